"""The Postgres side-effect path near one durable write, on the real server: the claim
that also returns the unresolved intents, and the outcome deferred off the answer."""

from __future__ import annotations

import asyncio
import pathlib
import signal
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from langchain_core.tools import tool
from langgraph.checkpoint.postgres import PostgresSaver
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from langgraph_resilience import ToolProfile
from langgraph_resilience.stores.persistence import POSTGRES_CONNECTION_KWARGS
from langgraph_resilience.stores.postgres_ledger import (
    AsyncPostgresIdempotencyStore,
    PostgresIdempotencyStore,
    PostgresSagaLog,
)
from langgraph_resilience.testing import FakeClock, text
from langgraph_resilience.testing import tool_calls as calls
from tests.conftest import build_graph
from tests.postgres.processes import finish, spawn

WORKER = pathlib.Path(__file__).with_name("deferred_outcome_worker.py")

pytestmark = pytest.mark.postgres


@pytest.fixture
def pool(pg_dsn: str) -> Iterator[ConnectionPool[Any]]:
    with ConnectionPool(
        pg_dsn, min_size=1, max_size=8, kwargs=POSTGRES_CONNECTION_KWARGS, open=True
    ) as pool:
        PostgresIdempotencyStore(pool).setup()
        PostgresSagaLog(pool).setup()
        PostgresSaver(pool).setup()
        yield pool


def _claim(store: PostgresIdempotencyStore, key: str, thread: str = "t", fp: str = "F") -> Any:
    return store.claim(key, tool="pay", args_json='{"a":1}', thread_id=thread, fingerprint=fp)


def test_the_claim_returns_the_unresolved_intents_of_its_effect(
    pool: ConnectionPool[Any],
) -> None:
    """A new claim carries the thread's other pending intents of the same fingerprint,
    oldest first (what `unresolved` returns), never its own, nor done or other ones."""
    store = PostgresIdempotencyStore(pool)
    assert _claim(store, "k1").unresolved == ()
    _claim(store, "k2")
    _claim(store, "other-thread", thread="u")
    _claim(store, "other-effect", fp="G")
    _claim(store, "k3")
    store.record_outcome("k3", "ok")
    claim = _claim(store, "k4")
    assert claim.state == "new"
    assert claim.unresolved is not None
    assert [r.key for r in claim.unresolved] == ["k1", "k2"]
    assert [r.key for r in claim.unresolved] == [r.key for r in store.unresolved("t", "F")][:2]
    assert all(r.age_s is not None and r.status == "pending" for r in claim.unresolved)
    replay = _claim(store, "k4")
    assert (replay.state, replay.unresolved) == ("pending", None)  # read, not looked up


def test_a_read_in_this_process_waits_for_the_deferred_outcome(
    pool: ConnectionPool[Any],
) -> None:
    """While an outcome is queued, a claim of its key (a replay in this process) waits
    for the write and sees it done; another process's store sees it only once written."""
    assert PostgresIdempotencyStore(pool)._behind is None  # awaited by default
    store = PostgresIdempotencyStore(pool, deferred_outcomes=True)
    behind = store._behind
    assert behind is not None
    write, release, order = behind._write, threading.Event(), []

    def held(key: str, result: Any, status: Any) -> None:
        release.wait(30)
        write(key, result, status)
        order.append("written")

    behind._write = held
    _claim(store, "pay-1")
    store.defer_outcome("pay-1", {"id": 7}, thread_id="t")
    assert PostgresIdempotencyStore(pool, deferred_outcomes=False).get("pay-1").status == "pending"
    replay: list[Any] = []
    reader = threading.Thread(target=lambda: replay.append(_claim(store, "pay-1")))
    reader.start()
    release.set()
    reader.join(30)
    order.append(f"claimed {replay[0].state}")
    assert order == ["written", "claimed done"]
    assert replay[0].result == {"id": 7}
    assert store.flush(timeout=30)


def test_reads_of_the_thread_wait_and_unrelated_ones_do_not(pool: ConnectionPool[Any]) -> None:
    """`for_thread` and `unresolved` of the outcome's effect wait for it; a read of
    another thread's key, or a claim of another effect of the thread, does not."""
    store = PostgresIdempotencyStore(pool, deferred_outcomes=True)
    behind = store._behind
    assert behind is not None
    write, release = behind._write, threading.Event()
    behind._write = lambda *a: (release.wait(30), write(*a))
    _claim(store, "a-1")
    _claim(store, "b-1", thread="b")
    store.defer_outcome("a-1", "ok", thread_id="t", fingerprint="F")
    assert store.get("b-1").status == "pending"  # answered while a-1 is still queued
    assert _claim(store, "a-2", fp="G").unresolved == ()  # another effect of the thread
    assert behind.holds("a-1", None)
    release.set()
    assert [(r.key, r.status) for r in store.for_thread("t")] == [
        ("a-1", "done"),
        ("a-2", "pending"),
    ]
    assert store.unresolved("t", "F") == []


