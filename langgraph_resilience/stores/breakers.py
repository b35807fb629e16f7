"""Circuit breakers in this process, and `CircuitBreaker` for plain callables.

Each store applies the pure transitions of `langgraph_resilience.core.breaker`
(`admit`, `record`, `release`) atomically behind the `BreakerStore` protocol, and
emits a ``breaker`` `Event` for every transition:

- `InMemoryBreakerStore` (the default): one process, a lock held for the
  transition alone (never across the tool call);
- `PostgresBreakerStore` / `AsyncPostgresBreakerStore`
  (`langgraph_resilience.stores.postgres_breakers`): every process sharing a table.

`CircuitBreaker` packages the protocol for plain callables.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from langgraph.errors import GraphBubbleUp

from langgraph_resilience.core.breaker import (
    ADMITTED,
    CLOSED,
    Admission,
    BreakerConfig,
    BreakerState,
    BreakerStore,
    Outcome,
    Transition,
    admit,
    record,
    release,
)
from langgraph_resilience.core.classification import classify
from langgraph_resilience.core.clock import Clock, SystemClock
from langgraph_resilience.core.flow import Call, Flow, adrive, drive
from langgraph_resilience.errors import CircuitOpenError
from langgraph_resilience.events import Event, emit
from langgraph_resilience.stores.memory import DEFAULT_MAX_ENTRIES, check_max_entries, evict_lru

__all__ = ["CircuitBreaker", "InMemoryBreakerStore", "emit_transition"]

T = TypeVar("T")

_CLOSED_JSON = CLOSED.to_json()


def emit_transition(key: str, transition: Transition) -> None:
    """The ``breaker`` event of one transition."""
    states = {"from_state": transition.source, "to_state": transition.target}
    when = {"reason": transition.reason, "at": transition.at}
    emit(Event("breaker", key=key, transition=transition.name, **states, **when))


# ------------------------------------------------------------------ in this process


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
        self.max_entries = check_max_entries(max_entries)

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
            evict_lru(states, limit, key, rules)

    def acquire(self, key: str, cfg: BreakerConfig, now: float) -> Admission:
        with self._lock:
            state = self._states.get(key, CLOSED)
            if state.status == "closed":  # the hot path: nothing to write
                return ADMITTED
            admission, new, transition = admit(state, cfg, now)
            self._store(key, new, now)
        if transition is not None:
            emit_transition(key, transition)
        return admission

    def record(
        self, key: str, cfg: BreakerConfig, now: float, outcome: Outcome,
        *, probe: bool = False, duration: float | None = None,
    ) -> Transition | None:  # fmt: skip
        with self._lock:
            new, transition = record(
                self._states.get(key, CLOSED), cfg, now, outcome, probe=probe, duration=duration
            )
            self._store(key, new, now)
        if transition is not None:
            emit_transition(key, transition)
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
        self, key: str, cfg: BreakerConfig, now: float, outcome: Outcome,
        *, probe: bool = False, duration: float | None = None,
    ) -> Transition | None:  # fmt: skip
        return self.record(key, cfg, now, outcome, probe=probe, duration=duration)

    async def arelease(self, key: str, cfg: BreakerConfig, now: float, *, probe: bool) -> None:
        self.release(key, cfg, now, probe=probe)

    async def asnapshot(self, key: str) -> BreakerState:
        return self.snapshot(key)


# ------------------------------------------------------------------ CircuitBreaker


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

    def _admitted(self, admission: Admission) -> Admission:
        if not admission.allowed:
            raise CircuitOpenError(self.key, admission.retry_after)
        return admission

    def _ended(self, admission: Admission, started: float, exc: BaseException | None) -> Flow[None]:
        """Account for the call's end: an outcome (success, or a classified failure), or,
        when it produced none (an interrupt, a cancellation), the admission released."""
        store, cfg, key, clock = self.store, self.config, self.key, self.clock
        if isinstance(exc, GraphBubbleUp) or not isinstance(exc, Exception | None):
            kwargs: dict[str, Any] = {"probe": admission.probe}
            yield Call(store.release, store.arelease, (key, cfg, clock.time()), kwargs)
            return
        outcome = None if exc is None else classify(exc).failure_class
        args = (key, cfg, clock.time(), outcome)
        kwargs = {"probe": admission.probe, "duration": clock.monotonic() - started}
        yield Call(store.record, store.arecord, args, kwargs)

    def call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Call ``fn(*args, **kwargs)`` through the breaker."""
        admission = self._admitted(self.store.acquire(self.key, self.config, self.clock.time()))
        started = self.clock.monotonic()
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            drive(self._ended(admission, started, exc), self.clock)
            raise
        drive(self._ended(admission, started, None), self.clock)
        return result

    async def acall(self, fn: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any) -> T:
        """Await ``fn(*args, **kwargs)`` through the breaker."""
        now = self.clock.time()
        admission = self._admitted(await self.store.aacquire(self.key, self.config, now))
        started = self.clock.monotonic()
        try:
            result = await fn(*args, **kwargs)
        except BaseException as exc:
            ending = adrive(self._ended(admission, started, exc), self.clock)
            if isinstance(exc, Exception):
                await ending
            else:  # cancelled: release the admission even so
                await asyncio.shield(ending)
            raise
        await adrive(self._ended(admission, started, None), self.clock)
        return result
