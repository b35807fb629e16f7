"""Fencing: a runner whose thread lock died stops before it writes.

`thread_lock` holds a PostgreSQL session advisory lock. That session can end
while the runner carries on (``pg_terminate_backend``, ``idle_session_timeout``,
a proxy, a failover): the server releases the lock, a second runner takes it,
and two runners would write the same thread. So a run holding a lock also holds
a *fence* for it (in a context variable, like LangGraph's config): before every
side effect is claimed and run, and before every checkpoint write of the savers
`open_postgres` makes, the fence asks the lock's session whether it is still the
one that took the lock and still alive. If not, the run stops with
`ThreadLockLostError`; the second runner is then the only writer.

What a fence cannot stop is an effect already running when the session died;
its idempotency key and the reconciliation (`in_flight`) cover that one.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import psycopg
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

from langgraph_resilience.errors import ThreadLockLostError
from langgraph_resilience.stores.postgres import PersistenceError, first_line

__all__ = [
    "AsyncFencedPostgresSaver",
    "Fence",
    "FencedPostgresSaver",
    "acheck_fence",
    "check_fence",
    "holding",
]


@dataclasses.dataclass(frozen=True, slots=True)
class Fence:
    """A held thread lock: `alive` answers whether the session holding it still does."""

    thread_id: str
    alive: Callable[[], bool]
    where: str = ""

    def check(self) -> None:
        """Raise `ThreadLockLostError` once the lock is gone."""
        if not self.alive():
            raise ThreadLockLostError(self.thread_id, self.where)


_HELD: contextvars.ContextVar[Mapping[str, Fence] | None] = contextvars.ContextVar(
    "langgraph_resilience_fences", default=None
)


@contextlib.contextmanager
def holding(fence: Fence) -> Iterator[None]:
    """Make `fence` the current context's fence for its thread while the block runs."""
    previous = _HELD.get()
    _HELD.set({**(previous or {}), fence.thread_id: fence})
    try:
        yield
    finally:  # set, not reset: an async lock enters and exits in different contexts
        _HELD.set(previous)


def _thread_of(config: RunnableConfig | Mapping[str, Any] | str) -> str:
    if isinstance(config, str):
        return config
    return str((config.get("configurable") or {}).get("thread_id", ""))


def check_fence(config: RunnableConfig | Mapping[str, Any] | str) -> None:
    """Stop (`ThreadLockLostError`) if this context holds the thread's lock and lost it."""
    fence = (_HELD.get() or {}).get(_thread_of(config))
    if fence is not None:
        fence.check()


async def acheck_fence(config: RunnableConfig | Mapping[str, Any] | str) -> None:
    """Async `check_fence` (the session check is a blocking round trip: in a thread)."""
    fence = (_HELD.get() or {}).get(_thread_of(config))
    if fence is not None:
        await asyncio.to_thread(fence.check)


def _write_failed(config: RunnableConfig, exc: BaseException) -> PersistenceError:
    """A checkpoint write the server dropped (a restart, a failover): typed, redacted,
    and saying what to do. Nothing after the thread's last checkpoint was saved, and
    the ledger keeps every effect's outcome, so resuming the thread completes it."""
    return PersistenceError(
        f"writing a checkpoint of thread {_thread_of(config)!r} failed: {first_line(exc)}; "
        "nothing after its last checkpoint was saved: resume the thread (resume / aresume) "
        "once PostgreSQL answers again"
    )


class FencedPostgresSaver(PostgresSaver):
    """LangGraph's `PostgresSaver`, refusing to write a thread whose lock this run lost;
    a dropped connection reaches the caller as a typed `PersistenceError`."""

    def put(self, config: RunnableConfig, *args: Any, **kwargs: Any) -> RunnableConfig:
        """`PostgresSaver.put`, after `check_fence`."""
        check_fence(config)
        try:
            return super().put(config, *args, **kwargs)
        except psycopg.OperationalError as exc:
            raise _write_failed(config, exc) from exc

    def put_writes(self, config: RunnableConfig, *args: Any, **kwargs: Any) -> None:
        """`PostgresSaver.put_writes`, after `check_fence`."""
        check_fence(config)
        try:
            super().put_writes(config, *args, **kwargs)
        except psycopg.OperationalError as exc:
            raise _write_failed(config, exc) from exc


class AsyncFencedPostgresSaver(AsyncPostgresSaver):
    """LangGraph's `AsyncPostgresSaver`, refusing to write a thread whose lock was lost;
    a dropped connection reaches the caller as a typed `PersistenceError`."""

    async def aput(self, config: RunnableConfig, *args: Any, **kwargs: Any) -> RunnableConfig:
        """`AsyncPostgresSaver.aput`, after `acheck_fence`."""
        await acheck_fence(config)
        try:
            return await super().aput(config, *args, **kwargs)
        except psycopg.OperationalError as exc:
            raise _write_failed(config, exc) from exc

    async def aput_writes(self, config: RunnableConfig, *args: Any, **kwargs: Any) -> None:
        """`AsyncPostgresSaver.aput_writes`, after `acheck_fence`."""
        await acheck_fence(config)
        try:
            await super().aput_writes(config, *args, **kwargs)
        except psycopg.OperationalError as exc:
            raise _write_failed(config, exc) from exc
