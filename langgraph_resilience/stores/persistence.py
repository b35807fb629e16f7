"""Persistence helpers: a checkpointer, a store and our ledgers, correctly configured, in one call.

`open_sqlite(path)` is the embedded default (no server; a thread still resumes
across processes). `open_postgres(dsn)` / `aopen_postgres(dsn)` are production:
one connection pool shared by LangGraph's Postgres saver and store and by our
own tables (the idempotency ledger ``lgr_idempotency``, the saga log
``lgr_saga``, the thread leases ``lgr_thread_leases``, the shared circuit
breakers), configured the way LangGraph requires (autocommit, dict rows) and a
transaction pooler requires (``prepare_threshold=None``: nothing is prepared),
every ``setup()`` run by one process at a time under a setup lease (a row of the
lease table, never a session lock), so workers starting together do not race, and
a start-up never waits longer than ``setup_timeout``. Each yields a `Persistence`,
so compiling is::

    with open_postgres(dsn) as p:
        app = builder.compile(checkpointer=p.checkpointer, store=p.store)
        with p.thread_lock(thread_id):          # one runner per thread
            app.invoke(inputs, config, durability="sync")

Then `~langgraph_resilience.stores.threads.resume` continues a thread from its
last checkpoint, `~langgraph_resilience.stores.threads.thread_status` says where it
stands and `~langgraph_resilience.stores.threads.list_threads` lists them.
`Persistence.purge` deletes the ledger's old completed records, only when
called; `Persistence.list_pending` lists its intents of unknown outcome (see
"Retention" in `langgraph_resilience.core.effects`).

One runner per thread: `Persistence.thread_lock`
(`langgraph_resilience.stores.locks`) holds the thread's lease on the same backend;
a crashed runner's lease lapses after ``lease_ttl`` (30 s by default).

Durability (the ``durability=`` argument of ``invoke`` / ``stream`` / ``ainvoke`` /
``astream``; LangGraph has no compile-time default for it, so pass it per run):

- ``durability="sync"`` (use it for every graph with side effects; `resume`
  defaults to it): each checkpoint is written before the next step starts. The
  model's ``AIMessage``, whose tool-call ids are part of every idempotency key,
  is durable before any tool runs, so a crash replays the *same* calls and the
  ledger turns them into recorded outcomes or reconciliations.
- ``durability="async"`` (LangGraph's default): the checkpoint of step n is
  written while step n+1 runs. A side-effecting call therefore waits, before its
  first run, until the checkpoint of the step that asked for it is saved
  (`~langgraph_resilience._graph.saved_step`: it wakes when this process's save
  returns, or reads the checkpoint back), so a crash during the tools step replays
  the *same* calls, as under ``"sync"``; a save that does not come stops the run
  (`StepNotSavedError`, nothing ran). Read-only tools do not wait.
- ``durability="exit"``: written only when the run ends or interrupts. A crash
  loses the whole run: every LLM call and tool runs again and the model may plan
  an effect anew, so a side-effecting call under it is refused with a
  `ConfigurationError` (beside a checkpointer that outlives the process). Only for
  graphs without side effects.

Whatever the mode, the ledger's intent is committed durably before the effect
starts; its outcome is flushed by the next durable commit (see
`~langgraph_resilience.stores.postgres_ledger.PostgresIdempotencyStore`), and if that is
lost the intent is reconciled, never re-executed blindly.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import inspect
import pathlib
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any, TypeAlias, TypedDict, Unpack

import psycopg
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.store.base import BaseStore
from langgraph.store.postgres import PostgresStore
from langgraph.store.postgres.aio import AsyncPostgresStore
from langgraph.store.sqlite import SqliteStore
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from langgraph_resilience.core.clock import SystemClock
from langgraph_resilience.core.effects import (
    DEFAULT_RETENTION,
    IdempotencyRecord,
    IdempotencyStore,
    SagaLog,
)
from langgraph_resilience.core.flow import Call, Flow, adrive, drive
from langgraph_resilience.core.lease import DEFAULT_LEASE_TTL
from langgraph_resilience.core.lease import lease_ttl as lease_ttl_seconds
from langgraph_resilience.core.redaction import redact
from langgraph_resilience.errors import PersistenceError, SetupTimeoutError, ThreadBusyError
from langgraph_resilience.stores.effect_ledger import attach_ledger
from langgraph_resilience.stores.fencing import AsyncFencedPostgresSaver, FencedPostgresSaver
from langgraph_resilience.stores.leases import Lease, acquire
from langgraph_resilience.stores.locks import athread_lock, thread_lock
from langgraph_resilience.stores.memory import InMemoryIdempotencyStore
from langgraph_resilience.stores.postgres import (
    POSTGRES_CONNECTION_KWARGS,
    Postgres,
    connect_error,
    first_line,
)
from langgraph_resilience.stores.postgres_breakers import (
    AsyncPostgresBreakerStore,
    PostgresBreakerStore,
)
from langgraph_resilience.stores.postgres_ledger import (
    AsyncPostgresIdempotencyStore,
    AsyncPostgresSagaLog,
    PostgresIdempotencyStore,
    PostgresSagaLog,
)
from langgraph_resilience.stores.saga import InMemorySagaLog
from langgraph_resilience.stores.sqlite import SqliteIdempotencyStore, SqliteSagaLog, sqlite_connect

__all__ = [
    "POSTGRES_CONNECTION_KWARGS",
    "Persistence",
    "PersistenceError",
    "PostgresOptions",
    "aopen_postgres",
    "open_postgres",
    "open_sqlite",
]

_NEVER_SLEEPS = SystemClock()

AnyPool: TypeAlias = "ConnectionPool[Any] | AsyncConnectionPool[Any]"


@dataclasses.dataclass(frozen=True, slots=True)
class Persistence:
    """A checkpointer, a store and the side-effect ledgers that belong together.

    ``idempotency`` and ``saga`` live next to the checkpoints (same database or
    file); for Postgres ``pool`` is the shared pool, for SQLite ``path`` is the
    file. `thread_lock` / `athread_lock` lock one thread on the same backend.
    """

    checkpointer: BaseCheckpointSaver[Any]
    store: BaseStore
    pool: AnyPool | None = None
    target: str = ""
    """Where the data lives: a file path or a redacted DSN, for messages."""
    idempotency: IdempotencyStore = dataclasses.field(default_factory=InMemoryIdempotencyStore)
    """The durable intent/outcome ledger (`langgraph_resilience.core.effects`)."""
    saga: SagaLog = dataclasses.field(default_factory=InMemorySagaLog)
    """The append-only saga log of effects and compensations."""
    path: pathlib.Path | None = None
    """The SQLite file, for `open_sqlite`."""
    lease_ttl: float = DEFAULT_LEASE_TTL
    """Seconds a thread lease lives past its last renewal (PostgreSQL): how long a
    crashed runner keeps its thread before another may resume it."""

    def thread_lock(
        self, thread_id: str, *, wait: bool | float = False
    ) -> contextlib.AbstractContextManager[Lease | None]:
        """`thread_lock` on this persistence's backend (its ``lease_ttl``)."""
        return thread_lock(self, thread_id, wait=wait)

    def athread_lock(
        self, thread_id: str, *, wait: bool | float = False
    ) -> contextlib.AbstractAsyncContextManager[Lease | None]:
        """`athread_lock` on this persistence's backend (its ``lease_ttl``)."""
        return athread_lock(self, thread_id, wait=wait)

    def purge(self, older_than: float | dt.timedelta = DEFAULT_RETENTION) -> int:
        """Delete the ledger's completed records older than `older_than` (30 days by
        default); never a pending one. `IdempotencyStore.purge`, whose "Retention"
        docs say how long to keep them: longer than any thread may wait to be resumed.

        >>> with open_postgres(dsn) as p:  # doctest: +SKIP
        ...     deleted = p.purge(dt.timedelta(days=30))   # e.g. from a daily job
        """
        return self.idempotency.purge(older_than)

    async def apurge(self, older_than: float | dt.timedelta = DEFAULT_RETENTION) -> int:
        """Async `purge`."""
        return await self.idempotency.apurge(older_than)

    def list_pending(
        self, older_than: float | dt.timedelta = 0.0, *, limit: int | None = None
    ) -> list[IdempotencyRecord]:
        """The ledger's intents of unknown outcome claimed at least `older_than` ago,
        oldest first (`IdempotencyStore.list_pending`): what an operator reconciles."""
        return self.idempotency.list_pending(older_than, limit=limit)

    async def alist_pending(
        self, older_than: float | dt.timedelta = 0.0, *, limit: int | None = None
    ) -> list[IdempotencyRecord]:
        """Async `list_pending`."""
        return await self.idempotency.alist_pending(older_than, limit=limit)


