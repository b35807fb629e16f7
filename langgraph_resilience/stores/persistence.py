"""Persistence helpers: a checkpointer, a store and our ledgers, correctly configured, in one call.

`open_sqlite(path)` is the embedded default (no server; a thread still resumes
across processes). `open_postgres(dsn)` / `aopen_postgres(dsn)` are production:
one connection pool shared by LangGraph's Postgres saver and store and by our
own tables (the idempotency ledger ``lgr_idempotency``, the saga log
``lgr_saga``, the shared circuit breakers), configured the way LangGraph
requires (autocommit, ``prepare_threshold=0``, dict rows), every ``setup()``
run once under an advisory lock so workers starting together do not race. Each
yields a `Persistence`, so compiling is::

    with open_postgres(dsn) as p:
        app = builder.compile(checkpointer=p.checkpointer, store=p.store)
        with p.thread_lock(thread_id):          # one runner per thread
            app.invoke(inputs, config, durability="sync")

Then `resume` / `aresume` continue a thread from its last checkpoint (after a
crash, or after an interrupt with ``Command(resume=...)``), `thread_status`
says where a thread stands and `list_threads` lists them (one query on the
Postgres and SQLite savers, whatever the number of checkpoints).
`Persistence.purge` deletes the ledger's old completed records, only when
called; `Persistence.list_pending` lists its intents of unknown outcome (see
"Retention" in `langgraph_resilience.stores.ledger`).

One runner per thread: open-source LangGraph has no per-thread lock, so two
workers resuming the same ``thread_id`` fork it. `thread_lock` holds a
PostgreSQL session advisory lock for the run, on one lock connection per
process (not a pooled one; a crash releases the locks with the session); a
second runner gets `ThreadBusyError`, or waits when asked to. On SQLite it is
an exclusive file lock.

Durability (the ``durability=`` argument of ``invoke`` / ``stream`` / ``ainvoke`` /
``astream``; LangGraph has no compile-time default for it, so pass it per run):

- ``durability="sync"`` (use it for every graph with side effects; `resume`
  defaults to it): each checkpoint is written before the next step starts. The
  model's ``AIMessage``, whose tool-call ids are part of every idempotency key,
  is durable before any tool runs, so a crash replays the *same* calls and the
  ledger turns them into recorded outcomes or reconciliations.
- ``durability="async"`` (LangGraph's default): the checkpoint of step n is
  written while step n+1 runs. Faster, but a crash during the tools step can
  lose the agent's checkpoint; the resumed model then emits new tool calls with
  new ids, hence new keys, and an effect can run twice. The ledger still
  protects a replay of the *same* call; it cannot recognise a re-planned one.
- ``durability="exit"``: written only when the run ends or interrupts. A crash
  loses the whole run: every LLM call and read-only tool runs again, and
  effects are exposed as with ``"async"``. Only for graphs without side effects.

Whatever the mode, the ledger's intent is committed durably before the effect
starts; its outcome is flushed by the next durable commit (see
`PostgresIdempotencyStore`), and if that is lost the intent is reconciled,
never re-executed blindly.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import datetime as dt
import fcntl
import hashlib
import importlib
import importlib.util
import inspect
import os
import pathlib
import sqlite3
import threading
import time
import weakref
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from typing import Any, Literal, TypeAlias, cast

import psycopg
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.pregel import Pregel
from langgraph.store.base import BaseStore
from langgraph.store.postgres import PostgresStore
from langgraph.store.postgres.aio import AsyncPostgresStore
from langgraph.store.sqlite import SqliteStore
from langgraph.types import Command, Durability, StateSnapshot
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from langgraph_resilience.core.redaction import redact
from langgraph_resilience.errors import ResilienceError, ThreadBusyError
from langgraph_resilience.stores.effect_ledger import attach_ledger, sqlite_connect
from langgraph_resilience.stores.fencing import (
    AsyncFencedPostgresSaver,
    Fence,
    FencedPostgresSaver,
    holding,
)
from langgraph_resilience.stores.ledger import (
    DEFAULT_RETENTION,
    AsyncPostgresIdempotencyStore,
    AsyncPostgresSagaLog,
    IdempotencyRecord,
    IdempotencyStore,
    InMemoryIdempotencyStore,
    InMemorySagaLog,
    PostgresIdempotencyStore,
    PostgresSagaLog,
    SagaLog,
    SqliteIdempotencyStore,
    SqliteSagaLog,
    summarize_records,
)

__all__ = [
    "POSTGRES_CONNECTION_KWARGS",
    "Persistence",
    "PersistenceError",
    "ThreadBusyError",
    "ThreadNotFoundError",
    "ThreadStatus",
    "alist_threads",
    "aopen_postgres",
    "aresume",
    "athread_lock",
    "athread_status",
    "list_threads",
    "open_postgres",
    "open_sqlite",
    "resume",
    "thread_lock",
    "thread_status",
]


class PersistenceError(ResilienceError):
    """The checkpointer or store could not be opened; the message names the target
    with any password redacted."""


class ThreadNotFoundError(ResilienceError):
    """`resume` was asked to continue a thread that has no checkpoint."""

    def __init__(self, thread_id: str) -> None:
        super().__init__(
            f"thread {thread_id!r} has no checkpoint to resume from; start it with "
            "app.invoke(inputs, config) first, or check the thread id and the checkpointer"
        )
        self.thread_id = thread_id


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
    """The durable intent/outcome ledger (`langgraph_resilience.stores.ledger`)."""
    saga: SagaLog = dataclasses.field(default_factory=InMemorySagaLog)
    """The append-only saga log of effects and compensations."""
    path: pathlib.Path | None = None
    """The SQLite file, for `open_sqlite`."""

    def thread_lock(
        self, thread_id: str, *, wait: bool | float = False
    ) -> contextlib.AbstractContextManager[None]:
        """`thread_lock` on this persistence's backend."""
        return thread_lock(self, thread_id, wait=wait)

    def athread_lock(
        self, thread_id: str, *, wait: bool | float = False
    ) -> contextlib.AbstractAsyncContextManager[None]:
        """`athread_lock` on this persistence's backend."""
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


