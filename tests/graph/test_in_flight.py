"""A timed-out side effect may still be running: it is neither asked about too early nor
run again, its late outcome is recorded, and it never keeps the process alive."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import pathlib
import subprocess
import sys
import textwrap
import threading
from typing import Any

import pytest
from langchain_core.messages import ToolMessage
from langchain_core.tools import tool

from langgraph_resilience import ResiliencePolicy, ToolProfile, tool_error_of
from langgraph_resilience._graph.in_flight import arun_with_timeout
from langgraph_resilience.errors import ThreadLockLostError
from langgraph_resilience.stores import EffectStatus, InMemoryIdempotencyStore
from langgraph_resilience.stores.saga import InMemorySagaLog
from langgraph_resilience.testing import text, tool_calls
from tests.conftest import build_graph

ROOT = pathlib.Path(__file__).resolve().parents[2]


class SlowBank:
    """A payment service that answers only once `go` is set, then records the payment."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.paid = threading.Event()
        self.payments: list[int] = []

    def charge(self, amount: int) -> str:
        self.go.wait(30)
        self.payments.append(amount)
        self.paid.set()
        return f"paid {amount}"

    def status(self, key: str) -> EffectStatus:
        return EffectStatus(done=bool(self.payments), result="paid" if self.payments else None)


def _graph(bank: SlowBank, pay: Any, ledger: InMemoryIdempotencyStore) -> Any:
    return build_graph(
        [pay],
        [tool_calls(("pay", {"amount": 5})), text("I could not confirm it yet")],
        policy=ResiliencePolicy(tool_timeout=0.05),
        profiles={"pay": ToolProfile(side_effect=True, status_check=bank.status)},
        options={"idempotency": ledger, "saga": InMemorySagaLog()},
    )


def _check(out: dict[str, Any], bank: SlowBank, ledger: InMemoryIdempotencyStore, h: Any) -> None:
    [answer] = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    error = tool_error_of(answer)
    assert error is not None
    assert error.failure_class == "unknown"
    assert "still running" in error.context["reason"]
    assert h.clock.sleeps == [pytest.approx(0.05)]  # the reconcile waited out its grace
    bank.go.set()
    assert bank.paid.wait(10)


def test_a_sync_attempt_still_running_is_not_run_again() -> None:
    """The first attempt times out but keeps running; the reconcile does not hear 'not
    done' and pay again: one payment, and its late outcome lands in the ledger."""
    bank, ledger = SlowBank(), InMemoryIdempotencyStore()

    @tool
    def pay(amount: int) -> str:
        """Pay."""
        return bank.charge(amount)

    h = _graph(bank, pay, ledger)
    config = h.config()
    out = h.app.invoke({"messages": [("user", "pay 5")]}, config)
    _check(out, bank, ledger, h)

    assert bank.payments == [5]
    [record] = ledger.for_thread(config["configurable"]["thread_id"])
    _wait_for(lambda: ledger.get(record.key).status == "done")  # type: ignore[union-attr]


def test_an_async_side_effect_is_left_to_land_not_cancelled_and_rerun() -> None:
    """Under ainvoke a side effect past its timeout is not cancelled (its request may have
    left): it stays in flight, is waited for, and lands once."""
    bank, ledger = SlowBank(), InMemoryIdempotencyStore()

    @tool
    async def pay(amount: int) -> str:
        """Pay."""
        return await asyncio.to_thread(bank.charge, amount)

    h = _graph(bank, pay, ledger)
    config = h.config()

    async def run() -> dict[str, Any]:
        out = await h.app.ainvoke({"messages": [("user", "pay 5")]}, config)
        _check(out, bank, ledger, h)
        [record] = ledger.for_thread(config["configurable"]["thread_id"])
        for _ in range(200):  # let the late outcome's write run on this loop
            if (got := ledger.get(record.key)) is not None and got.status == "done":
                break
            await asyncio.sleep(0)
        return dict(out)

    asyncio.run(run())
    assert bank.payments == [5]


