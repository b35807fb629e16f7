"""Thread leases, straight to PostgreSQL and through PgBouncer (transaction mode): one
holder at a time, takeover with a greater token, a stale holder's writes refused by
the database, renewal, release, waiting on the injected clock, bounded start-ups."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
import uuid
from typing import Any

import psycopg
import pytest
from langgraph.checkpoint.postgres import PostgresSaver
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from langgraph_resilience import (
    ConfigurationError,
    ThreadBusyError,
    aopen_postgres,
    open_postgres,
)
from langgraph_resilience.core.clock import SystemClock
from langgraph_resilience.core.flow import drive
from langgraph_resilience.errors import PersistenceError, SetupTimeoutError, ThreadLockLostError
from langgraph_resilience.stores import athread_lock, thread_lock
from langgraph_resilience.stores.held import check_fence, holding
from langgraph_resilience.stores.leases import Lease, acquire
from langgraph_resilience.stores.locks import lease_runner, thread_held
from langgraph_resilience.stores.persistence import SETUP_THREAD
from langgraph_resilience.stores.postgres_ledger import PostgresIdempotencyStore
from langgraph_resilience.testing import FakeClock
from tests.pgbouncer import PgBouncer

pytestmark = pytest.mark.postgres

REAL = SystemClock()


def other_worker(dsn: str) -> str:
    """The same database as another process would reach it (its own connection)."""
    return psycopg.conninfo.make_conninfo(dsn, application_name=f"w-{uuid.uuid4().hex[:6]}")


def take(dsn: str, thread: str, *, ttl: float = 30.0) -> Lease:
    """A lease taken and left alone: not renewed, not in any context (a holder that
    will stop, as a crashed or paused one does)."""
    flow = acquire(lease_runner(dsn), thread, ttl=ttl, wait=False, clock=REAL, where="test")
    return drive(flow, REAL)


def lapse(direct: str, thread: str) -> None:
    """The thread's lease lapses now (its holder missed its renewals: paused, cut off)."""
    with psycopg.connect(direct, autocommit=True) as conn:
        conn.execute(
            "UPDATE lgr_thread_leases SET expires_at = now() - interval '1 second' "
            "WHERE thread_id = %s",
            (thread,),
        )


def test_two_holders_cannot_hold_one_lease(pg_route: str) -> None:
    """While one runner holds a thread, every other (this process or another, sync or
    async) is refused, and told who holds it; once released the next one gets a greater
    token."""
    with thread_lock(pg_route, "t1") as first:
        assert isinstance(first, Lease)
        with pytest.raises(ThreadBusyError, match="another run in this process"):
            thread_lock(pg_route, "t1").__enter__()
        with pytest.raises(ThreadBusyError, match=r"held by .*lapses in"):
            take(other_worker(pg_route), "t1")

        async def async_runner() -> None:
            async with athread_lock(pg_route, "t1"):
                pass

        with pytest.raises(ThreadBusyError):
            asyncio.run(async_runner())
        with thread_lock(pg_route, "t2"):  # another thread is free
            pass
        assert thread_held(pg_route, "t1")
    assert not thread_held(pg_route, "t1")
    with thread_lock(other_worker(pg_route), "t1") as second:
        assert isinstance(second, Lease)
        assert second.token > first.token


def test_an_expired_lease_is_taken_over_with_a_higher_token(pg_route: str, pg_dsn: str) -> None:
    """A holder that stops renewing loses the thread once its lease lapses: the next
    runner takes it at once with a greater token; the old holder's check, renewal and
    release no longer count."""
    stale = take(pg_route, "t")
    lapse(pg_dsn, "t")
    with thread_lock(other_worker(pg_route), "t") as fresh:
        assert isinstance(fresh, Lease)
        assert fresh.token > stale.token
        with pytest.raises(ThreadLockLostError):
            stale.check()
        assert stale.renew() is False
        fresh.check()


