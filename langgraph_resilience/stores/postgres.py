"""PostgreSQL: the one plumbing every Postgres store shares.

`Postgres` wraps a psycopg pool or connection, sync or async, under one contract
(autocommit connections, as LangGraph's `PostgresSaver` needs; a single connection
is used by one caller at a time, under one lock per connection or the lock of the
connection's owner; a failed script leaves no transaction open). Its
work is written once, as `~langgraph_resilience.core.flow` flows over a cursor
(``yield Call(cur.execute, None, (sql, params))``): `Postgres.run` drives one with
`drive` on a sync connection, `Postgres.arun` with `adrive` on an async one (which
awaits the async cursor's coroutines), and each forwards to the other mode when
called across it (a sync store's async twin runs in a worker thread; an async
store's sync twin runs on the store's event loop, from another thread).

On it: the idempotency ledger and the saga log
(`langgraph_resilience.stores.postgres_ledger`), the breaker and retry-budget tables
(`langgraph_resilience.stores.breakers`, `langgraph_resilience.stores.budgets`), and
the thread leases (`langgraph_resilience.stores.leases`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator, Mapping
from typing import Any, TypeAlias, TypeVar

import psycopg
from psycopg import sql
from psycopg.pq import ExecStatus, PipelineStatus, TransactionStatus
from psycopg.rows import RowFactory, dict_row, tuple_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from langgraph_resilience.core.clock import SystemClock
from langgraph_resilience.core.flow import Call, Flow, adrive, drive
from langgraph_resilience.core.redaction import redact
from langgraph_resilience.errors import (
    ConfigurationError,
    PersistenceError,
    ThreadLockLostError,
)
from langgraph_resilience.stores.lease_sql import (
    FENCE_SQLSTATE,
)

__all__ = [
    "POSTGRES_CONNECTION_KWARGS",
    "AsyncConn",
    "JsonTable",
    "Postgres",
    "SyncConn",
]

T = TypeVar("T")

SyncConn: TypeAlias = "psycopg.Connection[Any] | ConnectionPool[Any]"
AsyncConn: TypeAlias = "psycopg.AsyncConnection[Any] | AsyncConnectionPool[Any]"
Work: TypeAlias = Callable[..., Flow[T]]
"""A flow over one cursor: ``work(cursor, *args)``."""

POSTGRES_CONNECTION_KWARGS: dict[str, Any] = {
    "autocommit": True,
    "prepare_threshold": None,
    "row_factory": dict_row,
}
"""What LangGraph's Postgres saver and store require of every connection, and what a
transaction pooler requires of ours: no statement is ever prepared
(``prepare_threshold=None``). PgBouncer before 1.21 (Debian bookworm ships 1.18) has
no prepared statements in ``pool_mode=transaction``: a statement prepared on one
backend is run on another (``prepared statement "_pg3_0" does not exist``). Preparing
would save the server a parse per statement; measured on this package's statements it
is noise next to the round trip."""

_NEVER_SLEEPS = SystemClock()


def first_line(exc: BaseException) -> str:
    """The first line of a driver's error, redacted (its text may quote the DSN)."""
    lines = redact(str(exc)).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def connect_error(shown: str, exc: BaseException) -> PersistenceError:
    """The error of a failed connection to the (redacted) DSN `shown`."""
    return PersistenceError(f"cannot connect to PostgreSQL at {shown}: {first_line(exc)}")


