"""`create_agent` + `ResilienceMiddleware` over real MCP servers: the same per-server
breaker, isError classification, degradation and told-once as `add_resilience`."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import ToolMessage
from langgraph.checkpoint.memory import InMemorySaver

from langgraph_resilience import ResilienceMiddleware, ToolProfile
from langgraph_resilience.core.breaker import BreakerConfig
from langgraph_resilience.stores import InMemoryBreakerStore
from langgraph_resilience.testing import FakeClock, ScriptedChatModel, text, tool_calls
from tests.conftest import Runner
from tests.mcp.conftest import Calls, mcp_tools, stdio
from tests.mcp.processes import HttpServer

pytestmark = pytest.mark.slow  # spawns real MCP server processes

TRIPPY = BreakerConfig(minimum_calls=1, window_size=1, open_duration=30)


def agent_over(served: dict[str, Any], responses: list[Any], **options: Any) -> Any:
    model = ScriptedChatModel(responses=responses)
    middleware = ResilienceMiddleware(**options)
    return create_agent(
        model, list(served.values()), middleware=[middleware], checkpointer=InMemorySaver()
    )


def answers(state: dict[str, Any], before: int = 0) -> list[ToolMessage]:
    return [m for m in state["messages"][before:] if isinstance(m, ToolMessage)]


def body(message: ToolMessage) -> dict[str, Any]:
    content = str(message.content)
    parsed: dict[str, Any] = json.loads(content[content.index("{") :])
    return parsed


def config() -> dict[str, Any]:
    return {"configurable": {"thread_id": uuid.uuid4().hex}}


def test_is_error_envelope_and_jsonrpc_errors_classify_under_the_middleware(
    runner: Runner, weather: HttpServer, calls: Calls
) -> None:
    """Our envelope in an isError result stays POLICY; invalid params stays SEMANTIC."""
    tools = mcp_tools({"weather": weather.connection}, calls)
    turn = tool_calls(
        ("weather_refund", {"order": "A7", "amount": 500}), ("weather_bad_params", {"x": 1})
    )
    agent = agent_over(tools, [turn, text("done")], clock=FakeClock())
    out = runner.invoke(agent, {"messages": [("user", "go")]}, config())
    classes = sorted(body(m)["failure_class"] for m in answers(out))
    assert classes == ["policy", "semantic"]
    assert calls.by_server["weather"] == 2


def test_a_killed_server_one_breaker_degradation_and_told_once(
    runner: Runner, weather: HttpServer, calls: Calls
) -> None:
    """kill -9: the first call's three attempts open weather's breaker; then a
    non-critical tool is skipped, a fallback on the stdio backup serves, a critical tool
    gets the server-down envelope; the tools are listed once; no call reaches weather."""
    tools = mcp_tools({"weather": weather.connection, "backup": stdio("backup")}, calls)
    store, clock = InMemoryBreakerStore(), FakeClock()
    profiles = {
        "weather_lookup": ToolProfile(critical=False),
        "weather_forecast": ToolProfile(fallback="backup_forecast"),
    }
    turn = tool_calls(
        ("weather_lookup", {"city": "Oslo"}),
        ("weather_forecast", {"city": "Oslo"}),
        ("weather_fail", {"order": "A7"}),
    )
    responses = [tool_calls(("weather_fail", {"order": "A1"})), text("down"), turn, text("ok")]
    agent = agent_over(
        tools,
        responses,
        clock=clock,
        profiles=profiles,
        breaker=TRIPPY,
        breaker_store=store,
        tools=list(tools.values()),
    )
    cfg = config()
    weather.kill()
    out = runner.invoke(agent, {"messages": [("user", "1")]}, cfg)
    assert calls.by_server["weather"] == 3
    assert store.snapshot("mcp:weather").status_at(TRIPPY, clock.time()) == "open"
    seen = len(out["messages"])
    out = runner.invoke(agent, {"messages": [("user", "2")]}, cfg)
    issued = {c["id"]: c["name"] for c in out["messages"][seen + 1].tool_calls}
    by_tool = {issued[m.tool_call_id]: m for m in answers(out, seen)}
    assert calls.by_server["weather"] == 3
    assert calls.by_server["backup"] == 1
    assert str(by_tool["weather_lookup"].content).startswith("skipped: server weather")
    assert "backup: forecast for Oslo" in str(by_tool["weather_forecast"].content)
    critical = body(by_tool["weather_fail"])
    assert critical["failure_class"] == "structural"
    assert critical["context"]["server"] == "weather"
    listed = [m for m in by_tool.values() if "unavailable_tools" in str(m.content)]
    assert len(listed) == 1
    assert out["messages"][-1].content == "ok"


def test_a_non_critical_tool_is_skipped_after_its_retries_under_the_middleware(
    runner: Runner, weather: HttpServer, calls: Calls
) -> None:
    """No breaker: the non-critical tool's attempts find weather gone, and the agent
    reads "skipped" for it, the critical one's TRANSIENT envelope beside it."""
    tools = mcp_tools({"weather": weather.connection}, calls)
    turn = tool_calls(("weather_lookup", {"city": "Oslo"}), ("weather_fail", {"order": "A7"}))
    agent = agent_over(
        tools,
        [turn, text("done")],
        clock=FakeClock(),
        breaker=None,
        profiles={"weather_lookup": ToolProfile(critical=False)},
    )
    weather.kill()
    out = runner.invoke(agent, {"messages": [("user", "go")]}, config())
    issued = {c["id"]: c["name"] for c in out["messages"][1].tool_calls}
    by_tool = {issued[m.tool_call_id]: m for m in answers(out)}
    assert calls.by_server["weather"] == 6
    assert str(by_tool["weather_lookup"].content).startswith("skipped: server weather")
    assert body(by_tool["weather_fail"])["failure_class"] == "transient"
    assert out["messages"][-1].content == "done"
