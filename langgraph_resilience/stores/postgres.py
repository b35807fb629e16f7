"""PostgreSQL: the one plumbing every Postgres store shares, and the ledger's tables.

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

On it: the idempotency ledger (table ``lgr_idempotency``) and the saga log
(``lgr_saga``), whose logic is `langgraph_resilience.stores.sql`'s, and the
breaker and retry-budget tables (`langgraph_resilience.stores.breakers`,
`langgraph_resilience.stores.budgets`).
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
from langgraph_resilience.core.effects import IdempotencyRecord, SagaEntry
from langgraph_resilience.core.flow import Call, Flow, adrive, drive
from langgraph_resilience.core.redaction import redact
from langgraph_resilience.errors import (
    ConfigurationError,
    PersistenceError,
    SetupTimeoutError,
    ThreadLockLostError,
)
from langgraph_resilience.stores.held import fences_json
from langgraph_resilience.stores.lease_sql import (
    FENCE_SQLSTATE,
    LEASE_DDL,
    SETUP_LOCK_TIMEOUT,
    SETUP_PREAMBLE,
)
from langgraph_resilience.stores.saga import SAGA_COLUMNS, SagaDialect, SqlSagaLog
from langgraph_resilience.stores.sql import (
    COLUMNS,
    LedgerDialect,
    SqlIdempotencyStore,
)

__all__ = [
    "IDEMPOTENCY_TABLE",
    "POSTGRES_CONNECTION_KWARGS",
    "SAGA_TABLE",
    "AsyncConn",
    "AsyncPostgresIdempotencyStore",
    "AsyncPostgresSagaLog",
    "JsonTable",
    "Postgres",
    "PostgresIdempotencyStore",
    "PostgresSagaLog",
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


def _raise_ours(exc: BaseException) -> None:
    """A driver error that means something of ours, raised as what it means: a write the
    database refused because the writer's thread lease is gone (`ThreadLockLostError`),
    or a ledger whose tables predate the fence functions (`ConfigurationError`)."""
    if not isinstance(exc, psycopg.Error):
        return
    if exc.sqlstate == FENCE_SQLSTATE:
        thread_id = exc.diag.message_detail or "?"
        raise ThreadLockLostError(thread_id, "its lease was taken over or expired") from None
    if isinstance(exc, psycopg.errors.UndefinedFunction) and "lgr_" in str(exc):
        raise ConfigurationError(
            "the ledger's tables were set up by an older version, without the thread "
            "lease functions its writes call: run setup() once (open_postgres(dsn) does, "
            "or PostgresIdempotencyStore(pool).setup()), then start the workers"
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


# ------------------------------------------------------------------ the ledger's tables

IDEMPOTENCY_TABLE = "lgr_idempotency"
SAGA_TABLE = "lgr_saga"


@contextlib.contextmanager
def _bounded(table: str) -> Iterator[None]:
    """A setup transaction whose lock wait ran out: `SetupTimeoutError`, naming the fix."""
    try:
        yield
    except psycopg.errors.LockNotAvailable as exc:
        raise SetupTimeoutError.waiting(table, seconds=SETUP_LOCK_TIMEOUT) from exc


_IDEMPOTENCY_DDL = (
    *SETUP_PREAMBLE,
    """
    CREATE TABLE IF NOT EXISTS lgr_idempotency (
        key text PRIMARY KEY,
        tool text,
        thread_id text,
        args jsonb,
        status text NOT NULL DEFAULT 'pending'
            CHECK (status IN ('pending', 'done', 'failed')),
        result jsonb,
        created_at timestamptz NOT NULL DEFAULT now(),
        updated_at timestamptz NOT NULL DEFAULT now()
    )
    """,
    "CREATE INDEX IF NOT EXISTS lgr_idempotency_thread_idx ON lgr_idempotency (thread_id)",
    "ALTER TABLE lgr_idempotency ADD COLUMN IF NOT EXISTS fingerprint text",
    "CREATE INDEX IF NOT EXISTS lgr_idempotency_unresolved_idx "
    "ON lgr_idempotency (thread_id, fingerprint) WHERE status = 'pending'",
    # done effects of a thread by fingerprint: what a claim finds that a rewound thread
    # no longer holds (on a large table created by an earlier version, create it
    # beforehand with CREATE INDEX CONCURRENTLY, same name)
    "CREATE INDEX IF NOT EXISTS lgr_idempotency_done_idx "
    "ON lgr_idempotency (thread_id, fingerprint) WHERE status = 'done'",
    # `purge`: completed rows by age. On a large table created by an earlier version,
    # create it beforehand with CREATE INDEX CONCURRENTLY (same name) to avoid
    # blocking writes while it builds; this statement is then a no-op.
    "CREATE INDEX IF NOT EXISTS lgr_idempotency_completed_idx "
    "ON lgr_idempotency (updated_at) WHERE status IN ('done', 'failed')",
    # the thread leases, whose tokens the ledger's writes carry (``lgr_fenced``)
    *LEASE_DDL,
)
"""The ledger's tables, and the leases its writes are fenced by, in one transaction:
the lock wait capped (`SetupTimeoutError`, never a hang), under the setup lock."""

_SAGA_DDL = (
    *SETUP_PREAMBLE,
    """
    CREATE TABLE IF NOT EXISTS lgr_saga (
        seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        thread_id text NOT NULL,
        key text NOT NULL,
        tool text NOT NULL,
        action text NOT NULL,
        status text NOT NULL,
        detail jsonb,
        at timestamptz NOT NULL DEFAULT clock_timestamp()
    )
    """,
    "CREATE INDEX IF NOT EXISTS lgr_saga_thread_idx ON lgr_saga (thread_id, seq)",
)

_OUTCOME = """
UPDATE lgr_idempotency
SET status = %(status)s, result = %(result)s::jsonb, updated_at = now()
{commit_mode}WHERE key = %(key)s AND status = 'pending'
RETURNING key, thread_id, NOT lgr_lease_holds(thread_id, %(fences)s::jsonb) AS lgr_stale
"""
# The outcome of an effect that ran is a fact, kept whoever reports it: refusing a
# stale holder's outcome would make the ledger forget an effect that happened (the
# next owner could run it again). ``lgr_stale`` says the writer's lease is gone, and
# the store stops that run right after the write (`ThreadLockLostError`).

# One batch of `purge`: completed rows older than the retention, oldest first, through
# lgr_idempotency_completed_idx; locked rows (a concurrent purge) are skipped. A pending
# row never qualifies, and the outer WHERE re-checks it on the row version it deletes.
_PURGE = """
WITH gone AS (
    DELETE FROM lgr_idempotency
    WHERE key IN (
        SELECT key FROM lgr_idempotency
        WHERE status IN ('done', 'failed')
          AND updated_at < now() - make_interval(secs => %(seconds)s)
        ORDER BY updated_at
        LIMIT %(batch)s
        FOR UPDATE SKIP LOCKED
    )
    AND status IN ('done', 'failed')
    RETURNING 1
)
SELECT count(*) AS n FROM gone
"""


def _record_of(row: Mapping[str, Any]) -> IdempotencyRecord:
    age = row.get("age_s")
    return IdempotencyRecord(
        **{name: row[name] for name in _RECORD_FIELDS}, age_s=None if age is None else float(age)
    )


def _entry_of(row: Mapping[str, Any]) -> SagaEntry:
    return SagaEntry(**{**{name: row[name] for name in _ENTRY_FIELDS}, "seq": int(row["seq"])})


_RECORD_FIELDS = COLUMNS.split(", ")
_AGE = "EXTRACT(EPOCH FROM clock_timestamp() - updated_at)::float8 AS age_s"
"""A record's age on the server's clock: no skew between the workers' clocks."""
_ENTRY_FIELDS = SAGA_COLUMNS.split(", ")
_NO_RECORD = (
    "NULL::text AS tool, NULL::text AS thread_id, NULL::jsonb AS args, "
    "'pending'::text AS status, NULL::jsonb AS result, NULL::timestamptz AS created_at, "
    "NULL::timestamptz AS updated_at, NULL::text AS fingerprint, NULL::float8 AS age_s"
)
"""The columns after ``key`` of `COLUMNS` and ``age_s``, empty: a new intent's row in a
claim that returns whole siblings (its caller knows the intent it wrote). Named: the
first branch of a ``UNION`` names the columns of every row."""
_DONE_ROW = (
    "NULL::text, NULL::text, NULL::jsonb, 'done'::text, NULL::jsonb, created_at, "
    "NULL::timestamptz, NULL::text, NULL::float8"
)
"""A done sibling's row in a claim: its key and creation time only (read when used)."""

