"""The side-effect ledger and the saga log on PostgreSQL: their tables (``lgr_idempotency``,
``lgr_saga``), their SQL dialects, and the stores over a pool or one connection.

Their logic is `langgraph_resilience.stores.sql`'s and `langgraph_resilience.stores.saga`'s;
every statement runs through `langgraph_resilience.stores.postgres.Postgres`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import psycopg

from langgraph_resilience.core.effects import IdempotencyRecord, SagaEntry
from langgraph_resilience.errors import SetupTimeoutError
from langgraph_resilience.stores.held import fences_json
from langgraph_resilience.stores.lease_sql import (
    LEASE_DDL,
    SETUP_LOCK_TIMEOUT,
    SETUP_PREAMBLE,
)
from langgraph_resilience.stores.postgres import (
    AsyncConn,
    Postgres,
    SyncConn,
)
from langgraph_resilience.stores.saga import SAGA_COLUMNS, SagaDialect, SqlSagaLog
from langgraph_resilience.stores.sql import (
    COLUMNS,
    LedgerDialect,
    SqlIdempotencyStore,
)

__all__ = [
    "IDEMPOTENCY_TABLE",
    "SAGA_TABLE",
    "AsyncPostgresIdempotencyStore",
    "AsyncPostgresSagaLog",
    "PostgresIdempotencyStore",
    "PostgresSagaLog",
]

IDEMPOTENCY_TABLE = "lgr_idempotency"
SAGA_TABLE = "lgr_saga"


@contextlib.contextmanager
def _bounded(table: str) -> Iterator[None]:
    """A setup transaction whose lock wait ran out: `SetupTimeoutError`, naming the fix."""
    try:
        yield
    except psycopg.errors.LockNotAvailable as exc:
        raise SetupTimeoutError.waiting(table, seconds=SETUP_LOCK_TIMEOUT) from exc


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

_OUTCOME_FUNCTION = """
CREATE OR REPLACE FUNCTION lgr_outcome(
    p_keys text[], p_statuses text[], p_results jsonb[], p_fences jsonb, p_relaxed boolean
) RETURNS TABLE (key text, thread_id text, lgr_stale boolean)
LANGUAGE plpgsql VOLATILE AS $lgr$
#variable_conflict use_column
BEGIN
    IF p_relaxed THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    RETURN QUERY
    WITH done AS (
        UPDATE lgr_idempotency AS l
        SET status = i.status, result = i.result, updated_at = now()
        FROM unnest(p_keys, p_statuses, p_results) AS i(key, status, result)
        WHERE l.key = i.key AND l.status = 'pending'
        RETURNING l.key, l.thread_id, NOT lgr_lease_holds(l.thread_id, p_fences)
    )
    SELECT * FROM done;
END
$lgr$
"""
"""The outcomes of pending intents, one row per key recorded; the first outcome wins (a
recorded one is never overwritten). ``p_relaxed``: the commit does not wait for its WAL
flush (``set_config(..., true)`` is transaction-local, so it applies to this one
autocommit statement and never leaks into a pooled session). A function for the reason
`_CLAIM_FUNCTION` is."""
_OUTCOME = (
    "SELECT * FROM lgr_outcome(ARRAY[%(key)s], ARRAY[%(status)s], ARRAY[%(result)s::jsonb], "
    "%(fences)s::jsonb, {relaxed})"
)
_OUTCOMES = (
    "SELECT * FROM lgr_outcome(%(keys)s::text[], %(statuses)s::text[], %(results)s::jsonb[], "
    "%(fences)s::jsonb, {relaxed})"
)
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
_QUALIFIED = ", ".join(f"l.{name}" for name in COLUMNS.split(", "))
"""`COLUMNS` of the ledger's row ``l``, beside a claim's input row ``i``."""
_DONE_ROW = (
    "NULL::text, NULL::text, NULL::jsonb, 'done'::text, NULL::jsonb, created_at, "
    "NULL::timestamptz, NULL::text, NULL::float8"
)
"""A done sibling's row in a claim: its key and creation time only (read when used)."""

