"""Retention of ``lgr_idempotency`` on real PostgreSQL: `purge` deletes completed rows
older than the retention (by the server's clock, in batches, through the
``updated_at`` index), never a pending one; `list_pending` shows those to an operator.

Rows are aged with ``UPDATE ... SET updated_at = now() - interval``: nothing waits.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
from typing import Any

import psycopg
import pytest
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from langgraph_resilience.core.effects import IdempotencyStore
from langgraph_resilience.stores.persistence import (
    POSTGRES_CONNECTION_KWARGS,
    aopen_postgres,
    open_postgres,
)
from langgraph_resilience.stores.postgres_ledger import (
    AsyncPostgresIdempotencyStore,
    PostgresIdempotencyStore,
)

pytestmark = [pytest.mark.postgres]


def _age(dsn: str, days: float, *keys: str) -> None:
    """Move rows `days` into the past (their intent and their outcome)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE lgr_idempotency SET created_at = created_at - make_interval(days => %s), "
            "updated_at = updated_at - make_interval(days => %s) WHERE key = ANY(%s)",
            (days, days, list(keys)),
        )


def _populate(store: IdempotencyStore) -> None:
    for key in ("old-done", "new-done"):
        store.claim(key, tool="pay", args_json="{}", thread_id="t")
        store.record_outcome(key, {"ok": key})
    store.claim("old-failed", tool="pay", args_json="{}", thread_id="t")
    store.record_outcome("old-failed", {"error": "declined"}, status="failed")
    for key in ("old-pending", "new-pending"):
        store.claim(key, tool="pay", args_json="{}", thread_id="t")


def _keys(store: IdempotencyStore) -> list[str]:
    return sorted(r.key for r in store.for_thread("t"))


def test_purge_keeps_pending_and_recent_rows(pg_dsn: str) -> None:
    with open_postgres(pg_dsn) as p:
        store = p.idempotency
        assert isinstance(store, PostgresIdempotencyStore)
        _populate(store)
        _age(pg_dsn, 31, "old-done", "old-failed", "old-pending")

        assert [r.key for r in p.list_pending(dt.timedelta(days=30))] == ["old-pending"]
        assert [r.key for r in store.list_pending()] == ["old-pending", "new-pending"]
        assert [r.key for r in store.list_pending(limit=1)] == ["old-pending"]
        deleted = p.purge()  # 30 days
        assert store.purge(dt.timedelta(days=30)) == 0  # nothing left to purge
        assert store.purge(3650 * 86_400.0) == 0

        assert deleted == 2
        assert _keys(store) == ["new-done", "new-pending", "old-pending"]
        _age(pg_dsn, 10_000, "old-pending")
        _age(pg_dsn, 2, "new-done")
        assert store.purge(dt.timedelta(days=1)) == 1  # new-done; old-pending stays
        assert _keys(store) == ["new-pending", "old-pending"]
        with pytest.raises(ValueError, match="older_than"):
            store.purge(0)


def test_purge_works_in_batches(pg_dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """More old rows than a batch: all go, one short statement per batch."""
    monkeypatch.setattr("langgraph_resilience.stores.sql._PURGE_BATCH", 4)
    keys = [f"k{n}" for n in range(10)]
    with ConnectionPool(pg_dsn, kwargs=POSTGRES_CONNECTION_KWARGS, min_size=1, max_size=2) as pool:
        store = PostgresIdempotencyStore(pool)
        store.setup()
        for key in keys:
            store.claim(key, tool="pay", args_json="{}", thread_id="t")
            store.record_outcome(key, {"ok": True})
        store.claim("p", tool="pay", args_json="{}", thread_id="t")
        _age(pg_dsn, 40, *keys, "p")
        executed: list[str] = []
        rows = store._rows

        def counted(query: str, params: Any) -> Any:
            executed.append(query)
            return rows(query, params)

        monkeypatch.setattr(store, "_rows", counted)

        assert store.purge() == 10
        assert len(executed) == 3  # 4 + 4 + 2
    assert _keys_of(pg_dsn) == ["p"]


def _keys_of(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        return [r[0] for r in conn.execute("SELECT key FROM lgr_idempotency ORDER BY key")]


def test_purge_is_an_index_scan_on_updated_at(pg_dsn: str) -> None:
    """setup() creates the partial index the purge's batch query is planned on."""
    with open_postgres(pg_dsn) as p:
        p.purge()
    with psycopg.connect(pg_dsn) as conn:
        conn.execute("SET enable_seqscan = off")
        plan = "\n".join(
            r[0]
            for r in conn.execute(
                "EXPLAIN SELECT key FROM lgr_idempotency WHERE status IN ('done', 'failed') "
                "AND updated_at < now() - make_interval(secs => 2592000.0) "
                "ORDER BY updated_at LIMIT 10000 FOR UPDATE SKIP LOCKED"
            )
        )
        indexes = {
            r[0]
            for r in conn.execute(
                "SELECT indexname FROM pg_indexes WHERE tablename = 'lgr_idempotency'"
            )
        }
    assert "lgr_idempotency_completed_idx" in indexes
    assert "lgr_idempotency_completed_idx" in plan


async def test_the_async_store_purges_and_lists_pending(pg_dsn: str) -> None:
    async with aopen_postgres(pg_dsn) as p:
        store = p.idempotency
        assert isinstance(store, AsyncPostgresIdempotencyStore)
        for key in ("done", "pending"):
            await store.aclaim(key, tool="pay", args_json="{}", thread_id="t")
        await store.arecord_outcome("done", {"ok": 1})
        _age(pg_dsn, 45, "done", "pending")

        pending = await p.alist_pending(dt.timedelta(days=44))
        deleted = await p.apurge(dt.timedelta(days=30))
        left = [r.key for r in await store.afor_thread("t")]

    assert [r.key for r in pending] == ["pending"]
    assert deleted == 1
    assert left == ["pending"]


def test_the_async_store_sync_twins(pg_dsn: str) -> None:
    """From a thread that is not the pool's loop, the sync twins forward to it."""
    results: dict[str, Any] = {}

    async def main() -> None:
        async with AsyncConnectionPool(
            pg_dsn, kwargs=POSTGRES_CONNECTION_KWARGS, min_size=1, max_size=2
        ) as pool:
            store = AsyncPostgresIdempotencyStore(pool)
            await store.setup()
            await store.aclaim("p", tool="pay", args_json="{}", thread_id="t")

            def other_thread() -> None:
                results["pending"] = [r.key for r in store.list_pending()]
                results["purged"] = store.purge()

            worker = threading.Thread(target=other_thread)
            worker.start()
            await asyncio.to_thread(worker.join)

    asyncio.run(main())
    assert results == {"pending": ["p"], "purged": 0}