# ------------------------------------------------------------------ SQLite


@contextlib.contextmanager
def open_sqlite(path: str | pathlib.Path) -> Iterator[Persistence]:
    """Open (and create) an embedded SQLite checkpointer, store and ledgers in one file.

    >>> with open_sqlite(tmp_path / "threads.sqlite") as p:  # doctest: +SKIP
    ...     app = builder.compile(checkpointer=p.checkpointer, store=p.store)
    """
    file = pathlib.Path(path)
    conns: list[sqlite3.Connection] = []
    try:
        try:
            file.parent.mkdir(parents=True, exist_ok=True)
            conns.extend(sqlite_connect(str(file)) for _ in range(3))
        except (OSError, sqlite3.Error) as exc:
            raise PersistenceError(
                f"cannot open SQLite state file {str(file)!r}: {exc}; "
                "choose a writable path (e.g. --state-dir)"
            ) from exc
        main, ledger_conn, saga_conn = conns
        try:
            checkpointer = SqliteSaver(main)
            checkpointer.setup()
            store = SqliteStore(main)
            store.setup()
            idempotency = SqliteIdempotencyStore(ledger_conn)
            idempotency.setup()
            saga = SqliteSagaLog(saga_conn)
            attach_ledger(checkpointer, idempotency, saga)
            yield Persistence(
                checkpointer=checkpointer,
                store=store,
                target=str(file),
                idempotency=idempotency,
                saga=saga,
                path=file,
            )
        except sqlite3.Error as exc:  # also a write refused later, e.g. a read-only file
            raise PersistenceError(
                f"SQLite state file {str(file)!r} is unusable: {exc}; "
                "is it read-only, or not a SQLite database?"
            ) from exc
    finally:
        for conn in conns:
            conn.close()


