"""Persistence helpers: a correctly configured checkpointer and store, in one call.

`open_sqlite(path)` is the embedded default (no server; a thread still resumes
across processes). `open_postgres(dsn)` is production: one connection pool
shared by LangGraph's `PostgresSaver` and `PostgresStore`, configured the way
they require (autocommit, ``prepare_threshold=0``, dict rows), with every
``setup()`` run once. Both yield a `Persistence`, so compiling is::

    with open_postgres(dsn) as p:
        app = builder.compile(checkpointer=p.checkpointer, store=p.store)
"""

from __future__ import annotations

import contextlib
import dataclasses
import pathlib
import sqlite3
from collections.abc import Iterator
from typing import Any

import psycopg
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.store.base import BaseStore
from langgraph.store.postgres import PostgresStore
from langgraph.store.sqlite import SqliteStore
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool, PoolTimeout

from langgraph_resilience.errors import ResilienceError
from langgraph_resilience.redaction import redact

__all__ = ["Persistence", "PersistenceError", "open_postgres", "open_sqlite"]


class PersistenceError(ResilienceError):
    """The checkpointer or store could not be opened; the message names the target
    with any password redacted."""


@dataclasses.dataclass(frozen=True, slots=True)
class Persistence:
    """A checkpointer and a store that belong together (and, for Postgres, their pool)."""

    checkpointer: BaseCheckpointSaver[Any]
    store: BaseStore
    pool: ConnectionPool[Any] | None = None
    target: str = ""
    """Where the data lives: a file path or a redacted DSN, for messages."""


POSTGRES_CONNECTION_KWARGS: dict[str, Any] = {
    "autocommit": True,
    "prepare_threshold": 0,
    "row_factory": dict_row,
}
"""What LangGraph's Postgres saver and store require of every connection."""


@contextlib.contextmanager
def open_sqlite(path: str | pathlib.Path) -> Iterator[Persistence]:
    """Open (and create) an embedded SQLite checkpointer and store in one file."""
    file = pathlib.Path(path)
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(str(file), check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
    except (OSError, sqlite3.Error) as exc:
        raise PersistenceError(
            f"cannot open SQLite state file {str(file)!r}: {exc}; "
            "choose a writable path (e.g. --state-dir)"
        ) from exc
    try:
        checkpointer = SqliteSaver(conn)
        checkpointer.setup()
        store = SqliteStore(conn)
        store.setup()
        yield Persistence(checkpointer=checkpointer, store=store, target=str(file))
    except sqlite3.Error as exc:
        raise PersistenceError(f"SQLite state file {str(file)!r} is unusable: {exc}") from exc
    finally:
        conn.close()


@contextlib.contextmanager
def open_postgres(
    dsn: str, *, min_size: int = 1, max_size: int = 10, timeout: float = 10.0
) -> Iterator[Persistence]:
    """Open a pool on `dsn`, a `PostgresSaver` and a `PostgresStore`, run their setup."""
    shown = redact(dsn)
    try:  # one direct probe: fails fast with the server's reason, where a pool would retry
        psycopg.connect(dsn, connect_timeout=max(1, int(timeout))).close()
    except psycopg.Error as exc:
        reason = redact(str(exc)).strip().splitlines()[0]
        raise PersistenceError(f"cannot connect to PostgreSQL at {shown}: {reason}") from None
    pool: ConnectionPool[Any] = ConnectionPool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        kwargs=POSTGRES_CONNECTION_KWARGS,
        open=False,
        name="langgraph-resilience",
    )
    try:
        pool.open(wait=True, timeout=timeout)
        checkpointer = PostgresSaver(pool)
        checkpointer.setup()
        store = PostgresStore(pool)
        store.setup()
    # `from None`: the driver's own exception may quote the DSN, password included.
    except PoolTimeout:
        pool.close()
        raise PersistenceError(
            f"cannot connect to PostgreSQL at {shown} within {timeout:g}s; "
            "check host, port, database and credentials"
        ) from None
    except (psycopg.Error, OSError) as exc:
        pool.close()
        raise PersistenceError(
            f"cannot open PostgreSQL at {shown}: {redact(str(exc)).strip().splitlines()[0]}"
        ) from None
    try:
        yield Persistence(checkpointer=checkpointer, store=store, pool=pool, target=shown)
    finally:
        pool.close()
