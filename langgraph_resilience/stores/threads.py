"""Threads after a crash or an interrupt: `resume` them, ask where they stand
(`thread_status`), list them (`list_threads`).

`resume` / `aresume` continue a thread from its last checkpoint (after a crash, or
after an interrupt with ``Command(resume=...)``), under the thread's lock when
given one; `thread_status` says where a thread stands and `list_threads` lists
them (one query on the Postgres and SQLite savers, whatever the number of
checkpoints).

Each takes a compiled graph with its checkpointer or, for a deployed graph whose
checkpointer a LangGraph Server owns, the server: a `langgraph_sdk` client or a
`RemoteGraph` (`langgraph_resilience.stores.remote_threads`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, cast

import psycopg
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.pregel import Pregel
from langgraph.types import Command, Durability, StateSnapshot

from langgraph_resilience.core.clock import SystemClock
from langgraph_resilience.core.effects import IdempotencyRecord, summarize_records
from langgraph_resilience.core.flow import Call, Flow, adrive, drive
from langgraph_resilience.core.redaction import redact
from langgraph_resilience.errors import ConfigurationError, ThreadNotFoundError
from langgraph_resilience.stores.locks import (
    LockTarget,
    athread_held,
    athread_lock,
    thread_held,
    thread_lock,
)
from langgraph_resilience.stores.postgres import Postgres
from langgraph_resilience.stores.remote_threads import (
    RemoteThreads,
    Server,
    alist_remote_threads,
    as_remote,
    list_remote_threads,
)

if TYPE_CHECKING:  # persistence.py builds on this module
    from langgraph_resilience.stores.persistence import Persistence

__all__ = [
    "ThreadState",
    "ThreadStatus",
    "alist_threads",
    "aresume",
    "athread_status",
    "list_threads",
    "resume",
    "thread_status",
]

_NEVER_SLEEPS = SystemClock()


AnyApp: TypeAlias = "Pregel[Any, Any, Any, Any] | Server"
ThreadState = Literal["done", "interrupted", "failed", "pending", "running", "not_found"]


def _thread_config(thread_id: str, config: RunnableConfig | None) -> RunnableConfig:
    base: dict[str, Any] = dict(config or {})
    configurable = {**(base.get("configurable") or {}), "thread_id": thread_id}
    return cast("RunnableConfig", {**base, "configurable": configurable})


def _remote(app: AnyApp, assistant_id: str | None, lock: Any) -> RemoteThreads | None:
    """The server's threads when `app` is a server; a local graph must own a checkpointer."""
    remote = as_remote(app, assistant_id)
    if remote is not None:
        if lock is not None:
            raise ConfigurationError(
                "lock= does not apply to a LangGraph Server: it runs one run per thread "
                "itself (a second is refused or queued by its multitask_strategy)"
            )
        return RemoteThreads(remote)
    if getattr(app, "checkpointer", None) is None:
        raise ConfigurationError(
            "this graph was compiled without a checkpointer, so it has no threads here; "
            "compile it with one, or, when a LangGraph Server runs it, pass the server: "
            "get_sync_client(url=...) (get_client for the async functions) or "
            "RemoteGraph(graph_id, url=...)"
        )
    return None


def resume(
    app: AnyApp,
    thread_id: str,
    *,
    command: Command[Any] | None = None,
    config: RunnableConfig | None = None,
    lock: LockTarget | None = None,
    wait: bool | float = False,
    durability: Durability = "sync",
    assistant_id: str | None = None,
    **kwargs: Any,
) -> Any:
    """Continue a thread from its last checkpoint: ``app.invoke(command, config)``.

    With no `command` the interrupted or crashed step runs again (side effects
    are protected by the idempotency ledger); after an ``interrupt()`` pass
    ``Command(resume=value)``. With `lock` (a `Persistence`, pool, DSN...) the
    run holds the thread's `thread_lock`. Raises `ThreadNotFoundError` when the
    thread has no checkpoint. Extra keyword arguments go to ``invoke``.

    On a server (`app` a client or `RemoteGraph`) it is a new run of `assistant_id`
    (default ``"agent"``, or the `RemoteGraph`'s) on the thread; a thread the
    server is running already raises `ThreadBusyError`.

    >>> resume(app, "thread-42", command=Command(resume="approve"), lock=p)  # doctest: +SKIP
    """
    cfg = _thread_config(thread_id, config)
    remote = _remote(app, assistant_id, lock)
    if remote is not None:
        found = remote.snapshot(cfg)
        if found is None or found.created_at is None:
            raise ThreadNotFoundError(thread_id)
        return remote.run(thread_id, command, cfg)
    assert not isinstance(app, Server)
    held = thread_lock(lock, thread_id, wait=wait) if lock is not None else contextlib.nullcontext()
    with held:
        if app.get_state(cfg).created_at is None:
            raise ThreadNotFoundError(thread_id)
        return app.invoke(command, cfg, durability=durability, **kwargs)


