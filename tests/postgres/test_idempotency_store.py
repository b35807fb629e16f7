"""The durable side-effect ledger, saga log, thread lock and resume helpers on real PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from langgraph.graph import END, START, StateGraph
from psycopg_pool import AsyncConnectionPool, ConnectionPool
from typing_extensions import TypedDict

from langgraph_resilience.errors import (
    PersistenceError,
    ThreadBusyError,
    ThreadNotFoundError,
)
from langgraph_resilience.stores.locks import (
    LOCK_APPLICATION_NAME,
    athread_lock,
    thread_lock,
)
from langgraph_resilience.stores.persistence import (
    POSTGRES_CONNECTION_KWARGS,
    aopen_postgres,
    open_postgres,
    open_sqlite,
)
from langgraph_resilience.stores.postgres_ledger import (
    AsyncPostgresIdempotencyStore,
    PostgresIdempotencyStore,
    PostgresSagaLog,
)
from langgraph_resilience.stores.threads import (
    alist_threads,
    list_threads,
    resume,
    thread_status,
)

WORKER = pathlib.Path(__file__).with_name("idempotency_worker.py")
ROOT = pathlib.Path(__file__).resolve().parents[2]
BARRIER_KEY = 4242
SECRET = "s3cr3t-pw"

pytestmark = [pytest.mark.postgres]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _worker(*args: str) -> list[str]:
    return [sys.executable, str(WORKER), *args]


def _run_worker(*args: str) -> dict[str, Any]:
    done = subprocess.run(
        _worker(*args), env=_env(), capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _wait_for(predicate: Any, what: str, proc: subprocess.Popen[Any] | None = None) -> None:
    deadline = time.monotonic() + 60
    while not predicate():
        assert proc is None or proc.poll() is None, f"the worker exited before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)  # polling a real subprocess or server, not standing in for a clock


WAITING_ON_ROW = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
    "AND wait_event_type = 'Lock' AND query LIKE '%lgr_idempotency%'"
)
WAITING_ADVISORY = (
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted "
    "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)


def _count(conn: psycopg.Connection[Any], query: str) -> int:
    row = conn.execute(query).fetchone()  # type: ignore[arg-type]
    return int(row[0]) if row else 0


def _kill(proc: subprocess.Popen[Any]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


@pytest.fixture
def pool(pg_dsn: str) -> Iterator[ConnectionPool[Any]]:
    """A pool configured as LangGraph's PostgresSaver needs, with our tables set up."""
    with ConnectionPool(
        pg_dsn, min_size=1, max_size=20, kwargs=POSTGRES_CONNECTION_KWARGS, open=True
    ) as pool:
        PostgresIdempotencyStore(pool).setup()
        PostgresSagaLog(pool).setup()
        yield pool


# ------------------------------------------------------------------ the ledger


@pytest.mark.parametrize("sync_outcomes", [False, True])
def test_claim_outcome_round_trip(pool: ConnectionPool[Any], sync_outcomes: bool) -> None:
    """new -> pending -> record -> done with the exact JSON result; the first outcome wins."""
    store = PostgresIdempotencyStore(pool, sync_outcomes=sync_outcomes)
    result = {"payment_id": "p_1", "amounts": [1, 2.5], "note": "déjà vu", "ok": True}

    first = store.claim("pay:1", tool="pay", args_json='{"amount":5}', thread_id="t1")
    again = store.claim("pay:1", tool="pay", args_json='{"amount":5}', thread_id="t1")
    recorded = store.record_outcome("pay:1", result)
    second = store.record_outcome("pay:1", {"payment_id": "p_2"})
    replay = store.claim("pay:1", tool="pay", args_json='{"amount":5}', thread_id="t1")

    assert (first.state, again.state, replay.state) == ("new", "pending", "done")
    assert recorded.status == "done"
    assert recorded.result == result
    assert second.result == result
    assert replay.result == result
    assert replay.record.tool == "pay"
    assert replay.record.thread_id == "t1"
    assert replay.record.args == {"amount": 5}