POSTGRES_CONNECTION_KWARGS: dict[str, Any] = {
    "autocommit": True,
    "prepare_threshold": 0,
    "row_factory": dict_row,
}
"""What LangGraph's Postgres saver and store require of every connection."""


# ------------------------------------------------------------------ SQLite


def _sqlite_connect(file: pathlib.Path) -> sqlite3.Connection:
    return sqlite_connect(str(file))


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
            conns.extend(_sqlite_connect(file) for _ in range(3))
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

_OPEN_LOCK = "langgraph-resilience:open"
_THREAD_LOCK_PREFIX = "langgraph-resilience:thread:"


def _first_line(exc: BaseException) -> str:
    lines = redact(str(exc)).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _connect_error(shown: str, exc: BaseException) -> PersistenceError:
    return PersistenceError(f"cannot connect to PostgreSQL at {shown}: {_first_line(exc)}")


def _breaker_store_class(name: str) -> Any:
    """Hook for the shared circuit-breaker table: `langgraph_resilience.stores.breakers`'s
    store class `name`, when that module defines it, else None."""
    if importlib.util.find_spec("langgraph_resilience.stores.breakers") is None:
        return None
    return getattr(importlib.import_module("langgraph_resilience.stores.breakers"), name, None)


def _postgres_persistence(pool: ConnectionPool[Any], shown: str) -> Persistence:
    p = Persistence(
        checkpointer=FencedPostgresSaver(pool),
        store=PostgresStore(pool),
        pool=pool,
        target=shown,
        idempotency=PostgresIdempotencyStore(pool),
        saga=PostgresSagaLog(pool),
    )
    attach_ledger(p.checkpointer, p.idempotency, p.saga)
    return p


def _setup_postgres(p: Persistence) -> None:
    """Every ``setup()``: LangGraph's saver and store, our ledgers, the breaker table."""
    parts: tuple[Any, ...] = (p.checkpointer, p.store, p.idempotency, p.saga)
    for part in parts:  # each Postgres part has a sync setup()
        part.setup()
    breakers = _breaker_store_class("PostgresBreakerStore")
    if breakers is not None:
        breakers(p.pool).setup()


@contextlib.contextmanager
def open_postgres(
    dsn: str,
    *,
    min_size: int = 1,
    max_size: int = 10,
    timeout: float = 10.0,
    setup: bool = True,
) -> Iterator[Persistence]:
    """Open a pool on `dsn` with a `PostgresSaver`, a `PostgresStore` and our ledgers.

    Every table is created (``setup=True``) under a session advisory lock, so
    processes that start together do not race on migrations; pass
    ``setup=False`` in workers when a deploy step already ran it. A connection
    failure raises `PersistenceError` naming the DSN with its password redacted.
    """
    shown = redact(dsn)
    try:  # one direct probe: fails fast with the server's reason, where a pool would retry
        probe = psycopg.connect(dsn, autocommit=True, connect_timeout=max(1, int(timeout)))
    except psycopg.Error as exc:
        raise _connect_error(shown, exc) from None  # the driver's text may quote the DSN
    pool: ConnectionPool[Any] = ConnectionPool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        kwargs=POSTGRES_CONNECTION_KWARGS,
        open=False,
        name="langgraph-resilience",
        check=ConnectionPool.check_connection,  # a server restart breaks idle connections
    )
    try:
        with probe:
            pool.open(wait=True, timeout=timeout)
            persistence = _postgres_persistence(pool, shown)
            if setup:
                probe.execute("SELECT pg_advisory_lock(hashtextextended(%s, 0))", (_OPEN_LOCK,))
                _setup_postgres(persistence)
    except PoolTimeout:
        pool.close()
        raise PersistenceError(
            f"cannot connect to PostgreSQL at {shown} within {timeout:g}s; "
            "check host, port, database and credentials"
        ) from None
    except (psycopg.Error, OSError) as exc:
        pool.close()
        raise PersistenceError(f"cannot open PostgreSQL at {shown}: {_first_line(exc)}") from None
    try:
        yield persistence
    finally:
        pool.close()