async def aresume(
    app: AnyApp,
    thread_id: str,
    *,
    command: Command[Any] | None = None,
    config: RunnableConfig | None = None,
    lock: LockTarget | psycopg.AsyncConnection[Any] | None = None,
    wait: bool | float = False,
    durability: Durability = "sync",
    assistant_id: str | None = None,
    **kwargs: Any,
) -> Any:
    """Async `resume`: ``await app.ainvoke(command, config)`` under `athread_lock`."""
    cfg = _thread_config(thread_id, config)
    remote = _remote(app, assistant_id, lock)
    if remote is not None:
        found = await remote.asnapshot(cfg)
        if found is None or found.created_at is None:
            raise ThreadNotFoundError(thread_id)
        return await remote.arun(thread_id, command, cfg)
    assert not isinstance(app, Server)
    held: contextlib.AbstractAsyncContextManager[Any] = (
        athread_lock(lock, thread_id, wait=wait) if lock is not None else contextlib.nullcontext()
    )
    async with held:
        if (await app.aget_state(cfg)).created_at is None:
            raise ThreadNotFoundError(thread_id)
        return await app.ainvoke(command, cfg, durability=durability, **kwargs)


@dataclasses.dataclass(frozen=True, slots=True)
class ThreadStatus:
    """Where one thread stands, for the CLI, notebooks and operators.

    `state` is ``done`` (nothing left to run), ``interrupted`` (waiting for
    ``Command(resume=...)``; `interrupts` holds the payloads), ``failed`` (a
    node raised; `error`), ``running`` (another runner holds its lock),
    ``pending`` (steps left and nobody running them: crashed, or a static
    breakpoint; `resume` continues it) or ``not_found``.
    """

    thread_id: str
    state: ThreadState
    next: tuple[str, ...] = ()
    """The nodes that run next: where the thread stopped."""
    interrupts: tuple[Any, ...] = ()
    """The payloads of the pending ``interrupt()`` calls."""
    interrupt_ids: tuple[str, ...] = ()
    error: str | None = None
    """The failed node's error, redacted."""
    checkpoint_id: str | None = None
    updated_at: str | None = None
    step: int | None = None
    tally: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Summary of the ``resilience`` channel: tool attempts, calls by status, events."""
    effects: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Side-effect intents of the thread by status (``pending`` ones are UNKNOWN)."""


def _tally_summary(values: Any) -> dict[str, Any]:
    tally = values.get("resilience") if isinstance(values, Mapping) else None
    if not isinstance(tally, Mapping):
        return {}
    calls: dict[str, int] = {str(k): int(v) for k, v in (tally.get("done") or {}).items()}
    for record in (tally.get("calls") or {}).values():
        status = str(record.get("status", "?"))
        calls[status] = calls.get(status, 0) + 1
    return {
        "tool_attempts": int(tally.get("tool_attempts") or 0),
        "calls": calls,
        "events": dict(tally.get("events") or {}),
    }


def _status_of(
    thread_id: str,
    snapshot: StateSnapshot,
    *,
    records: Iterable[IdempotencyRecord] | None,
    busy: bool,
) -> ThreadStatus:
    """Pure: a `ThreadStatus` from a state snapshot, the thread's tally and its lock."""
    if snapshot.created_at is None:
        return ThreadStatus(thread_id=thread_id, state="not_found")
    interrupts = tuple(snapshot.interrupts) or tuple(
        i for task in snapshot.tasks for i in task.interrupts
    )
    errors = [task.error for task in snapshot.tasks if task.error]
    state: ThreadState
    if interrupts:
        state = "interrupted"
    elif errors:
        state = "failed"
    elif snapshot.next or snapshot.tasks:
        # A crash after a node finished but before the step committed leaves `next`
        # empty while the task is still pending: that thread is not done.
        state = "running" if busy else "pending"
    else:
        state = "done"
    configurable = snapshot.config.get("configurable") or {}
    metadata = snapshot.metadata or {}
    return ThreadStatus(
        thread_id=thread_id,
        state=state,
        next=tuple(snapshot.next),
        interrupts=tuple(i.value for i in interrupts),
        interrupt_ids=tuple(i.id for i in interrupts),
        error=redact(str(errors[0])) if errors else None,
        checkpoint_id=configurable.get("checkpoint_id"),
        updated_at=snapshot.created_at,
        step=metadata.get("step"),
        tally=_tally_summary(snapshot.values),
        effects=summarize_records(records) if records is not None else {},
    )


