"""Error-amplification maths: task_failure, its inverses and the cost of retries."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from langgraph_resilience import ConfigurationError
from langgraph_resilience.core.reliability import (
    expected_attempts,
    max_error_rate,
    retries_needed,
    task_failure,
)

_RATES = st.floats(0.0, 1.0, allow_nan=False)
_OPEN_RATES = st.floats(1e-6, 1.0, exclude_max=True, allow_nan=False)
_STEPS = st.integers(0, 10_000)
_RETRIES = st.integers(0, 20)
_TARGETS = st.floats(1e-9, 1.0, allow_nan=False)


# ------------------------------------------------------------------- exact values


def test_two_percent_over_ten_steps_without_retry_is_about_eighteen_percent() -> None:
    """DESIGN.md's figure: e=0.02, n=10, r=0 gives 1 - 0.98**10 ~ 0.183."""
    assert task_failure(0.02, 10, 0) == pytest.approx(0.18292719, abs=1e-8)
    assert round(task_failure(0.02, 10, 0), 3) == 0.183


def test_one_retry_squares_the_step_failure() -> None:
    """With r=1 a step fails only if both attempts fail: 1 - (1 - 0.02**2)**10."""
    assert task_failure(0.02, 10, 1) == pytest.approx(1 - (1 - 0.0004) ** 10, rel=1e-12)


@pytest.mark.parametrize(
    ("e", "n", "r", "expected"),
    [
        (0.0, 10, 0, 0.0),
        (1.0, 10, 0, 1.0),
        (1.0, 1, 5, 1.0),
        (0.3, 0, 0, 0.0),
        (1.0, 0, 0, 0.0),
        (0.5, 1, 0, 0.5),
        (0.5, 1, 2, 0.125),
        (0.5, 2, 0, 0.75),
        (0.1, 50, 2, 1 - (1 - 0.001) ** 50),
    ],
)
def test_exact_values_and_edges(e: float, n: int, r: int, expected: float) -> None:
    """Boundary rates, zero steps and small cases match the closed form exactly."""
    assert task_failure(e, n, r) == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_tiny_rates_keep_their_precision() -> None:
    """A per-step failure of 1e-18 over 1000 steps is ~1e-15, not 0 by cancellation."""
    assert task_failure(1e-9, 1000, 1) == pytest.approx(1e-15, rel=1e-9)


def test_retries_needed_examples() -> None:
    """Known answers: a 20-step task at 2% needs one retry to fail under 1%."""
    assert retries_needed(0.02, 20, 0.01) == 1
    assert retries_needed(0.02, 20, 0.5) == 0
    assert retries_needed(0.2, 50, 0.001) == 6
    assert retries_needed(0.0, 100, 0.0) == 0
    assert retries_needed(0.5, 0, 0.0) == 0


def test_max_error_rate_example() -> None:
    """Ten steps, no retries, 5% task failure allow about 0.5% per step."""
    assert max_error_rate(10, 0, 0.05) == pytest.approx(1 - 0.95 ** (1 / 10), rel=1e-12)
    assert max_error_rate(0, 0, 0.0) == 1.0
    assert max_error_rate(10, 3, 1.0) == 1.0


def test_expected_attempts_examples() -> None:
    """The expected executions of one step are 1 + e + ... + e**r."""
    assert expected_attempts(0.5, 2) == 1.75
    assert expected_attempts(0.0, 5) == 1.0
    assert expected_attempts(1.0, 2) == 3.0
    assert expected_attempts(0.3, 0) == 1.0


# --------------------------------------------------------------------- validation


@pytest.mark.parametrize("e", [-0.01, 1.01, math.nan, math.inf, -math.inf, True, "0.1", None])
def test_rate_outside_zero_one_is_rejected(e: object) -> None:
    """e must be a number in [0, 1]; NaN, infinities, bools and strings are refused."""
    with pytest.raises(ConfigurationError, match="e must be a probability"):
        task_failure(e, 10, 0)  # type: ignore[arg-type]


@pytest.mark.parametrize(("n", "r"), [(-1, 0), (10, -1), (1.5, 0), (10, 2.0), (True, 0)])
def test_negative_or_non_integer_counts_are_rejected(n: object, r: object) -> None:
    """n and r must be integers >= 0."""
    with pytest.raises(ConfigurationError, match="must be an integer >= 0"):
        task_failure(0.1, n, r)  # type: ignore[arg-type]