# ------------------------------------------------------------------ Postgres

SETUP_THREAD = "langgraph-resilience:setup"
"""The lease row start-ups take to run every ``setup()`` one process at a time."""
DEFAULT_SETUP_TIMEOUT = 60.0
"""Seconds a start-up waits for another process's setup: twice the setup lease's TTL
(always the default 30 s, whatever ``lease_ttl`` says: a setup is not cut short by a
short thread TTL), so a setup whose process crashed is taken over first."""

_SYNC_PARTS = (FencedPostgresSaver, PostgresStore, PostgresIdempotencyStore, PostgresSagaLog)
_ASYNC_PARTS = (
    AsyncFencedPostgresSaver,
    AsyncPostgresStore,
    AsyncPostgresIdempotencyStore,
    AsyncPostgresSagaLog,
)


def _postgres_persistence(pool: AnyPool, shown: str, ttl: float) -> Persistence:
    """The saver, the store and our ledgers on one pool, sync or async."""
    parts: tuple[Any, ...] = _ASYNC_PARTS if isinstance(pool, AsyncConnectionPool) else _SYNC_PARTS
    saver, store, ledger, saga = parts
    p = Persistence(
        checkpointer=saver(pool),
        store=store(pool),
        pool=pool,
        target=shown,
        idempotency=ledger(pool),
        saga=saga(pool),
        lease_ttl=ttl,
    )
    attach_ledger(p.checkpointer, p.idempotency, p.saga)
    return p


