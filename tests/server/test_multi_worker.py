"""A real multi-worker LangGraph Server: two ``langhost`` processes (stock
``langgraph-api`` on ``langgraph-runtime-pg``) on one Postgres database and one Redis.

A worker is SIGKILLed while its refund is on the wire; the runtime's heartbeat sweep
re-queues the run and the other worker finishes it. With ``shared`` (our Postgres
ledger and breakers, opened once per worker) the refund happens once; ``plain``
(LangGraph's ``ToolNode``) refunds again. Effects are rows in a real Postgres table.
Both workers then report to one breaker: the single row they share.
"""

from __future__ import annotations

import signal
import time
from typing import Any

import psycopg
import pytest
from langgraph_sdk.client import SyncLangGraphClient

from langgraph_resilience.stores.postgres_breakers import PostgresBreakerStore
from tests.server.conftest import effects, new_order, run_finished, start_run
from tests.server.pg_runtime import Cluster, cluster_fixture  # noqa: F401  (`cluster`)

TAKEOVER_TIMEOUT = 30.0  # heartbeat 1 s: its key expires after 4 s, a sweep runs every 2 s


def _last_message(client: SyncLangGraphClient, thread_id: str) -> dict[str, Any]:
    values = client.threads.get_state(thread_id)["values"]
    assert isinstance(values, dict)
    return dict(values["messages"][-1])


def _ledger(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT status, count(*) FROM lgr_idempotency GROUP BY status")
        return {str(status): int(count) for status, count in rows.fetchall()}


def _breaker_window(dsn: str, key: str) -> tuple[int, int]:
    """(calls, failures) in the shared breaker `key`, as every worker reads it."""
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=0) as conn:
        state = PostgresBreakerStore(conn).snapshot(key)
    assert state.status == "closed"
    if state.window is None:  # no row yet: nothing has been written to it
        return 0, 0
    return state.window.calls, state.window.failures


def _window_reaching(dsn: str, key: str, expected: tuple[int, int]) -> tuple[int, int]:
    """The shared window once the workers' batched successes have landed (they are
    written within `SUCCESS_FLUSH_INTERVAL` of the run's end, by each worker): polled
    for up to 5 s of the servers' real time, then the last value read."""
    deadline = time.monotonic() + 5.0
    window = _breaker_window(dsn, key)
    while window != expected and time.monotonic() < deadline:
        time.sleep(0.05)
        window = _breaker_window(dsn, key)
    return window


@pytest.mark.parametrize(("graph", "expected"), [("shared", 1), ("plain", 2)])
def test_a_worker_killed_mid_effect_the_other_finishes_the_run(
    cluster: Cluster, graph: str, expected: int
) -> None:
    """SIGKILL of the worker running the refund, after its effect: the run stays
    ``running`` until its heartbeat expires, then the other worker claims it and the
    thread completes. Ours answers the replayed call from the shared ledger (the status
    check finds the row); plain ``ToolNode`` refunds again."""
    order = new_order()
    cluster.hold()
    thread_id, run_id = start_run(cluster.workers[0].client(), graph, f"refund {order}")
    victim = cluster.worker_running(order)
    survivor = cluster.other(victim)
    factory_calls = survivor.factory_calls()
    client = survivor.client()

    killed = time.monotonic()
    victim.stop(signal.SIGKILL)
    assert client.runs.get(thread_id, run_id)["status"] == "running"  # nobody finished it
    cluster.release()

    deadline = killed + TAKEOVER_TIMEOUT
    while not (order in survivor.effects_started() or survivor.factory_calls() > factory_calls):
        if time.monotonic() > deadline:
            pytest.fail(f"the run was not taken over in {TAKEOVER_TIMEOUT:g}s:\n{cluster.tails()}")
        time.sleep(0.05)
    took_over = time.monotonic() - killed
    status = run_finished(client, thread_id, run_id, timeout=TAKEOVER_TIMEOUT)
    print(f"{graph}: taken over {took_over:.2f}s after SIGKILL, {status} after "
          f"{time.monotonic() - killed:.2f}s; effects={effects(cluster.dsn, order)}")  # fmt: skip

    assert status == "success"
    assert effects(cluster.dsn, order) == expected
    assert (order in survivor.effects_started()) == (expected == 2)  # who refunded again
    last = _last_message(client, thread_id)
    assert last["type"] == "ai"
    assert last["content"].startswith("done:")
    if graph == "shared":
        assert _ledger(cluster.dsn) == {"done": 1}  # the intent did not stay pending
        # the killed attempt left no outcome (nor a failure) in the breaker both share
        assert _window_reaching(cluster.dsn, "refund", (1, 0)) == (1, 0)


def test_both_workers_share_one_breaker(cluster: Cluster) -> None:
    """Four held refunds on two workers of two slots each: both workers run two, and
    all four outcomes land in the one ``refund`` breaker row they share (a breaker per
    process would hold two each)."""
    client = cluster.workers[0].client()
    orders = [new_order() for _ in range(4)]
    cluster.hold()
    runs = [start_run(client, "shared", f"refund {order}") for order in orders]
    for order in orders:
        cluster.worker_running(order)
    assert sorted(len(w.effects_started()) for w in cluster.workers) == [2, 2]
    cluster.release()

    assert [run_finished(client, *run, timeout=30) for run in runs] == ["success"] * 4
    assert [effects(cluster.dsn, order) for order in orders] == [1, 1, 1, 1]
    # the successes are batched: the row is written within a flush interval of the end
    assert _window_reaching(cluster.dsn, "refund", (4, 0)) == (4, 0)
    with psycopg.connect(cluster.dsn) as conn:
        keys = [row[0] for row in conn.execute("SELECT key FROM lgr_breakers").fetchall()]
    assert keys == ["refund"]


def _lookups(worker: Any, order: str) -> int:
    """Executions of ``lookup(order)`` in `worker` (one marker file each)."""
    return len(list(worker.control.glob(f"lookup-{order}-*")))


def test_an_outage_one_worker_learns_is_the_other_workers_open_breaker(cluster: Cluster) -> None:
    """The order service goes down: a run on one worker fails its lookups and opens the
    shared breaker; that worker dies; on the survivor a new thread's lookup is refused
    without reaching the service (one breaker for both), answered to the agent with the
    breaker's retry_after, not sent to a human."""
    for worker in cluster.workers:
        (worker.control / "outage").write_text("x")
    client = cluster.workers[0].client()
    thread_id, run_id = start_run(client, "shared_trippy", "lookup A1")
    assert run_finished(client, thread_id, run_id, timeout=60) == "success"
    (learned,) = [w for w in cluster.workers if _lookups(w, "A1")]
    assert _lookups(learned, "A1") == 2  # both attempts reached the service
    survivor = cluster.other(learned)
    learned.stop(signal.SIGKILL)

    client = survivor.client()
    thread_id, run_id = start_run(client, "shared_trippy", "lookup B2")
    assert run_finished(client, thread_id, run_id, timeout=60) == "success"
    assert _lookups(survivor, "B2") == 0  # refused by the breaker the other worker opened
    state = client.threads.get_state(thread_id)
    tool = next(m for m in state["values"]["messages"] if m["type"] == "tool")
    assert '"type":"CircuitOpenError"' in tool["content"]
    assert not state["next"]  # the thread is done: nobody waits for a human