def _might_run(snapshot: StateSnapshot) -> bool:
    return bool(snapshot.next or snapshot.tasks) and not snapshot.interrupts


def _busy(persistence: Persistence, thread_id: str) -> bool:
    """Whether another runner holds the thread (its lease, read only; a file lock is
    taken and released at once)."""
    return thread_held(persistence, thread_id)


async def _abusy(persistence: Persistence, thread_id: str) -> bool:
    return await athread_held(persistence, thread_id)


def _status(
    app: AnyApp,
    thread_id: str,
    persistence: Persistence | None,
    config: RunnableConfig | None,
    snapshot: StateSnapshot | None,
) -> Flow[ThreadStatus]:
    """Read what `_status_of` needs: `thread_status` and `athread_status` drive this."""
    remote = _remote(app, None, None)
    cfg = _thread_config(thread_id, config)
    if snapshot is None and remote is not None:
        snapshot = yield Call(remote.snapshot, remote.asnapshot, (cfg,))
        if snapshot is None:
            return ThreadStatus(thread_id=thread_id, state="not_found")
    elif snapshot is None:
        assert not isinstance(app, Server)
        snapshot = yield Call(app.get_state, app.aget_state, (cfg,))
    assert snapshot is not None
    records = None
    if persistence:
        ledger = persistence.idempotency
        records = yield Call(ledger.for_thread, ledger.afor_thread, (thread_id,))
    busy = False
    if remote is not None and _might_run(snapshot):  # the server knows who runs it
        busy = yield Call(remote.busy, remote.abusy, (thread_id,))
    elif persistence is not None and _might_run(snapshot):
        busy = yield Call(_busy, _abusy, (persistence, thread_id))
    return _status_of(thread_id, snapshot, records=records, busy=busy)


def thread_status(
    app: AnyApp, thread_id: str, *, persistence: Persistence | None = None,
    config: RunnableConfig | None = None, snapshot: StateSnapshot | None = None,
) -> ThreadStatus:  # fmt: skip
    """Where a thread stands: done, interrupted (payload), failed (error), running,
    pending (where it stopped), with its tally summary.

    With `persistence` the status also counts the thread's side-effect intents
    and tells ``running`` (someone holds the thread lock) from ``pending``; on a
    server (`app` a client or `RemoteGraph`) ``running`` is the server's ``busy``.
    Pass the thread's latest `snapshot` when you already read it
    (``app.get_state``): the state is then not read again.
    """
    return drive(_status(app, thread_id, persistence, config, snapshot), _NEVER_SLEEPS)


async def athread_status(
    app: AnyApp, thread_id: str, *, persistence: Persistence | None = None,
    config: RunnableConfig | None = None, snapshot: StateSnapshot | None = None,
) -> ThreadStatus:  # fmt: skip
    """Async `thread_status`."""
    return await adrive(_status(app, thread_id, persistence, config, snapshot), _NEVER_SLEEPS)


# The latest root checkpoint of each thread, newest first, in one statement over the
# primary key (thread_id, checkpoint_ns, checkpoint_id) of LangGraph's `checkpoints`
# table (the same in PostgresSaver's and SqliteSaver's schema). Checkpoint ids are
# time-ordered (uuid6), so the greatest is the one written last.
_LATEST_SQL = (
    "SELECT thread_id, max(checkpoint_id) AS latest FROM checkpoints "
    "WHERE checkpoint_ns = '' GROUP BY thread_id ORDER BY latest DESC, thread_id"
)
_PG_LATEST_SQL = _LATEST_SQL + " LIMIT %(limit)s"
_SQLITE_LATEST_SQL = _LATEST_SQL + " LIMIT ?"


def _check_limit(limit: int | None) -> int | None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be None or an int >= 0, got {limit!r}")
    return limit


def _on_saver(saver: PostgresSaver | AsyncPostgresSaver) -> Postgres:
    """The saver's own connection or pool, used as the saver uses it (its lock held)."""
    is_async = isinstance(saver, AsyncPostgresSaver)
    owner = type(saver).__name__
    return Postgres(saver.conn, owner=owner, is_async=is_async, lock=saver.lock)


