"""Model fallback for the agent node: `resilient_model(primary, fallbacks=[...])`.

The agent's own chat model fails too: rate limits, overloaded servers, a model
withdrawn by the provider. `resilient_model` turns a primary model and its
fallbacks into one `BaseChatModel`, so the agent node does not change: errors
are classified, TRANSIENT ones retried with backoff (Retry-After honoured), each
model has its own circuit breaker, and a model that stays down hands the call to
the next one. A 401/403 is raised at once: a bad key is not hidden behind a
fallback (pass ``fallback_on=`` to change that).

Here the primary answers 429 (``Retry-After: 2``) then 503 twice; the backup
serves the call. That failed call (a breaker counts calls, not attempts; this demo
breaker opens on one) also opens the primary's breaker, so every later
call (the agent's next one in the same turn, and the next turn) goes straight to
the backup without touching the primary until the breaker lets a probe through. The
script runs offline: the models are `ScriptedChatModel`s and time is a
`FakeClock` (use your chat models, and drop ``clock=``/``rng=``, to run it for
real, e.g. ``resilient_model(ChatOpenAI(...), [ChatAnthropic(...)])``).

Run it from the repository root:

    python examples/model_fallback.py
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
    BreakerConfig,
    ResiliencePolicy,
    ResilienceState,
    add_resilience,
    resilient_model,
)
from langgraph_resilience.testing import (
    FakeClock,
    FakeHTTPError,
    ScriptedChatModel,
    text,
    tool_calls,
)


@tool
def order_status(order_id: int) -> str:
    """Where an order is."""
    return f"order {order_id}: out for delivery, arrives today"


TOOLS = [order_status]
SKIPPED = (EVENT_KEY, "call_id", "at", "from_state", "to_state")
clock = FakeClock()  # offline only: the default is the system clock

# Offline stand-ins for two providers' chat models.
primary = ScriptedChatModel(
    responses=[
        FakeHTTPError(429, headers={"Retry-After": "2"}),
        FakeHTTPError(503),
        FakeHTTPError(503),
    ]
)
backup = ScriptedChatModel(
    responses=[
        tool_calls(("order_status", {"order_id": 1042})),
        text("Order 1042 is out for delivery and arrives today."),
        text("You're welcome!"),
    ]
)

model = resilient_model(
    primary,
    fallbacks=[backup],
    policy=ResiliencePolicy(max_attempts=3, max_delay=10),
    breaker=BreakerConfig(minimum_calls=1, window_size=1, open_duration=60),
    keys=["model:primary", "model:backup"],  # breaker keys; default: class and model name
    clock=clock,
    rng=random.Random(0),  # offline only: reproducible jitter
)


class State(MessagesState, ResilienceState):
    """The agent's state: messages plus the resilience ledger."""


def agent(state: State) -> dict[str, Any]:
    """The agent node, unchanged: the resilient model binds the tools on every model."""
    return {"messages": [model.bind_tools(TOOLS).invoke(state["messages"])]}


def build_app() -> Any:
    """A ReAct agent graph with resilience added for its tools."""
    builder = StateGraph(State)
    builder.add_node("agent", agent)
    add_resilience(builder, agent="agent", tools=TOOLS, clock=clock, rng=random.Random(0))
    return builder.compile(checkpointer=InMemorySaver())


def ask(app: Any, question: str) -> str:
    """Run one turn, printing each model and tool event; return the answer."""
    config = {"configurable": {"thread_id": "model-fallback"}}
    print(f"user: {question}")
    for chunk in app.stream({"messages": [("user", question)]}, config, stream_mode="custom"):
        if EVENT_KEY in chunk and chunk[EVENT_KEY] != "route":
            details = {k: v for k, v in chunk.items() if k not in SKIPPED}
            print(f"  {chunk[EVENT_KEY]:<22} {details}")
    messages = app.get_state(config).values["messages"]
    print(f"agent: {messages[-1].content}\n")
    return str(messages[-1].content)


def main() -> int:
    """Two turns through the fallback, then a 401 that is not hidden; exit 1 if any differs."""
    app = build_app()
    ask(app, "Where is order 1042?")
    ask(app, "Thanks!")
    state = app.get_state({"configurable": {"thread_id": "model-fallback"}}).values
    tool_results = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    print(f"primary called {primary.calls} times, backup {backup.calls} times")
    print(f"backoff waits: {[round(s, 3) for s in clock.sleeps]} (the first is Retry-After)")

    # A bad API key: POLICY, raised at once, neither retried nor sent to the fallback.
    locked_out = ScriptedChatModel(responses=[FakeHTTPError(401)])
    spare = ScriptedChatModel(responses=[text("unreachable")])
    try:
        resilient_model(locked_out, fallbacks=[spare], clock=FakeClock()).invoke("hi")
    except FakeHTTPError as exc:
        print(f"401: raised {exc!r} after {locked_out.calls} call; fallback calls: {spare.calls}")

    ok = (
        primary.calls == 3  # the second turn never reached it: its breaker is open
        and backup.calls == 3
        and clock.sleeps[0] == 2.0
        and len(tool_results) == 1
        and (locked_out.calls, spare.calls) == (1, 0)
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
