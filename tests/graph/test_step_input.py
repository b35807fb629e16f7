"""What the tools step hands LangGraph's `ToolNode`: the graph's state itself when it
already is the step's input (the assistant message is the latest and all its calls
run), else the history up to that message, cut to the calls due now. A tool that
reads the state (`InjectedState`) sees the same either way."""

from __future__ import annotations

from typing import Annotated, Any

from langchain_core.messages import AIMessage, HumanMessage, ToolCall, ToolMessage
from langchain_core.tools import tool
from langgraph.prebuilt import InjectedState

from langgraph_resilience._graph.tool_batch import plan_batch, step_input
from langgraph_resilience._graph.tools import GuardedToolNode
from langgraph_resilience.testing import text, tool_calls
from tests.conftest import Runner, build_graph


@tool
def search(query: str) -> str:
    """Search the catalogue."""
    return f"results for {query}"


@tool
def weather(city: str) -> str:
    """Current weather for a city."""
    return f"sunny in {city}"


def _turn() -> dict[str, Any]:
    calls = [
        ToolCall(name="search", args={"query": "x"}, id="a", type="tool_call"),
        ToolCall(name="weather", args={"city": "Oslo"}, id="b", type="tool_call"),
    ]
    return {"messages": [HumanMessage("hi", id="h"), AIMessage("", tool_calls=calls, id="ai")]}


def test_a_clean_step_hands_toolnode_the_state_itself() -> None:
    settings = GuardedToolNode([search, weather]).settings
    state = _turn()
    batch = plan_batch(settings, state)
    assert batch is not None

    assert step_input(settings, state, batch) is state


def test_a_step_with_an_answered_call_hands_toolnode_only_the_due_ones() -> None:
    settings = GuardedToolNode([search, weather]).settings
    turn = _turn()
    state = {"messages": [*turn["messages"], ToolMessage("done", tool_call_id="a")]}
    batch = plan_batch(settings, state)
    assert batch is not None

    given = step_input(settings, state, batch)

    assert given is not state
    *history, ai = given["messages"]
    assert history == turn["messages"][:1]
    assert [call["id"] for call in ai.tool_calls] == ["b"]
    assert [call["id"] for call in state["messages"][1].tool_calls] == ["a", "b"]  # untouched


def test_a_tool_reading_the_state_sees_the_turn_it_was_called_in(runner: Runner) -> None:
    seen: list[tuple[str, list[str]]] = []

    @tool
    def look(query: str, state: Annotated[dict[str, Any], InjectedState]) -> str:
        """Look something up in the conversation."""
        first, last = state["messages"][0], state["messages"][-1]
        seen.append((first.content, [call["name"] for call in last.tool_calls]))
        return f"looked up {query}"

    h = build_graph(
        [look, weather],
        [tool_calls(("look", {"query": "x"}), ("weather", {"city": "Oslo"})), text("ok")],
    )

    out = runner.invoke(h.app, {"messages": [("user", "find x")]}, h.config())

    assert seen == [("find x", ["look", "weather"])]
    assert out["messages"][-1].content == "ok"
