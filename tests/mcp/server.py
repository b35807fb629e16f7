"""A real MCP server for the tests: ``python server.py NAME stdio`` or ``... NAME http PORT``.

Every server has the same tools, so a test picks the server by its name and the
behaviour by the tool: ``lookup`` answers, ``fail`` reports ``isError`` in free text,
``refund`` reports ``isError`` with our envelope (served by `mcp_server_tool`),
``bad_params`` and ``no_method`` answer JSON-RPC errors, ``slow`` sleeps, and
``die_once`` kills the server process the first time (a marker file remembers it).
Side effects write a line each to a file beside the marker: ``charge`` is served by
`mcp_server_tool` with a durable key ledger (a repeat of a key is not run again),
``busy_once`` refuses its first request with a JSON-RPC error (-32603, "503 service
unavailable") and ``cancel`` refuses every one (``isError``).
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import sys
from typing import Any

from langchain_core.tools import tool
from mcp import types
from mcp.server.fastmcp import FastMCP
from mcp.shared.exceptions import McpError

from langgraph_resilience import FailureClass
from langgraph_resilience._graph.mcp import mcp_server_tool
from langgraph_resilience.errors import ToolFailure
from langgraph_resilience.stores import SqliteIdempotencyStore
from langgraph_resilience.stores.sqlite import sqlite_connect


@tool
def refund(order: str, amount: float) -> str:
    """Refund an order."""
    raise ToolFailure(
        FailureClass.POLICY,
        f"refund of {amount} on {order} exceeds the limit",
        context={"limit": 100, "api_key": "sk-live-abcdef1234567890"},
    )


def _marker() -> pathlib.Path:
    return pathlib.Path(os.environ.get("MCP_TEST_MARKER") or "/nonexistent/marker")


def effects_file(marker: pathlib.Path) -> pathlib.Path:
    """Where the server's side effects are written, one line each."""
    return marker.with_name(marker.name + ".effects")


def ledger_file(marker: pathlib.Path) -> pathlib.Path:
    """The server's idempotency-key ledger (survives a restart, and stdio's process per
    session)."""
    return marker.with_name(marker.name + ".keys.sqlite")


def _effect(what: str) -> None:
    with effects_file(_marker()).open("a") as out:
        out.write(what + "\n")


@tool
def charge(order: str, amount: float) -> str:
    """Charge an order."""
    _effect(f"charge {order} {amount}")
    return f"charged {amount} on {order}"


def build(name: str, port: int) -> FastMCP:
    served = [mcp_server_tool(refund)]
    if "MCP_TEST_MARKER" in os.environ:
        keys = SqliteIdempotencyStore(sqlite_connect(str(ledger_file(_marker()))))
        keys.setup()
        served.append(mcp_server_tool(charge, idempotency=keys))
    server = FastMCP(name, host="127.0.0.1", port=port, tools=served)

    @server.tool()
    def lookup(city: str) -> str:
        """Look a city up."""
        return f"{name}: {city} is sunny"

    @server.tool()
    def forecast(city: str) -> str:
        """The forecast for a city."""
        return f"{name}: forecast for {city}"

    @server.tool()
    def fail(order: str) -> str:
        """Always fails (isError, free text)."""
        raise ValueError(f"order {order} does not exist")

    @server.tool()
    def bad_params(x: int) -> str:
        """Answered with a JSON-RPC invalid-params error."""
        return "never"

    @server.tool()
    def no_method(x: int) -> str:
        """Answered with a JSON-RPC method-not-found error."""
        return "never"

    @server.tool()
    async def slow(seconds: float) -> str:
        """Sleeps."""
        await asyncio.sleep(seconds)
        return "slept"

    @server.tool()
    def die_once(city: str) -> str:
        """Kills the server process the first time it is called."""
        marker = pathlib.Path(os.environ["MCP_TEST_MARKER"])
        if not marker.exists():
            marker.write_text("died")
            os._exit(1)
        return f"{name}: {city} after a restart"

    @server.tool()
    def busy_once(order: str) -> str:
        """Refused once with a JSON-RPC error (see `_protocol_errors`), then done."""
        _effect(f"busy_once {order}")
        return f"done {order}"

    @server.tool()
    def cancel(order: str) -> str:
        """Always refused: the service answers isError, nothing is done."""
        raise ValueError(f"order {order} was delivered and cannot be cancelled")

    _protocol_errors(server)
    return server


def _protocol_errors(server: FastMCP) -> None:
    """Answer two tools with JSON-RPC errors, as a server that rejects the request does."""
    handlers = server._mcp_server.request_handlers
    original = handlers[types.CallToolRequest]
    codes = {"bad_params": types.INVALID_PARAMS, "no_method": types.METHOD_NOT_FOUND}

    async def call(request: types.CallToolRequest) -> Any:
        code = codes.get(request.params.name)
        if code is not None:
            raise McpError(types.ErrorData(code=code, message=f"rejected ({code})"))
        busy = _marker().with_name(_marker().name + ".busy")
        if request.params.name == "busy_once" and not busy.exists():
            busy.write_text("refused")
            message = "503 service unavailable"
            raise McpError(types.ErrorData(code=types.INTERNAL_ERROR, message=message))
        return await original(request)

    handlers[types.CallToolRequest] = call


if __name__ == "__main__":
    name, transport = sys.argv[1], sys.argv[2]
    port = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    app = build(name, port)
    app.run(transport="stdio" if transport == "stdio" else "streamable-http")
