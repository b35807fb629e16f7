"""Circuit breakers shared through PostgreSQL: every process on one table (``lgr_breakers``).

Admission of a closed breaker is one plain ``SELECT`` at most every `BREAKER_CACHE_TTL`
seconds, plain successes are written in batches (`SUCCESS_FLUSH_INTERVAL`) and not at
all when they change nothing (a full window of successes), and every other change is
one transaction holding the key's row lock. `PostgresBreakerStore` and
`AsyncPostgresBreakerStore` are one implementation (`_PostgresBreakers`) whose
operations are flows driven by `drive` or `adrive`; they differ in the connections
they take. psycopg is imported by the first store built, never by in-memory users.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from langgraph_resilience.core.breaker import (
    CLOSED,
    Admission,
    BreakerConfig,
    BreakerState,
    Outcome,
    Transition,
    admit,
    fast_admission,
    record,
    release,
)
from langgraph_resilience.core.clock import Clock, SystemClock
from langgraph_resilience.core.flow import Call, Flow, adrive, drive
from langgraph_resilience.errors import ConfigurationError
from langgraph_resilience.events import logger
from langgraph_resilience.stores.breakers import emit_transition
from langgraph_resilience.stores.memory import DEFAULT_MAX_ENTRIES

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import AsyncConnectionPool, ConnectionPool

__all__ = [
    "BREAKER_CACHE_TTL",
    "SUCCESS_FLUSH_INTERVAL",
    "AsyncPostgresBreakerStore",
    "PostgresBreakerStore",
]

T = TypeVar("T")

_CLOSED_JSON = CLOSED.to_json()


def _parse(key: str, raw: Any) -> BreakerState:
    if raw is None:
        return CLOSED
    try:
        return BreakerState.from_json(raw)
    except ValueError:
        logger.warning("breaker %r: unreadable stored state, starting closed: %r", key, raw)
        return CLOSED


BREAKER_CACHE_TTL = 0.5
"""How stale, in seconds, a breaker read served from this process's cache may be: a
breaker another process opened is refused here at most this much later (this process's
own changes are seen at once). Override with ``PostgresBreakerStore(cache_ttl=...)``;
0 reads the row on every admission."""

SUCCESS_FLUSH_INTERVAL = 0.1
"""How long, in seconds, a plain success waits in this process before it is written,
together with every other success of its breaker that arrived meanwhile (one row-locked
change per breaker per interval instead of one per call). Failures, slow calls and
probes are written at once (a waiting success goes first, in the same transaction).
Override with ``PostgresBreakerStore(flush_interval=...)``; None writes every success
at once."""

_SEEN_MAX = DEFAULT_MAX_ENTRIES
"""Breakers whose last read this process keeps (cleared past it)."""

_Success = tuple[float, float | None, BreakerConfig]
"""A success waiting to be written: (now, duration, config)."""


def _slow(cfg: BreakerConfig, duration: float | None) -> bool:
    threshold = cfg.slow_call_threshold_s
    return threshold is not None and duration is not None and duration >= threshold


def _with_successes(
    state: BreakerState, successes: list[_Success], transitions: list[Transition]
) -> BreakerState:
    """`state` with the waiting successes applied in order (their transitions noted)."""
    for at, duration, cfg in successes:
        state, transition = record(state, cfg, at, None, duration=duration)
        if transition is not None:
            transitions.append(transition)
    return state


class _PostgresBreakers:
    """The breaker operations on one `JsonTable`, each a flow: the sync methods drive
    it with `drive`, their async twins with `adrive`.

    Two in-process shortcuts keep a closed breaker off the critical path: admission
    reads the row at most once per `cache_ttl` (`BREAKER_CACHE_TTL`), and plain
    successes are written in batches, at most `flush_interval` late
    (`SUCCESS_FLUSH_INTERVAL`), off the caller's path (a daemon thread for a sync
    store, a task on its loop for an async one), and a batch that leaves the breaker
    as this process last saw it is not written at all (`_changes_nothing`). What they
    trade: another process's trip is seen here up to `cache_ttl` late, a process
    killed, or a pool closed before `flush`, loses the successes of its last
    `flush_interval` (never a failure: those are written at once), and an unwritten
    batch counts as if it came before a failure another process wrote in the last
    `cache_ttl` (a trip comes no later for it)."""

    _ASYNC = False

    def __init__(
        self,
        conn: Any,
        table: str,
        *,
        cache_ttl: float = BREAKER_CACHE_TTL,
        flush_interval: float | None = SUCCESS_FLUSH_INTERVAL,
        clock: Clock | None = None,
    ) -> None:
        # Imported here: a graph with in-memory breakers never loads psycopg.
        from langgraph_resilience.stores.postgres import JsonTable, Postgres  # noqa: PLC0415

        pg = Postgres(conn, owner=type(self).__name__, is_async=self._ASYNC)
        self._table = JsonTable(pg, table, _CLOSED_JSON)
        self.table = table
        if cache_ttl < 0 or (flush_interval is not None and flush_interval < 0):
            raise ConfigurationError(
                "cache_ttl and flush_interval must be >= 0 seconds (flush_interval=None "
                f"writes every success at once), got {cache_ttl!r} and {flush_interval!r}"
            )
        self.cache_ttl = float(cache_ttl)
        self.flush_interval = flush_interval
        self.clock: Clock = clock or SystemClock()
        """Ages the cached reads (monotonic): inject a FakeClock in tests."""
        self._seen: dict[str, tuple[float, BreakerState]] = {}
        """key -> (read at, state): the last stored state this process saw."""
        self._successes: dict[str, list[_Success]] = {}
        self._guard = threading.Condition()
        self._flusher: threading.Thread | None = None
        self._aflusher: asyncio.Task[None] | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop of an async pool or connection (None for a sync one)."""
        return self._table.pg.loop

    # ----------------------------------------------------------- the cache

    def _cached(self, key: str) -> BreakerState | None:
        """The stored state this process saw less than `cache_ttl` ago, or None."""
        seen = self._seen.get(key)
        if seen is None or self.clock.monotonic() - seen[0] >= self.cache_ttl:
            return None
        return seen[1]

    def _remember(self, key: str, state: BreakerState) -> None:
        if self.cache_ttl <= 0:
            return
        if len(self._seen) >= _SEEN_MAX:
            self._seen.clear()
        self._seen[key] = (self.clock.monotonic(), state)

    def _changes_nothing(self, key: str, successes: list[_Success]) -> bool:
        """Whether `successes` leave the breaker as this process saw it less than
        `cache_ttl` ago (a closed one whose window is a full ring of clean outcomes, or
        an open one): then there is nothing to write. What that trades: the successes
        count as if they came before any failure another process wrote since that
        sight, so such a failure stays in the shared window for as many outcomes more;
        a trip is never missed by it, at most come sooner."""
        state = self._cached(key)
        return state is not None and _with_successes(state, successes, []) is state

    # ----------------------------------------------------------- waiting successes

    def _defer(self, key: str, success: _Success) -> None:
        with self._guard:
            self._successes.setdefault(key, []).append(success)
            if self._ASYNC:
                self._schedule_aflush()
            elif self._flusher is None or not self._flusher.is_alive():
                self._flusher = threading.Thread(
                    target=self._flush_forever, name="lgr-breaker-flush", daemon=True
                )
                self._flusher.start()
            else:
                self._guard.notify()

    def _take(self, key: str | None = None) -> dict[str, list[_Success]]:
        with self._guard:
            if key is None:
                taken, self._successes = self._successes, {}
                return taken
            found = self._successes.pop(key, None)
            return {} if found is None else {key: found}

    def _put_back(self, taken: dict[str, list[_Success]]) -> None:
        with self._guard:
            for key, successes in taken.items():
                self._successes[key] = successes + self._successes.get(key, [])

    def _waiting(self, key: str) -> list[_Success]:
        with self._guard:
            return list(self._successes.get(key, ()))

    def _flushing(self) -> Flow[None]:
        """Write every waiting success: one row-locked change per breaker they change."""
        taken = self._take()
        for key, successes in taken.items():
            if self._changes_nothing(key, successes):
                continue
            try:
                yield from self._applying(key, successes, None)
            except Exception:
                self._put_back({k: v for k, v in taken.items() if k >= key})
                raise

    def _flush_forever(self) -> None:
        """The sync store's flusher: wait for a success, linger, write them all."""
        while True:
            with self._guard:
                self._guard.wait_for(lambda: bool(self._successes))
                lingers_until = time.monotonic() + (self.flush_interval or 0.0)
                while (left := lingers_until - time.monotonic()) > 0:  # notified or not
                    self._guard.wait(left)
            try:
                drive(self._flushing(), _NEVER_SLEEPS)
            except Exception as exc:  # kept, written with the next batch or failure
                if self._table.pg.closed:
                    self._dropped(exc, ending=True)
                    return  # the next success starts a flusher again
                logger.warning("breaker successes not written yet: %s", type(exc).__name__)
                with self._guard:
                    self._guard.wait(self.flush_interval or 0.1)

    def _dropped(self, exc: Exception, *, ending: bool = False) -> None:
        """The store's pool or connection was closed with successes waiting: drop them,
        said once, rather than retry them against it forever (a closed pool stays closed
        unless its owner opens it again). The shared window misses only successes."""
        with self._guard:
            count = sum(len(waiting) for waiting in self._successes.values())
            self._successes.clear()
            if ending:
                self._flusher = None
        logger.warning(
            "%d breaker success(es) dropped: %s, the store's pool or connection was "
            "closed first; call the store's flush() before closing it to keep them",
            count,
            type(exc).__name__,
        )

    def _schedule_aflush(self) -> None:
        """The async store's flusher: one task on the running loop per batch."""
        if self._aflusher is not None and not self._aflusher.done():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:  # a sync call from another thread: onto the store's loop
            loop = self.loop
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(self._schedule_aflush)
            return
        self._aflusher = running.create_task(self._aflush_later())

    async def _aflush_later(self) -> None:
        await self.clock.asleep(self.flush_interval or 0.0)
        try:
            await adrive(self._flushing(), _NEVER_SLEEPS)
        except Exception as exc:  # kept, written with the next batch or failure
            if self._table.pg.closed:
                self._dropped(exc)
                return
            logger.warning("breaker successes not written yet: %s", type(exc).__name__)

    def flush(self) -> None:
        """Write the successes waiting in this process now (e.g. before exiting)."""
        drive(self._flushing(), _NEVER_SLEEPS)

    async def aflush(self) -> None:
        """Async `flush`."""
        await adrive(self._flushing(), _NEVER_SLEEPS)

    # ----------------------------------------------------------- the flows

    def _change(
        self, key: str, change: Callable[[BreakerState], tuple[T, BreakerState]]
    ) -> Flow[T]:
        """Apply `change` to the stored breaker under its row lock; remember the result."""
        written: list[BreakerState] = []

        def apply(raw: Any) -> tuple[T, dict[str, Any] | None]:
            state = _parse(key, raw)
            result, new = change(state)
            written.append(new)
            return result, None if new is state else new.to_json()

        result: T = yield Call(self._table.change, self._table.achange, (key, apply))
        if written:
            self._remember(key, written[-1])
        return result

    def _applying(
        self,
        key: str,
        successes: list[_Success],
        then: Callable[[BreakerState], tuple[Transition | None, BreakerState]] | None,
    ) -> Flow[Transition | None]:
        """The waiting `successes` of `key`, then `then`, in one locked change; every
        transition emitted; `then`'s returned."""
        transitions: list[Transition] = []

        def change(state: BreakerState) -> tuple[Transition | None, BreakerState]:
            transitions.clear()
            state = _with_successes(state, successes, transitions)
            if then is None:
                return None, state
            last, state = then(state)
            if last is not None:
                transitions.append(last)
            return last, state

        result: Transition | None = yield from self._change(key, change)
        for transition in transitions:
            emit_transition(key, transition)
        return result

    def _acquiring(self, key: str, cfg: BreakerConfig, now: float) -> Flow[Admission]:
        cached = self._cached(key)
        if cached is not None:
            fast = fast_admission(cached.status, cached.opened_at, cfg, now)
            if fast is not None:
                return fast
        stored = _parse(key, (yield Call(self._table.read, self._table.aread, (key,))))
        self._remember(key, stored)
        fast = fast_admission(stored.status, stored.opened_at, cfg, now)
        if fast is not None:
            return fast

        def change(state: BreakerState) -> tuple[tuple[Admission, Transition | None], BreakerState]:
            admission, new, transition = admit(state, cfg, now)
            return (admission, transition), new

        admission: Admission
        admission, transition = yield from self._change(key, change)
        if transition is not None:
            emit_transition(key, transition)
        return admission

    def _recording(
        self,
        key: str,
        cfg: BreakerConfig,
        now: float,
        outcome: Outcome,
        *,
        probe: bool,
        duration: float | None,
    ) -> Flow[Transition | None]:
        plain = outcome is None and not probe and not _slow(cfg, duration)
        if plain and self.flush_interval is not None:  # cannot trip at once: batched
            self._defer(key, (now, duration, cfg))
            return None

        def then(state: BreakerState) -> tuple[Transition | None, BreakerState]:
            new, transition = record(state, cfg, now, outcome, probe=probe, duration=duration)
            return transition, new

        taken = self._take(key)
        try:
            return (yield from self._applying(key, taken.get(key, []), then))
        except Exception:
            self._put_back(taken)
            raise

    def _releasing(self, key: str, cfg: BreakerConfig, now: float, probe: bool) -> Flow[None]:
        if probe:
            yield from self._change(key, lambda state: (None, release(state, cfg, now)))

    def _snapshot(self, key: str) -> Flow[BreakerState]:
        """The stored state, with this process's waiting successes applied."""
        raw = yield Call(self._table.read, self._table.aread, (key,))
        return _with_successes(_parse(key, raw), self._waiting(key), [])

    def acquire(self, key: str, cfg: BreakerConfig, now: float) -> Admission:
        """Admit or refuse one call (`admit`), taking a probe permit in half-open; a
        closed or still-open breaker read at most `cache_ttl` ago is not read again."""
        return drive(self._acquiring(key, cfg, now), _NEVER_SLEEPS)

    def record(
        self, key: str, cfg: BreakerConfig, now: float, outcome: Outcome,
        *, probe: bool = False, duration: float | None = None,
    ) -> Transition | None:  # fmt: skip
        """Account for an admitted call's outcome (`record`); None is success. A plain
        success is written within `flush_interval`, off the caller's path."""
        return drive(
            self._recording(key, cfg, now, outcome, probe=probe, duration=duration), _NEVER_SLEEPS
        )

    def release(self, key: str, cfg: BreakerConfig, now: float, *, probe: bool) -> None:
        """Return an admission whose call produced no outcome (`release`)."""
        drive(self._releasing(key, cfg, now, probe), _NEVER_SLEEPS)

    def snapshot(self, key: str) -> BreakerState:
        """The stored state (a fresh closed one for an unknown key), with the successes
        this process has not written yet."""
        return drive(self._snapshot(key), _NEVER_SLEEPS)

    async def aacquire(self, key: str, cfg: BreakerConfig, now: float) -> Admission:
        """Async `acquire`."""
        return await adrive(self._acquiring(key, cfg, now), _NEVER_SLEEPS)

    async def arecord(
        self, key: str, cfg: BreakerConfig, now: float, outcome: Outcome,
        *, probe: bool = False, duration: float | None = None,
    ) -> Transition | None:  # fmt: skip
        """Async `record`."""
        flow = self._recording(key, cfg, now, outcome, probe=probe, duration=duration)
        return await adrive(flow, _NEVER_SLEEPS)

    async def arelease(self, key: str, cfg: BreakerConfig, now: float, *, probe: bool) -> None:
        """Async `release`."""
        await adrive(self._releasing(key, cfg, now, probe), _NEVER_SLEEPS)

    async def asnapshot(self, key: str) -> BreakerState:
        """Async `snapshot`."""
        return await adrive(self._snapshot(key), _NEVER_SLEEPS)


