"""The Postgres breaker store on the real server: atomic transitions shared by processes."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from langgraph.checkpoint.postgres import PostgresSaver
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from langgraph_resilience.core.breaker import BreakerConfig, BreakerState, BreakerStore
from langgraph_resilience.core.budget import RetryBudget, RetryBudgetState
from langgraph_resilience.errors import CircuitOpenError, ConfigurationError, FailureClass
from langgraph_resilience.stores.breakers import CircuitBreaker
from langgraph_resilience.stores.budgets import PostgresRetryBudgetStore
from langgraph_resilience.stores.persistence import POSTGRES_CONNECTION_KWARGS
from langgraph_resilience.stores.postgres_breakers import (
    AsyncPostgresBreakerStore,
    PostgresBreakerStore,
)
from langgraph_resilience.testing import FakeClock, FakeHTTPError
from tests.postgres.breaker_worker import hammer

pytestmark = pytest.mark.postgres

T = FailureClass.TRANSIENT
CFG = BreakerConfig(minimum_calls=2, window_size=4, open_duration=30.0, half_open_max_calls=3)


@pytest.fixture
def pool(pg_dsn: str) -> Iterator[ConnectionPool[Any]]:
    """A pool configured exactly as LangGraph's PostgresSaver requires."""
    with ConnectionPool(
        pg_dsn, min_size=1, max_size=8, kwargs=POSTGRES_CONNECTION_KWARGS, open=True
    ) as pool:
        pool.wait(timeout=30)
        yield pool


@pytest.fixture
def store(pool: ConnectionPool[Any]) -> PostgresBreakerStore:
    """A breaker store on that pool, set up."""
    store = PostgresBreakerStore(pool)
    store.setup()
    return store


def test_shares_the_checkpointer_pool(pool: ConnectionPool[Any]) -> None:
    """The store and PostgresSaver set up and work on one pool; setup() is idempotent."""
    PostgresSaver(pool).setup()
    store = PostgresBreakerStore(pool)
    store.setup()
    store.setup()
    assert isinstance(store, BreakerStore)
    assert store.acquire("search", CFG, 0.0).allowed
    with pool.connection() as conn:
        tables = {
            row["tablename"]
            for row in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        }
    assert {"lgr_breakers", "checkpoints"} <= tables


def test_every_transition_through_the_store(
    store: PostgresBreakerStore, caplog: pytest.LogCaptureFixture
) -> None:
    """closed -> open -> half_open -> open -> half_open -> closed, persisted and evented."""
    with caplog.at_level(logging.INFO, logger="langgraph_resilience"):
        assert store.record("api", CFG, 0.0, T) is None
        assert store.snapshot("api").status == "closed"
        opened = store.record("api", CFG, 1.0, T)
        assert opened is not None
        assert opened.name == "closed->open"
        refused = store.acquire("api", CFG, 11.0)
        assert (refused.allowed, refused.retry_after, refused.status) == (False, 20.0, "open")
        probe = store.acquire("api", CFG, 31.0)
        assert probe.probe
        reopened = store.record("api", CFG, 32.0, T, probe=True)
        assert reopened is not None
        assert reopened.name == "half_open->open"
        probes = [store.acquire("api", CFG, 62.0) for _ in range(4)]
        assert [a.probe for a in probes] == [True, True, True, False]
        for _ in range(3):
            closed = store.record("api", CFG, 63.0, None, probe=True)
        assert closed is not None
        assert closed.name == "half_open->closed"
    assert store.snapshot("api") == BreakerState()
    transitions = [
        r.args[1]["transition"]  # type: ignore[index]
        for r in caplog.records
        if r.args and r.args[0] == "breaker"  # type: ignore[index]
    ]
    assert transitions == [
        "closed->open",
        "open->half_open",
        "half_open->open",
        "open->half_open",
        "half_open->closed",
    ]


def test_release_returns_a_probe_permit(store: PostgresBreakerStore) -> None:
    """A released probe permit is handed out again; a non-probe release writes nothing."""
    cfg = BreakerConfig(minimum_calls=1, window_size=1, open_duration=1.0)
    store.record("api", cfg, 0.0, T)
    assert store.acquire("api", cfg, 1.0).probe
    assert not store.acquire("api", cfg, 1.0).allowed
    store.release("api", cfg, 1.0, probe=False)
    assert not store.acquire("api", cfg, 1.0).allowed
    store.release("api", cfg, 1.0, probe=True)
    assert store.acquire("api", cfg, 1.0).probe


