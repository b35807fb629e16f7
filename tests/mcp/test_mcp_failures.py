"""A tool's own failures against real MCP servers: isError (free text, our envelope),
JSON-RPC errors, a slow server past tool_timeout, a stdio server that dies mid-call."""

from __future__ import annotations

import json
import pathlib
import time
from typing import Any

import pytest
from langchain_core.messages import ToolMessage

from langgraph_resilience import ResiliencePolicy
from langgraph_resilience.testing import text, tool_calls
from tests.conftest import Runner, build_graph
from tests.mcp.conftest import Calls, mcp_tools, stdio
from tests.mcp.processes import HttpServer

pytestmark = pytest.mark.slow  # spawns real MCP server processes


def answers(state: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in state["messages"] if isinstance(m, ToolMessage)]


def envelope(message: ToolMessage) -> dict[str, Any]:
    assert message.status == "error"
    body: dict[str, Any] = json.loads(str(message.content))
    return body


def run_one(runner: Runner, tools: dict[str, Any], name: str, args: dict[str, Any], **kw: Any):
    h = build_graph(list(tools.values()), [tool_calls((name, args)), text("done")], **kw)
    return h, runner.invoke(h.app, {"messages": [("user", "go")]}, h.config())


@pytest.mark.parametrize("handle_tool_errors", [True, False])
def test_is_error_in_free_text_is_the_tools_semantic_failure(
    runner: Runner, weather: HttpServer, calls: Calls, handle_tool_errors: bool
) -> None:
    """Whether the adapters flatten isError into an error ToolMessage or raise it, the
    agent sees one SEMANTIC envelope with the server's text, after one call (no retry)."""
    tools = mcp_tools({"weather": weather.connection}, calls, handle_tool_errors=handle_tool_errors)
    _, out = run_one(runner, tools, "weather_fail", {"order": "A7"})
    body = envelope(answers(out)[-1])
    assert body["failure_class"] == "semantic"
    assert body["context"]["mcp"] == "is_error"
    assert "order A7 does not exist" in body["message"]
    assert calls.by_server["weather"] == 1


@pytest.mark.parametrize("handle_tool_errors", [True, False])
def test_is_error_with_our_envelope_keeps_its_class_and_hides_the_secret(
    runner: Runner, weather: HttpServer, calls: Calls, handle_tool_errors: bool
) -> None:
    """A tool served by the package answers a POLICY failure as isError with our
    envelope; the client honours it (no retry, ask a human) and no secret crosses."""
    tools = mcp_tools({"weather": weather.connection}, calls, handle_tool_errors=handle_tool_errors)
    _, out = run_one(runner, tools, "weather_refund", {"order": "A7", "amount": 500})
    body = envelope(answers(out)[-1])
    assert body["failure_class"] == "policy"
    assert body["suggested_action"] == "ask_human"
    assert body["context"]["envelope"] is True
    assert body["context"]["limit"] == 100
    assert "sk-live-abcdef1234567890" not in json.dumps(body)
    assert calls.by_server["weather"] == 1


@pytest.mark.parametrize(
    ("tool", "failure_class", "code"),
    [("weather_bad_params", "semantic", -32602), ("weather_no_method", "structural", -32601)],
)
def test_jsonrpc_errors_are_protocol_failures_by_code(
    runner: Runner, weather: HttpServer, calls: Calls, tool: str, failure_class: str, code: int
) -> None:
    """A JSON-RPC error is not the tool's failure: invalid params must change the call,
    method not found is another path; neither is retried."""
    tools = mcp_tools({"weather": weather.connection}, calls)
    _, out = run_one(runner, tools, tool, {"x": 1})
    body = envelope(answers(out)[-1])
    assert body["failure_class"] == failure_class
    assert body["context"]["jsonrpc_code"] == code
    assert calls.by_server["weather"] == 1


def test_a_slow_server_past_tool_timeout_is_retried_then_answered_never_hangs(
    runner: Runner, weather: HttpServer, calls: Calls
) -> None:
    """Every attempt outlasts tool_timeout: three attempts, a TRANSIENT timeout
    envelope, and the run ends in a bounded time (the server sleeps 30s)."""
    tools = mcp_tools({"weather": weather.connection}, calls)
    started = time.monotonic()
    _, out = run_one(
        runner,
        tools,
        "weather_slow",
        {"seconds": 30},
        policy=ResiliencePolicy(tool_timeout=0.5, max_attempts=3),
    )
    assert time.monotonic() - started < 15
    body = envelope(answers(out)[-1])
    assert body["failure_class"] == "transient"
    assert body["context"]["timeout"] is True
    assert calls.by_server["weather"] == 3


def test_a_stdio_server_killed_mid_call_is_restarted_by_the_retry(
    runner: Runner, calls: Calls, marker: pathlib.Path
) -> None:
    """The stdio server process exits under the call (connection closed: TRANSIENT);
    the retry starts a new server process and the call succeeds."""
    tools = mcp_tools({"local": stdio("local", marker)}, calls)
    _, out = run_one(runner, tools, "local_die_once", {"city": "Oslo"})
    last = answers(out)[-1]
    assert last.status != "error"
    assert "Oslo after a restart" in str(last.content)
    assert marker.exists()
    assert calls.by_server["local"] == 2
    (record,) = out["resilience"]["calls"].values()
    assert record["attempts"] == 2
    assert record["error"]["context"]["jsonrpc_code"] == -32000  # connection closed