def test_a_sync_graph_answers_and_the_outcome_lands(pool: ConnectionPool[Any]) -> None:
    """A side-effecting call on the sync and the async path: one payment, the answer,
    and the ledger's record done (the deferred write is waited for by the read)."""
    store = PostgresIdempotencyStore(pool, deferred_outcomes=True)
    paid: list[int] = []

    @tool
    def pay(amount: int) -> str:
        """Pay."""
        paid.append(amount)
        return f"paid {amount}"

    for mode in ("sync", "async"):
        h = build_graph(
            [pay],
            [calls(("pay", {"amount": 5})), text("done")],
            profiles={"pay": ToolProfile(side_effect=True)},
            checkpointer=PostgresSaver(pool) if mode == "sync" else None,
            options={"idempotency": store, "saga": PostgresSagaLog(pool)},
            clock=FakeClock(),
        )
        config = h.config()
        if mode == "sync":
            h.app.invoke({"messages": [("user", "pay 5")]}, config)
        else:
            asyncio.run(h.app.ainvoke({"messages": [("user", "pay 5")]}, config))
        thread = config["configurable"]["thread_id"]
        assert [r.status for r in store.for_thread(thread)] == ["done"]
    assert paid == [5, 5]


def _payments(dsn: str) -> list[tuple[str, int]]:
    with psycopg.connect(dsn) as conn:
        return [(k, a) for k, a in conn.execute("SELECT key, amount FROM payments").fetchall()]


@pytest.mark.slow
def test_a_kill_between_the_effect_and_its_deferred_outcome(
    pg_dsn: str, pool: ConnectionPool[Any], tmp_path: pathlib.Path
) -> None:
    """The process is SIGKILLed after the payment, as its outcome would be written (and
    before the step is checkpointed): the intent is left pending, and a resume in a new
    process reconciles it through status_check instead of paying again."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE payments (id serial PRIMARY KEY, key text, amount int)")
    thread, marker = uuid.uuid4().hex, tmp_path / "marker"
    common = ["--dsn", pg_dsn, "--thread", thread, "--marker", str(marker)]
    first = spawn(WORKER, "start", *common, killed=True)
    assert first.wait(timeout=90) == -signal.SIGKILL
    key = marker.read_text()
    assert _payments(pg_dsn) == [(key, 30)]
    record = PostgresIdempotencyStore(pool, deferred_outcomes=False).get(key)
    assert record is not None
    assert record.status == "pending"

    result = finish(spawn(WORKER, "resume", *common))

    assert result == {"last": "paid"}
    assert _payments(pg_dsn) == [(key, 30)]  # not paid again
    record = PostgresIdempotencyStore(pool).get(key)
    assert record is not None
    assert (record.status, record.result) == ("done", "reconciled 30")  # by status_check


def test_the_async_store_defers_to_a_task_and_its_reads_wait(pg_dsn: str) -> None:
    """Asked to defer, the async store writes an outcome in a task on its loop: a claim
    of the key in this process waits for it (done), aflush waits for every one."""

    async def scenario() -> tuple[str, str, str]:
        async with AsyncConnectionPool(
            pg_dsn, min_size=1, max_size=4, kwargs=POSTGRES_CONNECTION_KWARGS, open=False
        ) as pool:
            store = AsyncPostgresIdempotencyStore(pool, deferred_outcomes=True)
            await store.setup()
            assert AsyncPostgresIdempotencyStore(pool)._tasks is None  # awaited by default
            kwargs = {"tool": "pay", "args_json": "{}", "thread_id": "t", "fingerprint": "F"}
            await store.aclaim("k1", **kwargs)
            await store.adefer_outcome("k1", "ok", thread_id="t", fingerprint="F")
            tasks = store._tasks
            assert tasks is not None
            assert tasks.matching("k1", None)  # handed over, not written yet
            replay = await store.aclaim("k1", **kwargs)
            await store.aclaim("k2", **kwargs)
            await store.adefer_outcome("k2", "ok", thread_id="t", fingerprint="F")
            await store.aflush()
            other = AsyncPostgresIdempotencyStore(pool, deferred_outcomes=False)
            record = await other.aget("k2")
            assert record is not None
            return replay.state, str(replay.result), record.status

    assert asyncio.run(scenario()) == ("done", "ok", "done")