_NEVER_SLEEPS = SystemClock()


class PostgresBreakerStore(_PostgresBreakers):
    """Breakers shared by every process using one PostgreSQL table, atomically.

    Give it the connection pool (or a connection) of your `PostgresSaver`:
    autocommit, ``prepare_threshold=None``, any row factory. Run `setup()` once,
    like the saver's. Admission of a closed (or still-open) breaker is one plain
    ``SELECT``, served from this process's cache for `cache_ttl` seconds
    (`BREAKER_CACHE_TTL`); every change runs in a transaction holding the key's row
    lock (``SELECT ... FOR UPDATE``), so concurrent workers never lose an update and
    half-open probe permits are never over-granted. Plain successes are batched:
    written within `flush_interval` (`SUCCESS_FLUSH_INTERVAL`), one locked change per
    breaker per batch, off the caller's path; failures, slow calls and probes at once.
    Call `flush()` to write the batch now. Async graphs can call the
    async methods (they run the statements in a worker thread); for an
    `AsyncConnectionPool` use `AsyncPostgresBreakerStore`.

    >>> store = PostgresBreakerStore(pool)  # doctest: +SKIP
    >>> store.setup()  # doctest: +SKIP
    """

    def __init__(
        self,
        conn: psycopg.Connection[Any] | ConnectionPool[Any],
        *,
        table: str = "lgr_breakers",
        cache_ttl: float = BREAKER_CACHE_TTL,
        flush_interval: float | None = SUCCESS_FLUSH_INTERVAL,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(
            conn, table, cache_ttl=cache_ttl, flush_interval=flush_interval, clock=clock
        )

    def setup(self) -> None:
        """Create the table if it does not exist. Run once, at deployment or start-up."""
        self._table.setup()


class AsyncPostgresBreakerStore(_PostgresBreakers):
    """`PostgresBreakerStore` on an `AsyncConnectionPool` (or `AsyncConnection`).

    The async methods never block the event loop. The sync methods exist for
    sync code running in another thread while the store's loop runs (as
    LangGraph's `AsyncPostgresSaver` does); called on the loop itself they raise.

    >>> store = AsyncPostgresBreakerStore(async_pool)  # doctest: +SKIP
    >>> await store.setup()  # doctest: +SKIP
    """

    _ASYNC = True

    def __init__(
        self,
        conn: psycopg.AsyncConnection[Any] | AsyncConnectionPool[Any],
        *,
        table: str = "lgr_breakers",
        cache_ttl: float = BREAKER_CACHE_TTL,
        flush_interval: float | None = SUCCESS_FLUSH_INTERVAL,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(
            conn, table, cache_ttl=cache_ttl, flush_interval=flush_interval, clock=clock
        )

    async def setup(self) -> None:
        """Create the table if it does not exist. Run once, at deployment or start-up."""
        await self._table.asetup()
