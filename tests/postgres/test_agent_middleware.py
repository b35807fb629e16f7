"""`create_agent` + `ResilienceMiddleware` on a real Postgres, across processes:
SIGKILL around a side effect, budgets that survive a crash, an escalation answered
from another process, the next turn sent to another worker (sync and async)."""

from __future__ import annotations

import pathlib
import signal
import subprocess
import uuid

import psycopg
import pytest

from tests.postgres.processes import finish, spawn, wait_for_marker

WORKER = pathlib.Path(__file__).with_name("agent_worker.py")

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def _prepare(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE refunds (id serial PRIMARY KEY, key text, order_id text)")
        conn.execute("CREATE TABLE attempts (id serial PRIMARY KEY, pid int)")


def _count(dsn: str, table: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    return int(row[0]) if row else 0


def _kill_at_marker(marker: pathlib.Path, process: subprocess.Popen[str]) -> None:
    wait_for_marker(marker, process)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("kill_at", ["before", "after", "completed"])
def test_sigkill_around_a_refund_then_resume_refunds_once(
    pg_dsn: str, tmp_path: pathlib.Path, kill_at: str, mode: str
) -> None:
    _prepare(pg_dsn)
    marker = tmp_path / "marker"
    common = ["--dsn", pg_dsn, "--thread", uuid.uuid4().hex, "--marker", str(marker)]
    common += ["--mode", mode]
    _kill_at_marker(marker, spawn(WORKER, "start", *common, "--kill-at", kill_at, killed=True))
    assert _count(pg_dsn, "refunds") == (0 if kill_at == "before" else 1)

    result = finish(spawn(WORKER, "resume", *common))

    assert result["last"] == "done"
    assert _count(pg_dsn, "refunds") == 1


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_attempts_spent_before_a_crash_count_after_the_resume(
    pg_dsn: str, tmp_path: pathlib.Path, mode: str
) -> None:
    """max_attempts=3, every retry a checkpointed step (inline_retry_max_wait=None): the
    first process fails once and is killed during its second attempt; the resumed
    process may make only the two attempts left."""
    _prepare(pg_dsn)
    marker = tmp_path / "marker"
    common = ["--dsn", pg_dsn, "--thread", uuid.uuid4().hex, "--marker", str(marker)]
    common += ["--mode", mode, "--ask", "lookup", "--no-in-step"]
    _kill_at_marker(
        marker, spawn(WORKER, "start", *common, "--kill-at", "none", "--hang-on", "2", killed=True)
    )
    assert _count(pg_dsn, "attempts") == 2

    result = finish(spawn(WORKER, "resume", *common))

    assert _count(pg_dsn, "attempts") == 4  # the killed attempt is made again, once
    assert result["attempts"] == [3]
    assert result["interrupts"] == 1  # retries spent: a human is asked (escalate=True)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_crash_inside_the_step_repeats_its_attempts_once(
    pg_dsn: str, tmp_path: pathlib.Path, mode: str
) -> None:
    """The crash rule of a short backoff retried inside the step: the first process fails
    once, retries inside the step and is SIGKILLed during that second attempt, before the
    step's checkpoint; the resumed step counts from the checkpoint before it, so both
    attempts are made again once: 2 + 3 executions, 3 counted."""
    _prepare(pg_dsn)
    marker = tmp_path / "marker"
    common = ["--dsn", pg_dsn, "--thread", uuid.uuid4().hex, "--marker", str(marker)]
    common += ["--mode", mode, "--ask", "lookup"]
    _kill_at_marker(
        marker, spawn(WORKER, "start", *common, "--kill-at", "none", "--hang-on", "2", killed=True)
    )
    assert _count(pg_dsn, "attempts") == 2

    result = finish(spawn(WORKER, "resume", *common))

    assert _count(pg_dsn, "attempts") == 5
    assert result["attempts"] == [3]
    assert result["interrupts"] == 1


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_escalation_is_answered_from_another_process(
    pg_dsn: str, tmp_path: pathlib.Path, mode: str
) -> None:
    _prepare(pg_dsn)
    common = ["--dsn", pg_dsn, "--thread", uuid.uuid4().hex, "--marker", str(tmp_path / "m")]
    common += ["--mode", mode, "--ask", "audit"]
    asked = finish(spawn(WORKER, "start", *common, "--kill-at", "none"))
    assert asked["interrupts"] == 1

    answered = finish(spawn(WORKER, "answer", *common, "--action", "retry"))

    assert answered["interrupts"] == 0
    assert answered["last"] == "done"


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("ends", ["answer", "tools", "model down"])
def test_the_next_turn_runs_on_another_worker_at_once(
    pg_dsn: str, tmp_path: pathlib.Path, mode: str, ends: str
) -> None:
    """A run that ends gives its thread back: at the model's final answer, after its
    tools step (every call ``return_direct``), or when its model call fails for good.
    The next turn, sent to another worker while the first lives on without collecting
    the finished run, runs. The lease used to go back only when that process collected
    the run, so the next turn was refused with ThreadBusyError for up to
    DEFAULT_LEASE_TTL."""
    _prepare(pg_dsn)
    marker, stay = tmp_path / "marker", tmp_path / "stay"
    common = ["--dsn", pg_dsn, "--thread", uuid.uuid4().hex, "--marker", str(marker)]
    common += ["--mode", mode, "--kill-at", "none"] + (["--direct"] if ends == "tools" else [])
    down = ["--model-down"] if ends == "model down" else []
    first = spawn(WORKER, "start", *common, *down, "--stay", str(stay))
    try:
        wait_for_marker(marker, first)
        second = finish(spawn(WORKER, "start", *common))
    finally:
        stay.write_text("go")
        done = finish(first)

    expected = {"answer": ("done", None), "tools": ("refunded A1", None)}
    assert (done["last"], done["error"]) == expected.get(ends, ("refund", "FakeHTTPError"))
    assert (second["last"], second["error"]) == ("done", None)
    assert _count(pg_dsn, "refunds") == 1
