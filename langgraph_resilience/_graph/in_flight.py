"""Attempts that ``tool_timeout`` stopped waiting for, but that may still be running.

A sync tool runs in a thread that cannot be killed, and an async side effect is
not cancelled (cancelling a request that already left loses its answer, not the
effect). So a timed-out attempt of a side effect can still land. Asking the
service "did it happen?" while it is in flight hears "not done" too early, and
running the call again would do it twice. Each abandoned attempt is kept here
under its idempotency key until it ends: the reconciliation waits for it (at most
its grace period) before it trusts a status check, and its late outcome is
recorded in the ledger when it arrives.

Every side effect executing in this process is also marked (`executing`), so that a
second runner of the same thread here (the first one's lock died and was taken over)
waits for the attempt on the wire instead of hearing "not done" from the service and
paying again; across processes the tool's timeout bounds what can still be in flight.

Threads are daemons, so an abandoned tool never keeps the process from exiting.
An async tool that blocks the event loop cannot be timed out at all (nothing runs
to notice the deadline): make such tools async all the way, or sync.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import contextvars
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Literal

from langgraph_resilience.errors import AttemptAbandoned, ThreadLockLostError
from langgraph_resilience.events import logger

__all__ = [
    "Settled",
    "arun_with_timeout",
    "asettle",
    "executing",
    "run_with_timeout",
    "settle",
]

_RUNNING: dict[str, int] = {}
"""Side effects executing in this process now, by key (any runner, any thread)."""
_ENDED = threading.Condition()
"""Notified whenever a side effect of this process stops executing."""
_RAN_HERE: collections.OrderedDict[str, None] = collections.OrderedDict()
"""Keys whose last attempt ran in this process and has ended (the newest, bounded): an
intent of theirs left pending is not another process's attempt on the wire."""
_RAN_HERE_MAX = 1024
OTHER_RUNNER_WAIT = 60.0
"""How long a reconciliation waits for an attempt another runner of this process is
executing when the tool has no timeout (with one, the timeout bounds the wait)."""
_SYNC: dict[str, concurrent.futures.Future[Any]] = {}
_ASYNC: dict[str, asyncio.Future[Any]] = {}
_GUARD = threading.Lock()
_KEEP: set[asyncio.Task[Any]] = set()
"""Late-outcome writes in flight (referenced so the loop does not drop them)."""


@contextlib.contextmanager
def executing(key: str) -> Iterator[None]:
    """Mark `key`'s side effect as executing in this process while the block runs: a
    second runner of the same thread here (its lock lost and taken over) must not hear
    "not done" from the service while this attempt is on the wire, and run it again."""
    with _ENDED:
        _RUNNING[key] = _RUNNING.get(key, 0) + 1
    try:
        yield
    finally:
        with _ENDED:
            left = _RUNNING.pop(key) - 1
            if left:
                _RUNNING[key] = left
            _RAN_HERE[key] = None
            _RAN_HERE.move_to_end(key)
            if len(_RAN_HERE) > _RAN_HERE_MAX:
                _RAN_HERE.popitem(last=False)
            _ENDED.notify_all()


def _executing(key: str) -> bool:
    with _ENDED:
        return key in _RUNNING


def _await_executing(key: str, grace: float) -> Settled:
    """Wait for an attempt executing in this process to end (``ended``), at most `grace`
    seconds, or `OTHER_RUNNER_WAIT` when the tool has no timeout (``running``)."""
    with _ENDED:
        if key not in _RUNNING:
            return "ended" if key in _RAN_HERE else "none"
        ended = _ENDED.wait_for(lambda: key not in _RUNNING, grace or OTHER_RUNNER_WAIT)
    return "ended" if ended else "running"


def _forget_sync(key: str, future: concurrent.futures.Future[Any]) -> None:
    with _GUARD:
        if _SYNC.get(key) is future:
            del _SYNC[key]


