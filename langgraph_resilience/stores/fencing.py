"""Fencing: a runner whose thread lease is gone stops before it writes.

`thread_lock` holds the thread's lease, which can lapse while the runner carries on (a
paused process, a database that did not answer its renewals); then a second runner may
take the thread over with a newer token, and two runners would write the same thread.
So the lease is the run's *fence* (in a context variable, like LangGraph's config;
`langgraph_resilience.stores.held`): the ledger's writes carry its token and the
database refuses those of a stale one in the same statement; before every side effect
runs (its claim is itself a fenced write), and before every checkpoint write of the
savers `open_postgres` makes, `check_fence` asks the database, in one statement, whether
the token is still the thread's current one with more than a third of its TTL left. If
not, the run stops with `ThreadLockLostError`; the second runner is then the only
writer.

A checkpoint write is checked, then sent (LangGraph's saver runs its own statements):
the gap between the two is covered by the third of the TTL the check demands, so a
write would have to take longer than that (10 s by default) to land after a takeover.
What a fence cannot stop is an effect already running when the lease lapsed; its
idempotency key and the reconciliation (`in_flight`) cover that one.
"""

from __future__ import annotations

from typing import Any

import psycopg
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

from langgraph_resilience.errors import PersistenceError
from langgraph_resilience.stores.held import Fence, acheck_fence, check_fence, holding, thread_of
from langgraph_resilience.stores.leases import abandon, written
from langgraph_resilience.stores.postgres import first_line

__all__ = [
    "AsyncFencedPostgresSaver",
    "Fence",
    "FencedPostgresSaver",
    "holding",
]


def _write_failed(config: RunnableConfig, exc: BaseException) -> PersistenceError:
    """A checkpoint write the server dropped (a restart, a failover): typed, redacted,
    and saying what to do. Nothing after the thread's last checkpoint was saved, and
    the ledger keeps every effect's outcome, so resuming the thread completes it. The
    run ends here, so its lease of the thread is given up in this process (a release
    cannot reach a database that is gone): the resume takes the thread at once."""
    abandon(thread_of(config))
    return PersistenceError(
        f"writing a checkpoint of thread {thread_of(config)!r} failed: {first_line(exc)}; "
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
            saved = super().put(config, *args, **kwargs)
        except psycopg.OperationalError as exc:
            raise _write_failed(config, exc) from exc
        written(thread_of(config))
        return saved

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
            saved = await super().aput(config, *args, **kwargs)
        except psycopg.OperationalError as exc:
            raise _write_failed(config, exc) from exc
        written(thread_of(config))
        return saved

    async def aput_writes(self, config: RunnableConfig, *args: Any, **kwargs: Any) -> None:
        """`AsyncPostgresSaver.aput_writes`, after `acheck_fence`."""
        await acheck_fence(config)
        try:
            await super().aput_writes(config, *args, **kwargs)
        except psycopg.OperationalError as exc:
            raise _write_failed(config, exc) from exc