def _pg_threads(saver: PostgresSaver, limit: int | None) -> list[str]:
    rows = _on_saver(saver).rows(_PG_LATEST_SQL, {"limit": limit})
    return [str(row["thread_id"]) for row in rows]


async def _apg_threads(saver: AsyncPostgresSaver, limit: int | None) -> list[str]:
    rows = await _on_saver(saver).arows(_PG_LATEST_SQL, {"limit": limit})
    return [str(row["thread_id"]) for row in rows]


def _sqlite_threads(saver: SqliteSaver, limit: int | None) -> list[str]:
    with saver.cursor(transaction=False) as cur:
        cur.execute(_SQLITE_LATEST_SQL, (-1 if limit is None else limit,))
        return [str(row[0]) for row in cur.fetchall()]


class _Latest:
    """The generic walk: the greatest root checkpoint id seen per thread."""

    def __init__(self) -> None:
        self.latest: dict[str, str] = {}

    def add(self, config: RunnableConfig) -> None:
        configurable = config.get("configurable") or {}
        thread_id = configurable.get("thread_id")
        if thread_id is None or configurable.get("checkpoint_ns", "") != "":
            return
        thread, checkpoint_id = str(thread_id), str(configurable.get("checkpoint_id") or "")
        if thread not in self.latest or checkpoint_id > self.latest[thread]:
            self.latest[thread] = checkpoint_id

    def threads(self, limit: int | None) -> list[str]:
        ordered = sorted(self.latest.items(), key=lambda item: item[0])
        ordered.sort(key=lambda item: item[1], reverse=True)  # stable: ties by thread id
        return [thread for thread, _ in ordered[:limit]]


def list_threads(
    checkpointer: BaseCheckpointSaver[Any] | Server, *, limit: int | None = None
) -> list[str]:
    """Distinct thread ids with a checkpoint, most recently written first (by each
    thread's latest checkpoint), at most `limit` of them. On a server (a sync client
    or a `RemoteGraph`): its threads, most recently updated first.

    On LangGraph's `PostgresSaver` and `SqliteSaver` it is one statement on the
    saver's own pool or connection: ``SELECT thread_id, max(checkpoint_id) ...
    GROUP BY thread_id`` over the ``checkpoints`` table's primary key, reading
    no checkpoint body (1,000 threads of 50 checkpoints: milliseconds). An
    `AsyncPostgresSaver` runs the same statement on its event loop (call this
    from another thread, or use `alist_threads`). Any other checkpointer is
    walked through ``checkpointer.list(None)``, i.e. every checkpoint.
    """
    limit = _check_limit(limit)
    if isinstance(checkpointer, Server):
        return list_remote_threads(checkpointer, limit)
    if isinstance(checkpointer, PostgresSaver):
        return _pg_threads(checkpointer, limit)
    if isinstance(checkpointer, SqliteSaver):
        return _sqlite_threads(checkpointer, limit)
    if isinstance(checkpointer, AsyncPostgresSaver):
        try:
            on_loop = asyncio.get_running_loop() is checkpointer.loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            raise asyncio.InvalidStateError(
                "list_threads on an AsyncPostgresSaver from its own event loop would block "
                "it; use `await alist_threads(checkpointer)`"
            )
        future = asyncio.run_coroutine_threadsafe(
            _apg_threads(checkpointer, limit), checkpointer.loop
        )
        return future.result()
    latest = _Latest()
    for item in checkpointer.list(None):
        latest.add(item.config)
    return latest.threads(limit)


async def alist_threads(
    checkpointer: BaseCheckpointSaver[Any] | Server, *, limit: int | None = None
) -> list[str]:
    """Async `list_threads`: one statement on an `AsyncPostgresSaver` (or, in a worker
    thread, on a `PostgresSaver` / `SqliteSaver`), else ``checkpointer.alist(None)``;
    on a server (an async client or a `RemoteGraph`), its threads."""
    limit = _check_limit(limit)
    if isinstance(checkpointer, Server):
        return await alist_remote_threads(checkpointer, limit)
    if isinstance(checkpointer, AsyncPostgresSaver):
        return await _apg_threads(checkpointer, limit)
    if isinstance(checkpointer, PostgresSaver | SqliteSaver):
        return await asyncio.to_thread(list_threads, checkpointer, limit=limit)
    latest = _Latest()
    async for item in checkpointer.alist(None):
        latest.add(item.config)
    return latest.threads(limit)
