"""Fencing: a runner whose thread lease lapsed stops before it writes again, so a second
runner that takes the thread over is the only one that goes on (no fork, no double pay)."""

from __future__ import annotations

import contextlib
import pathlib
import time
import uuid
from typing import Any

import psycopg
import pytest

from langgraph_resilience import ThreadBusyError, open_postgres
from langgraph_resilience.errors import PersistenceError, ThreadLockLostError
from langgraph_resilience.stores import athread_lock, thread_lock
from langgraph_resilience.stores.held import check_fence
from tests.postgres.processes import finish, spawn

WORKER = pathlib.Path(__file__).with_name("fence_worker.py")

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def lapse_leases(dsn: str) -> int:
    """Every thread lease on the test's database lapses now (its holder missed its
    renewals: a paused process, a network cut); returns how many."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "UPDATE lgr_thread_leases SET expires_at = now() - interval '1 second' "
            "WHERE expires_at > now() RETURNING thread_id"
        ).fetchall()
    return len(rows)


def test_a_lost_lock_is_noticed_at_the_next_fence(pg_dsn: str) -> None:
    """The lease lapses: the holder's fence says so; a second runner may lock."""
    with open_postgres(pg_dsn) as p, thread_lock(p, "t1"):
        check_fence("t1")  # held: fine
        assert lapse_leases(pg_dsn) == 1
        with pytest.raises(ThreadLockLostError):
            check_fence("t1")
        config: Any = {"configurable": {"thread_id": "t1", "checkpoint_ns": ""}}
        with pytest.raises(ThreadLockLostError):
            p.checkpointer.put_writes(config, [("x", 1)], "task")
        with thread_lock(pg_dsn, "t1"):  # the thread is free for the next runner
            pass


def test_a_stuck_lease_connection_is_replaced(pg_dsn: str) -> None:
    """A lease statement whose answer was never read (a round trip cut short) leaves the
    process's lease connection unable to run anything ("another command is already in
    progress"). The next statement replaces the connection; the lease, which lives in a
    table and not in the session, is still held."""
    with thread_lock(pg_dsn, "t1") as lease:
        assert lease is not None
        client: Any = lease.runner
        stuck = client._conn
        stuck.pgconn.send_query(b"SELECT 1")  # sent; its answer is never read
        check_fence("t1")
        with thread_lock(pg_dsn, "t2"):
            check_fence("t2")
        assert stuck.closed
        with pytest.raises(ThreadBusyError):
            thread_lock(pg_dsn, "t1").__enter__()


def test_a_busy_given_connection_is_named_not_replaced(pg_dsn: str) -> None:
    """A connection the caller gave is never replaced: one left busy or in a failed
    transaction gets an error that says so and what to pass instead, not "cannot
    connect"; the connection is left as it was."""
    with contextlib.closing(psycopg.connect(pg_dsn, autocommit=True)) as conn:
        conn.pgconn.send_query(b"SELECT 1")  # sent; its answer is never read
        busy = pytest.raises(PersistenceError, match=r"is busy.*used for nothing else")
        with busy, thread_lock(conn, "t1"):
            pass
        assert not conn.closed
    with psycopg.connect(pg_dsn) as conn:
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1 / 0")
        failed = pytest.raises(PersistenceError, match=r"failed transaction.*rollback\(\)")
        with failed, thread_lock(conn, "t1"):
            pass
        conn.rollback()
        with thread_lock(conn, "t1"):
            check_fence("t1")


async def test_a_busy_given_async_connection_is_named(pg_dsn: str) -> None:
    """`athread_lock` on a caller's busy `AsyncConnection`: the same typed error."""
    conn = await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True)
    try:
        conn.pgconn.send_query(b"SELECT 1")  # sent; its answer is never read
        with pytest.raises(PersistenceError, match=r"is busy.*used for nothing else"):
            async with athread_lock(conn, "t1"):
                pass
    finally:
        await conn.close()


def run_scenario(dsn: str, tmp: pathlib.Path, mode: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A blocks in its lookup under the lock; its lease lapses; B resumes the thread and
    finishes it; then A is released. Returns (A's result, B's result)."""
    thread, release = uuid.uuid4().hex, tmp / f"release-{uuid.uuid4().hex}"
    common = ["--dsn", dsn, "--thread", thread, "--mode", mode]
    first = spawn(WORKER, "start", *common, "--block", str(release))
    blocked = release.with_suffix(".blocked")
    deadline = time.monotonic() + 60
    while not blocked.exists():
        assert first.poll() is None, first.communicate()[1]
        assert time.monotonic() < deadline, "the first runner never reached its lookup"
        time.sleep(0.02)  # polling another process's marker file
    assert lapse_leases(dsn) == 1
    second = finish(spawn(WORKER, "resume", *common))
    release.write_text("go")
    return finish(first), second


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_runner_that_lost_its_lock_stops_and_the_thread_pays_once(
    pg_dsn: str, tmp_path: pathlib.Path, mode: str
) -> None:
    """The second runner pays and finishes; the first stops at its next write: one payment."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE payments (id serial PRIMARY KEY, key text, amount int)")

    first, second = run_scenario(pg_dsn, tmp_path, mode)

    assert second == {"last": "paid"}
    assert first == {"lost": True}
    with psycopg.connect(pg_dsn) as conn:
        payments = conn.execute("SELECT count(*) FROM payments").fetchone()
    assert payments == (1,)


