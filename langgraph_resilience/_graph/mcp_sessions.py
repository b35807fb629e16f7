"""Persistent MCP sessions that come back: one per server, reconnected when a call
needs one, with backoff, and never by a background loop.

The adapters' tools bound to a session (``load_mcp_tools(session)``) stay bound to it:
once the server restarts or the session drops, every call fails (a closed stream, a
terminated session) until someone opens a new one. `McpSessions` hands the adapters a
stand-in session that forwards each call to the server's current session, opening a
new one when the last one died, at most as often as `core.mcp.Reconnect` allows; a
call arriving sooner fails at once, TRANSIENT with the wait as Retry-After and marked
not sent, so the call's own retry waits within its budget. The sessions live on one
event-loop thread owned by the pool (a session must be closed by the task that opened
it), shared by sync and async callers, and stopped by `close`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import threading
from collections.abc import Awaitable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from langchain_core.tools import BaseTool

from langgraph_resilience._graph.exactly_once import key_in_effect
from langgraph_resilience._graph.mcp import IDEMPOTENCY_META, run_sync, tag_tool
from langgraph_resilience.core.classification import classify
from langgraph_resilience.core.clock import Clock, SystemClock
from langgraph_resilience.core.mcp import Reconnect, reconnect_wait
from langgraph_resilience.errors import ConfigurationError, FailureClass, ToolFailure

if TYPE_CHECKING:
    from langchain_mcp_adapters.client import MultiServerMCPClient

__all__ = ["McpReconnectingError", "McpSessions"]


class McpReconnectingError(ToolFailure):
    """The server's session dropped and the reconnection backoff has not passed yet: the
    call was not sent (TRANSIENT; ``retry_after_ms`` says when to try again)."""

    def __init__(self, server: str, wait: float) -> None:
        super().__init__(
            FailureClass.TRANSIENT,
            f"the session to MCP server {server!r} dropped; reconnecting in {wait:.3f}s",
            retry_after_ms=max(1, math.ceil(wait * 1000)),  # never early: it would fail again
            context={"mcp": "reconnecting", "server": server, "sent": False},
        )
        self.server = server


@dataclasses.dataclass(slots=True)
class _Link:
    """One server's session and its reconnection record."""

    server: str
    session: Any = None
    stop: asyncio.Event | None = None
    owner: asyncio.Future[None] | None = None
    failures: int = 0
    failed_at: float | None = None
    connects: int = 0


