"""MCP failures through the one rule table: JSON-RPC codes, closed sessions, isError results."""

from __future__ import annotations

import json

import anyio
import httpx
import pytest
from mcp.shared.exceptions import McpError
from mcp.types import ErrorData

from langgraph_resilience import FailureClass, ToolError, ToolProfile, classify
from langgraph_resilience.core.mcp import remote_envelope
from langgraph_resilience.errors import McpServerDownError, McpToolError


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
