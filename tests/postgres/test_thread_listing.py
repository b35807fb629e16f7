"""Listing threads on a large real Postgres database: 1,000 threads x 50 checkpoints.

The database is copies of a real demo thread (`benchmarks/threads_listing.py` builds
it with ``INSERT ... SELECT`` in a few seconds, writes interleaved in a seeded order).
`list_threads` must return every thread, most recently written first, with one
statement; the ``threads`` command one listing statement plus one state read per
thread, never a walk of every checkpoint. The wall-clock target (< 5 s) is measured by
the benchmark script, not asserted here: these count statements instead.
"""

from __future__ import annotations

import asyncio
import io
import json
import pathlib
import re
import sys
from typing import Any

import psycopg
import pytest
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

from langgraph_resilience.cli import main
from langgraph_resilience.stores.persistence import POSTGRES_CONNECTION_KWARGS
from langgraph_resilience.stores.threads import alist_threads, list_threads

ROOT = pathlib.Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.threads_listing import build_database  # noqa: E402

pytestmark = [pytest.mark.postgres]

THREADS = 1000
CHECKPOINTS = 50
READS_CHECKPOINTS = re.compile(r"\bfrom\s+checkpoints\b", re.IGNORECASE)


@pytest.fixture
def large(pg_dsn: str) -> tuple[str, list[str]]:
    """The 1,000 x 50 database and its threads, most recently written first."""
    expected = build_database(pg_dsn, threads=THREADS, checkpoints=CHECKPOINTS, seed=3)
    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute(
            "SELECT count(DISTINCT thread_id), count(*) FROM checkpoints WHERE checkpoint_ns = ''"
        ).fetchone()
    assert row == (THREADS, THREADS * CHECKPOINTS)
    assert len(expected) == THREADS
    assert expected != sorted(expected)  # the write order is not the order of the names
    return pg_dsn, expected


@pytest.fixture
def statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every statement any psycopg cursor (sync or async) executes in this test."""
    seen: list[str] = []
    sync_execute, async_execute = psycopg.Cursor.execute, psycopg.AsyncCursor.execute

    def execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(str(query))
        return sync_execute(self, query, *args, **kwargs)

    async def aexecute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(str(query))
        return await async_execute(self, query, *args, **kwargs)

    def walk(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("walked every checkpoint (checkpointer.list)")

    monkeypatch.setattr(psycopg.Cursor, "execute", execute)
    monkeypatch.setattr(psycopg.AsyncCursor, "execute", aexecute)
    monkeypatch.setattr(PostgresSaver, "list", walk)
    monkeypatch.setattr(AsyncPostgresSaver, "alist", walk)
    return seen


def test_list_threads_and_the_threads_command(
    large: tuple[str, list[str]], statements: list[str]
) -> None:
    """`list_threads` is one statement; ``threads`` one listing statement, then exactly one
    checkpoint read per thread, each of one thread's latest checkpoint. Every thread is
    listed, newest first, as the finished demo thread it is a copy of."""
    dsn, expected = large
    with psycopg.connect(dsn, **POSTGRES_CONNECTION_KWARGS) as conn:
        saver = PostgresSaver(conn)
        statements.clear()
        listed = list_threads(saver)
        assert len(statements) == 1
        assert "GROUP BY thread_id" in statements[0]
        top = list_threads(saver, limit=25)
    assert listed == expected
    assert top == expected[:25]

    statements.clear()
    out, err = io.StringIO(), io.StringIO()
    code = main(["threads", "--json", "--dsn", dsn], stdout=out, stderr=err)

    assert code == 0, err.getvalue()
    rows = json.loads(out.getvalue())["threads"]
    assert [r["thread_id"] for r in rows] == expected
    assert {r["state"] for r in rows} == {"done"}
    assert all(r["demo"] for r in rows)
    reads = [s for s in statements if READS_CHECKPOINTS.search(s)]
    listings = [s for s in reads if "GROUP BY thread_id" in s]
    assert len(listings) == 1
    assert len(reads) == 1 + THREADS
    per_thread = [s for s in reads if s not in listings]
    assert all("WHERE thread_id = %s AND checkpoint_ns = %s" in s for s in per_thread)
    assert all("LIMIT 1" in s for s in per_thread)

    statements.clear()
    out, err = io.StringIO(), io.StringIO()
    code = main(["threads", "--limit", "3", "--dsn", dsn], stdout=out, stderr=err)

    assert code == 0, err.getvalue()
    text = out.getvalue()
    positions = [text.index(thread) for thread in expected[:3]]
    assert positions == sorted(positions)
    assert expected[3] not in text
    assert sum(bool(READS_CHECKPOINTS.search(s)) for s in statements) == 1 + 3


async def test_alist_threads_on_the_async_saver(
    large: tuple[str, list[str]], statements: list[str]
) -> None:
    """AsyncPostgresSaver: the same one statement, awaited; the sync call from another
    thread runs it on the saver's loop, and from the loop itself is refused."""
    dsn, expected = large
    async with await psycopg.AsyncConnection.connect(dsn, **POSTGRES_CONNECTION_KWARGS) as conn:
        saver = AsyncPostgresSaver(conn)
        statements.clear()
        listed = await alist_threads(saver)
        assert len(statements) == 1
        from_a_thread = await asyncio.to_thread(list_threads, saver, limit=5)
        with pytest.raises(asyncio.InvalidStateError, match="alist_threads"):
            list_threads(saver)
        sync_saver_listed = await asyncio.to_thread(_listed_by_sync_saver, dsn)

    assert listed == expected
    assert from_a_thread == expected[:5]
    assert sync_saver_listed == expected[:7]


def _listed_by_sync_saver(dsn: str) -> list[str]:
    with psycopg.connect(dsn, **POSTGRES_CONNECTION_KWARGS) as conn:
        return asyncio.run(alist_threads(PostgresSaver(conn), limit=7))
