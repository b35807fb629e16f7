"""A Ctrl-C that lands while a ledger statement is in flight stops the run as the
interrupt it is, sync and async, on the real server: the rollback that follows fails
(the connection is still busy with the statement) and must not replace it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from langgraph_resilience.core.flow import Call, Flow
from langgraph_resilience.stores.persistence import POSTGRES_CONNECTION_KWARGS
from langgraph_resilience.stores.postgres import Postgres

pytestmark = [pytest.mark.postgres]


def _interrupted(cur: Any) -> None:
    cur.connection.pgconn.send_query(b"SELECT pg_sleep(0.2)")  # the statement went out
    raise KeyboardInterrupt  # and Ctrl-C landed before its answer was read


def _work(cur: Any) -> Flow[None]:
    yield Call(_interrupted, None, (cur,))


async def _awork(cur: Any) -> None:
    _interrupted(cur)


def _still_works(pool: ConnectionPool[Any]) -> None:
    with pool.connection() as conn:
        assert conn.execute("SELECT 1 AS one").fetchone() == {"one": 1}


@pytest.fixture
def pool(pg_dsn: str) -> Iterator[ConnectionPool[Any]]:
    with ConnectionPool(pg_dsn, min_size=1, max_size=1, kwargs=POSTGRES_CONNECTION_KWARGS) as pool:
        yield pool


def test_an_interrupt_during_a_statement_stays_an_interrupt(pool: ConnectionPool[Any]) -> None:
    with pytest.raises(KeyboardInterrupt):
        Postgres(pool, owner="test", is_async=False).run(_work)
    _still_works(pool)  # the busy connection was replaced


async def test_an_interrupt_during_an_async_statement_stays_an_interrupt(pg_dsn: str) -> None:
    async with AsyncConnectionPool(
        pg_dsn, min_size=1, max_size=1, kwargs=POSTGRES_CONNECTION_KWARGS
    ) as pool:
        runner = Postgres(pool, owner="test", is_async=True)

        def work(cur: Any) -> Flow[None]:
            yield Call(_interrupted, _awork, (cur,))

        with pytest.raises(KeyboardInterrupt):
            await runner.arun(work)
        async with pool.connection() as conn:
            cur = await conn.execute("SELECT 1 AS one")
            assert await cur.fetchone() == {"one": 1}
        await asyncio.sleep(0)
