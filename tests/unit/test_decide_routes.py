"""`decide` returns a failed call's final route: the graph carries it out and decides
nothing. Fallback, planner, human and MCP skip are chosen here from `Paths`, the facts
the graph learned (breakers, budgets, wiring)."""

from __future__ import annotations

import random

import pytest

from langgraph_resilience.core.decision import Decision, Paths, decide, unrecovered
from langgraph_resilience.core.policy import ResiliencePolicy
from langgraph_resilience.errors import FailureClass, ToolError


def _error(failure_class: FailureClass, **context: object) -> ToolError:
    retriable = failure_class is FailureClass.TRANSIENT
    return ToolError(
        type="FakeHTTPError",
        failure_class=failure_class,
        message="HTTP 503" if retriable else "HTTP 404",
        suggested_action="retry" if retriable else "use_fallback",
        retriable=retriable,
        tool="search",
        call_id="call_1",
        context=dict(context),
    )


def _decide(error: ToolError, paths: Paths, *, attempts: int = 1) -> Decision:
    return decide(
        error,
        attempts=attempts,
        task_attempts=attempts,
        elapsed=0.0,
        policy=ResiliencePolicy(max_attempts=3),
        profile=None,
        rng=random.Random(0),
        paths=paths,
    )


def test_a_retry_left_is_taken_before_any_fallback() -> None:
    """Attempts left: retry, whatever else the graph offers."""
    paths = Paths(fallback="backup", can_replan=True, can_escalate=True, skip="weather")
    assert _decide(_error(FailureClass.TRANSIENT), paths).route == "retry"


def test_a_spent_retry_budget_hands_the_call_to_the_fallback() -> None:
    """The shared budget refused the retry: the tool is out, the fallback takes it."""
    paths = Paths(retry_budget=False, fallback="backup")
    decision = _decide(_error(FailureClass.TRANSIENT), paths)
    assert decision == Decision("fallback", exhausted="retry_budget", to="backup")


def test_retries_spent_go_to_the_fallback_then_the_planner() -> None:
    """max_attempts: the fallback when there is one, else the planner."""
    error = _error(FailureClass.TRANSIENT)
    with_fallback = _decide(error, Paths(fallback="backup", can_replan=True), attempts=3)
    assert with_fallback == Decision("fallback", exhausted="max_attempts", to="backup")
    assert _decide(error, Paths(can_replan=True), attempts=3).route == "replan"


def test_a_missing_tool_falls_back_at_once() -> None:
    """STRUCTURAL is not retried: the fallback serves the call."""
    decision = _decide(_error(FailureClass.STRUCTURAL), Paths(fallback="backup"))
    assert (decision.route, decision.to) == ("fallback", "backup")


def test_a_policy_refusal_never_falls_back_and_goes_to_a_human() -> None:
    """A 403 is not the tool being out: a human decides, the fallback is not asked."""
    paths = Paths(fallback="backup", can_replan=True, can_escalate=True)
    assert _decide(_error(FailureClass.POLICY), paths).route == "escalate"


@pytest.mark.parametrize("lost", [{"connection": "refused"}, {"breaker": "open"}])
def test_an_unreachable_mcp_server_is_skipped_when_nothing_else_takes_it(
    lost: dict[str, str],
) -> None:
    """A non-critical MCP tool whose server is down: answered as skipped, naming it."""
    error = _error(FailureClass.STRUCTURAL, **lost)
    assert _decide(error, Paths(skip="weather")) == Decision("skip", to="weather")
    assert _decide(error, Paths(skip="weather", fallback="backup")).route == "fallback"


def test_a_call_of_a_running_plan_is_answered_not_replanned() -> None:
    """The plan executor handles its steps' failures; a fallback still serves them."""
    error = _error(FailureClass.STRUCTURAL)
    assert _decide(error, Paths(in_plan=True, can_replan=True)).route == "agent"
    assert _decide(error, Paths(in_plan=True, fallback="backup")).route == "fallback"


def test_unrecovered_leaves_a_retry_alone() -> None:
    """Only the agent's route is carried on: a retry or repair is already final."""
    retry = Decision("retry", delay=1.0)
    assert unrecovered(_error(FailureClass.TRANSIENT), retry, Paths(fallback="b")) == retry
