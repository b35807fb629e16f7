"""Retention of the idempotency ledger (embedded backends) and the bounded in-memory ledger.

Only completed records (``done``/``failed``) ever go, by age of their outcome or,
in memory, by LRU over `max_entries` / past `ttl`; a ``pending`` record (outcome
UNKNOWN) is never deleted, whatever its age. Time is a `FakeClock`: nothing sleeps.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import pathlib
import sqlite3
from collections.abc import Iterator

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.constants import CONFIG_KEY_CHECKPOINTER

from langgraph_resilience.core.effects import DEFAULT_RETENTION, IdempotencyStore
from langgraph_resilience.stores.effect_ledger import LedgerResolver
from langgraph_resilience.stores.memory import SWEEP_EVERY, InMemoryIdempotencyStore
from langgraph_resilience.stores.persistence import Persistence, open_sqlite
from langgraph_resilience.stores.postgres_ledger import (
    AsyncPostgresIdempotencyStore,
    PostgresIdempotencyStore,
)
from langgraph_resilience.stores.sqlite import SqliteIdempotencyStore
from langgraph_resilience.testing import FakeClock

DAY = 86_400.0


class Ledger:
    """A fresh embedded ledger on a fake clock."""

    def __init__(self, store: IdempotencyStore, clock: FakeClock) -> None:
        self.store = store
        self.clock = clock

    def done(self, key: str, thread_id: str = "t") -> None:
        self.store.claim(key, tool="pay", args_json="{}", thread_id=thread_id)
        self.store.record_outcome(key, {"ok": key})

    def failed(self, key: str) -> None:
        self.store.claim(key, tool="pay", args_json="{}", thread_id="t")
        self.store.record_outcome(key, {"error": "declined"}, status="failed")

    def pending(self, key: str) -> None:
        self.store.claim(key, tool="pay", args_json="{}", thread_id="t")


@pytest.fixture(params=["memory", "sqlite"])
def ledger(request: pytest.FixtureRequest, tmp_path: pathlib.Path) -> Iterator[Ledger]:
    clock = FakeClock()
    if request.param == "memory":
        yield Ledger(InMemoryIdempotencyStore(clock=clock), clock)
        return
    conn = sqlite3.connect(
        tmp_path / "ledger.sqlite", isolation_level=None, check_same_thread=False
    )
    store = SqliteIdempotencyStore(conn, clock=clock)
    store.setup()
    yield Ledger(store, clock)
    conn.close()


def test_every_backend_still_implements_the_protocol() -> None:
    """The protocol gained purge/list_pending (+ async twins): every backend has them."""
    for name in ("purge", "apurge", "list_pending", "alist_pending"):
        assert hasattr(IdempotencyStore, name)
        for backend in (
            InMemoryIdempotencyStore,
            SqliteIdempotencyStore,
            PostgresIdempotencyStore,
            AsyncPostgresIdempotencyStore,
        ):
            assert callable(getattr(backend, name)), (backend.__name__, name)
    assert isinstance(InMemoryIdempotencyStore(), IdempotencyStore)
    assert dt.timedelta(days=30) == DEFAULT_RETENTION


def test_purge_deletes_only_completed_records_older_than_the_retention(ledger: Ledger) -> None:
    """Old done and failed records go; an old pending one and recent ones stay."""
    ledger.done("old-done")
    ledger.failed("old-failed")
    ledger.pending("old-pending")
    ledger.clock.advance(31 * DAY)
    ledger.done("new-done")

    deleted = ledger.store.purge(dt.timedelta(days=30))

    assert deleted == 2
    assert ledger.store.get("old-done") is None
    assert ledger.store.get("old-failed") is None
    assert ledger.store.get("new-done") is not None
    pending = ledger.store.get("old-pending")
    assert pending is not None
    assert pending.status == "pending"


def test_purge_defaults_to_thirty_days_and_never_touches_pending(ledger: Ledger) -> None:
    """The default keeps a 29-day-old outcome; no age ever purges a pending intent."""
    ledger.done("a")
    ledger.pending("p")
    ledger.clock.advance(29 * DAY)
    assert ledger.store.purge() == 0
    ledger.clock.advance(2 * DAY)
    assert ledger.store.purge() == 1
    ledger.clock.advance(3650 * DAY)
    assert ledger.store.purge(1.0) == 0
    assert [r.key for r in ledger.store.list_pending()] == ["p"]


def test_purge_counts_the_age_of_the_outcome_not_of_the_intent(ledger: Ledger) -> None:
    """An intent claimed long ago whose outcome was recorded recently is kept."""
    ledger.pending("slow")
    ledger.clock.advance(40 * DAY)
    ledger.store.record_outcome("slow", {"ok": True})
    assert ledger.store.purge(dt.timedelta(days=30)) == 0
    ledger.clock.advance(31 * DAY)
    assert ledger.store.purge(dt.timedelta(days=30)) == 1


def test_a_replay_after_the_record_was_purged_runs_again(ledger: Ledger) -> None:
    """What the retention bounds (see "Retention"): once purged, a claim is new again."""
    ledger.done("k")
    assert ledger.store.claim("k", tool="pay", args_json="{}", thread_id="t").state == "done"
    ledger.clock.advance(31 * DAY)
    ledger.store.purge()
    assert ledger.store.claim("k", tool="pay", args_json="{}", thread_id="t").state == "new"


def test_list_pending_is_oldest_first_filtered_by_age_and_limited(ledger: Ledger) -> None:
    """The operator's view: pending intents only, oldest first, at least older_than old."""
    ledger.pending("p1")
    ledger.clock.advance(DAY)
    ledger.done("d1")
    ledger.pending("p2")
    ledger.clock.advance(DAY)
    ledger.pending("p3")

    assert [r.key for r in ledger.store.list_pending()] == ["p1", "p2", "p3"]
    assert [r.key for r in ledger.store.list_pending(DAY)] == ["p1", "p2"]
    assert [r.key for r in ledger.store.list_pending(dt.timedelta(days=2))] == ["p1"]
    assert [r.key for r in ledger.store.list_pending(limit=2)] == ["p1", "p2"]
    assert all(r.status == "pending" for r in ledger.store.list_pending())


