"""Threads on LangGraph Server: what `thread_status`, `resume` and `list_threads` read
and send when the server, not this process, owns the checkpointer.

Deployed (``langgraph dev``, LangGraph Server, a ``langgraph.json``), the graph is
compiled without a checkpointer and the server keeps the threads; so the thread
tools take the server instead: a `langgraph_sdk` client (``get_sync_client(url=...)``
or ``get_client``) or a `RemoteGraph`. The state is the server's (``GET
/threads/{id}/state``), ``running`` is the server's own ``busy`` (it runs one run per
thread: no `thread_lock` here), and an escalation is answered with
``Command(resume=...)`` over its API, as a new run on the thread.
"""

from __future__ import annotations

from typing import Any, TypeAlias

from langchain_core.runnables import RunnableConfig
from langgraph.pregel.remote import RemoteGraph
from langgraph.types import Command, StateSnapshot
from langgraph_sdk.client import LangGraphClient, SyncLangGraphClient
from langgraph_sdk.errors import ConflictError, NotFoundError

from langgraph_resilience.core.clock import SystemClock
from langgraph_resilience.core.flow import Call, Flow, adrive, drive
from langgraph_resilience.errors import ThreadBusyError

__all__ = [
    "DEFAULT_ASSISTANT",
    "RemoteThreads",
    "Server",
    "alist_remote_threads",
    "as_remote",
    "list_remote_threads",
]

Server: TypeAlias = RemoteGraph | SyncLangGraphClient | LangGraphClient
"""What the thread tools accept for a deployed graph."""

DEFAULT_ASSISTANT = "agent"
"""The graph name `resume` runs when a client is given without ``assistant_id``."""

_PAGE = 1000
_NEVER_SLEEPS = SystemClock()


def as_remote(target: Any, assistant_id: str | None = None) -> RemoteGraph | None:
    """`target` as a `RemoteGraph` when it is a server (None for a local graph)."""
    if isinstance(target, RemoteGraph):
        return target
    name = assistant_id or DEFAULT_ASSISTANT
    if isinstance(target, SyncLangGraphClient):
        return RemoteGraph(name, sync_client=target)
    if isinstance(target, LangGraphClient):
        return RemoteGraph(name, client=target)
    return None


class RemoteThreads:
    """One server's threads, through its `RemoteGraph` (sync and async clients)."""

    def __init__(self, graph: RemoteGraph) -> None:
        self.graph = graph

    def snapshot(self, config: RunnableConfig) -> StateSnapshot | None:
        """The thread's latest state; None when the server has no such thread."""
        try:
            return self.graph.get_state(config)
        except NotFoundError:
            return None

    async def asnapshot(self, config: RunnableConfig) -> StateSnapshot | None:
        """Async `snapshot`."""
        try:
            return await self.graph.aget_state(config)
        except NotFoundError:
            return None

    def busy(self, thread_id: str) -> bool:
        """Whether the server is running a run on the thread now."""
        client = self.graph.sync_client
        if client is None:
            return False
        return bool(client.threads.get(thread_id).get("status") == "busy")

    async def abusy(self, thread_id: str) -> bool:
        """Async `busy`."""
        client = self.graph.client
        if client is None:
            return False
        return bool((await client.threads.get(thread_id)).get("status") == "busy")

    def run(self, thread_id: str, command: Command[Any] | None, config: RunnableConfig) -> Any:
        """A new run on the thread (``Command(resume=...)`` or a plain continue); a thread
        the server is running already is `ThreadBusyError` (``multitask_strategy=
        "reject"``), never a second run queued behind it or interrupting it."""
        try:
            return self.graph.invoke(command, config, multitask_strategy="reject")
        except ConflictError as exc:
            raise ThreadBusyError(thread_id) from exc

    async def arun(
        self, thread_id: str, command: Command[Any] | None, config: RunnableConfig
    ) -> Any:
        """Async `run`."""
        try:
            return await self.graph.ainvoke(command, config, multitask_strategy="reject")
        except ConflictError as exc:
            raise ThreadBusyError(thread_id) from exc


def _sync_client(target: Server) -> SyncLangGraphClient:
    client = target.sync_client if isinstance(target, RemoteGraph) else target
    if not isinstance(client, SyncLangGraphClient):
        raise TypeError("list_threads needs a sync client: get_sync_client(url=...)")
    return client


def _async_client(target: Server) -> LangGraphClient:
    client = target.client if isinstance(target, RemoteGraph) else target
    if not isinstance(client, LangGraphClient):
        raise TypeError("alist_threads needs an async client: get_client(url=...)")
    return client


def _listing(search: Any, limit: int | None) -> Flow[list[str]]:
    """Page through ``threads.search`` (the sync or the async client's), most recently
    updated first: `list_remote_threads` drives it, `alist_remote_threads` awaits it."""
    found: list[str] = []
    while limit is None or len(found) < limit:
        size = _PAGE if limit is None else min(_PAGE, limit - len(found))
        options = {"limit": size, "offset": len(found), "sort_by": "updated_at"}
        page = yield Call(search, None, (), {**options, "sort_order": "desc"})
        found += [str(thread["thread_id"]) for thread in page]
        if len(page) < size:
            break
    return found


def list_remote_threads(target: Server, limit: int | None) -> list[str]:
    """The server's thread ids, most recently updated first (paged ``threads.search``)."""
    return drive(_listing(_sync_client(target).threads.search, limit), _NEVER_SLEEPS)


async def alist_remote_threads(target: Server, limit: int | None) -> list[str]:
    """Async `list_remote_threads`."""
    return await adrive(_listing(_async_client(target).threads.search, limit), _NEVER_SLEEPS)