def _apostgres_persistence(pool: AsyncConnectionPool[Any], shown: str) -> Persistence:
    p = Persistence(
        checkpointer=AsyncFencedPostgresSaver(pool),
        store=AsyncPostgresStore(pool),
        pool=pool,
        target=shown,
        idempotency=AsyncPostgresIdempotencyStore(pool),
        saga=AsyncPostgresSagaLog(pool),
    )
    attach_ledger(p.checkpointer, p.idempotency, p.saga)
    return p


async def _asetup_postgres(p: Persistence) -> None:
    """Async `_setup_postgres`."""
    parts: tuple[Any, ...] = (p.checkpointer, p.store, p.idempotency, p.saga)
    for part in parts:  # each async Postgres part has an async setup()
        await part.setup()
    breakers = _breaker_store_class("AsyncPostgresBreakerStore")
    if breakers is not None:
        done = breakers(p.pool).setup()
        if inspect.isawaitable(done):
            await done


@contextlib.asynccontextmanager
async def aopen_postgres(
    dsn: str,
    *,
    min_size: int = 1,
    max_size: int = 10,
    timeout: float = 10.0,
    setup: bool = True,
) -> AsyncIterator[Persistence]:
    """Async `open_postgres`: an `AsyncConnectionPool`, `AsyncPostgresSaver`,
    `AsyncPostgresStore` and the async ledgers, for ``app.ainvoke`` / ``astream``.

    >>> async with aopen_postgres(dsn) as p:  # doctest: +SKIP
    ...     app = builder.compile(checkpointer=p.checkpointer, store=p.store)
    """
    shown = redact(dsn)
    try:
        probe = await psycopg.AsyncConnection.connect(
            dsn, autocommit=True, connect_timeout=max(1, int(timeout))
        )
    except psycopg.Error as exc:
        raise _connect_error(shown, exc) from None
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        kwargs=POSTGRES_CONNECTION_KWARGS,
        open=False,
        name="langgraph-resilience",
        check=AsyncConnectionPool.check_connection,  # a restart breaks idle connections
    )
    try:
        async with probe:
            await pool.open(wait=True, timeout=timeout)
            persistence = _apostgres_persistence(pool, shown)
            if setup:
                await probe.execute(
                    "SELECT pg_advisory_lock(hashtextextended(%s, 0))", (_OPEN_LOCK,)
                )
                await _asetup_postgres(persistence)
    except PoolTimeout:
        await pool.close()
        raise PersistenceError(
            f"cannot connect to PostgreSQL at {shown} within {timeout:g}s; "
            "check host, port, database and credentials"
        ) from None
    except (psycopg.Error, OSError) as exc:
        await pool.close()
        raise PersistenceError(f"cannot open PostgreSQL at {shown}: {_first_line(exc)}") from None
    try:
        yield persistence
    finally:
        await pool.close()


# ------------------------------------------------------------------ one runner per thread

LockTarget: TypeAlias = (
    "Persistence | ConnectionPool[Any] | AsyncConnectionPool[Any] | psycopg.Connection[Any] "
    "| str | pathlib.Path"
)
"""What `thread_lock` locks on: a `Persistence`, a pool or a DSN (PostgreSQL advisory
lock), a connection (used as is), or a SQLite file path (file lock)."""

_LOCK_SQL = "SELECT pg_try_advisory_lock(hashtextextended(%s, 0)) AS locked"
_LOCK_WAIT_SQL = "SELECT pg_advisory_lock(hashtextextended(%s, 0)), true AS locked"
_UNLOCK_SQL = "SELECT pg_advisory_unlock(hashtextextended(%s, 0))"
_POLL_SECONDS = 0.01
LOCK_APPLICATION_NAME = "langgraph-resilience-lock"
"""The ``application_name`` of the sessions holding thread locks (``pg_stat_activity``)."""


def _lock_name(thread_id: str) -> str:
    """The advisory-lock text: namespaced, so it never collides with other lock users."""
    return _THREAD_LOCK_PREFIX + thread_id


def _timeout_ms(wait: bool | float) -> int | None:
    if isinstance(wait, bool):
        return None
    if wait < 0:
        raise ValueError(f"wait must be True, False or a number of seconds >= 0, got {wait!r}")
    return max(1, round(wait * 1000))


def _resolve(target: LockTarget) -> tuple[str, Any]:
    """Classify a lock target: ("postgres", conninfo), ("conn", connection), ("file", path),
    or ("local", None) for a Persistence without a shared backend."""
    if isinstance(target, Persistence):
        if target.pool is not None:
            return "postgres", target.pool.conninfo
        if target.path is not None:
            return "file", target.path
        return "local", None
    if isinstance(target, ConnectionPool | AsyncConnectionPool):
        return "postgres", target.conninfo
    if isinstance(target, psycopg.Connection):
        return "conn", target
    if isinstance(target, pathlib.Path):
        return "file", target
    if isinstance(target, str):
        return "postgres", target
    raise TypeError(
        f"cannot lock a thread on {type(target).__name__}; pass a Persistence, a psycopg "
        "pool, connection or DSN, or a pathlib.Path to the SQLite file"
    )


