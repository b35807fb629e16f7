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
