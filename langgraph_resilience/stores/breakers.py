"""Circuit breakers (a pure state machine and its stores), retry budgets and bulkheads.

When a tool or its upstream is down, retries only burn money and hammer it. A
breaker counts the outcomes of recent calls; when too many of them failed it
*opens* and calls fail fast without executing, until `open_duration` has passed.
It then *half-opens*: exactly `half_open_max_calls` probe calls are let through
(everyone else gets the retry-after); if they all succeed it *closes*, the first
failed probe reopens it::

    closed --failure rate >= threshold--> open --open_duration--> half_open
      ^                                    ^                         |
      |                                    +------ a probe fails ----+
      +------------- half_open_max_calls probes succeed -------------+

The decisions are pure functions of (state, config, now): `admit` and `record`
return a new `BreakerState` and the `Transition` they caused, if any. Time is
passed in, never read, so tests drive every transition with a fake clock. The
stores only apply these functions atomically: `InMemoryBreakerStore` under a
lock held for the transition alone (never across the tool call),
`PostgresBreakerStore` in one transaction holding the key's row lock, so every
worker process sharing the table agrees on the state and on the probe count.

Only failures of the `counted_classes` (TRANSIENT and STRUCTURAL by default)
count: a SEMANTIC failure caused by the model's bad arguments, or a POLICY
refusal, says nothing about the upstream's health and is ignored.

Integration
-----------
Per tool call, with ``key`` the tool's name (or a user-chosen key such as its
upstream host) and ``now = clock.time()`` (wall-clock seconds: a shared store
compares it across processes)::

    admission = store.acquire(key, cfg, clock.time())
    if not admission.allowed:
        # not executed: CircuitOpenError(key, admission.retry_after) -> a STRUCTURAL
        # ToolError with retry_after_ms=admission.retry_after_ms and
        # suggested_action="use_tool:<fallback>" when the profile names one
        ...
    started = clock.monotonic()
    try:
        result = execute()
    except GraphBubbleUp:                      # an interrupt is not an outcome
        store.release(key, cfg, clock.time(), probe=admission.probe)
        raise
    except Exception as exc:
        error = classify(exc, ...)
        store.record(key, cfg, clock.time(), error.failure_class,
                     probe=admission.probe, duration=clock.monotonic() - started)
    else:
        store.record(key, cfg, clock.time(), None,   # None: success
                     probe=admission.probe, duration=clock.monotonic() - started)

The async tool path uses ``aacquire`` / ``arecord`` / ``arelease``. A call
rejected by a `Bulkhead` never reached the tool: release its admission, do not
record it. Stores emit a ``breaker`` `Event` for every transition; `record`
also returns it. `CircuitBreaker` packages the same protocol for plain callables.

Retry budget
------------
`RetryBudget` is a token bucket per key, shared like the breakers
(`InMemoryRetryBudgetStore`, `PostgresRetryBudgetStore`): every first attempt
deposits `ratio` tokens, a retry withdraws one, so during an outage retries
across all threads stay within ``ratio`` x first attempts (plus the
`max_tokens` burst and the `min_retries_per_second` floor). Integration:
``budgets.deposit(key, budget, now)`` on a call's first execution, and
``budgets.try_withdraw(key, budget, now)`` before scheduling a TRANSIENT
retry; False means do not retry (report the budget as exhausted).

Bulkhead
--------
`Bulkhead` limits the calls of one tool in flight at once; an excess call
waits up to `max_wait` then raises `BulkheadFullError` (a TRANSIENT
`ToolFailure`). Take the slot after the breaker admitted the call
(``with bulkhead.slot():`` / ``async with bulkhead.aslot():`` around the
execution) and `release` the admission when the slot is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import math
import re
import threading
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator
from typing import Any, Literal, NamedTuple, Protocol, TypeVar, runtime_checkable

import psycopg
from langgraph.errors import GraphBubbleUp
from psycopg import sql
from psycopg.rows import tuple_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from langgraph_resilience.core.classify import classify
from langgraph_resilience.core.clock import Clock, SystemClock
from langgraph_resilience.core.policy import seconds
from langgraph_resilience.errors import (
    CircuitOpenError,
    ConfigurationError,
    FailureClass,
    ToolFailure,
)
from langgraph_resilience.events import Event, emit, logger

__all__ = [
    "DEFAULT_MAX_ENTRIES",
    "Admission",
    "AsyncPostgresBreakerStore",
    "BreakerConfig",
    "BreakerState",
    "BreakerStatus",
    "BreakerStore",
    "Bulkhead",
    "BulkheadFullError",
    "CircuitBreaker",
    "CountWindow",
    "InMemoryBreakerStore",
    "InMemoryRetryBudgetStore",
    "Outcome",
    "PostgresBreakerStore",
    "PostgresRetryBudgetStore",
    "RetryBudget",
    "RetryBudgetState",
    "TimeWindow",
    "Transition",
    "admit",
    "budget_deposit",
    "budget_withdraw",
    "record",
    "release",
]

T = TypeVar("T")
N = TypeVar("N", bound=tuple[Any, ...])

BreakerStatus = Literal["closed", "open", "half_open"]
"""Where a breaker is: ``closed`` (calls flow), ``open`` (fail fast), ``half_open`` (probing)."""

Outcome = FailureClass | None
"""How an admitted call ended: None for success, else its `FailureClass`."""

TIME_BUCKETS = 10
"""Buckets of a time-based window: eviction is exact to 1/10 of the window (as Polly)."""

_DEFAULT_COUNTED = frozenset({FailureClass.TRANSIENT, FailureClass.STRUCTURAL})


def _new(cls: type[N], values: tuple[Any, ...]) -> N:
    """Build a named tuple without its Python-level ``__new__`` (3x cheaper on the hot path)."""
    return tuple.__new__(cls, values)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _rate(value: object, *, field: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 < value <= 1
    ):
        raise ConfigurationError(
            f"{field} must be a fraction in (0, 1], e.g. 0.5 for 50%, got {value!r}"
        )
    return float(value)


def _positive_seconds(value: float | dt.timedelta, *, field: str) -> float:
    result = seconds(value, field=field)
    if result <= 0:
        raise ConfigurationError(
            f"{field} must be > 0 seconds (a number or a timedelta), got {value!r}"
        )
    return result


# ------------------------------------------------------------------ configuration


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class BreakerConfig:
    """How one breaker decides. Frozen, validated at construction.

    A breaker counts *logical calls*, not attempts: the guarded tools node and
    `resilient_model` report one outcome per call when it leaves the tool or model
    (success, or the failure it gave up with), so one call's own retries never open
    it; a half-open probe reports at once. Defaults follow resilience4j's where they
    fit an agent's tools, and differ where tool-call volumes are far below an RPC
    endpoint's:

    ==========================  =============  ==================================
    field                       resilience4j   ours (why)
    ==========================  =============  ==================================
    window / window_size        count, 100     count, 50 (a tool sees dozens of
                                               calls a minute, not thousands)
    failure_rate_threshold      50%            0.5 (same)
    minimum_calls               100            30 (see below)
    open_duration               60 s           60 s (same)
    half_open_max_calls         10             1 (as Polly: at agent volumes ten
                                               probes keep a breaker half-open
                                               for minutes, each failed probe is
                                               a user-visible failure)
    half_open_timeout           0 (forever)    60 s (a worker that dies between
                                               acquire and record would wedge a
                                               shared breaker half-open forever)
    slow_call_threshold         60 s, 100%     off (opt in)
    counted failures            all errors     TRANSIENT, STRUCTURAL (a bad
                                               argument or a refusal is not an
                                               unhealthy upstream)
    ==========================  =============  ==================================

    Why 30 calls: at the 50% threshold a tool whose calls fail at random 15% of the
    time (independently) must not trip. With n calls in the window the chance that
    at least half failed is P(X >= n/2), X ~ Binomial(n, 0.15): 7.1e-6 at n = 30 (the
    first judgement), and 6.6e-9 once the window holds 50; summed over the warm-up
    (n = 30..50) it is 1.8e-5. Even at 30% random failures a full window trips with
    probability 2.4e-3. And a retried call fails only when every attempt did: 15% per
    attempt over 3 attempts is 0.34% per call. A dead tool opens after 30 calls.

    resilience4j closes after the half-open calls' failure rate is below the
    threshold; here every probe must succeed and the first failed (or slow)
    probe reopens at once, which is what the probes are for.

    >>> BreakerConfig(window="time", window_size=30, minimum_calls=10).window_size
    30.0
    """

    window: Literal["count", "time"] = "count"
    """``count``: the last `window_size` calls; ``time``: the calls of the last
    `window_size` seconds (in 10 buckets, so eviction is exact to a tenth)."""

    window_size: int | float | dt.timedelta = 50
    """Calls (count window, an integer >= 1) or seconds (time window, > 0)."""

    failure_rate_threshold: float = 0.5
    """Open when counted failures / calls in the window reach this, in (0, 1]."""

    minimum_calls: int = 30
    """Calls the window must hold before a rate is judged at all (why 30: above)."""

    open_duration: float | dt.timedelta = 60.0
    """How long an open breaker fails fast before it lets probes through."""

    half_open_max_calls: int = 1
    """Probe permits in half-open; that many successful probes close the breaker."""

    half_open_timeout: float | dt.timedelta = 60.0
    """A half-open round whose permits are all taken but which has not resolved
    within this long presumes its probes lost (the caller crashed between acquire
    and record) and hands out fresh permits."""

    slow_call_threshold: float | dt.timedelta | None = None
    """A call lasting at least this long is slow; None disables slow-call counting."""

    slow_call_rate_threshold: float = 1.0
    """Open when slow calls / calls reach this, in (0, 1]; needs `slow_call_threshold`."""

    counted_classes: frozenset[FailureClass] = _DEFAULT_COUNTED
    """Failure classes that count against the upstream; all others are ignored."""

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        if self.window not in ("count", "time"):
            raise ConfigurationError(f"window must be 'count' or 'time', got {self.window!r}")
        if self.window == "count":
            if not _is_int(self.window_size) or int(self.window_size) < 1:  # type: ignore[arg-type]
                raise ConfigurationError(
                    "window_size of a count window is a number of calls: an integer >= 1, "
                    f"got {self.window_size!r} (for seconds use window='time')"
                )
        else:
            set_(self, "window_size", _positive_seconds(self.window_size, field="window_size"))
        set_(
            self,
            "failure_rate_threshold",
            _rate(self.failure_rate_threshold, field="failure_rate_threshold"),
        )
        set_(
            self,
            "slow_call_rate_threshold",
            _rate(self.slow_call_rate_threshold, field="slow_call_rate_threshold"),
        )
        for name in ("minimum_calls", "half_open_max_calls"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise ConfigurationError(f"{name} must be an integer >= 1, got {value!r}")
        if self.window == "count" and self.minimum_calls > int(self.window_size):  # type: ignore[arg-type]
            raise ConfigurationError(
                f"minimum_calls ({self.minimum_calls}) exceeds the count window_size "
                f"({self.window_size}), so the breaker could never open; lower minimum_calls "
                "or raise window_size"
            )
        set_(self, "open_duration", _positive_seconds(self.open_duration, field="open_duration"))
        set_(
            self,
            "half_open_timeout",
            _positive_seconds(self.half_open_timeout, field="half_open_timeout"),
        )
        if self.slow_call_threshold is not None:
            set_(
                self,
                "slow_call_threshold",
                _positive_seconds(self.slow_call_threshold, field="slow_call_threshold"),
            )
        try:
            if isinstance(self.counted_classes, str | FailureClass):
                raise TypeError
            counted = frozenset(FailureClass(c) for c in self.counted_classes)
        except (TypeError, ValueError):
            raise ConfigurationError(
                "counted_classes must be a collection of FailureClass values, e.g. "
                "frozenset({FailureClass.TRANSIENT}), got "
                f"{self.counted_classes!r}"
            ) from None
        if not counted and self.slow_call_threshold is None:
            raise ConfigurationError(
                "counted_classes is empty and slow_call_threshold is None, so the breaker "
                "could never open; count at least one FailureClass or set slow_call_threshold"
            )
        set_(self, "counted_classes", counted)

    # Typed views: the fields accept timedelta but are normalized to float seconds.
    @property
    def window_seconds(self) -> float:
        """The time window's span in seconds (time windows only)."""
        return float(self.window_size)  # type: ignore[arg-type]

    @property
    def window_calls(self) -> int:
        """The count window's size in calls (count windows only)."""
        return int(self.window_size)  # type: ignore[arg-type]

    @property
    def open_duration_s(self) -> float:
        """`open_duration` in seconds."""
        return float(self.open_duration)  # type: ignore[arg-type]

    @property
    def half_open_timeout_s(self) -> float:
        """`half_open_timeout` in seconds."""
        return float(self.half_open_timeout)  # type: ignore[arg-type]

    @property
    def slow_call_threshold_s(self) -> float | None:
        """`slow_call_threshold` in seconds, or None."""
        if self.slow_call_threshold is None:
            return None
        return float(self.slow_call_threshold)  # type: ignore[arg-type]