def test_a_lease_whose_process_died_is_taken_over_at_once(pg_route: str) -> None:
    """A run killed on this host (SIGKILL: no release) leaves a lease 30 s from lapsing;
    the next runner on the host sees its process is gone and takes over at once with a
    greater token, while a live holder on the host is still waited for."""
    script = (
        "import sys; from langgraph_resilience.core.clock import SystemClock; "
        "from langgraph_resilience.core.flow import drive; "
        "from langgraph_resilience.stores.leases import acquire; "
        "from langgraph_resilience.stores.locks import lease_runner; "
        "c = SystemClock(); "
        "l = drive(acquire(lease_runner(sys.argv[1]), 'td', ttl=30.0, wait=False, clock=c), c); "
        "print(l.token, flush=True); sys.stdin.read()"
    )
    with subprocess.Popen(
        [sys.executable, "-c", script, pg_route],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as child:
        assert child.stdout is not None
        dead_token = int(child.stdout.readline())
        with pytest.raises(ThreadBusyError, match="lapses in"):
            take(pg_route, "td")  # alive: refused
        child.kill()
    fresh = take(pg_route, "td")
    assert fresh.token > dead_token
    fresh.release()


class Unreachable:
    """A lease runner whose database does not answer (a restart dropped it)."""

    def rows(self, query: str, params: Any) -> Any:
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    async def arows(self, query: str, params: Any) -> Any:
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    def transaction(self, statements: Any) -> None:
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    async def atransaction(self, statements: Any) -> None:
        raise psycopg.OperationalError("server closed the connection unexpectedly")


def test_a_lease_lost_to_an_unreachable_database_is_taken_over_at_once(pg_route: str) -> None:
    """A run whose fence check cannot reach the database (a restart) stops with
    ThreadLockLostError; its row still looks held for 30 s, but this process knows the
    holder is dead, so the resume that follows takes the thread at once (it used to be
    refused, ThreadBusyError, until the row lapsed)."""
    lost = take(pg_route, "tu")
    lost.runner = Unreachable()
    with pytest.raises(ThreadLockLostError):
        lost.check()
    fresh = take(pg_route, "tu")
    assert fresh.token > lost.token
    fresh.release()


def test_a_check_near_the_end_of_a_held_lease_renews_it(pg_route: str, pg_dsn: str) -> None:
    """A step slowed past the renewals finds its lease still held but with less than a
    third of its TTL left: the check renews it instead of stopping the run."""
    lease = take(pg_route, "tn")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            "UPDATE lgr_thread_leases SET expires_at = now() + interval '2 seconds' "
            "WHERE thread_id = 'tn'"
        )
        lease.check()
        row = conn.execute(
            "SELECT EXTRACT(EPOCH FROM expires_at - now()) FROM lgr_thread_leases "
            "WHERE thread_id = 'tn'"
        ).fetchone()
    assert row is not None
    assert float(row[0]) > 20  # a whole TTL again
    assert not lease.lost
    lease.release()


def test_release_by_a_stale_token_does_nothing(pg_route: str, pg_dsn: str) -> None:
    """The old holder's release after a takeover leaves the new holder's lease alone."""
    stale = take(pg_route, "t")
    lapse(pg_dsn, "t")
    with thread_lock(other_worker(pg_route), "t") as fresh:
        stale.release()
        assert isinstance(fresh, Lease)
        fresh.check()
        with pytest.raises(ThreadBusyError):
            take(pg_route, "t")