def test_the_records_a_claim_and_an_outcome_return_match_a_read(
    pool: ConnectionPool[Any],
) -> None:
    """The claim and the outcome read back only the key (their caller knows the rest):
    what they return holds the fields a read returns, args redacted, the result as
    JSON; a claim that finds pending siblings still returns them whole."""
    store = PostgresIdempotencyStore(pool)
    args = '{"password":"p","user":"u"}'
    sibling = store.claim("s", tool="login", args_json=args, thread_id="t", fingerprint="f")
    claim = store.claim("k", tool="login", args_json=args, thread_id="t", fingerprint="f")
    stored = store.get("k")
    assert stored is not None
    fields = ("key", "status", "tool", "thread_id", "args", "fingerprint")
    assert [getattr(claim.record, f) for f in fields] == [getattr(stored, f) for f in fields]
    assert claim.record.args == {"password": "[REDACTED]", "user": "u"}
    assert claim.unresolved is not None
    [found] = claim.unresolved
    assert [getattr(found, f) for f in fields] == [getattr(sibling.record, f) for f in fields]
    assert found.created_at is not None
    assert found.age_s is not None

    recorded = store.record_outcome("k", {"ids": (1, 2)})
    stored = store.get("k")
    assert stored is not None
    assert (recorded.key, recorded.status, recorded.result) == ("k", "done", {"ids": [1, 2]})
    assert recorded.result == stored.result


def test_a_claim_returns_the_done_records_of_its_effect_newest_first(
    pool: ConnectionPool[Any],
) -> None:
    """In the claim's one round trip: the keys of the thread's done records of the same
    fingerprint (what a rewound thread is checked against); `done_keys` reads the
    same."""
    store = PostgresIdempotencyStore(pool)
    for key in ("d1", "d2", "p"):
        store.claim(key, tool="pay", args_json="{}", thread_id="t", fingerprint="f")
    store.record_outcome("d1", "ok")
    store.record_outcome("d2", "ok")
    claim = store.claim("new", tool="pay", args_json="{}", thread_id="t", fingerprint="f")
    assert set(claim.done or ()) == {"d1", "d2"}
    assert [r.key for r in claim.unresolved or ()] == ["p"]
    assert set(store.done_keys("t", "f")) == {"d1", "d2"}
    assert store.done_keys("t", "other") == []


def test_failed_outcome_release_and_thread_listing(pool: ConnectionPool[Any]) -> None:
    """A failed outcome replays as failed until released; a done one is never released."""
    store = PostgresIdempotencyStore(pool)
    store.claim("a", tool="pay", args_json="{}", thread_id="t")
    store.claim("b", tool="pay", args_json='{"password":"hunter2"}', thread_id="t")
    store.claim("c", tool="mail", args_json="{}", thread_id="other")
    store.record_outcome("a", {"error": "card declined"}, status="failed")
    store.record_outcome("c", "sent")

    assert store.claim("a", tool="pay", args_json="{}", thread_id="t").status == "failed"
    assert store.release("a") is True
    assert store.claim("a", tool="pay", args_json="{}", thread_id="t").state == "new"
    assert store.release("c") is False
    assert store.get("c") is not None
    assert store.get("missing") is None
    by_key = {r.key: r for r in store.for_thread("t")}
    assert set(by_key) == {"a", "b"}
    assert by_key["b"].args == {"password": "[REDACTED]"}


