"""Seeded fault injection for any set of tools: the chaos harness behind ``bench``.

A `FaultPlan` says *what* goes wrong (a fault kind from `FAULT_KINDS`) and
*when* (a schedule: `Single`, `Persistent`, `Intermittent` with probability p,
`Burst` of k consecutive calls), optionally only for some tools. `inject` wraps
tools in `ChaosTool`s that apply the plan::

    plan = FaultPlan.of(
        intermittent(("http_503", "timeout"), p=0.15),
        persistent("schema_drift", tools=("get_order",)),
        name="flaky",
    )
    tools = inject([search, get_order], plan, seed=7, clock=FakeClock())
    ...  # build and run your graph with `tools`
    print(chaos_stats(tools))  # calls, real executions, faults fired, ...

Everything is deterministic from the seed: each tool keeps its own call counter
and, per plan entry, its own ``random.Random`` seeded from ``(seed, entry,
tool)``, so the n-th call of a tool gets the same fault in every run and for
every framework under test, whatever the other tools do. (Run parallel calls of
one tool serially, e.g. ``config={"max_concurrency": 1}``, when the order of
calls *within* one tool must be reproducible too.) Time is virtual: each call
charges ``latency`` seconds, a timeout ``timeout`` seconds, to a `FakeClock`.

Fault kinds are data. A status code is one line in `FAULT_KINDS`; the
behaviours are those of `testing.Fault` (raise before executing, raise after
the effect committed, replace the output) plus four that need the real call:
truncated output, semantically wrong output (every number negated), schema
drift (a required argument is renamed and the old name is rejected from then
on) and partial success (only part of a batch is executed). Tool removal and
schema drift are permanent once they fire.

A `ChaosTool` also keeps what a benchmark needs to judge a framework from the
outside: attempts per logical call and per identical call, calls after the tool
was removed, calls while a breaker *should* be open, and recovery latency on the
virtual clock. "Should be open" is decided by a shadow breaker per tool: the
package's own pure breaker (`breaker.admit` / `breaker.record`) with the
`BreakerConfig` given to `inject`, fed with the outcomes the tool really saw. A
call it would have refused counts in ``calls_while_open``, whatever framework
made it.

The shadow counts *logical calls*, as the package's breakers do (see
`BreakerConfig`): one outcome per call when it leaves the tool, a success if any
attempt succeeded, else the failure of its last attempt; attempts that are
retried on the same tool report nothing, and a half-open probe reports at once.
A logical call is a tool-call id within the caller's *epoch* (`inject`'s
`epoch`, e.g. the agent's reply count: providers that number ids per message
reuse ``call_0`` every turn), and an attempt without an id is a call of its own.
The harness cannot see when a framework gives up on a call, so it takes the
first evidence that the call has left its tool: its id reaching another tool of
the same `inject` (a fallback), an attempt from a later epoch (the agent's next
turn) or, without an epoch, from a later LangGraph step. Before that, its
failure is not counted: a framework that keeps retrying one call within a turn
is judged by the attempt budget, not as "calls while open". The shadows are
replayed from the call log when they are read, so that evidence may come after
the attempt it settles.
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
import math
import random
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from langchain_core.messages import ToolCall, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.errors import GraphBubbleUp
from pydantic import BaseModel, ConfigDict, PrivateAttr, create_model

from langgraph_resilience.core.canonical import call_key
from langgraph_resilience.errors import ConfigurationError, FailureClass
from langgraph_resilience.stores.breakers import BreakerConfig, BreakerState, admit, record
from langgraph_resilience.stores.ledger import FailedItem, PartialResult
from langgraph_resilience.testing import FakeClock, Fault, FaultyTool

__all__ = [
    "FAULT_KINDS",
    "Burst",
    "CallLog",
    "ChaosStats",
    "ChaosTool",
    "FaultKind",
    "FaultPlan",
    "FaultSpec",
    "Intermittent",
    "Persistent",
    "Schedule",
    "Single",
    "burst",
    "chaos_stats",
    "inject",
    "intermittent",
    "persistent",
    "single",
]

# ------------------------------------------------------------------ fault kinds


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FaultKind:
    """One way a tool call goes wrong; `make` builds a fresh `testing.Fault` per firing
    (a fresh exception each time: frameworks attach notes to the exceptions they see)."""

    name: str
    failure_class: FailureClass
    """How the package's taxonomy is expected to classify it (for grouping results)."""
    make: Callable[[str], Fault]
    """Builds the fault for the tool of this name."""
    description: str
    permanent: bool = False
    """Once fired, the tool stays this way (removal, schema drift)."""

    @property
    def raises(self) -> bool:
        """True when the caller sees an exception (not a wrong or partial result)."""
        return self.name not in _DEGRADED


_DEGRADED = frozenset({"malformed_output", "wrong_output", "partial_success"})


class ConnectTimeout(TimeoutError):
    """Stands in for ``httpx.ConnectTimeout`` where httpx is not installed (same name,
    so classifiers that go by the exception's type name treat it the same)."""