def test_a_stale_holders_writes_are_refused_by_the_database(pg_route: str, pg_dsn: str) -> None:
    """After a takeover, every write the stale runner sends carries its old token and is
    refused in the same statement (claim, release), or kept and the runner stopped
    (the outcome of an effect that ran); its fence check and checkpoint writes stop
    too. The new holder's writes go through."""
    config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    with open_postgres(pg_route) as p, thread_lock(p, "t") as lease:
        assert isinstance(lease, Lease)
        ledger = p.idempotency
        ledger.claim("k-ran", tool="pay", args_json="{}", thread_id="t")
        ledger.claim("k-not-run", tool="pay", args_json="{}", thread_id="t")
        lapse(pg_dsn, "t")
        fresh = take(other_worker(pg_route), "t")
        with pytest.raises(ThreadLockLostError):
            ledger.claim("k-new", tool="pay", args_json="{}", thread_id="t", fingerprint="f")
        with pytest.raises(ThreadLockLostError):
            ledger.claim("k-new2", tool="pay", args_json="{}", thread_id="t")
        with pytest.raises(ThreadLockLostError):
            ledger.release("k-not-run")
        with pytest.raises(ThreadLockLostError):
            ledger.record_outcome("k-ran", "paid")
        with pytest.raises(ThreadLockLostError):
            check_fence("t")
        with pytest.raises(ThreadLockLostError):
            p.checkpointer.put_writes(config, [("x", 1)], "task")
        assert ledger.get("k-new") is None
        assert ledger.get("k-new2") is None
        assert (ledger.get("k-not-run") or _none()).status == "pending"
        kept = ledger.get("k-ran")
        assert kept is not None
        assert (kept.status, kept.result) == ("done", "paid")
        with holding(fresh):  # the new owner's writes go through
            ledger.claim("k-new", tool="pay", args_json="{}", thread_id="t")
            assert ledger.release("k-not-run")
        fresh.release()


def _none() -> Any:
    raise AssertionError("no record")


async def test_a_stale_async_holders_writes_are_refused(pg_route: str, pg_dsn: str) -> None:
    """The same on the async stores (aopen_postgres, athread_lock on its async pool)."""
    async with aopen_postgres(pg_route) as p, p.athread_lock("t") as lease:
        assert isinstance(lease, Lease)
        await p.idempotency.aclaim("k1", tool="pay", args_json="{}", thread_id="t")
        await asyncio.to_thread(lapse, pg_dsn, "t")
        fresh = await asyncio.to_thread(take, other_worker(pg_route), "t")
        with pytest.raises(ThreadLockLostError):
            await p.idempotency.aclaim("k2", tool="pay", args_json="{}", thread_id="t")
        with pytest.raises(ThreadLockLostError):
            await p.idempotency.arelease("k1")
        with pytest.raises(ThreadLockLostError):
            await lease.acheck()
        assert await p.idempotency.aget("k2") is None
        await asyncio.to_thread(fresh.release)


@pytest.mark.slow
def test_renewal_keeps_a_long_holder_alive(pg_route: str) -> None:
    """A run holding a 1.5 s lease for 4 s keeps it: every check passes and others are
    refused throughout (renewed every 0.5 s in the background)."""
    with thread_lock(pg_route, "t", ttl=1.5) as lease:
        assert isinstance(lease, Lease)
        ends = time.monotonic() + 4.0
        while time.monotonic() < ends:
            lease.check()
            with pytest.raises(ThreadBusyError):
                take(other_worker(pg_route), "t")
            time.sleep(0.4)  # the run working, in real time: the lease lapses in real time


@pytest.mark.slow
async def test_async_renewal_keeps_a_long_holder_alive(pg_route: str) -> None:
    """The async holder's renewal task does the same."""
    async with athread_lock(pg_route, "t", ttl=1.5) as lease:
        assert isinstance(lease, Lease)
        for _ in range(10):
            await lease.acheck()
            await asyncio.sleep(0.4)


def test_wait_asks_again_with_a_backoff_on_the_clock(pg_route: str) -> None:
    """wait=<seconds> asks again after 10, 20, 40 ... ms (capped at 250 ms), slept on the
    injected clock, and gives up with ThreadBusyError once the wait is spent."""
    clock = FakeClock()
    with thread_lock(pg_route, "t"), pytest.raises(ThreadBusyError):
        thread_lock(other_worker(pg_route), "t", wait=1.0, clock=clock).__enter__()
    assert clock.sleeps[:6] == [0.01, 0.02, 0.04, 0.08, 0.16, 0.25]
    assert sum(clock.sleeps) == pytest.approx(1.0)