DIALECT = LedgerDialect(
    # The intent: one durable round trip for a new key. A key that exists returns no
    # row, and the claim script reads it (a second round trip, only on a replay).
    intent="""
        INSERT INTO lgr_idempotency (key, tool, thread_id, args, fingerprint)
        SELECT %(key)s, %(tool)s, %(thread_id)s, %(args)s::jsonb, %(fingerprint)s
        WHERE lgr_fenced(%(thread_id)s, %(fences)s::jsonb)
        ON CONFLICT (key) DO NOTHING
        RETURNING key
    """,
    # The intent and the thread's other pending intents of its fingerprint (what the
    # exactly-once flow reconciles before a new effect runs), in one round trip: the
    # SELECT reads the snapshot the INSERT started from, so it never sees this key.
    # Both are fenced in the statement: a writer whose thread lease was taken over or
    # lapsed gets `ThreadLockLostError` (SQLSTATE LR001, raised by ``lgr_fenced``) and
    # nothing is written, with no gap between the check and the write.
    intent_unresolved=f"""
        WITH new AS (
            INSERT INTO lgr_idempotency (key, tool, thread_id, args, fingerprint)
            SELECT %(key)s, %(tool)s, %(thread_id)s, %(args)s::jsonb, %(fingerprint)s
            WHERE lgr_fenced(%(thread_id)s, %(fences)s::jsonb)
            ON CONFLICT (key) DO NOTHING
            RETURNING key
        )
        SELECT 'new' AS lgr_kind, key, {_NO_RECORD} FROM new
        UNION ALL
        SELECT 'sibling' AS lgr_kind, {COLUMNS}, {_AGE} FROM lgr_idempotency
        WHERE thread_id = %(thread_id)s AND fingerprint = %(fingerprint)s
          AND status = 'pending' AND key <> %(key)s
        UNION ALL
        SELECT 'done' AS lgr_kind, key, {_DONE_ROW} FROM lgr_idempotency
        WHERE thread_id = %(thread_id)s AND fingerprint = %(fingerprint)s
          AND status = 'done'
    """,
    get=f"SELECT {COLUMNS}, {_AGE} FROM lgr_idempotency WHERE key = %(key)s",
    # The outcome of a pending intent; first outcome wins (a recorded one is never
    # overwritten). The relaxed variant does not wait for its WAL flush:
    # ``set_config(..., true)`` is transaction-local, so it applies to this one
    # autocommit statement and never leaks into the pooled session.
    outcome=_OUTCOME.format(commit_mode=""),
    relaxed_outcome=_OUTCOME.format(
        commit_mode="FROM (SELECT set_config('synchronous_commit', 'off', true)) AS commit_mode\n"
    ),
    # An outcome for a key with no intent (never claimed, or released): inserted,
    # unless another writer got there first.
    outcome_insert="""
        INSERT INTO lgr_idempotency (key, status, result)
        VALUES (%(key)s, %(status)s, %(result)s::jsonb)
        ON CONFLICT (key) DO NOTHING
        RETURNING key
    """,
    unresolved=(
        f"SELECT {COLUMNS}, {_AGE} FROM lgr_idempotency WHERE thread_id = %(thread_id)s "
        "AND fingerprint = %(fingerprint)s AND status = 'pending' ORDER BY created_at, key"
    ),
    done_keys=(
        "SELECT key FROM lgr_idempotency WHERE thread_id = %(thread_id)s "
        "AND fingerprint = %(fingerprint)s AND status = 'done' ORDER BY created_at DESC, key DESC"
    ),
    for_thread=(
        f"SELECT {COLUMNS} FROM lgr_idempotency WHERE thread_id = %(thread_id)s "
        "ORDER BY created_at, key"
    ),
    release=(
        "DELETE FROM lgr_idempotency WHERE key = %(key)s AND status <> 'done' "
        "AND lgr_fenced(thread_id, %(fences)s::jsonb) RETURNING key"
    ),
    purge=_PURGE,
    list_pending=(
        f"SELECT {COLUMNS} FROM lgr_idempotency WHERE status = 'pending' "
        "AND created_at <= now() - make_interval(secs => %(seconds)s) "
        "ORDER BY created_at, key LIMIT %(limit)s"
    ),
    record_of=_record_of,
    purged=lambda rows: int(rows[0]["n"]) if rows else 0,
    fences=fences_json,
    stale_of=lambda row: bool(row["lgr_stale"]),
)
"""The ledger's statements on PostgreSQL (the server's clock); the writes carry the
thread leases of the writer's context (`fences_json`)."""