def _connect_timeout(tool: str) -> Exception:
    """The error an HTTP client raises when it could not even connect: httpx's own."""
    try:
        import httpx  # noqa: PLC0415 - optional: only the benchmark's extras install it
    except ImportError:  # pragma: no cover - httpx comes with langchain-core's langsmith
        return ConnectTimeout(f"timed out while connecting to {tool}")
    request = httpx.Request("POST", f"https://chaos.test/{tool}")
    return httpx.ConnectTimeout("timed out while connecting", request=request)


def _status(code: int, **kwargs: Any) -> Callable[[str], Fault]:
    return lambda _tool: Fault.status(code, **kwargs)


def _kind(
    name: str,
    failure_class: FailureClass,
    make: Callable[[str], Fault],
    description: str,
    *,
    permanent: bool = False,
) -> tuple[str, FaultKind]:
    return name, FaultKind(
        name=name,
        failure_class=failure_class,
        make=make,
        description=description,
        permanent=permanent,
    )


_T, _S, _ST, _P, _U, _PA = (
    FailureClass.TRANSIENT,
    FailureClass.SEMANTIC,
    FailureClass.STRUCTURAL,
    FailureClass.POLICY,
    FailureClass.UNKNOWN,
    FailureClass.PARTIAL,
)

FAULT_KINDS: Mapping[str, FaultKind] = dict(
    [
        _kind("http_429", _T, _status(429), "429 Too Many Requests, no Retry-After"),
        _kind(
            "http_429_retry_after",
            _T,
            _status(429, retry_after="2"),
            "429 with Retry-After: 2",
        ),
        _kind("http_500", _T, _status(500), "500 Internal Server Error, before executing"),
        _kind("http_502", _T, _status(502), "502 Bad Gateway, before executing"),
        _kind("http_503", _T, _status(503), "503 Service Unavailable, before executing"),
        _kind("http_504", _T, _status(504), "504 Gateway Timeout, before executing"),
        _kind("http_400", _S, _status(400, body="bad request"), "400 on a valid call"),
        _kind("http_401", _P, _status(401), "401 Unauthorized"),
        _kind("http_403", _P, _status(403), "403 Forbidden"),
        _kind("http_404", _ST, _status(404), "404 Not Found (once)"),
        _kind("timeout", _T, lambda _t: Fault.timeout(), "timeout before executing"),
        _kind(
            "connect_timeout",
            _T,
            lambda tool: Fault.raises(_connect_timeout(tool)),
            "httpx.ConnectTimeout: the request never left the client (safe to retry, even a "
            "side effect)",
        ),
        _kind(
            "timeout_after_commit",
            _U,
            lambda _t: Fault.timeout(after_effect=True),
            "timeout after the effect committed (lost response)",
        ),
        _kind(
            "connection_reset",
            _T,
            lambda _t: Fault.raises(ConnectionResetError(104, "Connection reset by peer")),
            "connection reset before the request was processed",
        ),
        _kind(
            "malformed_output",
            _S,
            lambda _t: Fault("truncate", after_effect=True),
            "executes, then returns the first half of its JSON output",
        ),
        _kind(
            "wrong_output",
            _S,
            lambda _t: Fault("wrong", after_effect=True),
            "executes, then returns its output with every number v replaced by -(|v|+1)",
        ),
        _kind(
            "schema_drift",
            _S,
            lambda _t: Fault("drift"),
            "a required argument is renamed (<arg>_v2); the old name is rejected from then on",
            permanent=True,
        ),
        _kind(
            "tool_removed",
            _ST,
            lambda tool: Fault.status(404, body=json.dumps({"error": f"unknown tool {tool!r}"})),
            "404 'unknown tool' on this and every later call",
            permanent=True,
        ),
        _kind(
            "partial_success",
            _PA,
            lambda _t: Fault("partial", after_effect=True),
            "a batch call executes only its first half and reports the rest as failed",
        ),
    ]
)
"""Every fault kind `FaultSpec` accepts, by name. Add a kind by adding an entry."""


# -------------------------------------------------------------------- schedules


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Single:
    """Exactly the ``at``-th call of the tool (0-based)."""

    at: int = 0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Persistent:
    """Every call from the ``start``-th on."""

    start: int = 0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Intermittent:
    """Each call independently, with probability ``p``."""

    p: float


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Burst:
    """``length`` consecutive calls: from the ``start``-th call, or, with ``start=None``,
    a burst begins at each call outside a burst with probability ``p``."""

    length: int
    start: int | None = 0
    p: float = 0.1


Schedule = Single | Persistent | Intermittent | Burst


def _check_probability(p: float, what: str) -> None:
    if isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 <= p <= 1.0:
        raise ConfigurationError(f"{what} must be a probability in [0, 1], got {p!r}")