def test_wait_true_queues_behind_the_holder(pg_route: str) -> None:
    """wait=True gets the thread as soon as its holder lets go."""
    got = threading.Event()
    holding_now = threading.Event()

    def waiter() -> None:
        holding_now.wait(10)
        with thread_lock(other_worker(pg_route), "t", wait=True):
            got.set()

    queued = threading.Thread(target=waiter)
    queued.start()
    with thread_lock(pg_route, "t"):
        holding_now.set()
        time.sleep(0.3)  # the waiter is asking meanwhile, in real time
        assert not got.is_set()
    queued.join(10)
    assert got.is_set()


def test_a_sqlite_or_local_lock_gives_no_lease(tmp_path: Any) -> None:
    """A file lock has no token: the block gets None, and nothing is fenced."""
    with thread_lock(tmp_path / "threads.sqlite", "t") as held:
        assert held is None


def test_setup_waits_for_another_and_gives_up_cleanly(pg_route: str) -> None:
    """A start-up whose setup another process is running waits at most setup_timeout,
    then raises SetupTimeoutError naming the fix; once free it opens."""
    with open_postgres(pg_route):
        pass  # the tables exist
    other = take(other_worker(pg_route), SETUP_THREAD)
    started = time.monotonic()
    with (
        pytest.raises(SetupTimeoutError, match=r"setup=False"),
        open_postgres(pg_route, setup_timeout=0.5),
    ):
        pass
    assert time.monotonic() - started < 5
    other.release()
    with open_postgres(pg_route, setup_timeout=0.5):
        pass


def test_a_setup_whose_process_died_is_taken_over(pg_route: str, pg_dsn: str) -> None:
    """A start-up that died mid-setup holds nothing once its lease lapsed."""
    with open_postgres(pg_route):
        pass
    take(other_worker(pg_route), SETUP_THREAD)
    lapse(pg_dsn, SETUP_THREAD)
    with open_postgres(pg_route, setup_timeout=0.5):
        pass


def test_the_lease_table_is_created_on_first_use(pg_route: str) -> None:
    """thread_lock on a database nobody set up creates what it needs."""
    with thread_lock(pg_route, "t") as lease:
        assert isinstance(lease, Lease)
        lease.check()


def test_a_pooler_refusal_is_reported_as_the_servers_reason(
    pgbouncer: PgBouncer, pg_dsn: str
) -> None:
    """A connection PgBouncer refuses is reported with its reason, not as "check host,
    port, database and credentials"."""
    through = pgbouncer.dsn(pg_dsn)
    missing = pgbouncer.dsn(pg_dsn.rpartition("/")[0] + "/lgr_no_such_db")
    with pytest.raises(PersistenceError) as caught, open_postgres(missing, timeout=3):
        pass
    assert "check host" not in str(caught.value)
    assert "lgr_no_such_db" in str(caught.value)
    with open_postgres(through, timeout=3):
        pass


def test_a_ledger_set_up_before_leases_says_to_run_setup(pg_dsn: str) -> None:
    """Tables created by a version without the fence functions: the first write says to
    run setup() once (not a retried, generic ledger outage); after it, writes go on."""
    with open_postgres(pg_dsn) as p:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("DROP FUNCTION lgr_fenced(text, jsonb)")
        with pytest.raises(ConfigurationError, match=r"run setup\(\) once"):
            p.idempotency.claim("k", tool="pay", args_json="{}", thread_id="t")
        p.idempotency.setup()
        assert p.idempotency.claim("k", tool="pay", args_json="{}", thread_id="t").state == "new"


