"""The retry node: it waits, through the injected clock, until a scheduled retry is due.

The tools node decides *whether* and *how long* (`core.decision`, `core.backoff`); this
node only waits until the due time stored in the tally and hands back to the tools
node. Because the due time is wall-clock and checkpointed, a thread resumed after a
crash waits only what remains of its backoff. It sees only long waits (beyond
``policy.inline_retry_max_wait``): the tools step sleeps a short one itself
(`_graph.inline_retry`).
"""

from __future__ import annotations

from typing import Any

from langchain_core.runnables import RunnableConfig

from langgraph_resilience._graph.node import ResilienceNode
from langgraph_resilience._graph.state import Tally, current_slots, read_tally
from langgraph_resilience.core.clock import Clock, SystemClock
from langgraph_resilience.events import Event, emit

__all__ = ["RetryNode", "next_due"]


def next_due(tally: Tally, slots: list[str]) -> float | None:
    """The earliest due time among the scheduled calls in `slots`, or None."""
    calls = tally.get("calls") or {}
    dues = [
        record["due"] or 0.0
        for slot in slots
        if (record := calls.get(slot)) is not None and record["status"] == "scheduled"
    ]
    return min(dues) if dues else None


class RetryNode(ResilienceNode):
    """Waits (through the injected clock) until the next scheduled retry is due."""

    def __init__(self, *, clock: Clock | None = None, messages_key: str = "messages") -> None:
        self.clock = clock or SystemClock()
        self.messages_key = messages_key

    def _wait(self, state: Any) -> tuple[float, list[str]]:
        tally = read_tally(state)
        calls = tally.get("calls") or {}
        slots = [
            slot
            for slot in current_slots(state, self.messages_key)
            if slot in calls and calls[slot]["status"] == "scheduled"
        ]
        due = next_due(tally, slots)
        wait = 0.0 if due is None else max(0.0, due - self.clock.time())
        ids = [calls[slot].get("call_id") or slot for slot in slots]
        return wait, ids

    def run(self, state: Any, config: RunnableConfig) -> dict[str, Any]:
        """Sync body: block for the remaining backoff."""
        wait, ids = self._wait(state)
        emit(Event("backoff", seconds=round(wait, 6), calls=ids))
        if wait > 0:
            self.clock.sleep(wait)
        return {"resilience": {"events": {"backoff": 1}}}

    async def arun(self, state: Any, config: RunnableConfig) -> dict[str, Any]:
        """Async body: suspend for the remaining backoff without blocking the loop."""
        wait, ids = self._wait(state)
        emit(Event("backoff", seconds=round(wait, 6), calls=ids))
        if wait > 0:
            await self.clock.asleep(wait)
        return {"resilience": {"events": {"backoff": 1}}}
