"""The Postgres breaker's in-process shortcuts on the real server: a cached admission
with a staleness bound, batched successes, failures written at once."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from langgraph_resilience.core.breaker import BreakerConfig
from langgraph_resilience.errors import FailureClass
from langgraph_resilience.stores.persistence import POSTGRES_CONNECTION_KWARGS
from langgraph_resilience.stores.postgres_breakers import (
    BREAKER_CACHE_TTL,
    AsyncPostgresBreakerStore,
    PostgresBreakerStore,
)
from langgraph_resilience.testing import FakeClock

pytestmark = pytest.mark.postgres

T = FailureClass.TRANSIENT
CFG = BreakerConfig(minimum_calls=2, window_size=4, open_duration=30.0, half_open_max_calls=1)
NEVER = 3600.0
"""A flush interval no test waits for: only `flush()` or a failure writes successes."""


@pytest.fixture
def pool(pg_dsn: str) -> Iterator[ConnectionPool[Any]]:
    with ConnectionPool(
        pg_dsn, min_size=1, max_size=4, kwargs=POSTGRES_CONNECTION_KWARGS, open=True
    ) as pool:
        pool.wait(timeout=30)
        PostgresBreakerStore(pool).setup()
        yield pool


def _worker(pool: ConnectionPool[Any], clock: FakeClock, **kwargs: Any) -> PostgresBreakerStore:
    """Another worker's store on the same table (its own cache and batch)."""
    return PostgresBreakerStore(pool, clock=clock, **kwargs)


def test_a_trip_elsewhere_is_seen_within_the_cache_ttl(pool: ConnectionPool[Any]) -> None:
    """A worker that read a closed breaker keeps admitting from its cache until
    cache_ttl has passed on its clock, then refuses the breaker another worker opened."""
    clock = FakeClock()
    here, there = _worker(pool, clock, cache_ttl=2.0), _worker(pool, clock)
    assert here.acquire("api", CFG, 0.0).allowed  # read once: closed
    there.record("api", CFG, 0.0, T)
    there.record("api", CFG, 0.0, T)
    assert there.snapshot("api").status == "open"
    clock.advance(1.999)
    assert here.acquire("api", CFG, 1.0).allowed  # stale by less than the bound
    clock.advance(0.001)
    refused = here.acquire("api", CFG, 1.0)
    assert not refused.allowed
    assert refused.retry_after == pytest.approx(29.0)


def test_the_default_bound_and_no_cache(pool: ConnectionPool[Any]) -> None:
    """The default bound is BREAKER_CACHE_TTL; cache_ttl=0 reads the row every time."""
    clock = FakeClock()
    cached, uncached = _worker(pool, clock), _worker(pool, clock, cache_ttl=0)
    assert cached.cache_ttl == BREAKER_CACHE_TTL
    assert cached.acquire("db", CFG, 0.0).allowed
    assert uncached.acquire("db", CFG, 0.0).allowed
    for _ in range(2):
        _worker(pool, clock).record("db", CFG, 0.0, T)
    assert not uncached.acquire("db", CFG, 0.0).allowed
    assert cached.acquire("db", CFG, 0.0).allowed
    clock.advance(BREAKER_CACHE_TTL)
    assert not cached.acquire("db", CFG, 0.0).allowed


def test_own_trip_is_refused_at_once(pool: ConnectionPool[Any]) -> None:
    """A trip this worker wrote updates its cache: its next call is refused without
    waiting for the cache to expire."""
    clock = FakeClock()
    store = _worker(pool, clock, cache_ttl=NEVER)
    assert store.acquire("pay", CFG, 0.0).allowed
    store.record("pay", CFG, 0.0, T)
    assert store.record("pay", CFG, 0.0, T) is not None  # closed->open
    assert not store.acquire("pay", CFG, 0.0).allowed


def test_successes_wait_and_a_failure_reaches_the_shared_row_at_once(
    pool: ConnectionPool[Any],
) -> None:
    """Plain successes stay in this process (seen by its own snapshot) until flushed; a
    failure is written at once, after the successes that came before it, in one change."""
    clock = FakeClock()
    here, there = _worker(pool, clock, flush_interval=NEVER), _worker(pool, clock)
    for _ in range(3):
        assert here.record("svc", CFG, 0.0, None, duration=0.01) is None
    assert there.snapshot("svc").window is None  # nothing written yet
    own = here.snapshot("svc").window
    assert own is not None
    assert (own.calls, own.failures) == (3, 0)
    here.record("svc", CFG, 0.0, T)
    shared = there.snapshot("svc").window
    assert shared is not None
    assert (shared.calls, shared.failures) == (4, 1)  # the successes went first
    here.record("svc", CFG, 0.0, None)
    here.flush()
    shared = there.snapshot("svc").window
    assert shared is not None
    assert (shared.calls, shared.failures) == (4, 1)  # a ring of 4: the oldest success left
    assert shared.failure_bits != 0