def _check_index(value: int, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigurationError(f"{what} must be an integer >= 0, got {value!r}")


def _check_schedule(schedule: Schedule) -> None:
    match schedule:
        case Single(at=at):
            _check_index(at, "Single.at")
        case Persistent(start=start):
            _check_index(start, "Persistent.start")
        case Intermittent(p=p):
            _check_probability(p, "Intermittent.p")
        case Burst(length=length, start=start, p=p):
            if isinstance(length, bool) or not isinstance(length, int) or length < 1:
                raise ConfigurationError(f"Burst.length must be an integer >= 1, got {length!r}")
            if start is not None:
                _check_index(start, "Burst.start")
            _check_probability(p, "Burst.p")
        case _:
            raise ConfigurationError(
                f"schedule must be Single, Persistent, Intermittent or Burst, got {schedule!r}"
            )


@dataclasses.dataclass(slots=True)
class _Cursor:
    """One plan entry's view of one tool: its random stream and burst state."""

    rng: random.Random
    burst_left: int = 0

    def fires(self, schedule: Schedule, index: int) -> bool:
        """Whether call number `index` is faulty. Draws exactly one number per call for
        the random schedules, so the stream stays aligned with the call index."""
        match schedule:
            case Single(at=at):
                return index == at
            case Persistent(start=start):
                return index >= start
            case Intermittent(p=p):
                return self.rng.random() < p
            case Burst(length=length, start=None, p=p):
                draw = self.rng.random()
                if self.burst_left > 0:
                    self.burst_left -= 1
                    return True
                if draw < p:
                    self.burst_left = length - 1
                    return True
                return False
            case Burst(length=length, start=int() as start):
                return start <= index < start + length
        return False  # pragma: no cover - _check_schedule rejects anything else


# ------------------------------------------------------------------------ plans


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FaultSpec:
    """One plan entry: fault `kind` (or a tuple of kinds, one picked per firing) on
    `schedule`, for `tools` (None: every tool).

    >>> FaultSpec(kind="http_503", schedule=Single(at=1), tools=("search",)).kinds
    ('http_503',)
    """

    kind: str | tuple[str, ...]
    schedule: Schedule
    tools: tuple[str, ...] | None = None
    rename: Mapping[str, str] | None = None
    """For ``schema_drift``: old argument name -> new name; default: the first
    required argument ``x`` becomes ``x_v2``."""

    def __post_init__(self) -> None:
        unknown = [k for k in self.kinds if k not in FAULT_KINDS]
        if not self.kinds or unknown:
            raise ConfigurationError(
                f"unknown fault kind(s) {unknown or [self.kind]!r}; "
                f"known kinds: {sorted(FAULT_KINDS)}"
            )
        _check_schedule(self.schedule)
        if isinstance(self.tools, str):
            raise ConfigurationError(
                f"tools must be a tuple of tool names, got the string {self.tools!r}; "
                f"write tools=({self.tools!r},)"
            )

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds this entry may inject."""
        return (self.kind,) if isinstance(self.kind, str) else tuple(self.kind)

    def applies_to(self, tool: str) -> bool:
        """Whether this entry targets `tool`."""
        return self.tools is None or tool in self.tools

    def describe(self) -> dict[str, Any]:
        """A JSON-ready description."""
        schedule = {"type": type(self.schedule).__name__, **dataclasses.asdict(self.schedule)}
        return {
            "kinds": list(self.kinds),
            "schedule": schedule,
            "tools": list(self.tools) if self.tools is not None else None,
        }


def single(
    kind: str | tuple[str, ...], *, at: int = 0, tools: Iterable[str] | None = None
) -> FaultSpec:
    """The ``at``-th call of each targeted tool fails with `kind`."""
    return FaultSpec(kind=kind, schedule=Single(at=at), tools=_tools(tools))


def persistent(
    kind: str | tuple[str, ...],
    *,
    start: int = 0,
    tools: Iterable[str] | None = None,
    rename: Mapping[str, str] | None = None,
) -> FaultSpec:
    """Every call from the ``start``-th on fails with `kind`."""
    return FaultSpec(
        kind=kind, schedule=Persistent(start=start), tools=_tools(tools), rename=rename
    )


def intermittent(
    kind: str | tuple[str, ...], *, p: float, tools: Iterable[str] | None = None
) -> FaultSpec:
    """Each call fails with `kind` with probability `p`, independently."""
    return FaultSpec(kind=kind, schedule=Intermittent(p=p), tools=_tools(tools))


def burst(
    kind: str | tuple[str, ...],
    *,
    length: int,
    start: int | None = 0,
    p: float = 0.1,
    tools: Iterable[str] | None = None,
) -> FaultSpec:
    """`length` consecutive calls fail: from ``start``, or at random onsets (``start=None``)."""
    return FaultSpec(
        kind=kind, schedule=Burst(length=length, start=start, p=p), tools=_tools(tools)
    )


def _tools(tools: Iterable[str] | None) -> tuple[str, ...] | None:
    if tools is None:
        return None
    if isinstance(tools, str):
        return (tools,)
    return tuple(tools)


@dataclasses.dataclass(frozen=True, slots=True)
class FaultPlan:
    """An ordered list of `FaultSpec`s; per call, the first entry that fires wins.

    >>> FaultPlan.of(single("http_503"), name="one-503").name
    'one-503'
    """

    specs: tuple[FaultSpec, ...] = ()
    name: str = "custom"

    @classmethod
    def of(cls, *specs: FaultSpec, name: str = "custom") -> FaultPlan:
        """A plan from its entries."""
        return cls(tuple(specs), name)

    @property
    def kinds(self) -> tuple[str, ...]:
        """Every kind the plan may inject, in order of first mention."""
        return tuple(dict.fromkeys(k for spec in self.specs for k in spec.kinds))

    def describe(self) -> dict[str, Any]:
        """A JSON-ready description."""
        return {"name": self.name, "specs": [spec.describe() for spec in self.specs]}


# -------------------------------------------------------------------- the tool


@dataclasses.dataclass(frozen=True, slots=True)
class CallLog:
    """What happened to one call that reached a `ChaosTool` (one attempt)."""

    index: int
    call_id: str | None
    key: str
    fault: str | None
    ok: bool
    executed: bool
    at: float
    """Virtual monotonic time when the attempt ended."""
    seq: int = 0
    """Arrival order among every tool of the same `inject` call."""
    step: int | None = None
    """The LangGraph super-step it ran in (``langgraph_step``), None outside a graph."""
    epoch: int | None = None
    """The caller's epoch when it arrived (`inject`'s `epoch`), None without one."""
    started: float = 0.0
    """Wall-clock time (``clock.time()``) when it arrived: what a breaker is asked at."""
    outcome: FailureClass | None = None
    """What a breaker is told of this attempt: None for a success (degraded output
    included: the upstream answered), else the failure's class."""

    @property
    def logical(self) -> tuple[str | None, int | None, int | None]:
        """The logical call it is an attempt of: its tool-call id within its epoch (an
        attempt without an id is a call of its own)."""
        if self.call_id:
            return self.call_id, self.epoch, None
        return None, None, self.seq