def test_claim_is_atomic_across_threads(pool: ConnectionPool[Any]) -> None:
    """16 threads claim one key at the same instant: exactly one is told to execute."""
    store = PostgresIdempotencyStore(pool)
    barrier = threading.Barrier(16)
    states: list[str] = []

    def claim() -> None:
        barrier.wait()
        states.append(store.claim("race", tool="pay", args_json="{}", thread_id="t").state)

    threads = [threading.Thread(target=claim) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(states) == ["new"] + ["pending"] * 15


@pytest.mark.slow
def test_claim_is_atomic_across_processes(pg_dsn: str, pool: ConnectionPool[Any]) -> None:
    """4 processes released together by a Postgres barrier: exactly one claims `new`."""
    workers = 4
    with psycopg.connect(pg_dsn, autocommit=True) as gate:
        gate.execute("SELECT pg_advisory_lock(%s)", (BARRIER_KEY,))
        procs = [
            subprocess.Popen(
                _worker("claim", "--dsn", pg_dsn, "--key", "proc-race"),
                env=_env(),
                stdout=subprocess.PIPE,
                text=True,
            )
            for _ in range(workers)
        ]

        _wait_for(
            lambda: _count(gate, WAITING_ADVISORY) == workers, "every worker to reach the barrier"
        )
        gate.execute("SELECT pg_advisory_unlock(%s)", (BARRIER_KEY,))
        outputs = [proc.communicate(timeout=60)[0] for proc in procs]

    states = sorted(json.loads(out)["state"] for out in outputs)
    assert states == ["new"] + ["pending"] * (workers - 1)


def test_claim_racing_an_uncommitted_insert_reads_the_winner(
    pg_dsn: str, pool: ConnectionPool[Any]
) -> None:
    """A claim that waited on another worker's insert sees that row, not nothing."""
    store = PostgresIdempotencyStore(pool)
    claims: list[Any] = []
    with psycopg.connect(pg_dsn) as other:  # a transaction, not autocommit
        other.execute(
            "INSERT INTO lgr_idempotency (key, tool, thread_id) VALUES ('slow', 'pay', 't')"
        )
        claimer = threading.Thread(
            target=lambda: claims.append(
                store.claim("slow", tool="pay", args_json="{}", thread_id="t")
            )
        )
        claimer.start()
        with psycopg.connect(pg_dsn, autocommit=True) as watch:
            _wait_for(
                lambda: _count(watch, WAITING_ON_ROW) >= 1,
                "the claim to wait on the uncommitted row",
            )
        other.commit()
        claimer.join(timeout=30)

    assert [c.state for c in claims] == ["pending"]


async def test_async_store_round_trip(pg_dsn: str, pool: ConnectionPool[Any]) -> None:
    """The AsyncConnectionPool store claims atomically and records outcomes like the sync one."""
    async with AsyncConnectionPool(
        pg_dsn, min_size=1, max_size=10, kwargs=POSTGRES_CONNECTION_KWARGS, open=False
    ) as apool:
        store = AsyncPostgresIdempotencyStore(apool)
        claims = await asyncio.gather(
            *(store.aclaim("k", tool="pay", args_json="{}", thread_id="t") for _ in range(8))
        )
        recorded = await store.arecord_outcome("k", {"id": 7})
        replay = await store.aclaim("k", tool="pay", args_json="{}", thread_id="t")
        from_thread = await asyncio.to_thread(store.get, "k")
        with pytest.raises(asyncio.InvalidStateError):
            store.get("k")  # sync call on the loop's own thread would deadlock

    assert sorted(c.state for c in claims) == ["new"] + ["pending"] * 7
    assert recorded.result == {"id": 7}
    assert replay.state == "done"
    assert from_thread is not None
    assert from_thread.result == {"id": 7}


# ------------------------------------------------------------------ saga


def _record_three_payments(pool: ConnectionPool[Any], pg_dsn: str, thread: str) -> list[str]:
    store, saga = PostgresIdempotencyStore(pool), PostgresSagaLog(pool)
    keys = []
    for n in (1, 2, 3):
        key = f"pay:{n}"
        store.claim(key, tool="pay", args_json=json.dumps({"n": n}), thread_id=thread)
        store.record_outcome(key, {"payment_id": f"p_{n}"})
        saga.append(thread, key=key, tool="pay", action="effect", status="done")
        keys.append(key)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE refunds (id serial PRIMARY KEY, comp_key text UNIQUE, payment text)"
        )
    return keys


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("placement", ["before", "after"])
def test_saga_compensates_lifo_exactly_once_across_a_sigkill(
    pg_dsn: str, pool: ConnectionPool[Any], tmp_path: pathlib.Path, mode: str, placement: str
) -> None:
    """Three payments, a compensation run killed inside the 2nd refund, a rerun: 3 refunds, LIFO."""
    thread = uuid.uuid4().hex
    _record_three_payments(pool, pg_dsn, thread)
    marker = tmp_path / "blocked"
    common = ["--dsn", pg_dsn, "--thread", thread, "--mode", mode, "--marker", str(marker)]

    first = subprocess.Popen(
        _worker("compensate", *common, "--block-on", "pay:2", "--placement", placement),
        env=_env(),
    )
    _wait_for(marker.exists, "the second refund to start", first)
    _kill(first)
    rerun = _run_worker("compensate", *common)

    with psycopg.connect(pg_dsn) as conn:
        refunds = conn.execute("SELECT payment FROM refunds ORDER BY id").fetchall()
    assert [r[0] for r in refunds] == ["p_3", "p_2", "p_1"]
    assert rerun["ok"] is True
    outcomes = [(s["key"], s["outcome"]) for s in rerun["steps"]]
    assert outcomes == [
        ("pay:3", "already_compensated"),
        ("pay:2", "compensated"),
        ("pay:1", "compensated"),
    ]
    statuses = [
        (e.key, e.status)
        for e in PostgresSagaLog(pool).entries(thread)
        if e.action == "compensate" and e.key == "pay:2"
    ]
    expected_end = ("pay:2", "reconciled") if placement == "after" else ("pay:2", "done")
    assert statuses[-1] == expected_end


