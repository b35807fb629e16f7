"""A dead MCP server against real processes: one breaker for all its tools, calls to it
only as half-open probes, a restart closes it; degradation per tool (skip, fallback on
another server, a critical tool's clear envelope), and the agent told once."""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_core.messages import ToolMessage

from langgraph_resilience import GuardedToolNode, ToolProfile
from langgraph_resilience.core.breaker import BreakerConfig
from langgraph_resilience.stores import InMemoryBreakerStore
from langgraph_resilience.testing import FakeClock, text, tool_calls
from tests.conftest import Runner, build_graph
from tests.mcp.conftest import Calls, mcp_tools, stdio
from tests.mcp.processes import HttpServer

TRIPPY = BreakerConfig(minimum_calls=1, window_size=1, open_duration=30)
"""Opens once a server's last call failed (after its retries)."""

WEATHER_TOOLS = [
    "weather_bad_params",
    "weather_busy_once",
    "weather_cancel",
    "weather_charge",
    "weather_die_once",
    "weather_fail",
    "weather_forecast",
    "weather_lookup",
    "weather_no_method",
    "weather_refund",
    "weather_slow",
]


pytestmark = pytest.mark.slow  # spawns real MCP server processes


def new_answers(state: dict[str, Any], before: int) -> list[ToolMessage]:
    return [m for m in state["messages"][before:] if isinstance(m, ToolMessage)]


def body(message: ToolMessage) -> dict[str, Any]:
    content = str(message.content)
    parsed: dict[str, Any] = json.loads(content[content.index("{") :])
    return parsed


def test_a_killed_server_is_learned_once_for_all_its_tools_and_a_restart_closes_it(
    runner: Runner, weather: HttpServer, calls: Calls
) -> None:
    """kill -9: lookup fails its three attempts and opens the server's breaker; forecast,
    another tool of it, is refused without a call and names the tools it took down; after
    open_duration, the server restarted, one probe closes the breaker."""
    tools = mcp_tools({"weather": weather.connection}, calls)
    store, clock = InMemoryBreakerStore(), FakeClock()
    turns = [
        tool_calls(("weather_lookup", {"city": "Oslo"})),
        text("down"),
        tool_calls(("weather_forecast", {"city": "Oslo"})),
        text("still down"),
        tool_calls(("weather_forecast", {"city": "Oslo"})),
        text("back"),
    ]
    h = build_graph(
        list(tools.values()),
        turns,
        clock=clock,
        options={"breaker": TRIPPY, "breaker_store": store},
    )
    config = h.config()
    weather.kill()
    out = runner.invoke(h.app, {"messages": [("user", "weather?")]}, config)
    (failed,) = new_answers(out, 0)
    assert body(failed)["failure_class"] == "transient"
    assert calls.by_server["weather"] == 3
    assert store.snapshot("mcp:weather").status_at(TRIPPY, clock.time()) == "open"

    seen = len(out["messages"])
    out = runner.invoke(h.app, {"messages": [("user", "forecast?")]}, config)
    (refused,) = new_answers(out, seen)
    envelope = body(refused)
    assert envelope["failure_class"] == "structural"
    assert envelope["type"] == "McpServerDownError"
    assert envelope["context"]["server"] == "weather"
    assert envelope["context"]["unavailable_tools"] == WEATHER_TOOLS
    assert calls.by_server["weather"] == 3  # no call reached the dead server
    node = GuardedToolNode(list(tools.values()), breaker=TRIPPY, breaker_store=store, clock=clock)
    assert node.servers_down() == {"weather": WEATHER_TOOLS}  # the breaker's state says so

    weather.start()
    clock.advance(31)
    seen = len(out["messages"])
    out = runner.invoke(h.app, {"messages": [("user", "forecast now?")]}, config)
    (served,) = new_answers(out, seen)
    assert served.status != "error"
    assert "weather: forecast for Oslo" in str(served.content)
    assert calls.by_server["weather"] == 4  # the one half-open probe
    assert store.snapshot("mcp:weather").status_at(TRIPPY, clock.time()) == "closed"