def test_an_abandoned_tool_never_keeps_the_process_alive() -> None:
    """A sync tool that never returns, past tool_timeout: the process still exits."""
    script = textwrap.dedent(
        """
        import threading
        from langchain_core.tools import tool
        from langgraph_resilience import ResiliencePolicy
        from langgraph_resilience.testing import text, tool_calls
        from tests.conftest import build_graph

        @tool
        def hang(q: str) -> str:
            \"\"\"Never answers.\"\"\"
            threading.Event().wait()
            return q

        h = build_graph(
            [hang],
            [tool_calls(("hang", {"q": "x"}))] + [text("gave up")] * 5,
            policy=ResiliencePolicy(tool_timeout=0.05, max_attempts=1),
        )
        out = h.app.invoke({"messages": [("user", "x")]}, h.config())
        print(out["messages"][-1].content)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "gave up"


def _wait_for(condition: Any) -> None:
    """Wait for a condition another thread makes true (a real thread: polled, bounded)."""
    event = threading.Event()
    for _ in range(500):
        if condition():
            return
        event.wait(0.01)
    raise AssertionError("condition never became true")


def test_a_re_issue_after_the_late_outcome_landed_is_answered_from_it() -> None:
    """The agent is told the payment's outcome is unknown (its attempt timed out and is
    still running); the attempt then lands and its outcome is recorded; then, in the
    same task, the model re-issues the payment under a new id. The re-issue must be
    answered from the earlier, now known, outcome, not run: one payment. (Seen under
    load in the fault suite's slow-tool scenario: the earlier intent was no longer
    pending, so the re-issue found nothing to reconcile and paid again.)"""
    bank, ledger = SlowBank(), InMemoryIdempotencyStore()
    keys: list[str] = []

    @tool
    def pay(amount: int) -> str:
        """Pay."""
        return bank.charge(amount)

    def re_issue(messages: list[Any]) -> Any:
        bank.go.set()  # the first attempt lands now
        assert bank.paid.wait(10)
        _wait_for(lambda: all(ledger.get(k).status == "done" for k in keys))  # type: ignore[union-attr]
        return tool_calls(("pay", {"amount": 5}))

    h = build_graph(
        [pay],
        [tool_calls(("pay", {"amount": 5})), re_issue, text("paid")],
        policy=ResiliencePolicy(tool_timeout=0.05),
        profiles={"pay": ToolProfile(side_effect=True, status_check=bank.status)},
        options={"idempotency": ledger, "saga": InMemorySagaLog()},
    )
    config = h.config()
    thread_id = config["configurable"]["thread_id"]
    original = ledger.claim

    def claim(key: str, *args: Any, **kwargs: Any) -> Any:
        if not keys:  # the first call's key
            keys.append(key)
        return original(key, *args, **kwargs)

    ledger.claim = claim  # type: ignore[method-assign]
    out = h.app.invoke({"messages": [("user", "pay 5")]}, config)

    answers = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert len(answers) == 2
    first, second = (tool_error_of(m) for m in answers)
    assert first is not None
    assert first.failure_class == "unknown"
    assert second is None, second
    assert "paid 5" in str(answers[1].content)
    assert bank.payments == [5]
    assert len(ledger.for_thread(thread_id)) == 2  # the re-issue's key records the same outcome


@pytest.mark.parametrize(
    ("refusal", "level", "said"),
    [
        (ThreadLockLostError("t-1", "outcome kept"), logging.INFO, "recorded; its run had lost"),
        (OSError("ledger unreachable"), logging.WARNING, "could not be recorded (OSError)"),
    ],
    ids=["superseded", "unreachable"],
)
def test_a_late_outcome_the_ledger_refuses_is_logged_not_left_unretrieved(
    refusal: Exception, level: int, said: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A cancelled run leaves its side effect in flight; when it lands, its outcome is
    written by a task nobody awaits. A refusal of that write (a successor took the
    thread, which keeps the outcome; or the ledger is down) is logged once, never left
    for asyncio to report as "Task exception was never retrieved" with a traceback.
    (Seen cancelling random runs on AsyncPostgresSaver, as a server does.)"""

    async def main() -> list[dict[str, Any]]:
        unretrieved: list[dict[str, Any]] = []
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: unretrieved.append(ctx))
        gate, landed = asyncio.Event(), asyncio.Event()

        async def execute(_: Any) -> str:
            await gate.wait()
            return "paid 5"

        async def on_late(_: Any) -> None:
            landed.set()
            raise refusal

        run = asyncio.ensure_future(
            arun_with_timeout(execute, None, None, key=f"k-{level}", on_late=on_late)
        )
        await asyncio.sleep(0)  # the run is now waiting on its effect
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        gate.set()
        await asyncio.wait_for(landed.wait(), 10)
        for _ in range(5):  # let the write's done-callback run
            await asyncio.sleep(0)
        gc.collect()  # an unretrieved exception is reported when its task is freed
        return unretrieved

    with caplog.at_level(logging.INFO, logger="langgraph_resilience"):
        assert asyncio.run(main()) == []
    [record] = [r for r in caplog.records if "late outcome" in r.getMessage()]
    assert (record.levelno, said in record.getMessage()) == (level, True)