def _setup(p: Persistence, *, checkpointer: bool, wait: float) -> Flow[None]:
    """Every ``setup()`` (LangGraph's saver and store unless a server owns them, our
    ledgers, the breaker table), by one process at a time: under the setup lease, a
    row of the lease table taken and renewed like a thread's (so a pooler is fine,
    and a setup whose process crashed is taken over once its lease lapses). A start-up
    waits at most `wait` seconds for another's: `SetupTimeoutError`, never a hang."""
    asynchronous = isinstance(p.pool, AsyncConnectionPool)
    breakers: Any = AsyncPostgresBreakerStore if asynchronous else PostgresBreakerStore
    assert p.pool is not None
    runner = Postgres(p.pool, owner="open_postgres", is_async=asynchronous)
    try:
        lease = yield from acquire(
            runner,
            SETUP_THREAD,
            ttl=DEFAULT_LEASE_TTL,
            wait=wait,
            clock=_NEVER_SLEEPS,
            where=p.target,
        )
    except ThreadBusyError as exc:
        raise SetupTimeoutError.waiting("the tables", seconds=f"{wait:g}s") from exc
    yield Call(lease.start_renewal, _async_call(lease.astart_renewal))
    parts: tuple[Any, ...] = (p.idempotency, p.saga, breakers(p.pool))
    if checkpointer:
        parts = (p.checkpointer, p.store, *parts)
    try:
        for part in parts:
            yield Call(part.setup)
    except Exception:
        yield Call(lease.release, lease.arelease)
        raise
    yield Call(lease.release, lease.arelease)


def _async_call(start: Callable[[], None]) -> Callable[[], Any]:
    """`start` as an async callable (it must run on the loop: it creates a task)."""

    async def call() -> None:
        start()

    return call


def postgres_opening(
    dsn: str,
    connect: Callable[..., Any],
    pool_class: Any,
    *,
    min_size: int = 1,
    max_size: int = 10,
    timeout: float = 10.0,
    setup: bool = True,
    checkpointer: bool = True,
    lease_ttl: float | dt.timedelta | None = None,
    setup_timeout: float = DEFAULT_SETUP_TIMEOUT,
) -> Flow[Persistence]:
    """Probe `dsn`, open a pool on it, set every table up: `open_postgres` under
    `drive`, `aopen_postgres` under `adrive` (the async connection and pool)."""
    shown = redact(dsn)
    ttl = lease_ttl_seconds(lease_ttl)
    options = {
        "autocommit": True,
        "connect_timeout": max(1, int(timeout)),
        "prepare_threshold": None,
    }
    try:  # one direct probe: fails fast with the server's reason, where a pool would retry
        probe = yield Call(connect, None, (dsn,), options)
    except psycopg.Error as exc:
        raise connect_error(shown, exc) from None  # the driver's text may quote the DSN
    yield Call(probe.close)  # it connected: the server is there
    pools: list[Any] = []
    pool: Any = pool_class(
        dsn,
        min_size=min_size,
        max_size=max_size,
        kwargs=POSTGRES_CONNECTION_KWARGS,
        open=False,
        name="langgraph-resilience",
        check=_purging_check(pool_class, pools),  # a server restart breaks idle connections
    )
    pools.append(pool)
    try:
        yield Call(pool.open, None, (), {"wait": True, "timeout": timeout})
        persistence = _postgres_persistence(pool, shown, ttl)
        if setup:
            yield from _setup(persistence, checkpointer=checkpointer, wait=setup_timeout)
    except PoolTimeout:
        yield Call(pool.close)
        reason = yield from _why_no_connection(dsn, connect, options)
        raise PersistenceError(
            f"cannot open a pool on PostgreSQL at {shown} within {timeout:g}s: {reason}"
        ) from None
    except (psycopg.Error, OSError) as exc:
        yield Call(pool.close)
        raise PersistenceError(f"cannot open PostgreSQL at {shown}: {first_line(exc)}") from None
    except Exception:  # ours, typed already (SetupTimeoutError, ...): the pool is closed
        yield Call(pool.close)
        raise
    return persistence