def test_a_ledger_set_up_before_the_claim_function_says_to_run_setup(pg_dsn: str) -> None:
    """Tables created by a version that claimed inline, without ``lgr_claim``: a claim
    says which function is missing and to run setup() once; after it, claims go on."""
    with open_postgres(pg_dsn) as p:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute("DROP FUNCTION lgr_claim(text[], text[], jsonb[], text[], text, jsonb)")
        with pytest.raises(ConfigurationError, match=r"lgr_claim.*run setup\(\) once"):
            p.idempotency.claim("k", tool="pay", args_json="{}", thread_id="t", fingerprint="f")
        p.idempotency.setup()
        claim = p.idempotency.claim("k", tool="pay", args_json="{}", thread_id="t", fingerprint="f")
        assert claim.state == "new"


def test_a_stale_holders_claim_is_refused_on_a_saver_connection(pg_dsn: str) -> None:
    """A ledger on LangGraph's own saver's single connection (under the saver's lock)
    is fenced the same: a stale holder's claim is refused, typed."""
    with PostgresSaver.from_conn_string(pg_dsn) as saver:
        saver.setup()
        ledger = PostgresIdempotencyStore(saver.conn, lock=saver.lock)
        ledger.setup()
        with thread_lock(pg_dsn, "t"):
            ledger.claim("k1", tool="pay", args_json="{}", thread_id="t")
            lapse(pg_dsn, "t")
            take(other_worker(pg_dsn), "t").release()
            with pytest.raises(ThreadLockLostError):
                ledger.claim("k2", tool="pay", args_json="{}", thread_id="t")
        assert ledger.get("k2") is None


def test_a_lock_whose_pool_closes_under_it_stops_renewing(
    pg_route: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A pool closed while a lock on it is held (its ``with`` block left first): the
    renewer gives up once the lease has lapsed, saying so once, and the lease is lost.
    Before, it asked the closed pool ten times a second for the life of the process."""
    before = set(threading.enumerate())
    pool = ConnectionPool(pg_route, kwargs={"autocommit": True}, min_size=1, open=False)
    with pool, thread_lock(pool, "tc", ttl=1.0) as lease:
        assert isinstance(lease, Lease)
        (renewer,) = [t for t in set(threading.enumerate()) - before if t.name == "lgr-lease"]
        pool.close()
        renewer.join(30)  # a bound for a hang, not a clock
        assert not renewer.is_alive()
        assert lease.lost
        with pytest.raises(ThreadLockLostError):
            lease.check()
    assert caplog.text.count("no renewal answered") == 1
    take(other_worker(pg_route), "tc").release()  # the thread is free again


async def test_an_async_lock_whose_pool_closes_under_it_stops_renewing(
    pg_route: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The async renewer task does the same."""
    pool = AsyncConnectionPool(pg_route, kwargs={"autocommit": True}, min_size=1, open=False)
    async with pool, athread_lock(pool, "tc", ttl=1.0) as lease:
        assert isinstance(lease, Lease)
        assert lease._task is not None
        await pool.close()
        await asyncio.wait_for(lease._task, 30)  # a bound for a hang, not a clock
        assert lease.lost
    assert caplog.text.count("no renewal answered") == 1


_DROP_ACQUIRE = "DROP FUNCTION lgr_acquire(text, text, float8, text)"


def test_a_lease_table_that_predates_the_acquire_function_gets_it(pg_dsn: str) -> None:
    """Leases set up by a version that took them inline: the next lease adds the
    function and is taken, through a DSN of its own and through a ledger's pool."""
    with open_postgres(pg_dsn) as p:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(_DROP_ACQUIRE)
        first = take(other_worker(pg_dsn), "predates-1")
        first.release()
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(_DROP_ACQUIRE)
        runner = p.idempotency.lease_runner
        assert runner is not None
        flow = acquire(runner, "predates-2", ttl=30.0, wait=False, clock=REAL, where="test")
        second = drive(flow, REAL)
        second.release()
    assert second.token > first.token
