"""Backoff: capped exponential delays with full jitter, server-directed waits, ledger retries.

Pure functions of (attempt, policy, rng, what the server said, what is left of the
deadline): the tools node, the model chain and the ledger all ask here how long to
wait, so the maths is written once.
"""

from __future__ import annotations

import random

from langgraph_resilience.core.policy import ResiliencePolicy

__all__ = [
    "LEDGER_RETRY_DELAYS",
    "backoff_delay",
    "ledger_retry_delay",
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
