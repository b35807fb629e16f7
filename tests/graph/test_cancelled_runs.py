"""A run cancelled while a side effect is on the wire (a server's double-texting with
``interrupt``, a cancelled run): the effect is not lost, repeated or misreported.

The effect lands after the cancel and its outcome is recorded; the next input answers
the call from the ledger (its result, or UNKNOWN while it is still running), never
"it was not run"; an identical call the model re-issues is not run again.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver, PersistentDict

from langgraph_resilience import ToolProfile
from langgraph_resilience.stores.effect_ledger import LEDGER_FILE
from langgraph_resilience.testing import text, tool_calls
from tests.conftest import build_graph


def _refund_tool(done: list[str], release: asyncio.Event, started: asyncio.Event) -> Any:
    @tool
    async def refund(order: str) -> str:
        """Refund an order."""
        started.set()
        await release.wait()
        done.append(order)
        return f"refunded {order}"

    return refund


async def _cancel_mid_effect(h: Any, config: dict[str, Any], started: asyncio.Event) -> None:
    run = asyncio.ensure_future(h.app.ainvoke({"messages": [("user", "refund A1")]}, config))
    await asyncio.wait_for(started.wait(), 5)
    run.cancel()
    await asyncio.gather(run, return_exceptions=True)


async def test_an_effect_that_lands_after_the_cancel_answers_the_call_with_its_result() -> None:
    done: list[str] = []
    release, started = asyncio.Event(), asyncio.Event()
    h = build_graph(
        [_refund_tool(done, release, started)],
        [tool_calls(("refund", {"order": "A1"})), lambda m: text(f"told: {m[-2].text}")],
        profiles={"refund": ToolProfile(side_effect=True)},
    )
    config = h.config()
    await _cancel_mid_effect(h, config, started)
    release.set()
    for _ in range(100):  # the abandoned effect lands on this loop
        if done:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # its outcome is written by a task of its own

    result = await h.app.ainvoke({"messages": [HumanMessage("and?")]}, config)
    answer = next(m for m in result["messages"] if isinstance(m, ToolMessage))
    assert answer.text == "refunded A1"
    assert answer.status == "success"
    assert answer.response_metadata["resilience"]["replayed"] is True
    assert done == ["A1"]


async def test_an_effect_still_running_is_unknown_and_a_reissue_does_not_run_it_again() -> None:
    done: list[str] = []
    release, started = asyncio.Event(), asyncio.Event()

    def reissue(messages: list[Any]) -> AIMessage:
        assert "outcome is unknown" in messages[-2].text  # what the model was told
        return tool_calls(("refund", {"order": "A1"}))

    h = build_graph(
        [_refund_tool(done, release, started)],
        [tool_calls(("refund", {"order": "A1"})), reissue, text("checking")],
        profiles={"refund": ToolProfile(side_effect=True)},
    )
    config = h.config()
    await _cancel_mid_effect(h, config, started)

    result = await h.app.ainvoke({"messages": [HumanMessage("and?")]}, config)
    answers = [m for m in result["messages"] if isinstance(m, ToolMessage)]
    assert [a.status for a in answers] == ["error", "error"]
    assert '"failure_class":"unknown"' in answers[1].text
    assert "identical earlier call" in answers[1].text
    release.set()
    for _ in range(100):
        if done:
            break
        await asyncio.sleep(0.01)
    assert done == ["A1"]  # the first attempt, once; the re-issue never ran


def _file_backed_saver(directory: Any) -> InMemorySaver:
    """An InMemorySaver persisting to files, as ``langgraph dev``'s does."""
    files = iter(range(1, 10))

    def factory(*args: Any) -> PersistentDict:
        return PersistentDict(*args, filename=str(directory / f".checkpoint.{next(files)}.pckl"))

    return InMemorySaver(factory=factory)


async def test_a_file_backed_in_memory_saver_gets_a_ledger_file_beside_it(tmp_path: Any) -> None:
    """``langgraph dev`` keeps threads across restarts in ``.langgraph_api/``: the
    ledger must survive them too, so it is a SQLite file there, not this process."""
    done: list[str] = []
    release, started = asyncio.Event(), asyncio.Event()
    release.set()
    h = build_graph(
        [_refund_tool(done, release, started)],
        [tool_calls(("refund", {"order": "A1"})), text("done")],
        profiles={"refund": ToolProfile(side_effect=True)},
        checkpointer=_file_backed_saver(tmp_path),
    )
    await h.app.ainvoke({"messages": [("user", "refund A1")]}, h.config())
    with contextlib.closing(sqlite3.connect(tmp_path / LEDGER_FILE)) as check:
        rows = check.execute("SELECT tool, status FROM lgr_idempotency").fetchall()
    assert rows == [("refund", "done")]


async def test_a_sync_tools_effect_lands_after_the_cancel_too() -> None:
    """A sync tool of an async run runs in a worker thread, which a cancel cannot stop:
    its outcome is recorded when the thread returns, and the call is answered with it."""
    done: list[str] = []
    release, started = threading.Event(), threading.Event()

    @tool
    def refund(order: str) -> str:
        """Refund an order."""
        started.set()
        release.wait(10)
        done.append(order)
        return f"refunded {order}"

    h = build_graph(
        [refund],
        [tool_calls(("refund", {"order": "A1"})), text("ok")],
        profiles={"refund": ToolProfile(side_effect=True)},
    )
    config = h.config()
    run = asyncio.ensure_future(h.app.ainvoke({"messages": [("user", "refund A1")]}, config))
    await asyncio.to_thread(started.wait, 5)
    run.cancel()
    await asyncio.gather(run, return_exceptions=True)
    release.set()
    for _ in range(200):
        if done:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # the outcome write is a task of its own, after the thread

    result = await h.app.ainvoke({"messages": [HumanMessage("and?")]}, config)
    answer = next(m for m in result["messages"] if isinstance(m, ToolMessage))
    assert answer.text == "refunded A1"
    assert done == ["A1"]
