"""The stale-intent rule on real PostgreSQL (`settle_stale`): a pending intent of a thread
that no longer exists, or one older than the pending TTL, is settled with an
``IntentAbandoned`` result whose outcome is unknown; a young intent of a living thread
is left to its thread, and a thread the client cannot see is not judged unless it sees
every thread of the ledger.

Rows are aged with ``UPDATE ... SET created_at = now() - interval``: nothing waits.
"""

from __future__ import annotations

import datetime as dt
import uuid

import psycopg
import pytest
from langgraph.graph import START, MessagesState, StateGraph

from langgraph_resilience import open_postgres
from langgraph_resilience.stores import asettle_stale, settle_stale
from langgraph_resilience.stores.persistence import Persistence, aopen_postgres

pytestmark = [pytest.mark.postgres]


def _age(dsn: str, minutes: float, key: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE lgr_idempotency SET created_at = created_at - make_interval(mins => %s) "
            "WHERE key = %s",
            (minutes, key),
        )


def _checkpoint(p: Persistence, thread_id: str) -> None:
    """A thread that exists: one checkpoint of a real graph."""
    builder = StateGraph(MessagesState)
    builder.add_node("noop", lambda state: {})
    builder.add_edge(START, "noop")
    app = builder.compile(checkpointer=p.checkpointer)
    app.invoke({"messages": []}, {"configurable": {"thread_id": thread_id}})


def test_gone_threads_and_expired_intents_are_settled_never_released(pg_dsn: str) -> None:
    with open_postgres(pg_dsn) as p:
        living, gone = "t-living-" + uuid.uuid4().hex[:6], "t-gone-" + uuid.uuid4().hex[:6]
        _checkpoint(p, living)
        ledger = p.idempotency
        for key, thread in (("k-young", living), ("k-gone", gone), ("k-old", living)):
            ledger.claim(key, tool="refund", args_json="{}", thread_id=thread)
        _age(pg_dsn, 10, "k-gone")
        _age(pg_dsn, 60 * 24 * 31, "k-old")

        visible = settle_stale(ledger, p.checkpointer)  # another server's thread? not judged
        assert [(s.key, s.reason) for s in visible] == [("k-old", "expired")]
        gone_too = settle_stale(ledger, p.checkpointer, sees_all=True)
        assert [(s.key, s.reason) for s in gone_too] == [("k-gone", "thread_gone")]
        assert [r.key for r in ledger.list_pending()] == ["k-young"]
        record = ledger.get("k-gone")
        assert record is not None
        assert record.status == "failed"
        assert record.result["type"] == "IntentAbandoned"
        assert record.result["outcome"] == "unknown"
        # never released: a replay of that call finds the outcome, it does not run again
        assert ledger.claim("k-gone", tool="refund", args_json="{}", thread_id=gone).state == "done"
        assert settle_stale(ledger, p.checkpointer, sees_all=True) == []  # nothing left


async def test_the_async_twin_with_a_thread_predicate(pg_dsn: str) -> None:
    async with aopen_postgres(pg_dsn) as p:
        ledger = p.idempotency
        await ledger.aclaim("k-1", tool="refund", args_json="{}", thread_id="t-1")
        _age(pg_dsn, 10, "k-1")
        assert await asettle_stale(ledger, lambda thread: True) == []  # living, young
        assert await asettle_stale(ledger, lambda thread: False) == []  # not its to judge
        settled = await asettle_stale(
            ledger, lambda thread: False, grace=dt.timedelta(minutes=5), sees_all=True
        )
        assert [(s.key, s.thread_id, s.reason) for s in settled] == [("k-1", "t-1", "thread_gone")]
        assert await ledger.alist_pending() == []