def require_autocommit(conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    """The one connection rule of every Postgres store (ConfigurationError otherwise)."""
    if not conn.autocommit:
        raise ConfigurationError(
            "the store needs autocommit connections, as LangGraph's PostgresSaver "
            "does: connect with autocommit=True or build the pool with "
            "kwargs=langgraph_resilience.stores.postgres.POSTGRES_CONNECTION_KWARGS"
        )


def _cursor(conn: Any, row_factory: RowFactory[Any], client: bool) -> Any:
    """A cursor on `conn` (sync or async): client-side binding when `client`, which
    allows several statements with parameters in one round trip."""
    if not client:
        return conn.cursor(row_factory=row_factory)
    if isinstance(conn, psycopg.AsyncConnection):
        return psycopg.AsyncClientCursor(conn, row_factory=row_factory)
    return psycopg.ClientCursor(conn, row_factory=row_factory)


def _rows_of(cur: Any) -> bool:
    """Whether the statement `cur` ran returned rows (read from its result's status, not
    `description`, which builds a Column per field each time)."""
    result = cur.pgresult
    return result is not None and result.status == ExecStatus.TUPLES_OK


def fetch(cur: Any, query: Any, params: Any = None) -> Flow[list[Any]]:
    """Run one statement; the rows it returned (none for a statement without rows)."""
    yield Call(cur.execute, None, (query, params))
    if not _rows_of(cur):
        return []
    rows: list[Any] = yield Call(cur.fetchall)
    return rows


@contextlib.contextmanager
def _kept(exc: BaseException) -> Iterator[None]:
    """A rollback after `exc` that fails does not replace it: a Ctrl-C that lands while
    a statement is in flight leaves the connection busy ("another command is already
    in progress"), and the user's interrupt must stop the run, not become a ledger
    failure that is retried. The pool discards the connection it gets back."""
    try:
        yield
    except psycopg.Error:
        raise exc from None


def _raise_ours(exc: BaseException) -> None:
    """A driver error that means something of ours, raised as what it means: a write the
    database refused because the writer's thread lease is gone (`ThreadLockLostError`),
    or a ledger whose tables predate a function of ours it calls (`ConfigurationError`)."""
    if not isinstance(exc, psycopg.Error):
        return
    if exc.sqlstate == FENCE_SQLSTATE:
        thread_id = exc.diag.message_detail or "?"
        raise ThreadLockLostError(thread_id, "its lease was taken over or expired") from None
    if isinstance(exc, psycopg.errors.UndefinedFunction) and "lgr_" in str(exc):
        raise ConfigurationError(
            f"the ledger's tables were set up by an older version, without a function "
            f"its writes call ({first_line(exc)}): run setup() once (open_postgres(dsn) "
            "does, or PostgresIdempotencyStore(pool).setup()), then start the workers"
        ) from exc


def _transaction(cur: Any, statements: Iterable[str]) -> Flow[None]:
    """Run `statements` in one transaction, in one round trip (no parameters)."""
    yield Call(cur.execute, None, ("BEGIN;\n" + ";\n".join(statements) + ";\nCOMMIT",))


def _execute_alone(conn: psycopg.Connection[Any], cur: Any, query: Any, params: Any) -> None:
    """One statement on a connection another owns, its lock held: never prepared (its
    owner may prepare every statement, ``prepare_threshold=0``, and a statement of
    ours must not depend on it), and synced on its own when the owner keeps the
    connection in pipeline mode (``from_conn_string(pipeline=True)``), so its result
    is read now."""
    if conn.info.pipeline_status == PipelineStatus.OFF:
        cur.execute(query, params, prepare=False)
        return
    with conn.pipeline():  # nested in the owner's: exiting it syncs this statement
        cur.execute(query, params, prepare=False)


async def _aexecute_alone(
    conn: psycopg.AsyncConnection[Any], cur: Any, query: Any, params: Any
) -> None:
    """Async `_execute_alone`."""
    if conn.info.pipeline_status == PipelineStatus.OFF:
        await cur.execute(query, params, prepare=False)
        return
    async with conn.pipeline():
        await cur.execute(query, params, prepare=False)


_CONNECTION_LOCKS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


def _connection_lock(conn: Any, is_async: bool) -> Any:
    """The lock every store of this package holds on single connection `conn` (a ledger
    and a saga log given one connection take turns on it)."""
    with _LOCKS_GUARD:
        lock = _CONNECTION_LOCKS.get(conn)
        if lock is None:
            lock = _CONNECTION_LOCKS[conn] = asyncio.Lock() if is_async else threading.Lock()
        return lock


class Postgres:
    """A psycopg pool or connection, sync or async: the plumbing of every Postgres store.

    `run` / `arun` check a connection out (or take the single one's lock), open a
    cursor and drive a flow over it; a flow that fails leaves no transaction open.
    A pool's connections must be autocommit (checked at each checkout, a single
    connection at construction).

    A single connection is used under one lock: by default the one every store of
    this package shares on that connection; `lock` is the lock of the connection's
    owner instead (LangGraph's ``PostgresSaver`` / ``AsyncPostgresSaver`` hold
    ``saver.lock`` around each use of ``saver.conn``), so the two never use it at
    once. On such a *shared* connection `rows` and `transaction` run one statement
    at a time, unprepared, each synced on its own; a pool's connections are never
    shared, and `lock` is unused for one.
    """

    def __init__(
        self,
        conn: SyncConn | AsyncConn,
        *,
        owner: str,
        is_async: bool,
        twin: str | None = None,
        lock: threading.Lock | asyncio.Lock | None = None,
    ) -> None:
        kinds: tuple[type, ...] = (
            (psycopg.AsyncConnection, AsyncConnectionPool)
            if is_async
            else (psycopg.Connection, ConnectionPool)
        )
        if not isinstance(conn, kinds):
            twin = twin or (owner.removeprefix("Async") if is_async else f"Async{owner}")
            names = " or ".join(kind.__name__ for kind in kinds)
            other = "sync" if is_async else "async"
            raise ConfigurationError(
                f"{owner} takes a psycopg {names}; for {other} ones use {twin}"
            )
        single = isinstance(conn, psycopg.Connection | psycopg.AsyncConnection)
        if isinstance(conn, psycopg.Connection | psycopg.AsyncConnection):
            require_autocommit(conn)
        self.conn: Any = conn
        self.owner = owner
        self.is_async = is_async
        self.shared = single and lock is not None
        """Whether the single connection is its owner's, used under the owner's lock."""
        self._lock: Any = None
        """Serializes the users of a single connection (None for a pool)."""
        if single:
            self._lock = lock if self.shared else _connection_lock(conn, is_async)
        self.loop: asyncio.AbstractEventLoop | None = None
        """The event loop of an async pool or connection (its sync twins run there)."""
        if is_async:
            with contextlib.suppress(RuntimeError):
                self.loop = asyncio.get_running_loop()

    @property
    def closed(self) -> bool:
        """Whether the pool or connection was closed: nothing goes through it until its
        owner opens it again."""
        return bool(self.conn.closed)

    # ----------------------------------------------------------- connections

    @contextlib.contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        if isinstance(self.conn, ConnectionPool):
            with self.conn.connection() as conn:
                require_autocommit(conn)
                yield conn
        else:
            with self._lock:
                yield self.conn

    @contextlib.asynccontextmanager
    async def _aconnection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        if self.loop is None:
            self.loop = asyncio.get_running_loop()
        if isinstance(self.conn, AsyncConnectionPool):
            async with self.conn.connection() as conn:
                require_autocommit(conn)
                yield conn
        else:
            async with self._lock:
                yield self.conn

    def _on_loop(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run `coro` on the async store's loop from another thread (as LangGraph's
        `AsyncPostgresSaver` does)."""
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if self.loop is None or running is self.loop:
            coro.close()
            raise asyncio.InvalidStateError(
                f"synchronous calls to {self.owner} are only allowed from a thread other "
                "than its event loop's, while that loop runs; use the async methods "
                "(aclaim, aacquire, ...) instead"
            )
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    # ----------------------------------------------------------- the drivers

    def run(
        self,
        work: Work[T],
        *args: Any,
        row_factory: RowFactory[Any] = dict_row,
        client: bool = False,
    ) -> T:
        """``work(cursor, *args)`` on a connection of this pool (sync)."""
        if self.is_async:
            return self._on_loop(self.arun(work, *args, row_factory=row_factory, client=client))
        with self._connection() as conn, _cursor(conn, row_factory, client) as cur:
            try:
                return drive(work(cur, *args), _NEVER_SLEEPS)
            except BaseException as exc:
                if conn.info.transaction_status != TransactionStatus.IDLE:
                    with _kept(exc):
                        conn.rollback()
                _raise_ours(exc)
                raise

    async def arun(
        self,
        work: Work[T],
        *args: Any,
        row_factory: RowFactory[Any] = dict_row,
        client: bool = False,
    ) -> T:
        """Async `run` (a sync pool's in a worker thread)."""
        if not self.is_async:
            return await asyncio.to_thread(
                self.run, work, *args, row_factory=row_factory, client=client
            )
        async with self._aconnection() as conn, _cursor(conn, row_factory, client) as cur:
            try:
                return await adrive(work(cur, *args), _NEVER_SLEEPS)
            except BaseException as exc:
                if conn.info.transaction_status != TransactionStatus.IDLE:
                    with _kept(exc):
                        await conn.rollback()
                _raise_ours(exc)
                raise

    def rows(self, query: str, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Run one statement (committed); its rows as dicts."""
        if not self.shared:
            return self.run(fetch, query, params)
        if self.is_async:
            return self._on_loop(self.arows(query, params))
        with self._lock, self.conn.cursor(row_factory=dict_row) as cur:
            try:
                _execute_alone(self.conn, cur, query, params)
            except psycopg.Error as exc:
                _raise_ours(exc)
                raise
            return cur.fetchall() if _rows_of(cur) else []

    async def arows(self, query: str, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Async `rows`."""
        if not self.shared:
            return await self.arun(fetch, query, params)
        if not self.is_async:
            return await asyncio.to_thread(self.rows, query, params)
        self.loop = self.loop or asyncio.get_running_loop()
        async with self._lock, self.conn.cursor(row_factory=dict_row) as cur:
            try:
                await _aexecute_alone(self.conn, cur, query, params)
            except psycopg.Error as exc:
                _raise_ours(exc)
                raise
            return await cur.fetchall() if _rows_of(cur) else []

    def transaction(self, statements: Iterable[str]) -> None:
        """Run `statements` (no parameters) in one transaction: in one round trip, or
        on a shared connection one statement at a time."""
        if not self.shared:
            self.run(_transaction, tuple(statements), client=True)
        elif self.is_async:
            self._on_loop(self.atransaction(statements))
        else:
            with self._lock, self.conn.transaction(), self.conn.cursor() as cur:
                for statement in statements:
                    _execute_alone(self.conn, cur, statement, None)

    async def atransaction(self, statements: Iterable[str]) -> None:
        """Async `transaction`."""
        if not self.shared:
            await self.arun(_transaction, tuple(statements), client=True)
        elif not self.is_async:
            await asyncio.to_thread(self.transaction, statements)
        else:
            self.loop = self.loop or asyncio.get_running_loop()
            async with self._lock, self.conn.transaction(), self.conn.cursor() as cur:
                for statement in statements:
                    await _aexecute_alone(self.conn, cur, statement, None)


# ------------------------------------------------------------------ key -> jsonb tables

_TABLE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$")

JsonChange: TypeAlias = Callable[[Any], tuple[T, dict[str, Any] | None]]
"""A change of one row's JSON: (stored JSON or None) -> (result, JSON to write or None)."""


def _table(name: str) -> sql.Identifier:
    if not isinstance(name, str) or not _TABLE_NAME.match(name):
        raise ConfigurationError(
            f"table must be a plain SQL identifier, optionally schema-qualified "
            f"(e.g. 'lgr_breakers' or 'ops.lgr_breakers'), got {name!r}"
        )
    return sql.Identifier(*name.split("."))


@dataclasses.dataclass(frozen=True, slots=True)
class _TableSql:
    """The statements of one key -> jsonb table. Changes take the row lock in a
    transaction that commits asynchronously (``synchronous_commit = off``): a
    breaker's state is worth a lost millisecond after a server crash, not an
    fsync per tool call. Statements are batched (client-side binding, one round
    trip per batch) so a locked change costs two round trips."""

    setup: sql.Composed
    read: sql.Composed
    lock: sql.Composed
    write: sql.Composed
    commit: sql.SQL

    @classmethod
    def for_table(cls, table: str) -> _TableSql:
        ident = _table(table)
        return cls(
            setup=sql.SQL(
                "CREATE TABLE IF NOT EXISTS {} (key text PRIMARY KEY, state jsonb NOT NULL, "
                "updated_at timestamptz NOT NULL DEFAULT now())"
            ).format(ident),
            read=sql.SQL("SELECT state FROM {} WHERE key = %s").format(ident),
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


def _fetch_one(cur: Any, query: Any, params: Any) -> Flow[tuple[Any, ...] | None]:
    yield Call(cur.execute, None, (query, params))
    row: tuple[Any, ...] | None = yield Call(cur.fetchone)
    return row


def _locked_change(
    cur: Any, statements: _TableSql, key: str, default: dict[str, Any], change: JsonChange[T]
) -> Flow[T]:
    """Apply `change` to `key`'s row under its row lock, in one transaction (two trips)."""
    yield Call(cur.execute, None, (statements.lock, (key, Jsonb(default), key)))
    while cur.nextset():
        pass
    row = yield Call(cur.fetchone)
    result, new = change(None if row is None else row[0])
    if new is None:
        yield Call(cur.execute, None, (statements.commit,))
    else:
        yield Call(cur.execute, None, (statements.write, (Jsonb(new), key)))
    return result


class JsonTable:
    """A ``key -> jsonb`` table on `Postgres` (the breaker and retry-budget stores):
    read a row's JSON, or change it atomically under the row's lock. Each operation
    is one flow, run by `Postgres.run` (sync) or `Postgres.arun` (async)."""

    def __init__(self, pg: Postgres, table: str, default: dict[str, Any]) -> None:
        self.pg = pg
        self.table = table
        self.default = default
        """The JSON a missing row starts from."""
        self._sql = _TableSql.for_table(table)

    def setup(self) -> None:
        """Create the table if it does not exist."""
        self.pg.run(fetch, self._sql.setup)

    async def asetup(self) -> None:
        """Async `setup`."""
        await self.pg.arun(fetch, self._sql.setup)

    def read(self, key: str) -> Any:
        """The stored JSON of `key`, or None."""
        row = self.pg.run(_fetch_one, self._sql.read, (key,), row_factory=tuple_row)
        return None if row is None else row[0]

    async def aread(self, key: str) -> Any:
        """Async `read`."""
        row = await self.pg.arun(_fetch_one, self._sql.read, (key,), row_factory=tuple_row)
        return None if row is None else row[0]

    def change(self, key: str, change: JsonChange[T]) -> T:
        """Apply `change` to `key`'s row under its lock; its result."""
        flow_args = (self._sql, key, self.default, change)
        result: T = self.pg.run(_locked_change, *flow_args, row_factory=tuple_row, client=True)
        return result

    async def achange(self, key: str, change: JsonChange[T]) -> T:
        """Async `change`."""
        flow_args = (self._sql, key, self.default, change)
        result: T = await self.pg.arun(
            _locked_change, *flow_args, row_factory=tuple_row, client=True
        )
        return result
