"""Our Postgres pieces for a graph a LangGraph Server runs, opened once per process.

On a server the graph is compiled without a checkpointer (the server injects its
own) and a graph factory in ``langgraph.json`` may be called for every run. So
`ashared_postgres` / `shared_postgres` open one pool per process (per event loop
for the async one) on the first call and return the same `SharedStores` after: the
idempotency ledger, the saga log and the breaker store every worker shares, with
only our tables set up (never the checkpoint or store tables, which the server
owns). See ``examples/server/``::

    async def make_graph(config):
        stores = await ashared_postgres(os.environ["LANGGRAPH_RESILIENCE_DSN"])
        add_resilience(builder, ..., idempotency=stores.idempotency, saga=stores.saga,
                       breaker_store=stores.breakers)
        return builder.compile()
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import weakref
from typing import Any, Unpack

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from langgraph_resilience.core.clock import SystemClock
from langgraph_resilience.core.effects import IdempotencyStore, SagaLog
from langgraph_resilience.core.flow import adrive, drive
from langgraph_resilience.stores.persistence import PostgresOptions, postgres_opening
from langgraph_resilience.stores.postgres_breakers import (
    AsyncPostgresBreakerStore,
    PostgresBreakerStore,
)

__all__ = ["SharedStores", "ashared_postgres", "shared_postgres"]

_NEVER_SLEEPS = SystemClock()


@dataclasses.dataclass(frozen=True, slots=True)
class SharedStores:
    """The ledgers and breakers one process's graphs share, on one pool."""

    idempotency: IdempotencyStore
    saga: SagaLog
    breakers: PostgresBreakerStore | AsyncPostgresBreakerStore
    """Breakers every worker on this database shares (`add_resilience(breaker_store=)`)."""
    pool: ConnectionPool[Any] | AsyncConnectionPool[Any]
    target: str
    """The DSN with its password redacted."""


_SYNC: dict[str, SharedStores] = {}
_SYNC_LOCK = threading.Lock()
_ASYNC: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Future[Any]]] = (
    weakref.WeakKeyDictionary()
)


def _options(options: PostgresOptions) -> dict[str, Any]:
    return {**options, "checkpointer": False}


def shared_postgres(dsn: str, **options: Unpack[PostgresOptions]) -> SharedStores:
    """The process's `SharedStores` on `dsn` (opened and set up on the first call)."""
    with _SYNC_LOCK:
        found = _SYNC.get(dsn)
        if found is None:
            flow = postgres_opening(dsn, psycopg.connect, ConnectionPool, **_options(options))
            p = drive(flow, _NEVER_SLEEPS)
            pool: Any = p.pool
            found = SharedStores(p.idempotency, p.saga, PostgresBreakerStore(pool), pool, p.target)
            _SYNC[dsn] = found
        return found


async def _aopen(dsn: str, options: PostgresOptions) -> SharedStores:
    flow = postgres_opening(
        dsn, psycopg.AsyncConnection.connect, AsyncConnectionPool, **_options(options)
    )
    p = await adrive(flow, _NEVER_SLEEPS)
    pool: Any = p.pool
    return SharedStores(p.idempotency, p.saga, AsyncPostgresBreakerStore(pool), pool, p.target)


async def ashared_postgres(dsn: str, **options: Unpack[PostgresOptions]) -> SharedStores:
    """Async `shared_postgres`: one async pool per event loop; concurrent first calls
    wait for the same opening. A failed opening is not kept: the next call retries."""
    loop = asyncio.get_running_loop()
    opened = _ASYNC.setdefault(loop, {})
    future = opened.get(dsn)
    if future is None:
        future = opened[dsn] = loop.create_task(_aopen(dsn, options))
    try:
        return await asyncio.shield(future)
    except Exception:
        if opened.get(dsn) is future:
            del opened[dsn]
        raise
