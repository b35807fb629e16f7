"""An agent over two MCP servers, one of which dies.

Two real MCP servers (FastMCP, from the `mcp` SDK): ``weather`` on loopback HTTP,
``backup`` on stdio. The tools come through langchain-mcp-adapters'
`MultiServerMCPClient`, loaded with `load_mcp_tools`, which tags each tool with its
server: all of weather's tools report to one breaker, ``mcp:weather``.

1. weather answers;
2. weather's process is killed (SIGKILL): the forecast fails its three attempts,
   which opens weather's breaker, and the backup server's forecast serves the call;
3. with weather down, no call reaches it: the forecast goes straight to the backup,
   the news (not critical) is answered "skipped: server weather unavailable", and
   the agent is told once which of weather's tools are out.

Offline like the other examples (a `ScriptedChatModel` and a `FakeClock`); it needs
the ``mcp`` extra (``pip install 'langgraph-resilience[mcp]'``). Run it from the
repository root:

    python examples/mcp_two_servers.py
"""

from __future__ import annotations

import collections
import os
import random
import socket
import subprocess
import sys
import time
from typing import Any

from langchain_core.messages import ToolMessage
from langchain_mcp_adapters.client import MultiServerMCPClient
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import MessagesState, StateGraph

from langgraph_resilience import (
    BreakerConfig,
    ResilienceState,
    ToolProfile,
    add_resilience,
)
from langgraph_resilience.mcp import load_mcp_tools
from langgraph_resilience.stores import InMemoryBreakerStore
from langgraph_resilience.testing import FakeClock, ScriptedChatModel, text, tool_calls


def serve(name: str, transport: str, port: int) -> None:
    """One MCP server (this script, run as ``--serve NAME stdio|http PORT``)."""
    from mcp.server.fastmcp import FastMCP  # noqa: PLC0415 - only the server needs it

    server = FastMCP(name, host="127.0.0.1", port=port, log_level="WARNING")

    @server.tool()
    def forecast(city: str) -> str:
        """Tomorrow's forecast for a city."""
        return f"[{name}] {city}: 16°C, sunny spells"

    @server.tool()
    def news(city: str) -> str:
        """Local news headlines."""
        return f"[{name}] {city}: the tram line reopens"

    server.run(transport="stdio" if transport == "stdio" else "streamable-http")


def start_weather() -> tuple[subprocess.Popen[bytes], int]:
    """Start the weather server on a free loopback port and wait until it listens."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, __file__, "--serve", "weather", "http", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return process, port
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise SystemExit("the weather server did not start")


def shown(message: ToolMessage) -> str:
    """A tool answer's text (MCP results are content blocks)."""
    content = message.content
    if isinstance(content, list):
        content = " ".join(b.get("text", "") for b in content if isinstance(b, dict))
    return str(content)[:140]


class State(MessagesState, ResilienceState):
    """The agent's state: messages plus the resilience ledger."""


def main() -> int:
    """Run the three turns; exit 1 unless the dead server was survived as described."""
    process, port = start_weather()
    sent: collections.Counter[str] = collections.Counter()

    async def count(request: Any, handler: Any) -> Any:  # the adapters' interceptor
        sent[request.server_name] += 1
        return await handler(request)

    client = MultiServerMCPClient(
        {
            "weather": {"transport": "streamable_http", "url": f"http://127.0.0.1:{port}/mcp"},
            "backup": {
                "transport": "stdio",
                "command": sys.executable,
                "args": [__file__, "--serve", "backup", "stdio", "0"],
                "env": dict(os.environ),  # the server child sees what this script sees
            },
        },
        tool_name_prefix=True,  # weather_forecast, backup_forecast, ...
        tool_interceptors=[count],
    )
    try:
        return run(load_mcp_tools(client), process, sent)
    finally:
        process.kill()


def run(tools: list[Any], process: subprocess.Popen[bytes], sent: collections.Counter[str]) -> int:
    ask = tool_calls(("weather_forecast", {"city": "Lyon"}))
    both = tool_calls(("weather_forecast", {"city": "Lyon"}), ("weather_news", {"city": "Lyon"}))
    model = ScriptedChatModel(responses=[ask, text("1"), ask, text("2"), both, text("3")])
    builder = StateGraph(State)
    builder.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
    add_resilience(
        builder,
        agent="agent",
        tools=tools,
        profiles={
            "weather_forecast": ToolProfile(fallback="backup_forecast"),
            "weather_news": ToolProfile(critical=False),
        },
        breaker=BreakerConfig(minimum_calls=1, window_size=1, open_duration=60),
        breaker_store=InMemoryBreakerStore(),
        clock=FakeClock(),  # offline only: backoff waits take no real time
        rng=random.Random(0),
    )
    app = builder.compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "mcp-two-servers"}}
    seen = 0
    for turn, question in enumerate(["forecast?", "forecast again?", "forecast and news?"], 1):
        if turn == 2:
            process.kill()
            process.wait()
            print("-- weather's process killed")
        state = app.invoke({"messages": [("user", question)]}, config)
        for message in state["messages"][seen:]:
            if isinstance(message, ToolMessage):
                print(f"turn {turn}: {message.name}: {shown(message)}")
        seen = len(state["messages"])
        print(f"turn {turn}: calls sent so far: {dict(sent)}")
    last = [m for m in state["messages"] if isinstance(m, ToolMessage)][-2:]
    served = any("[backup] Lyon" in str(m.content) for m in last)
    skipped = any(str(m.content).startswith("skipped: server weather") for m in last)
    return 0 if served and skipped and sent["weather"] == 4 else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        serve(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        sys.exit(main())
