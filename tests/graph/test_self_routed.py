"""The tools node routes itself (`SelfRouted`): the same place the branch after it went.

`add_resilience` wires no conditional edge after the tools node; the node's update
carries its ``goto``, computed by `next_after` on the state the update leaves. Each
test replays a thread's checkpoints and checks every tools step against `next_step`
read on the state the graph actually stored, which is what the branch used to read.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.messages import ToolMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import Command

from langgraph_resilience import EVENT_KEY, ResiliencePolicy
from langgraph_resilience._graph.router import next_after, next_step
from langgraph_resilience.testing import Fault, FaultyTool, ScriptedChatModel, text, tool_calls
from tests.conftest import Harness, Runner, build_graph


@tool
def search(query: str) -> str:
    """Search the web."""
    return f"results for {query}"


@tool
def refund(order_id: int, amount: float) -> str:
    """Refund an order."""
    return f"refunded {amount} on {order_id}"


ROUTES = {"agent": "agent", "__end__": END, "tools": "tools", "retry": "retry", "repair": "repair"}


def _tools_steps(h: Harness, config: dict[str, Any]) -> list[tuple[str, tuple[str, ...]]]:
    """For every tools step of the thread: where `next_step` sends the stored state
    after it, and where the graph went."""
    history = list(h.app.get_state_history(config))[::-1]  # oldest first
    steps = []
    for before, after in itertools.pairwise(history):
        if before.next == ("tools",):
            expected = ROUTES[next_step(after.values)]
            steps.append((expected, after.next))
    return steps


def _routes(chunks: list[Any]) -> list[str]:
    return [c[1]["to"] for c in chunks if c[0] == "custom" and c[1].get(EVENT_KEY) == "route"]


def _check(h: Harness, runner: Runner, config: dict[str, Any]) -> list[str]:
    chunks = runner.stream(
        h.app, {"messages": [("user", "go")]}, config, stream_mode=["custom", "updates"]
    )
    steps = _tools_steps(h, config)
    assert steps, "the thread ran no tools step"
    for expected, went in steps:
        assert went == (() if expected == END else (expected,))
    return _routes(chunks)


def test_a_clean_call_goes_back_to_the_agent(runner: Runner) -> None:
    h = build_graph([search], [tool_calls(("search", {"query": "x"})), text("ok")])
    assert h.app.builder.branches.get("tools") is None  # no conditional edge after tools

    routes = _check(h, runner, h.config())

    assert routes == ["agent"]


def test_a_long_wait_goes_to_the_retry_node(runner: Runner) -> None:
    flaky = FaultyTool(search, [Fault.status(429, retry_after="5")])
    h = build_graph([flaky], [tool_calls(("search", {"query": "x"})), text("ok")])

    routes = _check(h, runner, h.config())

    assert routes == ["retry", "agent"]


def test_a_semantic_failure_goes_to_repair(runner: Runner) -> None:
    repairer = ScriptedChatModel(
        responses=[tool_calls(("refund", {"order_id": 7, "amount": 12.5}))]
    )
    h = build_graph(
        [refund],
        [tool_calls(("refund", {"order_id": 7, "amount": "lots"})), text("ok")],
        repair_model=repairer,
    )

    routes = _check(h, runner, h.config())

    assert routes == ["repair", "tools", "agent"]  # the repair node routes back to tools
    assert repairer.calls == 1


def test_an_exhausted_budget_answers_and_goes_to_the_agent(runner: Runner) -> None:
    down = FaultyTool(search, then=Fault.status(503))
    h = build_graph(
        [down],
        [tool_calls(("search", {"query": "x"})), text("sorry")],
        policy=ResiliencePolicy(max_attempts=2),
    )

    config = h.config()
    routes = _check(h, runner, config)

    assert routes == ["agent"]
    answers = [m for m in h.app.get_state(config).values["messages"] if isinstance(m, ToolMessage)]
    assert [m.status for m in answers] == ["error"]


@pytest.mark.parametrize("update_is_list", [False, True])
def test_next_after_reads_the_ledger_the_update_leaves(update_is_list: bool) -> None:
    """A delta that schedules a retry routes to `retry` though the state before it
    had nothing waiting; a tool's Command in ToolNode's list form is read too."""
    h = build_graph([search], [tool_calls(("search", {"query": "x"})), text("ok")])
    config = h.config()
    h.app.invoke({"messages": [("user", "go")]}, config, interrupt_before=["tools"])
    state = h.app.get_state(config).values
    ai = state["messages"][-1]
    slot = f"{ai.id}:0"
    record = {
        "tool": "search",
        "key": "k",
        "attempts": 1,
        "status": "scheduled",
        "due": 5.0,
        "error": None,
        "call_id": ai.tool_calls[0]["id"],
        "args": {"query": "x"},
    }
    delta = {"messages": [], "resilience": {"calls": {slot: record}, "tool_attempts": 1}}
    update: Any = [Command(update={"messages": []}), delta] if update_is_list else delta

    assert next_step(state) == "agent"  # nothing recorded yet
    assert next_after(state, update) == "retry"


def test_the_drawing_still_names_the_tools_node_s_tools() -> None:
    """LangGraph labels a node with the tools it holds; the wrapper keeps that label."""
    h = build_graph([search, refund], [text("ok")])
    plain = StateGraph(MessagesState)
    plain.add_node("tools", ToolNode([search, refund]))
    plain.add_edge(START, "tools")
    # LangGraph draws the label from 1.2.19 on; on the oldest version pyproject
    # allows, neither drawing has it, and the two must still agree.
    expected = plain.compile().get_graph().nodes["tools"].metadata
    assert h.app.get_graph().nodes["tools"].metadata == expected
    if expected:  # the label as drawn, where this LangGraph draws one
        mermaid = h.app.get_graph().draw_mermaid()
        assert "tools(tools<hr/><small><em>__tools = search, refund</em></small>)" in mermaid


class _Runs(BaseCallbackHandler):
    """The names of the chain runs a graph run starts (what a tracer would show)."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def on_chain_start(self, serialized: Any, inputs: Any, **kwargs: Any) -> None:
        self.names.append(kwargs.get("name") or "")


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_the_package_s_routers_are_not_runs_of_their_own(mode: str) -> None:
    """The routers are plumbing: no traced run each (three a turn cost over a third of the
    clean turn's overhead); the agent and tools nodes still are runs, and a route off
    the clean path is still announced."""
    flaky = FaultyTool(search, [Fault.status(429, retry_after="5")])
    h = build_graph([flaky], [tool_calls(("search", {"query": "x"})), text("ok")])
    runs = _Runs()
    config = {**h.config(), "callbacks": [runs]}
    inp = {"messages": [("user", "go")]}
    kwargs: dict[str, Any] = {"stream_mode": ["custom", "values"]}
    if mode == "sync":
        chunks = list(h.app.stream(inp, config, **kwargs))
    else:
        chunks = [chunk async for chunk in h.app.astream(inp, config, **kwargs)]

    assert {"agent", "tools", "retry"} <= set(runs.names)
    routers = {"route_entry", "route_after_agent", "announced_next_step", "next_step"}
    assert routers.isdisjoint(runs.names), runs.names
    assert _routes(chunks) == ["retry", "agent"]