@dataclasses.dataclass(slots=True)
class _Call:
    index: int
    call_id: str | None
    key: str
    kind: FaultKind | None
    fault: Fault | None
    started: float
    seq: int
    step: int | None
    epoch: int | None
    wall: float


@dataclasses.dataclass(slots=True)
class _Shadow:
    """One tool's shadow breaker, as replayed over the attempts it saw."""

    while_open: int = 0
    opens: int = 0


class _Group:
    """The tools of one `inject` call: one arrival order and one epoch, so the shadow
    breakers can tell when a logical call has left its tool (see `ChaosTool`)."""

    def __init__(self, epoch: Callable[[], int] | None) -> None:
        self.epoch = epoch
        self.tools: list[ChaosTool] = []
        self._next = 0
        self._lock = threading.Lock()
        self._cache: tuple[int, dict[str, _Shadow]] | None = None

    def arrive(self) -> tuple[int, int | None]:
        """A sequence number for an arriving attempt, and the epoch it arrives in."""
        with self._lock:
            seq = self._next
            self._next += 1
        return seq, (self.epoch() if self.epoch is not None else None)

    def shadows(self) -> dict[str, _Shadow]:
        """Every tool's shadow breaker, replayed (cached until an attempt is logged)."""
        logged = sum(len(t._log) for t in self.tools)
        with self._lock:
            if self._cache is not None and self._cache[0] == logged:
                return self._cache[1]
        shadows = _replay(self.tools)
        with self._lock:
            self._cache = (logged, shadows)
        return shadows


_Logical = tuple[str, str | None, int | None, int | None]


def _settle_points(entries: Sequence[tuple[CallLog, ChaosTool]]) -> dict[int, list[_Logical]]:
    """For each logical call, the first attempt (by index into `entries`) that shows it had
    left its tool by then: after its last attempt there, the same call id on another
    tool (its fallback), or an attempt from a later epoch (the caller's next turn); or,
    without an epoch, an attempt from a later LangGraph step (an attempt outside a
    graph ends its call). A call settles before that attempt is admitted."""
    last: dict[_Logical, int] = {}
    for i, (entry, tool) in enumerate(entries):
        last[(tool.name, *entry.logical)] = i
    points: dict[int, list[_Logical]] = {}
    for logical, i in last.items():
        entry, tool = entries[i]
        for j in range(i + 1, len(entries)):
            later, other = entries[j]
            if entry.epoch is not None and later.epoch is not None:
                left = later.epoch > entry.epoch
            else:
                left = entry.step is None or later.step is None or later.step > entry.step
            if left or (
                entry.call_id is not None
                and later.call_id == entry.call_id
                and later.epoch == entry.epoch
                and other.name != tool.name
            ):
                points.setdefault(j, []).append(logical)
                break
    return points