def run_with_timeout(
    execute: Callable[[Any], Any],
    request: Any,
    timeout: float,
    *,
    key: str | None = None,
    on_late: Callable[[Any], Any] | None = None,
) -> Any:
    """Run a sync tool in a daemon thread for at most `timeout` seconds. Past it the
    attempt is abandoned (`AttemptAbandoned`); with a side effect's `key` it is kept
    in flight, and `on_late` receives its result if it completes."""
    context = contextvars.copy_context()
    future: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def work() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(context.run(execute, request))
        except BaseException as exc:
            future.set_exception(exc)

    threading.Thread(target=work, name="lgr-tool", daemon=True).start()
    try:
        return future.result(timeout=timeout)
    except concurrent.futures.TimeoutError:
        if future.done():
            raise  # the tool itself raised TimeoutError
    if key is not None:
        with _GUARD:
            _SYNC[key] = future

        def landed(done: concurrent.futures.Future[Any]) -> None:
            _forget_sync(key, done)
            if on_late is not None and done.exception() is None:
                try:
                    on_late(done.result())
                except Exception as exc:
                    _report_late(key, exc)

        future.add_done_callback(landed)
    raise AttemptAbandoned(timeout, grace=timeout)


async def arun_with_timeout(
    execute: Callable[[Any], Awaitable[Any]],
    request: Any,
    timeout: float | None,
    *,
    key: str | None = None,
    on_late: Callable[[Any], Awaitable[Any]] | None = None,
) -> Any:
    """Async `run_with_timeout`: a plain call is cancelled at the deadline; a side
    effect (`key`) is left running, in flight, and its late result goes to `on_late`.

    So is a side effect whose run is cancelled (a server's double-texting
    ``interrupt``, a cancelled run): the effect may be on the wire, and its outcome,
    when it lands, is recorded instead of being lost with the run.
    """
    task = asyncio.ensure_future(execute(request))
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
    except asyncio.CancelledError:
        if key is None:
            task.cancel()
        else:
            _keep_in_flight(key, task, on_late)
        raise
    if done:
        return task.result()
    assert timeout is not None  # asyncio.wait without a timeout returns only when done
    if key is None:
        task.cancel()
        raise AttemptAbandoned(timeout, grace=0.0)
    _keep_in_flight(key, task, on_late)
    raise AttemptAbandoned(timeout, grace=timeout)


def _keep_in_flight(
    key: str, task: asyncio.Future[Any], on_late: Callable[[Any], Awaitable[Any]] | None
) -> None:
    """Keep an abandoned async side effect under its key until it ends; then record
    its outcome (`on_late`)."""
    _ASYNC[key] = task

    def landed(finished: asyncio.Future[Any]) -> None:
        if _ASYNC.get(key) is finished:
            del _ASYNC[key]
        if on_late is not None and not finished.cancelled() and finished.exception() is None:
            write = asyncio.ensure_future(on_late(finished.result()))
            _KEEP.add(write)
            write.add_done_callback(written)

    def written(write: asyncio.Future[Any]) -> None:
        _KEEP.discard(write)
        if not write.cancelled() and (exc := write.exception()) is not None:
            _report_late(key, exc)

    task.add_done_callback(landed)


def _report_late(key: str, exc: BaseException) -> None:
    """Say how a late outcome's write failed (nobody awaits it: the run is gone). A run
    that lost its thread meanwhile still kept the outcome (an effect that ran is a
    fact); any other failure leaves the intent pending, reconciled later."""
    if isinstance(exc, ThreadLockLostError):
        logger.info("late outcome of %s recorded; its run had lost the thread", key)
    else:
        logger.warning("late outcome of %s could not be recorded (%s)", key, type(exc).__name__)


Settled = Literal["none", "ended", "running"]
"""No attempt of the key ran in this process; one did and has ended; one still runs."""


def settle(key: str, grace: float) -> Settled:
    """Wait (at most `grace` seconds) for an abandoned attempt of `key` to end; an
    attempt executing in this process now (another runner's) is ``running``."""
    with _GUARD:
        future = _SYNC.get(key)
    if future is None:
        return _await_executing(key, grace)
    try:
        future.result(timeout=grace)
    except concurrent.futures.TimeoutError:
        return "ended" if future.done() else "running"
    except BaseException:  # it ended by failing: nothing is in flight any more
        return "ended"
    return "ended"


async def asettle(key: str, grace: float) -> Settled:
    """Async `settle` (an abandoned sync attempt is waited for in a worker thread)."""
    task = _ASYNC.get(key)
    if task is None:
        if key in _SYNC or _executing(key):
            return await asyncio.to_thread(settle, key, grace)
        return settle(key, 0.0)  # not executing: answers at once
    await asyncio.wait({task}, timeout=grace or OTHER_RUNNER_WAIT)  # no timeout: as executing
    return "ended" if task.done() else "running"
