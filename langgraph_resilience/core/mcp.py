"""MCP's failure surface, as classification rules (pure: the `mcp` SDK is never imported).

MCP separates a tool that ran and failed (a result with ``isError: true``) from a
protocol error (a JSON-RPC error) and from a session that is gone (the server process
exited, the connection closed). A client that flattens them loses the routing key, so
each gets its own rule, recognized by duck typing as the rest of the table is:

- a JSON-RPC error (``McpError`` with ``.error.code``) by its code: invalid params is
  SEMANTIC (the call must change), method not found STRUCTURAL (the server has no such
  thing), connection closed and the client's request timeout TRANSIENT;
- a closed or broken session stream (anyio's ``ClosedResourceError`` and kin) is
  TRANSIENT: a new session may succeed (the breaker declares the server down when it
  does not, and `CircuitOpenError` is STRUCTURAL);
- an ``isError`` result is the tool's own failure: SEMANTIC by default, or whatever
  the envelope it carries says when it is ours or the same shape.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from collections.abc import Mapping
from typing import Any

from langgraph_resilience.core.policy import seconds
from langgraph_resilience.core.profile import ToolProfile
from langgraph_resilience.core.verdict import Rule, Verdict
from langgraph_resilience.errors import ConfigurationError, FailureClass, McpToolError

__all__ = [
    "CONNECTION_CLOSED",
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "METHOD_NOT_FOUND",
    "PARSE_ERROR",
    "MCP_RULES",
    "Reconnect",
    "jsonrpc_code",
    "mcp_error_rule",
    "mcp_result_rule",
    "mcp_session_rule",
    "reconnect_wait",
    "remote_envelope",
]

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
CONNECTION_CLOSED = -32000
"""The SDK's code for a session whose transport closed under a pending request."""
REQUEST_TIMEOUT = 408
"""The SDK's code (an HTTP status) for its own read timeout."""
SESSION_TERMINATED = 32600
"""The SDK's code (positive) for a session the server no longer knows (it restarted):
the request was refused, not run, and a new session will do."""
URL_ELICITATION_REQUIRED = -32042
"""The server needs the user to act (open a URL) before the tool can run."""

_DEFAULT_ACTION = {
    FailureClass.TRANSIENT: "retry",
    FailureClass.SEMANTIC: "fix_args",
    FailureClass.STRUCTURAL: "ask_human",
    FailureClass.POLICY: "ask_human",
    FailureClass.PARTIAL: "retry",
    FailureClass.UNKNOWN: "query_status",
}

_BY_CODE: dict[int, tuple[FailureClass, dict[str, Any]]] = {
    INVALID_PARAMS: (FailureClass.SEMANTIC, {}),
    METHOD_NOT_FOUND: (FailureClass.STRUCTURAL, {}),
    INVALID_REQUEST: (FailureClass.STRUCTURAL, {}),
    PARSE_ERROR: (FailureClass.STRUCTURAL, {}),
    INTERNAL_ERROR: (FailureClass.TRANSIENT, {}),
    CONNECTION_CLOSED: (FailureClass.TRANSIENT, {"connection": "lost"}),
    REQUEST_TIMEOUT: (FailureClass.TRANSIENT, {"timeout": True}),
    URL_ELICITATION_REQUIRED: (FailureClass.POLICY, {}),
    SESSION_TERMINATED: (FailureClass.TRANSIENT, {"session": "terminated", "sent": False}),
}
"""JSON-RPC codes: a malformed request or an unknown method will not get better with
the same client (STRUCTURAL); an internal error or a lost connection may (TRANSIENT)."""

_SESSION_GONE = ("ClosedResourceError", "BrokenResourceError", "EndOfStream")


def jsonrpc_code(error: BaseException) -> int | None:
    """The JSON-RPC error code an ``McpError`` carries, or None for anything else."""
    if not any(cls.__name__ == "McpError" for cls in type(error).__mro__):
        return None
    code = getattr(getattr(error, "error", None), "code", None)
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def _verdict(
    failure_class: FailureClass,
    context: Mapping[str, Any],
    *,
    action: str | None = None,
    retriable: bool = True,
    retry_after_ms: int | None = None,
) -> Verdict:
    return Verdict(
        failure_class,
        action or _DEFAULT_ACTION[failure_class],
        retriable=failure_class is FailureClass.TRANSIENT and retriable,
        retry_after_ms=retry_after_ms,
        context=dict(context),
    )