def _replay(tools: Sequence[ChaosTool]) -> dict[str, _Shadow]:
    """Feed each tool's shadow breaker one outcome per logical call, as the package's
    breakers are fed: a success when an attempt succeeds, or the last attempt's failure
    once the call has left the tool (`_settle_points`); a half-open probe decides at
    once. An attempt the shadow refuses counts in ``while_open`` and tells it nothing."""
    entries = sorted(
        ((entry, tool) for tool in tools for entry in tool._log), key=lambda pair: pair[0].seq
    )
    points = _settle_points(entries)
    states: dict[str, BreakerState] = {}
    shadows = {tool.name: _Shadow() for tool in tools}
    configs = {tool.name: tool._breaker for tool in tools}
    pending: dict[_Logical, FailureClass] = {}
    reported: set[_Logical] = set()

    def tell(name: str, now: float, outcome: FailureClass | None, *, probe: bool) -> None:
        cfg = configs[name]
        if cfg is None:
            return
        states[name], transition = record(
            states.get(name, BreakerState()), cfg, now, outcome, probe=probe
        )
        if transition is not None and transition.target == "open":
            shadows[name].opens += 1

    for j, (entry, tool) in enumerate(entries):
        for logical in points.get(j, ()):
            if logical in pending:
                tell(logical[0], entry.started, pending.pop(logical), probe=False)
                reported.add(logical)
        cfg = configs[tool.name]
        if cfg is None:
            continue
        admission, states[tool.name], _ = admit(
            states.get(tool.name, BreakerState()), cfg, entry.started
        )
        if not admission.allowed:
            shadows[tool.name].while_open += 1
            continue
        logical = (tool.name, *entry.logical)
        if admission.probe:
            tell(tool.name, entry.started, entry.outcome, probe=True)
            pending.pop(logical, None)
            reported.add(logical)
        elif logical in reported:
            continue  # its outcome was told already (e.g. a succeeded call run again)
        elif entry.outcome is None:
            tell(tool.name, entry.started, None, probe=False)
            pending.pop(logical, None)
            reported.add(logical)
        else:
            pending[logical] = entry.outcome
    return shadows


@dataclasses.dataclass(slots=True)
class _Slot:
    """The fault decided for the running call, and whether the wrapped tool ran
    (shared by reference: the tool body runs in a copy of the caller's context)."""

    fault: Fault | None
    executed: bool = False


_CURRENT: contextvars.ContextVar[_Slot | None] = contextvars.ContextVar(
    "langgraph_resilience_chaos_call", default=None
)