def test_circuit_breaker_on_the_postgres_store(store: PostgresBreakerStore) -> None:
    """CircuitBreaker works unchanged over the shared store."""
    clock = FakeClock()
    cfg = BreakerConfig(minimum_calls=2, window_size=2, open_duration=5.0)
    breaker = CircuitBreaker("geo", cfg, store=store, clock=clock)

    def dead() -> None:
        raise FakeHTTPError(503)

    for _ in range(2):
        with pytest.raises(FakeHTTPError):
            breaker.call(dead)
    with pytest.raises(CircuitOpenError):
        breaker.call(dead)
    clock.advance(5.0)
    assert breaker.call(lambda: "ok") == "ok"
    assert store.snapshot("geo").status == "closed"


def test_single_connection_and_rollback_on_error(pg_dsn: str) -> None:
    """A plain autocommit connection works; an error mid-transition rolls back cleanly."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        store = PostgresBreakerStore(conn, table="ops_breakers")
        store.setup()
        store.record("api", CFG, 0.0, T)
        with pytest.raises(AttributeError):
            store.record("api", None, 0.0, T)  # type: ignore[arg-type]
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        assert store.record("api", CFG, 0.0, T) is not None
        assert store.snapshot("api").status == "open"


def test_unreadable_state_starts_closed(
    store: PostgresBreakerStore, pool: ConnectionPool[Any], caplog: pytest.LogCaptureFixture
) -> None:
    """A row that is not a breaker state is logged and treated as a fresh breaker."""
    with pool.connection() as conn:
        conn.execute("INSERT INTO lgr_breakers (key, state) VALUES ('api', '{\"v\": 99}')")
    with caplog.at_level(logging.WARNING, logger="langgraph_resilience"):
        assert store.snapshot("api") == BreakerState()
        store.record("api", CFG, 0.0, T)
    assert "unreadable stored state" in caplog.text
    assert store.snapshot("api").window is not None


def test_misconfigured_connections_are_rejected(pg_dsn: str) -> None:
    """Non-autocommit connections, async pools and odd table names fail at construction."""
    with psycopg.connect(pg_dsn) as conn, pytest.raises(ConfigurationError, match="autocommit"):
        PostgresBreakerStore(conn)
    with (
        psycopg.connect(pg_dsn, autocommit=True) as conn,
        pytest.raises(ConfigurationError, match="plain SQL identifier"),
    ):
        PostgresBreakerStore(conn, table="x; DROP TABLE y")
    with pytest.raises(ConfigurationError, match="AsyncPostgresBreakerStore"):
        PostgresBreakerStore("postgresql://nowhere")  # type: ignore[arg-type]
    with (
        ConnectionPool(pg_dsn, min_size=1, open=True) as plain_pool,
        pytest.raises(ConfigurationError, match="POSTGRES_CONNECTION_KWARGS"),
    ):
        PostgresBreakerStore(plain_pool).setup()


def test_sync_store_async_methods(store: PostgresBreakerStore) -> None:
    """The sync store's async twins run off the event loop and see the same rows."""
    cfg = BreakerConfig(minimum_calls=1, window_size=1, open_duration=1.0)

    async def scenario() -> list[Any]:
        await store.arecord("api", cfg, 0.0, T)
        refused = await store.aacquire("api", cfg, 0.5)
        probe = await store.aacquire("api", cfg, 1.0)
        await store.arelease("api", cfg, 1.0, probe=True)
        probe = await store.aacquire("api", cfg, 1.0)
        await store.arecord("api", cfg, 1.0, None, probe=probe.probe)
        return [refused.allowed, probe.probe, (await store.asnapshot("api")).status]

    assert asyncio.run(scenario()) == [False, True, "closed"]


# ---------------------------------------------------------------------- async


