"""Error amplification: why a small per-step error rate sinks a long task.

An agent task of `n` tool steps, each failing with probability `e` and retried
up to `r` times, fails with probability::

    task_failure(e, n, r) = 1 - (1 - e**(r + 1))**n

A 2% per-step error rate is ~18% task failure over 10 steps without retries
(``task_failure(0.02, 10, 0) ≈ 0.183``) and ~0.4% with one retry.

Caveat: the formula holds only for *independent, detectable, transient*
faults. It breaks, always towards more failure than it predicts, when

- faults are correlated: during an outage every retry fails too, so for
  those steps the effective rate is ``e``, not ``e**(r + 1)``;
- errors are silent: a wrong answer that looks like a success is never
  retried (an output contract turns it into a detectable SEMANTIC failure);
- failures are not retriable: a 401, a bad argument or a missing tool fails
  the same way every time, so retries only add cost.

These functions are the arithmetic behind choosing a retry budget; they say
nothing about a given tool's real fault distribution.
"""

from __future__ import annotations

import math

from langgraph_resilience.errors import ConfigurationError

__all__ = ["expected_attempts", "max_error_rate", "retries_needed", "task_failure"]


def _rate(value: float, *, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(f"{name} must be a probability in [0, 1], got {value!r}")
    if not 0.0 <= value <= 1.0:  # also rejects NaN
        raise ConfigurationError(f"{name} must be a probability in [0, 1], got {value!r}")
    return float(value)


def _count(value: int, *, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigurationError(f"{name} must be an integer >= 0, got {value!r}")
    return value


def _from_step_failure(step_failure: float, n: int) -> float:
    """``1 - (1 - step_failure)**n``, accurate for tiny rates (log1p/expm1)."""
    if n == 0 or step_failure == 0.0:
        return 0.0
    if step_failure == 1.0:
        return 1.0
    return min(1.0, -math.expm1(n * math.log1p(-step_failure)))


def task_failure(e: float, n: int, r: int) -> float:
    """Probability that a task of `n` steps fails, each step failing with probability
    `e` and retried up to `r` times: ``1 - (1 - e**(r + 1))**n``.

    Holds only for independent, detectable, transient faults (see the module
    docstring): correlated outages, silent semantic errors and non-retriable
    failures make the real figure worse.

    Raises `ConfigurationError` when `e` is not in [0, 1] or `n` or `r` is negative.

    >>> round(task_failure(0.02, 10, 0), 3)
    0.183
    >>> round(task_failure(0.02, 10, 1), 4)
    0.004
    """
    e = _rate(e, name="e")
    n = _count(n, name="n")
    r = _count(r, name="r")
    return _from_step_failure(e ** (r + 1), n)


def retries_needed(e: float, n: int, target: float) -> int:
    """The fewest retries per step that keep `task_failure(e, n, r)` at or below `target`.

    Same caveat as `task_failure`: retries only help against independent,
    detectable, transient faults. Raises `ConfigurationError` for invalid
    inputs, and when no number of retries reaches `target` (every step fails,
    ``e == 1``, or ``target == 0`` with ``e > 0``).

    >>> retries_needed(0.02, 20, 0.01)
    1
    >>> retries_needed(0.2, 50, 0.001)
    6
    """
    e = _rate(e, name="e")
    n = _count(n, name="n")
    target = _rate(target, name="target")
    if task_failure(e, n, 0) <= target:
        return 0
    if e == 1.0 or target == 0.0:
        raise ConfigurationError(
            f"no number of retries brings task failure to {target} when e={e} "
            "(every attempt fails, or the target is zero); lower e or raise target"
        )
    # (1 - e**(r+1))**n >= 1 - target  <=>  e**(r+1) <= 1 - (1 - target)**(1/n) = allowed
    allowed = -math.expm1(math.log1p(-target) / n)
    guess = max(0, math.ceil(math.log(allowed) / math.log(e)) - 1)
    # The closed form can be off by rounding: bisect on task_failure itself, which is
    # monotone in r, for the smallest budget that reaches the target.
    low, high = 0, guess
    while task_failure(e, n, high) > target:
        low, high = high + 1, 2 * high + 1
    while low < high:
        middle = (low + high) // 2
        if task_failure(e, n, middle) <= target:
            high = middle
        else:
            low = middle + 1
    return high


def max_error_rate(n: int, r: int, target: float) -> float:
    """The highest per-step error rate `e` with `task_failure(e, n, r) <= target`.

    Same caveat as `task_failure`. Raises `ConfigurationError` for invalid inputs.

    >>> round(max_error_rate(10, 0, 0.05), 5)
    0.00512
    """
    n = _count(n, name="n")
    r = _count(r, name="r")
    target = _rate(target, name="target")
    if n == 0 or target == 1.0:
        return 1.0
    allowed = -math.expm1(math.log1p(-target) / n)
    return min(1.0, math.pow(allowed, 1.0 / (r + 1)))


def expected_attempts(e: float, r: int) -> float:
    """Expected executions of one step with up to `r` retries: ``sum(e**k, k=0..r)``.

    The cost side of retrying: it grows with `e`, and layers that each retry
    multiply (3 attempts in 3 nested layers is up to 27 executions).

    >>> expected_attempts(0.5, 2)
    1.75
    """
    e = _rate(e, name="e")
    r = _count(r, name="r")
    return math.fsum(e**k for k in range(r + 1))
