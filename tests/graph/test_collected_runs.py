"""A run's lease goes back when its writer is collected, from wherever the collector
runs: inside a lock the collecting thread holds (``ThreadPoolExecutor.submit``'s, the
lease table's) the finalizer only hands the lease over, never waiting for itself. CI
once hung forever there: a collection inside ``run_in_executor`` gave a lease back with
``run_in_executor``, whose lock the same thread already held."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable

from langgraph_resilience._graph import run_lease
from langgraph_resilience._graph.run_lease import _LOCAL, _Held, _release_all

DEADLOCK_GUARD = 10.0
"""Seconds a thread may take before the test calls it stuck (it takes milliseconds)."""


def _finishes(body: Callable[[], None]) -> bool:
    """Run `body` in a daemon thread: True if it ended (a deadlock keeps it forever)."""
    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    thread.join(DEADLOCK_GUARD)
    return not thread.is_alive()


def test_a_collection_inside_the_lease_table_s_lock_does_not_wait_for_itself() -> None:
    """Sync: the finalizer fires in a thread that holds the local lease table's lock;
    the lease is handed to the releaser thread and is back once it has run."""
    key = f"collected-{uuid.uuid4().hex}"
    held = {key: _Held(_LOCAL.take(key), 0.0)}

    def collected_inside_the_lock() -> None:
        with _LOCAL._guard:
            _release_all(held)

    assert _finishes(collected_inside_the_lock)
    run_lease._released_collected()
    assert _LOCAL.holder(key) is None
    assert held == {}


def test_a_collection_inside_a_loop_hands_the_lease_to_the_loop() -> None:
    """Async: the finalizer fires in the event loop's thread, inside a lock that thread
    holds; the lease goes back on the loop's next turn."""
    key = f"collected-{uuid.uuid4().hex}"
    held = {key: _Held(_LOCAL.take(key), 0.0)}
    seen: list[object] = []

    async def main() -> None:
        with _LOCAL._guard:
            _release_all(held)
        seen.append(_LOCAL.holder(key))  # not yet: a callback of the next turn
        await asyncio.sleep(0)
        seen.append(_LOCAL.holder(key))

    assert _finishes(lambda: asyncio.run(main()))
    assert seen[0] is not None
    assert seen[1] is None
