"""The chaos mix ``mcp_server_down``: an MCP server holding several tools dies for a window.

Real MCP servers (FastMCP over loopback HTTP): ``weather`` holds ``forecast`` and
``news``; ``backup`` holds the same tools. Each task asks for a city's forecast and
news; ``weather`` is killed (SIGKILL) before task `down_from` and restarted before
task `down_until`. The scripted agent behaves as a model reading its tool answers
would: when the forecast fails, it asks ``backup_forecast`` once; then it answers.

Contenders, in one run, each over a fresh pair of servers:

- ``toolnode``: LangGraph's ``ToolNode(handle_tool_errors=True)`` over the adapters' tools;
- ``create_agent``: LangChain's ``create_agent`` + ``ToolRetryMiddleware`` (2 retries);
- ``resilient``: ``add_resilience`` over `load_mcp_tools` (one breaker per server, the
  forecast's fallback on backup, the news not critical);
- ``middleware``: ``create_agent`` + `ResilienceMiddleware`, the same profiles.

Reported per contender: tasks that got a forecast (success), calls sent to the dead
server, LLM calls. Run it from the repository root::

    python -m benchmarks.chaos.mcp_server_down
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import os
import pathlib
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import ToolRetryMiddleware
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool
from langchain_mcp_adapters.client import MultiServerMCPClient
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from langgraph_resilience import (
    BreakerConfig,
    ResilienceMiddleware,
    ResilienceState,
    ToolProfile,
    add_resilience,
)
from langgraph_resilience.mcp import aload_mcp_tools
from langgraph_resilience.stores import InMemoryBreakerStore
from langgraph_resilience.testing import FakeClock, ScriptedChatModel, text, tool_calls

__all__ = ["CONTENDERS", "Outcome", "main", "run_mix"]

BREAKER = BreakerConfig(minimum_calls=1, window_size=1, open_duration=30)
PROFILES = {
    "weather_forecast": ToolProfile(fallback="backup_forecast"),
    "weather_news": ToolProfile(critical=False),
}
ROOT = pathlib.Path(__file__).resolve().parents[2]
CITIES = ("Lyon", "Oslo", "Porto", "Riga", "Turin", "Bergen", "Ghent", "Cork")


@dataclasses.dataclass
class Outcome:
    """One contender's run of the mix."""

    contender: str
    tasks: int
    success: int = 0
    dead_calls: int = 0
    llm_calls: int = 0


# ------------------------------------------------------------------ servers


def serve(name: str, port: int) -> None:
    """One MCP server (this module, run as ``--serve NAME PORT``)."""
    from mcp.server.fastmcp import FastMCP  # noqa: PLC0415 - only the server needs it

    server = FastMCP(name, host="127.0.0.1", port=port, log_level="WARNING")

    @server.tool()
    def forecast(city: str) -> str:
        """Tomorrow's forecast for a city."""
        return f"[{name}] forecast for {city}: 16C"

    @server.tool()
    def news(city: str) -> str:
        """Local headlines."""
        return f"[{name}] news for {city}: the tram reopens"

    server.run(transport="streamable-http")


class Server:
    """A server process on a fixed loopback port: started, killed, restarted."""

    def __init__(self, name: str) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port: int = sock.getsockname()[1]
        self.name, self.process = name, None  # type: ignore[var-annotated]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> None:
        command = [sys.executable, "-m", "benchmarks.chaos.mcp_server_down", "--serve"]
        self.process = subprocess.Popen(  # type: ignore[assignment]
            [*command, self.name, str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ},
            cwd=ROOT,  # ``-m benchmarks...`` resolves from the checkout
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # bounded polling for start-up
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"MCP server {self.name} did not start")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


# ------------------------------------------------------------------ the agent


def agent_policy(outcome: Outcome) -> Callable[[list[BaseMessage]], AIMessage]:
    """The scripted agent: forecast + news; on a failed forecast, backup_forecast once."""

    def decide(messages: list[BaseMessage]) -> AIMessage:
        outcome.llm_calls += 1
        start = max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage))
        task = messages[start:]
        city = str(task[0].content)
        answers = [m for m in task if isinstance(m, ToolMessage)]
        if not answers:
            return tool_calls(
                ("weather_forecast", {"city": city}), ("weather_news", {"city": city})
            )
        got = any(_forecast_ok(m) for m in answers)
        tried = any(m.name == "backup_forecast" for m in answers)
        if not got and not tried:
            return tool_calls(("backup_forecast", {"city": city}))
        return text("done")

    return decide


