"""Add resilience to an existing ReAct-style LangGraph agent.

A ReAct agent is an LLM node that calls tools and loops until it answers. Built
the usual way, with `ToolNode` and `tools_condition`, one failing tool call
ends the run or reaches the model as a raw traceback. Three changes, marked
``(resilience)`` below, make it classify and recover every failure instead:

1. the state mixes in `ResilienceState` (the checkpointed ledger and budgets);
2. `add_resilience(...)` replaces ``ToolNode`` + ``tools_condition`` + the
   tools -> agent edge;
3. the graph is compiled with a checkpointer, so budgets survive a resume.

Here the weather tool answers 503, then 429 with ``Retry-After: 1``, and the
events tool times out once; the agent still receives two clean results. The
script runs offline: the model is a `ScriptedChatModel`, the faults come from
`FaultyTool` and time from a `FakeClock` (use your chat model and tools, and
drop ``clock=``/``rng=``, to run it for real).

Run it from the repository root:

    python examples/react_agent.py
"""

from __future__ import annotations

import random
import sys
from typing import Any

from langchain_core.messages import ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import MessagesState, StateGraph

from langgraph_resilience import (
    EVENT_KEY,
    ResiliencePolicy,
    ResilienceState,
    add_resilience,
    tool_error_of,
)
from langgraph_resilience.testing import (
    FakeClock,
    Fault,
    FaultyTool,
    ScriptedChatModel,
    text,
    tool_calls,
)


@tool
def get_weather(city: str) -> str:
    """Current weather for a city."""
    return f"{city}: 14°C, light rain"


@tool
def search_events(city: str, date: str) -> str:
    """Events in a city on a date."""
    return f"{city}, {date}: jazz at the Bimhuis, 20:30"


# Offline stand-ins for real tools and a real model.
TOOLS = [
    FaultyTool(get_weather, [Fault.status(503), Fault.status(429, retry_after="1")]),
    FaultyTool(search_events, [Fault.timeout()]),
]
model = ScriptedChatModel(
    responses=[
        tool_calls(
            ("get_weather", {"city": "Amsterdam"}),
            ("search_events", {"city": "Amsterdam", "date": "2026-05-02"}),
        ),
        text("Take an umbrella (14°C, light rain); there is jazz at the Bimhuis at 20:30."),
    ]
)


class State(MessagesState, ResilienceState):  # (resilience) was: MessagesState
    """The agent's state: messages plus the resilience ledger."""


def agent(state: State) -> dict[str, Any]:
    """The ReAct agent node: the model decides to call tools or to answer."""
    return {"messages": [model.bind_tools(TOOLS).invoke(state["messages"])]}


def build_app() -> Any:
    """The usual ReAct graph, with resilience added."""
    builder = StateGraph(State)
    builder.add_node("agent", agent)
    # (resilience) was:
    #   builder.add_node("tools", ToolNode(TOOLS))
    #   builder.add_conditional_edges("agent", tools_condition)
    #   builder.add_edge("tools", "agent")
    add_resilience(
        builder,
        agent="agent",
        tools=TOOLS,
        policy=ResiliencePolicy(max_attempts=3, deadline=60),
        clock=FakeClock(),  # offline only: the default is the system clock
        rng=random.Random(0),  # offline only: reproducible jitter
    )
    return builder.compile(checkpointer=InMemorySaver())  # (resilience) a checkpointer


def main() -> int:
    """Run one question through the agent; exit 1 if a tool call was not recovered."""
    app = build_app()
    config = {"configurable": {"thread_id": "react-example"}}
    question = {"messages": [("user", "What's the weather in Amsterdam, and what's on May 2?")]}
    for mode, chunk in app.stream(question, config, stream_mode=["updates", "custom"]):
        if mode == "custom" and EVENT_KEY in chunk:
            details = {k: v for k, v in chunk.items() if k not in (EVENT_KEY, "call_id")}
            print(f"  {chunk[EVENT_KEY]:<16} {details}")
        elif mode == "updates":
            print(f"-- {', '.join(chunk)} done")

    state = app.get_state(config).values
    results = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    failed = [m for m in results if tool_error_of(m) is not None]
    print("\nanswer:", state["messages"][-1].content)
    print(f"tool results: {len(results) - len(failed)} ok, {len(failed)} failed")
    print("tool executions:", state["resilience"]["tool_attempts"])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
