"""The `langgraph-resilience` command, run as real subprocesses.

Each CLI process spends seconds importing LangGraph, so the independent scenarios
(a full demo, a crash and its resume, an escalation answered later, a bad DSN)
start together in a module fixture, and each test waits for the one it checks.
Checks that need no process of their own (listings, refused answers, argument
mistakes, a runner refused while this process holds the thread) call `main()`
here, at the point of the scenario they inspect.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import io
import json
import os
import pathlib
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from langgraph_resilience.cli import main
from langgraph_resilience.stores.persistence import open_sqlite

ROOT = pathlib.Path(__file__).resolve().parents[2]
PASSWORD = "s3cr3t-pw"

Result = subprocess.CompletedProcess[str]


def start(*args: str, state: pathlib.Path, dsn: str | None = None) -> subprocess.Popen[str]:
    """Start ``python -m langgraph_resilience ARGS`` with its state under `state`."""
    env = {**os.environ, "XDG_STATE_HOME": str(state), "COLUMNS": "160"}
    env.pop("LANGGRAPH_RESILIENCE_DSN", None)
    if dsn is not None:
        env["LANGGRAPH_RESILIENCE_DSN"] = dsn
    return subprocess.Popen(
        [sys.executable, "-m", "langgraph_resilience", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen[str]) -> Result:
    try:
        stdout, stderr = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def run_cli(*args: str, state: pathlib.Path, dsn: str | None = None) -> Result:
    return finish(start(*args, state=state, dsn=dsn))


def run_here(*args: str) -> Result:
    """Run `main(args)` in this process: quick, for checks that need no process of
    their own. Its output goes to streams passed in, never through sys.stdout or
    sys.stderr, which pytest swaps between tests while the scenario threads run."""
    out, err = io.StringIO(), io.StringIO()
    code = main(list(args), stdout=out, stderr=err)
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def sqlite_dir(state: pathlib.Path) -> str:
    """The --state-dir of a scenario's state (what XDG_STATE_HOME implies)."""
    return str(state / "langgraph-resilience")


def records_of(result: Result) -> list[dict[str, Any]]:
    """The records of a ``--json`` run: its stdout is one JSON document."""
    records: list[dict[str, Any]] = json.loads(result.stdout)["records"]
    return records


def summary_of(result: Result) -> dict[str, Any]:
    assert result.returncode == 0, result.stderr
    summary = records_of(result)[-1]
    assert summary["kind"] == "summary"
    return summary


def state_file(state: pathlib.Path) -> pathlib.Path:
    return state / "langgraph-resilience" / "threads.sqlite"


def effects_in_sqlite(state: pathlib.Path, thread_id: str) -> list[tuple[str, str]]:
    """The demo back office's log: one (kind, idempotency key) row per execution."""
    with contextlib.closing(sqlite3.connect(state_file(state))) as conn:
        rows = conn.execute(
            "SELECT kind, idempotency_key FROM lgr_demo_effects WHERE thread_id = ? ORDER BY id",
            (thread_id,),
        ).fetchall()
    return [(str(kind), str(key)) for kind, key in rows]


def assert_one_line_error(result: Result, *needles: str) -> None:
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


# ------------------------------------------------------------------ scenarios


def full_demo(state: pathlib.Path) -> dict[str, Any]:
    return {"demo": run_cli("demo", "--json", state=state), "state": state}


def crash_and_resume(state: pathlib.Path) -> dict[str, Any]:
    """Killed right after the refund happened; listed; a concurrent runner refused;
    resumed by another process; listed again; a stray answer refused."""
    out: dict[str, Any] = {
        "crash": run_cli("demo", "--crash-at", "refund", "--thread-id", "t-crash", state=state),
        "state": state,
    }
    where = ("--state-dir", sqlite_dir(state))
    out["effects_after_crash"] = effects_in_sqlite(state, "t-crash")
    out["threads_after_crash"] = run_here("threads", "--json", *where)
    with open_sqlite(state_file(state)) as p, p.thread_lock("t-crash"):
        out["busy"] = run_here("resume", "t-crash", *where)
    out["resume"] = run_cli("resume", "t-crash", state=state)
    out["effects"] = effects_in_sqlite(state, "t-crash")
    out["threads"] = run_here("threads", *where)
    out["stray_answer"] = run_here("resume", "t-crash", "--skip", *where)
    return out


