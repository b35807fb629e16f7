"""The fault kinds: every way a tool call goes wrong, as data (`FAULT_KINDS`).

A status code is one line here; the behaviours are those of `testing.Fault`
(raise before executing, raise after the effect committed, replace the output)
plus four that need the real call (`ChaosTool` applies them): truncated output,
semantically wrong output (every number negated), schema drift (a required
argument is renamed and the old name is rejected from then on) and partial
success (only part of a batch is executed).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import Any

from langgraph_resilience.errors import FailureClass
from langgraph_resilience.testing import Fault

__all__ = ["FAULT_KINDS", "TIMEOUTS", "ConnectTimeout", "FaultKind"]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FaultKind:
    """One way a tool call goes wrong; `make` builds a fresh `testing.Fault` per firing
    (a fresh exception each time: frameworks attach notes to the exceptions they see)."""

    name: str
    failure_class: FailureClass
    """How the package's taxonomy is expected to classify it (for grouping results)."""
    make: Callable[[str], Fault]
    """Builds the fault for the tool of this name."""
    description: str
    permanent: bool = False
    """Once fired, the tool stays this way (removal, schema drift)."""

    @property
    def raises(self) -> bool:
        """True when the caller sees an exception (not a wrong or partial result)."""
        return self.name not in _DEGRADED


_DEGRADED = frozenset({"malformed_output", "wrong_output", "partial_success"})


class ConnectTimeout(TimeoutError):
    """Stands in for ``httpx.ConnectTimeout`` where httpx is not installed (same name,
    so classifiers that go by the exception's type name treat it the same)."""


def _connect_timeout(tool: str) -> Exception:
    """The error an HTTP client raises when it could not even connect: httpx's own."""
    try:
        import httpx  # noqa: PLC0415 - optional: only the benchmark's extras install it
    except ImportError:  # pragma: no cover - httpx comes with langchain-core's langsmith
        return ConnectTimeout(f"timed out while connecting to {tool}")
    request = httpx.Request("POST", f"https://chaos.test/{tool}")
    return httpx.ConnectTimeout("timed out while connecting", request=request)


def _status(code: int, **kwargs: Any) -> Callable[[str], Fault]:
    return lambda _tool: Fault.status(code, **kwargs)


def _kind(
    name: str,
    failure_class: FailureClass,
    make: Callable[[str], Fault],
    description: str,
    *,
    permanent: bool = False,
) -> tuple[str, FaultKind]:
    return name, FaultKind(
        name=name,
        failure_class=failure_class,
        make=make,
        description=description,
        permanent=permanent,
    )


_T, _S, _ST, _P, _U, _PA = (
    FailureClass.TRANSIENT,
    FailureClass.SEMANTIC,
    FailureClass.STRUCTURAL,
    FailureClass.POLICY,
    FailureClass.UNKNOWN,
    FailureClass.PARTIAL,
)

FAULT_KINDS: Mapping[str, FaultKind] = dict(
    [
        _kind("http_429", _T, _status(429), "429 Too Many Requests, no Retry-After"),
        _kind(
            "http_429_retry_after",
            _T,
            _status(429, retry_after="2"),
            "429 with Retry-After: 2",
        ),
        _kind("http_500", _T, _status(500), "500 Internal Server Error, before executing"),
        _kind("http_502", _T, _status(502), "502 Bad Gateway, before executing"),
        _kind("http_503", _T, _status(503), "503 Service Unavailable, before executing"),
        _kind("http_504", _T, _status(504), "504 Gateway Timeout, before executing"),
        _kind("http_400", _S, _status(400, body="bad request"), "400 on a valid call"),
        _kind("http_401", _P, _status(401), "401 Unauthorized"),
        _kind("http_403", _P, _status(403), "403 Forbidden"),
        _kind("http_404", _ST, _status(404), "404 Not Found (once)"),
        _kind("timeout", _T, lambda _t: Fault.timeout(), "timeout before executing"),
        _kind(
            "connect_timeout",
            _T,
            lambda tool: Fault.raises(_connect_timeout(tool)),
            "httpx.ConnectTimeout: the request never left the client (safe to retry, even a "
            "side effect)",
        ),
        _kind(
            "timeout_after_commit",
            _U,
            lambda _t: Fault.timeout(after_effect=True),
            "timeout after the effect committed (lost response)",
        ),
        _kind(
            "connection_reset",
            _T,
            lambda _t: Fault.raises(ConnectionResetError(104, "Connection reset by peer")),
            "connection reset before the request was processed",
        ),
        _kind(
            "malformed_output",
            _S,
            lambda _t: Fault("truncate", after_effect=True),
            "executes, then returns the first half of its JSON output",
        ),
        _kind(
            "wrong_output",
            _S,
            lambda _t: Fault("wrong", after_effect=True),
            "executes, then returns its output with every number v replaced by -(|v|+1)",
        ),
        _kind(
            "schema_drift",
            _S,
            lambda _t: Fault("drift"),
            "a required argument is renamed (<arg>_v2); the old name is rejected from then on",
            permanent=True,
        ),
        _kind(
            "tool_removed",
            _ST,
            lambda tool: Fault.status(404, body=json.dumps({"error": f"unknown tool {tool!r}"})),
            "404 'unknown tool' on this and every later call",
            permanent=True,
        ),
        _kind(
            "partial_success",
            _PA,
            lambda _t: Fault("partial", after_effect=True),
            "a batch call executes only its first half and reports the rest as failed",
        ),
    ]
)
"""Every fault kind `FaultSpec` accepts, by name. Add a kind by adding an entry."""


TIMEOUTS = frozenset({"timeout", "timeout_after_commit", "connect_timeout"})
"""Kinds that charge the timeout to the clock."""
