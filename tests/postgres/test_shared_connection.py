"""The ledger on a single connection it shares: a LangGraph saver's, or its own two stores'.

LangGraph's ``from_conn_string`` savers hold ``saver.lock`` around each use of their one
connection, opened with ``prepare_threshold=0`` (every statement prepared), and
``pipeline=True`` keeps it in pipeline mode. The ledger given that lock takes turns
with the saver, prepares nothing and reads its own results at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Any

import psycopg
import pytest
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

from langgraph_resilience.stores.postgres import POSTGRES_CONNECTION_KWARGS as KWARGS
from langgraph_resilience.stores.postgres import JsonTable, Postgres
from langgraph_resilience.stores.postgres_ledger import (
    AsyncPostgresIdempotencyStore,
    AsyncPostgresSagaLog,
    PostgresIdempotencyStore,
    PostgresSagaLog,
)

pytestmark = pytest.mark.postgres

PREPARED_OF_OURS = (
    "SELECT count(*) AS n FROM pg_prepared_statements WHERE statement LIKE '%lgr_%' "
    "AND statement NOT LIKE '%pg_prepared_statements%'"
)


def _claim(store: Any, key: str) -> str:
    return str(store.claim(key, tool="refund", args_json="{}", thread_id="t").state)


def test_the_ledger_waits_for_the_savers_lock(pg_dsn: str) -> None:
    """While the saver holds its lock, a claim on its connection does not start; it
    runs once the saver lets go."""
    with PostgresSaver.from_conn_string(pg_dsn) as saver:
        store = PostgresIdempotencyStore(saver.conn, lock=saver.lock)
        store.setup()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            with saver.lock:
                claimed = pool.submit(_claim, store, "k1")
                done, _ = concurrent.futures.wait([claimed], timeout=0.3)
                assert not done  # a real thread blocked on a real lock
            assert claimed.result(timeout=30) == "new"


@pytest.mark.parametrize("pipeline", [False, True])
def test_a_savers_connection_runs_the_ledger_unprepared(pg_dsn: str, pipeline: bool) -> None:
    """On the saver's connection (every statement prepared, or in pipeline mode) a
    claim, its replay and its outcome read their own results, and none is prepared."""
    with PostgresSaver.from_conn_string(pg_dsn) as plain:
        plain.setup()  # LangGraph's setup cannot run in pipeline mode (CREATE INDEX CONCURRENTLY)
    with PostgresSaver.from_conn_string(pg_dsn, pipeline=pipeline) as saver:
        store = PostgresIdempotencyStore(saver.conn, lock=saver.lock)
        saga = PostgresSagaLog(saver.conn, lock=saver.lock)
        store.setup()
        saga.setup()
        assert _claim(store, "k1") == "new"
        assert _claim(store, "k1") == "pending"
        assert store.record_outcome("k1", {"ok": 1}).status == "done"
        record = store.get("k1")
        assert record is not None
        assert record.result == {"ok": 1}
        saga.append("t", key="k1", tool="refund", action="do", status="done")
        assert [e.key for e in saga.entries("t")] == ["k1"]
        with saver.lock, saver.conn.cursor() as cur:
            cur.execute(PREPARED_OF_OURS, prepare=False)
            row = cur.fetchone()
    assert row == {"n": 0}


@pytest.mark.parametrize("pipeline", [False, True])
def test_an_async_savers_connection_runs_the_ledger(pg_dsn: str, pipeline: bool) -> None:
    """The same on `AsyncPostgresSaver`'s connection, under its asyncio lock."""

    async def scenario() -> dict[str, Any]:
        async with AsyncPostgresSaver.from_conn_string(pg_dsn) as plain:
            await plain.setup()
        async with AsyncPostgresSaver.from_conn_string(pg_dsn, pipeline=pipeline) as saver:
            store = AsyncPostgresIdempotencyStore(saver.conn, lock=saver.lock)
            saga = AsyncPostgresSagaLog(saver.conn, lock=saver.lock)
            await store.setup()
            await saga.setup()
            claims = await asyncio.gather(
                *(store.aclaim(f"k{n}", tool="t", args_json="{}", thread_id="t") for n in range(8))
            )
            assert {c.state for c in claims} == {"new"}
            outcome = await store.arecord_outcome("k1", "ok")
            assert outcome.status == "done"
            await saga.aappend("t", key="k1", tool="refund", action="do", status="done")
            async with saver.lock, saver.conn.cursor() as cur:
                await cur.execute(PREPARED_OF_OURS, prepare=False)
                row: dict[str, Any] = await cur.fetchone() or {}
            return row

    assert asyncio.run(scenario()) == {"n": 0}


def test_stores_on_one_connection_never_run_inside_each_others_transaction(pg_dsn: str) -> None:
    """Given one connection of the user's, every store of the package takes turns on it:
    a claim made while a key -> jsonb table holds a row lock in its transaction (as a
    breaker's change does) waits for that transaction to end instead of joining it
    (and being rolled back with it)."""
    with (
        psycopg.connect(pg_dsn, **KWARGS) as conn,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        store = PostgresIdempotencyStore(conn)
        store.setup()
        table = JsonTable(Postgres(conn, owner="test", is_async=False), "lgr_kv", {})
        table.setup()
        claims: list[concurrent.futures.Future[str]] = []

        def change(state: Any) -> tuple[bool, dict[str, Any]]:
            claims.append(pool.submit(_claim, store, "k1"))
            done, _ = concurrent.futures.wait(claims, timeout=0.3)
            return bool(done), {"n": 1}  # a real thread on a real connection

        claimed_inside = table.change("breaker", change)
        assert not claimed_inside
        assert claims[0].result(timeout=30) == "new"
