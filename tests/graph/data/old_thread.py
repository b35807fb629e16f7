"""The graph and script of the migration fixture (`make_unbounded_ledger.py`), shared
by the generator and the test so both run the same thread."""

from __future__ import annotations

from typing import Any

from langchain_core.tools import tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import MessagesState, StateGraph

from langgraph_resilience import ResiliencePolicy, ResilienceState, add_resilience
from langgraph_resilience.testing import (
    FakeClock,
    Fault,
    FaultyTool,
    ScriptedChatModel,
    text,
    tool_calls,
)

THREAD = "old-thread"
TURNS = 30
"""Finished tasks before the one left waiting for its retry."""


class State(MessagesState, ResilienceState):
    """The user's state plus the ledger."""


@tool
def lookup(q: str) -> str:
    """Looks `q` up."""
    return f"found {q}"


@tool
def flaky_inner(x: int) -> str:
    """Answers `x`."""
    return f"flaky ok {x}"


def flaky() -> FaultyTool:
    """Fails its first execution with a 503, then answers."""
    return FaultyTool(flaky_inner, [Fault.status(503)], name="flaky")


def script(*, extra: list[Any] | None = None) -> ScriptedChatModel:
    """TURNS clean tasks of two lookups, then the flaky call (and `extra` after it)."""
    responses: list[Any] = []
    for turn in range(TURNS):
        responses += [
            tool_calls(("lookup", {"q": f"a{turn}"}), ("lookup", {"q": f"b{turn}"})),
            text(f"answer {turn}"),
        ]
    responses.append(tool_calls(("flaky", {"x": 1})))
    return ScriptedChatModel(responses=[*responses, *(extra or [])])


def build(
    saver: BaseCheckpointSaver[Any],
    model: ScriptedChatModel,
    *,
    interrupt_before_retry: bool = False,
    clock: FakeClock | None = None,
    flaky_tool: FaultyTool | None = None,
) -> Any:
    def agent(state: State) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(State)
    builder.add_node("agent", agent)
    add_resilience(
        builder,
        agent="agent",
        tools=[lookup, flaky_tool or flaky()],
        clock=clock or FakeClock(),
        policy=ResiliencePolicy(),
    )
    return builder.compile(
        checkpointer=saver, interrupt_before=["retry"] if interrupt_before_retry else None
    )