async def test_async_twins(ledger: Ledger) -> None:
    ledger.done("a")
    ledger.pending("p")
    ledger.clock.advance(31 * DAY)
    assert [r.key for r in await ledger.store.alist_pending(limit=1)] == ["p"]
    assert await ledger.store.apurge() == 1


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), dt.timedelta(0), True, "1d"])
def test_purge_refuses_a_retention_that_is_not_a_positive_duration(
    ledger: Ledger, bad: object
) -> None:
    """purge(0) would delete every completed record at once: refused, as is nonsense."""
    ledger.done("a")
    with pytest.raises(ValueError, match="older_than"):
        ledger.store.purge(bad)  # type: ignore[arg-type]
    assert ledger.store.get("a") is not None


@pytest.mark.parametrize("bad", [0, -3, True, 1.5])
def test_list_pending_refuses_a_bad_limit(ledger: Ledger, bad: object) -> None:
    with pytest.raises(ValueError, match="limit"):
        ledger.store.list_pending(limit=bad)  # type: ignore[arg-type]


def test_sqlite_purge_deletes_in_batches(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More old records than one batch: every one goes, in several short statements."""
    monkeypatch.setattr("langgraph_resilience.stores.sql._PURGE_BATCH", 3)
    clock = FakeClock()
    conn = sqlite3.connect(tmp_path / "l.sqlite", isolation_level=None, check_same_thread=False)
    store = SqliteIdempotencyStore(conn, clock=clock)
    store.setup()
    ledger = Ledger(store, clock)
    for n in range(7):
        ledger.done(f"k{n}")
    ledger.pending("p")
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    clock.advance(31 * DAY)

    assert store.purge() == 7
    assert [r.key for r in store.for_thread("t")] == ["p"]
    assert sum("DELETE FROM lgr_idempotency" in s for s in statements) == 3
    conn.close()


def test_sqlite_purge_uses_the_completed_index(tmp_path: pathlib.Path) -> None:
    """The purge's scan is the partial index on updated_at, not the whole table."""
    with open_sqlite(tmp_path / "threads.sqlite") as p:
        assert isinstance(p.idempotency, SqliteIdempotencyStore)
        conn = p.idempotency.conn
        plan = " ".join(
            str(tuple(row))
            for row in conn.execute(
                "EXPLAIN QUERY PLAN SELECT key FROM lgr_idempotency "
                "WHERE status IN ('done', 'failed') AND updated_at < 1 "
                "ORDER BY updated_at LIMIT 10"
            )
        )
    assert "lgr_idempotency_completed_idx" in plan


def test_persistence_purge_and_list_pending_delegate_to_the_ledger(tmp_path: pathlib.Path) -> None:
    """`Persistence.purge` / `list_pending` are the ledger's, on every backend."""
    clock = FakeClock()
    p = Persistence(
        checkpointer=None,  # type: ignore[arg-type]
        store=None,  # type: ignore[arg-type]
        idempotency=InMemoryIdempotencyStore(clock=clock),
    )
    Ledger(p.idempotency, clock).done("a")
    Ledger(p.idempotency, clock).pending("b")
    clock.advance(31 * DAY)
    assert [r.key for r in p.list_pending()] == ["b"]
    assert asyncio.run(p.alist_pending(limit=5))[0].key == "b"
    assert p.purge() == 1
    assert asyncio.run(p.apurge()) == 0
    with open_sqlite(tmp_path / "threads.sqlite") as sqlite_p:
        sqlite_p.idempotency.claim("k", tool="pay", args_json="{}", thread_id="t")
        assert sqlite_p.purge() == 0
        assert [r.key for r in sqlite_p.list_pending()] == ["k"]


# ------------------------------------------------------------------ the bounded in-memory ledger


def _memory(**kwargs: object) -> Ledger:
    clock = FakeClock()
    return Ledger(InMemoryIdempotencyStore(clock=clock, **kwargs), clock)  # type: ignore[arg-type]


def test_unbounded_by_default() -> None:
    """Without max_entries or ttl nothing is forgotten (as the durable tables)."""
    ledger = _memory()
    for n in range(500):
        ledger.done(f"k{n}")
    ledger.clock.advance(3650 * DAY)
    ledger.done("last")
    assert len(ledger.store) == 501  # type: ignore[arg-type]


def test_max_entries_evicts_the_least_recently_used_completed_record() -> None:
    """Over the bound, the completed record used longest ago goes; a replay counts as a use."""
    ledger = _memory(max_entries=3)
    ledger.done("a")
    ledger.done("b")
    ledger.done("c")
    ledger.store.claim("a", tool="pay", args_json="{}", thread_id="t")  # a replay of a

    ledger.done("d")

    store = ledger.store
    assert len(store) == 3  # type: ignore[arg-type]
    assert store.get("b") is None
    assert [k for k in "acd" if store.get(k) is not None] == ["a", "c", "d"]


def test_max_entries_never_evicts_a_pending_record() -> None:
    """Pending records are never candidates: they alone may exceed the bound."""
    ledger = _memory(max_entries=2)
    ledger.pending("p1")
    ledger.pending("p2")
    ledger.done("d1")
    ledger.pending("p3")
    ledger.pending("p4")

    assert ledger.store.get("d1") is None
    assert [r.key for r in ledger.store.list_pending()] == ["p1", "p2", "p3", "p4"]
    assert len(ledger.store) == 4  # type: ignore[arg-type]


def test_the_record_just_written_is_kept() -> None:
    """A new outcome is not evicted by its own write, even when all else is pending."""
    ledger = _memory(max_entries=1)
    ledger.pending("p")
    ledger.done("d")
    record = ledger.store.get("d")
    assert record is not None
    assert record.status == "done"


def test_ttl_evicts_completed_records_idle_that_long() -> None:
    """Past ttl since their last use, completed records go on the next write; pending stay."""
    ledger = _memory(ttl=dt.timedelta(hours=1))
    ledger.done("old")
    ledger.done("replayed")
    ledger.pending("p")
    ledger.clock.advance(1800)
    ledger.store.get("replayed")  # used again: its hour starts over
    ledger.clock.advance(1801)

    ledger.done("new")

    store = ledger.store
    assert store.get("old") is None
    assert store.get("replayed") is not None
    assert store.get("new") is not None
    assert store.get("p") is not None
    ledger.clock.advance(10 * 3600)
    ledger.pending("q")
    assert [r.key for r in store.list_pending()] == ["p", "q"]
    assert len(store) == 2  # type: ignore[arg-type]


def test_released_records_leave_the_eviction_order() -> None:
    """A released failed record is gone: it is not evicted twice nor counted."""
    ledger = _memory(max_entries=2)
    ledger.failed("f")
    assert ledger.store.release("f")
    ledger.done("a")
    ledger.done("b")
    assert [k for k in ("a", "b") if ledger.store.get(k)] == ["a", "b"]


@pytest.mark.parametrize(
    "kwargs", [{"max_entries": 0}, {"max_entries": True}, {"ttl": 0}, {"ttl": -5.0}]
)
def test_bounds_must_be_positive(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=r"max_entries|ttl"):
        InMemoryIdempotencyStore(**kwargs)  # type: ignore[arg-type]


def test_completed_records_of_threads_that_are_gone_are_swept() -> None:
    """With `thread_alive`, a sweep every SWEEP_EVERY writes drops the completed records
    of deleted threads; a live thread's records and any pending record stay."""
    live = {"keep"}
    store = InMemoryIdempotencyStore(thread_alive=live.__contains__)
    store.claim("kept", tool="pay", args_json="{}", thread_id="keep")
    store.record_outcome("kept", "ok")
    store.claim("pending", tool="pay", args_json="{}", thread_id="gone")
    writes = 3
    for i in range(SWEEP_EVERY):
        if writes % SWEEP_EVERY == SWEEP_EVERY - 1:
            break
        store.claim(f"g{i}", tool="pay", args_json="{}", thread_id="gone")
        store.record_outcome(f"g{i}", "ok")
        writes += 2
    assert store.get("g0") is not None  # no sweep yet
    store.claim("last", tool="pay", args_json="{}", thread_id="gone")  # the sweeping write

    assert len(store) == 3  # "kept", "pending" and "last" (pending)
    assert store.get("kept") is not None
    assert store.get("g0") is None
    assert [r.key for r in store.list_pending()] == ["pending", "last"]


def test_the_ledger_beside_an_in_memory_saver_sweeps_its_deleted_threads() -> None:
    """The store chosen for an `InMemorySaver` asks the saver whether a thread is alive."""
    saver = InMemorySaver()
    resolver = LedgerResolver(idempotency=None, saga=None, needed=True)
    ledger = resolver.resolve({"configurable": {CONFIG_KEY_CHECKPOINTER: saver}})
    assert ledger is not None
    alive = ledger.idempotency._thread_alive  # type: ignore[attr-defined]
    saver.storage["t1"]  # the saver now holds thread t1 (a defaultdict, as a run does)
    assert alive("t1")
    assert not alive("t2")
    saver.delete_thread("t1")
    assert not alive("t1")