def answer_later(state: pathlib.Path) -> dict[str, Any]:
    """Paused at the escalation (listed; resumed without an answer: refused), then
    approved by another process."""
    out: dict[str, Any] = {
        "pause": run_cli("demo", "--pause", "--json", "--thread-id", "t-pause", state=state),
        "state": state,
    }
    where = ("--state-dir", sqlite_dir(state))
    out["threads_paused"] = run_here("threads", "--json", *where)
    out["no_answer"] = run_here("resume", "t-pause", *where)
    out["approve"] = run_cli("resume", "t-pause", "--approve", "--json", state=state)
    out["effects"] = effects_in_sqlite(state, "t-pause")
    return out


def bad_dsn(state: pathlib.Path) -> dict[str, Any]:
    dsn = f"postgresql://app:{PASSWORD}@127.0.0.1:1/nowhere"
    return {"demo": run_cli("demo", "--dsn", dsn, state=state)}


SCENARIOS: dict[str, Callable[[pathlib.Path], dict[str, Any]]] = {
    "crash": crash_and_resume,
    "answer_later": answer_later,
    "full_demo": full_demo,
    "bad_dsn": bad_dsn,
}

Futures = dict[str, concurrent.futures.Future[dict[str, Any]]]


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Futures]:
    """Every scenario runs concurrently, each in its own state directory."""
    with (
        pytest.MonkeyPatch.context() as env,
        concurrent.futures.ThreadPoolExecutor(max_workers=len(SCENARIOS)) as pool,
    ):
        env.delenv("LANGGRAPH_RESILIENCE_DSN", raising=False)  # main() here uses SQLite
        yield {
            name: pool.submit(scenario, tmp_path_factory.mktemp(name))
            for name, scenario in SCENARIOS.items()
        }


def outcome(scenarios: Futures, name: str) -> dict[str, Any]:
    return scenarios[name].result(timeout=300)


# ------------------------------------------------------------------ tests


@pytest.mark.postgres
def test_crash_and_resume_on_postgres(
    tmp_path: pathlib.Path, pg_dsn: str, scenarios: Futures
) -> None:
    """The same crash and resume on Postgres (--dsn, then LANGGRAPH_RESILIENCE_DSN).

    First in the file, and asking for `scenarios`, so the SQLite scenarios run meanwhile.
    """
    crash = run_cli(
        "demo", "--dsn", pg_dsn, "--crash-at", "refund", "--thread-id", "t-pg", state=tmp_path
    )
    assert crash.returncode == -signal.SIGKILL, crash.stderr

    resumed = run_cli("resume", "t-pg", "--json", state=tmp_path, dsn=pg_dsn)

    summary = summary_of(resumed)
    assert summary["state"] == "done"
    assert [(e["kind"], e["executions"]) for e in summary["effects"]] == [("refund", 1)]
    refund = next(c for c in summary["calls"] if c["call_id"] == "call_refund")
    assert refund["recovery"] == "reconcile"
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute("SELECT kind FROM lgr_demo_effects WHERE thread_id = 't-pg'")
        assert [row[0] for row in rows] == ["refund"]
    listed = run_here("threads", "--json", "--dsn", pg_dsn)
    [thread] = json.loads(listed.stdout)["threads"]
    assert (thread["thread_id"], thread["state"]) == ("t-pg", "done")
    assert not (tmp_path / "langgraph-resilience").exists()  # nothing went to SQLite


def test_demo_recovers_or_escalates_every_failure_class(scenarios: Futures) -> None:
    """demo exits 0; its JSON summary shows each class taken by the path designed for it."""
    out = outcome(scenarios, "full_demo")
    result = out["demo"]
    summary = summary_of(result)

    assert summary["state"] == "done"
    paths = {
        (call["failure_class"], call["recovery"])
        for call in summary["calls"]
        if call["recovery"] not in ("none", "plan_step")
    }
    assert paths == {
        ("transient", "retry"),
        ("semantic", "repair"),
        ("semantic", "coercion"),
        ("transient", "fallback"),
        ("structural", "replan"),
        ("policy", "escalation"),
        ("unknown", "reconcile"),
    }
    calls = {call["call_id"]: call for call in summary["calls"]}
    assert calls["call_lookup"]["backoff_s"] == 2.0  # Retry-After: 2 honoured
    assert calls["call_stock"]["classes"] == ["transient", "transient", "transient"]
    assert calls["call_policy"]["llm_calls"] == 1
    assert calls["call_credit"]["ok"] is False  # declined: the non-interactive default
    assert all(c["ok"] for c in summary["calls"] if c["call_id"] != "call_credit")
    assert [(e["kind"], e["executions"]) for e in summary["effects"]] == [("refund", 1)]
    assert summary["exactly_once"] is True
    lines = records_of(result)
    assert any(line.get("resilience") == "breaker" and line["to_state"] == "open" for line in lines)
    [answer] = [line for line in lines if line["kind"] == "answer"]
    assert answer["answer"]["action"] == "skip"
    assert state_file(out["state"]).exists()


