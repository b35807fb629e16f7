"""SQLite: the embedded default's ledger and saga log, in the same file as the checkpoints.

The ledger's logic is `langgraph_resilience.stores.sql`'s, run over `Sqlite` (one
autocommit ``sqlite3`` connection, timestamps from the store's `Clock`). A single
SQLite statement is atomic, also across processes sharing the file, so claims are
exclusive.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from collections.abc import Mapping
from typing import Any

from langgraph_resilience.core.clock import Clock, SystemClock
from langgraph_resilience.core.effects import IdempotencyRecord, SagaEntry
from langgraph_resilience.stores.saga import SAGA_COLUMNS, SagaDialect, SqlSagaLog
from langgraph_resilience.stores.sql import (
    COLUMNS,
    LedgerDialect,
    SqlIdempotencyStore,
)
from langgraph_resilience.stores.values import utc

__all__ = ["Sqlite", "SqliteIdempotencyStore", "SqliteSagaLog", "sqlite_connect"]

_DDL = (
    """
    CREATE TABLE IF NOT EXISTS lgr_idempotency (
        key TEXT PRIMARY KEY,
        tool TEXT,
        thread_id TEXT,
        args TEXT,
        status TEXT NOT NULL DEFAULT 'pending'
            CHECK (status IN ('pending', 'done', 'failed')),
        result TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        fingerprint TEXT
    )
    """,
    "CREATE INDEX IF NOT EXISTS lgr_idempotency_thread_idx ON lgr_idempotency (thread_id)",
    """
    CREATE TABLE IF NOT EXISTS lgr_saga (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        thread_id TEXT NOT NULL,
        key TEXT NOT NULL,
        tool TEXT NOT NULL,
        action TEXT NOT NULL,
        status TEXT NOT NULL,
        detail TEXT,
        at REAL NOT NULL
    )
    """,
    "CREATE INDEX IF NOT EXISTS lgr_saga_thread_idx ON lgr_saga (thread_id, seq)",
)
_INDEXES = (
    "CREATE INDEX IF NOT EXISTS lgr_idempotency_unresolved_idx "
    "ON lgr_idempotency (thread_id, fingerprint) WHERE status = 'pending'",
    "CREATE INDEX IF NOT EXISTS lgr_idempotency_done_idx "
    "ON lgr_idempotency (thread_id, fingerprint) WHERE status = 'done'",
    "CREATE INDEX IF NOT EXISTS lgr_idempotency_completed_idx "
    "ON lgr_idempotency (updated_at) WHERE status IN ('done', 'failed')",
)
"""Created after the ``fingerprint`` column is sure to exist (an older file lacks it)."""


def sqlite_connect(path: str) -> sqlite3.Connection:
    """A connection of our own to a SQLite state file: autocommit, WAL, shared by threads."""
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=30)
    conn.execute("PRAGMA journal_mode=WAL")
    return conn


def _json(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _record_of(row: sqlite3.Row) -> IdempotencyRecord:
    return IdempotencyRecord(
        key=row["key"],
        status=row["status"],
        result=_json(row["result"]),
        tool=row["tool"],
        thread_id=row["thread_id"],
        args=_json(row["args"]),
        created_at=utc(row["created_at"]),
        updated_at=utc(row["updated_at"]),
        fingerprint=row["fingerprint"],
    )


def _entry_of(row: sqlite3.Row) -> SagaEntry:
    fields = (row["thread_id"], row["key"], row["tool"], row["action"], row["status"])
    return SagaEntry(int(row["seq"]), *fields, _json(row["detail"]), utc(row["at"]))


_RECORD = """
INSERT INTO lgr_idempotency (key, status, result, created_at, updated_at)
VALUES (:key, :status, :result, :now, :now)
ON CONFLICT (key) DO UPDATE
    SET status = excluded.status, result = excluded.result, updated_at = excluded.updated_at
    WHERE lgr_idempotency.status = 'pending'
RETURNING key
"""
"""SQLite's outcome statement is an upsert: it also inserts a key with no intent."""

