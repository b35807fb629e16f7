"""`ChaosTool`, the tool wrapper that applies a `FaultPlan`, and `inject`, which builds them.

Each tool keeps its own call counter and, per plan entry, its own
``random.Random`` seeded from ``(seed, entry, tool)``. Time is virtual: each
call charges ``latency`` seconds, a timeout ``timeout`` seconds, to a `FakeClock`.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import json
import math
import random
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypedDict, Unpack

from langchain_core.messages import ToolCall, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.errors import GraphBubbleUp
from pydantic import BaseModel, ConfigDict, PrivateAttr, create_model

from langgraph_resilience import (
    BreakerConfig,
    ConfigurationError,
    FailureClass,
    PartialResult,
)
from langgraph_resilience.core import FailedItem, call_key
from langgraph_resilience.core.validation import parsed_content
from langgraph_resilience.testing import FakeClock, Fault, FaultyTool
from langgraph_resilience.testing.faults.calls import CallLog, Shadow, replay
from langgraph_resilience.testing.faults.kinds import FAULT_KINDS, TIMEOUTS, FaultKind
from langgraph_resilience.testing.faults.plan import FaultPlan, FaultSpec
from langgraph_resilience.testing.faults.schedules import Cursor

__all__ = ["DEFAULT_LATENCY", "DEFAULT_TIMEOUT", "ChaosOptions", "ChaosTool", "inject"]


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


DEFAULT_LATENCY = 0.05
"""Virtual seconds every call charges to the clock."""
DEFAULT_TIMEOUT = 5.0
"""Virtual seconds a timeout fault charges on top."""


class ChaosOptions(TypedDict, total=False):
    """How a `ChaosTool` charges time and judges breakers (the options of `inject`)."""

    clock: FakeClock | None
    latency: float
    timeout: float
    breaker: BreakerConfig | None
    epoch: Callable[[], int] | None


class _Group:
    """The tools of one `inject` call: one arrival order and one epoch, so the shadow
    breakers can tell when a logical call has left its tool (see `ChaosTool`)."""

    def __init__(self, epoch: Callable[[], int] | None) -> None:
        self.epoch = epoch
        self.tools: list[ChaosTool] = []
        self._next = 0
        self._lock = threading.Lock()
        self._cache: tuple[int, dict[str, Shadow]] | None = None

    def arrive(self) -> tuple[int, int | None]:
        """A sequence number for an arriving attempt, and the epoch it arrives in."""
        with self._lock:
            seq = self._next
            self._next += 1
        return seq, (self.epoch() if self.epoch is not None else None)

    def shadows(self) -> dict[str, Shadow]:
        """Every tool's shadow breaker, replayed (cached until an attempt is logged)."""
        logged = sum(len(t._log) for t in self.tools)
        with self._lock:
            if self._cache is not None and self._cache[0] == logged:
                return self._cache[1]
        shadows = replay(
            {t.name: t._log for t in self.tools}, {t.name: t._breaker for t in self.tools}
        )
        with self._lock:
            self._cache = (logged, shadows)
        return shadows


@dataclasses.dataclass(slots=True)
class _Slot:
    """The fault decided for the running call, and whether the wrapped tool ran
    (shared by reference: the tool body runs in a copy of the caller's context)."""

    fault: Fault | None
    executed: bool = False
    result: Any = None
    """What the attempt returned, once it did."""


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
    _cursors: list[Cursor] = PrivateAttr(default_factory=list)
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
        self, inner: BaseTool, plan: FaultPlan, *, seed: int, **options: Unpack[ChaosOptions]
    ) -> None:
        super().__init__(inner)
        self._breaker = options.get("breaker")
        self._join(_Group(options.get("epoch")))
        self._specs = [s for s in plan.specs if s.applies_to(inner.name)]
        self._cursors = [
            Cursor(random.Random(f"{seed}:{i}:{inner.name}"))
            for i, s in enumerate(plan.specs)
            if s.applies_to(inner.name)
        ]
        self._kind_rng = random.Random(f"{seed}:kinds:{inner.name}")
        self._clock = options.get("clock")
        self._latency = options.get("latency", DEFAULT_LATENCY)
        self._timeout = options.get("timeout", DEFAULT_TIMEOUT)

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
            if kind is not None and kind.name in TIMEOUTS:
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

    @contextlib.contextmanager
    def _attempt(
        self, value: str | dict[str, Any] | ToolCall, config: RunnableConfig | None
    ) -> Iterator[_Slot]:
        """One attempt: decide its fault, expose it to the tool body, log how it ended
        (control flow such as ``interrupt()`` passes through unlogged)."""
        call = self._begin(value, config)
        slot = _Slot(call.fault)
        token = _CURRENT.set(slot)
        try:
            yield slot
        except GraphBubbleUp:
            raise
        except Exception:
            self._end(call, slot, ok=False)
            raise
        finally:
            _CURRENT.reset(token)
        degraded = call.kind is not None and not call.kind.raises
        self._end(call, slot, ok=_is_success(slot.result) and not degraded)

    def invoke(
        self,
        input: str | dict[str, Any] | ToolCall,
        config: RunnableConfig | None = None,
        **kwargs: Any,
    ) -> Any:
        with self._attempt(input, config) as slot:
            slot.result = super().invoke(input, config, **kwargs)
        return slot.result

    async def ainvoke(
        self,
        input: str | dict[str, Any] | ToolCall,
        config: RunnableConfig | None = None,
        **kwargs: Any,
    ) -> Any:
        with self._attempt(input, config) as slot:
            slot.result = await super().ainvoke(input, config, **kwargs)
        return slot.result

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
            return _wrong(result)
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


def _wrong(result: Any) -> Any:
    """`result` with every number negated; as is when it is not JSON (or null)."""
    content = result.content if isinstance(result, ToolMessage) else result
    parsed = parsed_content(content)
    if parsed is None or (isinstance(content, str) and parsed is content):
        return result
    return _negate_numbers(parsed)


def _is_success(result: Any) -> bool:
    return not (isinstance(result, ToolMessage) and result.status == "error")


def inject(
    tools: Sequence[BaseTool],
    plan: FaultPlan,
    seed: int,
    *,
    clock: FakeClock | None = None,
    latency: float = DEFAULT_LATENCY,
    timeout: float = DEFAULT_TIMEOUT,
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
    >>> from langgraph_resilience.testing.faults import single
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