class _LockSession:
    """One PostgreSQL session holding the thread locks of many runs of this process.

    Advisory locks belong to a session, so one connection per process and DSN
    holds any number of thread locks (100 concurrent runs cost one connection,
    not 100), and a crash of the process releases them all with the session.
    The session is re-entrant, so `held` refuses a second in-process holder.
    """

    def __init__(self, *, conninfo: str | None = None, conn: Any = None) -> None:
        self._conninfo = conninfo
        self._conn: psycopg.Connection[Any] | None = conn
        self.shown = redact(conninfo if conninfo is not None else conn.info.dsn)
        self._mutex = threading.Lock()
        self.held: set[str] = set()
        self.generation = 0
        """Grows with every reconnect: a lock taken in an older generation died with it."""

    def _connection(self) -> psycopg.Connection[Any]:
        if self._conn is not None and not self._conn.closed:
            return self._conn
        if self._conninfo is None:
            raise PersistenceError(f"the lock connection to {self.shown} is closed")
        try:
            self._conn = psycopg.connect(
                self._conninfo, autocommit=True, application_name=LOCK_APPLICATION_NAME
            )
        except psycopg.Error as exc:
            raise _connect_error(self.shown, exc) from None
        self.generation += 1
        return self._conn

    def fence(self, thread_id: str) -> Fence:
        """The fence of a lock just taken: alive while this session (this generation of
        its connection) is, and the lock still held by this process."""
        generation = self.generation

        def alive() -> bool:
            with self._mutex:
                conn = self._conn
                if self.generation != generation or thread_id not in self.held:
                    return False
                if conn is None or conn.closed:
                    return False
                try:
                    conn.execute("SELECT 1")
                except psycopg.Error:
                    return False
                return True

        return Fence(thread_id, alive, self.shown)

    def try_acquire(self, thread_id: str) -> None:
        """``pg_try_advisory_lock``; `ThreadBusyError` when anyone else holds it."""
        with self._mutex:
            if thread_id in self.held:
                raise ThreadBusyError(thread_id, "another run in this process")
            if not self._query(_LOCK_SQL, thread_id):
                raise ThreadBusyError(thread_id, self.shown)
            self.held.add(thread_id)

    def wait_acquire(self, thread_id: str, wait: bool | float) -> None:
        """Block on the lock in this session (a caller's own connection)."""
        with self._mutex:
            if thread_id in self.held:
                raise ThreadBusyError(thread_id, "another run in this process")
            _pg_wait(self._connection(), thread_id, wait, self.shown)
            self.held.add(thread_id)

    def _query(self, sql: str, thread_id: str) -> bool:
        """Run one lock statement; an owned session that broke (server restart) is
        reconnected once. Locks it held died with it: the server released them."""
        for attempt in (1, 2):
            conn = self._connection()
            try:
                with conn.cursor(row_factory=dict_row) as cur:
                    row = cur.execute(sql, (_lock_name(thread_id),)).fetchone()
                if not conn.autocommit:
                    conn.commit()
                return bool(row and row["locked"])
            except psycopg.OperationalError as exc:
                if self._conninfo is None or attempt == 2 or not conn.closed:
                    raise _connect_error(self.shown, exc) from None
        raise AssertionError("unreachable")  # pragma: no cover

    def release(self, thread_id: str) -> None:
        with self._mutex:
            self.held.discard(thread_id)
            conn = self._conn
            if conn is None or conn.closed:
                return  # the session ended: the server released the lock already
            with contextlib.suppress(psycopg.Error):
                conn.execute(_UNLOCK_SQL, (_lock_name(thread_id),))
                if not conn.autocommit:
                    conn.commit()

    def close(self) -> None:
        with self._mutex:
            if self._conninfo is not None and self._conn is not None:
                self._conn.close()
                self._conn = None


_SESSIONS: dict[tuple[int, str], _LockSession] = {}
_GIVEN_SESSIONS: weakref.WeakKeyDictionary[Any, _LockSession] = weakref.WeakKeyDictionary()
_SESSIONS_GUARD = threading.Lock()


@atexit.register
def _close_sessions() -> None:
    """Close this process's lock sessions at exit (the server drops their locks)."""
    with _SESSIONS_GUARD:
        sessions = [s for (pid, _), s in _SESSIONS.items() if pid == os.getpid()]
    for session in sessions:
        session.close()


