"""The suite's functions served over a real MCP session, with faults on the way.

Why this module exists: a user's tools often come from an MCP server, and there the
evidence of a failure is MCP's own: a JSON-RPC error response, a session closed
before the request was written, a connection dropped before or after the server
ran the tool. `McpHost` serves every function of a suite from a FastMCP server on
loopback (streamable HTTP, uvicorn in a daemon thread, one per conversation), each
through `mcp_server_tool(..., idempotency=store)`: the host deduplicates a request
by the ``_meta.idempotency_key`` ours sends (as a key-deduplicating service does);
requests without a key (the other contenders') run every time. The host runs the
function on the conversation's `Sandbox`, which logs each run.

`Relay` is the client's outermost tool-call interceptor: it draws each attempt's
fault from the mix (the same deterministic draw as the HTTP variant) and plays it:

- ``mcp_refused``: the server answers a JSON-RPC error (-32603, "503 service
  unavailable") before running the tool (definite refusal);
- ``closed_before``: ``anyio.ClosedResourceError``, the session closed before the
  request was written (definite refusal; the server never sees it);
- ``dropped_before``: ``McpError(-32000, "Connection closed")`` without the request
  reaching the tool (ambiguous: the client cannot tell; not done);
- ``dropped_after``: the server runs the tool (the effect commits), then the client
  gets ``McpError(-32000, "Connection closed")`` (ambiguous; done).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from langchain_core.tools import BaseTool, StructuredTool
from mcp import types
from mcp.server.fastmcp import FastMCP
from mcp.shared.exceptions import McpError

from agentdojo.functions_runtime import Function
from langgraph_resilience._graph.mcp import aload_mcp_tools, mcp_server_tool
from langgraph_resilience.stores.memory import InMemoryIdempotencyStore

from .suites import canonical_key
from .tools import Sandbox

MCP_KINDS = ("mcp_refused", "closed_before", "dropped_before", "dropped_after")
MCP_BEFORE = frozenset({"mcp_refused", "closed_before", "dropped_before"})
"""Kinds under which the tool does not run."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class McpHost:
    """A FastMCP server on loopback serving `sandbox`'s suite (see the module)."""

    def __init__(self, sandbox: Sandbox) -> None:
        import uvicorn  # noqa: PLC0415 - only for the MCP variant

        self.sandbox = sandbox
        self.fault: str | None = None
        """The fault of the attempt now on the wire (set by the relay)."""
        self.number = 0
        self.refuse = False
        self.port = _free_port()
        store = InMemoryIdempotencyStore()
        served = [
            mcp_server_tool(self._tool(f), idempotency=store)
            for f in sandbox.suite.functions.values()
        ]
        server = FastMCP(sandbox.suite.name, host="127.0.0.1", port=self.port, tools=served)
        handlers = server._mcp_server.request_handlers
        original = handlers[types.CallToolRequest]

        async def call(request: types.CallToolRequest) -> Any:
            if self.refuse:  # a JSON-RPC error response: the tool does not run
                raise McpError(
                    types.ErrorData(code=types.INTERNAL_ERROR, message="503 service unavailable")
                )
            return await original(request)

        handlers[types.CallToolRequest] = call
        config = uvicorn.Config(
            server.streamable_http_app(), host="127.0.0.1", port=self.port, log_level="error"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the MCP host did not start")
            time.sleep(0.01)

    def _tool(self, function: Function[Any, Any]) -> BaseTool:
        def run(**kwargs: Any) -> str:
            key = canonical_key(function, kwargs)
            return self.sandbox.execute(function, kwargs, key, self.number, self.fault)

        return StructuredTool(
            name=function.name,
            description=function.description,
            args_schema=function.parameters,
            func=run,
        )

    @property
    def connection(self) -> dict[str, Any]:
        return {"transport": "streamable_http", "url": f"http://127.0.0.1:{self.port}/mcp"}

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


class Relay:
    """The client's outermost interceptor: draws and plays each attempt's fault."""

    def __init__(self, host: McpHost) -> None:
        self.host = host

    async def __call__(self, request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        sandbox = self.host.sandbox
        function = sandbox.suite.functions[request.name]
        key, number, fault = sandbox.draw(function, request.args)
        self.host.number, self.host.fault, self.host.refuse = number, None, False
        if fault in MCP_BEFORE:
            sandbox.unrun(function.name, key, number, fault)
            if fault == "closed_before":
                raise anyio.ClosedResourceError
            if fault == "dropped_before":
                raise _connection_closed()
            self.host.refuse = True  # mcp_refused: the server answers a JSON-RPC error
            try:
                return await handler(request)
            finally:
                self.host.refuse = False
        if fault is None:
            return await handler(request)
        self.host.fault = fault  # dropped_after: the tool runs, its answer is lost
        try:
            await handler(request)
        finally:
            self.host.fault = None
        raise _connection_closed()


def _connection_closed() -> McpError:
    return McpError(types.ErrorData(code=types.CONNECTION_CLOSED, message="Connection closed"))


def load_tools(host: McpHost, ours: bool) -> list[BaseTool]:
    """The host's tools through the adapters' client with the relay: ours with
    `aload_mcp_tools` (the key in ``_meta``), the others with ``client.get_tools()``."""
    from langchain_mcp_adapters.client import MultiServerMCPClient  # noqa: PLC0415

    client = MultiServerMCPClient(
        {host.sandbox.suite.name: host.connection},  # type: ignore[dict-item]
        tool_interceptors=[Relay(host)],
    )
    loaded: list[BaseTool] = asyncio.run(aload_mcp_tools(client) if ours else client.get_tools())
    return loaded