def test_async_store_grants_exactly_the_permits_to_concurrent_tasks(pg_dsn: str) -> None:
    """64 tasks racing on an AsyncConnectionPool get exactly half_open_max_calls probes."""

    async def scenario() -> tuple[list[bool], BreakerState, str]:
        async with AsyncConnectionPool(
            pg_dsn, min_size=1, max_size=8, kwargs=POSTGRES_CONNECTION_KWARGS, open=False
        ) as pool:
            await pool.wait(timeout=30)
            store = AsyncPostgresBreakerStore(pool)
            await store.setup()
            for _ in range(2):
                await store.arecord("api", CFG, 0.0, T)
            admissions = await asyncio.gather(
                *(store.aacquire("api", CFG, 30.0) for _ in range(64))
            )
            # Sync code in a worker thread (as a sync tool would) reaches the same store.
            status = await asyncio.to_thread(lambda: store.snapshot("api").status)
            return [a.probe for a in admissions if a.allowed], await store.asnapshot("api"), status

    probes, state, seen_from_thread = asyncio.run(scenario())
    assert probes == [True, True, True]
    assert (state.status, state.permits, seen_from_thread) == ("half_open", 3, "half_open")


def test_async_store_full_cycle_on_a_connection(pg_dsn: str) -> None:
    """The async store on a single AsyncConnection runs a whole cycle; sync calls on the
    loop's own thread are refused with a message."""

    async def scenario() -> list[Any]:
        conn = await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True)
        async with conn:
            store = AsyncPostgresBreakerStore(conn)
            await store.setup()
            cfg = BreakerConfig(minimum_calls=1, window_size=1, open_duration=1.0)
            opened = await store.arecord("api", cfg, 0.0, T)
            probe = await store.aacquire("api", cfg, 1.0)
            await store.arelease("api", cfg, 1.0, probe=True)
            probe = await store.aacquire("api", cfg, 1.0)
            closed = await store.arecord("api", cfg, 1.0, None, probe=True)
            with pytest.raises(asyncio.InvalidStateError, match="async methods"):
                store.snapshot("api")
            return [opened and opened.name, probe.probe, closed and closed.name]

    assert asyncio.run(scenario()) == ["closed->open", True, "half_open->closed"]


def test_async_store_rejects_sync_connections(pg_dsn: str) -> None:
    """AsyncPostgresBreakerStore takes only async connections and pools."""
    with (
        psycopg.connect(pg_dsn, autocommit=True) as conn,
        pytest.raises(ConfigurationError, match="PostgresBreakerStore"),
    ):
        AsyncPostgresBreakerStore(conn)  # type: ignore[arg-type]


# ------------------------------------------------------------- many processes

PROCESSES = 4


