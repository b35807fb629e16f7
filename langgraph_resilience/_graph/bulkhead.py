"""Bulkheads: a per-tool limit on calls in flight, so one slow tool cannot occupy every worker.

A `Bulkhead` admits at most `max_concurrent` calls at once; an excess call waits
up to `max_wait` then raises `BulkheadFullError` (a TRANSIENT `ToolFailure`). The
guarded tools node takes the slot after the breaker admitted the call
(``with bulkhead.slot():`` / ``async with bulkhead.aslot():`` around the
execution) and releases the admission when the slot is refused: the call never
reached the tool.

It lives with the node that runs tool calls, not in ``core/`` (it blocks threads
and waits on real time, where core decisions are pure functions of an injected
clock) nor in ``stores/`` (its state is this process's semaphores: nothing to
share through a backend).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

from langgraph_resilience.core.policy import seconds
from langgraph_resilience.errors import ConfigurationError, FailureClass, ToolFailure

__all__ = ["Bulkhead", "BulkheadFullError"]

T = TypeVar("T")


class BulkheadFullError(ToolFailure):
    """A call waited `max_wait` for a bulkhead slot and got none: TRANSIENT, and it
    never reached the tool (release its breaker admission, do not record it)."""

    def __init__(self, name: str, max_concurrent: int, max_wait: float) -> None:
        super().__init__(
            FailureClass.TRANSIENT,
            f"bulkhead {name!r} is full: {max_concurrent} calls in flight, "
            f"none finished within {max_wait:g}s",
            suggested_action="retry",
            context={"bulkhead": name, "max_concurrent": max_concurrent, "max_wait_s": max_wait},
        )
        self.name = name


class Bulkhead:
    """A per-tool concurrency limit, so one slow tool cannot occupy every worker.

    At most `max_concurrent` calls run at once; a further call waits up to
    `max_wait` seconds for a slot, then fails with `BulkheadFullError` (TRANSIENT).
    Sync callers share a `threading.BoundedSemaphore`; async callers share an
    `asyncio.Semaphore` per event loop (a process runs a graph either way, so
    the two pools are separate).

    >>> search_slots = Bulkhead("search", max_concurrent=4, max_wait=2.0)
    >>> with search_slots.slot():
    ...     pass
    """

    def __init__(
        self, name: str, *, max_concurrent: int, max_wait: float | dt.timedelta = 0.0
    ) -> None:
        if (
            isinstance(max_concurrent, bool)
            or not isinstance(max_concurrent, int)
            or max_concurrent < 1
        ):
            raise ConfigurationError(
                f"Bulkhead.max_concurrent must be an integer >= 1, got {max_concurrent!r}"
            )
        wait = seconds(max_wait, field="max_wait")
        if wait < 0:
            raise ConfigurationError(
                f"Bulkhead.max_wait must be >= 0 seconds (0: fail at once), got {max_wait!r}"
            )
        self.name = name
        self.max_concurrent = max_concurrent
        self.max_wait = wait
        self._semaphore = threading.BoundedSemaphore(max_concurrent)
        self._async: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )
        self._async_lock = threading.Lock()

    def _full(self) -> BulkheadFullError:
        return BulkheadFullError(self.name, self.max_concurrent, self.max_wait)

    @contextlib.contextmanager
    def slot(self) -> Iterator[None]:
        """Hold a slot for the duration of the block (sync)."""
        acquired = (
            self._semaphore.acquire(timeout=self.max_wait)
            if self.max_wait > 0
            else self._semaphore.acquire(blocking=False)
        )
        if not acquired:
            raise self._full()
        try:
            yield
        finally:
            self._semaphore.release()

    def _loop_semaphore(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        with self._async_lock:
            semaphore = self._async.get(loop)
            if semaphore is None:
                semaphore = self._async[loop] = asyncio.Semaphore(self.max_concurrent)
        return semaphore

    @contextlib.asynccontextmanager
    async def aslot(self) -> AsyncIterator[None]:
        """Hold a slot for the duration of the block (async; never blocks the loop)."""
        semaphore = self._loop_semaphore()
        if semaphore.locked() and self.max_wait <= 0:
            raise self._full()
        try:
            await asyncio.wait_for(semaphore.acquire(), self.max_wait or None)
        except TimeoutError:
            raise self._full() from None
        try:
            yield
        finally:
            semaphore.release()

    def call(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
        """Call ``fn(*args, **kwargs)`` in a slot."""
        with self.slot():
            return fn(*args, **kwargs)

    async def acall(self, fn: Callable[..., Awaitable[T]], /, *args: Any, **kwargs: Any) -> T:
        """Await ``fn(*args, **kwargs)`` in a slot."""
        async with self.aslot():
            return await fn(*args, **kwargs)