def mcp_error_rule(error: BaseException, profile: ToolProfile | None) -> Verdict | None:
    """A JSON-RPC error, classified by its code; an unknown code passes (UNKNOWN)."""
    code = jsonrpc_code(error)
    if code is None or code not in _BY_CODE:
        return None
    failure_class, context = _BY_CODE[code]
    return _verdict(failure_class, {"mcp": "jsonrpc_error", "jsonrpc_code": code, **context})


def mcp_session_rule(error: BaseException, profile: ToolProfile | None) -> Verdict | None:
    """A closed or broken session stream: the server or its connection is gone."""
    if any(cls.__name__ in _SESSION_GONE for cls in type(error).__mro__):
        return _verdict(FailureClass.TRANSIENT, {"mcp": "session_closed", "connection": "lost"})
    return None


def remote_envelope(text: str) -> dict[str, Any] | None:
    """The envelope an ``isError`` result carries in its text, when it is ours or the
    same shape (a JSON object with a valid ``failure_class``, possibly under
    ``"error"``); None for free text."""
    start = text.find("{")
    if start < 0:
        return None
    try:
        value, _ = json.JSONDecoder().raw_decode(text[start:])
    except ValueError:
        return None
    if isinstance(value, dict) and isinstance(value.get("error"), dict):
        value = value["error"]
    if not isinstance(value, dict):
        return None
    try:
        FailureClass(str(value.get("failure_class")))
    except ValueError:
        return None
    return value


def _tool_text(error: BaseException) -> str | None:
    """The text of an ``isError`` result: ours, or the adapters' exception (which keeps
    the result's content blocks in ``.tool_content``)."""
    if isinstance(error, McpToolError):
        return error.content
    blocks = getattr(error, "tool_content", None)
    if not isinstance(blocks, list):
        return None
    parts = [b.get("text") for b in blocks if isinstance(b, dict) and b.get("type") == "text"]
    return "\n".join(p for p in parts if isinstance(p, str))


def mcp_result_rule(error: BaseException, profile: ToolProfile | None) -> Verdict | None:
    """An ``isError`` result: the envelope it carries is honoured, else SEMANTIC."""
    text = _tool_text(error)
    if text is None:
        return None
    envelope = remote_envelope(text)
    if envelope is None:
        return _verdict(FailureClass.SEMANTIC, {"mcp": "is_error"})
    failure_class = FailureClass(envelope["failure_class"])
    after = envelope.get("retry_after_ms")
    remote = envelope.get("context")
    context = {"mcp": "is_error", "envelope": True, **(remote if isinstance(remote, dict) else {})}
    action = envelope.get("suggested_action")
    return _verdict(
        failure_class,
        context,
        action=action if isinstance(action, str) and action else None,
        retriable=envelope.get("retriable", True) is not False,
        retry_after_ms=after if isinstance(after, int) and after >= 0 else None,
    )


MCP_RULES: tuple[Rule, ...] = (mcp_result_rule, mcp_error_rule, mcp_session_rule)
"""The MCP rules, in the order `DEFAULT_RULES` holds them (before the generic ones)."""


# ------------------------------------------------------------------ reconnecting


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Reconnect:
    """How a dropped MCP session is reconnected: only when a call needs it, never more
    often than a doubling backoff allows (no background loop probes a dead server).

    >>> Reconnect(base_delay=1, max_delay=8).delay(4)
    8.0
    """

    base_delay: float | dt.timedelta = 0.5
    """The wait after the first failed (re)connection."""

    max_delay: float | dt.timedelta = 30.0
    """The longest wait between two reconnection attempts."""

    def __post_init__(self) -> None:
        base = seconds(self.base_delay, field="base_delay")
        top = seconds(self.max_delay, field="max_delay")
        if not (0 < float(base) <= float(top)):
            raise ConfigurationError(
                "Reconnect needs 0 < base_delay <= max_delay (seconds), "
                f"got base_delay={base!r}, max_delay={top!r}"
            )
        object.__setattr__(self, "base_delay", float(base))
        object.__setattr__(self, "max_delay", float(top))

    def delay(self, failures: int) -> float:
        """Seconds to wait after `failures` consecutive failed connections (0: none)."""
        if failures <= 0:
            return 0.0
        base, top = float(self.base_delay), float(self.max_delay)  # type: ignore[arg-type]
        return min(top, base * 2.0 ** min(failures - 1, 60))


def reconnect_wait(
    reconnect: Reconnect, *, failures: int, failed_at: float | None, now: float
) -> float:
    """Seconds until a dropped session may be reconnected (0: now), on the monotonic
    clock: a call arriving sooner is refused at once with this wait as Retry-After."""
    if failed_at is None or failures <= 0:
        return 0.0
    return max(0.0, failed_at + reconnect.delay(failures) - now)
