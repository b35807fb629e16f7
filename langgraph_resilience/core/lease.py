"""Thread leases, the pure part: how long a lease lives, when it is renewed, how
often a waiter asks again, and how much life a fence check demands.

A lease (`langgraph_resilience.stores.leases`) lapses `ttl` seconds after it was
last taken or renewed, on the database's clock; its holder renews it every third of
that, so a healthy lease always has more than two thirds of its TTL left, and a fence
check asks for more than a third: a check passes only while a renewal is at most a
third of the TTL late, which leaves the write sent after it that much time to land
before anyone could take the thread over.
"""

from __future__ import annotations

import datetime as dt
import math

from langgraph_resilience.errors import ConfigurationError

__all__ = [
    "DEFAULT_LEASE_TTL",
    "MIN_LEASE_TTL",
    "check_margin",
    "lease_ttl",
    "poll_delay",
    "renew_interval",
    "renew_retry",
    "wait_seconds",
]

DEFAULT_LEASE_TTL = 30.0
"""Seconds a crashed holder keeps its thread: the longest a resume waits for it."""
MIN_LEASE_TTL = 1.0
"""A shorter lease would be renewed too often to be worth a round trip."""
_POLL_FIRST = 0.01
_POLL_CAP = 0.25


def lease_ttl(value: float | dt.timedelta | None) -> float:
    """`value` (seconds or a timedelta; None: the default) as validated seconds."""
    if value is None:
        return DEFAULT_LEASE_TTL
    seconds = value.total_seconds() if isinstance(value, dt.timedelta) else value
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or seconds < MIN_LEASE_TTL
    ):
        raise ConfigurationError(
            f"lease_ttl must be a number of seconds or a timedelta >= {MIN_LEASE_TTL:g}, "
            f"got {value!r}; it is how long a crashed runner keeps its thread "
            f"(default {DEFAULT_LEASE_TTL:g}s)"
        )
    return float(seconds)


def renew_interval(ttl: float) -> float:
    """Seconds between renewals of a held lease."""
    return ttl / 3


def renew_retry(ttl: float) -> float:
    """Seconds before trying again after a renewal that failed (the database did not
    answer): soon, as the lease is running out."""
    return min(1.0, ttl / 10)


def check_margin(ttl: float) -> float:
    """Seconds of life a fence check demands of the lease (see the module docstring)."""
    return ttl / 3


def wait_seconds(wait: bool | float) -> float | None:
    """The most a lock waits: 0 (``False``), None (``True``: no bound), or seconds."""
    if wait is True:
        return None
    if wait is False:
        return 0.0
    if isinstance(wait, int | float) and math.isfinite(wait) and wait >= 0:
        return float(wait)
    raise ValueError(f"wait must be True, False or a number of seconds >= 0, got {wait!r}")


def poll_delay(attempt: int, *, expires_in: float | None, left: float | None) -> float:
    """How long a waiter sleeps before asking again, after `attempt` refusals (1-based):
    10 ms doubling to 250 ms, never past the moment the holder's lease lapses
    (`expires_in`, when known) nor past the waiter's own deadline (`left`)."""
    delay: float = min(_POLL_CAP, _POLL_FIRST * 2.0 ** min(attempt - 1, 16))
    if expires_in is not None:
        delay = min(delay, max(expires_in, 0.001))
    if left is not None:
        delay = min(delay, max(left, 0.0))
    return delay
