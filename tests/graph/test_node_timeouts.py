"""Node timeouts (LangGraph's `TimeoutPolicy`, ``set_node_defaults(timeout=...)``) on a
graph with side effects: LangGraph gives each timed node attempt a stream writer of its
own, so the writer alone no longer tells one run from another. A run keeps its thread
through every step, and a second run on it is still refused."""

from __future__ import annotations

import asyncio
from typing import Any

from langchain_core.messages import BaseMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import StateGraph
from langgraph.types import Command

from langgraph_resilience import ThreadBusyError, ToolProfile, add_resilience
from langgraph_resilience.testing import FakeClock, ScriptedChatModel, text, tool_calls
from tests.conftest import State

_PAY = {"pay": ToolProfile(side_effect=True)}


def _timed_graph(pay: Any, responses: list[Any], **options: Any) -> Any:
    """The README's graph, every node (ours too) under a 30 s timeout."""
    model = ScriptedChatModel(responses=responses)

    async def agent(state: State) -> dict[str, list[BaseMessage]]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(State).set_node_defaults(timeout=30.0)
    builder.add_node("agent", agent)
    add_resilience(builder, agent="agent", tools=[pay], profiles=_PAY, clock=FakeClock(), **options)
    return builder.compile(checkpointer=InMemorySaver())


def _config(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


def test_a_side_effect_runs_once_under_node_timeouts() -> None:
    paid: list[int] = []

    @tool
    def pay(amount: int) -> str:
        """Pay."""
        paid.append(amount)
        return f"paid {amount}"

    app = _timed_graph(pay, [tool_calls(("pay", {"amount": 10})), text("ok")])
    out = asyncio.run(app.ainvoke({"messages": [("user", "pay 10")]}, _config("t1")))
    assert [m.content for m in out["messages"] if isinstance(m, ToolMessage)] == ["paid 10"]
    assert paid == [10]
    assert out["messages"][-1].content == "ok"


def test_a_second_run_is_still_refused_under_node_timeouts() -> None:
    paid: list[int] = []
    started, finish = asyncio.Event(), asyncio.Event()

    @tool
    async def pay(amount: int) -> str:
        """Pay."""
        started.set()
        if not paid:
            await asyncio.wait_for(finish.wait(), 30)
        paid.append(amount)
        return f"paid {amount}"

    script = [tool_calls(("pay", {"amount": 10})), text("ok")] * 2
    app = _timed_graph(pay, script)

    async def both() -> tuple[Any, Any]:
        first = asyncio.create_task(app.ainvoke({"messages": [("user", "pay 10")]}, _config("t2")))
        await asyncio.wait_for(started.wait(), 30)
        second = app.ainvoke({"messages": [("user", "pay 20")]}, _config("t2"))
        [refused] = await asyncio.gather(second, return_exceptions=True)
        finish.set()
        return await first, refused

    out, refused = asyncio.run(both())
    assert isinstance(refused, ThreadBusyError)
    assert [m.content for m in out["messages"] if isinstance(m, ToolMessage)] == ["paid 10"]
    assert paid == [10]


def test_a_resumed_run_keeps_its_thread_under_node_timeouts() -> None:
    """A resume runs no entry step: its first step of ours takes the thread, and its
    later steps are the same run's."""

    @tool
    def pay(amount: int) -> str:
        """Pay."""
        raise PermissionError("needs approval")

    script = [tool_calls(("pay", {"amount": 1})), text("skipped")]
    app = _timed_graph(pay, script, escalate=True)

    async def run() -> Any:
        paused = await app.ainvoke({"messages": [("user", "pay")]}, _config("t3"))
        assert paused["__interrupt__"]
        return await app.ainvoke(Command(resume={"action": "skip"}), _config("t3"))

    out = asyncio.run(run())
    assert "__interrupt__" not in out
    assert out["messages"][-1].content == "skipped"
