"""Backoff maths (`backoff_delay`) and the pure routing decision (`decide`)."""

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from langgraph_resilience import FailureClass, ResiliencePolicy, ToolError, ToolProfile
from langgraph_resilience.core import backoff_delay, classify
from langgraph_resilience.core.decision import Decision, decide
from langgraph_resilience.testing import FakeHTTPError


@st.composite
def policies(draw: st.DrawFn) -> ResiliencePolicy:
    """Valid policies: 0 <= base_delay <= max_delay."""
    max_delay = draw(st.floats(0.0, 3600.0, allow_nan=False))
    base_delay = draw(st.floats(0.0, max_delay, allow_nan=False))
    return ResiliencePolicy(base_delay=base_delay, max_delay=max_delay)


_ATTEMPTS = st.integers(0, 200) | st.just(10**6)
_SEEDS = st.integers(0, 2**32 - 1)
_WAITS = st.floats(0.0, 1e6, allow_nan=False)


# ---------------------------------------------------------------------- properties


@settings(deadline=None)
@given(policy=policies(), attempt=_ATTEMPTS, seed=_SEEDS)
def test_delay_is_within_zero_and_max_delay(
    policy: ResiliencePolicy, attempt: int, seed: int
) -> None:
    """Without Retry-After the jittered delay is never negative and never above max_delay."""
    delay = backoff_delay(attempt, policy=policy, rng=random.Random(seed))
    assert delay is not None
    assert 0.0 <= delay <= policy.max_delay_s


@settings(deadline=None)
@given(policy=policies(), attempt=_ATTEMPTS, seed=_SEEDS)
def test_delay_is_within_the_exponential_ceiling(
    policy: ResiliencePolicy, attempt: int, seed: int
) -> None:
    """Attempt n never waits longer than base_delay * 2**n (full jitter below the curve)."""
    delay = backoff_delay(attempt, policy=policy, rng=random.Random(seed))
    assert delay is not None
    if attempt < 60:
        assert delay <= policy.base_delay_s * 2**attempt


@settings(deadline=None)
@given(policy=policies(), attempt=_ATTEMPTS, seed=_SEEDS, retry_after=_WAITS)
def test_retry_after_is_honoured_exactly(
    policy: ResiliencePolicy, attempt: int, seed: int, retry_after: float
) -> None:
    """The server's Retry-After replaces the jitter, even when it exceeds max_delay, up to
    max_retry_after; a longer one is never slept."""
    delay = backoff_delay(attempt, policy=policy, rng=random.Random(seed), retry_after=retry_after)
    assert delay == (None if retry_after > policy.max_retry_after_s else retry_after)


def test_a_day_long_retry_after_is_reported_not_slept() -> None:
    """Retry-After: 86400 is past the 120 s cap: the decision gives up with the reason."""
    error = classify(FakeHTTPError(503, headers={"Retry-After": "86400"}), tool="t")
    decision = decide(
        error,
        attempts=1,
        task_attempts=1,
        elapsed=0.0,
        policy=ResiliencePolicy(),
        profile=None,
        rng=random.Random(0),
    )
    assert decision == Decision("agent", exhausted="retry_after")
    assert error.retry_after_ms == 86_400_000
    assert (
        backoff_delay(
            0,
            policy=ResiliencePolicy(max_retry_after=90_000),
            rng=random.Random(0),
            retry_after=86400.0,
        )
        == 86400.0
    )


@settings(deadline=None)
@given(
    policy=policies(),
    attempt=_ATTEMPTS,
    seed=_SEEDS,
    retry_after=st.none() | _WAITS,
    remaining=st.floats(-10.0, 1e4, allow_nan=False),
)
def test_delay_always_ends_inside_the_deadline(
    policy: ResiliencePolicy,
    attempt: int,
    seed: int,
    retry_after: float | None,
    remaining: float,
) -> None:
    """A returned delay is always < remaining; a delay that would not fit is None."""
    unbounded = backoff_delay(
        attempt, policy=policy, rng=random.Random(seed), retry_after=retry_after
    )
    bounded = backoff_delay(
        attempt,
        policy=policy,
        rng=random.Random(seed),
        retry_after=retry_after,
        remaining=remaining,
    )
    if unbounded is None:  # a Retry-After past max_retry_after is never slept
        assert bounded is None
        return
    if unbounded >= remaining:
        assert bounded is None
    else:
        assert bounded == unbounded
        assert bounded < remaining


