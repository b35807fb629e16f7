"""The decisions after a failure: a tool call's and a model call's, on one retry rule.

`decide` maps (envelope, what was spent, policy, the ways out the graph offers:
`Paths`) to a tool call's final route, fallback and MCP skip included; the nodes only
carry out its `Decision`. `decide_model` does the same for one model of a
`resilient_model` chain (retry, fall back, raise). Both ask `retry_wait` whether and
how long to wait, with one attempt convention: `attempts` counts the executions
made, the failed one included. `unrecovered` says where a tool failure goes when
neither retry nor repair takes it (DESIGN.md section 1); `remembered_gone` is the
thread's memory of a tool that answered STRUCTURAL; `retry_in_step` says where a
retry's wait is slept (inside the tools step, or in the checkpointed retry node).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping
from typing import Literal, cast

from langgraph_resilience.core.backoff import backoff_delay, retry_after_exceeded
from langgraph_resilience.core.policy import ResiliencePolicy
from langgraph_resilience.core.profile import ToolProfile
from langgraph_resilience.errors import ExhaustionReason, FailureClass, ToolError

__all__ = [
    "DEFAULT_FALLBACK_ON",
    "Decision",
    "Paths",
    "decide",
    "decide_model",
    "decide_repair",
    "remembered_gone",
    "retry_in_step",
    "retry_wait",
    "unrecovered",
]

Route = Literal["retry", "repair", "fallback", "replan", "escalate", "skip", "agent", "raise"]

WaitRefused = Literal["max_attempts", "deadline", "retry_after", "retry_after_too_long"]
"""Why a retriable failure is not retried."""

DEFAULT_FALLBACK_ON = frozenset({FailureClass.TRANSIENT, FailureClass.STRUCTURAL})
"""Failure classes that hand a model call to the next model: an overloaded or missing
model. Add POLICY to fall back on a provider's 401/403/quota refusal too."""


def retry_wait(
    error: ToolError,
    *,
    attempts: int,
    max_attempts: int,
    remaining: float | None,
    policy: ResiliencePolicy,
    rng: random.Random,
    patience: float | None = None,
) -> float | WaitRefused:
    """Seconds to wait before retrying a retriable `error`, or why it is not retried.

    `attempts` counts the executions made, the failed one included; `remaining` is
    the time left before the deadline (None: no deadline). A Retry-After beyond
    ``policy.max_retry_after`` is never slept; one beyond `patience` (given when an
    alternative can serve the call at once, such as a fallback model) is not either.

    >>> err = ToolError(type="HTTPError", failure_class="transient", message="503",
    ...                 suggested_action="retry", retriable=True)
    >>> retry_wait(err, attempts=3, max_attempts=3, remaining=None,
    ...            policy=ResiliencePolicy(), rng=random.Random(0))
    'max_attempts'
    """
    if attempts >= max_attempts:
        return "max_attempts"
    if remaining is not None and remaining <= 0:
        return "deadline"
    retry_after = None if error.retry_after_ms is None else error.retry_after_ms / 1000.0
    if retry_after_exceeded(retry_after, policy):
        return "retry_after"  # never slept: the envelope says how long
    if patience is not None and retry_after is not None and retry_after > patience:
        return "retry_after_too_long"
    delay = backoff_delay(
        attempts - 1, policy=policy, rng=rng, retry_after=retry_after, remaining=remaining
    )
    return "deadline" if delay is None else delay


def retry_in_step(wait: float, policy: ResiliencePolicy) -> bool:
    """Whether a retry that waits `wait` seconds is slept inside the tools step.

    A short wait (at most ``policy.inline_retry_max_wait``) is slept on the step's
    clock and the call runs again in the same step: two checkpoints fewer per retry.
    A longer one is scheduled in the tally and slept by the retry node, so a crash
    during it resumes with only what remains of it, and the right attempt count.

    The crash rule: a step's in-step attempts are checkpointed when the step ends.
    If the process dies inside the step, the thread resumes from the checkpoint
    before it, with the attempt counts that checkpoint holds, and the step runs
    again: the executions of the lost step are repeated once (never more per crash:
    the step's own retries stop at ``max_attempts``, and a resumed step counts from
    the checkpoint again). The budgets still hold within every run of the step. A
    side effect is never repeated: each of its executions is claimed in the
    exactly-once ledger before it runs, durably, so the re-run finds the claim and
    reconciles it instead of executing again.

    >>> retry_in_step(0.4, ResiliencePolicy())
    True
    >>> retry_in_step(30.0, ResiliencePolicy())
    False
    >>> retry_in_step(0.0, ResiliencePolicy(inline_retry_max_wait=None))
    False
    """
    limit = policy.inline_retry_max_wait_s
    return limit is not None and wait <= limit


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    """What to do with one failed call: retry after `delay`, repair it, hand it to the
    fallback tool `to` (for a model: the next model of its chain), to the planner or a
    human, answer it as skipped (its MCP server, `to`, is unreachable), hand the
    envelope back to the agent, or (a model chain) raise it to the caller."""

    route: Route
    delay: float = 0.0
    exhausted: ExhaustionReason | None = None
    """Why a recoverable failure is not recovered; None when no path applies."""
    to: str = ""
    """The fallback tool (``fallback``) or the unreachable MCP server (``skip``)."""
    reason: str = ""
    """Why a model call took its route (`decide_model`): ``transient`` for a retry,
    else the wait refused (`WaitRefused`) or the failure class that decided."""