_CLAIM_FUNCTION = f"""
CREATE OR REPLACE FUNCTION lgr_claim(
    p_keys text[], p_tools text[], p_args jsonb[], p_fingerprints text[],
    p_thread text, p_fences jsonb
) RETURNS TABLE (
    lgr_kind text, lgr_for text, key text, tool text, thread_id text, args jsonb,
    status text, result jsonb, created_at timestamptz, updated_at timestamptz,
    fingerprint text, age_s float8
) LANGUAGE plpgsql VOLATILE AS $lgr$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    WITH i AS (
        SELECT * FROM unnest(p_keys, p_tools, p_args, p_fingerprints)
            AS i(key, tool, args, fingerprint)
    ), new AS (
        INSERT INTO lgr_idempotency (key, tool, thread_id, args, fingerprint)
        SELECT i.key, i.tool, p_thread, i.args, i.fingerprint FROM i
        WHERE lgr_fenced(p_thread, p_fences)
        ON CONFLICT (key) DO NOTHING
        RETURNING key
    )
    SELECT 'new'::text, new.key, new.key, {_NO_RECORD} FROM new
    UNION ALL
    SELECT 'sibling'::text, i.key, {_QUALIFIED}, {_AGE} FROM i JOIN lgr_idempotency AS l
    ON l.thread_id = p_thread AND l.fingerprint = i.fingerprint
      AND l.status = 'pending' AND l.key <> i.key
    UNION ALL
    SELECT 'done'::text, i.key, l.key, {_DONE_ROW} FROM i JOIN lgr_idempotency AS l
    ON l.thread_id = p_thread AND l.fingerprint = i.fingerprint AND l.status = 'done';
END
$lgr$
"""
"""A claim: each key's intent unless it exists, with the thread's pending intents
(``sibling``) and done records (``done``) of its fingerprint, one row each, named by
the key they answer (``lgr_for``). The statement's snapshot holds none of its own
intents: as if the claims had run at the same instant, each on its own. Fenced: a
writer whose thread lease was taken over or lapsed gets `ThreadLockLostError`
(SQLSTATE LR001, raised by ``lgr_fenced``) and nothing is written, with no gap
between the check and the write.

A function because PL/pgSQL keeps its statements' plans per server session, which a
transaction pooler leaves alone: sent inline and unprepared (as a pooler requires),
planning added about 80% to this statement's time. A change of its columns needs a
``DROP FUNCTION`` first (``CREATE OR REPLACE`` keeps the result type)."""

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
    _CLAIM_FUNCTION,
    _OUTCOME_FUNCTION,
)
"""The ledger's tables, and the leases its writes are fenced by, in one transaction:
the lock wait capped (`SetupTimeoutError`, never a hang), under the setup lock."""

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
    # exactly-once flow reconciles before a new effect runs), in one round trip, by
    # `_CLAIM_FUNCTION`; for one key, or several of one thread (a step's concurrent
    # claims, sent as one statement by `group_commit`).
    intent_unresolved=(
        "SELECT * FROM lgr_claim(ARRAY[%(key)s], ARRAY[%(tool)s], ARRAY[%(args)s::jsonb], "
        "ARRAY[%(fingerprint)s], %(thread_id)s, %(fences)s::jsonb)"
    ),
    intents_unresolved=(
        "SELECT * FROM lgr_claim(%(keys)s::text[], %(tools)s::text[], %(args)s::jsonb[], "
        "%(fingerprints)s::text[], %(thread_id)s, %(fences)s::jsonb)"
    ),
    get=f"SELECT {COLUMNS}, {_AGE} FROM lgr_idempotency WHERE key = %(key)s",
    # The outcome of a pending intent; first outcome wins (a recorded one is never
    # overwritten), by `_OUTCOME_FUNCTION`; the relaxed variant does not wait for
    # its WAL flush.
    outcome=_OUTCOME.format(relaxed="false"),
    relaxed_outcome=_OUTCOME.format(relaxed="true"),
    outcomes=_OUTCOMES.format(relaxed="false"),
    relaxed_outcomes=_OUTCOMES.format(relaxed="true"),
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
    The claims of one step that come while another of its claims is in flight go
    together as one statement, and so do its outcomes
    (`~langgraph_resilience.stores.group_commit`). Call `setup` once (``open_postgres`` does).

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