@settings(deadline=None)
@given(policy=policies(), attempt=st.integers(0, 62), seed=_SEEDS)
def test_delay_is_exactly_full_jitter(policy: ResiliencePolicy, attempt: int, seed: int) -> None:
    """The delay is uniform(0, min(max_delay, base * 2**n)) drawn from the injected rng.

    (Beyond n = 62 the exponent is capped; only a base below max_delay / 2**62 notices.)
    """
    expected = random.Random(seed).uniform(
        0.0, min(policy.max_delay_s, policy.base_delay_s * 2**attempt)
    )
    assert backoff_delay(attempt, policy=policy, rng=random.Random(seed)) == expected


# ------------------------------------------------------------------- exact examples


@pytest.mark.parametrize("attempt", [0, 1, 2, 3, 5, 8])
def test_fixed_seed_gives_exact_delays(attempt: int) -> None:
    """With seed 42 and the default policy every delay is reproducible to the bit."""
    policy = ResiliencePolicy()
    expected = random.Random(42).uniform(0.0, min(30.0, 0.5 * 2**attempt))
    assert backoff_delay(attempt, policy=policy, rng=random.Random(42)) == expected


def test_successive_delays_consume_one_rng_draw_each() -> None:
    """A shared rng produces the same sequence as computing each draw by hand."""
    policy = ResiliencePolicy(base_delay=1.0, max_delay=10.0)
    rng, reference = random.Random(7), random.Random(7)
    delays = [backoff_delay(n, policy=policy, rng=rng) for n in range(6)]
    assert delays == [reference.uniform(0.0, min(10.0, 2.0**n)) for n in range(6)]


def test_huge_attempt_numbers_do_not_overflow() -> None:
    """Attempt 10**6 is capped at max_delay instead of raising OverflowError."""
    policy = ResiliencePolicy(base_delay=30.0, max_delay=30.0)
    expected = random.Random(3).uniform(0.0, 30.0)
    assert backoff_delay(10**6, policy=policy, rng=random.Random(3)) == expected


def test_zero_base_delay_never_waits() -> None:
    """base_delay=0 means immediate retries."""
    policy = ResiliencePolicy(base_delay=0.0, max_delay=0.0)
    assert backoff_delay(5, policy=policy, rng=random.Random(1)) == 0.0


def test_negative_retry_after_is_treated_as_now() -> None:
    """A Retry-After in the past means retry immediately."""
    policy = ResiliencePolicy()
    assert backoff_delay(0, policy=policy, rng=random.Random(1), retry_after=-5.0) == 0.0


def test_retry_after_above_max_delay_is_not_capped() -> None:
    """A 120 s Retry-After is honoured although max_delay is 30 s."""
    policy = ResiliencePolicy()
    assert backoff_delay(0, policy=policy, rng=random.Random(1), retry_after=120.0) == 120.0


def test_retry_after_beyond_the_deadline_stops() -> None:
    """If the server asks for longer than the deadline leaves, the answer is stop."""
    policy = ResiliencePolicy()
    assert (
        backoff_delay(0, policy=policy, rng=random.Random(1), retry_after=120.0, remaining=60.0)
        is None
    )


def test_delay_equal_to_remaining_stops() -> None:
    """A wait ending exactly at the deadline leaves no time to run the call."""
    policy = ResiliencePolicy()
    assert (
        backoff_delay(0, policy=policy, rng=random.Random(1), retry_after=5.0, remaining=5.0)
        is None
    )


# ------------------------------------------------------------------------ decide()


def _error(
    *,
    retriable: bool = True,
    retry_after_ms: int | None = None,
    failure_class: FailureClass = FailureClass.POLICY,
) -> ToolError:
    """A TRANSIENT 503 envelope, or a non-retriable one of `failure_class`."""
    return ToolError(
        type="FakeHTTPError",
        failure_class=FailureClass.TRANSIENT if retriable else failure_class,
        message="HTTP 503" if retriable else "HTTP 403",
        suggested_action="retry" if retriable else "ask_human",
        retriable=retriable,
        retry_after_ms=retry_after_ms,
        tool="search",
        call_id="call_1",
    )


def _decide(
    error: ToolError | None = None,
    *,
    attempts: int = 1,
    task_attempts: int = 1,
    elapsed: float | None = 0.0,
    policy: ResiliencePolicy | None = None,
    profile: ToolProfile | None = None,
    seed: int = 0,
) -> Decision:
    return decide(
        error or _error(),
        attempts=attempts,
        task_attempts=task_attempts,
        elapsed=elapsed,
        policy=policy or ResiliencePolicy(),
        profile=profile,
        rng=random.Random(seed),
    )


@pytest.mark.parametrize(
    "failure_class", [FailureClass.POLICY, FailureClass.STRUCTURAL, FailureClass.UNKNOWN]
)
def test_non_retriable_goes_back_to_the_agent_unexhausted(failure_class: FailureClass) -> None:
    """A failure that was never retriable is handed back without an exhaustion reason."""
    error = _error(retriable=False, failure_class=failure_class)
    assert _decide(error) == Decision("agent", exhausted=None)