def test_a_server_stopped_for_good_gets_only_the_half_open_probes(
    runner: Runner, weather: HttpServer, calls: Calls
) -> None:
    """The server never comes back: after the breaker opened, each open_duration buys one
    probe, which fails and reopens it; every other call is answered without a call."""
    tools = mcp_tools({"weather": weather.connection}, calls)
    store, clock = InMemoryBreakerStore(), FakeClock()
    call = tool_calls(("weather_lookup", {"city": "Oslo"}))
    h = build_graph(
        list(tools.values()),
        [call, text("t")] * 5,
        clock=clock,
        options={"breaker": TRIPPY, "breaker_store": store},
    )
    weather.kill()
    config = h.config()
    runner.invoke(h.app, {"messages": [("user", "1")]}, config)
    opened_at = calls.by_server["weather"]
    assert opened_at == 3
    runner.invoke(h.app, {"messages": [("user", "2")]}, config)  # refused
    clock.advance(31)
    runner.invoke(h.app, {"messages": [("user", "3")]}, config)  # one probe, fails
    runner.invoke(h.app, {"messages": [("user", "4")]}, config)  # refused again
    clock.advance(31)
    out = runner.invoke(h.app, {"messages": [("user", "5")]}, config)  # one probe
    probes = 2
    assert calls.by_server["weather"] - opened_at <= probes
    assert body(out["messages"][-2])["failure_class"] in ("structural", "transient")


def test_degradation_per_tool_and_the_agent_told_once(
    runner: Runner, weather: HttpServer, calls: Calls
) -> None:
    """With weather down: a non-critical tool is skipped, a tool with a fallback on the
    backup server (stdio) is served there, a critical tool gets a clear envelope; the
    server's tools are listed once, in one of the three answers; no call reaches it."""
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
    h = build_graph(
        list(tools.values()),
        [tool_calls(("weather_fail", {"order": "A1"})), text("down"), turn, text("done")],
        clock=clock,
        profiles=profiles,
        options={"breaker": TRIPPY, "breaker_store": store},
    )
    config = h.config()
    weather.kill()
    out = runner.invoke(h.app, {"messages": [("user", "1")]}, config)
    assert calls.by_server["weather"] == 3
    seen = len(out["messages"])
    out = runner.invoke(h.app, {"messages": [("user", "2")]}, config)
    issued = {c["id"]: c["name"] for c in out["messages"][seen + 1].tool_calls}
    by_tool = {issued[m.tool_call_id]: m for m in new_answers(out, seen)}
    assert calls.by_server["weather"] == 3
    assert calls.by_server["backup"] == 1

    skipped = by_tool["weather_lookup"]
    assert skipped.status != "error"
    assert str(skipped.content).startswith("skipped: server weather unavailable")
    served = by_tool["weather_forecast"]
    assert "backup: forecast for Oslo" in str(served.content)
    assert served.response_metadata["resilience"]["served_by"] == "backup_forecast"
    critical = body(by_tool["weather_fail"])
    assert critical["failure_class"] == "structural"
    assert critical["context"]["server"] == "weather"
    assert "MCP server 'weather' is unavailable" in critical["message"]
    listed = [
        m for m in (skipped, by_tool["weather_fail"]) if "unavailable_tools" in str(m.content)
    ]
    assert len(listed) == 1
    assert out["messages"][-1].content == "done"
    assert h.app.get_state(config).next == ()


def test_a_non_critical_tool_is_skipped_once_its_retries_find_the_server_gone(
    runner: Runner, weather: HttpServer, calls: Calls
) -> None:
    """No breaker has opened yet (none at all here): a non-critical tool spends its
    attempts on the dead server, then is answered as skipped, not as a failure; a
    critical tool in the same turn gets its TRANSIENT envelope."""
    tools = mcp_tools({"weather": weather.connection}, calls)
    turn = tool_calls(("weather_lookup", {"city": "Oslo"}), ("weather_fail", {"order": "A7"}))
    h = build_graph(
        list(tools.values()),
        [turn, text("done")],
        profiles={"weather_lookup": ToolProfile(critical=False)},
        options={"breaker": None},
    )
    weather.kill()
    out = runner.invoke(h.app, {"messages": [("user", "go")]}, h.config())
    issued = {c["id"]: c["name"] for c in out["messages"][1].tool_calls}
    by_tool = {issued[m.tool_call_id]: m for m in new_answers(out, 0)}
    assert calls.by_server["weather"] == 6
    skipped = by_tool["weather_lookup"]
    assert skipped.status != "error"
    assert str(skipped.content).startswith("skipped: server weather unavailable")
    assert body(by_tool["weather_fail"])["failure_class"] == "transient"
    assert out["messages"][-1].content == "done"
