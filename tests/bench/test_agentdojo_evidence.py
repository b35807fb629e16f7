"""The AgentDojo evaluation's fault kinds, checking model, repeat metric and declarations.

Harness invariants, not scores: each fault kind raises the real client error its
evidence calls for and runs the function or not as the kind says; the checking
model reads before it re-issues a write, and its verdicts read AgentDojo's
environments right; a repeat that changes nothing is not a duplicate effect; the
writes declared idempotent are. Skipped unless the ``bench`` extra is installed.
"""

from __future__ import annotations

import dataclasses
import pathlib
import sys
from typing import Any

import pytest

pytest.importorskip(
    "agentdojo",
    reason="the AgentDojo evaluation needs the bench extra: pip install -e '.[bench]'",
)

import httpx
import yaml
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

ROOT = pathlib.Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from agentdojo.agent_pipeline.tool_execution import tool_result_to_str  # noqa: E402

from benchmarks.agentdojo.checks import CHECKS, Check  # noqa: E402
from benchmarks.agentdojo.contenders import CONTENDERS  # noqa: E402
from benchmarks.agentdojo.faults import AMBIGUOUS, KINDS, MIXES, REFUSALS, Mix  # noqa: E402
from benchmarks.agentdojo.replay import plan  # noqa: E402
from benchmarks.agentdojo.runner import Unit, cached_suite, measure, run_unit  # noqa: E402
from benchmarks.agentdojo.suites import IDEMPOTENT, SUITES, TaskSpec  # noqa: E402
from benchmarks.agentdojo.tools import Attempt, Sandbox  # noqa: E402
from langgraph_resilience.core.evidence import execution  # noqa: E402

SUITE = "banking"
ERRORS: dict[str, type[Exception]] = {
    "http_429": httpx.HTTPStatusError,
    "http_503": httpx.HTTPStatusError,
    "connect_error": httpx.ConnectError,
    "connect_timeout": httpx.ConnectTimeout,
    "read_timeout_before": httpx.ReadTimeout,
    "commit_timeout": httpx.ReadTimeout,
}


def _task_with(function: str) -> TaskSpec:
    """The first task that makes `function`'s call, cut down to that one call."""
    spec = next(t for t in cached_suite(SUITE).tasks if function in {c.function for c in t.calls})
    call = next(c for c in spec.calls if c.function == function)
    return dataclasses.replace(spec, calls=(call,))


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_raises_its_real_error_and_runs_the_function_as_it_says(kind: str) -> None:
    suite = cached_suite(SUITE)
    sandbox = Sandbox(suite, Mix(kind, 1.0, {kind: 1}, kind), seed=0)
    spec = _task_with("send_money")
    sandbox.start_task(spec.id, spec.fresh_environment())
    before = len(sandbox.env.bank_account.transactions)  # type: ignore[union-attr]
    with pytest.raises(ERRORS[kind]) as caught:
        sandbox.call(suite.functions["send_money"], dict(spec.calls[0].args), None)
    ran = len(sandbox.env.bank_account.transactions) > before  # type: ignore[union-attr]
    assert ran == (kind == "commit_timeout")
    assert sandbox.attempts[-1].ran == ran
    assert sandbox.attempts[-1].changed == ran
    # the evidence the client sees: a definite refusal, or a lost answer
    assert execution([caught.value]) == ("refused" if kind in REFUSALS else "unknown")
    assert (kind in AMBIGUOUS) == (kind not in REFUSALS)


def test_every_mix_faults_the_same_attempts() -> None:
    faulty = [m for m in MIXES.values() if m.rate > 0]
    for seed in range(60):
        draws = [
            m.draw(seed=seed, suite="s", task="t", function="f", key="{}", attempt=1)
            for m in faulty
        ]
        assert len({d is None for d in draws}) == 1
    assert set(MIXES["refusals"].weights) == REFUSALS
    assert set(MIXES["transient"].weights) == REFUSALS | {"read_timeout_before"}
    assert set(MIXES["transient+commit"].weights) == set(KINDS)


def _history(spec: TaskSpec, *steps: tuple[str, dict[str, Any], bool, str]) -> list[Any]:
    messages: list[Any] = [HumanMessage(spec.prompt)]
    for n, (name, args, ok, text) in enumerate(steps):
        call_id = f"call_{n}"
        messages.append(AIMessage("", tool_calls=[{"name": name, "args": args, "id": call_id}]))
        messages.append(
            ToolMessage(text, tool_call_id=call_id, status="success" if ok else "error")
        )
    return messages