# ------------------------------------------------------------------ one runner per thread


@pytest.mark.slow
def test_a_second_process_gets_thread_busy_until_the_holder_dies(
    pg_dsn: str, tmp_path: pathlib.Path
) -> None:
    """Two processes lock one thread: the second gets ThreadBusyError; once the holder is
    SIGKILLed its lease lapses (a 2 s TTL here) and the thread is free again."""
    marker = tmp_path / "locked"
    holder = subprocess.Popen(
        _worker(
            "hold-lock", "--dsn", pg_dsn, "--thread", "t-busy", "--marker", str(marker),
            "--ttl", "2",
        ),
        env=_env(),
    )  # fmt: skip
    _wait_for(marker.exists, "the holder to take the lock", holder)

    busy = _run_worker("try-lock", "--dsn", pg_dsn, "--thread", "t-busy")
    other_thread = _run_worker("try-lock", "--dsn", pg_dsn, "--thread", "t-other")
    _kill(holder)
    killed = time.monotonic()
    after = _run_worker("try-lock", "--dsn", pg_dsn, "--thread", "t-busy", "--wait", "30")

    assert busy["acquired"] is False
    assert busy["thread_id"] == "t-busy"
    assert "another runner" in busy["error"]
    assert "lapses in" in busy["error"]
    assert other_thread["acquired"] is True
    assert after["acquired"] is True
    assert time.monotonic() - killed < 15


def test_thread_lock_waits_when_asked(pg_dsn: str) -> None:
    """wait=<seconds> gives up with ThreadBusyError; wait=True queues behind the holder."""
    acquired = threading.Event()
    with thread_lock(pg_dsn, "t-wait"):
        with pytest.raises(ThreadBusyError), thread_lock(pg_dsn, "t-wait", wait=0.05):
            pass

        def waiter() -> None:
            with thread_lock(pg_dsn, "t-wait", wait=True):
                acquired.set()

        queued = threading.Thread(target=waiter)
        queued.start()
        time.sleep(0.3)  # the waiter asks again meanwhile (real time: the lease is real)
        assert not acquired.is_set()
    queued.join(timeout=30)
    assert acquired.is_set()


async def test_async_thread_lock_excludes_sync_and_async_runners(pg_dsn: str) -> None:
    """athread_lock and thread_lock use the same advisory lock."""

    def sync_runner() -> None:
        with thread_lock(pg_dsn, "t-async"):
            pass

    async with athread_lock(pg_dsn, "t-async"):
        with pytest.raises(ThreadBusyError):
            await asyncio.to_thread(sync_runner)
        with pytest.raises(ThreadBusyError):
            async with athread_lock(pg_dsn, "t-async", wait=0.05):
                pass
    async with athread_lock(pg_dsn, "t-async"):
        pass


def test_many_runs_share_one_lock_connection(pg_dsn: str) -> None:
    """50 runs of one process hold 50 thread leases through a single connection of its
    own; a 2nd run of a held thread is refused."""
    with contextlib.ExitStack() as stack, psycopg.connect(pg_dsn, autocommit=True) as watch:
        for n in range(50):
            stack.enter_context(thread_lock(pg_dsn, f"t-{n}"))
        with pytest.raises(ThreadBusyError, match="another run in this process"):
            thread_lock(pg_dsn, "t-7").__enter__()
        leases = _count(watch, "SELECT count(*) FROM lgr_thread_leases WHERE expires_at > now()")
        sessions = _count(
            watch,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            f"AND application_name = '{LOCK_APPLICATION_NAME}'",
        )
    assert (leases, sessions) == (50, 1)
    with thread_lock(pg_dsn, "t-7"):
        pass