# ------------------------------------------------------------------------ windows


class CountWindow(NamedTuple):
    """The outcomes of the last `size` calls, as a ring of bits plus running totals.

    Slot ``i`` of the ring is bit ``i`` of `failure_bits` / `slow_bits`; `head`
    is the slot the next outcome overwrites. Adding is O(1): one slot flips and
    the totals are adjusted by the evicted outcome (resilience4j's ring buffer).
    Like every state record here it is an immutable named tuple, cheap to build
    on the hot path.
    """

    size: int
    calls: int = 0
    """Outcomes held, at most `size`."""
    failures: int = 0
    slow: int = 0
    head: int = 0
    failure_bits: int = 0
    slow_bits: int = 0

    def add(self, now: float, failed: bool, slow: bool) -> CountWindow:
        """The window with one more outcome, the oldest evicted when full."""
        size, calls, failures, slow_count, head, failure_bits, slow_bits = self
        bit = 1 << head
        if calls == size:
            failures -= bool(failure_bits & bit)
            slow_count -= bool(slow_bits & bit)
        else:
            calls += 1
        if failed:
            failure_bits |= bit
            failures += 1
        elif failure_bits & bit:
            failure_bits ^= bit
        if slow:
            slow_bits |= bit
            slow_count += 1
        elif slow_bits & bit:
            slow_bits ^= bit
        head += 1
        values = (size, calls, failures, slow_count, 0 if head == size else head)
        return tuple.__new__(CountWindow, (*values, failure_bits, slow_bits))

    def evict(self, now: float) -> CountWindow:
        """Count windows only evict when a new outcome arrives."""
        return self

    def to_json(self) -> dict[str, Any]:
        """Plain JSON; the bit rings are hex strings (JSON numbers lose big integers)."""
        return {
            "kind": "count",
            "size": self.size,
            "calls": self.calls,
            "failures": self.failures,
            "slow": self.slow,
            "head": self.head,
            "failure_bits": format(self.failure_bits, "x"),
            "slow_bits": format(self.slow_bits, "x"),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CountWindow:
        """The inverse of `to_json`."""
        return cls(
            int(data["size"]),
            int(data["calls"]),
            int(data["failures"]),
            int(data["slow"]),
            int(data["head"]),
            int(data["failure_bits"], 16),
            int(data["slow_bits"], 16),
        )


Bucket = tuple[int, int, int, int]
"""(bucket index = floor(now / width), calls, failures, slow)."""


class TimeWindow(NamedTuple):
    """The outcomes of the last `span` seconds, in `TIME_BUCKETS` buckets plus totals.

    Adding and evicting touch at most `TIME_BUCKETS` buckets: O(1). A bucket
    leaves the window whole, so the window covers between 9/10 and all of
    `span` (Polly's rolling health metrics make the same trade).
    """

    span: float
    calls: int = 0
    failures: int = 0
    slow: int = 0
    buckets: tuple[Bucket, ...] = ()
    """Non-empty buckets, oldest first."""

    def _index(self, now: float) -> int:
        return math.floor(now / (self.span / TIME_BUCKETS))

    def evict(self, now: float) -> TimeWindow:
        """The window without the buckets that ended before ``now - span``."""
        oldest_kept = self._index(now) - TIME_BUCKETS + 1
        buckets = self.buckets
        if not buckets or buckets[0][0] >= oldest_kept:
            return self
        calls, failures, slow = self.calls, self.failures, self.slow
        drop = 0
        for index, b_calls, b_failures, b_slow in buckets:
            if index >= oldest_kept:
                break
            calls -= b_calls
            failures -= b_failures
            slow -= b_slow
            drop += 1
        return _new(TimeWindow, (self.span, calls, failures, slow, buckets[drop:]))

    def add(self, now: float, failed: bool, slow: bool) -> TimeWindow:
        """The window with one more outcome at ``now``, stale buckets evicted."""
        window = self.evict(now)
        index = window._index(now)
        buckets = window.buckets
        if buckets and buckets[-1][0] >= index:  # same bucket (or a clock step back)
            last_index, b_calls, b_failures, b_slow = buckets[-1]
            last = (last_index, b_calls + 1, b_failures + failed, b_slow + slow)
            buckets = (*buckets[:-1], last)
        else:
            buckets = (*buckets, (index, 1, int(failed), int(slow)))
        return _new(
            TimeWindow,
            (self.span, window.calls + 1, window.failures + failed, window.slow + slow, buckets),
        )

    def to_json(self) -> dict[str, Any]:
        """Plain JSON."""
        return {
            "kind": "time",
            "span": self.span,
            "calls": self.calls,
            "failures": self.failures,
            "slow": self.slow,
            "buckets": [list(b) for b in self.buckets],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TimeWindow:
        """The inverse of `to_json`."""
        buckets = tuple((int(i), int(c), int(f), int(s)) for i, c, f, s in data["buckets"])
        return cls(
            float(data["span"]),
            int(data["calls"]),
            int(data["failures"]),
            int(data["slow"]),
            buckets,
        )


Window = CountWindow | TimeWindow
_WINDOWS: dict[str, type[Window]] = {"count": CountWindow, "time": TimeWindow}


def _window_for(window: Window | None, cfg: BreakerConfig) -> Window:
    """`window` if it was built for `cfg`'s window, else an empty one (config changed)."""
    if cfg.window == "count":
        if type(window) is CountWindow and window.size == cfg.window_size:
            return window
        return CountWindow(cfg.window_calls)
    if type(window) is TimeWindow and window.span == cfg.window_size:
        return window
    return TimeWindow(cfg.window_seconds)


# ---------------------------------------------------------------- state machine


class BreakerState(NamedTuple):
    """A snapshot of one breaker: what the stores keep per key. JSON via `to_json`.

    >>> BreakerState().status
    'closed'
    """

    status: BreakerStatus = "closed"
    window: Window | None = None
    """Recent outcomes while closed (None: none yet); emptied by every transition."""
    opened_at: float | None = None
    """When the breaker last opened (the `now` given to `record`)."""
    half_open_since: float | None = None
    """When the current half-open round of permits began."""
    permits: int = 0
    """Probe permits handed out in the current half-open round."""
    successes: int = 0
    """Successful probes in the current half-open round."""

    def status_at(self, cfg: BreakerConfig, now: float) -> BreakerStatus:
        """The status `admit` would act on at `now`: an open breaker past its
        `open_duration` is already half-open. For planners and dashboards."""
        if self.status == "open" and now - (self.opened_at or 0.0) >= cfg.open_duration_s:
            return "half_open"
        return self.status

    def to_json(self) -> dict[str, Any]:
        """Plain JSON (what the Postgres store writes to its ``jsonb`` column)."""
        return {
            "v": 1,
            "status": self.status,
            "window": None if self.window is None else self.window.to_json(),
            "opened_at": self.opened_at,
            "half_open_since": self.half_open_since,
            "permits": self.permits,
            "successes": self.successes,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BreakerState:
        """The inverse of `to_json`; raises ValueError on anything else."""
        try:
            if data.get("v") != 1 or data["status"] not in ("closed", "open", "half_open"):
                raise ValueError(f"not a breaker state: {data!r}")
            raw = data.get("window")
            window: Window | None = None
            if raw is not None:
                window = (
                    CountWindow.from_json(raw)
                    if raw["kind"] == "count"
                    else TimeWindow.from_json(raw)
                )
            return cls(
                data["status"],
                window,
                None if data.get("opened_at") is None else float(data["opened_at"]),
                None if data.get("half_open_since") is None else float(data["half_open_since"]),
                int(data.get("permits", 0)),
                int(data.get("successes", 0)),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a breaker state: {data!r}") from exc


CLOSED = BreakerState()
"""A fresh breaker."""
_CLOSED_JSON = CLOSED.to_json()


class Admission(NamedTuple):
    """The answer to "may this call run?".

    `probe` marks a half-open probe: pass it back to `record`/`release`.
    `retry_after` is 0 when allowed, else the seconds until a call may be let
    through (until half-open; in half-open with every permit taken, until the
    round expires, an upper bound since the probes usually resolve sooner).
    """

    allowed: bool
    probe: bool = False
    retry_after: float = 0.0
    status: BreakerStatus = "closed"
    """The breaker's status when it decided."""

    @property
    def retry_after_ms(self) -> int:
        """`retry_after` in whole milliseconds, rounded up (for ``ToolError.retry_after_ms``)."""
        return math.ceil(round(self.retry_after * 1000, 6))  # float noise is not a millisecond


_ADMITTED = Admission(True)


class Transition(NamedTuple):
    """One state change of a breaker, for events and callers."""

    source: BreakerStatus
    target: BreakerStatus
    reason: str
    """``failure_rate``, ``slow_call_rate``, ``open_duration_elapsed``,
    ``probe_failed``, ``probe_slow`` or ``probes_succeeded``."""
    at: float

    @property
    def name(self) -> str:
        """``source->target``, e.g. ``closed->open``."""
        return f"{self.source}->{self.target}"


def _opened(now: float) -> BreakerState:
    return BreakerState("open", None, now)


def admit(
    state: BreakerState, cfg: BreakerConfig, now: float
) -> tuple[Admission, BreakerState, Transition | None]:
    """Decide whether a call may run at `now`; return (admission, new state, transition).

    Closed admits and changes nothing. Open refuses until `open_duration` has
    passed, then half-opens (the transition is returned). Half-open hands out
    at most `half_open_max_calls` probe permits per round.

    >>> admission, state, transition = admit(BreakerState(), BreakerConfig(), now=0.0)
    >>> admission.allowed, state.status, transition
    (True, 'closed', None)
    """
    if state.status == "closed":
        return _ADMITTED, state, None
    transition = None
    if state.status == "open":
        if state.opened_at is not None:  # (a state without it can only half-open)
            wait = state.opened_at + cfg.open_duration_s - now
            if wait > 0:
                return Admission(False, False, wait, "open"), state, None
        state = BreakerState("half_open", None, state.opened_at, now)
        transition = Transition("open", "half_open", "open_duration_elapsed", now)
    if state.permits < cfg.half_open_max_calls:
        new = state._replace(permits=state.permits + 1)
        return Admission(True, True, 0.0, "half_open"), new, transition
    since = state.half_open_since if state.half_open_since is not None else now
    expires = since + cfg.half_open_timeout_s
    if now >= expires:  # the round's probes never reported: start a new round
        new = BreakerState("half_open", None, state.opened_at, now, 1, 0)
        return Admission(True, True, 0.0, "half_open"), new, transition
    return Admission(False, False, expires - now, "half_open"), state, transition


def _trip_reason(window: Window, cfg: BreakerConfig) -> str | None:
    calls = window.calls
    if calls < cfg.minimum_calls:
        return None
    if window.failures / calls >= cfg.failure_rate_threshold:
        return "failure_rate"
    if cfg.slow_call_threshold is not None and window.slow / calls >= cfg.slow_call_rate_threshold:
        return "slow_call_rate"
    return None


def record(
    state: BreakerState,
    cfg: BreakerConfig,
    now: float,
    outcome: Outcome,
    *,
    probe: bool = False,
    duration: float | None = None,
) -> tuple[BreakerState, Transition | None]:
    """Account for a finished call; return (new state, transition or None).

    `outcome` is None for success or the call's `FailureClass`; classes outside
    `counted_classes` are ignored (neither success nor failure). `duration` in
    seconds makes the call slow when it reaches `slow_call_threshold`.
    Closed: the outcome enters the window, which opens the breaker once it holds
    `minimum_calls` and a rate reaches its threshold (``>=``, as resilience4j).
    Half-open: only probes count; a counted failure or a slow probe reopens,
    `half_open_max_calls` successes close. Open: late results are ignored.

    >>> cfg = BreakerConfig(window_size=2, minimum_calls=2)
    >>> state, _ = record(BreakerState(), cfg, 0.0, FailureClass.TRANSIENT)
    >>> record(state, cfg, 0.0, FailureClass.TRANSIENT)[1].name
    'closed->open'
    """
    failed = outcome is not None
    if failed and outcome not in cfg.counted_classes:  # ignored: neither success nor failure
        return (release(state, cfg, now) if probe else state), None
    threshold = cfg.slow_call_threshold
    slow = threshold is not None and duration is not None and duration >= threshold  # type: ignore[operator]
    if state.status == "closed":  # the hot path
        window = state.window
        if (
            window is None
            or type(window) is not _WINDOWS[cfg.window]
            or window[0] != cfg.window_size
        ):
            window = _window_for(window, cfg)
        window = window.add(now, failed, slow)
        if window.calls >= cfg.minimum_calls:
            reason = _trip_reason(window, cfg)
            if reason is not None:
                return _opened(now), Transition("closed", "open", reason, now)
        return tuple.__new__(BreakerState, ("closed", window, None, None, 0, 0)), None
    if state.status == "open" or not probe:
        return state, None
    if failed or slow:
        reason = "probe_failed" if failed else "probe_slow"
        return _opened(now), Transition("half_open", "open", reason, now)
    successes = state.successes + 1
    if successes >= cfg.half_open_max_calls:
        return CLOSED, Transition("half_open", "closed", "probes_succeeded", now)
    return state._replace(successes=successes), None


def release(state: BreakerState, cfg: BreakerConfig, now: float) -> BreakerState:
    """Give back a probe permit whose call never produced an outcome (interrupted,
    cancelled, rejected by a bulkhead). Outside half-open nothing changes."""
    if state.status != "half_open" or state.permits <= 0:
        return state
    return state._replace(permits=state.permits - 1)


# ------------------------------------------------------------------------ stores


def _emit(key: str, transition: Transition) -> None:
    emit(
        Event(
            "breaker",
            key=key,
            transition=transition.name,
            from_state=transition.source,
            to_state=transition.target,
            reason=transition.reason,
            at=transition.at,
        )
    )


@runtime_checkable
class BreakerStore(Protocol):
    """Where breakers live, keyed by name; every method applies one pure transition
    atomically. ``now`` is wall-clock seconds (``clock.time()``)."""

    def acquire(self, key: str, cfg: BreakerConfig, now: float) -> Admission:
        """Admit or refuse one call (`admit`), taking a probe permit in half-open."""
        ...

    def record(
        self,
        key: str,
        cfg: BreakerConfig,
        now: float,
        outcome: Outcome,
        *,
        probe: bool = False,
        duration: float | None = None,
    ) -> Transition | None:
        """Account for an admitted call's outcome (`record`); None is success."""
        ...

    def release(self, key: str, cfg: BreakerConfig, now: float, *, probe: bool) -> None:
        """Return an admission whose call produced no outcome (`release`)."""
        ...

    def snapshot(self, key: str) -> BreakerState:
        """The stored state (a fresh closed one for an unknown key)."""
        ...

    async def aacquire(self, key: str, cfg: BreakerConfig, now: float) -> Admission:
        """Async `acquire`."""
        ...

    async def arecord(
        self,
        key: str,
        cfg: BreakerConfig,
        now: float,
        outcome: Outcome,
        *,
        probe: bool = False,
        duration: float | None = None,
    ) -> Transition | None:
        """Async `record`."""
        ...

    async def arelease(self, key: str, cfg: BreakerConfig, now: float, *, probe: bool) -> None:
        """Async `release`."""
        ...

    async def asnapshot(self, key: str) -> BreakerState:
        """Async `snapshot`."""
        ...


DEFAULT_MAX_ENTRIES = 10_000
"""How many keys an in-process breaker or retry-budget store holds by default."""


def _max_entries(value: int | None) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigurationError(f"max_entries must be None or an int >= 1, got {value!r}")
    return value


def _evict_lru(
    states: OrderedDict[str, Any], limit: int, keep: str, rules: tuple[Callable[[Any], bool], ...]
) -> None:
    """Bring `states` (least recently used first) from over `limit` down to a tenth
    below it, so the scan is paid once per limit/10 new keys. Each rule in turn picks
    victims in LRU order; `keep` (the key just written) is never one, nor any entry
    no rule accepts."""
    excess = len(states) - (limit - limit // 10)
    for rule in rules:
        if excess <= 0:
            return
        victims = []
        for key, value in states.items():
            if key != keep and rule(value):
                victims.append(key)
                if len(victims) == excess:
                    break
        for key in victims:
            del states[key]
        excess -= len(victims)


def _forgettable(state: BreakerState, now: float) -> bool:
    """A closed breaker whose window holds no outcome at `now`: forgetting it loses nothing
    (it is exactly the fresh breaker an unknown key gets)."""
    if state.status != "closed":
        return False
    window = state.window
    return window is None or window.evict(now).calls == 0


class InMemoryBreakerStore:
    """The default store: breakers of one process, thread-safe.

    One lock guards the state map for the duration of a pure transition (about
    a microsecond), never across the tool call, so callers never serialize on a
    slow tool. The async methods are the same non-blocking code.

    It holds at most `max_entries` keys (`DEFAULT_MAX_ENTRIES`; None: no bound),
    so a key per user, host or model name cannot grow it forever. A breaker back
    to fresh (closed, nothing in its window) is not stored at all; when a new key
    exceeds the bound, breakers are forgotten down to a tenth below it: the least
    recently used closed ones whose window is empty first, then the least recently
    used closed ones (losing their recent outcomes, which at worst delays a trip).
    An open or half-open breaker is never forgotten: while every key is one, the
    store grows past the bound rather than close a breaker early.

    >>> store = InMemoryBreakerStore()
    >>> store.acquire("search", BreakerConfig(), now=0.0).allowed
    True
    """

    def __init__(self, *, max_entries: int | None = DEFAULT_MAX_ENTRIES) -> None:
        self._states: OrderedDict[str, BreakerState] = OrderedDict()
        """Stored breakers, least recently used first."""
        self._lock = threading.Lock()
        self.max_entries = _max_entries(max_entries)

    def __len__(self) -> int:
        """The breakers held (a fresh closed one is not held)."""
        with self._lock:
            return len(self._states)

    def _store(self, key: str, state: BreakerState, now: float) -> None:
        """Write `state` as the most recently used; a fresh breaker is dropped instead.
        Called with the lock held."""
        states = self._states
        if state.status == "closed" and state.window is None:
            states.pop(key, None)
            return
        if key in states:
            states[key] = state
            states.move_to_end(key)
            return
        states[key] = state
        limit = self.max_entries
        if limit is not None and len(states) > limit:
            rules = (lambda s: _forgettable(s, now), lambda s: s.status == "closed")
            _evict_lru(states, limit, key, rules)

    def acquire(self, key: str, cfg: BreakerConfig, now: float) -> Admission:
        with self._lock:
            state = self._states.get(key, CLOSED)
            if state.status == "closed":  # the hot path: nothing to write
                return _ADMITTED
            admission, new, transition = admit(state, cfg, now)
            self._store(key, new, now)
        if transition is not None:
            _emit(key, transition)
        return admission

    def record(
        self,
        key: str,
        cfg: BreakerConfig,
        now: float,
        outcome: Outcome,
        *,
        probe: bool = False,
        duration: float | None = None,
    ) -> Transition | None:
        with self._lock:
            new, transition = record(
                self._states.get(key, CLOSED), cfg, now, outcome, probe=probe, duration=duration
            )
            self._store(key, new, now)
        if transition is not None:
            _emit(key, transition)
        return transition

    def release(self, key: str, cfg: BreakerConfig, now: float, *, probe: bool) -> None:
        if not probe:
            return
        with self._lock:
            self._store(key, release(self._states.get(key, CLOSED), cfg, now), now)

    def snapshot(self, key: str) -> BreakerState:
        with self._lock:
            return self._states.get(key, CLOSED)

    def reset(self, key: str | None = None) -> None:
        """Forget one breaker (or all): it is closed and empty again."""
        with self._lock:
            if key is None:
                self._states.clear()
            else:
                self._states.pop(key, None)

    async def aacquire(self, key: str, cfg: BreakerConfig, now: float) -> Admission:
        return self.acquire(key, cfg, now)

    async def arecord(
        self,
        key: str,
        cfg: BreakerConfig,
        now: float,
        outcome: Outcome,
        *,
        probe: bool = False,
        duration: float | None = None,
    ) -> Transition | None:
        return self.record(key, cfg, now, outcome, probe=probe, duration=duration)

    async def arelease(self, key: str, cfg: BreakerConfig, now: float, *, probe: bool) -> None:
        self.release(key, cfg, now, probe=probe)

    async def asnapshot(self, key: str) -> BreakerState:
        return self.snapshot(key)


# --------------------------------------------------------------------- Postgres

_TABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$")


def _table(name: str) -> sql.Identifier:
    if not isinstance(name, str) or not _TABLE_NAME.match(name):
        raise ConfigurationError(
            f"table must be a plain SQL identifier, optionally schema-qualified "
            f"(e.g. 'lgr_breakers' or 'ops.lgr_breakers'), got {name!r}"
        )
    return sql.Identifier(*name.split("."))


@dataclasses.dataclass(frozen=True, slots=True)
class _Sql:
    """The statements of one store table. Transitions take the row lock in a
    transaction that commits asynchronously (``synchronous_commit = off``): a
    breaker's state is worth a lost millisecond after a server crash, not an
    fsync per tool call. Statements are batched (client-side binding, one round
    trip per batch) so a locked transition costs two round trips."""

    setup: sql.Composed
    read: sql.Composed
    peek: sql.Composed
    lock: sql.Composed
    write: sql.Composed
    commit: sql.SQL

    @classmethod
    def for_table(cls, table: str) -> _Sql:
        ident = _table(table)
        return cls(
            setup=sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (key text PRIMARY KEY, state jsonb NOT NULL, "
                "updated_at timestamptz NOT NULL DEFAULT now())"
            ).format(ident),
            read=sql.SQL("SELECT state FROM {} WHERE key = %s").format(ident),
            peek=sql.SQL(
                "SELECT state->>'status', state->'opened_at' FROM {} WHERE key = %s"
            ).format(ident),
            lock=sql.SQL(
                "BEGIN; SET LOCAL synchronous_commit = off; "
                "INSERT INTO {t} (key, state) VALUES (%s, %s) ON CONFLICT (key) DO NOTHING; "
                "SELECT state FROM {t} WHERE key = %s FOR UPDATE"
            ).format(t=ident),
            write=sql.SQL(
                "UPDATE {} SET state = %s, updated_at = now() WHERE key = %s; COMMIT"
            ).format(ident),
            commit=sql.SQL("COMMIT"),
        )


def _parse(key: str, raw: Any) -> BreakerState:
    if raw is None:
        return CLOSED
    try:
        return BreakerState.from_json(raw)
    except ValueError:
        logger.warning("breaker %r: unreadable stored state, starting closed: %r", key, raw)
        return CLOSED


def _fast_admission(
    row: tuple[Any, ...] | None, cfg: BreakerConfig, now: float
) -> Admission | None:
    """The answer to an acquire from the (status, opened_at) row alone, when it changes
    nothing: closed admits, open before `open_duration` refuses. None means the
    locked path must decide (half-open permits, or time to half-open)."""
    if row is None or row[0] == "closed":
        return _ADMITTED
    status, opened_at = row
    if status == "open" and isinstance(opened_at, int | float):
        wait = opened_at + cfg.open_duration_s - now
        if wait > 0:
            return Admission(False, False, wait, "open")
    return None


Change = Callable[[BreakerState], tuple[T, BreakerState]]
JsonChange = Callable[[Any], tuple[T, dict[str, Any] | None]]
"""A change of one row's JSON: (stored JSON or None) -> (result, JSON to write or None)."""


def _locked_change(
    conn: psycopg.Connection[Any],
    statements: _Sql,
    key: str,
    default: dict[str, Any],
    change: JsonChange[T],
) -> T:
    """Apply `change` to `key`'s row under its row lock, in one transaction (two trips)."""
    cur = psycopg.ClientCursor(conn, row_factory=tuple_row)
    try:
        cur.execute(statements.lock, (key, Jsonb(default), key))
        while cur.nextset():
            pass
        row = cur.fetchone()
        result, new = change(None if row is None else row[0])
        if new is None:
            cur.execute(statements.commit)
        else:
            cur.execute(statements.write, (Jsonb(new), key))
    except BaseException:
        conn.rollback()
        raise
    finally:
        cur.close()
    return result


async def _alocked_change(
    conn: psycopg.AsyncConnection[Any],
    statements: _Sql,
    key: str,
    default: dict[str, Any],
    change: JsonChange[T],
) -> T:
    """Async `_locked_change`."""
    cur = psycopg.AsyncClientCursor(conn, row_factory=tuple_row)
    try:
        await cur.execute(statements.lock, (key, Jsonb(default), key))
        while cur.nextset():
            pass
        row = await cur.fetchone()
        result, new = change(None if row is None else row[0])
        if new is None:
            await cur.execute(statements.commit)
        else:
            await cur.execute(statements.write, (Jsonb(new), key))
    except BaseException:
        await conn.rollback()
        raise
    finally:
        await cur.close()
    return result


def _breaker_change(key: str, change: Change[T]) -> JsonChange[T]:
    def apply(raw: Any) -> tuple[T, dict[str, Any] | None]:
        state = _parse(key, raw)
        result, new = change(state)
        return result, None if new is state else new.to_json()

    return apply


def _require_autocommit(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    if not conn.autocommit:
        raise ConfigurationError(
            "the store needs autocommit connections, as LangGraph's PostgresSaver "
            "does: connect with autocommit=True or build the pool with "
            "kwargs=langgraph_resilience.stores.persistence.POSTGRES_CONNECTION_KWARGS"
        )


class _PostgresTable:
    """A key -> jsonb table on a sync connection or pool (shared by the sync stores)."""

    def __init__(self, conn: psycopg.Connection[Any] | ConnectionPool[Any], table: str) -> None:
        if not isinstance(conn, psycopg.Connection | ConnectionPool):
            raise ConfigurationError(
                f"{type(self).__name__} takes a psycopg Connection or ConnectionPool; for "
                "async ones use AsyncPostgresBreakerStore"
            )
        if isinstance(conn, psycopg.Connection):
            _require_autocommit(conn)
        self._conn = conn
        self._lock = threading.Lock()  # serializes users of a single shared connection
        self._sql = _Sql.for_table(table)
        self.table = table

    @contextlib.contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        if isinstance(self._conn, ConnectionPool):
            with self._conn.connection() as conn:
                _require_autocommit(conn)
                yield conn
        else:
            with self._lock:
                yield self._conn

    def setup(self) -> None:
        """Create the table if it does not exist. Run once, at deployment or start-up."""
        with self._connection() as conn:
            conn.execute(self._sql.setup)

    def _read_json(self, key: str) -> Any:
        with self._connection() as conn, conn.cursor(row_factory=tuple_row) as cur:
            cur.execute(self._sql.read, (key,))
            row = cur.fetchone()
        return None if row is None else row[0]


class PostgresBreakerStore(_PostgresTable):
    """Breakers shared by every process using one PostgreSQL table, atomically.

    Give it the connection pool (or a connection) of your `PostgresSaver`:
    autocommit, ``prepare_threshold=0``, any row factory. Run `setup()` once,
    like the saver's. Admission of a closed (or still-open) breaker is one plain
    ``SELECT``; every change runs in a transaction holding the key's row lock
    (``SELECT ... FOR UPDATE``), so concurrent workers never lose an update and
    half-open probe permits are never over-granted. Async graphs can call the
    async methods (they run the sync ones in a worker thread); for an
    `AsyncConnectionPool` use `AsyncPostgresBreakerStore`.

    >>> store = PostgresBreakerStore(pool)  # doctest: +SKIP
    >>> store.setup()  # doctest: +SKIP
    """

    def __init__(
        self,
        conn: psycopg.Connection[Any] | ConnectionPool[Any],
        *,
        table: str = "lgr_breakers",
    ) -> None:
        super().__init__(conn, table)

    def _read(self, key: str) -> BreakerState:
        return _parse(key, self._read_json(key))

    def _peek(self, key: str) -> tuple[Any, ...] | None:
        with self._connection() as conn, conn.cursor(row_factory=tuple_row) as cur:
            cur.execute(self._sql.peek, (key,))
            return cur.fetchone()

    def _change(self, key: str, change: Change[T]) -> T:
        with self._connection() as conn:
            return _locked_change(conn, self._sql, key, _CLOSED_JSON, _breaker_change(key, change))

    def acquire(self, key: str, cfg: BreakerConfig, now: float) -> Admission:
        fast = _fast_admission(self._peek(key), cfg, now)
        if fast is not None:
            return fast

        def change(state: BreakerState) -> tuple[tuple[Admission, Transition | None], BreakerState]:
            admission, new, transition = admit(state, cfg, now)
            return (admission, transition), new

        admission, transition = self._change(key, change)
        if transition is not None:
            _emit(key, transition)
        return admission

    def record(
        self,
        key: str,
        cfg: BreakerConfig,
        now: float,
        outcome: Outcome,
        *,
        probe: bool = False,
        duration: float | None = None,
    ) -> Transition | None:
        def change(state: BreakerState) -> tuple[Transition | None, BreakerState]:
            new, transition = record(state, cfg, now, outcome, probe=probe, duration=duration)
            return transition, new

        transition = self._change(key, change)
        if transition is not None:
            _emit(key, transition)
        return transition

    def release(self, key: str, cfg: BreakerConfig, now: float, *, probe: bool) -> None:
        if probe:
            self._change(key, lambda state: (None, release(state, cfg, now)))

    def snapshot(self, key: str) -> BreakerState:
        return self._read(key)

    async def aacquire(self, key: str, cfg: BreakerConfig, now: float) -> Admission:
        return await asyncio.to_thread(self.acquire, key, cfg, now)

    async def arecord(
        self,
        key: str,
        cfg: BreakerConfig,
        now: float,
        outcome: Outcome,
        *,
        probe: bool = False,
        duration: float | None = None,
    ) -> Transition | None:
        return await asyncio.to_thread(
            lambda: self.record(key, cfg, now, outcome, probe=probe, duration=duration)
        )

    async def arelease(self, key: str, cfg: BreakerConfig, now: float, *, probe: bool) -> None:
        if probe:
            await asyncio.to_thread(lambda: self.release(key, cfg, now, probe=probe))

    async def asnapshot(self, key: str) -> BreakerState:
        return await asyncio.to_thread(self.snapshot, key)


class AsyncPostgresBreakerStore:
    """`PostgresBreakerStore` on an `AsyncConnectionPool` (or `AsyncConnection`).

    The async methods never block the event loop. The sync methods exist for
    sync code running in another thread while the store's loop runs (as
    LangGraph's `AsyncPostgresSaver` does); called on the loop itself they raise.

    >>> store = AsyncPostgresBreakerStore(async_pool)  # doctest: +SKIP
    >>> await store.setup()  # doctest: +SKIP
    """

    def __init__(
        self,
        conn: psycopg.AsyncConnection[Any] | AsyncConnectionPool[Any],
        *,
        table: str = "lgr_breakers",
    ) -> None:
        if not isinstance(conn, psycopg.AsyncConnection | AsyncConnectionPool):
            raise ConfigurationError(
                "AsyncPostgresBreakerStore takes a psycopg AsyncConnection or "
                "AsyncConnectionPool; for sync ones use PostgresBreakerStore"
            )
        if isinstance(conn, psycopg.AsyncConnection):
            _require_autocommit(conn)
        self._conn = conn
        self._lock = asyncio.Lock()
        self._sql = _Sql.for_table(table)
        self.table = table
        try:
            self.loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self.loop = None

    @contextlib.asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        if self.loop is None:
            self.loop = asyncio.get_running_loop()
        if isinstance(self._conn, AsyncConnectionPool):
            async with self._conn.connection() as conn:
                _require_autocommit(conn)
                yield conn
        else:
            async with self._lock:
                yield self._conn

    async def setup(self) -> None:
        """Create the table if it does not exist. Run once, at deployment or start-up."""
        async with self._connection() as conn:
            await conn.execute(self._sql.setup)

    async def _read(self, key: str) -> BreakerState:
        async with self._connection() as conn, conn.cursor(row_factory=tuple_row) as cur:
            await cur.execute(self._sql.read, (key,))
            row = await cur.fetchone()
        return _parse(key, None if row is None else row[0])

    async def _peek(self, key: str) -> tuple[Any, ...] | None:
        async with self._connection() as conn, conn.cursor(row_factory=tuple_row) as cur:
            await cur.execute(self._sql.peek, (key,))
            return await cur.fetchone()

    async def _change(self, key: str, change: Change[T]) -> T:
        async with self._connection() as conn:
            return await _alocked_change(
                conn, self._sql, key, _CLOSED_JSON, _breaker_change(key, change)
            )

    async def aacquire(self, key: str, cfg: BreakerConfig, now: float) -> Admission:
        fast = _fast_admission(await self._peek(key), cfg, now)
        if fast is not None:
            return fast

        def change(state: BreakerState) -> tuple[tuple[Admission, Transition | None], BreakerState]:
            admission, new, transition = admit(state, cfg, now)
            return (admission, transition), new

        admission, transition = await self._change(key, change)
        if transition is not None:
            _emit(key, transition)
        return admission

    async def arecord(
        self,
        key: str,
        cfg: BreakerConfig,
        now: float,
        outcome: Outcome,
        *,
        probe: bool = False,
        duration: float | None = None,
    ) -> Transition | None:
        def change(state: BreakerState) -> tuple[Transition | None, BreakerState]:
            new, transition = record(state, cfg, now, outcome, probe=probe, duration=duration)
            return transition, new

        transition = await self._change(key, change)
        if transition is not None:
            _emit(key, transition)
        return transition

    async def arelease(self, key: str, cfg: BreakerConfig, now: float, *, probe: bool) -> None:
        if probe:
            await self._change(key, lambda state: (None, release(state, cfg, now)))

    async def asnapshot(self, key: str) -> BreakerState:
        return await self._read(key)

    def _sync(self, coro: Coroutine[Any, Any, T]) -> T:
        loop = self.loop
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is None or running is loop:
            coro.close()
            raise asyncio.InvalidStateError(
                "synchronous calls to AsyncPostgresBreakerStore are only allowed from another "
                "thread while its event loop runs; use the async methods (aacquire, arecord, "
                "...) or a PostgresBreakerStore on a sync pool"
            )
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    def acquire(self, key: str, cfg: BreakerConfig, now: float) -> Admission:
        return self._sync(self.aacquire(key, cfg, now))

    def record(
        self,
        key: str,
        cfg: BreakerConfig,
        now: float,
        outcome: Outcome,
        *,
        probe: bool = False,
        duration: float | None = None,
    ) -> Transition | None:
        return self._sync(self.arecord(key, cfg, now, outcome, probe=probe, duration=duration))

    def release(self, key: str, cfg: BreakerConfig, now: float, *, probe: bool) -> None:
        self._sync(self.arelease(key, cfg, now, probe=probe))

    def snapshot(self, key: str) -> BreakerState:
        return self._sync(self.asnapshot(key))


# ------------------------------------------------------------- CircuitBreaker


class CircuitBreaker:
    """One named breaker bound to a config, a store and a clock: guards any callable.

    The tool loop uses the store protocol directly; this is the same protocol
    for code outside a graph. An open breaker raises `CircuitOpenError` without
    calling; an exception is classified (`classify`) and re-raised.

    >>> breaker = CircuitBreaker("geo-api", BreakerConfig(minimum_calls=3))
    >>> breaker.call(lambda: 42)
    42
    """

    def __init__(
        self,
        key: str,
        config: BreakerConfig | None = None,
        *,
        store: BreakerStore | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.key = key
        self.config = config or BreakerConfig()
        self.store: BreakerStore = store if store is not None else InMemoryBreakerStore()
        self.clock: Clock = clock or SystemClock()

    def _refused(self, admission: Admission) -> CircuitOpenError:
        return CircuitOpenError(self.key, admission.retry_after)

    @staticmethod
    def _outcome(exc: Exception) -> Outcome:
        return classify(exc).failure_class

    def call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Call ``fn(*args, **kwargs)`` through the breaker."""
        clock, store, cfg, key = self.clock, self.store, self.config, self.key
        admission = store.acquire(key, cfg, clock.time())
        if not admission.allowed:
            raise self._refused(admission)
        started = clock.monotonic()
        try:
            result = fn(*args, **kwargs)
        except GraphBubbleUp:
            store.release(key, cfg, clock.time(), probe=admission.probe)
            raise
        except Exception as exc:
            store.record(
                key,
                cfg,
                clock.time(),
                self._outcome(exc),
                probe=admission.probe,
                duration=clock.monotonic() - started,
            )
            raise
        except BaseException:
            store.release(key, cfg, clock.time(), probe=admission.probe)
            raise
        store.record(
            key,
            cfg,
            clock.time(),
            None,
            probe=admission.probe,
            duration=clock.monotonic() - started,
        )
        return result

    async def acall(self, fn: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any) -> T:
        """Await ``fn(*args, **kwargs)`` through the breaker."""
        clock, store, cfg, key = self.clock, self.store, self.config, self.key
        admission = await store.aacquire(key, cfg, clock.time())
        if not admission.allowed:
            raise self._refused(admission)
        started = clock.monotonic()
        try:
            result = await fn(*args, **kwargs)
        except GraphBubbleUp:
            await store.arelease(key, cfg, clock.time(), probe=admission.probe)
            raise
        except Exception as exc:
            await store.arecord(
                key,
                cfg,
                clock.time(),
                self._outcome(exc),
                probe=admission.probe,
                duration=clock.monotonic() - started,
            )
            raise
        except BaseException:  # cancelled: no outcome
            await asyncio.shield(store.arelease(key, cfg, clock.time(), probe=admission.probe))
            raise
        await store.arecord(
            key,
            cfg,
            clock.time(),
            None,
            probe=admission.probe,
            duration=clock.monotonic() - started,
        )
        return result


# ---------------------------------------------------------------- retry budget


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


def _refilled(state: RetryBudgetState, cfg: RetryBudget, now: float) -> float:
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
    tokens = min(cfg.max_tokens, _refilled(state, cfg, now) + cfg.ratio)
    return RetryBudgetState(tokens, _stamp(state, now))


def budget_withdraw(
    state: RetryBudgetState, cfg: RetryBudget, now: float
) -> tuple[bool, RetryBudgetState]:
    """Ask for one retry: (granted, new state). A refusal still records the refill."""
    tokens = _refilled(state, cfg, now)
    if tokens >= 1.0:
        return True, RetryBudgetState(tokens - 1.0, _stamp(state, now))
    return False, RetryBudgetState(tokens, _stamp(state, now))


class InMemoryRetryBudgetStore:
    """Retry budgets of one process, thread-safe; each method is one pure step under a lock.

    Integration: `deposit` on every first execution of a tool call, and
    `try_withdraw` before scheduling a TRANSIENT retry; False means "do not
    retry" (report the budget as exhausted).

    It holds at most `max_entries` keys (`DEFAULT_MAX_ENTRIES`; None: no bound).
    When a new key exceeds it, buckets are forgotten down to a tenth below it: the
    least recently used ones that have refilled to full first (a full bucket is
    what an unknown key gets: nothing is lost), then the least recently used ones
    (each starts full again: at most `max_tokens` more retries for that key).

    >>> budgets = InMemoryRetryBudgetStore()
    >>> budgets.try_withdraw("search", RetryBudget(), now=0.0)
    True
    """

    def __init__(self, *, max_entries: int | None = DEFAULT_MAX_ENTRIES) -> None:
        self._states: OrderedDict[str, tuple[RetryBudgetState, RetryBudget]] = OrderedDict()
        """Each key's bucket and the budget it was last used with, least recently used first."""
        self._lock = threading.Lock()
        self.max_entries = _max_entries(max_entries)

    def __len__(self) -> int:
        """The buckets held."""
        with self._lock:
            return len(self._states)

    def _get(self, key: str) -> RetryBudgetState:
        held = self._states.get(key)
        return _FULL if held is None else held[0]

    def _store(self, key: str, state: RetryBudgetState, cfg: RetryBudget, now: float) -> None:
        states = self._states
        new = key not in states
        states[key] = (state, cfg)
        states.move_to_end(key)
        limit = self.max_entries
        if new and limit is not None and len(states) > limit:
            rules = (
                lambda held: _refilled(held[0], held[1], now) >= held[1].max_tokens,
                lambda _: True,
            )
            _evict_lru(states, limit, key, rules)

    def deposit(self, key: str, cfg: RetryBudget, now: float) -> None:
        """A first attempt was made."""
        with self._lock:
            self._store(key, budget_deposit(self._get(key), cfg, now), cfg, now)

    def try_withdraw(self, key: str, cfg: RetryBudget, now: float) -> bool:
        """May one retry be made now? Takes the token when it may."""
        with self._lock:
            granted, state = budget_withdraw(self._get(key), cfg, now)
            self._store(key, state, cfg, now)
        return granted

    def snapshot(self, key: str) -> RetryBudgetState:
        """The stored state (a full bucket for an unknown key)."""
        with self._lock:
            return self._get(key)

    async def adeposit(self, key: str, cfg: RetryBudget, now: float) -> None:
        """Async `deposit`."""
        self.deposit(key, cfg, now)

    async def atry_withdraw(self, key: str, cfg: RetryBudget, now: float) -> bool:
        """Async `try_withdraw`."""
        return self.try_withdraw(key, cfg, now)


_FULL = RetryBudgetState()


class PostgresRetryBudgetStore(_PostgresTable):
    """Retry budgets shared by every process using one PostgreSQL table.

    Same connection rules and `setup()` as `PostgresBreakerStore`; every
    `deposit` and `try_withdraw` is one locked transaction (two round trips),
    so concurrent workers never spend a token twice. The async methods run the
    sync ones in a worker thread.

    >>> budgets = PostgresRetryBudgetStore(pool)  # doctest: +SKIP
    >>> budgets.setup()  # doctest: +SKIP
    """

    def __init__(
        self,
        conn: psycopg.Connection[Any] | ConnectionPool[Any],
        *,
        table: str = "lgr_retry_budgets",
    ) -> None:
        super().__init__(conn, table)

    def _change(
        self, key: str, change: Callable[[RetryBudgetState], tuple[T, RetryBudgetState]]
    ) -> T:
        def apply(raw: Any) -> tuple[T, dict[str, Any] | None]:
            result, new = change(RetryBudgetState.from_json(raw))
            return result, new.to_json()

        with self._connection() as conn:
            return _locked_change(conn, self._sql, key, _FULL.to_json(), apply)

    def deposit(self, key: str, cfg: RetryBudget, now: float) -> None:
        """A first attempt was made."""
        self._change(key, lambda state: (None, budget_deposit(state, cfg, now)))

    def try_withdraw(self, key: str, cfg: RetryBudget, now: float) -> bool:
        """May one retry be made now? Takes the token when it may."""
        return self._change(key, lambda state: budget_withdraw(state, cfg, now))

    def snapshot(self, key: str) -> RetryBudgetState:
        """The stored state (a full bucket for an unknown key)."""
        return RetryBudgetState.from_json(self._read_json(key))

    async def adeposit(self, key: str, cfg: RetryBudget, now: float) -> None:
        """Async `deposit` (in a worker thread)."""
        await asyncio.to_thread(self.deposit, key, cfg, now)

    async def atry_withdraw(self, key: str, cfg: RetryBudget, now: float) -> bool:
        """Async `try_withdraw` (in a worker thread)."""
        return await asyncio.to_thread(self.try_withdraw, key, cfg, now)


# --------------------------------------------------------------------- bulkhead


class BulkheadFullError(ToolFailure):
    """A call waited `max_wait` for a bulkhead slot and got none: TRANSIENT, and it
    never reached the tool (release its breaker admission, do not record it)."""

    def __init__(self, name: str, max_concurrent: int, max_wait: float) -> None:
        super().__init__(
            FailureClass.TRANSIENT,
            f"bulkhead {name!r} is full: {max_concurrent} calls in flight, "
            f"none finished within {max_wait:g}s",
            suggested_action="retry",
            context={"bulkhead": name, "max_concurrent": max_concurrent, "max_wait_s": max_wait},
        )
        self.name = name


class Bulkhead:
    """A per-tool concurrency limit, so one slow tool cannot occupy every worker.

    At most `max_concurrent` calls run at once; a further call waits up to
    `max_wait` seconds for a slot, then fails with `BulkheadFullError` (TRANSIENT).
    Sync callers share a `threading.BoundedSemaphore`; async callers share an
    `asyncio.Semaphore` per event loop (a process runs a graph either way, so
    the two pools are separate).

    >>> search_slots = Bulkhead("search", max_concurrent=4, max_wait=2.0)
    >>> with search_slots.slot():
    ...     pass
    """

    def __init__(
        self, name: str, *, max_concurrent: int, max_wait: float | dt.timedelta = 0.0
    ) -> None:
        if not _is_int(max_concurrent) or max_concurrent < 1:
            raise ConfigurationError(
                f"Bulkhead.max_concurrent must be an integer >= 1, got {max_concurrent!r}"
            )
        wait = seconds(max_wait, field="max_wait")
        if wait < 0:
            raise ConfigurationError(
                f"Bulkhead.max_wait must be >= 0 seconds (0: fail at once), got {max_wait!r}"
            )
        self.name = name
        self.max_concurrent = max_concurrent
        self.max_wait = wait
        self._semaphore = threading.BoundedSemaphore(max_concurrent)
        self._async: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )
        self._async_lock = threading.Lock()

    def _full(self) -> BulkheadFullError:
        return BulkheadFullError(self.name, self.max_concurrent, self.max_wait)

    @contextlib.contextmanager
    def slot(self) -> Iterator[None]:
        """Hold a slot for the duration of the block (sync)."""
        acquired = (
            self._semaphore.acquire(timeout=self.max_wait)
            if self.max_wait > 0
            else self._semaphore.acquire(blocking=False)
        )
        if not acquired:
            raise self._full()
        try:
            yield
        finally:
            self._semaphore.release()

    def _loop_semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        with self._async_lock:
            semaphore = self._async.get(loop)
            if semaphore is None:
                semaphore = self._async[loop] = asyncio.Semaphore(self.max_concurrent)
        return semaphore

    @contextlib.asynccontextmanager
    async def aslot(self) -> AsyncIterator[None]:
        """Hold a slot for the duration of the block (async; never blocks the loop)."""
        semaphore = self._loop_semaphore()
        if semaphore.locked() and self.max_wait <= 0:
            raise self._full()
        try:
            await asyncio.wait_for(semaphore.acquire(), self.max_wait or None)
        except TimeoutError:
            raise self._full() from None
        try:
            yield
        finally:
            semaphore.release()

    def call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Call ``fn(*args, **kwargs)`` in a slot."""
        with self.slot():
            return fn(*args, **kwargs)

    async def acall(self, fn: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any) -> T:
        """Await ``fn(*args, **kwargs)`` in a slot."""
        async with self.aslot():
            return await fn(*args, **kwargs)