def _forecast_ok(message: ToolMessage) -> bool:
    return message.status != "error" and "forecast for" in str(message.content)


# ------------------------------------------------------------------ contenders


class State(MessagesState, ResilienceState):
    """The graph's state: messages plus our ledger (unused by the baselines)."""


def _graph(model: ScriptedChatModel, tools: Sequence[BaseTool], ours: bool, clock: Any) -> Any:
    async def agent(state: State) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(State)
    builder.add_node("agent", agent)
    if ours:
        add_resilience(
            builder,
            agent="agent",
            tools=tools,
            profiles=PROFILES,
            breaker=BREAKER,
            breaker_store=InMemoryBreakerStore(),
            clock=clock,
        )
    else:
        builder.add_node("tools", ToolNode(list(tools), handle_tool_errors=True))
        builder.add_edge(START, "agent")
        builder.add_conditional_edges("agent", tools_condition)
        builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=InMemorySaver())


def _agent(model: ScriptedChatModel, tools: Sequence[BaseTool], ours: bool, clock: Any) -> Any:
    if ours:
        middleware: Any = ResilienceMiddleware(
            profiles=PROFILES, breaker=BREAKER, breaker_store=InMemoryBreakerStore(), clock=clock
        )
    else:
        middleware = ToolRetryMiddleware(max_retries=2, initial_delay=0, jitter=False)
    return create_agent(model, list(tools), middleware=[middleware], checkpointer=InMemorySaver())


CONTENDERS: dict[str, tuple[Callable[..., Any], bool]] = {
    "toolnode": (_graph, False),
    "create_agent": (_agent, False),
    "resilient": (_graph, True),
    "middleware": (_agent, True),
}


# ------------------------------------------------------------------ the run


async def _run(name: str, tasks: int, down_from: int, down_until: int) -> Outcome:
    weather, backup = Server("weather"), Server("backup")
    weather.start()
    backup.start()
    outcome, dead = Outcome(name, tasks), [False]
    sent: collections.Counter[str] = collections.Counter()

    async def count(request: Any, handler: Any) -> Any:
        sent[request.server_name] += 1
        if dead[0] and request.server_name == "weather":
            outcome.dead_calls += 1
        return await handler(request)

    connections: Any = {
        "weather": {"transport": "streamable_http", "url": weather.url},
        "backup": {"transport": "streamable_http", "url": backup.url},
    }
    client = MultiServerMCPClient(connections, tool_name_prefix=True, tool_interceptors=[count])
    try:
        build, ours = CONTENDERS[name]
        tools = await aload_mcp_tools(client) if ours else await client.get_tools()
        clock = FakeClock()
        model = ScriptedChatModel(responses=[agent_policy(outcome)] * (tasks * 6))
        app = build(model, tools, ours, clock)
        config = {"configurable": {"thread_id": f"mcp-down-{name}"}}
        for index in range(tasks):
            if index == down_from:
                weather.kill()
                dead[0] = True
            if index == down_until:
                weather.start()
                dead[0] = False
                clock.advance(BREAKER.open_duration_s + 1)  # the outage took that long
            city = CITIES[index % len(CITIES)]
            state = await app.ainvoke({"messages": [HumanMessage(city)]}, config)
            start = max(i for i, m in enumerate(state["messages"]) if isinstance(m, HumanMessage))
            answers = [m for m in state["messages"][start:] if isinstance(m, ToolMessage)]
            outcome.success += any(_forecast_ok(m) for m in answers)
    finally:
        weather.kill()
        backup.kill()
    return outcome


def run_mix(
    *,
    tasks: int = 8,
    down_from: int = 2,
    down_until: int = 6,
    contenders: Sequence[str] = tuple(CONTENDERS),
) -> list[Outcome]:
    """Run every contender over the mix, one after the other, each on fresh servers."""
    return [asyncio.run(_run(name, tasks, down_from, down_until)) for name in contenders]


def main(argv: Sequence[str] | None = None) -> int:
    """Print the table of the mix (success, calls to the dead server, LLM calls)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--serve"]:
        serve(args[1], int(args[2]))
        return 0
    outcomes = run_mix()
    print(f"{'contender':<14}{'success':>10}{'dead calls':>12}{'LLM calls':>11}")
    for o in outcomes:
        print(f"{o.contender:<14}{o.success:>5}/{o.tasks:<4}{o.dead_calls:>12}{o.llm_calls:>11}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
