"""The graph's routers: the `Literal`-typed functions behind its conditional edges.

In the style of LangGraph's `tools_condition`: `route_after_agent` after the agent
node, `next_step` after every recovery node (the first waiting path, in a fixed
order). The tools node, the one on every turn's path, routes itself (`SelfRouted`,
`next_after`: the same `next_step`, on the state its update leaves). The decisions
themselves are in `core.decision`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, cast

from langchain_core.messages import AnyMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph.message import add_messages
from langgraph.types import Command

from langgraph_resilience._graph.node import ResilienceNode
from langgraph_resilience._graph.state import (
    current_slots,
    current_task,
    last_ai_message,
    merge_tally,
    read_messages,
    read_tally,
    task_view,
)
from langgraph_resilience.events import Event, emit

__all__ = ["Next", "SelfRouted", "next_after", "next_step", "route_after_agent"]


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
"""Where the graph goes once a recovery node has finished the calls of a turn."""


def _pending(state: Any, messages_key: str) -> set[str]:
    calls = read_tally(state).get("calls") or {}
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
    tally = read_tally(state)
    if task_view(tally, current_task(read_messages(state, messages_key))).get("aborted"):
        return "__end__"
    pending = _pending(state, messages_key)
    for status, route in _ORDER:
        if status in pending:
            return route
    plan = tally.get("plan")
    if plan is not None and plan.get("status") == "running":
        return "executor"
    return "agent"


_ORDER: tuple[tuple[str, Next], ...] = (
    ("repair", "repair"),
    ("ready", "tools"),  # repaired or human-approved: runs now, no backoff step
    ("scheduled", "retry"),
    ("escalate", "escalate"),
    ("replan", "planner"),  # last: a plan starts a new AIMessage, so the turn must be finished
)


def next_after(state: Any, update: Any, messages_key: str = "messages") -> Next:
    """`next_step` on the state a node's `update` leaves (a dict, or ToolNode's list of
    Commands and one dict), computed in the node: no branch after it, so LangGraph
    neither copies the channels nor replays the reducers to read that state again.

    The tally delta is merged as the reducer would; the messages matter only for the
    latest assistant and human messages, which ToolMessages never change."""
    parts = update if isinstance(update, list) else [update]
    tally = read_tally(state)
    added: list[Any] = []
    for part in parts:
        body = part.update if isinstance(part, Command) else part
        if not isinstance(body, dict):
            continue  # a Command whose update is not a mapping: nothing the router reads
        if body.get("resilience"):
            tally = merge_tally(tally, body["resilience"])
        added.extend(body.get(messages_key) or [])
    messages = read_messages(state, messages_key)
    if any(not isinstance(message, ToolMessage) for message in added):
        messages = cast("list[AnyMessage]", add_messages(list[Any](messages), added))
    return next_step({messages_key: messages, "resilience": tally}, messages_key)


class SelfRouted(ResilienceNode):
    """A node that routes itself: its update goes out as a `Command` whose ``goto`` is
    `next_after`'s answer (``routes`` maps it to the graph's node names), so the node
    needs no conditional edge. `add_resilience` wires the tools node this way; a graph
    wired by hand keeps `next_step` on its conditional edge."""

    def __init__(self, node: ResilienceNode, routes: Mapping[str, str], messages_key: str) -> None:
        self.node = node
        self.leases_thread = node.leases_thread
        self.routes = dict(routes)
        self.messages_key = messages_key

    @property
    def tools_by_name(self) -> Mapping[str, Any] | None:
        """The wrapped node's tools, which LangGraph's drawing reads to label the node."""
        tools: Mapping[str, Any] | None = getattr(self.node, "tools_by_name", None)
        return tools

    def run(self, state: Any, config: RunnableConfig) -> Any:
        """Sync body: the node's, then the route."""
        return self._routed(state, self.node.run(state, config))

    async def arun(self, state: Any, config: RunnableConfig) -> Any:
        """Async body: the node's, then the route."""
        return self._routed(state, await self.node.arun(state, config))

    def _routed(self, state: Any, update: Any) -> Any:
        to = next_after(state, update, self.messages_key)
        emit(Event("route", to=to))
        goto = self.routes[to]
        if isinstance(update, list):
            return [*update, Command(goto=goto)]
        return Command(update=update, goto=goto)
