"""Persistent MCP sessions (`McpSessions`) against a real HTTP server: a restart or a
dropped session is reconnected by the next call, with backoff, and a dead server ends
the call with an envelope, never a hang; sync and async."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import ToolMessage
from langchain_mcp_adapters.client import MultiServerMCPClient
from langgraph.checkpoint.memory import InMemorySaver

from langgraph_resilience import ResilienceMiddleware, ResiliencePolicy
from langgraph_resilience.mcp import McpSessions, Reconnect
from langgraph_resilience.testing import FakeClock, ScriptedChatModel, text, tool_calls
from tests.conftest import Runner, build_graph
from tests.mcp.conftest import Calls
from tests.mcp.processes import HttpServer

pytestmark = pytest.mark.slow  # spawns real MCP server processes


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def sessions(weather: HttpServer, calls: Calls, clock: FakeClock) -> Iterator[McpSessions]:
    client = MultiServerMCPClient(
        {"weather": weather.connection}, tool_interceptors=[calls], tool_name_prefix=True
    )
    with McpSessions(client, clock=clock, reconnect=Reconnect(base_delay=2)) as pool:
        yield pool


def last_answer(state: dict[str, Any]) -> ToolMessage:
    return [m for m in state["messages"] if isinstance(m, ToolMessage)][-1]


def graph(sessions: McpSessions, clock: FakeClock, turns: int, **kw: Any) -> Any:
    tools = sessions.load_tools()
    call = tool_calls(("weather_lookup", {"city": "Oslo"}))
    return build_graph(tools, [call, text("ok")] * turns, clock=clock, **kw)


def test_a_restarted_server_is_reconnected_by_the_next_call_after_the_backoff(
    runner: Runner, weather: HttpServer, sessions: McpSessions, clock: FakeClock
) -> None:
    """kill -9 and restart: the old session is unknown to the new process (TRANSIENT,
    not sent); the call's retry waits out the reconnect backoff (its Retry-After) on
    the clock, opens a second session and succeeds."""
    h = graph(sessions, clock, 2, policy=ResiliencePolicy(max_attempts=4))
    config = h.config()
    assert "Oslo is sunny" in str(
        last_answer(runner.invoke(h.app, {"messages": [("user", "1")]}, config)).content
    )
    weather.kill()
    weather.start()
    started = clock.monotonic()
    out = runner.invoke(h.app, {"messages": [("user", "2")]}, config)
    assert "Oslo is sunny" in str(last_answer(out).content)
    assert sessions.connects("weather") == 2
    assert clock.monotonic() - started >= 2  # the reconnect backoff was waited, on the clock
    (record,) = [r for r in out["resilience"]["calls"].values() if r["attempts"] > 1]
    assert record["status"] == "ok"


def test_a_dropped_session_is_reopened_without_a_failed_call(
    runner: Runner, sessions: McpSessions, clock: FakeClock, calls: Calls
) -> None:
    """The session closes between calls: the next call opens a new one first."""
    h = graph(sessions, clock, 2)
    config = h.config()
    runner.invoke(h.app, {"messages": [("user", "1")]}, config)
    sessions.drop("weather")
    out = runner.invoke(h.app, {"messages": [("user", "2")]}, config)
    assert last_answer(out).status != "error"
    assert sessions.connects("weather") == 2
    assert calls.by_server["weather"] == 2


def test_a_server_dead_under_a_session_ends_the_call_with_an_envelope_not_a_hang(
    runner: Runner, weather: HttpServer, sessions: McpSessions, clock: FakeClock
) -> None:
    """The HTTP transport leaves a request to a killed server unanswered; the pool ends
    it when the session dies, reconnection fails, and the agent gets a TRANSIENT
    envelope in bounded time."""
    h = graph(sessions, clock, 2)
    config = h.config()
    runner.invoke(h.app, {"messages": [("user", "1")]}, config)
    weather.kill()
    started = time.monotonic()
    out = runner.invoke(h.app, {"messages": [("user", "2")]}, config)
    assert time.monotonic() - started < 20
    answer = last_answer(out)
    assert answer.status == "error"
    assert json.loads(str(answer.content))["failure_class"] == "transient"


def test_create_agent_reconnects_a_restarted_server_through_the_pool(
    runner: Runner, weather: HttpServer, sessions: McpSessions, clock: FakeClock
) -> None:
    """The same restart under `create_agent` + `ResilienceMiddleware`: the call's retry
    waits out the reconnect backoff and the second session answers."""
    model = ScriptedChatModel(
        responses=[tool_calls(("weather_lookup", {"city": "Oslo"})), text("ok")] * 2
    )
    agent = create_agent(
        model,
        sessions.load_tools(),
        middleware=[ResilienceMiddleware(clock=clock, policy=ResiliencePolicy(max_attempts=4))],
        checkpointer=InMemorySaver(),
    )
    config = {"configurable": {"thread_id": "sessions-agent"}}
    runner.invoke(agent, {"messages": [("user", "1")]}, config)
    weather.kill()
    weather.start()
    out = runner.invoke(agent, {"messages": [("user", "2")]}, config)
    assert "Oslo is sunny" in str(last_answer(out).content)
    assert sessions.connects("weather") == 2