class McpSessions:
    """One persistent session per server of `client`, reconnected on demand.

    >>> with McpSessions(client) as sessions:  # doctest: +SKIP
    ...     tools = sessions.load_tools()
    """

    def __init__(
        self,
        client: MultiServerMCPClient,
        *,
        reconnect: Reconnect | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.client, self.reconnect = client, reconnect or Reconnect()
        self.clock = clock or SystemClock()
        self._links = {name: _Link(name) for name in client.connections}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._start_lock = threading.Lock()

    # ------------------------------------------------------------ the public face

    def connects(self, server: str) -> int:
        """How many sessions were opened to `server` (the first one included)."""
        return self._link(server).connects

    async def aload_tools(self, *, servers: Sequence[str] | None = None) -> list[BaseTool]:
        """The servers' tools bound to this pool's sessions, tagged by server."""
        from langchain_mcp_adapters.tools import load_mcp_tools  # noqa: PLC0415 - optional

        tools: list[BaseTool] = []
        for name in list(self._links) if servers is None else list(servers):
            link = self._link(name)
            loaded = await load_mcp_tools(
                _Forwarding(self, link.server),  # type: ignore[arg-type]
                server_name=name,
                tool_interceptors=self.client.tool_interceptors,
                tool_name_prefix=self.client.tool_name_prefix,
                handle_tool_errors=self.client.handle_tool_errors,
            )
            tools.extend(tag_tool(tool, name) for tool in loaded)
        return tools

    def load_tools(self, *, servers: Sequence[str] | None = None) -> list[BaseTool]:
        """Sync `aload_tools`."""
        tools: list[BaseTool] = run_sync(self.aload_tools(servers=servers))
        return tools

    def drop(self, server: str) -> None:
        """Close `server`'s session (as a dropped connection would); the next call
        reconnects."""
        self._submit(self._close(self._link(server)), wait=True)

    def close(self) -> None:
        """Close every session and stop the pool's loop thread."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        for link in self._links.values():
            self._submit(self._close(link), wait=True)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
        self._loop = self._thread = None

    def __enter__(self) -> McpSessions:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ the loop thread

    def _link(self, server: str) -> _Link:
        link = self._links.get(server)
        if link is None:
            raise ConfigurationError(
                f"no MCP server named {server!r}; the client knows {sorted(self._links)}"
            )
        return link

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._start_lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name="langgraph-resilience-mcp", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def _submit(self, work: Coroutine[Any, Any, Any], *, wait: bool = False) -> Any:
        future = asyncio.run_coroutine_threadsafe(work, self._started())
        return future.result() if wait else asyncio.wrap_future(future)

    # ------------------------------------------------------------ on the loop thread

    async def call(self, server: str, name: str, arguments: Any, **kwargs: Any) -> Any:
        """One tool call on `server`'s session, reconnecting first if it dropped."""
        link = self._link(server)
        if link.session is None:
            wait = reconnect_wait(
                self.reconnect,
                failures=link.failures,
                failed_at=link.failed_at,
                now=self.clock.monotonic(),
            )
            if wait > 0:
                raise McpReconnectingError(server, wait)
            await self._open(link)
        try:
            return await self._raced(link, link.session.call_tool(name, arguments, **kwargs))
        except Exception as exc:
            if _session_lost(exc):
                await self._close(link)
                link.failures, link.failed_at = 1, self.clock.monotonic()
            raise

    async def _raced(self, link: _Link, call: Coroutine[Any, Any, Any]) -> Any:
        """The call's result, unless its session dies first: a dead HTTP transport leaves
        the pending request unanswered forever, so the owner's end ends the call."""
        task, owner = asyncio.ensure_future(call), link.owner
        if owner is None:
            return await task
        await asyncio.wait({task, owner}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        task.cancel()
        raise ConnectionError(f"the session to MCP server {link.server!r} dropped mid-call")

    async def _open(self, link: _Link) -> None:
        ready: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        link.stop = asyncio.Event()
        link.owner = asyncio.ensure_future(self._own(link, ready, link.stop))
        try:
            link.session = await ready
        except Exception:
            link.failures, link.failed_at = link.failures + 1, self.clock.monotonic()
            raise
        link.failures, link.failed_at, link.connects = 0, None, link.connects + 1

    async def _own(self, link: _Link, ready: asyncio.Future[Any], stop: asyncio.Event) -> None:
        """Hold one session open until told to stop or until it dies (the session's
        context must be left by the task that entered it)."""
        try:
            async with self.client.session(link.server) as session:
                ready.set_result(session)
                await stop.wait()
        except BaseException as exc:  # a dying session ends here, quietly
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else ConnectionError())
        finally:
            if link.stop is stop:
                link.session = None

    async def _close(self, link: _Link) -> None:
        if link.stop is not None:
            link.stop.set()
        link.session = None
        await asyncio.sleep(0)  # let the owner leave the session's context


class _Forwarding:
    """What the adapters hold as "the session": each call goes to the pool, which runs
    it on the server's current session (on the pool's loop)."""

    def __init__(self, pool: McpSessions, server: str) -> None:
        self.pool, self.server = pool, server

    def call_tool(self, name: str, arguments: Any = None, **kwargs: Any) -> Awaitable[Any]:
        key = key_in_effect()  # read here: the pool's loop has its own context
        if key is not None and kwargs.get("meta") is None:
            kwargs["meta"] = {IDEMPOTENCY_META: key}
        result: Awaitable[Any] = self.pool._submit(
            self.pool.call(self.server, name, arguments, **kwargs)
        )
        return result

    async def list_tools(self, cursor: str | None = None, **kwargs: Any) -> Any:
        """Listing the tools opens the session, so loading them is a health check."""

        async def listed() -> Any:
            link = self.pool._link(self.server)
            if link.session is None:
                await self.pool._open(link)
            return await link.session.list_tools(cursor=cursor, **kwargs)

        return await self.pool._submit(listed())


def _session_lost(exc: BaseException) -> bool:
    """Whether a failed call means the session is gone (closed stream, lost or refused
    connection, a server that no longer knows the session), not just the call."""
    context = classify(exc).context
    return bool(
        context.get("connection")
        or context.get("session") == "terminated"
        or context.get("mcp") == "session_closed"
    )