def _session_for(kind: str, where: Any) -> _LockSession:
    """The process's lock session for a DSN (keyed by pid: never shared across a fork),
    or the one wrapping a caller's connection."""
    with _SESSIONS_GUARD:
        if kind == "conn":
            session = _GIVEN_SESSIONS.get(where)
            if session is None:
                session = _GIVEN_SESSIONS[where] = _LockSession(conn=where)
            return session
        key = (os.getpid(), str(where))
        session = _SESSIONS.get(key)
        if session is None:
            session = _SESSIONS[key] = _LockSession(conninfo=str(where))
        return session


def _pg_wait(conn: psycopg.Connection[Any], thread_id: str, wait: bool | float, shown: str) -> None:
    """Block on the lock (at most `wait` seconds when it is a number)."""
    timeout = _timeout_ms(wait)
    try:
        with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
            if timeout is not None:
                cur.execute(f"SET LOCAL lock_timeout = {timeout}")
            cur.execute(_LOCK_WAIT_SQL, (_lock_name(thread_id),))
    except psycopg.errors.LockNotAvailable:
        raise ThreadBusyError(thread_id, shown) from None


async def _apg_wait(
    conn: psycopg.AsyncConnection[Any], thread_id: str, wait: bool | float, shown: str
) -> None:
    timeout = _timeout_ms(wait)
    try:
        async with conn.transaction(), conn.cursor(row_factory=dict_row) as cur:
            if timeout is not None:
                await cur.execute(f"SET LOCAL lock_timeout = {timeout}")
            await cur.execute(_LOCK_WAIT_SQL, (_lock_name(thread_id),))
    except psycopg.errors.LockNotAvailable:
        raise ThreadBusyError(thread_id, shown) from None


def _alive(conn: psycopg.Connection[Any]) -> bool:
    """Whether a dedicated lock connection still answers (its session holds the lock)."""
    if conn.closed:
        return False
    try:
        conn.execute("SELECT 1")
    except psycopg.Error:
        return False
    return True


def _lock_file(path: pathlib.Path, thread_id: str) -> pathlib.Path:
    digest = hashlib.sha256(thread_id.encode("utf-8")).hexdigest()[:32]
    return pathlib.Path(f"{path}.locks") / f"{digest}.lock"