SAGA_DIALECT = SagaDialect(
    append=f"""
        INSERT INTO lgr_saga (thread_id, key, tool, action, status, detail)
        VALUES (%(thread_id)s, %(key)s, %(tool)s, %(action)s, %(status)s, %(detail)s::jsonb)
        RETURNING {SAGA_COLUMNS}
    """,
    entries=(f"SELECT {SAGA_COLUMNS} FROM lgr_saga WHERE thread_id = %(thread_id)s ORDER BY seq"),
    entry_of=_entry_of,
)


class _PostgresLedger(SqlIdempotencyStore):
    _ASYNC = False

    def __init__(
        self,
        conn: Any,
        *,
        sync_outcomes: bool = False,
        deferred_outcomes: bool = False,
        lock: Any = None,
    ) -> None:
        self._pg = Postgres(conn, owner=type(self).__name__, is_async=self._ASYNC, lock=lock)
        self.conn = conn
        self.sync_outcomes = sync_outcomes
        self.deferred_outcomes = deferred_outcomes
        super().__init__(
            self._pg,
            DIALECT,
            relaxed=not sync_outcomes,
            deferred=deferred_outcomes,
            is_async=self._ASYNC,
        )

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop of an async pool or connection (None for a sync one)."""
        return self._pg.loop

    @property
    def lease_runner(self) -> Postgres:
        """Where thread leases beside this ledger are taken: its own pool or connection."""
        return self._pg


class PostgresIdempotencyStore(_PostgresLedger):
    """The ledger in PostgreSQL table ``lgr_idempotency``, over a psycopg pool or connection.

    Works with the pool configuration LangGraph's `PostgresSaver` needs
    (``autocommit=True, prepare_threshold=None, row_factory=dict_row``). On a single
    connection another user also holds (a ``PostgresSaver``'s ``saver.conn``), pass
    that user's `lock` (``saver.lock``): each statement then runs under it, one at a
    time and unprepared (`Postgres`). Claiming a
    new key is one ``INSERT ... ON CONFLICT DO NOTHING`` round trip, atomic across
    workers, that also returns the thread's unresolved intents of the same effect
    (a replay reads the existing record: one more); an outcome is one ``UPDATE``.
    Call `setup` once (``open_postgres`` does).

    With ``deferred_outcomes=True`` (off by default: measured on 2 cores, the writer
    thread's GIL contention cost a clean turn ~1.8 ms more than the round trip it
    took off the answer's path; see benchmarks/README.md) the exactly-once flow hands the
    outcome of an effect that ran to `defer_outcome`: a daemon thread writes it while
    the answer goes on, and every read of this store that could see that key (a claim,
    `get`, `unresolved`, `for_thread`, ...) waits for it first. A process killed before
    it is written leaves the intent ``pending``, reconciled on resume through the
    tool's ``status_check``, never re-run blindly. Close the pool after `flush()`:
    an outcome still queued when the pool closes is given up the same way.
    Async methods run the sync ones in a worker thread; inside an event loop
    prefer `AsyncPostgresIdempotencyStore`.

    The intent's commit always waits for its WAL flush: it must survive a server
    crash before the effect starts. The outcome's commit does not, unless
    ``sync_outcomes=True``: the next durable commit (the step's checkpoint, on
    any connection) flushes it, and if the server crashes before that the
    intent is simply ``pending`` again, so it is reconciled, never re-executed
    blindly. That saves one disk flush per side-effecting call.
    """

    def __init__(
        self,
        conn: SyncConn,
        *,
        sync_outcomes: bool = False,
        deferred_outcomes: bool = False,
        lock: threading.Lock | None = None,
    ) -> None:
        super().__init__(
            conn, sync_outcomes=sync_outcomes, deferred_outcomes=deferred_outcomes, lock=lock
        )

    def setup(self) -> None:
        """Create the table and its indexes, and the lease table, if they do not exist
        (one transaction; `SetupTimeoutError` rather than a hang)."""
        with _bounded(IDEMPOTENCY_TABLE):
            self._pg.transaction(_IDEMPOTENCY_DDL)


class AsyncPostgresIdempotencyStore(_PostgresLedger):
    """`PostgresIdempotencyStore` over a psycopg `AsyncConnectionPool` or `AsyncConnection`.

    Sync methods are allowed from threads other than the store's event loop
    only (they run on that loop), exactly like LangGraph's `AsyncPostgresSaver`.
    Call ``await store.setup()`` once (``aopen_postgres`` does). Outcomes commit
    as in `PostgresIdempotencyStore` (``sync_outcomes``) and are awaited by default
    (as the sync store's):
    on one event loop a deferred write still spends the loop's time, and measured it
    made a turn slower, not faster (benchmarks/README.md, ``postgres_path.py``).
    ``deferred_outcomes=True`` defers them as the sync store does, each written by a
    task on the store's loop; one still running when that loop shuts down is
    cancelled, its intent left pending (reconciled, as after a crash): ``await
    store.aflush()`` before closing the loop.
    """

    _ASYNC = True

    def __init__(
        self,
        conn: AsyncConn,
        *,
        sync_outcomes: bool = False,
        deferred_outcomes: bool = False,
        lock: asyncio.Lock | None = None,
    ) -> None:
        super().__init__(
            conn, sync_outcomes=sync_outcomes, deferred_outcomes=deferred_outcomes, lock=lock
        )

    async def setup(self) -> None:
        """Create the table and its indexes, and the lease table, if they do not exist."""
        with _bounded(IDEMPOTENCY_TABLE):
            await self._pg.atransaction(_IDEMPOTENCY_DDL)


class PostgresSagaLog(SqlSagaLog):
    """The saga log in PostgreSQL table ``lgr_saga`` (append-only: no update, no delete).
    Its async methods run the sync ones in a worker thread; `lock` as for
    `PostgresIdempotencyStore`."""

    def __init__(self, conn: SyncConn, *, lock: threading.Lock | None = None) -> None:
        self._pg = Postgres(conn, owner=type(self).__name__, is_async=False, lock=lock)
        self.conn = conn
        super().__init__(self._pg, SAGA_DIALECT)

    def setup(self) -> None:
        """Create the table and its index if they do not exist."""
        with _bounded(SAGA_TABLE):
            self._pg.transaction(_SAGA_DDL)


class AsyncPostgresSagaLog(SqlSagaLog):
    """`PostgresSagaLog` over a psycopg `AsyncConnectionPool` or `AsyncConnection`."""

    def __init__(self, conn: AsyncConn, *, lock: asyncio.Lock | None = None) -> None:
        self._pg = Postgres(conn, owner=type(self).__name__, is_async=True, lock=lock)
        self.conn = conn
        super().__init__(self._pg, SAGA_DIALECT)

    async def setup(self) -> None:
        """Create the table and its index if they do not exist."""
        with _bounded(SAGA_TABLE):
            await self._pg.atransaction(_SAGA_DDL)