@dataclasses.dataclass(frozen=True, slots=True)
class Paths:
    """The ways out of a failure the graph offers besides retry and repair, as facts
    `decide` reads: the graph learns them (breakers, budgets, wiring), `decide` chooses."""

    retry_budget: bool = True
    """False once the shared retry budget refused a token."""
    fallback: str = ""
    """The next fallback tool still worth a call (not tried, breaker not open)."""
    can_replan: bool = False
    can_escalate: bool = False
    in_plan: bool = False
    """The call is a step of a running plan: its executor handles the failure."""
    skip: str = ""
    """The MCP server a non-critical tool's failure shows unreachable."""


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


def unrecovered(error: ToolError, decision: Decision, paths: Paths) -> Decision:
    """Where a failure goes when retry and repair cannot take it (DESIGN.md section 1).

    A tool that is out (STRUCTURAL, or its retries spent) hands the call to its next
    fallback (`paths.fallback`). Else POLICY and UNKNOWN never reach the planner: a
    human decides (when escalation is on). An open breaker never reaches a human: the
    planner, else the agent (with the breaker's ``retry_after``). Other STRUCTURAL
    failures, loops and exhausted per-call budgets go to the planner, else to a human.
    A spent thread budget goes to a human: a new plan would only spend more. Calls of
    a running plan are answered; the plan executor handles their failure through
    fallbacks. What is left for the agent is answered as skipped when its MCP server
    is unreachable (`paths.skip`).
    """
    if decision.route != "agent":
        return decision
    if paths.fallback and _tool_out(error, decision):
        return Decision("fallback", exhausted=decision.exhausted, to=paths.fallback)
    onward = _onward(error, decision, paths)
    if onward.route == "agent" and paths.skip:
        return Decision("skip", exhausted=onward.exhausted, to=paths.skip)
    return onward


def _onward(error: ToolError, decision: Decision, paths: Paths) -> Decision:
    """The planner, a human, or the agent, for a failure no tool takes."""
    can_replan, can_escalate = paths.can_replan, paths.can_escalate
    if paths.in_plan:
        return decision
    human = Decision("escalate", exhausted=decision.exhausted) if can_escalate else decision
    if error.context.get("breaker") == "open":
        # An outage the breaker knows of, and the call never ran: a human cannot fix it.
        # Another path (a plan), else the agent is told when the tool may work again.
        return Decision("replan", exhausted=decision.exhausted) if can_replan else decision
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


def _reconcilable(error: ToolError, profile: ToolProfile | None) -> bool:
    """A side effect that may have run, whose service can say whether it did."""
    return (
        error.failure_class is FailureClass.UNKNOWN
        and profile is not None
        and profile.side_effect
        and profile.status_check is not None
        and bool(error.context.get("maybe_executed"))
    )


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
    paths: Paths = Paths(),
) -> Decision:
    """Decide where a failed execution goes: the final route, which the graph carries
    out without deciding anything more.

    `attempts` counts executions of this call so far (the failed one included),
    `task_attempts` every tool execution in the current task, `elapsed` the
    seconds since the task's first tool call (None if unknown), `repairs`
    the reflection repairs spent on this call, `llm_calls` the task's
    recovery LLM calls. `idempotent` says side effects run under idempotency
    keys, which is what makes retrying them safe.

    A retry the budget refuses, and a failure neither retry nor repair takes, goes to
    the fallback tool when the tool is out (STRUCTURAL, or its retries spent), then
    where `unrecovered` sends it; a non-critical MCP tool whose server is unreachable
    is then answered as skipped.

    A side effect whose outcome is unknown and that has a ``status_check`` is
    reconciled before anything is counted: asking the service is not an attempt,
    and the tools node only runs it again when the answer is "not done" and
    attempts are left.
    """
    first = _recovery(
        error,
        attempts=attempts,
        task_attempts=task_attempts,
        elapsed=elapsed,
        policy=policy,
        profile=profile,
        rng=rng,
        repairs=repairs,
        llm_calls=llm_calls,
        can_repair=can_repair,
        idempotent=idempotent,
    )
    if first.route == "retry" and not paths.retry_budget:
        first = Decision("agent", exhausted="retry_budget")
    return first if first.route != "agent" else unrecovered(error, first, paths)


