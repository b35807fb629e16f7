"""The per-tool bulkhead: a concurrency limit whose excess calls fail TRANSIENT after a bound."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
from typing import Any

import pytest

from langgraph_resilience._graph.bulkhead import Bulkhead, BulkheadFullError
from langgraph_resilience.core.classification import classify
from langgraph_resilience.errors import ConfigurationError, FailureClass, ToolFailure


@pytest.mark.parametrize(
    ("kwargs", "hint"),
    [
        ({"max_concurrent": 0}, "integer >= 1"),
        ({"max_concurrent": True}, "integer >= 1"),
        ({"max_concurrent": 2.5}, "integer >= 1"),
        ({"max_concurrent": 1, "max_wait": -1}, ">= 0 seconds"),
        ({"max_concurrent": 1, "max_wait": dt.timedelta(seconds=-1)}, ">= 0 seconds"),
        ({"max_concurrent": 1, "max_wait": "1s"}, "number of seconds"),
    ],
)
def test_bad_bulkhead_fails_at_construction(kwargs: dict[str, Any], hint: str) -> None:
    """Invalid limits raise ConfigurationError saying what is expected."""
    with pytest.raises(ConfigurationError) as info:
        Bulkhead("search", **kwargs)
    assert hint in str(info.value)


def test_full_bulkhead_error_is_a_transient_tool_failure() -> None:
    """The rejection is a ToolFailure that classifies as TRANSIENT and retriable."""
    error = BulkheadFullError("search", 4, 0.5)
    assert isinstance(error, ToolFailure)
    envelope = classify(error, tool="search")
    assert envelope.failure_class is FailureClass.TRANSIENT
    assert envelope.retriable
    assert envelope.context == {"bulkhead": "search", "max_concurrent": 4, "max_wait_s": 0.5}


def test_excess_sync_call_fails_without_waiting() -> None:
    """With max_wait=0 a call beyond max_concurrent fails at once; a freed slot admits again."""
    bulkhead = Bulkhead("search", max_concurrent=2)
    entered, leave = threading.Barrier(3, timeout=10), threading.Event()

    def hold() -> None:
        with bulkhead.slot():
            entered.wait()
            leave.wait(timeout=10)

    holders = [threading.Thread(target=hold) for _ in range(2)]
    for thread in holders:
        thread.start()
    entered.wait()  # both holders are inside
    with pytest.raises(BulkheadFullError):
        bulkhead.call(lambda: "never")
    leave.set()
    for thread in holders:
        thread.join()
    assert bulkhead.call(lambda: "now") == "now"


def test_sync_waiter_gets_a_slot_freed_within_max_wait() -> None:
    """A call waits for a slot (up to max_wait) instead of failing."""
    bulkhead = Bulkhead("search", max_concurrent=1, max_wait=30.0)
    results: list[str] = []
    with bulkhead.slot():
        waiter = threading.Thread(target=lambda: results.append(bulkhead.call(lambda: "ran")))
        waiter.start()
    waiter.join(timeout=30)
    assert results == ["ran"]


def test_sync_wait_is_bounded() -> None:
    """A call that cannot get a slot within max_wait fails with BulkheadFullError."""
    bulkhead = Bulkhead("search", max_concurrent=1, max_wait=0.05)
    with bulkhead.slot(), pytest.raises(BulkheadFullError, match=r"within 0\.05s"):
        bulkhead.call(lambda: None)


def test_never_more_than_max_concurrent_threads_inside() -> None:
    """8 threads through a limit of 3: at most 3 are ever inside at once, and all finish."""
    bulkhead = Bulkhead("search", max_concurrent=3, max_wait=30.0)
    state = {"inside": 0, "peak": 0, "done": 0}
    changed, gate = threading.Condition(), threading.Event()

    def work() -> None:
        with bulkhead.slot():
            with changed:
                state["inside"] += 1
                state["peak"] = max(state["peak"], state["inside"])
                changed.notify_all()
            gate.wait(timeout=30)
            with changed:
                state["inside"] -= 1
                state["done"] += 1

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    with changed:
        assert changed.wait_for(lambda: state["inside"] == 3, timeout=30)
    gate.set()
    for thread in threads:
        thread.join()
    assert state == {"inside": 0, "peak": 3, "done": 8}


def test_async_excess_call_fails_and_waiter_gets_freed_slot() -> None:
    """Async: no slot and max_wait=0 fails at once; a waiter gets the slot when it frees."""

    async def scenario() -> list[Any]:
        strict = Bulkhead("search", max_concurrent=1)
        patient = Bulkhead("fetch", max_concurrent=1, max_wait=30.0)
        held, leave = asyncio.Event(), asyncio.Event()

        async def hold(bulkhead: Bulkhead) -> str:
            async with bulkhead.aslot():
                held.set()
                await leave.wait()
            return "held"

        async def quick() -> str:
            return "quick"

        holder = asyncio.create_task(hold(strict))
        await held.wait()
        with pytest.raises(BulkheadFullError):
            await strict.acall(quick)
        leave.set()
        await holder

        held.clear()
        leave.clear()
        holder = asyncio.create_task(hold(patient))
        await held.wait()
        waiter = asyncio.create_task(patient.acall(quick))
        await asyncio.sleep(0)  # let the waiter queue on the semaphore
        assert not waiter.done()
        leave.set()
        return [await holder, await waiter, await strict.acall(quick)]

    assert asyncio.run(scenario()) == ["held", "quick", "quick"]


def test_async_wait_is_bounded() -> None:
    """Async: a call that cannot get a slot within max_wait fails with BulkheadFullError."""
    bulkhead = Bulkhead("search", max_concurrent=1, max_wait=0.05)

    async def scenario() -> None:
        async with bulkhead.aslot():
            with pytest.raises(BulkheadFullError):
                async with bulkhead.aslot():
                    pass

    asyncio.run(scenario())


def test_one_bulkhead_serves_several_event_loops() -> None:
    """The same bulkhead works from successive event loops (one semaphore per loop)."""
    bulkhead = Bulkhead("search", max_concurrent=1)

    async def once() -> int:
        async def value() -> int:
            return 1

        return await bulkhead.acall(value)

    assert asyncio.run(once()) + asyncio.run(once()) == 2