DIALECT = LedgerDialect(
    intent="""
        INSERT INTO lgr_idempotency
            (key, tool, thread_id, args, status, created_at, updated_at, fingerprint)
        VALUES (:key, :tool, :thread_id, :args, 'pending', :now, :now, :fingerprint)
        ON CONFLICT (key) DO NOTHING
        RETURNING key
    """,
    get=f"SELECT {COLUMNS} FROM lgr_idempotency WHERE key = :key",
    outcome=_RECORD,
    relaxed_outcome=_RECORD,
    outcome_insert=None,
    unresolved=(
        f"SELECT {COLUMNS} FROM lgr_idempotency WHERE thread_id = :thread_id "
        "AND fingerprint = :fingerprint AND status = 'pending' ORDER BY created_at, key"
    ),
    done_keys=(
        "SELECT key FROM lgr_idempotency WHERE thread_id = :thread_id "
        "AND fingerprint = :fingerprint AND status = 'done' ORDER BY created_at DESC, key DESC"
    ),
    for_thread=(
        f"SELECT {COLUMNS} FROM lgr_idempotency WHERE thread_id = :thread_id "
        "ORDER BY created_at, key"
    ),
    release="DELETE FROM lgr_idempotency WHERE key = :key AND status <> 'done' RETURNING key",
    purge="""
        DELETE FROM lgr_idempotency
        WHERE key IN (
            SELECT key FROM lgr_idempotency
            WHERE status IN ('done', 'failed') AND updated_at < :now - :seconds
            ORDER BY updated_at
            LIMIT :batch
        )
        AND status IN ('done', 'failed')
        RETURNING 1
    """,
    list_pending=(
        f"SELECT {COLUMNS} FROM lgr_idempotency WHERE status = 'pending' "
        "AND created_at <= :now - :seconds ORDER BY created_at, key "
        "LIMIT coalesce(:limit, -1)"
    ),
    record_of=_record_of,
    purged=len,
)
"""The ledger's statements on SQLite (the store's clock: ``:now``)."""

SAGA_DIALECT = SagaDialect(
    append=f"""
        INSERT INTO lgr_saga (thread_id, key, tool, action, status, detail, at)
        VALUES (:thread_id, :key, :tool, :action, :status, :detail, :now)
        RETURNING {SAGA_COLUMNS}
    """,
    entries=f"SELECT {SAGA_COLUMNS} FROM lgr_saga WHERE thread_id = :thread_id ORDER BY seq",
    entry_of=_entry_of,
)


class Sqlite:
    """One sqlite3 connection (autocommit) used one statement at a time; every
    statement gets ``now`` from the clock. Async calls run in a worker thread."""

    def __init__(self, conn: sqlite3.Connection, *, clock: Clock | None = None) -> None:
        conn.row_factory = sqlite3.Row
        self.conn = conn
        self._clock = clock or SystemClock()
        self._lock = threading.Lock()

    def setup(self) -> None:
        """Create the ledger and saga tables if they do not exist (and add the
        ``fingerprint`` column to a ledger made by an earlier version)."""
        with self._lock:
            for statement in _DDL:
                self.conn.execute(statement)
            columns = {row[1] for row in self.conn.execute("PRAGMA table_info(lgr_idempotency)")}
            if "fingerprint" not in columns:
                self.conn.execute("ALTER TABLE lgr_idempotency ADD COLUMN fingerprint TEXT")
            for statement in _INDEXES:
                self.conn.execute(statement)

    def rows(self, query: str, params: Mapping[str, Any]) -> list[sqlite3.Row]:
        """Run one statement (committed); its rows."""
        with self._lock:
            cursor = self.conn.execute(query, {**params, "now": self._clock.time()})
            rows = cursor.fetchall()
            if self.conn.in_transaction:
                self.conn.commit()
            return rows

    async def arows(self, query: str, params: Mapping[str, Any]) -> list[sqlite3.Row]:
        """Async `rows`, in a worker thread."""
        return await asyncio.to_thread(self.rows, query, params)


class SqliteIdempotencyStore(SqlIdempotencyStore):
    """The ledger in the embedded SQLite file (``INSERT ... ON CONFLICT DO NOTHING``).

    A single SQLite statement is atomic, also across processes sharing the file,
    so claims are exclusive. Give it its own connection (``isolation_level=None``,
    ``check_same_thread=False``): `open_sqlite` does. Async methods run in a
    worker thread; `purge` and `list_pending` measure age by the store's clock.
    """

    def __init__(self, conn: sqlite3.Connection, *, clock: Clock | None = None) -> None:
        self._sqlite = Sqlite(conn, clock=clock)
        self.conn = conn
        super().__init__(self._sqlite, DIALECT, relaxed=False)

    def setup(self) -> None:
        """Create the ledger and saga tables if they do not exist."""
        self._sqlite.setup()

    async def asetup(self) -> None:
        """Async `setup`, in a worker thread."""
        await asyncio.to_thread(self._sqlite.setup)


class SqliteSagaLog(SqlSagaLog):
    """The saga log in the embedded SQLite file (append-only)."""

    def __init__(self, conn: sqlite3.Connection, *, clock: Clock | None = None) -> None:
        self._sqlite = Sqlite(conn, clock=clock)
        self.conn = conn
        super().__init__(self._sqlite, SAGA_DIALECT)

    def setup(self) -> None:
        """Create the ledger and saga tables if they do not exist."""
        self._sqlite.setup()

    async def asetup(self) -> None:
        """Async `setup`, in a worker thread."""
        await asyncio.to_thread(self._sqlite.setup)
