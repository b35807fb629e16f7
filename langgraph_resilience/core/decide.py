"""The one decision after a failed tool call: retry, repair, replan, escalate or answer.

`decide` maps (envelope, what was spent, policy) to the next step; the nodes only
carry out its `Decision`. `unrecovered` says where a failure goes when neither retry
nor repair takes it (DESIGN.md section 1); `remembered_gone` is the thread's memory
of a tool that answered STRUCTURAL.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping
from typing import Literal

from langgraph_resilience.core.backoff import backoff_delay, retry_after_exceeded
from langgraph_resilience.core.policy import ResiliencePolicy
from langgraph_resilience.core.profile import ToolProfile
from langgraph_resilience.errors import ExhaustionReason, FailureClass, ToolError

__all__ = ["Decision", "decide", "decide_repair", "remembered_gone", "unrecovered"]

Route = Literal["retry", "repair", "replan", "escalate", "agent"]


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    """What to do with one failed call: retry after `delay`, repair it, or hand the
    envelope back to the agent."""

    route: Route
    delay: float = 0.0
    exhausted: ExhaustionReason | None = None
    """Why a recoverable failure is not recovered; None when no path applies."""


def remembered_gone(
    gone: Mapping[str, float], tool: str, *, now: float, memory: float | None
) -> float | None:
    """When `tool` answered STRUCTURAL within `memory` seconds (None: ever), the time
    it did, else None. The thread then stops calling it: a 404/410 is about the
    endpoint, and asking again only buys the same answer.

    >>> remembered_gone({"geo": 100.0}, "geo", now=150.0, memory=300.0)
    100.0
    >>> remembered_gone({"geo": 100.0}, "geo", now=500.0, memory=300.0) is None
    True
    """
    at = gone.get(tool)
    if at is None or (memory is not None and now - at >= memory):
        return None
    return at


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
    if not can_repair or error.context.get("stage") == "output":
        # An output that breaks its contract is the tool's fault: new arguments won't fix it.
        return Decision("agent")
    if profile is not None and profile.side_effect and error.context.get("stage") != "arguments":
        return Decision("agent", exhausted="side_effect")
    if repairs >= policy.max_repair:
        return Decision("agent", exhausted="max_repair")
    if llm_calls >= policy.max_recovery_llm_calls:
        return Decision("agent", exhausted="max_recovery_llm_calls")
    return Decision("repair")


def unrecovered(
    error: ToolError,
    decision: Decision,
    *,
    can_replan: bool,
    can_escalate: bool,
    in_plan: bool = False,
) -> Decision:
    """Where a failure goes when retry and repair cannot take it (DESIGN.md section 1).

    POLICY and UNKNOWN never reach the planner: a human decides (when
    escalation is on). STRUCTURAL failures, loops and exhausted per-call
    budgets go to the planner, else to a human. A spent thread budget goes to
    a human: a new plan would only spend more. Calls of a running plan are
    answered; the plan executor handles their failure through fallbacks.
    """
    if decision.route != "agent" or in_plan:
        return decision
    human = Decision("escalate", exhausted=decision.exhausted) if can_escalate else decision
    if error.failure_class in (FailureClass.POLICY, FailureClass.UNKNOWN):
        return human
    if decision.exhausted in (
        "max_tool_attempts",
        "max_thread_tool_attempts",
        "max_recovery_llm_calls",
        "side_effect",
    ):
        return human
    replannable = error.failure_class is FailureClass.STRUCTURAL or decision.exhausted in (
        "max_attempts",
        "deadline",
        "retry_after",
        "max_repair",
        "loop",
    )
    if not replannable:
        return decision
    if can_replan:
        return Decision("replan", exhausted=decision.exhausted)
    return human


def decide(
    error: ToolError,
    *,
    attempts: int,
    task_attempts: int,
    elapsed: float | None,
    policy: ResiliencePolicy,
    profile: ToolProfile | None,
    rng: random.Random,
    repairs: int = 0,
    llm_calls: int = 0,
    can_repair: bool = False,
    idempotent: bool = False,
) -> Decision:
    """Decide the next step after a failed execution.

    `attempts` counts executions of this call so far (the failed one included),
    `task_attempts` every tool execution in the current task, `elapsed` the
    seconds since the task's first tool call (None if unknown), `repairs`
    the reflection repairs spent on this call, `llm_calls` the task's
    recovery LLM calls. `idempotent` says side effects run under idempotency
    keys, which is what makes retrying them safe.

    A side effect whose outcome is unknown and that has a ``status_check`` is
    reconciled before anything is counted: asking the service is not an attempt,
    and the tools node only runs it again when the answer is "not done" and
    attempts are left.
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
    side_effect = profile is not None and profile.side_effect
    if (
        error.failure_class is FailureClass.UNKNOWN
        and side_effect
        and idempotent
        and profile is not None
        and profile.status_check is not None
        and bool(error.context.get("maybe_executed"))
    ):
        # the next run asks status_check, never blind; an abandoned attempt that may still
        # land is given its grace first, so "not done" is not heard too early
        return Decision("retry", delay=float(error.context.get("in_flight_s") or 0.0))
    if not error.retriable:
        return Decision("agent")
    if side_effect and not idempotent:
        # A side effect is never retried without an idempotency key.
        return Decision("agent", exhausted="side_effect")
    max_attempts = (
        profile.max_attempts
        if profile is not None and profile.max_attempts is not None
        else policy.max_attempts
    )
    if attempts >= max_attempts:
        return Decision("agent", exhausted="max_attempts")
    if task_attempts >= policy.max_tool_attempts:
        return Decision("agent", exhausted="max_tool_attempts")
    remaining = None
    if policy.deadline_s is not None:
        remaining = policy.deadline_s - (elapsed or 0.0)
        if remaining <= 0:
            return Decision("agent", exhausted="deadline")
    retry_after = None if error.retry_after_ms is None else error.retry_after_ms / 1000.0
    if retry_after_exceeded(retry_after, policy):
        return Decision("agent", exhausted="retry_after")  # never slept: the envelope says how long
    delay = backoff_delay(
        attempts - 1, policy=policy, rng=rng, retry_after=retry_after, remaining=remaining
    )
    if delay is None:
        return Decision("agent", exhausted="deadline")
    return Decision("retry", delay=delay)
