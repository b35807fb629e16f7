"""One runner per thread: `thread_lock` / `athread_lock`.

Open-source LangGraph has no per-thread lock, so two workers resuming the same
``thread_id`` fork it. On PostgreSQL `thread_lock` holds the thread's lease
(`langgraph_resilience.stores.leases`): a row with a fencing token, taken, renewed and
released by single-statement transactions, so it holds straight to PostgreSQL and
through a transaction pooler (PgBouncer, RDS Proxy, Supavisor) alike. A second runner
gets `ThreadBusyError`, or waits when asked to; a crashed runner's lease lapses after
its TTL (30 s by default). The lease is the run's fence: its token travels with the
run's ledger writes and is checked before its checkpoint writes and side effects. On
SQLite it is an exclusive file lock.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import datetime as dt
import fcntl
import hashlib
import os
import pathlib
import threading
import weakref
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeAlias, runtime_checkable

import psycopg
from psycopg.pq import ExecStatus, TransactionStatus
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from langgraph_resilience.core.clock import Clock, SystemClock
from langgraph_resilience.core.flow import adrive, drive
from langgraph_resilience.core.lease import lease_ttl, wait_seconds
from langgraph_resilience.core.redaction import redact
from langgraph_resilience.errors import PersistenceError, ThreadBusyError
from langgraph_resilience.stores.held import holding
from langgraph_resilience.stores.leases import Lease, LeaseRunner, acquire, held_by
from langgraph_resilience.stores.postgres import Postgres, connect_error

__all__ = [
    "LOCK_APPLICATION_NAME",
    "LockBackend",
    "LockTarget",
    "athread_held",
    "athread_lock",
    "lease_runner",
    "thread_held",
    "thread_lock",
]

_POLL_SECONDS = 0.01
_SYSTEM_CLOCK = SystemClock()
"""How a wait polls and reads the time, unless a caller passes its own clock."""
LOCK_APPLICATION_NAME = "langgraph-resilience-lock"
"""The ``application_name`` of the connections this package opens for lease statements
on a DSN (``pg_stat_activity``); a pool's or a caller's connection keeps its own."""


@runtime_checkable
class LockBackend(Protocol):
    """Where a `~langgraph_resilience.stores.persistence.Persistence` keeps its data:
    its pool (PostgreSQL) or its file (SQLite); neither: this process only."""

    @property
    def pool(self) -> ConnectionPool[Any] | AsyncConnectionPool[Any] | None:
        """The shared PostgreSQL pool, or None."""
        ...

    @property
    def path(self) -> pathlib.Path | None:
        """The SQLite file, or None."""
        ...


LockTarget: TypeAlias = (
    "LockBackend | ConnectionPool[Any] | AsyncConnectionPool[Any] | psycopg.Connection[Any] "
    "| str | pathlib.Path"
)
"""What `thread_lock` locks on: a `Persistence` (any `LockBackend`), a pool or a DSN
(a lease on PostgreSQL), a connection (used as is), or a SQLite file path (file lock)."""


# ------------------------------------------------------------------ where lease statements run


class _DsnConnection:
    """This process's connection for the lease statements of a DSN: one per process and
    DSN (not per run), reconnected when it broke or was left busy. Each statement is its
    own transaction, so a reconnect loses nothing and a statement is simply sent again
    (taking a lease twice with the same holder takes it once)."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self.shown = redact(dsn)
        self._conn: psycopg.Connection[Any] | None = None
        self._mutex = threading.Lock()

    def _connection(self) -> psycopg.Connection[Any]:
        conn = self._conn
        if conn is not None and _usable(conn):
            return conn
        if conn is not None:
            conn.close()
        try:
            self._conn = psycopg.connect(
                self._dsn,
                autocommit=True,
                prepare_threshold=None,
                application_name=LOCK_APPLICATION_NAME,
            )
        except psycopg.Error as exc:
            raise connect_error(self.shown, exc) from None
        return self._conn

    def rows(self, query: str, params: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
        """One statement; sent again once on a fresh connection if the first one broke."""
        with self._mutex:
            for attempt in (1, 2):
                conn = self._connection()
                try:
                    return _fetch(conn, query, params)
                except psycopg.OperationalError:
                    if attempt == 2 or _usable(conn):
                        raise
            raise AssertionError("unreachable")  # pragma: no cover

    async def arows(self, query: str, params: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
        return await asyncio.to_thread(self.rows, query, params)

    def transaction(self, statements: tuple[str, ...]) -> None:
        self.rows("BEGIN;\n" + ";\n".join(statements) + ";\nCOMMIT", {})

    async def atransaction(self, statements: tuple[str, ...]) -> None:
        await asyncio.to_thread(self.transaction, statements)

    def close(self) -> None:
        with self._mutex:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


class _GivenConnection:
    """A caller's own connection (sync or async), used as is: never replaced, committed
    after each lease statement when it is not autocommit."""

    def __init__(self, conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn
        self.shown = redact(conn.info.dsn)
        self._mutex = threading.Lock()
        self._amutex: asyncio.Lock | None = None

    def rows(self, query: str, params: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
        conn = self.conn
        if not isinstance(conn, psycopg.Connection):
            raise TypeError("an AsyncConnection takes athread_lock, not thread_lock")
        with self._mutex:
            _check_given(conn, self.shown)
            try:
                found = _fetch(conn, query, params)
            except psycopg.Error:
                if not conn.closed and not conn.autocommit:
                    conn.rollback()
                raise
            if not conn.autocommit:
                conn.commit()
            return found

    async def arows(self, query: str, params: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
        conn = self.conn
        if isinstance(conn, psycopg.Connection):
            return await asyncio.to_thread(self.rows, query, params)
        if self._amutex is None:
            self._amutex = asyncio.Lock()
        async with self._amutex:
            _check_given(conn, self.shown)
            try:
                async with conn.cursor(row_factory=dict_row) as cur:
                    await cur.execute(query, params)
                    found = await cur.fetchall() if _has_rows(cur) else []
            except psycopg.Error:
                if not conn.closed and not conn.autocommit:
                    await conn.rollback()
                raise
            if not conn.autocommit:
                await conn.commit()
            return found

    def transaction(self, statements: tuple[str, ...]) -> None:
        self.rows("BEGIN;\n" + ";\n".join(statements) + ";\nCOMMIT", {})

    async def atransaction(self, statements: tuple[str, ...]) -> None:
        await self.arows("BEGIN;\n" + ";\n".join(statements) + ";\nCOMMIT", {})


def _has_rows(cur: Any) -> bool:
    result = cur.pgresult
    return result is not None and result.status == ExecStatus.TUPLES_OK


def _fetch(
    conn: psycopg.Connection[Any], query: str, params: Mapping[str, Any]
) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query, params or None)
        return cur.fetchall() if _has_rows(cur) else []


_CLIENTS: dict[tuple[int, str], _DsnConnection] = {}
_GIVEN: weakref.WeakKeyDictionary[Any, _GivenConnection] = weakref.WeakKeyDictionary()
_CLIENTS_GUARD = threading.Lock()


@atexit.register
def _close_clients() -> None:
    """Close this process's lease connections at exit."""
    with _CLIENTS_GUARD:
        clients = [c for (pid, _), c in _CLIENTS.items() if pid == os.getpid()]
    for client in clients:
        client.close()


def _dsn_client(dsn: str) -> _DsnConnection:
    """The process's lease connection for `dsn` (keyed by pid: never shared across a fork)."""
    with _CLIENTS_GUARD:
        key = (os.getpid(), dsn)
        client = _CLIENTS.get(key)
        if client is None:
            client = _CLIENTS[key] = _DsnConnection(dsn)
        return client


def _given(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> _GivenConnection:
    with _CLIENTS_GUARD:
        runner = _GIVEN.get(conn)
        if runner is None:
            runner = _GIVEN[conn] = _GivenConnection(conn)
        return runner


def _resolve(target: Any) -> tuple[str, Any]:
    """Classify a lock target: ("pool", pool), ("dsn", conninfo), ("conn", connection),
    ("file", path), or ("local", None) for a Persistence without a shared backend."""
    if isinstance(target, LockBackend):
        if target.pool is not None:
            return "pool", target.pool
        if target.path is not None:
            return "file", target.path
        return "local", None
    if isinstance(target, ConnectionPool | AsyncConnectionPool):
        return "pool", target
    if isinstance(target, psycopg.Connection | psycopg.AsyncConnection):
        return "conn", target
    if isinstance(target, pathlib.Path):
        return "file", target
    if isinstance(target, str):
        return "dsn", target
    raise TypeError(
        f"cannot lock a thread on {type(target).__name__}; pass a Persistence, a psycopg "
        "pool, connection or DSN, or a pathlib.Path to the SQLite file"
    )


def _runner(kind: str, where: Any, *, asynchronous: bool) -> tuple[LeaseRunner, str]:
    """Where the lease statements of a Postgres target run, and how to name it: a pool's
    own connections (an async pool only for an async lock: a sync lock on it uses the
    pool's DSN), a caller's connection, or this process's connection for a DSN."""
    if kind == "pool":
        shown = redact(where.conninfo)
        if isinstance(where, AsyncConnectionPool) and not asynchronous:
            return _dsn_client(str(where.conninfo)), shown
        is_async = isinstance(where, AsyncConnectionPool)
        return Postgres(where, owner="thread_lock", is_async=is_async), shown
    if kind == "conn":
        given = _given(where)
        return given, given.shown
    client = _dsn_client(str(where))
    return client, client.shown


def lease_runner(target: LockTarget, *, asynchronous: bool = False) -> LeaseRunner:
    """Where `thread_lock` runs the lease statements of a PostgreSQL `target` (for
    `langgraph_resilience.stores.leases.acquire`, and tests)."""
    kind, where = _resolve(target)
    if kind in ("file", "local"):
        raise TypeError(f"{target!r} is not a PostgreSQL target: it has no leases")
    return _runner(kind, where, asynchronous=asynchronous)[0]


def _ttl_of(target: Any, ttl: float | dt.timedelta | None) -> float:
    """The lease's TTL: given here, else the target's (`Persistence.lease_ttl`), else 30 s."""
    return lease_ttl(ttl if ttl is not None else getattr(target, "lease_ttl", None))


# ------------------------------------------------------------------ caller's connections


def _usable(conn: psycopg.Connection[Any]) -> bool:
    """Open and idle: ready for the next statement."""
    return not conn.closed and conn.info.transaction_status == TransactionStatus.IDLE


def _check_given(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], shown: str) -> None:
    """A caller's connection that cannot take a lease statement: say why, and what to
    pass instead, rather than report a failure to connect."""
    status = conn.info.transaction_status
    if status == TransactionStatus.ACTIVE:
        raise PersistenceError(
            f"the connection to {shown} given to thread_lock is busy: a statement sent "
            "on it has an answer nobody read. Give thread_lock a connection used for "
            "nothing else, or a DSN or pool so it runs its statements itself"
        )
    if status == TransactionStatus.INERROR:
        raise PersistenceError(
            f"the connection to {shown} given to thread_lock is in a failed "
            "transaction; roll it back (conn.rollback()) before locking a thread on it"
        )


# ------------------------------------------------------------------ SQLite and in-process


def _lock_file(path: pathlib.Path, thread_id: str) -> pathlib.Path:
    digest = hashlib.sha256(thread_id.encode("utf-8")).hexdigest()[:32]
    return pathlib.Path(f"{path}.locks") / f"{digest}.lock"


@contextlib.contextmanager
def _lock_file_open(path: pathlib.Path, thread_id: str) -> Iterator[int]:
    """The thread's lock file, open for the block (its ``flock`` released, if taken,
    when the block ends)."""
    file = _lock_file(path, thread_id)
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(file, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise PersistenceError(f"cannot create the thread lock file {str(file)!r}: {exc}") from exc
    try:
        yield fd
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)  # a no-op when the lock was never taken
        os.close(fd)


def _flock(
    fd: int, wait: bool | float, thread_id: str, shown: str, clock: Clock = _SYSTEM_CLOCK
) -> None:
    """Exclusive ``flock``: per open file, so it excludes other threads and processes."""
    if wait is True:
        fcntl.flock(fd, fcntl.LOCK_EX)
        return
    bound = wait_seconds(wait)
    deadline = clock.monotonic() + (bound or 0.0)
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if clock.monotonic() >= deadline:
                raise ThreadBusyError(thread_id, shown) from None
        clock.sleep(_POLL_SECONDS)  # flock has no timed wait: poll, through the clock


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


# ------------------------------------------------------------------ the public locks


@contextlib.contextmanager
def thread_lock(
    target: LockTarget,
    thread_id: str,
    *,
    wait: bool | float = False,
    ttl: float | dt.timedelta | None = None,
    clock: Clock | None = None,
) -> Iterator[Lease | None]:
    """Hold the run lock of one thread for the duration of the block.

    On PostgreSQL it is a lease: a row of ``lgr_thread_leases`` with a fencing token,
    taken in one statement (on the target's pool, the caller's connection, or for a
    DSN one connection per process), renewed every third of its TTL by a daemon thread
    and released in one statement, so it holds the same straight to PostgreSQL and
    through a transaction pooler (PgBouncer ``pool_mode=transaction``, RDS Proxy,
    Supavisor). A runner that crashes holds its thread until the lease lapses: `ttl`
    seconds (or a timedelta; default: the `Persistence`'s ``lease_ttl``, else 30 s)
    after its last renewal, on the database's clock. The block gets the `Lease`: its
    ``token`` is greater than every earlier holder's; every ledger write of the run
    carries it and the database refuses those of a stale token, and the run checks it
    before each checkpoint write and side effect (`ThreadLockLostError`).

    On SQLite it is an exclusive ``flock`` on ``<file>.locks/<hash>.lock`` (the block
    gets None). When another runner holds the thread: `ThreadBusyError` (naming the
    holder and when its lease lapses), or with ``wait=True`` ask again until it is
    free (a number waits at most that many seconds), with a backoff slept on `clock`.

    >>> with thread_lock(persistence, "thread-42"):  # doctest: +SKIP
    ...     app.invoke(None, {"configurable": {"thread_id": "thread-42"}})
    """
    clock = clock or _SYSTEM_CLOCK
    kind, where = _resolve(target)
    if kind == "file":
        with _lock_file_open(where, thread_id) as fd:
            _flock(fd, wait, thread_id, str(where), clock)
            yield None
        return
    if kind == "local":
        with _local_lock(thread_id):
            yield None
        return
    seconds = _ttl_of(target, ttl)
    runner, shown = _runner(kind, where, asynchronous=False)
    lease = drive(
        acquire(runner, thread_id, ttl=seconds, wait=wait, clock=clock, where=shown), clock
    )
    lease.start_renewal()
    try:
        with holding(lease):
            yield lease
    finally:
        lease.release()


@contextlib.asynccontextmanager
async def athread_lock(
    target: LockTarget | psycopg.AsyncConnection[Any],
    thread_id: str,
    *,
    wait: bool | float = False,
    ttl: float | dt.timedelta | None = None,
    clock: Clock | None = None,
) -> AsyncIterator[Lease | None]:
    """Async `thread_lock`; also accepts a psycopg `AsyncConnection` (used as is).

    On an async pool the lease statements run on the pool itself and the lease is renewed
    by a task on the running loop; on a sync pool, a DSN or a sync connection they run in
    a worker thread. Waiting never blocks the event loop.
    """
    clock = clock or _SYSTEM_CLOCK
    kind, where = _resolve(target)
    if kind == "file":
        with _lock_file_open(where, thread_id) as fd:
            await asyncio.to_thread(_flock, fd, wait, thread_id, str(where), clock)
            yield None
        return
    if kind == "local":
        with _local_lock(thread_id):
            yield None
        return
    seconds = _ttl_of(target, ttl)
    runner, shown = _runner(kind, where, asynchronous=True)
    flow = acquire(runner, thread_id, ttl=seconds, wait=wait, clock=clock, where=shown)
    lease = await adrive(flow, clock)
    lease.astart_renewal()
    try:
        with holding(lease):
            yield lease
    finally:
        await lease.arelease()


def thread_held(target: LockTarget, thread_id: str) -> bool:
    """Whether another runner holds the thread now (on PostgreSQL, reads only)."""
    kind, where = _resolve(target)
    if kind in ("file", "local"):
        try:
            with thread_lock(target, thread_id):
                return False
        except ThreadBusyError:
            return True
    runner, _ = _runner(kind, where, asynchronous=False)
    return drive(held_by(runner, thread_id), _SYSTEM_CLOCK)


async def athread_held(target: LockTarget, thread_id: str) -> bool:
    """Async `thread_held`."""
    kind, where = _resolve(target)
    if kind in ("file", "local"):
        try:
            async with athread_lock(target, thread_id):
                return False
        except ThreadBusyError:
            return True
    runner, _ = _runner(kind, where, asynchronous=True)
    return await adrive(held_by(runner, thread_id), _SYSTEM_CLOCK)