def _tool_out(error: ToolError, decision: Decision) -> bool:
    """The tool itself cannot serve the call now (missing, breaker open, retries
    spent), so another tool may: a fallback's case."""
    return error.failure_class is FailureClass.STRUCTURAL or decision.exhausted in (
        "max_attempts",
        "deadline",
        "retry_after",
        "retry_budget",
    )


def _recovery(
    error: ToolError,
    *,
    attempts: int,
    task_attempts: int,
    elapsed: float | None,
    policy: ResiliencePolicy,
    profile: ToolProfile | None,
    rng: random.Random,
    repairs: int,
    llm_calls: int,
    can_repair: bool,
    idempotent: bool,
) -> Decision:
    """Retry, repair, or neither (``agent``, with why): the call's own recovery."""
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
    if idempotent and _reconcilable(error, profile):
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
    remaining = None if policy.deadline_s is None else policy.deadline_s - (elapsed or 0.0)
    wait = retry_wait(
        error,
        attempts=attempts,
        max_attempts=max_attempts,
        remaining=remaining,
        policy=policy,
        rng=rng,
    )
    if isinstance(wait, str):
        return Decision("agent", exhausted=cast("ExhaustionReason", wait))
    return Decision("retry", delay=wait)


def decide_model(
    error: ToolError,
    *,
    attempts: int,
    policy: ResiliencePolicy,
    rng: random.Random,
    elapsed: float,
    has_fallback: bool,
    fallback_on: frozenset[FailureClass] = DEFAULT_FALLBACK_ON,
) -> Decision:
    """Decide the next step after an attempt on one model of a chain failed: a
    `Decision` routed ``retry`` (after `delay`), ``fallback`` (the next model) or
    ``raise``, with its `reason`: ``transient`` for a retry, else ``max_attempts``,
    ``deadline``, ``retry_after`` (a Retry-After beyond ``policy.max_retry_after`` and
    no fallback), ``retry_after_too_long`` (a Retry-After not waited for because a
    fallback can serve the call), or the failure class that decided.

    `attempts` counts the attempts made on this model in this call, the failed one
    included, as for tools (and as the envelope's ``error.attempt`` and the events
    do). TRANSIENT errors are retried (`retry_wait`) while ``policy.max_attempts``
    and ``policy.deadline`` allow. A Retry-After beyond ``policy.max_retry_after``
    falls back when the next model can take the call (``retry_after_too_long``),
    else it is raised (``retry_after``), never slept; when the next model can take
    the call, a Retry-After beyond ``policy.max_delay`` is not waited for either. A
    failure that is not retried falls back when its class is in `fallback_on` and a
    next model exists, else it is raised.

    >>> err = ToolError(type="HTTPError", failure_class="policy", message="401",
    ...                 suggested_action="ask_human", retriable=False)
    >>> decide_model(err, attempts=1, policy=ResiliencePolicy(), rng=random.Random(0),
    ...              elapsed=0.0, has_fallback=True).route
    'raise'
    """
    reason = error.failure_class.value
    can_fall_back = has_fallback and error.failure_class in fallback_on
    if error.retriable:
        wait = retry_wait(
            error,
            attempts=attempts,
            max_attempts=policy.max_attempts,
            remaining=None if policy.deadline_s is None else policy.deadline_s - elapsed,
            policy=policy,
            rng=rng,
            patience=policy.max_delay_s if can_fall_back else None,
        )
        if not isinstance(wait, str):
            return Decision("retry", delay=wait, reason="transient")
        reason = "retry_after_too_long" if wait == "retry_after" and can_fall_back else wait
    if can_fall_back:
        return Decision("fallback", reason=reason)
    return Decision("raise", reason=reason)
