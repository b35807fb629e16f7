"""Stale intents: settle the pending side effects no run of their thread will resolve.

The rule is `langgraph_resilience.core.effects.stale_reason` (see "Stale intents"
there): a pending intent whose thread no longer exists (deleted, rolled back by
double-texting, lost with ``langgraph dev``'s unflushed files), or one older than
the pending TTL, is settled with an ``IntentAbandoned`` result whose outcome is
*unknown* (the effect may well have happened): a replay of its call is answered
"outcome unknown", never run again. Its row's status is ``failed`` (the table's
statuses are pending, done and failed); everything that reads it names it unknown.

Only threads the given client can see are judged: with a ledger several servers
share (`ashared_postgres`), a thread one server cannot find may be another's, and its
intent is left alone unless ``sees_all=True`` says this client sees every thread
that writes the ledger. Run `settle_stale` from the job that runs
`Persistence.purge`, e.g. daily::

    settled = settle_stale(p.idempotency, get_sync_client(url=...))   # a server's threads
    settled = settle_stale(p.idempotency, p.checkpointer, sees_all=True)  # your only saver
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable
from typing import Any, TypeAlias

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph_sdk.errors import NotFoundError

from langgraph_resilience.core.clock import SystemClock
from langgraph_resilience.core.effects import (
    PENDING_TTL,
    STALE_GRACE,
    IdempotencyRecord,
    IdempotencyStore,
    StaleReason,
    abandoned_result,
    stale_reason,
)
from langgraph_resilience.core.flow import Call, Flow, adrive, drive
from langgraph_resilience.stores.remote_threads import Server, as_remote

__all__ = ["SettledIntent", "Threads", "asettle_stale", "settle_stale"]

_NEVER_SLEEPS = SystemClock()

Threads: TypeAlias = "BaseCheckpointSaver[Any] | Server | Callable[[str], bool]"
"""Where the threads live: a checkpointer, a LangGraph Server (client or RemoteGraph),
or a function ``thread_id -> exists``."""


@dataclasses.dataclass(frozen=True, slots=True)
class SettledIntent:
    """One stale intent `settle_stale` settled, for the operator's audit."""

    key: str
    tool: str | None
    thread_id: str | None
    reason: StaleReason
    age_s: float


def _seconds(value: float | dt.timedelta) -> float:
    return value.total_seconds() if isinstance(value, dt.timedelta) else float(value)


def _aged(record: IdempotencyRecord) -> IdempotencyRecord:
    """The record with its age, from its creation time when the store did not say."""
    if record.age_s is not None or record.created_at is None:
        return record
    created = record.created_at
    if created.tzinfo is None:
        created = created.replace(tzinfo=dt.UTC)
    age = (dt.datetime.now(dt.UTC) - created).total_seconds()
    return dataclasses.replace(record, age_s=max(0.0, age))


def _needs_sync_client(thread_id: str) -> Any:
    raise TypeError("settle_stale needs a sync client: get_sync_client(url=...)")


def _exists(threads: Threads, thread_id: str) -> Flow[bool]:
    """Whether a thread exists: on a server (its API), a checkpointer (its latest
    checkpoint) or by the caller's predicate. One flow for `drive` and `adrive`."""
    remote = as_remote(threads)
    if remote is not None:
        sync, asynchronous = remote.sync_client, remote.client
        get = Call(
            sync.threads.get if sync is not None else _needs_sync_client,
            asynchronous.threads.get if asynchronous is not None else None,
            (thread_id,),
        )
        try:
            yield get
        except NotFoundError:
            return False
        return True
    if isinstance(threads, BaseCheckpointSaver):
        config: Any = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
        found = yield Call(threads.get_tuple, threads.aget_tuple, (config,))
        return found is not None
    return bool(threads(thread_id))  # type: ignore[operator]


def _settling(
    store: IdempotencyStore,
    threads: Threads,
    *,
    grace: float,
    ttl: float,
    limit: int | None,
    sees_all: bool,
) -> Flow[list[SettledIntent]]:
    pending: list[IdempotencyRecord] = yield Call(
        store.list_pending, store.alist_pending, (grace,), {"limit": limit}
    )
    known: dict[str, bool] = {}
    settled: list[SettledIntent] = []
    for found in pending:
        record, thread_id = _aged(found), found.thread_id or ""
        if thread_id not in known:
            known[thread_id] = yield from _exists(threads, thread_id)
        if not known[thread_id] and not sees_all:
            continue  # not this client's to judge: it may be another server's thread
        reason = stale_reason(record, thread_exists=known[thread_id], grace=grace, ttl=ttl)
        if reason is None:
            continue
        yield Call(
            store.record_outcome,
            store.arecord_outcome,
            (record.key, abandoned_result(reason)),
            {"status": "failed"},
        )
        age = record.age_s or 0.0
        settled.append(SettledIntent(record.key, record.tool, found.thread_id, reason, age))
    return settled


def settle_stale(
    idempotency: IdempotencyStore,
    threads: Threads,
    *,
    grace: float | dt.timedelta = STALE_GRACE,
    ttl: float | dt.timedelta = PENDING_TTL,
    limit: int | None = None,
    sees_all: bool = False,
) -> list[SettledIntent]:
    """Settle the ledger's stale pending intents (the rule in the module docs); returns
    what it settled. An intent of a thread that exists and is younger than `ttl` is
    left to its thread; one whose thread `threads` cannot find is left alone unless
    `sees_all` (then its thread is gone)."""
    flow = _settling(
        idempotency,
        threads,
        grace=_seconds(grace),
        ttl=_seconds(ttl),
        limit=limit,
        sees_all=sees_all,
    )
    return drive(flow, _NEVER_SLEEPS)


async def asettle_stale(
    idempotency: IdempotencyStore,
    threads: Threads,
    *,
    grace: float | dt.timedelta = STALE_GRACE,
    ttl: float | dt.timedelta = PENDING_TTL,
    limit: int | None = None,
    sees_all: bool = False,
) -> list[SettledIntent]:
    """Async `settle_stale`."""
    flow = _settling(
        idempotency,
        threads,
        grace=_seconds(grace),
        ttl=_seconds(ttl),
        limit=limit,
        sees_all=sees_all,
    )
    return await adrive(flow, _NEVER_SLEEPS)