def test_demo_text_explains_each_call(scenarios: Futures) -> None:
    """The text output names each failure's class, its recovery path and the crash."""
    out = outcome(scenarios, "crash")
    crash, resumed = out["crash"], out["resume"]

    for text in ("→ TRANSIENT", "→ SEMANTIC", "→ STRUCTURAL", "→ POLICY", "Retry-After"):
        assert text in crash.stdout
    for text in ("coercion", "repair model", "circuit breaker", "plan verified", "skip"):
        assert text in crash.stdout
    assert "Every tool call" in resumed.stdout
    assert "Traceback" not in crash.stderr + resumed.stderr


def test_crash_after_the_effect_then_resume_refunds_exactly_once(scenarios: Futures) -> None:
    """Killed after the refund and before the checkpoint, resumed by another process:
    the refund is reconciled through status_check, never executed a second time."""
    out = outcome(scenarios, "crash")

    crash = out["crash"]
    assert crash.returncode == -signal.SIGKILL, crash.stderr
    assert "killed at refund" in crash.stdout
    assert "langgraph-resilience resume t-crash" in crash.stdout
    assert [kind for kind, _ in out["effects_after_crash"]] == ["refund"]

    resumed = out["resume"]
    assert resumed.returncode == 0, resumed.stderr
    assert "reconciled, not run again" in resumed.stdout
    assert "every side effect ran exactly once" in resumed.stdout
    assert out["effects"] == out["effects_after_crash"]


def test_threads_lists_a_killed_thread_as_pending_then_done(scenarios: Futures) -> None:
    """threads shows where the killed thread stopped and its unknown effect, then done."""
    out = outcome(scenarios, "crash")

    [thread] = json.loads(out["threads_after_crash"].stdout)["threads"]
    assert thread["thread_id"] == "t-crash"
    assert (thread["state"], thread["next"]) == ("pending", ["tools"])
    assert thread["effects"]["pending"] == 1
    assert "unknown outcome" in thread["why"]
    assert thread["resume"].startswith("langgraph-resilience resume t-crash --state-dir")

    table = out["threads"]
    assert table.returncode == 0, table.stderr
    assert "t-crash" in table.stdout
    assert "done" in table.stdout


def test_threads_says_why_a_thread_waits(scenarios: Futures) -> None:
    """An interrupted thread is listed with the tool, the class and the reason."""
    [thread] = json.loads(outcome(scenarios, "answer_later")["threads_paused"].stdout)["threads"]

    assert thread["state"] == "interrupted"
    assert "goodwill_credit (policy)" in thread["why"]
    assert "supervisor's approval" in thread["why"]
    assert thread["resume"].startswith("langgraph-resilience resume t-pause")
    assert thread["resume"].endswith("--approve|--skip|--edit JSON|--abort")


def test_a_second_runner_of_a_thread_is_refused(scenarios: Futures) -> None:
    """While another process holds the thread, resume is one line and exit code 2."""
    assert_one_line_error(outcome(scenarios, "crash")["busy"], "being run by another process")


def test_paused_escalation_is_answered_by_a_later_process(scenarios: Futures) -> None:
    """--pause leaves the POLICY escalation waiting; resume without an answer is refused;
    resume --approve grants it and each side effect then runs exactly once."""
    out = outcome(scenarios, "answer_later")

    paused = summary_of(out["pause"])
    assert paused["state"] == "interrupted"
    assert [(w["tool"], w["reason"]) for w in paused["waiting_for"]] == [
        ("goodwill_credit", "policy")
    ]
    assert_one_line_error(out["no_answer"], "waits for a human", "--approve")

    approved = summary_of(out["approve"])
    assert approved["state"] == "done"
    credit = next(c for c in approved["calls"] if c["call_id"] == "call_credit")
    assert (credit["recovery"], credit["ok"]) == ("escalation", True)
    assert sorted(kind for kind, _ in out["effects"]) == ["goodwill_credit", "refund"]
    assert approved["exactly_once"] is True


def test_unreachable_dsn_is_one_line_exit_2_without_password(scenarios: Futures) -> None:
    """An unreachable DSN gives one error line, exit code 2, and never the password."""
    result = outcome(scenarios, "bad_dsn")["demo"]

    assert_one_line_error(result, "cannot connect to PostgreSQL", "app:***@")
    assert PASSWORD not in result.stderr + result.stdout


