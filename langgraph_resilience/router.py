"""Routing: the pure `decide()` over a classified failure, and the graph's routers.

`decide` is the one place that maps (envelope, what was spent, policy) to the
next step; the nodes only carry out its `Decision`. The routers are the
`Literal`-typed functions behind the graph's conditional edges, in the style of
LangGraph's `tools_condition`.
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any, Literal

from langgraph_resilience.errors import ExhaustionReason, FailureClass, ToolError
from langgraph_resilience.policy import ResiliencePolicy
from langgraph_resilience.profile import ToolProfile
from langgraph_resilience.retry import backoff_delay
from langgraph_resilience.state import (
    current_tool_call_ids,
    last_ai_message,
    read_ledger,
    read_messages,
)

__all__ = [
    "Decision",
    "decide",
    "decide_repair",
    "route_after_agent",
    "route_after_repair",
    "route_after_tools",
]

Route = Literal["retry", "repair", "agent"]


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    """What to do with one failed call: retry after `delay`, repair it, or hand the
    envelope back to the agent."""

    route: Route
    delay: float = 0.0
    exhausted: ExhaustionReason | None = None
    """Why a recoverable failure is not recovered; None when no path applies."""


def decide_repair(
    error: ToolError,
    *,
    repairs: int,
    llm_calls: int,
    policy: ResiliencePolicy,
    profile: ToolProfile | None,
    can_repair: bool,
) -> Decision:
    """Reflection repair for a SEMANTIC failure, within MAX_REPAIR and the LLM budget.

    A side effect is repaired only when its arguments were rejected before it ran.
    """
    if not can_repair:
        return Decision("agent")
    if profile is not None and profile.side_effect and error.context.get("stage") != "arguments":
        return Decision("agent", exhausted="side_effect")
    if repairs >= policy.max_repair:
        return Decision("agent", exhausted="max_repair")
    if llm_calls >= policy.max_recovery_llm_calls:
        return Decision("agent", exhausted="max_recovery_llm_calls")
    return Decision("repair")


def decide(
    error: ToolError,
    *,
    attempts: int,
    thread_attempts: int,
    elapsed: float | None,
    policy: ResiliencePolicy,
    profile: ToolProfile | None,
    rng: random.Random,
    repairs: int = 0,
    llm_calls: int = 0,
    can_repair: bool = False,
) -> Decision:
    """Decide the next step after a failed execution.

    `attempts` counts executions of this call so far (the failed one included),
    `thread_attempts` every tool execution in the thread, `elapsed` the
    seconds since the thread's first tool call (None if unknown), `repairs`
    the reflection repairs spent on this call, `llm_calls` the thread's
    recovery LLM calls.
    """
    if error.failure_class is FailureClass.SEMANTIC:
        return decide_repair(
            error,
            repairs=repairs,
            llm_calls=llm_calls,
            policy=policy,
            profile=profile,
            can_repair=can_repair,
        )
    if not error.retriable:
        return Decision("agent")
    if profile is not None and profile.side_effect:
        # A side effect is never retried without an idempotency key.
        return Decision("agent", exhausted="side_effect")
    max_attempts = (
        profile.max_attempts
        if profile is not None and profile.max_attempts is not None
        else policy.max_attempts
    )
    if attempts >= max_attempts:
        return Decision("agent", exhausted="max_attempts")
    if thread_attempts >= policy.max_tool_attempts:
        return Decision("agent", exhausted="max_tool_attempts")
    remaining = None
    if policy.deadline_s is not None:
        remaining = policy.deadline_s - (elapsed or 0.0)
        if remaining <= 0:
            return Decision("agent", exhausted="deadline")
    retry_after = None if error.retry_after_ms is None else error.retry_after_ms / 1000.0
    delay = backoff_delay(
        attempts - 1, policy=policy, rng=rng, retry_after=retry_after, remaining=remaining
    )
    if delay is None:
        return Decision("agent", exhausted="deadline")
    return Decision("retry", delay=delay)


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


def _pending(state: Any, messages_key: str) -> set[str]:
    calls = read_ledger(state).get("calls") or {}
    return {
        record["status"]
        for call_id in current_tool_call_ids(state, messages_key)
        if (record := calls.get(call_id)) is not None
    }


def route_after_tools(state: Any, messages_key: str = "messages") -> Route:
    """``repair`` while a call waits for reflection repair, ``retry`` while one waits
    for its backoff, else ``agent`` (every call of the turn is answered)."""
    pending = _pending(state, messages_key)
    if "repair" in pending:
        return "repair"
    if "scheduled" in pending:
        return "retry"
    return "agent"


def route_after_repair(
    state: Any, messages_key: str = "messages"
) -> Literal["repair", "tools", "agent"]:
    """``repair`` again after a rejected repair with budget left, ``tools`` to run the
    repaired (or other waiting) calls, else ``agent``."""
    pending = _pending(state, messages_key)
    if "repair" in pending:
        return "repair"
    if "scheduled" in pending:
        return "tools"
    return "agent"