def test_non_retriable_wins_over_every_budget() -> None:
    """Even a side-effecting, over-budget call reports 'not retriable', not exhaustion."""
    decision = _decide(_error(retriable=False), attempts=99, profile=ToolProfile(side_effect=True))
    assert decision == Decision("agent")


def test_side_effect_is_never_retried_blindly() -> None:
    """A retriable failure on a side-effecting tool is given up as 'side_effect'."""
    assert _decide(profile=ToolProfile(side_effect=True)) == Decision(
        "agent", exhausted="side_effect"
    )


@pytest.mark.parametrize(("attempts", "route"), [(1, "retry"), (2, "retry"), (3, "agent")])
def test_max_attempts_counts_the_first_execution(attempts: int, route: str) -> None:
    """With max_attempts=3 the third failed execution is the last."""
    decision = _decide(attempts=attempts)
    assert decision.route == route
    assert decision.exhausted == (None if route == "retry" else "max_attempts")


def test_attempts_beyond_max_are_exhausted() -> None:
    """Overshooting the budget (e.g. after a resume) still stops."""
    assert _decide(attempts=10).exhausted == "max_attempts"


def test_profile_max_attempts_overrides_the_policy() -> None:
    """A tool's own max_attempts replaces the graph's, both up and down."""
    assert _decide(attempts=3, profile=ToolProfile(max_attempts=5)).route == "retry"
    assert _decide(attempts=5, profile=ToolProfile(max_attempts=5)).exhausted == "max_attempts"
    assert _decide(attempts=1, profile=ToolProfile(max_attempts=1)).exhausted == "max_attempts"
    assert _decide(attempts=2, profile=ToolProfile()).route == "retry"


def test_thread_budget_is_shared_by_every_call() -> None:
    """When the thread has spent max_tool_attempts, no call retries."""
    policy = ResiliencePolicy(max_tool_attempts=10)
    assert _decide(attempts=1, task_attempts=10, policy=policy) == Decision(
        "agent", exhausted="max_tool_attempts"
    )
    assert _decide(attempts=1, task_attempts=9, policy=policy).route == "retry"


def test_per_call_budget_is_reported_before_the_thread_budget() -> None:
    """When both are spent, the call's own budget is named."""
    policy = ResiliencePolicy(max_tool_attempts=3)
    assert _decide(attempts=3, task_attempts=3, policy=policy).exhausted == "max_attempts"


@pytest.mark.parametrize("elapsed", [60.0, 61.0, 1e9])
def test_passed_deadline_stops(elapsed: float) -> None:
    """Once the thread's deadline has passed, nothing retries."""
    policy = ResiliencePolicy(deadline=60)
    assert _decide(elapsed=elapsed, policy=policy) == Decision("agent", exhausted="deadline")


def test_unknown_elapsed_counts_from_zero() -> None:
    """Without a start time the whole deadline remains."""
    policy = ResiliencePolicy(deadline=60)
    assert _decide(elapsed=None, policy=policy).route == "retry"


def test_retry_after_beyond_the_remaining_deadline_stops() -> None:
    """A server asking for longer than the deadline leaves ends the call now."""
    policy = ResiliencePolicy(deadline=60)
    decision = _decide(_error(retry_after_ms=30_000), elapsed=40.0, policy=policy)
    assert decision == Decision("agent", exhausted="deadline")


def test_retry_after_inside_the_deadline_is_the_delay() -> None:
    """Retry-After (ms) becomes the delay in seconds, uncapped by max_delay."""
    policy = ResiliencePolicy(max_delay=1.0, deadline=600)
    decision = _decide(_error(retry_after_ms=45_500), elapsed=10.0, policy=policy)
    assert decision == Decision("retry", delay=45.5)


def test_retry_without_deadline_uses_jittered_backoff() -> None:
    """Otherwise the delay is full jitter for retry number attempts-1, from the rng."""
    policy = ResiliencePolicy(base_delay=2.0, max_delay=60.0)
    for attempts in (1, 2):
        expected = random.Random(11).uniform(0.0, min(60.0, 2.0 * 2 ** (attempts - 1)))
        decision = _decide(attempts=attempts, policy=policy, seed=11)
        assert decision == Decision("retry", delay=expected)


def test_retry_with_deadline_room_uses_jittered_backoff() -> None:
    """A deadline with room left does not change the jittered delay."""
    policy = ResiliencePolicy(base_delay=0.5, deadline=300)
    expected = random.Random(5).uniform(0.0, 0.5)
    assert _decide(elapsed=10.0, policy=policy, seed=5) == Decision("retry", delay=expected)
