"""Fixtures for tests against real MCP servers: processes, clients, a call counter."""

from __future__ import annotations

import collections
import pathlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from langchain_core.tools import BaseTool
from langchain_mcp_adapters.client import MultiServerMCPClient

from langgraph_resilience.mcp import load_mcp_tools
from tests.mcp.processes import HttpServer, stdio_connection


class Calls:
    """Counts the tool calls the adapters sent to each server (an adapters interceptor:
    every attempt that tried to reach the server, whether or not it answered)."""

    def __init__(self) -> None:
        self.by_server: collections.Counter[str] = collections.Counter()

    async def __call__(self, request: Any, handler: Callable[[Any], Awaitable[Any]]) -> Any:
        self.by_server[request.server_name] += 1
        return await handler(request)


@pytest.fixture
def marker(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path / "died"


@pytest.fixture
def weather(marker: pathlib.Path) -> Iterator[HttpServer]:
    """The "weather" server on loopback HTTP (killed at teardown)."""
    server = HttpServer("weather", marker).start()
    yield server
    server.kill()


@pytest.fixture
def calls() -> Calls:
    return Calls()


def mcp_tools(
    connections: dict[str, Any], calls: Calls, *, handle_tool_errors: bool = True
) -> dict[str, BaseTool]:
    """The servers' tools, loaded through the adapters' client and tagged by server;
    names are prefixed with the server (``weather_lookup``)."""
    client = MultiServerMCPClient(
        connections,
        tool_interceptors=[calls],
        tool_name_prefix=True,
        handle_tool_errors=handle_tool_errors,
    )
    return {t.name: t for t in load_mcp_tools(client)}


def stdio(name: str, marker: pathlib.Path | None = None) -> dict[str, Any]:
    return stdio_connection(name, marker)