def _why_no_connection(
    dsn: str, connect: Callable[..., Any], options: Mapping[str, Any]
) -> Flow[str]:
    """Why the pool got no connection although the probe did: the server's first line
    for a fresh connection and statement, not a guess at host and credentials."""
    try:
        conn = yield Call(connect, None, (dsn,), dict(options))
    except psycopg.Error as exc:
        return first_line(exc)
    try:
        yield Call(conn.execute, None, ("SELECT 1",))
    except psycopg.Error as exc:
        yield Call(conn.close)
        return first_line(exc)
    yield Call(conn.close)
    return (
        "a direct connection works, so the pool's connections were refused or queued "
        "(a pooler's pool or max_client_conn full?): raise those limits, or timeout="
    )


def _purging_check(pool_class: Any, pools: list[Any]) -> Callable[[Any], Any]:
    """The pool's check on checkout, which on the first broken connection checks every
    idle one at once (`pool.check()`): after a server restart all of them are broken,
    and psycopg_pool would otherwise find that out one checkout at a time, waiting its
    reconnection backoff (0, 1, 2, 4, ... s) between them, until its timeout."""
    if inspect.iscoroutinefunction(pool_class.check_connection):

        async def acheck(conn: Any) -> None:
            try:
                await pool_class.check_connection(conn)
            except Exception:
                await pools[0].check()
                raise

        return acheck

    def check(conn: Any) -> None:
        try:
            pool_class.check_connection(conn)
        except Exception:
            pools[0].check()
            raise

    return check


class PostgresOptions(TypedDict, total=False):
    """The keyword arguments of `open_postgres` and `aopen_postgres`."""

    min_size: int
    """Connections the pool keeps open (default 1)."""
    max_size: int
    """Connections the pool may open (default 10)."""
    timeout: float
    """Seconds to wait for the server (default 10)."""
    setup: bool
    """Create every table (default True); ``False`` in workers when a deploy step
    already did."""
    checkpointer: bool
    """Create LangGraph's checkpoint and store tables too (default True); ``False``
    when a LangGraph Server owns the checkpointer (`shared_postgres` does)."""
    lease_ttl: float | dt.timedelta
    """How long a thread lease lives past its last renewal (default 30 s): how long a
    crashed runner keeps its thread before `resume` may take it over. Its holder renews
    it every third of that."""
    setup_timeout: float
    """Seconds a start-up waits for another process's setup before it fails with
    `SetupTimeoutError` (default 60)."""


@contextlib.contextmanager
def open_postgres(dsn: str, **options: Unpack[PostgresOptions]) -> Iterator[Persistence]:
    """Open a pool on `dsn` with a `PostgresSaver`, a `PostgresStore` and our ledgers.

    Every table is created (``setup=True``) by one process at a time, under a lease
    row (no session state: fine through PgBouncer), so processes that start together
    do not race on migrations and none waits longer than ``setup_timeout``; pass
    ``setup=False`` in workers when a deploy step already ran it. A connection
    failure raises `PersistenceError` naming the DSN with its password redacted and
    the server's reason.
    """
    persistence = drive(
        postgres_opening(dsn, psycopg.connect, ConnectionPool, **options), _NEVER_SLEEPS
    )
    try:
        yield persistence
    finally:
        persistence.pool.close()  # type: ignore[union-attr]


@contextlib.asynccontextmanager
async def aopen_postgres(
    dsn: str, **options: Unpack[PostgresOptions]
) -> AsyncIterator[Persistence]:
    """Async `open_postgres`: an `AsyncConnectionPool`, `AsyncPostgresSaver`,
    `AsyncPostgresStore` and the async ledgers, for ``app.ainvoke`` / ``astream``.

    >>> async with aopen_postgres(dsn) as p:  # doctest: +SKIP
    ...     app = builder.compile(checkpointer=p.checkpointer, store=p.store)
    """
    flow = postgres_opening(dsn, psycopg.AsyncConnection.connect, AsyncConnectionPool, **options)
    persistence = await adrive(flow, _NEVER_SLEEPS)
    try:
        yield persistence
    finally:
        await persistence.pool.close()  # type: ignore[union-attr, misc]
