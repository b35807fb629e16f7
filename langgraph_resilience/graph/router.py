"""The graph's routers: the `Literal`-typed functions behind its conditional edges.

In the style of LangGraph's `tools_condition`: `route_after_agent` after the agent
node, `next_step` after every recovery node (the first waiting path, in a fixed
order). The decisions themselves are in `core.decide`.
"""

from __future__ import annotations

from typing import Any, Literal

from langgraph_resilience.graph.state import (
    current_slots,
    current_task,
    last_ai_message,
    read_ledger,
    read_messages,
    task_view,
)

__all__ = ["Next", "next_step", "route_after_agent"]


def route_after_agent(state: Any, messages_key: str = "messages") -> Literal["tools", "__end__"]:
    """``tools`` if the latest message is an `AIMessage` with (valid or invalid) tool calls."""
    messages = read_messages(state, messages_key)
    if not messages:
        return "__end__"
    found = last_ai_message(messages[-1:])
    if found is None:
        return "__end__"
    ai = found[1]
    return "tools" if ai.tool_calls or ai.invalid_tool_calls else "__end__"


Next = Literal["repair", "tools", "retry", "planner", "escalate", "executor", "agent", "__end__"]
"""Where the graph goes once a recovery node has settled the calls of a turn."""


def _pending(state: Any, messages_key: str) -> set[str]:
    calls = read_ledger(state).get("calls") or {}
    return {
        "ready" if record["status"] == "scheduled" and record["due"] is None else record["status"]
        for slot in current_slots(state, messages_key)
        if (record := calls.get(slot)) is not None
    }


def next_step(state: Any, messages_key: str = "messages") -> Next:
    """The router after every recovery node: the first waiting path, in a fixed order.

    repair (a bad call is fixed before anything waits), tools (a repaired or
    approved call, due at once), retry (backoff, then
    the tools node runs every due call), escalate, planner; then the plan
    executor while a replan runs; then the agent once every call of the turn
    is answered. An aborted task ends the run (the next human message starts afresh).
    """
    ledger = read_ledger(state)
    if task_view(ledger, current_task(read_messages(state, messages_key))).get("aborted"):
        return "__end__"
    pending = _pending(state, messages_key)
    for status, route in _ORDER:
        if status in pending:
            return route
    plan = ledger.get("plan")
    if plan is not None and plan.get("status") == "running":
        return "executor"
    return "agent"


_ORDER: tuple[tuple[str, Next], ...] = (
    ("repair", "repair"),
    ("ready", "tools"),  # repaired or human-approved: runs now, no backoff step
    ("scheduled", "retry"),
    ("escalate", "escalate"),
    ("replan", "planner"),  # last: a plan starts a new AIMessage, so the turn must be settled
)
