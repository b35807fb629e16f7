"""The demo's back office: the tables it keeps next to the checkpoints.

It lives in the same SQLite file or Postgres database as the threads: it logs
every executed side effect (one row per execution: the simulated service does
*not* deduplicate, so the table shows whether anything ran twice), the
supervisors' approvals, and the run log the command uses to explain a thread
across processes.
"""

from __future__ import annotations

import abc
import json
import re
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from psycopg_pool import ConnectionPool

from langgraph_resilience.stores.persistence import Persistence

__all__ = ["DemoStore", "PostgresDemoStore", "SqliteDemoStore", "open_demo_store"]


class DemoStore(abc.ABC):
    """The demo's own tables, next to the checkpoints: effects, approvals, run log.

    ``lgr_demo_effects`` has one row per *execution* of a side effect (no unique
    key: the simulated payment service deduplicates nothing), so counting rows
    per idempotency key proves exactly-once. ``lgr_demo_approvals`` holds the
    supervisors' approvals; ``lgr_demo_events`` the resilience events the command
    streamed, so a thread run by several processes can still be explained.
    """

    target: str = ""

    @abc.abstractmethod
    def _query(self, sql: str, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """Run one statement (``:name`` parameters) and return its rows."""

    @abc.abstractmethod
    def setup(self) -> None:
        """Create the tables if they do not exist."""

    def record_effect(
        self, *, thread_id: str, kind: str, key: str, detail: Mapping[str, Any]
    ) -> int:
        """Log one execution of a side effect; returns its reference number."""
        rows = self._query(
            "INSERT INTO lgr_demo_effects (thread_id, kind, idempotency_key, detail, at) "
            "VALUES (:thread_id, :kind, :key, :detail, :at) RETURNING id",
            {
                "thread_id": thread_id,
                "kind": kind,
                "key": key,
                "detail": json.dumps(dict(detail), sort_keys=True),
                "at": time.time(),
            },
        )
        return int(rows[0]["id"])

    def effect(self, key: str) -> dict[str, Any] | None:
        """The first execution logged under `key` (what a status check asks), or None."""
        rows = self._query(
            f"{_EFFECT_COLUMNS} WHERE idempotency_key = :key ORDER BY id LIMIT 1", {"key": key}
        )
        return _effect_row(rows[0]) if rows else None

    def effects(self, thread_id: str) -> list[dict[str, Any]]:
        """Every execution of a side effect in the thread, oldest first."""
        rows = self._query(
            f"{_EFFECT_COLUMNS} WHERE thread_id = :thread_id ORDER BY id", {"thread_id": thread_id}
        )
        return [_effect_row(row) for row in rows]

    def approve(self, thread_id: str, tool_name: str) -> None:
        """A supervisor approves `tool_name`'s pending request in this thread."""
        self._query(
            "INSERT INTO lgr_demo_approvals (thread_id, tool, at) VALUES (:thread_id, :tool, :at) "
            "ON CONFLICT (thread_id, tool) DO NOTHING",
            {"thread_id": thread_id, "tool": tool_name, "at": time.time()},
        )

    def approved(self, thread_id: str, tool_name: str) -> bool:
        """Has a supervisor approved `tool_name` in this thread?"""
        rows = self._query(
            "SELECT 1 AS ok FROM lgr_demo_approvals WHERE thread_id = :thread_id AND tool = :tool",
            {"thread_id": thread_id, "tool": tool_name},
        )
        return bool(rows)

    def log_events(self, thread_id: str, events: Sequence[Mapping[str, Any]]) -> None:
        """Append streamed resilience events to the thread's run log."""
        for event in events:
            self._query(
                "INSERT INTO lgr_demo_events (thread_id, event) VALUES (:thread_id, :event)",
                {"thread_id": thread_id, "event": json.dumps(dict(event), default=str)},
            )

    def events(self, thread_id: str) -> list[dict[str, Any]]:
        """The thread's run log, oldest first."""
        rows = self._query(
            "SELECT event FROM lgr_demo_events WHERE thread_id = :thread_id ORDER BY id",
            {"thread_id": thread_id},
        )
        return [json.loads(row["event"]) for row in rows]

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections the store owns."""


_EFFECT_COLUMNS = "SELECT id, thread_id, kind, idempotency_key, detail, at FROM lgr_demo_effects"


def _effect_row(row: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": int(row["id"]),
        "thread_id": row["thread_id"],
        "kind": row["kind"],
        "key": row["idempotency_key"],
        "detail": json.loads(row["detail"]),
        "at": float(row["at"]),
    }


_SQLITE_DDL = (
    """CREATE TABLE IF NOT EXISTS lgr_demo_effects (
        id INTEGER PRIMARY KEY AUTOINCREMENT, thread_id TEXT NOT NULL, kind TEXT NOT NULL,
        idempotency_key TEXT NOT NULL, detail TEXT NOT NULL, at REAL NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS lgr_demo_effects_key ON lgr_demo_effects (idempotency_key)",
    """CREATE TABLE IF NOT EXISTS lgr_demo_approvals (
        thread_id TEXT NOT NULL, tool TEXT NOT NULL, at REAL NOT NULL,
        PRIMARY KEY (thread_id, tool))""",
    """CREATE TABLE IF NOT EXISTS lgr_demo_events (
        id INTEGER PRIMARY KEY AUTOINCREMENT, thread_id TEXT NOT NULL, event TEXT NOT NULL)""",
)

_POSTGRES_DDL = (
    """CREATE TABLE IF NOT EXISTS lgr_demo_effects (
        id BIGSERIAL PRIMARY KEY, thread_id TEXT NOT NULL, kind TEXT NOT NULL,
        idempotency_key TEXT NOT NULL, detail TEXT NOT NULL, at DOUBLE PRECISION NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS lgr_demo_effects_key ON lgr_demo_effects (idempotency_key)",
    """CREATE TABLE IF NOT EXISTS lgr_demo_approvals (
        thread_id TEXT NOT NULL, tool TEXT NOT NULL, at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (thread_id, tool))""",
    """CREATE TABLE IF NOT EXISTS lgr_demo_events (
        id BIGSERIAL PRIMARY KEY, thread_id TEXT NOT NULL, event TEXT NOT NULL)""",
)


class SqliteDemoStore(DemoStore):
    """The demo tables in the embedded SQLite file (or ``":memory:"``)."""

    def __init__(self, path: str) -> None:
        self.target = path
        self._conn = sqlite3.connect(
            path, check_same_thread=False, isolation_level=None, timeout=30
        )
        self._conn.row_factory = sqlite3.Row
        self._lock = threading.Lock()

    def _query(self, sql: str, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._conn.execute(sql, dict(params or {})).fetchall()
        return [dict(row) for row in rows]

    def setup(self) -> None:
        for statement in _SQLITE_DDL:
            self._query(statement)

    def close(self) -> None:
        self._conn.close()


_NAMED = re.compile(r"(?<!:):([a-z_]+)")


class PostgresDemoStore(DemoStore):
    """The demo tables in the Postgres database, on the persistence's pool."""

    def __init__(self, pool: ConnectionPool[Any], target: str = "") -> None:
        self.target = target
        self._pool = pool

    def _query(self, sql: str, params: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        with self._pool.connection() as conn, conn.cursor() as cur:
            cur.execute(_NAMED.sub(r"%(\1)s", sql), dict(params or {}))
            rows = cur.fetchall() if cur.description else []
        return [dict(row) for row in rows]

    def setup(self) -> None:
        with self._pool.connection() as conn, conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtextextended('lgr-demo-setup', 0))")
            for statement in _POSTGRES_DDL:
                conn.execute(statement)


@contextmanager
def open_demo_store(persistence: Persistence | None = None) -> Iterator[DemoStore]:
    """The demo tables next to `persistence`'s checkpoints (in memory without one)."""
    store: DemoStore
    if persistence is not None and isinstance(persistence.pool, ConnectionPool):
        store = PostgresDemoStore(persistence.pool, persistence.target)
    elif persistence is not None and persistence.path is not None:
        store = SqliteDemoStore(str(persistence.path))
    else:
        store = SqliteDemoStore(":memory:")
    try:
        store.setup()
        yield store
    finally:
        store.close()
