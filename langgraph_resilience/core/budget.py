"""Retry budgets, the pure part: a token bucket per key bounding retries to a share of calls.

Every first attempt deposits `RetryBudget.ratio` tokens, a retry withdraws one,
so during an outage retries across all threads stay within ``ratio`` x first
attempts (plus the `RetryBudget.max_tokens` burst and the
`RetryBudget.min_retries_per_second` floor). `budget_deposit` and
`budget_withdraw` are pure steps of a `RetryBudgetState`; the stores that share a
bucket per key (`langgraph_resilience.stores.budgets`) apply them atomically.
Integration: ``budgets.deposit(key, budget, now)`` on a call's first execution,
and ``budgets.try_withdraw(key, budget, now)`` before scheduling a TRANSIENT
retry; False means do not retry (report the budget as exhausted).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

from langgraph_resilience.errors import ConfigurationError

__all__ = [
    "FULL",
    "RetryBudget",
    "RetryBudgetState",
    "budget_deposit",
    "budget_withdraw",
    "refilled",
]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RetryBudget:
    """A token bucket bounding retries to a fraction of first attempts, per key.

    Every first attempt deposits `ratio` tokens, every retry needs one whole
    token, the bucket holds at most `max_tokens` (and starts full), and
    `min_retries_per_second` tokens trickle in regardless. So over any period,
    retries <= ratio x first attempts + max_tokens + min_retries_per_second x
    seconds. Finagle's and Envoy's budgets default to 20% of requests; AWS's
    retry quota spends from a 500-token pool. Our floor is low because agent
    tools see few calls a second: Finagle's 10 retries/s would never bind.

    >>> RetryBudget(ratio=0.1).max_tokens
    10.0
    """

    ratio: float = 0.2
    """Tokens deposited per first attempt: the retry/first-attempt ratio allowed."""

    max_tokens: float = 10.0
    """Bucket capacity and initial content: the burst of retries allowed at once."""

    min_retries_per_second: float = 0.1
    """Tokens added per second of time regardless of traffic, so a quiet tool can
    still retry occasionally. 0 disables the floor."""

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        for name, minimum, inclusive in (
            ("ratio", 0.0, False),
            ("max_tokens", 1.0, True),
            ("min_retries_per_second", 0.0, True),
        ):
            value = getattr(self, name)
            ok = (
                not isinstance(value, bool)
                and isinstance(value, int | float)
                and math.isfinite(value)
                and (value >= minimum if inclusive else value > minimum)
            )
            if not ok:
                bound = f">= {minimum:g}" if inclusive else f"> {minimum:g}"
                raise ConfigurationError(
                    f"RetryBudget.{name} must be a number {bound}, got {value!r}"
                )
            set_(self, name, float(value))


class RetryBudgetState(NamedTuple):
    """The tokens of one retry budget and when they were last refilled."""

    tokens: float | None = None
    """None: never used, i.e. a full bucket."""
    updated_at: float | None = None

    def to_json(self) -> dict[str, Any]:
        """Plain JSON."""
        return {"tokens": self.tokens, "updated_at": self.updated_at}

    @classmethod
    def from_json(cls, data: Any) -> RetryBudgetState:
        """The inverse of `to_json`; anything unreadable is a full bucket."""
        try:
            tokens, updated_at = data["tokens"], data["updated_at"]
            return cls(
                None if tokens is None else float(tokens),
                None if updated_at is None else float(updated_at),
            )
        except (KeyError, TypeError, ValueError):
            return cls()


def refilled(state: RetryBudgetState, cfg: RetryBudget, now: float) -> float:
    """The tokens in the bucket at `now`: its stored tokens plus the floor's trickle."""
    if state.tokens is None:
        return cfg.max_tokens
    elapsed = 0.0 if state.updated_at is None else max(0.0, now - state.updated_at)
    return min(cfg.max_tokens, state.tokens + cfg.min_retries_per_second * elapsed)


def _stamp(state: RetryBudgetState, now: float) -> float:
    """The refill time after `now`: it never goes back, so callers whose clocks
    disagree slightly (threads, processes) cannot refill one interval twice."""
    return now if state.updated_at is None else max(state.updated_at, now)


def budget_deposit(state: RetryBudgetState, cfg: RetryBudget, now: float) -> RetryBudgetState:
    """Account for a first attempt: `ratio` more tokens, up to `max_tokens`."""
    tokens = min(cfg.max_tokens, refilled(state, cfg, now) + cfg.ratio)
    return RetryBudgetState(tokens, _stamp(state, now))


def budget_withdraw(
    state: RetryBudgetState, cfg: RetryBudget, now: float
) -> tuple[bool, RetryBudgetState]:
    """Ask for one retry: (granted, new state). A refusal still records the refill."""
    tokens = refilled(state, cfg, now)
    if tokens >= 1.0:
        return True, RetryBudgetState(tokens - 1.0, _stamp(state, now))
    return False, RetryBudgetState(tokens, _stamp(state, now))


FULL = RetryBudgetState()
"""A bucket never used: full (what an unknown key has)."""
