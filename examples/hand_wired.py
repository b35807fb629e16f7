"""Wire the prebuilt nodes into your own graph by hand, as LangGraph's `ToolNode`.

`add_resilience` is a convenience: it adds the package's nodes and edges for you.
Each node is also a public building block, so a graph that needs its own routing
(its own node names, an extra branch, only some of the recovery paths) wires them
itself, exactly as it would wire `ToolNode` and `tools_condition`:

- `AnswerPendingNode` on the way in from START: a tool call a new human message
  interrupted is answered before the model is called again;
- `GuardedToolNode` in place of ``ToolNode``: classifies every failure, records it
  in the checkpointed ledger and answers every call (it never waits);
- `RetryNode` waits out a scheduled backoff, then hands back to the tools;
- `route_after_agent` in place of ``tools_condition``; `next_step` after the tools
  and every recovery node (``retry`` or ``agent`` here: with no repair model,
  planner or escalation, those are the only ways on).

Here the weather tool answers 503 once; the hand-wired graph retries it and the
agent receives the clean result. Offline like the other examples: a
`ScriptedChatModel`, a `FaultyTool` and a `FakeClock`.

Run it from the repository root:

    python examples/hand_wired.py
"""

from __future__ import annotations

import random
import sys
from typing import Any

from langchain_core.messages import ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph

from langgraph_resilience import (
    AnswerPendingNode,
    GuardedToolNode,
    ResiliencePolicy,
    ResilienceState,
    RetryNode,
    next_step,
    route_after_agent,
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


TOOLS = [FaultyTool(get_weather, [Fault.status(503)])]
model = ScriptedChatModel(
    responses=[
        tool_calls(("get_weather", {"city": "Amsterdam"})),
        text("Take an umbrella: 14°C and light rain in Amsterdam."),
    ]
)


class State(MessagesState, ResilienceState):
    """The agent's state: messages plus the resilience ledger."""


def agent(state: State) -> dict[str, Any]:
    """The agent node: the model decides to call tools or to answer."""
    return {"messages": [model.bind_tools(TOOLS).invoke(state["messages"])]}


def build_app() -> Any:
    """The graph, wired by hand from the public nodes."""
    clock = FakeClock()  # offline only: the default is the system clock
    builder = StateGraph(State)
    builder.add_node("agent", agent)
    builder.add_node("answer_pending", AnswerPendingNode())
    builder.add_node(
        "tools",
        GuardedToolNode(
            TOOLS, policy=ResiliencePolicy(max_attempts=3), clock=clock, rng=random.Random(0)
        ),
    )
    builder.add_node("retry", RetryNode(clock=clock))
    builder.add_edge(START, "answer_pending")
    builder.add_edge("answer_pending", "agent")
    builder.add_conditional_edges("agent", route_after_agent, {"tools": "tools", "__end__": END})
    builder.add_conditional_edges(
        "tools", next_step, {"retry": "retry", "agent": "agent", "__end__": END}
    )
    builder.add_edge("retry", "tools")
    return builder.compile(checkpointer=InMemorySaver())


def main() -> int:
    """Run one question; exit 1 if the tool call was not recovered."""
    app = build_app()
    config = {"configurable": {"thread_id": "hand-wired-example"}}
    for chunk in app.stream({"messages": [("user", "Weather in Amsterdam?")]}, config):
        print(f"-- {', '.join(chunk)} done")
    state = app.get_state(config).values
    results = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    failed = [m for m in results if tool_error_of(m) is not None]
    print("\nanswer:", state["messages"][-1].content)
    print("tool executions:", state["resilience"]["tool_attempts"])
    return 1 if failed or len(results) != 1 else 0


if __name__ == "__main__":
    sys.exit(main())