def test_a_success_that_can_trip_is_written_at_once(pool: ConnectionPool[Any]) -> None:
    """A slow success (it may trip the slow-call rate) and a probe are not batched."""
    clock = FakeClock()
    cfg = BreakerConfig(minimum_calls=1, window_size=2, slow_call_threshold=1.0)
    here, there = _worker(pool, clock, flush_interval=NEVER), _worker(pool, clock)
    transition = here.record("slow", cfg, 0.0, None, duration=5.0)
    assert transition is not None
    assert transition.reason == "slow_call_rate"
    assert there.snapshot("slow").status == "open"
    probe = here.acquire("slow", cfg, 100.0)
    assert probe.probe
    closed = here.record("slow", cfg, 100.0, None, probe=True, duration=0.1)
    assert closed is not None
    assert closed.name == "half_open->closed"
    assert there.snapshot("slow").status == "closed"


def test_a_trip_by_waiting_successes_happens_at_the_flush(pool: ConnectionPool[Any]) -> None:
    """A success that completes minimum_calls over a failing window trips the breaker
    when its batch is written: what batching costs is that delay, not the trip."""
    clock = FakeClock()
    cfg = BreakerConfig(minimum_calls=3, window_size=3, failure_rate_threshold=0.5)
    here = _worker(pool, clock, flush_interval=NEVER)
    here.record("late", cfg, 0.0, T)
    here.record("late", cfg, 0.0, T)
    here.record("late", cfg, 0.0, None)
    assert _worker(pool, clock).snapshot("late").status == "closed"
    here.flush()
    assert _worker(pool, clock).snapshot("late").status == "open"


def test_async_store_batches_and_flushes(pg_dsn: str) -> None:
    """The async store defers plain successes the same way; aflush writes them, and its
    flusher task writes them by itself within the flush interval."""

    async def scenario() -> tuple[int, int, int]:
        async with AsyncConnectionPool(
            pg_dsn, min_size=1, max_size=2, kwargs=POSTGRES_CONNECTION_KWARGS, open=False
        ) as pool:
            store = AsyncPostgresBreakerStore(pool, flush_interval=NEVER)
            await store.setup()
            other = AsyncPostgresBreakerStore(pool)
            await store.arecord("a", CFG, 0.0, None)
            before = (await other.asnapshot("a")).window
            await store.aflush()
            after = (await other.asnapshot("a")).window
            quick = AsyncPostgresBreakerStore(pool, flush_interval=0.0)
            await quick.arecord("b", CFG, 0.0, None)
            for _ in range(200):  # the flusher task runs on this loop
                window = (await other.asnapshot("b")).window
                if window is not None:
                    break
                await asyncio.sleep(0.01)
            return (
                0 if before is None else before.calls,
                0 if after is None else after.calls,
                0 if window is None else window.calls,
            )

    assert asyncio.run(scenario()) == (0, 1, 1)


def test_the_sync_flusher_writes_by_itself(pool: ConnectionPool[Any]) -> None:
    """With no further calls, the daemon flusher still writes a waiting success."""
    store = PostgresBreakerStore(pool, flush_interval=0.0)
    store.record("bg", CFG, 0.0, None)
    other = PostgresBreakerStore(pool)
    thread = store._flusher
    assert thread is not None
    for _ in range(500):
        window = other.snapshot("bg").window
        if window is not None:
            break
        thread.join(0.01)
    assert window is not None
    assert window.calls == 1