BAD_INPUTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "refused login": (
        ("threads", "--dsn", f"postgresql://app:{PASSWORD}@127.0.0.1:5432/no_such_db"),
        ("PostgreSQL", "app:***@"),
    ),
    "unknown thread": (("resume", "no-such-thread"), ("no thread 'no-such-thread'",)),
    "invalid --edit": (("resume", "t", "--edit", "{amount: 10"), ("--edit: invalid JSON",)),
    "--edit not an object": (("resume", "t", "--edit", "[10]"), ("JSON object",)),
    "bad --crash-at": (("demo", "--crash-at", "lunch"), ("not a crash point",)),
    "two answers": (("resume", "t", "--approve", "--skip"), ("not allowed with",)),
    "two output forms": (("threads", "--json", "--jsonl"), ("not allowed with",)),
    "unusable state dir": (("threads", "--state-dir", "/proc/no/such"), ("SQLite state file",)),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_one_line_exit_2(tmp_path: pathlib.Path, case: str) -> None:
    """A user mistake gives one error line, exit code 2, no traceback, never a password."""
    args, needles = BAD_INPUTS[case]
    where = () if "--state-dir" in args else ("--state-dir", str(tmp_path))
    result = run_here(*args, *where)

    assert_one_line_error(result, *needles)
    assert PASSWORD not in result.stderr + result.stdout


def test_an_answer_for_a_thread_without_escalation_is_refused(scenarios: Futures) -> None:
    """--skip on a thread that waits for nobody is one line and exit code 2."""
    result = outcome(scenarios, "crash")["stray_answer"]

    assert_one_line_error(result, "no pending escalation", "--skip")


def test_readme_commands_are_what_ci_runs() -> None:
    """The README's two set-up commands are the ones .ci/run executes."""
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    for command in (
        "pip install . && langgraph-resilience demo",
        'pip install -e ".[dev]" && python -m pytest',
    ):
        assert command in readme
        assert command.replace("pip install", "pip install -q") in ci


def test_a_crash_point_never_reached_is_a_usage_error(tmp_path: pathlib.Path) -> None:
    """`--crash-at 999` on a shorter run: the demo still finishes and prints its summary,
    then says in one line that nothing was killed, and exits 2 (not a silent 0)."""
    result = run_here("demo", "--crash-at", "999", "--state-dir", str(tmp_path))
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert "--crash-at 999 was never reached" in line
    assert "nothing was killed" in line
    assert "is done" in result.stdout


def test_an_invalid_edit_is_refused_in_one_line_and_the_thread_still_waits(
    tmp_path: pathlib.Path,
) -> None:
    """`--edit` with a value the tool rejects: the escalation asks again (nothing runs),
    the output shows why, and the command exits 2 with one line saying how to answer."""
    state = str(tmp_path)
    result = run_here("demo", "--edit", '{"amount": "lots"}', "--state-dir", state)
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert "your answer was refused" in line
    assert "amount" in line
    assert "langgraph-resilience resume" in line
    assert "refused:" in result.stdout
    assert "waits for a human" in result.stdout


@pytest.mark.parametrize(
    ("flag", "says"),
    [
        ("--skip", "needs a supervisor, who declined it this time"),
        ("--approve", "For the trouble:"),
    ],
)
def test_the_agents_answer_says_what_the_human_decided(
    tmp_path: pathlib.Path, flag: str, says: str
) -> None:
    """After --skip (the default) the credit was declined, so the answer must not promise
    that a supervisor will still look at it; after --approve it was granted."""
    result = run_here("demo", flag, "--state-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    answer = " ".join(result.stdout.split())  # the answer wraps at the terminal width
    assert says in answer
    assert "will look at a goodwill credit" not in answer


def test_json_is_one_document_and_jsonl_the_same_records_as_they_happen(
    tmp_path: pathlib.Path,
) -> None:
    """``--json`` prints one JSON document (``{"records": [...]}``), ``--jsonl`` the same
    records one per line; ``threads`` likewise (a document, or a line per thread)."""
    where = ("--state-dir", str(tmp_path))
    document = run_here("demo", "--thread-id", "t-doc", *where, "--json")
    streamed = run_here("demo", "--thread-id", "t-lines", *where, "--jsonl")
    assert document.returncode == streamed.returncode == 0, document.stderr + streamed.stderr

    records = json.loads(document.stdout)["records"]  # the whole stdout parses at once
    lines = [json.loads(line) for line in streamed.stdout.splitlines()]
    assert [r["kind"] for r in records] == [r["kind"] for r in lines]
    assert records[-1]["kind"] == "summary"

    listed = json.loads(run_here("threads", *where, "--json").stdout)["threads"]
    rows = [json.loads(line) for line in run_here("threads", *where, "--jsonl").stdout.splitlines()]
    assert (
        [r["thread_id"] for r in rows] == [t["thread_id"] for t in listed] == ["t-lines", "t-doc"]
    )