def test_lock_connection_survives_a_terminated_backend(pg_dsn: str) -> None:
    """When the server ends the lease connection, the next lock reconnects instead of
    failing, and the lease held meanwhile is still held (it lives in a table)."""
    with thread_lock(pg_dsn, "t-a") as lease, psycopg.connect(pg_dsn, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE application_name = %s AND datname = current_database()",
            (LOCK_APPLICATION_NAME,),
        )
        assert lease is not None
        lease.check()
        with pytest.raises(ThreadBusyError):
            thread_lock(pg_dsn, "t-a").__enter__()
    with thread_lock(pg_dsn, "t-b"):
        pass


# ------------------------------------------------------------------ opening


@pytest.mark.parametrize(
    "dsn",
    [
        f"postgresql://postgres:{SECRET}@127.0.0.1:1/postgres",
        f"postgresql://postgres:{SECRET}@127.0.0.1:5432/no_such_database_lgr",
    ],
    ids=["wrong-port", "wrong-database"],
)
def test_open_postgres_failure_names_the_dsn_without_password(dsn: str) -> None:
    """A wrong port or database: PersistenceError naming host and database, never the password."""
    with pytest.raises(PersistenceError) as caught, open_postgres(dsn, timeout=3):
        pass
    message = str(caught.value)
    assert SECRET not in message
    assert "postgresql://postgres:***@127.0.0.1" in message
    assert caught.value.__cause__ is None
    assert caught.value.__suppress_context__


@pytest.mark.parametrize(
    "dsn",
    [
        f"postgresql://postgres:{SECRET}@127.0.0.1:1/postgres",
        f"postgresql://postgres:{SECRET}@127.0.0.1:5432/no_such_database_lgr",
    ],
    ids=["wrong-port", "wrong-database"],
)
async def test_aopen_postgres_failure_names_the_dsn_without_password(dsn: str) -> None:
    """The async opener fails the same way, without the password."""
    with pytest.raises(PersistenceError) as caught:
        async with aopen_postgres(dsn, timeout=3):
            pass
    assert SECRET not in str(caught.value)
    assert "***@127.0.0.1" in str(caught.value)


def test_open_sqlite_in_a_read_only_place_is_a_clear_error() -> None:
    """A path where nothing can be written (procfs, even as root): PersistenceError naming it."""
    with pytest.raises(PersistenceError) as caught, open_sqlite("/proc/self/lgr/threads.sqlite"):
        pass
    assert "/proc/self/lgr/threads.sqlite" in str(caught.value)
    assert "writable" in str(caught.value)


_READ_ONLY_PROBE = """
import sys
from langgraph_resilience.errors import PersistenceError
from langgraph_resilience.stores.persistence import open_sqlite
try:
    with open_sqlite(sys.argv[1]):
        pass
except PersistenceError as exc:
    print(exc)
    sys.exit(3)
"""


def test_open_sqlite_in_a_read_only_directory_is_a_clear_error(tmp_path: pathlib.Path) -> None:
    """A chmod 555 directory: PersistenceError naming the file (root runs without DAC override)."""
    directory = tmp_path / "ro"
    directory.mkdir()
    directory.chmod(0o555)
    command = [sys.executable, "-c", _READ_ONLY_PROBE, str(directory / "threads.sqlite")]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: cannot make a directory read-only")
        drop = "-dac_override,-dac_read_search"
        command = [setpriv, f"--inh-caps={drop}", f"--bounding-set={drop}", *command]
    try:
        done = subprocess.run(
            command, env=_env(), capture_output=True, text=True, timeout=60, check=False
        )
    finally:
        directory.chmod(0o755)
    assert done.returncode == 3, done.stderr
    assert str(directory / "threads.sqlite") in done.stdout
    assert "Traceback" not in done.stderr


class Counter(TypedDict):
    n: int


def _counter_graph() -> StateGraph[Any, Any, Any, Any]:
    builder: StateGraph[Any, Any, Any, Any] = StateGraph(Counter)
    builder.add_node("add", lambda s: {"n": s["n"] + 1})
    builder.add_edge(START, "add")
    builder.add_edge("add", END)
    return builder


