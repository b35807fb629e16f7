"""Retry: capped exponential backoff with full jitter (pure), and the retry node.

The tools node decides *whether* and *how long*; the retry node only waits
until the due time stored in the ledger and hands back to the tools node.
Because the due time is wall-clock and checkpointed, a thread resumed after a
crash waits only what remains of its backoff.
"""

from __future__ import annotations

import random
from typing import Any

from langchain_core.runnables import RunnableConfig

from langgraph_resilience.clock import Clock
from langgraph_resilience.events import Event, emit
from langgraph_resilience.policy import ResiliencePolicy
from langgraph_resilience.state import Ledger, current_slots, read_ledger

__all__ = [
    "LEDGER_RETRY_DELAYS",
    "RetryNode",
    "backoff_delay",
    "ledger_retry_delay",
    "next_due",
    "retry_after_exceeded",
]

_MAX_EXPONENT = 62
"""2**62 * any sane base already exceeds every cap; larger exponents overflow floats."""


def backoff_delay(
    attempt: int,
    *,
    policy: ResiliencePolicy,
    rng: random.Random,
    retry_after: float | None = None,
    remaining: float | None = None,
) -> float | None:
    """Seconds to wait before retry number `attempt` (0-based), or None to stop.

    Full jitter: uniform(0, min(max_delay, base_delay * 2**attempt)). A server's
    Retry-After (seconds) replaces the jittered value, because the server knows
    better, up to ``policy.max_retry_after``: a longer wait is never slept (None;
    `retry_after_exceeded` tells this case apart). `remaining` is what is left of
    the deadline: a wait that would not end inside it is pointless, so the answer
    is None (stop, budget exhausted).

    >>> backoff_delay(0, policy=ResiliencePolicy(), rng=random.Random(1)) <= 0.5
    True
    """
    if retry_after is not None:
        if retry_after_exceeded(retry_after, policy):
            return None
        delay = max(0.0, retry_after)
    else:
        ceiling = min(policy.max_delay_s, policy.base_delay_s * 2 ** min(attempt, _MAX_EXPONENT))
        delay = rng.uniform(0.0, ceiling)
    if remaining is not None and delay >= remaining:
        return None
    return delay


LEDGER_RETRY_DELAYS = (0.05, 0.2, 0.8, 2.0)
"""Waits between attempts of one ledger operation (a database error is transient: a
restart, a failover, a dropped pooled connection): about 3 s in all, then it gives up."""


def ledger_retry_delay(attempt: int) -> float | None:
    """The wait before retrying a ledger operation that failed `attempt` times, or None.

    >>> ledger_retry_delay(1), ledger_retry_delay(5)
    (0.05, None)
    """
    return LEDGER_RETRY_DELAYS[attempt - 1] if attempt <= len(LEDGER_RETRY_DELAYS) else None


def retry_after_exceeded(retry_after: float | None, policy: ResiliencePolicy) -> bool:
    """Whether a server-directed wait is longer than the policy lets a call sleep.

    >>> retry_after_exceeded(86400.0, ResiliencePolicy())
    True
    """
    return retry_after is not None and retry_after > policy.max_retry_after_s


def next_due(ledger: Ledger, slots: list[str]) -> float | None:
    """The earliest due time among the scheduled calls in `slots`, or None."""
    calls = ledger.get("calls") or {}
    dues = [
        record["due"] or 0.0
        for slot in slots
        if (record := calls.get(slot)) is not None and record["status"] == "scheduled"
    ]
    return min(dues) if dues else None


class RetryNode:
    """Waits (through the injected clock) until the next scheduled retry is due."""

    def __init__(self, *, clock: Clock, messages_key: str = "messages") -> None:
        self.clock = clock
        self.messages_key = messages_key

    def _wait(self, state: Any) -> tuple[float, list[str]]:
        ledger = read_ledger(state)
        calls = ledger.get("calls") or {}
        slots = [
            slot
            for slot in current_slots(state, self.messages_key)
            if slot in calls and calls[slot]["status"] == "scheduled"
        ]
        due = next_due(ledger, slots)
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
