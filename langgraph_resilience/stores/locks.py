"""One runner per thread: `thread_lock` / `athread_lock`.

Open-source LangGraph has no per-thread lock, so two workers resuming the same
``thread_id`` fork it. `thread_lock` holds a PostgreSQL session advisory lock for
the run, on one lock connection per process (not a pooled one; a crash releases
the locks with the session); a second runner gets `ThreadBusyError`, or waits
when asked to. On SQLite it is an exclusive file lock. A run holding a lock also
holds its fence (`langgraph_resilience.stores.fencing`), so it stops before it
writes once the lock's session is gone.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import fcntl
import hashlib
import os
import pathlib
import threading
import weakref
from collections.abc import AsyncIterator, Iterator
from typing import Any, Protocol, TypeAlias, runtime_checkable

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from langgraph_resilience.core.clock import Clock, SystemClock
from langgraph_resilience.core.redaction import redact
from langgraph_resilience.errors import ThreadBusyError
from langgraph_resilience.stores.fencing import Fence, holding
from langgraph_resilience.stores.postgres import PersistenceError, connect_error

__all__ = ["LOCK_APPLICATION_NAME", "LockBackend", "LockTarget", "athread_lock", "thread_lock"]

_THREAD_LOCK_PREFIX = "langgraph-resilience:thread:"


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
(PostgreSQL advisory lock), a connection (used as is), or a SQLite file path (file lock)."""

_LOCK_SQL = "SELECT pg_try_advisory_lock(hashtextextended(%s, 0)) AS locked"
_LOCK_WAIT_SQL = "SELECT pg_advisory_lock(hashtextextended(%s, 0)), true AS locked"
_UNLOCK_SQL = "SELECT pg_advisory_unlock(hashtextextended(%s, 0))"
_POLL_SECONDS = 0.01
_SYSTEM_CLOCK = SystemClock()
"""How a file lock's wait polls and reads the time (a test passes its own clock)."""
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
    if isinstance(target, LockBackend):
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
        """The session's connection, reconnected if it ended or is stuck: an owned
        session is idle between lock statements (autocommit, under the mutex), so one
        that is not (a statement whose answer was never read, after an interrupted
        round trip) can run nothing more. Closing it ends the locks it held, and the
        new generation makes every fence taken on it report the lock lost."""
        conn = self._conn
        if conn is not None and not conn.closed:
            if _usable(conn):
                return conn
            if self._conninfo is None:  # the caller's own: never replaced, but named
                _check_given(conn, self.shown)
                return conn
            conn.close()
        if self._conninfo is None:
            raise PersistenceError(f"the lock connection to {self.shown} is closed")
        try:
            self._conn = psycopg.connect(
                self._conninfo, autocommit=True, application_name=LOCK_APPLICATION_NAME
            )
        except psycopg.Error as exc:
            raise connect_error(self.shown, exc) from None
        self.generation += 1
        return self._conn

    def fence(self, thread_id: str) -> Fence:
        """The fence of a lock just taken: alive while this session (this generation of
        its connection) is, and the lock still held by this process."""
        generation = self.generation

        def alive() -> bool:
            with self._mutex:
                if self.generation != generation or thread_id not in self.held:
                    return False
                return self._conn is not None and _alive(self._conn)

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
        reconnected once, as is one the error left stuck. Locks it held died with it."""
        for attempt in (1, 2):
            conn = self._connection()
            try:
                with conn.cursor(row_factory=dict_row) as cur:
                    row = cur.execute(sql, (_lock_name(thread_id),)).fetchone()
                if not conn.autocommit:
                    conn.commit()
                return bool(row and row["locked"])
            except psycopg.OperationalError as exc:
                if self._conninfo is None or attempt == 2 or _usable(conn):
                    raise connect_error(self.shown, exc) from None
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


def _usable(conn: psycopg.Connection[Any]) -> bool:
    """Open and idle: ready for the next statement."""
    return not conn.closed and conn.info.transaction_status == TransactionStatus.IDLE


def _check_given(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], shown: str) -> None:
    """A caller's connection that cannot take a lock statement: say why, and what to
    pass instead, rather than report a failure to connect."""
    status = conn.info.transaction_status
    if status == TransactionStatus.ACTIVE:
        raise PersistenceError(
            f"the connection to {shown} given to thread_lock is busy: a statement sent "
            "on it has an answer nobody read. Give thread_lock a connection used for "
            "nothing else, or a DSN or pool so it keeps its own lock session"
        )
    if status == TransactionStatus.INERROR:
        raise PersistenceError(
            f"the connection to {shown} given to thread_lock is in a failed "
            "transaction; roll it back (conn.rollback()) before locking a thread on it"
        )


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
    timeout = _timeout_ms(wait)
    deadline = clock.monotonic() + (timeout or 0) / 1000
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if timeout is None or clock.monotonic() >= deadline:
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
        with _lock_file_open(where, thread_id) as fd:
            _flock(fd, wait, thread_id, str(where))
            yield
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
    with _waited_lock(str(where), thread_id, wait) as fence, holding(fence):
        yield


@contextlib.contextmanager
def _waited_lock(dsn: str, thread_id: str, wait: bool | float) -> Iterator[Fence]:
    """Wait for the lock on a dedicated session; yield its fence. The lock is unlocked
    before the session closes: the server frees a closed session's locks only once its
    backend has exited, so a caller locking again at once would find it still held."""
    shown = redact(dsn)
    try:
        conn: psycopg.Connection[Any] = psycopg.connect(dsn, autocommit=True)
    except psycopg.Error as exc:
        raise connect_error(shown, exc) from None
    with conn:
        _pg_wait(conn, thread_id, wait, shown)
        try:
            yield Fence(thread_id, lambda: _alive(conn), shown)
        finally:
            with contextlib.suppress(psycopg.Error):
                conn.execute(_UNLOCK_SQL, (_lock_name(thread_id),))


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
        _check_given(target, shown)
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
        with _lock_file_open(where, thread_id) as fd:
            await asyncio.to_thread(_flock, fd, wait, thread_id, str(where))
            yield
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
    # A dedicated sync session, waited on in a worker thread: its fence is then checked
    # like every other (a sync round trip, in a thread), so a waited run is fenced too.
    waited = _waited_lock(str(where), thread_id, wait)
    fence = await asyncio.to_thread(waited.__enter__)
    try:
        with holding(fence):
            yield
    finally:
        await asyncio.to_thread(waited.__exit__, None, None, None)