@pytest.fixture(scope="module")
def processes() -> Iterator[tuple[Any, Any]]:
    """PROCESSES worker processes spawned once for the module, and a manager for barriers."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(PROCESSES) as workers, ctx.Manager() as manager:
        yield workers, manager


def hammer_from_processes(
    processes: tuple[Any, Any], dsn: str, cfg: BreakerConfig, *, outcome: str | None, calls: int
) -> list[dict[str, Any]]:
    """Run `hammer` in every worker process at once, 3 threads each, at time 30."""
    workers, manager = processes
    ready, finished = manager.Barrier(PROCESSES), manager.Barrier(PROCESSES)
    cfg_kwargs = {
        "minimum_calls": cfg.minimum_calls,
        "window_size": cfg.window_size,
        "open_duration": cfg.open_duration,
        "half_open_max_calls": cfg.half_open_max_calls,
    }
    jobs = [
        workers.apply_async(
            hammer,
            (dsn, "shared", cfg_kwargs, 30.0),
            {
                "threads": 3,
                "calls": calls,
                "outcome": outcome,
                "ready": ready,
                "finished": finished,
            },
        )
        for _ in range(PROCESSES)
    ]
    reports: list[dict[str, Any]] = [job.get(timeout=180) for job in jobs]
    assert len({r["pid"] for r in reports}) == PROCESSES  # really 4 processes at once
    return reports


@pytest.mark.slow
@pytest.mark.parametrize(
    ("outcome", "final"),
    [
        (None, "half_open"),  # probes never report: every permit stays taken
        ("ok", "closed"),  # probes succeed: the breaker closes, later calls are not probes
    ],
)
def test_processes_agree_on_half_open_probes(
    pg_dsn: str,
    store: PostgresBreakerStore,
    processes: tuple[Any, Any],
    outcome: str | None,
    final: str,
) -> None:
    """4 spawned processes x 3 threads hammer one half-open breaker: exactly
    half_open_max_calls probes are admitted in all, and every process sees the same state."""
    for _ in range(2):
        store.record("shared", CFG, 0.0, T)
    assert store.snapshot("shared").status == "open"

    reports = hammer_from_processes(processes, pg_dsn, CFG, outcome=outcome, calls=30)

    total = {k: sum(r["counts"][k] for r in reports) for k in ("admitted", "probes", "refused")}
    assert total["probes"] == CFG.half_open_max_calls
    assert total["admitted"] + total["refused"] == PROCESSES * 3 * 30
    if outcome is None:
        assert total["admitted"] == CFG.half_open_max_calls
    else:
        assert total["admitted"] > CFG.half_open_max_calls  # closed again: calls flow
    snapshots = [r["snapshot"] for r in reports]
    assert all(s == snapshots[0] for s in snapshots)
    shared = BreakerState.from_json(snapshots[0])
    assert shared == store.snapshot("shared")
    assert shared.status == final
    if outcome is None:
        assert shared.permits == CFG.half_open_max_calls


@pytest.mark.slow
def test_processes_reopen_on_a_failed_probe(
    pg_dsn: str, store: PostgresBreakerStore, processes: tuple[Any, Any]
) -> None:
    """When the probes fail, at most half_open_max_calls are admitted and all processes
    see the breaker open again."""
    for _ in range(2):
        store.record("shared", CFG, 0.0, T)

    reports = hammer_from_processes(processes, pg_dsn, CFG, outcome="transient", calls=20)

    probes = sum(r["counts"]["probes"] for r in reports)
    assert 1 <= probes <= CFG.half_open_max_calls
    assert {BreakerState.from_json(r["snapshot"]).status for r in reports} == {"open"}
    assert store.snapshot("shared") == BreakerState("open", None, 30.0)


def test_threads_on_one_pool_never_over_grant(store: PostgresBreakerStore) -> None:
    """16 threads on one pool racing in half-open get exactly the permits."""
    for _ in range(2):
        store.record("api", CFG, 0.0, T)
    start = threading.Barrier(16)
    probes: list[bool] = []

    def worker() -> None:
        start.wait(timeout=30)
        for _ in range(10):
            admission = store.acquire("api", CFG, 30.0)
            if admission.allowed:
                probes.append(admission.probe)

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert probes == [True, True, True]


# ---------------------------------------------------------------- retry budget


def test_retry_budget_store_is_atomic_across_pools(pg_dsn: str, pool: ConnectionPool[Any]) -> None:
    """8 threads on two pools spend one shared budget: tokens are conserved exactly
    (granted retries + tokens left = deposits), so no token is spent twice or lost."""
    cfg = RetryBudget(ratio=0.25, max_tokens=10.0, min_retries_per_second=0.0)
    first = PostgresRetryBudgetStore(pool)
    first.setup()
    first.setup()
    assert first.snapshot("tool") == RetryBudgetState()
    drained = [first.try_withdraw("tool", cfg, 0.0) for _ in range(11)]
    assert drained == [True] * 10 + [False]  # the bucket starts full: max_tokens
    with ConnectionPool(
        pg_dsn, min_size=1, max_size=4, kwargs=POSTGRES_CONNECTION_KWARGS, open=True
    ) as other_pool:
        second = PostgresRetryBudgetStore(other_pool)
        start = threading.Barrier(8)
        granted: list[bool] = []

        def worker(budgets: PostgresRetryBudgetStore) -> None:
            start.wait(timeout=30)
            for _ in range(25):
                budgets.deposit("tool", cfg, 0.0)
                granted.extend(budgets.try_withdraw("tool", cfg, 0.0) for _ in range(2))

        threads = [threading.Thread(target=worker, args=(b,)) for b in [first, second] * 4]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    tokens = first.snapshot("tool").tokens
    assert tokens is not None
    assert sum(granted) + tokens == cfg.ratio * 8 * 25  # quarters add up exactly in binary
    assert sum(granted) >= 45


def test_retry_budget_store_async_twins(
    store: PostgresBreakerStore, pool: ConnectionPool[Any]
) -> None:
    """The async methods share the rows of the sync ones."""
    cfg = RetryBudget(max_tokens=1.0, min_retries_per_second=0.0)
    budgets = PostgresRetryBudgetStore(pool)
    budgets.setup()

    async def scenario() -> list[bool]:
        results = [
            await budgets.atry_withdraw("t", cfg, 0.0),
            await budgets.atry_withdraw("t", cfg, 0.0),
        ]
        for _ in range(5):
            await budgets.adeposit("t", cfg, 0.0)
        results.append(await budgets.atry_withdraw("t", cfg, 0.0))
        return results

    assert asyncio.run(scenario()) == [True, False, True]
