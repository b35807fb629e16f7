"""A real MCP server for the tests: ``python server.py NAME stdio`` or ``... NAME http PORT``.

Every server has the same tools, so a test picks the server by its name and the
behaviour by the tool: ``lookup`` answers, ``fail`` reports ``isError`` in free text,
``refund`` reports ``isError`` with our envelope (served by `mcp_server_tool`),
``bad_params`` and ``no_method`` answer JSON-RPC errors, ``slow`` sleeps, and
``die_once`` kills the server process the first time (a marker file remembers it).
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

from langgraph_resilience import FailureClass, ToolFailure
from langgraph_resilience.graph.mcp import mcp_server_tool


@tool
def refund(order: str, amount: float) -> str:
    """Refund an order."""
    raise ToolFailure(
        FailureClass.POLICY,
        f"refund of {amount} on {order} exceeds the limit",
        context={"limit": 100, "api_key": "sk-live-abcdef1234567890"},
    )


def build(name: str, port: int) -> FastMCP:
    server = FastMCP(name, host="127.0.0.1", port=port, tools=[mcp_server_tool(refund)])

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
        return await original(request)

    handlers[types.CallToolRequest] = call


if __name__ == "__main__":
    name, transport = sys.argv[1], sys.argv[2]
    port = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    app = build(name, port)
    app.run(transport="stdio" if transport == "stdio" else "streamable-http")