def test_configuration_error_is_a_value_error() -> None:
    """Callers catching ValueError also catch bad inputs."""
    with pytest.raises(ValueError, match="probability"):
        task_failure(2.0, 1, 0)


@pytest.mark.parametrize("target", [-0.1, 1.5, math.nan])
def test_invalid_target_is_rejected(target: float) -> None:
    """The inverse helpers validate target as a probability too."""
    with pytest.raises(ConfigurationError, match="target must be a probability"):
        retries_needed(0.1, 10, target)
    with pytest.raises(ConfigurationError, match="target must be a probability"):
        max_error_rate(10, 0, target)


@pytest.mark.parametrize(("e", "target"), [(1.0, 0.5), (0.1, 0.0)])
def test_unreachable_target_says_why(e: float, target: float) -> None:
    """When every attempt fails, or the target is zero, no retry budget is enough."""
    with pytest.raises(ConfigurationError, match="no number of retries"):
        retries_needed(e, 10, target)


# --------------------------------------------------------------------- properties


@given(e=_RATES, n=_STEPS, r=_RETRIES)
def test_result_is_a_probability(e: float, n: int, r: int) -> None:
    """task_failure is always within [0, 1]."""
    assert 0.0 <= task_failure(e, n, r) <= 1.0


@given(a=_RATES, b=_RATES, n=_STEPS, r=_RETRIES)
def test_more_errors_per_step_never_help(a: float, b: float, n: int, r: int) -> None:
    """task_failure is non-decreasing in the per-step error rate e."""
    low, high = sorted((a, b))
    assert task_failure(low, n, r) <= task_failure(high, n, r)


@given(e=_RATES, a=_STEPS, b=_STEPS, r=_RETRIES)
def test_more_steps_never_help(e: float, a: int, b: int, r: int) -> None:
    """task_failure is non-decreasing in the number of steps n."""
    low, high = sorted((a, b))
    assert task_failure(e, low, r) <= task_failure(e, high, r)


@given(e=_RATES, n=_STEPS, a=_RETRIES, b=_RETRIES)
def test_more_retries_never_hurt(e: float, n: int, a: int, b: int) -> None:
    """task_failure is non-increasing in the retry budget r."""
    low, high = sorted((a, b))
    assert task_failure(e, n, high) <= task_failure(e, n, low)


@given(e=_RATES, n=st.integers(1, 10_000), r=_RETRIES)
def test_at_least_the_step_failure_and_at_most_the_union_bound(e: float, n: int, r: int) -> None:
    """One step's failure <= task failure <= n times it (independent steps)."""
    step = e ** (r + 1)
    failure = task_failure(e, n, r)
    assert failure >= step * (1 - 1e-12)
    assert failure <= min(1.0, n * step) * (1 + 1e-12)


@given(e=_OPEN_RATES, n=st.integers(1, 1000), target=_TARGETS)
def test_retries_needed_is_the_smallest_sufficient_budget(e: float, n: int, target: float) -> None:
    """r = retries_needed reaches the target and r - 1 does not."""
    r = retries_needed(e, n, target)
    assert task_failure(e, n, r) <= target
    if r > 0:
        assert task_failure(e, n, r - 1) > target


@given(n=st.integers(1, 1000), r=_RETRIES, target=st.floats(1e-6, 0.999, allow_nan=False))
def test_max_error_rate_inverts_task_failure(n: int, r: int, target: float) -> None:
    """At e = max_error_rate(n, r, target), task_failure gives back the target."""
    e = max_error_rate(n, r, target)
    assert 0.0 <= e <= 1.0
    assert task_failure(e, n, r) == pytest.approx(target, rel=1e-6)


@given(e=_RATES, a=_RETRIES, b=_RETRIES)
def test_retries_cost_more_executions(e: float, a: int, b: int) -> None:
    """Expected executions grow with r, between 1 and r + 1."""
    low, high = sorted((a, b))
    assert 1.0 <= expected_attempts(e, low) <= expected_attempts(e, high) <= high + 1