def _counting_checks(monkeypatch: pytest.MonkeyPatch, lease: Any) -> list[str]:
    """The fence checks `lease` sends to the database from now on (a spy on the
    statements it builds; they still run on the real server)."""
    from langgraph_resilience.stores import lease_sql, leases  # noqa: PLC0415

    sent: list[str] = []
    statement = leases.Lease._statement

    def counted(self: Any, query: str, **extra: Any) -> Any:
        sent.extend(["check"] if self is lease and query == lease_sql.CHECK else [])
        return statement(self, query, **extra)

    monkeypatch.setattr(leases.Lease, "_statement", counted)
    return sent


def test_after_a_claim_a_fresh_lease_is_not_asked_again(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Right after a side effect's claim (a fenced write), its fence check sends nothing
    while the lease is fresh: renewed less than two thirds of its TTL ago, so it cannot
    lapse before the effect and its outcome are written. A check without a claim, or
    one whose lease was last renewed longer ago, still asks the database, and a lease
    that lapsed still stops the run."""
    with thread_lock(pg_dsn, "t1") as lease:
        assert lease is not None
        sent = _counting_checks(monkeypatch, lease)
        assert lease.fresh()
        check_fence("t1", claimed=True)
        assert sent == []
        check_fence("t1")  # a checkpoint write's check: no intent guards what follows
        assert sent == ["check"]
        lease.confirmed = (lease.confirmed or 0.0) - lease.ttl  # renewed a TTL ago
        assert not lease.fresh()
        check_fence("t1", claimed=True)
        assert sent == ["check", "check"]
        assert lapse_leases(pg_dsn) == 1
        with pytest.raises(ThreadLockLostError):
            check_fence("t1", claimed=True)


async def test_an_async_fresh_lease_after_a_claim_is_not_asked_again(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same through `acheck_fence`; a lease given up is never fresh."""
    from langgraph_resilience.stores.held import acheck_fence  # noqa: PLC0415

    async with athread_lock(pg_dsn, "t1") as lease:
        assert lease is not None
        sent = _counting_checks(monkeypatch, lease)
        await acheck_fence("t1", claimed=True)
        assert sent == []
        lease.give_up()
        assert not lease.fresh()
        await acheck_fence("t1", claimed=True)
        assert sent == ["check"]


def test_a_side_effect_sends_no_fence_check_after_its_claim(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through ``add_resilience`` on LangGraph's own PostgresSaver with the Postgres
    ledger: each payment is claimed (fenced by the run's lease), paid once and
    answered, and no fence check goes to the database before it."""
    from langchain_core.messages import ToolMessage  # noqa: PLC0415
    from psycopg_pool import ConnectionPool  # noqa: PLC0415

    from langgraph_resilience import ToolProfile  # noqa: PLC0415
    from langgraph_resilience.stores import leases  # noqa: PLC0415
    from langgraph_resilience.stores.persistence import (  # noqa: PLC0415
        POSTGRES_CONNECTION_KWARGS,
    )
    from langgraph_resilience.stores.postgres_ledger import (  # noqa: PLC0415
        PostgresIdempotencyStore,
    )
    from tests.postgres.payments import pay_in_one_step  # noqa: PLC0415

    checks: list[str] = []
    original = leases.Lease._checked

    def counted(self: Any) -> Any:
        checks.append(self.thread_id)
        return original(self)

    monkeypatch.setattr(leases.Lease, "_checked", counted)
    with ConnectionPool(pg_dsn, min_size=1, max_size=6, kwargs=POSTGRES_CONNECTION_KWARGS) as pool:
        ledger = PostgresIdempotencyStore(pool)
        ledger.setup()
        calls = [("c1", "o1"), ("c2", "o2")]
        out, paid, thread = pay_in_one_step(pool, ledger, calls, ToolProfile(side_effect=True))
        records = ledger.for_thread(thread)

    answers = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert sorted(paid) == ["o1", "o2"]
    assert sorted((m.tool_call_id, m.status) for m in answers) == [
        ("c1", "success"),
        ("c2", "success"),
    ]
    assert sorted(r.status for r in records) == ["done", "done"]  # claimed, then recorded
    assert checks == []