def test_the_checking_model_reads_before_it_reissues_a_failed_write() -> None:
    spec = _task_with("send_money")
    write = spec.calls[0]
    check = CHECKS[SUITE]["send_money"]
    lost = (write.function, dict(write.args), False, "ReadTimeout: timed out")
    blind = plan(_history(spec, lost), 0, spec, "blind", CHECKS[SUITE])
    assert (blind.position, blind.phase) == (0, "call")  # re-issue at once
    checking = plan(_history(spec, lost), 0, spec, "checking", CHECKS[SUITE])
    assert (checking.position, checking.phase) == (0, "check")
    there = yaml.safe_dump([{"id": 9, **write.args, "sender": "me", "recurring": False}])
    read = check.args(write.args, ())
    seen = plan(
        _history(spec, lost, (check.read, read, True, there)), 0, spec, "checking", CHECKS[SUITE]
    )
    assert (seen.position, seen.phase, seen.failed) == (1, "call", ())  # done: move on
    absent = plan(
        _history(spec, lost, (check.read, read, True, "[]")), 0, spec, "checking", CHECKS[SUITE]
    )
    assert (absent.position, absent.phase) == (0, "call")  # not there: re-issue it
    again = plan(
        _history(spec, lost, (check.read, read, True, "[]"), lost, (check.read, read, True, "[]")),
        0,
        spec,
        "checking",
        CHECKS[SUITE],
    )
    assert (again.position, again.failed) == (1, (0,))  # re-issued once, then given up


def _verdict(suite: str, env: Any, check: Check, args: Any, earlier: Any) -> bool | None:
    result, error = cached_suite(suite).runtime.run_function(
        env, check.read, check.args(args, earlier)
    )
    if error:
        return check.verdict(args, False, str(error))
    return check.verdict(args, True, tool_result_to_str(result))


@pytest.mark.parametrize("suite", SUITES)
def test_checks_see_the_effect_after_the_write_and_not_before(suite: str) -> None:
    """For every reference write with a check: the verdict on the environment just
    before it is False (unless the write changes nothing), just after it True."""
    loaded = cached_suite(suite)
    checked = 0
    for spec in loaded.tasks:
        env = spec.fresh_environment()
        for index, call in enumerate(spec.calls):
            check = CHECKS[suite].get(call.function)
            earlier = spec.calls[:index]
            before = _verdict(suite, env, check, call.args, earlier) if check else None
            dump = env.model_dump()
            loaded.runtime.run_function(env, call.function, call.args)
            if check is None:
                continue
            checked += 1
            assert _verdict(suite, env, check, call.args, earlier) is True, (spec.id, call)
            assert before is False or env.model_dump() == dump, (spec.id, call)
    assert checked > 0 or not CHECKS[suite]


@pytest.mark.parametrize("suite", SUITES)
def test_writes_declared_idempotent_are(suite: str) -> None:
    """Each reference call of an IDEMPOTENT function, run a second time, leaves the
    environment as the first run did."""
    loaded = cached_suite(suite)
    for spec in loaded.tasks:
        env = spec.fresh_environment()
        for call in spec.calls:
            loaded.runtime.run_function(env, call.function, call.args)
            if call.function in IDEMPOTENT[suite]:
                once = env.model_dump()
                _, error = loaded.runtime.run_function(env, call.function, call.args)
                assert error is None
                assert env.model_dump() == once, (spec.id, call)


def test_a_repeat_that_changes_nothing_is_not_a_duplicate_effect() -> None:
    spec = _task_with("send_money")
    key = spec.calls[0].key
    first = Attempt("send_money", key, 1, "commit_timeout", True, False, changed=True)
    again = Attempt("send_money", key, 2, None, True, True, changed=True)
    same = Attempt("send_money", key, 2, None, True, True, changed=False)
    effects = cached_suite(SUITE).side_effects
    assert measure(spec, [first, again], effects)[:2] == (1, 1)
    assert measure(spec, [first, same], effects)[:2] == (0, 1)


def test_the_commit_mix_duplicates_blind_toolnode_and_checking_removes_it() -> None:
    """A real duplicate is counted (plain ToolNode re-sends a committed write), and the
    checking model, which reads first, does not make it."""
    blind = run_unit(Unit(SUITE, 0, "commit", "unique", ("toolnode",)))
    checking = run_unit(Unit(SUITE, 0, "commit", "unique", ("toolnode",), behaviour="checking"))
    assert sum(r.duplicates for r in blind) > 0
    assert sum(r.duplicates for r in checking) == 0
    assert all(r.behaviour == "checking" for r in checking)


def test_the_declared_contender_builds_and_declares_only_idempotent_writes() -> None:
    assert "declared" in CONTENDERS
    results = run_unit(Unit(SUITE, 0, "commit", "unique", ("declared", "resilient")))
    by = {c: [r for r in results if r.contender == c] for c in ("declared", "resilient")}
    assert sum(r.duplicates for r in by["declared"]) == 0
    assert sum(r.raised is not None for r in results) == 0
    # it repeats (only) idempotent writes after a lost answer; resilient never repeats
    assert sum(r.repeats for r in by["resilient"]) == 0
