"""A worker process for the shared-breaker test: hammers one Postgres breaker from threads.

Run in processes spawned (``multiprocessing`` 'spawn' context) by
``test_breaker_store.py``; each call opens its own pool configured like
LangGraph's PostgresSaver requires.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from psycopg_pool import ConnectionPool

from langgraph_resilience.core.breaker import BreakerConfig
from langgraph_resilience.errors import FailureClass
from langgraph_resilience.stores.persistence import POSTGRES_CONNECTION_KWARGS
from langgraph_resilience.stores.postgres_breakers import PostgresBreakerStore


def hammer(
    dsn: str,
    key: str,
    cfg_kwargs: dict[str, Any],
    now: float,
    *,
    threads: int,
    calls: int,
    outcome: str | None,
    ready: Any,
    finished: Any,
) -> dict[str, Any]:
    """Acquire `calls` times from each of `threads` threads at time `now`; record
    `outcome` ("ok", a FailureClass value, or None: never record) for admitted calls.
    Waits on `ready` before and `finished` after; returns its pid, counts and a snapshot."""
    cfg = BreakerConfig(**cfg_kwargs)
    counts = {"admitted": 0, "probes": 0, "refused": 0}
    lock = threading.Lock()
    with ConnectionPool(
        dsn, min_size=threads, max_size=threads, kwargs=POSTGRES_CONNECTION_KWARGS, open=True
    ) as pool:
        pool.wait(timeout=30)
        store = PostgresBreakerStore(pool)
        start = threading.Barrier(threads + 1)

        def loop() -> None:
            start.wait(timeout=60)
            for _ in range(calls):
                admission = store.acquire(key, cfg, now)
                with lock:
                    counts["admitted" if admission.allowed else "refused"] += 1
                    counts["probes"] += admission.probe
                if admission.allowed and outcome is not None:
                    result = None if outcome == "ok" else FailureClass(outcome)
                    store.record(key, cfg, now, result, probe=admission.probe, duration=0.01)

        workers = [threading.Thread(target=loop) for _ in range(threads)]
        for worker in workers:
            worker.start()
        ready.wait(timeout=120)  # every process is connected: go together
        start.wait(timeout=60)
        for worker in workers:
            worker.join()
        store.flush()  # this process's batched successes reach the shared row
        finished.wait(timeout=120)  # nobody writes any more: read the shared state
        snapshot = store.snapshot(key).to_json()
    return {"pid": os.getpid(), "counts": counts, "snapshot": snapshot}
