"""Circuit breakers, the pure part: the config, the state machine, the store protocol.

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
stores (`langgraph_resilience.stores.breakers`) only apply these functions
atomically behind the `BreakerStore` protocol: the in-memory one under a lock held
for the transition alone (never across the tool call), the Postgres ones in one
transaction holding the key's row lock, so every worker process sharing the table
agrees on the state and on the probe count.

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
also returns it. `~langgraph_resilience.stores.breakers.CircuitBreaker` packages
the same protocol for plain callables.

Retry budgets are `langgraph_resilience.core.budget`; bulkheads
`langgraph_resilience._graph.bulkhead`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from typing import Any, Literal, NamedTuple, Protocol, runtime_checkable

from langgraph_resilience.core.policy import seconds
from langgraph_resilience.core.windows import WINDOW_KINDS, CountWindow, TimeWindow, Window
from langgraph_resilience.errors import ConfigurationError, FailureClass

__all__ = [
    "ADMITTED",
    "CLOSED",
    "Admission",
    "BreakerConfig",
    "BreakerState",
    "BreakerStatus",
    "BreakerStore",
    "Outcome",
    "Transition",
    "admit",
    "fast_admission",
    "record",
    "release",
]

BreakerStatus = Literal["closed", "open", "half_open"]
"""Where a breaker is: ``closed`` (calls flow), ``open`` (fail fast), ``half_open`` (probing)."""

Outcome = FailureClass | None
"""How an admitted call ended: None for success, else its `FailureClass`."""

_DEFAULT_COUNTED = frozenset({FailureClass.TRANSIENT, FailureClass.STRUCTURAL})


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

    # Typed views, computed at construction: the fields above accept a timedelta and
    # are normalized to float seconds; these say so to the type checker.
    window_seconds: float = dataclasses.field(init=False, repr=False, compare=False)
    """The time window's span in seconds (time windows only)."""
    window_calls: int = dataclasses.field(init=False, repr=False, compare=False)
    """The count window's size in calls (count windows only)."""
    open_duration_s: float = dataclasses.field(init=False, repr=False, compare=False)
    """`open_duration` in seconds."""
    half_open_timeout_s: float = dataclasses.field(init=False, repr=False, compare=False)
    """`half_open_timeout` in seconds."""
    slow_call_threshold_s: float | None = dataclasses.field(init=False, repr=False, compare=False)
    """`slow_call_threshold` in seconds, or None."""

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
        set_(self, "counted_classes", _counted(self.counted_classes, self.slow_call_threshold))
        window_size, slow = float(self.window_size), self.slow_call_threshold  # type: ignore[arg-type]
        set_(self, "window_seconds", window_size)
        set_(self, "window_calls", int(window_size))
        set_(self, "open_duration_s", float(self.open_duration))  # type: ignore[arg-type]
        set_(self, "half_open_timeout_s", float(self.half_open_timeout))  # type: ignore[arg-type]
        set_(self, "slow_call_threshold_s", None if slow is None else float(slow))  # type: ignore[arg-type]


def _counted(classes: Any, slow_call_threshold: Any) -> frozenset[FailureClass]:
    """`counted_classes` as a frozenset of FailureClass, or why it cannot open a breaker."""
    try:
        if isinstance(classes, str | FailureClass):
            raise TypeError
        counted = frozenset(FailureClass(c) for c in classes)
    except (TypeError, ValueError):
        raise ConfigurationError(
            "counted_classes must be a collection of FailureClass values, e.g. "
            f"frozenset({{FailureClass.TRANSIENT}}), got {classes!r}"
        ) from None
    if not counted and slow_call_threshold is None:
        raise ConfigurationError(
            "counted_classes is empty and slow_call_threshold is None, so the breaker "
            "could never open; count at least one FailureClass or set slow_call_threshold"
        )
    return counted


def window_for(window: Window | None, cfg: BreakerConfig) -> Window:
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
_CLOSED_REST = (None, None, 0, 0)
"""A closed state's fields after its window (`BreakerState`)."""
"""A fresh breaker."""


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


ADMITTED = Admission(True)
"""The admission of a call to a closed breaker (shared: nothing to allocate)."""


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
        return ADMITTED, state, None
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
            or type(window) is not WINDOW_KINDS[cfg.window]
            or window[0] != cfg.window_size
        ):
            window = window_for(window, cfg)
        window = window.add(now, failed, slow)
        if window.calls >= cfg.minimum_calls:
            reason = _trip_reason(window, cfg)
            if reason is not None:
                return _opened(now), Transition("closed", "open", reason, now)
        if window is state.window and state[2:] == _CLOSED_REST:
            return state, None  # nothing changed: the same state, for a store to skip
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


def fast_admission(
    status: str | None, opened_at: Any, cfg: BreakerConfig, now: float
) -> Admission | None:
    """The answer to an acquire from a stored breaker's status and ``opened_at`` alone,
    when it changes nothing: closed (or never stored: None) admits, open before
    `open_duration` refuses. None means the full `admit` must decide under the key's
    lock (half-open permits, or time to half-open)."""
    if status is None or status == "closed":
        return ADMITTED
    if status == "open" and isinstance(opened_at, int | float):
        wait = opened_at + cfg.open_duration_s - now
        if wait > 0:
            return Admission(False, False, wait, "open")
    return None


# ------------------------------------------------------------------ the store protocol


@runtime_checkable
class BreakerStore(Protocol):
    """Where breakers live, keyed by name; every method applies one pure transition
    atomically. ``now`` is wall-clock seconds (``clock.time()``)."""

    def acquire(self, key: str, cfg: BreakerConfig, now: float) -> Admission:
        """Admit or refuse one call (`admit`), taking a probe permit in half-open."""
        ...

    def record(
        self, key: str, cfg: BreakerConfig, now: float, outcome: Outcome,
        *, probe: bool = False, duration: float | None = None,
    ) -> Transition | None:  # fmt: skip
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
        self, key: str, cfg: BreakerConfig, now: float, outcome: Outcome,
        *, probe: bool = False, duration: float | None = None,
    ) -> Transition | None:  # fmt: skip
        """Async `record`."""
        ...

    async def arelease(self, key: str, cfg: BreakerConfig, now: float, *, probe: bool) -> None:
        """Async `release`."""
        ...

    async def asnapshot(self, key: str) -> BreakerState:
        """Async `snapshot`."""
        ...
