"""MCP tools under the guards: which server serves a tool, what a down server answers.

A tool loaded from an MCP server (`aload_mcp_tools`, through the adapters' own
`MultiServerMCPClient`) is tagged with its server, so its calls report to the
server's breaker (``mcp:<server>``, one per server by default: one dead server is
learned once, not once per tool) and a refused call names every tool the server took
down. The adapters open a session per call, so a restarted server is reconnected by
the next call that reaches it: reconnection is driven by traffic only (the retry
backoff, then the breaker's half-open probe), and no loop outlives the graph.

The other way round, `mcp_server_tool` serves a LangChain tool over MCP so that its
failures are ``isError`` results carrying our `ToolError` envelope.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextvars
import functools
import json
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeGuard

from langchain_core.messages import BaseMessage, HumanMessage, ToolCall, ToolMessage
from langchain_core.tools import BaseTool, StructuredTool, Tool

from langgraph_resilience._graph.exactly_once import key_in_effect, storable
from langgraph_resilience.core.canonical import canonical_args
from langgraph_resilience.core.classification import DEFAULT_RULES, Rule, classify
from langgraph_resilience.core.effects import IdempotencyStore
from langgraph_resilience.core.mcp import remote_envelope
from langgraph_resilience.core.profile import ToolProfile
from langgraph_resilience.errors import ConfigurationError, FailureClass, McpToolError, ToolError
from langgraph_resilience.events import Event, emit
from langgraph_resilience.stores.memory import InMemoryIdempotencyStore

if TYPE_CHECKING:
    from langchain_mcp_adapters.client import MultiServerMCPClient
    from mcp.server.fastmcp.tools import Tool as FastMCPTool

__all__ = [
    "IDEMPOTENCY_META",
    "SERVER_KEY",
    "ToldOnce",
    "aload_mcp_tools",
    "async_only",
    "is_error_of",
    "load_mcp_tools",
    "mcp_server_of",
    "mcp_server_tool",
    "run_sync",
    "servers_of",
    "skipped_message",
    "tag_tool",
    "told_servers",
]

SERVER_KEY = "mcp_server"
"""The tool metadata key naming the MCP server that serves a tool."""


def mcp_server_of(tool: BaseTool) -> str | None:
    """The MCP server a tool is tagged with (`aload_mcp_tools` tags them), or None."""
    server = (tool.metadata or {}).get(SERVER_KEY)
    return server if isinstance(server, str) and server else None


def servers_of(tools: Iterable[BaseTool], profiles: Mapping[str, ToolProfile]) -> dict[str, str]:
    """Each MCP tool's server by tool name: its profile's `server`, else its tag."""
    found = {t.name: s for t in tools if (s := mcp_server_of(t)) is not None}
    found.update({name: p.server for name, p in profiles.items() if p.server})
    return found


# ------------------------------------------------------------------ loading


async def aload_mcp_tools(
    client: MultiServerMCPClient, *, servers: Sequence[str] | None = None
) -> list[BaseTool]:
    """The tools of `client`'s servers (all, or `servers`), each tagged with its server
    and given a sync body, so sync and async graphs both run them. A side-effecting
    call carries its idempotency key in the request's ``_meta``
    (``{"idempotency_key": ...}``), which a server built with `mcp_server_tool`
    deduplicates by: the client's own settings and interceptors still apply.

    >>> tools = await aload_mcp_tools(MultiServerMCPClient(connections))  # doctest: +SKIP
    """
    # the mcp extra is optional: imported when MCP tools are loaded, never with the package
    from langchain_mcp_adapters.tools import load_mcp_tools as load  # noqa: PLC0415

    names = list(client.connections) if servers is None else list(servers)
    unknown = sorted(set(names) - set(client.connections))
    if unknown:
        raise ConfigurationError(
            f"no MCP server named {unknown}; the client knows {sorted(client.connections)}"
        )
    tools: list[BaseTool] = []
    for name in names:
        loaded = await load(
            None,
            connection=client.connections[name],
            callbacks=client.callbacks,
            server_name=name,
            tool_interceptors=[*(client.tool_interceptors or []), _KeyedCall(client)],
            tool_name_prefix=client.tool_name_prefix,
            handle_tool_errors=client.handle_tool_errors,
        )
        tools.extend(tag_tool(tool, name) for tool in loaded)
    return tools


IDEMPOTENCY_META = "idempotency_key"
"""The ``_meta`` field of a ``tools/call`` request that carries a side effect's key."""


