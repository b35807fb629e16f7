"""Outcomes written after the caller has its answer (``deferred_outcomes=True``): a
sync store's are queued and written in order by one daemon thread (`OutcomeWriter`),
an async store's by tasks on its loop (`OutcomeTasks`). Until one is written, the
store's reads that could see it wait for it; a crash before it leaves the intent
pending, reconciled on resume, never re-run blindly."""

from __future__ import annotations

import asyncio
import atexit
import collections
import contextvars
import threading
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from langgraph_resilience.core.backoff import ledger_retry_delay
from langgraph_resilience.core.clock import SystemClock
from langgraph_resilience.core.effects import OutcomeStatus
from langgraph_resilience.errors import ThreadLockLostError
from langgraph_resilience.events import Event, emit, logger

__all__ = ["EXIT_FLUSH_TIMEOUT", "OutcomeTasks", "OutcomeWriter"]

_NEVER_SLEEPS = SystemClock()
"""The writers' clock for retry waits: real time, never a graph's fake one."""


_Deferred = tuple[str, Any, OutcomeStatus, str | None, str | None, contextvars.Context]
"""A deferred outcome: (key, result, status, thread_id, fingerprint, the context it was
handed over in: its thread lease travels with the write)."""


class OutcomeWriter:
    """Outcomes written after the caller has its answer: queued, and written in order by
    one daemon thread (``write(key, result, status)``), each retried as every ledger
    write is (`ledger_retry_delay`), then given up (the intent stays pending: it is
    reconciled, never re-run). `wait` holds a reader until the queued outcomes it could
    see are written; at interpreter exit the queue is written out (at most
    `EXIT_FLUSH_TIMEOUT` seconds)."""

    def __init__(self, write: Callable[[str, Any, OutcomeStatus], Any]) -> None:
        self._write = write
        self._queue: collections.deque[_Deferred] = collections.deque()
        """Outcomes not written yet, oldest first (the head is being written)."""
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        _WRITERS.add(self)

    def put(
        self,
        key: str,
        result: Any,
        status: OutcomeStatus,
        thread_id: str | None,
        fingerprint: str | None = None,
    ) -> None:
        """Queue one outcome (of `thread_id`'s effect `fingerprint`, when known)."""
        with self._cond:
            item = (key, result, status, thread_id, fingerprint, contextvars.copy_context())
            self._queue.append(item)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._drain, name="lgr-outcomes", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def holds(self, key: str | None, thread_id: str | None, fingerprint: str | None = None) -> bool:
        """Whether an outcome `wait` would wait for is queued."""
        with self._cond:
            return self._holds(key, thread_id, fingerprint)

    def _holds(self, key: str | None, thread_id: str | None, fingerprint: str | None) -> bool:
        if key is None and thread_id is None:
            return bool(self._queue)
        return any(
            k == key
            or (
                thread_id is not None
                and t in (thread_id, None)
                and (fingerprint is None or f in (fingerprint, None))
            )
            for k, _, _, t, f, _ in self._queue
        )

    def wait(
        self,
        key: str | None,
        thread_id: str | None,
        fingerprint: str | None = None,
        *,
        timeout: float | None = None,
    ) -> bool:
        """Wait until no outcome of `key`, nor of `thread_id`'s effect `fingerprint`
        (any of its effects when None; of anyone, when `key` and `thread_id` are both
        None) is queued; False if `timeout` passed first."""
        with self._cond:
            return self._cond.wait_for(
                lambda: not self._holds(key, thread_id, fingerprint), timeout
            )

    def _drain(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._queue))
                key, result, status, _, _, context = self._queue[0]
            try:
                context.run(self._written, key, result, status)
            finally:
                with self._cond:
                    self._queue.popleft()
                    self._cond.notify_all()

    def _written(self, key: str, result: Any, status: OutcomeStatus) -> None:
        attempt = 0
        while True:
            attempt += 1
            try:
                self._write(key, result, status)
                return
            except ThreadLockLostError:
                return  # kept; the run that handed it over is stopped at its next write
            except Exception as exc:
                delay = ledger_retry_delay(attempt)
                if delay is None:
                    _gave_up(key, exc)
                    return
                _NEVER_SLEEPS.sleep(delay)


class OutcomeTasks:
    """The async store's deferred outcomes: one task per outcome on the store's loop,
    each retried as every ledger write is, then given up (the intent stays pending);
    `wait` awaits the ones a reader could see (`OutcomeWriter`'s rule). A task still
    running when its loop is shut down is cancelled: its intent stays pending, the
    same safe outcome as a crash."""

    def __init__(self, write: Callable[[str, Any, OutcomeStatus], Awaitable[Any]]) -> None:
        self._write = write
        self._tasks: dict[asyncio.Future[None], tuple[str, str | None, str | None]] = {}
        self._guard = threading.Lock()

    def put(
        self,
        key: str,
        result: Any,
        status: OutcomeStatus,
        thread_id: str | None,
        fingerprint: str | None = None,
    ) -> None:
        """Start writing one outcome on the running loop."""
        task = asyncio.ensure_future(self._written(key, result, status))
        with self._guard:
            self._tasks[task] = (key, thread_id, fingerprint)
        task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Future[None]) -> None:
        with self._guard:
            self._tasks.pop(task, None)

    def matching(
        self, key: str | None, thread_id: str | None, fingerprint: str | None = None
    ) -> list[asyncio.Future[None]]:
        """The outcome tasks `wait` would wait for."""
        with self._guard:
            items = list(self._tasks.items())
        if key is None and thread_id is None:
            return [task for task, _ in items]
        return [
            task
            for task, (k, t, f) in items
            if k == key
            or (
                thread_id is not None
                and t in (thread_id, None)
                and (fingerprint is None or f in (fingerprint, None))
            )
        ]

    async def wait(
        self, key: str | None, thread_id: str | None, fingerprint: str | None = None
    ) -> None:
        """Until the matching outcomes are written (or given up)."""
        tasks = self.matching(key, thread_id, fingerprint)
        if tasks:
            await asyncio.wait(tasks)

    async def _written(self, key: str, result: Any, status: OutcomeStatus) -> None:
        attempt = 0
        while True:
            attempt += 1
            try:
                await self._write(key, result, status)
                return
            except ThreadLockLostError:
                return  # kept; the run that handed it over is stopped at its next write
            except Exception as exc:
                delay = ledger_retry_delay(attempt)
                if delay is None:
                    _gave_up(key, exc)
                    return
                await _NEVER_SLEEPS.asleep(delay)


def _gave_up(key: str, exc: BaseException) -> None:
    logger.warning(
        "deferred outcome of %s not written (%s): the intent stays pending and is reconciled later",
        key,
        type(exc).__name__,
    )
    emit(Event("ledger_unavailable", operation="record", key=key, error=type(exc).__name__))


EXIT_FLUSH_TIMEOUT = 5.0
"""How long interpreter exit waits for deferred outcomes to be written."""

_WRITERS: weakref.WeakSet[OutcomeWriter] = weakref.WeakSet()


@atexit.register
def _flush_at_exit() -> None:
    deadline = time.monotonic() + EXIT_FLUSH_TIMEOUT
    for writer in list(_WRITERS):
        writer.wait(None, None, None, timeout=max(0.0, deadline - time.monotonic()))