def test_a_closed_pool_drops_waiting_successes_once(
    pg_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A pool closed with a success waiting (the ``with ConnectionPool(...)`` idiom
    ending): the flusher says so once and ends, instead of retrying a closed pool in a
    warning every tenth of a second for the life of the process."""
    with ConnectionPool(
        pg_dsn, min_size=1, max_size=2, kwargs=POSTGRES_CONNECTION_KWARGS, open=True
    ) as closing:
        store = PostgresBreakerStore(closing, flush_interval=NEVER)
        store.setup()
    store.flush_interval = 0.0
    store.record("late", CFG, 0.0, None)
    thread = store._flusher
    assert thread is not None
    thread.join(30)  # a bound for a hang
    assert not thread.is_alive()
    warnings = [r.getMessage() for r in caplog.records if "breaker success" in r.getMessage()]
    assert warnings == [
        "1 breaker success(es) dropped: PoolClosed, the store's pool or connection was "
        "closed first; call the store's flush() before closing it to keep them"
    ]
    assert store._waiting("late") == []


def test_the_async_store_drops_waiting_successes_of_a_closed_pool(
    pg_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The async flusher task, too, drops what it cannot write to a closed pool."""

    async def scenario() -> list[str]:
        async with AsyncConnectionPool(
            pg_dsn, min_size=1, max_size=2, kwargs=POSTGRES_CONNECTION_KWARGS, open=False
        ) as closing:
            store = AsyncPostgresBreakerStore(closing, flush_interval=NEVER)
            await store.setup()
        store.flush_interval = 0.0
        await store.arecord("alate", CFG, 0.0, None)
        task = store._aflusher
        assert task is not None
        await asyncio.wait_for(task, 30)  # a bound for a hang
        assert store._waiting("alate") == []
        return [r.getMessage() for r in caplog.records if "breaker success" in r.getMessage()]

    warnings = asyncio.run(scenario())
    assert len(warnings) == 1
    assert warnings[0].startswith("1 breaker success(es) dropped: PoolClosed")


def _row_version(pool: ConnectionPool[Any], key: str) -> str:
    """The row's ``xmin``: it changes with every write of the row."""
    with pool.connection() as conn:
        query = "SELECT xmin::text AS version FROM lgr_breakers WHERE key = %s"
        row = conn.execute(query, (key,)).fetchone()
    assert row is not None
    return str(row["version"])


def test_a_batch_that_changes_nothing_is_not_written(pool: ConnectionPool[Any]) -> None:
    """Once the window is a full ring of successes, more successes leave it the same
    window: a flush within cache_ttl of this worker's last sight does not even take
    the row lock (it finishes while another transaction holds it) and writes nothing."""
    clock = FakeClock()
    here = _worker(pool, clock, flush_interval=NEVER, cache_ttl=10.0)
    for _ in range(CFG.window_size):
        here.record("steady", CFG, 0.0, None)
    here.flush()
    version = _row_version(pool, "steady")
    for _ in range(3):
        here.record("steady", CFG, 0.0, None)
    with pool.connection() as holder, holder.transaction():
        holder.execute("SELECT state FROM lgr_breakers WHERE key = 'steady' FOR UPDATE")
        flusher = threading.Thread(target=here.flush, daemon=True)
        flusher.start()
        flusher.join(30)  # a bound for a hang, not a clock: it returns at once
        assert not flusher.is_alive(), "the flush waited for the row lock"
    assert _row_version(pool, "steady") == version
    window = _worker(pool, clock).snapshot("steady").window
    assert window is not None
    assert (window.calls, window.failures) == (CFG.window_size, 0)


def test_without_a_cache_a_batch_is_judged_under_the_lock(pool: ConnectionPool[Any]) -> None:
    """With cache_ttl=0 nothing is remembered: the batch is applied under the row lock,
    which finds nothing to change on a full clean ring and so does not rewrite it."""
    clock = FakeClock()
    here = _worker(pool, clock, flush_interval=NEVER, cache_ttl=0)
    for _ in range(CFG.window_size):
        here.record("exact", CFG, 0.0, None)
    here.flush()
    version = _row_version(pool, "exact")
    here.record("exact", CFG, 0.0, None)
    assert not here._changes_nothing("exact", here._waiting("exact"))
    here.flush()
    assert _row_version(pool, "exact") == version


def test_an_unwritten_batch_counts_before_a_failure_elsewhere(pool: ConnectionPool[Any]) -> None:
    """The trade of not writing: within cache_ttl of this worker's sight of a clean
    window, its successes are not written, so a failure another worker wrote meanwhile
    stays in the shared window (as if those successes came first); past cache_ttl the
    batch is applied under the row lock and shifts it out."""
    clock = FakeClock()
    here = _worker(pool, clock, flush_interval=NEVER, cache_ttl=1.0)
    there = _worker(pool, clock)
    for _ in range(CFG.window_size):
        here.record("svc2", CFG, 0.0, None)
    here.flush()
    assert there.record("svc2", CFG, 0.0, T) is None  # one failure of four: still closed
    for _ in range(CFG.window_size):
        here.record("svc2", CFG, 0.0, None)
    here.flush()
    window = there.snapshot("svc2").window
    assert window is not None
    assert (window.calls, window.failures) == (CFG.window_size, 1)
    clock.advance(1.0)
    for _ in range(CFG.window_size):
        here.record("svc2", CFG, 0.0, None)
    here.flush()
    window = there.snapshot("svc2").window
    assert window is not None
    assert (window.calls, window.failures) == (CFG.window_size, 0)


def test_async_store_skips_a_batch_that_changes_nothing(
    pg_dsn: str, pool: ConnectionPool[Any]
) -> None:
    """The async store shares the flush: a batch on a full clean ring does not take the
    row lock (another transaction holds it) and writes nothing."""

    async def scenario() -> None:
        async with AsyncConnectionPool(
            pg_dsn, min_size=1, max_size=2, kwargs=POSTGRES_CONNECTION_KWARGS, open=False
        ) as apool:
            store = AsyncPostgresBreakerStore(apool, flush_interval=NEVER)
            for _ in range(CFG.window_size):
                await store.arecord("asteady", CFG, 0.0, None)
            await store.aflush()
            version = _row_version(pool, "asteady")
            await store.arecord("asteady", CFG, 0.0, None)
            with pool.connection() as holder, holder.transaction():
                holder.execute("SELECT state FROM lgr_breakers WHERE key = 'asteady' FOR UPDATE")
                await asyncio.wait_for(store.aflush(), 30)  # a bound for a hang
            assert _row_version(pool, "asteady") == version

    asyncio.run(scenario())
