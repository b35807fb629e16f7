"""MCP failures through the one rule table: JSON-RPC codes, closed sessions, isError results."""

from __future__ import annotations

import json

import anyio
import httpx
import pytest
from mcp.shared.exceptions import McpError
from mcp.types import ErrorData

from langgraph_resilience import FailureClass, ToolError, ToolProfile
from langgraph_resilience.core import classify
from langgraph_resilience.core.mcp import Reconnect, reconnect_wait, remote_envelope
from langgraph_resilience.errors import ConfigurationError, McpServerDownError, McpToolError


@pytest.mark.parametrize(
    ("code", "expected", "retriable"),
    [
        (-32602, FailureClass.SEMANTIC, False),
        (-32601, FailureClass.STRUCTURAL, False),
        (-32600, FailureClass.STRUCTURAL, False),
        (-32700, FailureClass.STRUCTURAL, False),
        (-32603, FailureClass.TRANSIENT, True),
        (-32000, FailureClass.TRANSIENT, True),
        (408, FailureClass.TRANSIENT, True),
        (-32042, FailureClass.POLICY, False),
    ],
)
def test_jsonrpc_errors_are_classified_by_code(
    code: int, expected: FailureClass, retriable: bool
) -> None:
    """Each JSON-RPC code the SDK raises maps to its recovery path, with the code kept."""
    error = classify(McpError(ErrorData(code=code, message="m")), tool="t")
    assert (error.failure_class, error.retriable) == (expected, retriable)
    assert error.context["jsonrpc_code"] == code


def test_an_unknown_jsonrpc_code_is_never_retried() -> None:
    """A code we do not know is UNKNOWN, not TRANSIENT."""
    error = classify(McpError(ErrorData(code=-31999, message="odd")))
    assert error.failure_class is FailureClass.UNKNOWN
    assert not error.retriable


def test_a_lost_connection_on_a_side_effect_is_unknown() -> None:
    """Connection closed under a pending call: the effect may have happened."""
    closed = McpError(ErrorData(code=-32000, message="Connection closed"))
    error = classify(closed, profile=ToolProfile(side_effect=True))
    assert error.failure_class is FailureClass.UNKNOWN


def test_a_closed_session_stream_is_transient() -> None:
    """The adapters raise anyio's ClosedResourceError once a persistent session died."""
    error = classify(anyio.ClosedResourceError())
    assert error.failure_class is FailureClass.TRANSIENT
    assert error.context["mcp"] == "session_closed"


def test_an_exception_group_is_classified_by_its_leaf() -> None:
    """The HTTP client wraps a refused connection in a task group's ExceptionGroup."""
    group = ExceptionGroup("unhandled errors in a TaskGroup", [httpx.ConnectError("refused")])
    error = classify(group)
    assert error.failure_class is FailureClass.TRANSIENT
    assert error.context["connection"] == "refused"


def test_an_is_error_result_without_envelope_is_the_tools_semantic_failure() -> None:
    """Free text in an isError result: the tool ran and refused the call as made."""
    error = classify(McpToolError("Error executing tool fail: no such order"))
    assert error.failure_class is FailureClass.SEMANTIC
    assert error.context == {"mcp": "is_error"}


def test_an_is_error_result_with_our_envelope_is_honoured() -> None:
    """Our envelope in an isError result keeps its class, action and Retry-After."""
    sent = ToolError(
        type="HTTPError",
        failure_class="transient",
        message="upstream 503",
        suggested_action="retry",
        retriable=True,
        retry_after_ms=1500,
        context={"status_code": 503},
    )
    error = classify(McpToolError(sent.model_dump_json()))
    assert error.failure_class is FailureClass.TRANSIENT
    assert error.retriable
    assert error.retry_after_ms == 1500
    assert error.context["status_code"] == 503
    assert error.context["envelope"] is True


def test_a_compatible_envelope_under_error_is_honoured() -> None:
    """A server's own shape with a failure_class (here under "error") is read too."""
    text = "refused: " + json.dumps({"error": {"failure_class": "policy", "message": "limit"}})
    error = classify(McpToolError(text))
    assert (error.failure_class, error.suggested_action) == (FailureClass.POLICY, "ask_human")


def test_an_envelope_with_a_bogus_class_is_free_text() -> None:
    """JSON that is not an envelope does not steer routing."""
    assert remote_envelope('{"failure_class": "fine"}') is None
    assert remote_envelope("not json {") is None


def test_secrets_in_a_remote_envelope_are_redacted() -> None:
    """A server's envelope is redacted like any other evidence."""
    text = json.dumps(
        {"failure_class": "semantic", "context": {"authorization": "Bearer sk-abcdef123456"}}
    )
    error = classify(McpToolError(text))
    assert "sk-abcdef123456" not in error.model_dump_json()


def test_a_server_down_error_is_structural_and_names_its_tools() -> None:
    """An MCP server's open breaker: another path, and which tools are out."""
    down = McpServerDownError("weather", "mcp:weather", 12.0, ["forecast", "alerts"])
    error = classify(down, profile=ToolProfile(fallback="forecast_b"))
    assert error.failure_class is FailureClass.STRUCTURAL
    assert error.suggested_action == "use_tool:forecast_b"
    assert "forecast, alerts" in error.message


def test_reconnect_backoff_doubles_up_to_its_cap() -> None:
    """No failure: no wait; then base, 2x base, ... capped at max_delay."""
    reconnect = Reconnect(base_delay=0.5, max_delay=3)
    assert [reconnect.delay(n) for n in range(6)] == [0.0, 0.5, 1.0, 2.0, 3.0, 3.0]
    assert reconnect.delay(10_000) == 3.0


def test_reconnect_wait_counts_from_the_last_failure() -> None:
    """A call 0.2s after the second failure waits the rest of the 1s backoff."""
    reconnect = Reconnect(base_delay=0.5, max_delay=30)
    assert reconnect_wait(reconnect, failures=2, failed_at=10.0, now=10.2) == pytest.approx(0.8)
    assert reconnect_wait(reconnect, failures=2, failed_at=10.0, now=12.0) == 0.0
    assert reconnect_wait(reconnect, failures=0, failed_at=None, now=12.0) == 0.0


@pytest.mark.parametrize(("base", "top"), [(0, 1), (2, 1), (-1, 5)])
def test_reconnect_rejects_an_impossible_backoff(base: float, top: float) -> None:
    """A zero or negative base, or a cap below it, is a ConfigurationError saying so."""
    with pytest.raises(ConfigurationError, match="base_delay <= max_delay"):
        Reconnect(base_delay=base, max_delay=top)


def test_a_terminated_session_is_transient_and_was_not_sent() -> None:
    """The SDK's 32600: the restarted server does not know the session; a side effect is
    safe to retry since the request was refused."""
    terminated = McpError(ErrorData(code=32600, message="Session terminated"))
    error = classify(terminated, profile=ToolProfile(side_effect=True))
    assert error.failure_class is FailureClass.TRANSIENT
    assert error.context["sent"] is False