def _open_lock_file(path: pathlib.Path, thread_id: str) -> int:
    file = _lock_file(path, thread_id)
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        return os.open(file, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise PersistenceError(f"cannot create the thread lock file {str(file)!r}: {exc}") from exc


def _flock(fd: int, wait: bool | float, thread_id: str, shown: str) -> None:
    """Exclusive ``flock``: per open file, so it excludes other threads and processes."""
    if wait is True:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return
    timeout = _timeout_ms(wait)
    deadline = time.monotonic() + (timeout or 0) / 1000
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if timeout is None or time.monotonic() >= deadline:
                raise ThreadBusyError(thread_id, shown) from None
        time.sleep(_POLL_SECONDS)  # flock has no timed wait


_LOCAL_HELD: set[str] = set()
_LOCAL_GUARD = threading.Lock()


@contextlib.contextmanager
def _local_lock(thread_id: str) -> Iterator[None]:
    with _LOCAL_GUARD:
        if thread_id in _LOCAL_HELD:
            raise ThreadBusyError(thread_id, "this process")
        _LOCAL_HELD.add(thread_id)
    try:
        yield
    finally:
        with _LOCAL_GUARD:
            _LOCAL_HELD.discard(thread_id)


@contextlib.contextmanager
def thread_lock(
    target: LockTarget, thread_id: str, *, wait: bool | float = False
) -> Iterator[None]:
    """Hold the run lock of one thread for the duration of the block.

    On PostgreSQL it is a session advisory lock on
    ``hashtextextended('langgraph-resilience:thread:' || thread_id, 0)``, never a
    pooled connection (locks must not starve the checkpointer): by default
    ``pg_try_advisory_lock`` on one lock session per process and DSN, which
    holds the locks of all the process's runs (one round trip to lock, one to
    unlock); a crashed runner's locks die with its session. On SQLite it is an
    exclusive ``flock`` on ``<file>.locks/<hash>.lock``. When another runner
    holds it: `ThreadBusyError`, or with ``wait=True`` wait for it on a
    dedicated connection (a number waits at most that many seconds).

    >>> with thread_lock(persistence, "thread-42"):  # doctest: +SKIP
    ...     app.invoke(None, {"configurable": {"thread_id": "thread-42"}})
    """
    kind, where = _resolve(target)
    if kind == "file":
        fd = _open_lock_file(where, thread_id)
        try:
            _flock(fd, wait, thread_id, str(where))
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
        return
    if kind == "local":
        with _local_lock(thread_id):
            yield
        return
    if wait is False or kind == "conn":
        session = _session_for(kind, where)
        if wait is not False:  # a caller's connection: wait on it
            session.wait_acquire(thread_id, wait)
        else:
            session.try_acquire(thread_id)
        try:
            with holding(session.fence(thread_id)):
                yield
        finally:
            session.release(thread_id)
        return
    shown = redact(str(where))
    try:
        conn: psycopg.Connection[Any] = psycopg.connect(str(where), autocommit=True)
    except psycopg.Error as exc:
        raise _connect_error(shown, exc) from None
    with conn:  # a dedicated session for the wait; closing it releases the lock
        _pg_wait(conn, thread_id, wait, shown)
        with holding(Fence(thread_id, lambda: _alive(conn), shown)):
            yield


@contextlib.asynccontextmanager
async def athread_lock(
    target: LockTarget | psycopg.AsyncConnection[Any],
    thread_id: str,
    *,
    wait: bool | float = False,
) -> AsyncIterator[None]:
    """Async `thread_lock`; also accepts a psycopg `AsyncConnection` (used as is).

    Without waiting it shares `thread_lock`'s per-process lock session (one
    short round trip, in a worker thread); waiting uses a dedicated
    `AsyncConnection`, so the event loop never blocks.
    """
    if isinstance(target, psycopg.AsyncConnection):
        shown = redact(target.info.dsn)
        if wait is False:
            async with target.cursor(row_factory=dict_row) as cur:
                await cur.execute(_LOCK_SQL, (_lock_name(thread_id),))
                row = await cur.fetchone()
            if row is None or not row["locked"]:
                raise ThreadBusyError(thread_id, shown)
        else:
            await _apg_wait(target, thread_id, wait, shown)
        try:
            yield
        finally:
            with contextlib.suppress(psycopg.Error):
                await target.execute(_UNLOCK_SQL, (_lock_name(thread_id),))
        return
    kind, where = _resolve(target)
    if kind == "file":
        fd = _open_lock_file(where, thread_id)
        try:
            await asyncio.to_thread(_flock, fd, wait, thread_id, str(where))
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
        return
    if kind == "local" or wait is False or kind == "conn":
        entered = thread_lock(target, thread_id, wait=wait)
        await asyncio.to_thread(entered.__enter__)
        try:  # the fence was set in the worker's context: set it in this one too
            fence = _session_for(kind, where).fence(thread_id) if kind != "local" else None
            with holding(fence) if fence is not None else contextlib.nullcontext():
                yield
        finally:
            await asyncio.to_thread(entered.__exit__, None, None, None)
        return
    shown = redact(str(where))
    try:
        conn = await psycopg.AsyncConnection.connect(str(where), autocommit=True)
    except psycopg.Error as exc:
        raise _connect_error(shown, exc) from None
    async with conn:
        await _apg_wait(conn, thread_id, wait, shown)
        yield


# ------------------------------------------------------------------ resume and status

AnyApp: TypeAlias = "Pregel[Any, Any, Any, Any]"
ThreadState = Literal["done", "interrupted", "failed", "pending", "running", "not_found"]


def _thread_config(thread_id: str, config: RunnableConfig | None) -> RunnableConfig:
    base: dict[str, Any] = dict(config or {})
    configurable = {**(base.get("configurable") or {}), "thread_id": thread_id}
    return cast("RunnableConfig", {**base, "configurable": configurable})


def resume(
    app: AnyApp,
    thread_id: str,
    *,
    command: Command[Any] | None = None,
    config: RunnableConfig | None = None,
    lock: LockTarget | None = None,
    wait: bool | float = False,
    durability: Durability = "sync",
    **kwargs: Any,
) -> Any:
    """Continue a thread from its last checkpoint: ``app.invoke(command, config)``.

    With no `command` the interrupted or crashed step runs again (side effects
    are protected by the idempotency ledger); after an ``interrupt()`` pass
    ``Command(resume=value)``. With `lock` (a `Persistence`, pool, DSN...) the
    run holds the thread's `thread_lock`. Raises `ThreadNotFoundError` when the
    thread has no checkpoint. Extra keyword arguments go to ``invoke``.

    >>> resume(app, "thread-42", command=Command(resume="approve"), lock=p)  # doctest: +SKIP
    """
    cfg = _thread_config(thread_id, config)
    held = thread_lock(lock, thread_id, wait=wait) if lock is not None else contextlib.nullcontext()
    with held:
        if app.get_state(cfg).created_at is None:
            raise ThreadNotFoundError(thread_id)
        return app.invoke(command, cfg, durability=durability, **kwargs)


async def aresume(
    app: AnyApp,
    thread_id: str,
    *,
    command: Command[Any] | None = None,
    config: RunnableConfig | None = None,
    lock: LockTarget | psycopg.AsyncConnection[Any] | None = None,
    wait: bool | float = False,
    durability: Durability = "sync",
    **kwargs: Any,
) -> Any:
    """Async `resume`: ``await app.ainvoke(command, config)`` under `athread_lock`."""
    cfg = _thread_config(thread_id, config)
    held: contextlib.AbstractAsyncContextManager[None] = (
        athread_lock(lock, thread_id, wait=wait) if lock is not None else contextlib.nullcontext()
    )
    async with held:
        if (await app.aget_state(cfg)).created_at is None:
            raise ThreadNotFoundError(thread_id)
        return await app.ainvoke(command, cfg, durability=durability, **kwargs)


@dataclasses.dataclass(frozen=True, slots=True)
class ThreadStatus:
    """Where one thread stands, for the CLI, notebooks and operators.

    `state` is ``done`` (nothing left to run), ``interrupted`` (waiting for
    ``Command(resume=...)``; `interrupts` holds the payloads), ``failed`` (a
    node raised; `error`), ``running`` (another runner holds its lock),
    ``pending`` (steps left and nobody running them: crashed, or a static
    breakpoint; `resume` continues it) or ``not_found``.
    """

    thread_id: str
    state: ThreadState
    next: tuple[str, ...] = ()
    """The nodes that run next: where the thread stopped."""
    interrupts: tuple[Any, ...] = ()
    """The payloads of the pending ``interrupt()`` calls."""
    interrupt_ids: tuple[str, ...] = ()
    error: str | None = None
    """The failed node's error, redacted."""
    checkpoint_id: str | None = None
    updated_at: str | None = None
    step: int | None = None
    ledger: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Summary of the ``resilience`` channel: tool attempts, calls by status, events."""
    effects: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Side-effect intents of the thread by status (``pending`` ones are UNKNOWN)."""


def _ledger_summary(values: Any) -> dict[str, Any]:
    ledger = values.get("resilience") if isinstance(values, Mapping) else None
    if not isinstance(ledger, Mapping):
        return {}
    calls: dict[str, int] = {}
    for record in (ledger.get("calls") or {}).values():
        status = str(record.get("status", "?"))
        calls[status] = calls.get(status, 0) + 1
    return {
        "tool_attempts": int(ledger.get("tool_attempts") or 0),
        "calls": calls,
        "events": dict(ledger.get("events") or {}),
    }


def _status_of(
    thread_id: str,
    snapshot: StateSnapshot,
    *,
    records: Iterable[IdempotencyRecord] | None,
    busy: bool,
) -> ThreadStatus:
    """Pure: a `ThreadStatus` from a state snapshot, the thread's ledger and its lock."""
    if snapshot.created_at is None:
        return ThreadStatus(thread_id=thread_id, state="not_found")
    interrupts = tuple(snapshot.interrupts) or tuple(
        i for task in snapshot.tasks for i in task.interrupts
    )
    errors = [task.error for task in snapshot.tasks if task.error]
    state: ThreadState
    if interrupts:
        state = "interrupted"
    elif errors:
        state = "failed"
    elif snapshot.next or snapshot.tasks:
        # A crash after a node finished but before the step committed leaves `next`
        # empty while the task is still pending: that thread is not done.
        state = "running" if busy else "pending"
    else:
        state = "done"
    configurable = snapshot.config.get("configurable") or {}
    metadata = snapshot.metadata or {}
    return ThreadStatus(
        thread_id=thread_id,
        state=state,
        next=tuple(snapshot.next),
        interrupts=tuple(i.value for i in interrupts),
        interrupt_ids=tuple(i.id for i in interrupts),
        error=redact(str(errors[0])) if errors else None,
        checkpoint_id=configurable.get("checkpoint_id"),
        updated_at=snapshot.created_at,
        step=metadata.get("step"),
        ledger=_ledger_summary(snapshot.values),
        effects=summarize_records(records) if records is not None else {},
    )


def _might_run(snapshot: StateSnapshot) -> bool:
    return bool(snapshot.next or snapshot.tasks) and not snapshot.interrupts


def thread_status(
    app: AnyApp,
    thread_id: str,
    *,
    persistence: Persistence | None = None,
    config: RunnableConfig | None = None,
    snapshot: StateSnapshot | None = None,
) -> ThreadStatus:
    """Where a thread stands: done, interrupted (payload), failed (error), running,
    pending (where it stopped), with its ledger summary.

    With `persistence` the status also counts the thread's side-effect intents
    and tells ``running`` (someone holds the thread lock) from ``pending``.
    Pass the thread's latest `snapshot` when you already read it
    (``app.get_state``): the state is then not read again.
    """
    if snapshot is None:
        snapshot = app.get_state(_thread_config(thread_id, config))
    records = persistence.idempotency.for_thread(thread_id) if persistence else None
    busy = False
    if persistence is not None and _might_run(snapshot):
        try:
            with thread_lock(persistence, thread_id):
                pass
        except ThreadBusyError:
            busy = True
    return _status_of(thread_id, snapshot, records=records, busy=busy)


async def athread_status(
    app: AnyApp,
    thread_id: str,
    *,
    persistence: Persistence | None = None,
    config: RunnableConfig | None = None,
    snapshot: StateSnapshot | None = None,
) -> ThreadStatus:
    """Async `thread_status`."""
    if snapshot is None:
        snapshot = await app.aget_state(_thread_config(thread_id, config))
    records = await persistence.idempotency.afor_thread(thread_id) if persistence else None
    busy = False
    if persistence is not None and _might_run(snapshot):
        try:
            async with athread_lock(persistence, thread_id):
                pass
        except ThreadBusyError:
            busy = True
    return _status_of(thread_id, snapshot, records=records, busy=busy)


# The latest root checkpoint of each thread, newest first, in one statement over the
# primary key (thread_id, checkpoint_ns, checkpoint_id) of LangGraph's `checkpoints`
# table (the same in PostgresSaver's and SqliteSaver's schema). Checkpoint ids are
# time-ordered (uuid6), so the greatest is the one written last.
_LATEST_SQL = (
    "SELECT thread_id, max(checkpoint_id) AS latest FROM checkpoints "
    "WHERE checkpoint_ns = '' GROUP BY thread_id ORDER BY latest DESC, thread_id"
)
_PG_LATEST_SQL = _LATEST_SQL + " LIMIT %s"
_SQLITE_LATEST_SQL = _LATEST_SQL + " LIMIT ?"


def _check_limit(limit: int | None) -> int | None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be None or an int >= 0, got {limit!r}")
    return limit


def _pg_threads(saver: PostgresSaver, limit: int | None) -> list[str]:
    with saver._cursor() as cur:
        cur.execute(_PG_LATEST_SQL, (limit,))
        return [str(row["thread_id"]) for row in cur.fetchall()]


async def _apg_threads(saver: AsyncPostgresSaver, limit: int | None) -> list[str]:
    async with saver._cursor() as cur:
        await cur.execute(_PG_LATEST_SQL, (limit,))
        return [str(row["thread_id"]) for row in await cur.fetchall()]


def _sqlite_threads(saver: SqliteSaver, limit: int | None) -> list[str]:
    with saver.cursor(transaction=False) as cur:
        cur.execute(_SQLITE_LATEST_SQL, (-1 if limit is None else limit,))
        return [str(row[0]) for row in cur.fetchall()]


class _Latest:
    """The generic walk: the greatest root checkpoint id seen per thread."""

    def __init__(self) -> None:
        self.latest: dict[str, str] = {}

    def add(self, config: RunnableConfig) -> None:
        configurable = config.get("configurable") or {}
        thread_id = configurable.get("thread_id")
        if thread_id is None or configurable.get("checkpoint_ns", "") != "":
            return
        thread, checkpoint_id = str(thread_id), str(configurable.get("checkpoint_id") or "")
        if thread not in self.latest or checkpoint_id > self.latest[thread]:
            self.latest[thread] = checkpoint_id

    def threads(self, limit: int | None) -> list[str]:
        ordered = sorted(self.latest.items(), key=lambda item: item[0])
        ordered.sort(key=lambda item: item[1], reverse=True)  # stable: ties by thread id
        return [thread for thread, _ in ordered[:limit]]


def list_threads(checkpointer: BaseCheckpointSaver[Any], *, limit: int | None = None) -> list[str]:
    """Distinct thread ids with a checkpoint, most recently written first (by each
    thread's latest checkpoint), at most `limit` of them.

    On LangGraph's `PostgresSaver` and `SqliteSaver` it is one statement on the
    saver's own pool or connection: ``SELECT thread_id, max(checkpoint_id) ...
    GROUP BY thread_id`` over the ``checkpoints`` table's primary key, reading
    no checkpoint body (1,000 threads of 50 checkpoints: milliseconds). An
    `AsyncPostgresSaver` runs the same statement on its event loop (call this
    from another thread, or use `alist_threads`). Any other checkpointer is
    walked through ``checkpointer.list(None)``, i.e. every checkpoint.
    """
    limit = _check_limit(limit)
    if isinstance(checkpointer, PostgresSaver):
        return _pg_threads(checkpointer, limit)
    if isinstance(checkpointer, SqliteSaver):
        return _sqlite_threads(checkpointer, limit)
    if isinstance(checkpointer, AsyncPostgresSaver):
        try:
            on_loop = asyncio.get_running_loop() is checkpointer.loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            raise asyncio.InvalidStateError(
                "list_threads on an AsyncPostgresSaver from its own event loop would block "
                "it; use `await alist_threads(checkpointer)`"
            )
        future = asyncio.run_coroutine_threadsafe(
            _apg_threads(checkpointer, limit), checkpointer.loop
        )
        return future.result()
    latest = _Latest()
    for item in checkpointer.list(None):
        latest.add(item.config)
    return latest.threads(limit)


async def alist_threads(
    checkpointer: BaseCheckpointSaver[Any], *, limit: int | None = None
) -> list[str]:
    """Async `list_threads`: one statement on an `AsyncPostgresSaver` (or, in a worker
    thread, on a `PostgresSaver` / `SqliteSaver`), else ``checkpointer.alist(None)``."""
    limit = _check_limit(limit)
    if isinstance(checkpointer, AsyncPostgresSaver):
        return await _apg_threads(checkpointer, limit)
    if isinstance(checkpointer, PostgresSaver | SqliteSaver):
        return await asyncio.to_thread(list_threads, checkpointer, limit=limit)
    latest = _Latest()
    async for item in checkpointer.alist(None):
        latest.add(item.config)
    return latest.threads(limit)