def _negate_numbers(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return -(abs(value) + 1)
    if isinstance(value, float):
        return -(abs(value) + 1.0) if math.isfinite(value) else value
    if isinstance(value, Mapping):
        return {k: _negate_numbers(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_negate_numbers(v) for v in value]
    return value


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def _raw_args(value: str | dict[str, Any] | ToolCall) -> tuple[dict[str, Any], str | None]:
    if isinstance(value, dict) and value.get("type") == "tool_call":
        args = value.get("args")
        return (dict(args) if isinstance(args, dict) else {}), value.get("id")
    if isinstance(value, dict):
        return dict(value), None
    return {"input": value}, None


class ChaosTool(FaultyTool):
    """A tool wrapper that applies a `FaultPlan`; build it with `inject`.

    It is a `testing.FaultyTool` whose per-call fault comes from the plan's
    schedules instead of a list: ``calls`` and ``executions`` mean the same,
    and ``log`` holds one `CallLog` per call (attempt).

    ``calls_while_open`` and ``shadow_opens`` come from the shadow breaker, which
    counts logical calls as the package's breakers do (module docstring): for
    example a call that fails twice and then succeeds reports one success, and
    a call the framework gives up on after three failed attempts reports one
    failure, once the next turn (or its fallback) shows it has left the tool.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    _specs: list[FaultSpec] = PrivateAttr(default_factory=list)
    _cursors: list[_Cursor] = PrivateAttr(default_factory=list)
    _clock: FakeClock | None = PrivateAttr(default=None)
    _latency: float = PrivateAttr(default=0.0)
    _timeout: float = PrivateAttr(default=0.0)
    _kind_rng: random.Random = PrivateAttr(default_factory=random.Random)
    _permanent: dict[str, FaultKind] = PrivateAttr(default_factory=dict)
    _renamed: dict[str, str] = PrivateAttr(default_factory=dict)
    _removed_at: int | None = PrivateAttr(default=None)
    _breaker: BreakerConfig | None = PrivateAttr(default=None)
    _group: _Group = PrivateAttr(default_factory=lambda: _Group(None))
    _pending: dict[str, float] = PrivateAttr(default_factory=dict)
    _log: list[CallLog] = PrivateAttr(default_factory=list)
    _after_removal: int = PrivateAttr(default=0)
    _latencies: list[float] = PrivateAttr(default_factory=list)
    _chaos_lock: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    def __init__(
        self,
        inner: BaseTool,
        plan: FaultPlan,
        *,
        seed: int,
        clock: FakeClock | None = None,
        latency: float = 0.05,
        timeout: float = 5.0,
        breaker: BreakerConfig | None = None,
        epoch: Callable[[], int] | None = None,
    ) -> None:
        super().__init__(inner)
        self._breaker = breaker
        self._join(_Group(epoch))
        self._specs = [s for s in plan.specs if s.applies_to(inner.name)]
        self._cursors = [
            _Cursor(random.Random(f"{seed}:{i}:{inner.name}"))
            for i, s in enumerate(plan.specs)
            if s.applies_to(inner.name)
        ]
        self._kind_rng = random.Random(f"{seed}:kinds:{inner.name}")
        self._clock = clock
        self._latency = latency
        self._timeout = timeout

    # ------------------------------------------------------------ counters

    @property
    def log(self) -> list[CallLog]:
        """One entry per call, in arrival order."""
        return list(self._log)

    @property
    def removed(self) -> bool:
        """Whether a ``tool_removed`` fault has fired."""
        return self._removed_at is not None

    @property
    def renamed(self) -> dict[str, str]:
        """After schema drift: new argument name -> old name."""
        return dict(self._renamed)

    @property
    def calls_after_removal(self) -> int:
        """Calls that arrived after a call had already been answered 'unknown tool'."""
        return self._after_removal

    @property
    def calls_while_open(self) -> int:
        """Calls the shadow breaker would have refused (0 without a `BreakerConfig`)."""
        return self._group.shadows()[self.name].while_open

    @property
    def shadow_opens(self) -> int:
        """Times the shadow breaker opened (0 without a `BreakerConfig`)."""
        return self._group.shadows()[self.name].opens

    def _join(self, group: _Group) -> None:
        if self in self._group.tools:
            self._group.tools.remove(self)
        self._group = group
        group.tools.append(self)

    @property
    def recovery_latencies(self) -> list[float]:
        """Virtual seconds from an identical call's first failure to its next success."""
        return list(self._latencies)

    # ------------------------------------------------------------ decisions

    def _key(self, args: Mapping[str, Any]) -> str:
        inner_args = {self._renamed.get(k, k): v for k, v in args.items()}
        return call_key(self.name, inner_args)

    def _decide(self, index: int, args: Mapping[str, Any]) -> tuple[FaultKind | None, Fault | None]:
        chosen: FaultKind | None = None
        for spec, cursor in zip(self._specs, self._cursors, strict=True):
            fired = cursor.fires(spec.schedule, index)  # every cursor advances every call
            if fired and chosen is None:
                kinds = spec.kinds
                name = kinds[0] if len(kinds) == 1 else self._kind_rng.choice(kinds)
                chosen = FAULT_KINDS[name]
                if name == "schema_drift" and not self._drift(spec):
                    chosen = None
        if chosen is not None and chosen.name == "tool_removed":
            self._permanent["tool_removed"] = chosen
        if "tool_removed" in self._permanent:
            removed = self._permanent["tool_removed"]
            return removed, removed.make(self.name)
        if self._renamed and any(old in args for old in self._renamed.values()):
            return FAULT_KINDS["schema_drift"], None  # the old name: the schema rejects it
        if chosen is None or chosen.name == "schema_drift":
            return None, None
        if chosen.name == "partial_success" and not any(
            isinstance(v, list) and len(v) >= 2 for v in args.values()
        ):
            return None, None  # not a batch call: nothing to do partially
        return chosen, chosen.make(self.name)

    def _drift(self, spec: FaultSpec) -> bool:
        """Rename a required argument, for good. False if the tool has none."""
        if self._renamed:
            return True
        schema = self.args_schema
        if not (isinstance(schema, type) and issubclass(schema, BaseModel)):
            return False
        fields = schema.model_fields
        rename = dict(spec.rename or {})
        if not rename:
            required = [name for name, info in fields.items() if info.is_required()]
            if not required:
                return False
            rename = {required[0]: f"{required[0]}_v2"}
        new_fields: dict[str, Any] = {
            rename.get(name, name): (info.annotation, info) for name, info in fields.items()
        }
        self.args_schema = create_model(
            f"{schema.__name__}V2", __doc__=schema.__doc__, **new_fields
        )
        self._renamed = {new: old for old, new in rename.items()}
        self._permanent["schema_drift"] = FAULT_KINDS["schema_drift"]
        return True

    def _now(self) -> float:
        return self._clock.time() if self._clock is not None else 0.0

    def _begin(
        self, value: str | dict[str, Any] | ToolCall, config: RunnableConfig | None
    ) -> _Call:
        args, call_id = _raw_args(value)
        step = (config or {}).get("metadata", {}).get("langgraph_step")
        seq, epoch = self._group.arrive()
        with self._chaos_lock:
            index = self._calls
            self._calls += 1
            if self._removed_at is not None:
                self._after_removal += 1
            kind, fault = self._decide(index, args)
        started, wall = 0.0, self._now()
        if self._clock is not None:
            started = self._clock.monotonic()
            self._clock.advance(self._latency)
            if kind is not None and kind.name in _TIMEOUTS:
                self._clock.advance(self._timeout)
        step = step if isinstance(step, int) else None
        return _Call(index, call_id, self._key(args), kind, fault, started, seq, step, epoch, wall)

    def _end(self, call: _Call, slot: _Slot, *, ok: bool) -> None:
        now = self._clock.monotonic() if self._clock is not None else 0.0
        kind = call.kind
        with self._chaos_lock:
            if kind is not None and kind.name == "tool_removed" and self._removed_at is None:
                self._removed_at = call.index
            if ok:
                first = self._pending.pop(call.key, None)
                if first is not None:
                    self._latencies.append(now - first)
            else:
                self._pending.setdefault(call.key, call.started)
            outcome = None if ok or kind is None or not kind.raises else kind.failure_class
            if not ok and kind is None:
                outcome = FailureClass.SEMANTIC  # the tool's own error: not the upstream
            self._log.append(
                CallLog(
                    index=call.index,
                    call_id=call.call_id,
                    key=call.key,
                    fault=kind.name if kind is not None else None,
                    ok=ok,
                    executed=slot.executed,
                    at=now,
                    seq=call.seq,
                    step=call.step,
                    epoch=call.epoch,
                    started=call.wall,
                    outcome=outcome,
                )
            )

    def _next(self) -> Fault | None:  # FaultyTool's hook: the fault decided at invoke time
        slot = _CURRENT.get()
        return slot.fault if slot is not None else None

    def _executed(self) -> None:
        super()._executed()
        slot = _CURRENT.get()
        if slot is not None:
            slot.executed = True

    # ------------------------------------------------------------ execution

    def invoke(
        self,
        input: str | dict[str, Any] | ToolCall,
        config: RunnableConfig | None = None,
        **kwargs: Any,
    ) -> Any:
        call = self._begin(input, config)
        slot = _Slot(call.fault)
        token = _CURRENT.set(slot)
        try:
            result = super().invoke(input, config, **kwargs)
        except GraphBubbleUp:
            raise
        except Exception:
            self._end(call, slot, ok=False)
            raise
        finally:
            _CURRENT.reset(token)
        degraded = call.kind is not None and not call.kind.raises
        self._end(call, slot, ok=_is_success(result) and not degraded)
        return result

    async def ainvoke(
        self,
        input: str | dict[str, Any] | ToolCall,
        config: RunnableConfig | None = None,
        **kwargs: Any,
    ) -> Any:
        call = self._begin(input, config)
        slot = _Slot(call.fault)
        token = _CURRENT.set(slot)
        try:
            result = await super().ainvoke(input, config, **kwargs)
        except GraphBubbleUp:
            raise
        except Exception:
            self._end(call, slot, ok=False)
            raise
        finally:
            _CURRENT.reset(token)
        degraded = call.kind is not None and not call.kind.raises
        self._end(call, slot, ok=_is_success(result) and not degraded)
        return result

    def _inner_args(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        kwargs.pop("run_manager", None)
        return {self._renamed.get(k, k): v for k, v in kwargs.items()}

    @staticmethod
    def _split(fault: Fault | None, args: dict[str, Any]) -> tuple[dict[str, Any], Any]:
        """For partial success: keep the first half of the first list argument."""
        if fault is None or fault.kind != "partial":
            return args, None
        for name, value in args.items():
            if isinstance(value, list) and len(value) >= 2:
                half = len(value) // 2
                return {**args, name: value[:half]}, (name, value[:half], value[half:])
        return args, None

    def _degrade(self, fault: Fault | None, result: Any, split: Any) -> Any:
        if fault is None:
            return result
        if fault.kind == "truncate":
            text = _as_text(result)
            return text[: max(1, len(text) // 2)]
        if fault.kind == "wrong":
            parsed = _parse(result)
            return _negate_numbers(parsed) if parsed is not None else result
        if fault.kind == "partial":
            if split is None:
                return result
            _name, done, failed = split
            return PartialResult(
                succeeded=done,
                failed=[FailedItem(item=item, error="503 from the upstream") for item in failed],
            ).model_dump()
        return self._after(fault, result)

    def _run(self, *args: Any, config: RunnableConfig, **kwargs: Any) -> Any:
        fault = self._next()
        self._before(fault)
        inner_args, split = self._split(fault, self._inner_args(kwargs))
        result = self.inner.invoke(inner_args, config)
        self._executed()
        return self._degrade(fault, result, split)

    async def _arun(self, *args: Any, config: RunnableConfig, **kwargs: Any) -> Any:
        fault = self._next()
        self._before(fault)
        inner_args, split = self._split(fault, self._inner_args(kwargs))
        result = await self.inner.ainvoke(inner_args, config)
        self._executed()
        return self._degrade(fault, result, split)


def _parse(value: Any) -> Any:
    if isinstance(value, ToolMessage):
        value = value.content
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return None
    return value


_TIMEOUTS = frozenset({"timeout", "timeout_after_commit", "connect_timeout"})
"""Kinds that charge the timeout to the clock."""


def _is_success(result: Any) -> bool:
    return not (isinstance(result, ToolMessage) and result.status == "error")


def inject(
    tools: Sequence[BaseTool],
    plan: FaultPlan,
    seed: int,
    *,
    clock: FakeClock | None = None,
    latency: float = 0.05,
    timeout: float = 5.0,
    breaker: BreakerConfig | None = None,
    epoch: Callable[[], int] | None = None,
) -> list[BaseTool]:
    """Wrap each tool in a `ChaosTool` applying `plan`, deterministically from `seed`.

    `clock` (a `FakeClock`) is charged `latency` virtual seconds per call and
    `timeout` more per timeout fault. `breaker` configures the shadow breakers
    behind ``calls_while_open`` (None: not counted). `epoch` is a counter the
    caller moves on whenever it may issue calls anew, e.g. the agent's reply
    count (``model.calls``): attempts are grouped into logical calls per
    (tool-call id, epoch), which keeps apart the calls of providers that number
    ids per message (``call_0`` every turn), and a call that failed has left its
    tool by the next epoch (see `ChaosTool`). The returned tools keep the wrapped
    tools' names, descriptions and schemas.

    >>> from langchain_core.tools import tool
    >>> @tool
    ... def ping(host: str) -> str:
    ...     '''Ping a host.'''
    ...     return "pong"
    >>> [flaky] = inject([ping], FaultPlan.of(single("http_503")), seed=1)
    >>> flaky.invoke({"host": "a"})
    Traceback (most recent call last):
    ...
    langgraph_resilience.testing.FakeHTTPError: HTTP 503
    >>> flaky.invoke({"host": "a"}), flaky.calls, flaky.executions
    ('pong', 2, 1)
    """
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise ConfigurationError(f"tool names must be unique, got {names}")
    for spec in plan.specs:
        unknown = sorted(set(spec.tools or ()) - set(names))
        if unknown:
            raise ConfigurationError(
                f"the plan targets unknown tools {unknown}; known tools: {sorted(names)}"
            )
    group = _Group(epoch)
    wrapped = [
        ChaosTool(
            t, plan, seed=seed, clock=clock, latency=latency, timeout=timeout, breaker=breaker
        )
        for t in tools
    ]
    for chaos_tool in wrapped:
        chaos_tool._join(group)
    return list(wrapped)


# ------------------------------------------------------------------- statistics


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ChaosStats:
    """What the injected tools saw, summed over tools."""

    calls: int
    """Calls that reached a tool (attempts), faulty or not."""
    executions: int
    """Times a wrapped tool really ran."""
    faults: dict[str, int]
    """Faults fired, by kind."""
    calls_after_removal: int
    calls_while_open: int
    max_attempts_per_call: int
    """The most calls one logical call (a tool-call id in its epoch) made to its tool
    (retries of that call)."""
    max_attempts_per_key: int
    """The most calls of one identical (tool, canonical args) in the run."""
    attempts_by_call: dict[str, int]
    """Calls per ``tool:call_id``, for the ids that reached a tool more than once (an id
    reused in several epochs: its most-retried logical call)."""
    shadow_opens: int = 0
    """Times a shadow breaker opened."""
    recovery_latencies: tuple[float, ...]
    by_tool: dict[str, dict[str, int]]

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return dataclasses.asdict(self)


def chaos_stats(tools: Iterable[BaseTool]) -> ChaosStats:
    """Sum the counters of the `ChaosTool`s among `tools` (others are ignored)."""
    faults: Counter[str] = Counter()
    per_call: Counter[tuple[str, str, int | None]] = Counter()
    per_key: Counter[str] = Counter()
    by_tool: dict[str, dict[str, int]] = {}
    calls = executions = after_removal = while_open = opens = 0
    latencies: list[float] = []
    for t in tools:
        if not isinstance(t, ChaosTool):
            continue
        log = t.log
        calls += t.calls
        executions += t.executions
        after_removal += t.calls_after_removal
        while_open += t.calls_while_open
        opens += t.shadow_opens
        latencies.extend(t.recovery_latencies)
        for entry in log:
            if entry.fault is not None:
                faults[entry.fault] += 1
            if entry.call_id:
                per_call[(t.name, entry.call_id, entry.epoch)] += 1
            per_key[entry.key] += 1
        by_tool[t.name] = {
            "calls": t.calls,
            "executions": t.executions,
            "faults": sum(1 for e in log if e.fault is not None),
        }
    return ChaosStats(
        calls=calls,
        executions=executions,
        faults=dict(sorted(faults.items())),
        calls_after_removal=after_removal,
        calls_while_open=while_open,
        max_attempts_per_call=max(per_call.values(), default=0),
        max_attempts_per_key=max(per_key.values(), default=0),
        attempts_by_call=_most_per_id(per_call),
        recovery_latencies=tuple(latencies),
        by_tool=by_tool,
        shadow_opens=opens,
    )


def _most_per_id(per_call: Mapping[tuple[str, str, int | None], int]) -> dict[str, int]:
    most: dict[str, int] = {}
    for (tool, call_id, _epoch), n in per_call.items():
        name = f"{tool}:{call_id}"
        if n > 1 and n > most.get(name, 0):
            most[name] = n
    return dict(sorted(most.items()))