class _KeyedCall:
    """The innermost interceptor: a side-effecting call (a key in context) is sent with
    its key in the request's ``_meta``; any other goes on as the adapters send it.
    The adapters open a session per call, and so does this, with the same connection
    (headers an earlier interceptor set included)."""

    def __init__(self, client: MultiServerMCPClient) -> None:
        self.client = client

    async def __call__(self, request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        key = key_in_effect()
        if key is None:
            return await handler(request)
        from langchain_mcp_adapters.sessions import create_session  # noqa: PLC0415

        connection: dict[str, Any] = dict(self.client.connections[request.server_name])
        if request.headers and connection.get("transport") in _HTTP_TRANSPORTS:
            connection["headers"] = {**(connection.get("headers") or {}), **request.headers}
        failure: BaseException | None = None
        async with create_session(connection) as session:  # type: ignore[arg-type]
            await session.initialize()
            try:
                result = await session.call_tool(
                    request.name, request.args, meta={IDEMPOTENCY_META: key}
                )
            except Exception as exc:  # raised outside the session's context, as the
                failure = exc  # adapters do: leaving it may swallow an exception
        if failure is not None:
            raise failure
        return result


_HTTP_TRANSPORTS = ("sse", "http", "streamable_http", "streamable-http")


def load_mcp_tools(
    client: MultiServerMCPClient, *, servers: Sequence[str] | None = None
) -> list[BaseTool]:
    """Sync `aload_mcp_tools` (for scripts and sync graphs; not inside an event loop)."""
    tools: list[BaseTool] = run_sync(aload_mcp_tools(client, servers=servers))
    return tools


def tag_tool(tool: BaseTool, server: str) -> BaseTool:
    """Tag an MCP tool with its server (its breaker is then the server's) and give an
    async-only tool a sync body."""
    tool.metadata = {**(tool.metadata or {}), SERVER_KEY: server}
    if async_only(tool) and tool.coroutine is not None:
        tool.func = _sync_body(tool.coroutine)
    return tool


def async_only(tool: BaseTool | None) -> TypeGuard[StructuredTool | Tool]:
    """Whether `tool` has an async body and no sync one (``async def`` under ``@tool``)."""
    return isinstance(tool, StructuredTool | Tool) and tool.func is None and bool(tool.coroutine)


def _sync_body(coroutine: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
    """A sync twin of an async tool body, with its signature (injected arguments)."""

    @functools.wraps(coroutine)
    def body(*args: Any, **kwargs: Any) -> Any:
        return run_sync(coroutine(*args, **kwargs))

    return body


async def _awaited(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def run_sync(awaitable: Awaitable[Any]) -> Any:
    """Run a coroutine to the end from sync code: here when no loop runs in this
    thread, else on a fresh thread (a loop cannot be re-entered)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_awaited(awaitable))
    context = contextvars.copy_context()  # the call's key and run config go along
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(context.run, asyncio.run, _awaited(awaitable)).result()


# ------------------------------------------------------------------ answers


def is_error_of(message: ToolMessage, server: str | None) -> McpToolError:
    """The failure behind an ``isError`` result the adapters flattened into an error
    `ToolMessage` (their default): the tool's own failure, so it is classified."""
    content = message.content
    if isinstance(content, list):
        parts = [b.get("text") if isinstance(b, dict) else b for b in content]
        text = "\n".join(p for p in parts if isinstance(p, str))
    else:
        text = str(content)
    error = McpToolError(text, server=server)
    envelope = remote_envelope(text)
    if envelope is not None and isinstance(envelope.get("message"), str):
        error.args = (envelope["message"],)  # the model reads the server's message
    return error


def told_servers(messages: Sequence[BaseMessage]) -> set[str]:
    """The MCP servers the agent was already told are unavailable in this task (since
    the last human message), read from the answers themselves: no extra state."""
    told: set[str] = set()
    for message in reversed(messages):
        if isinstance(message, HumanMessage):
            break
        if isinstance(message, ToolMessage) and isinstance(message.artifact, dict):
            server = message.artifact.get("mcp_unavailable")
            if server is None:
                context = (message.artifact.get("tool_error") or {}).get("context") or {}
                server = context.get("server") if context.get("unavailable_tools") else None
            if isinstance(server, str):
                told.add(server)
    return told


def already_told(
    server: str | None,
    *,
    rerouted: bool,
    messages: Sequence[BaseMessage],
    message_id: str | None,
    once: ToldOnce,
) -> bool:
    """Whether this task's agent already heard that `server` is down (from the history,
    or from an earlier refusal of this assistant message): its tools are then not
    listed again. A refusal a fallback answers never counts: the agent may not see it."""
    if server is None or rerouted:
        return False
    if server in told_servers(messages):
        return True
    return message_id is not None and not once.first(message_id, server)


class ToldOnce:
    """Which down servers the answers to one assistant message already listed: its
    parallel calls (threads, or separate tasks under `create_agent`) list them once.
    In-process and bounded; the history (`told_servers`) covers later steps."""

    def __init__(self, size: int = 256) -> None:
        self._told: collections.OrderedDict[tuple[str, str], None] = collections.OrderedDict()
        self._size, self._lock = size, threading.Lock()

    def first(self, message_id: str, server: str) -> bool:
        """True for the first answer to `message_id` to tell of `server`."""
        with self._lock:
            key = (message_id, server)
            if key in self._told:
                return False
            self._told[key] = None
            while len(self._told) > self._size:
                self._told.popitem(last=False)
            return True


def skipped_message(call: ToolCall, server: str, tools: Sequence[str]) -> ToolMessage:
    """A non-critical tool's answer while its server is down: a result, not a failure,
    so the model plans around it. It lists the server's tools once per task."""
    emit(Event("call_skipped", tool=call["name"], call_id=call["id"] or "", server=server))
    body: dict[str, Any] = {"skipped": True, "reason": f"server {server} unavailable"}
    if tools:
        body["unavailable_tools"] = list(tools)
    return ToolMessage(
        content=f"skipped: server {server} unavailable " + json.dumps(body),
        name=call["name"],
        tool_call_id=call["id"] or "",
        artifact={"mcp_unavailable": server, "unavailable_tools": list(tools)},
    )


# ------------------------------------------------------------------ serving


def mcp_server_tool(
    tool: BaseTool,
    *,
    profile: ToolProfile | None = None,
    rules: Sequence[Rule] = (),
    idempotency: IdempotencyStore | None = None,
) -> FastMCPTool:
    """`tool` as a FastMCP tool whose failures are ``isError`` results carrying our
    (redacted) envelope: a client reading it, ours or another, keeps the class.

    A request whose ``_meta`` carries an idempotency key (ours send one for every side
    effect) is run at most once per key, as Stripe runs a request per
    ``Idempotency-Key``: a repeat gets the first result without running the tool
    again, and one arriving while the first still runs is refused (TRANSIENT, retry
    later). The keys live in `idempotency` (in this process by default; pass a
    durable store to keep them across restarts). So a client may declare the tool
    ``ToolProfile(side_effect=True, safe_repeat="by_key")``. `rules` are tried before
    the built-in table.

    >>> server = FastMCP("orders", tools=[mcp_server_tool(refund)])  # doctest: +SKIP
    """
    # the mcp extra is optional: imported when a tool is served, never with the package
    from langchain_mcp_adapters.tools import to_fastmcp  # noqa: PLC0415
    from mcp.types import CallToolResult, TextContent  # noqa: PLC0415

    store = idempotency if idempotency is not None else InMemoryIdempotencyStore()

    def refused(error: ToolError) -> CallToolResult:
        text = error.model_dump_json(exclude_none=True)
        return CallToolResult(isError=True, content=[TextContent(type="text", text=text)])

    async def run(lgr_context: Any = None, **arguments: Any) -> Any:
        key = _meta_key(lgr_context)
        if key is None:
            return await _served(tool, arguments, profile, rules, refused)
        claim = await store.aclaim(
            key, tool=tool.name, args_json=canonical_args(arguments), thread_id=f"mcp:{tool.name}"
        )
        if claim.state == "done":  # a repeat of a request already run: its first result
            emit(Event("effect_deduplicated", tool=tool.name, key=key))
            return claim.record.result
        if claim.state == "pending":
            return refused(_in_progress(tool.name))
        result = await _served(tool, arguments, profile, rules, refused)
        if isinstance(result, CallToolResult):
            await store.arelease(key)  # failed: the next request with the key runs it
        else:
            await store.arecord_outcome(key, storable(result))
        return result

    served = to_fastmcp(tool)
    return served.model_copy(update={"fn": run, "context_kwarg": "lgr_context"})


async def _served(
    tool: BaseTool,
    arguments: dict[str, Any],
    profile: ToolProfile | None,
    rules: Sequence[Rule],
    refused: Callable[[ToolError], Any],
) -> Any:
    try:
        return await tool.ainvoke(arguments)
    except Exception as exc:
        table = (*rules, *DEFAULT_RULES)
        return refused(classify(exc, tool=tool.name, profile=profile, rules=table))


def _meta_key(context: Any) -> str | None:
    """The idempotency key a request's ``_meta`` carries, or None."""
    meta = getattr(getattr(context, "request_context", None), "meta", None)
    key = (getattr(meta, "model_extra", None) or {}).get(IDEMPOTENCY_META)
    return key if isinstance(key, str) and key else None


def _in_progress(tool: str) -> ToolError:
    return ToolError(
        type="RequestInProgress",
        failure_class=FailureClass.TRANSIENT,
        message="a request with this idempotency key is still running; retry later",
        suggested_action="retry",
        retriable=True,
        retry_after_ms=1000,
        tool=tool,
        context={"sent": False},
    )