async def test_aopen_postgres_runs_an_async_graph_with_the_ledger(pg_dsn: str) -> None:
    """aopen_postgres: async pool, saver, store and ledgers that a graph and a second open see."""
    async with aopen_postgres(pg_dsn) as p:
        assert isinstance(p.pool, AsyncConnectionPool)
        app = _counter_graph().compile(checkpointer=p.checkpointer, store=p.store)
        out = await app.ainvoke({"n": 1}, {"configurable": {"thread_id": "a1"}})
        claim = await p.idempotency.aclaim("k", tool="pay", args_json="{}", thread_id="a1")
        await p.idempotency.arecord_outcome("k", {"ok": 1})
        await p.saga.aappend("a1", key="k", tool="pay", action="effect", status="done")
        threads = await alist_threads(p.checkpointer)
        assert "***" not in p.target
    with open_postgres(pg_dsn) as again:
        record = again.idempotency.get("k")
        entries = again.saga.entries("a1")
        with psycopg.connect(pg_dsn) as conn:
            tables = {
                r[0]
                for r in conn.execute(
                    "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
                ).fetchall()
            }

    assert out == {"n": 2}
    assert claim.state == "new"
    assert threads == ["a1"]
    assert record is not None
    assert record.result == {"ok": 1}
    assert [e.action for e in entries] == ["effect"]
    assert {"checkpoints", "store", "lgr_idempotency", "lgr_saga"} <= tables


# ------------------------------------------------------------------ resume and status


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_interrupted_thread_is_resumed_from_another_process(pg_dsn: str, mode: str) -> None:
    """interrupt() in one process, Command(resume=...) by thread_id in another: charged once."""
    with open_postgres(pg_dsn), psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE payments (key text, order_id text)")
    thread = uuid.uuid4().hex

    started = _run_worker("approve-start", "--dsn", pg_dsn, "--thread", thread)
    resumed = _run_worker(
        "approve-resume", "--dsn", pg_dsn, "--thread", thread, "--mode", mode, "--decision", "yes"
    )

    assert started["state"] == "interrupted"
    assert started["next"] == ["ask"]
    assert started["interrupts"] == [{"question": "charge this order?", "order": "o-17"}]
    assert resumed["status"]["state"] == "done"
    assert resumed["status"]["effects"] == {
        "pending": 0,
        "done": 1,
        "failed": 0,
        "unknown": 0,
        "compensated": 0,
    }
    assert resumed["values"]["decision"] == "yes"
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute("SELECT order_id FROM payments").fetchall()
    assert rows == [("o-17",)]


class Steps(TypedDict, total=False):
    log: str


def _two_steps(fail: bool) -> StateGraph[Any, Any, Any, Any]:
    def first(state: Steps) -> Steps:
        return {"log": "first"}

    def second(state: Steps) -> Steps:
        if fail:
            raise RuntimeError(f"upstream refused password={SECRET}")
        return {"log": "second"}

    builder: StateGraph[Any, Any, Any, Any] = StateGraph(Steps)
    builder.add_node("first", first)
    builder.add_node("second", second)
    builder.add_edge(START, "first")
    builder.add_edge("first", "second")
    builder.add_edge("second", END)
    return builder


def test_thread_status_reports_failed_pending_running_and_done(pg_dsn: str) -> None:
    """Status tells failed (redacted error) from pending, running (locked elsewhere) and done."""
    with open_postgres(pg_dsn) as p:
        failing = _two_steps(fail=True).compile(checkpointer=p.checkpointer)
        with pytest.raises(RuntimeError):
            failing.invoke({}, {"configurable": {"thread_id": "f"}}, durability="sync")
        failed = thread_status(failing, "f", persistence=p)

        paused = _two_steps(fail=False).compile(
            checkpointer=p.checkpointer, interrupt_before=["second"]
        )
        paused.invoke({}, {"configurable": {"thread_id": "p"}}, durability="sync")
        pending = thread_status(paused, "p", persistence=p)
        with thread_lock(pg_dsn, "p"):
            running = thread_status(paused, "p", persistence=p)
        resume(paused, "p", lock=p)
        done = thread_status(paused, "p", persistence=p)
        missing = thread_status(paused, "nope", persistence=p)
        with pytest.raises(ThreadNotFoundError):
            resume(paused, "nope", lock=p)
        threads = set(list_threads(p.checkpointer))

    assert failed.state == "failed"
    assert failed.next == ("second",)
    assert failed.error is not None
    assert "upstream refused" in failed.error
    assert SECRET not in failed.error
    assert (pending.state, pending.next) == ("pending", ("second",))
    assert running.state == "running"
    assert (done.state, done.next) == ("done", ())
    assert missing.state == "not_found"
    assert threads == {"f", "p"}
