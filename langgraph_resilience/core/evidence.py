"""Evidence of execution: did a failed request reach the code that performs the effect?

A side effect's failure is safe to retry when the evidence says the request was not
processed, and must be reconciled, never repeated blindly, when it leaves that open
(DESIGN.md section 5). The evidence is the same whatever the transport, so it is
read off the exception's cause chain from the outside in; the first link that is
specific decides, and a chain with no specific link is `"unknown"`:

=========================================  ==========  =========================================
evidence                                   verdict     why (the convention's source)
=========================================  ==========  =========================================
HTTP 408, 425, 429, 503                    refused     the server says it did not process the
                                                       request (RFC 9110 15.5.9, RFC 8470,
                                                       RFC 6585 4, RFC 9110 15.6.4)
connection refused, DNS failure,           refused     nothing reached the service: the client
connect / pool timeout (httpx, requests,               raised before the request was written
urllib3, aiohttp, openai / anthropic via               (the SDKs chain the httpx error as the
their httpx cause)                                     ``__cause__``)
an MCP JSON-RPC error response             refused     the server rejected the request at the
                                                       protocol level; a tool that ran and
                                                       failed answers ``isError`` instead (MCP
                                                       spec, "Tools: error handling")
MCP session terminated (32600), a write    refused     the SDK refused it before sending (a
on a closed stream (anyio Closed/Broken)               closed stream takes no bytes)
read timeout, a connection dropped after   unknown     the request was written; the answer was
the write (RemoteProtocolError, reset),                lost (httpx, requests ``ReadTimeout``,
MCP connection closed (-32000) or request              the MCP SDK's codes for a transport that
timeout (408), HTTP 500/502/504                        closed under a pending request)
a bare ``TimeoutError`` or anything else   unknown     no evidence of which side it happened on
=========================================  ==========  =========================================

A *definite business failure* (4xx with a reason, an MCP ``isError`` result) is not a
question for this module: it is never TRANSIENT, the effect did not happen, and the
exactly-once flow settles its intent as failed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

__all__ = ["Execution", "execution", "link_execution"]

Execution = Literal["refused", "unknown"]
"""``refused``: the request was certainly not processed; ``unknown``: it may have been."""

_REFUSED_STATUS = frozenset({408, 425, 429, 503})
"""HTTP statuses by which a server says it did not process the request."""

_UNKNOWN_STATUS = frozenset({500, 502, 504})
"""Statuses that say the request reached a server that may have acted on it."""

_BEFORE_SEND = frozenset(
    {
        "ConnectError",  # httpx: refused, unreachable, TLS handshake
        "ConnectTimeout",  # httpx, requests
        "ConnectTimeoutError",  # urllib3
        "NewConnectionError",  # urllib3 (under requests' ConnectionError)
        "NameResolutionError",  # urllib3
        "PoolTimeout",  # httpx: no connection to send it on
        "ClientConnectorError",  # aiohttp
        "ConnectionRefusedError",
        "gaierror",  # socket: DNS
        "ClosedResourceError",  # anyio: a send on a closed stream writes nothing
        "BrokenResourceError",
    }
)
"""Exception types raised before a single byte of the request was written."""

_AFTER_SEND = frozenset(
    {
        "ReadTimeout",  # httpx, requests
        "ReadTimeoutError",  # urllib3
        "ReadError",
        "RemoteProtocolError",  # httpx: the server closed mid-answer
        "RemoteDisconnected",  # http.client
        "ServerDisconnectedError",  # aiohttp
        "ConnectionResetError",
        "IncompleteRead",
        "EndOfStream",  # anyio: the answer never came
        "AttemptAbandoned",  # ours: the attempt timed out and may still land
    }
)
"""Exception types that say the request was written and its answer lost."""

_MCP_ERROR = "McpError"
_MCP_SDK_CODES = frozenset({-32000, 408})
"""The MCP SDK's own codes for a request whose answer it lost (connection closed,
its read timeout): not the server's answer."""


def _names(error: BaseException) -> frozenset[str]:
    return frozenset(cls.__name__ for cls in type(error).__mro__)


def _status(error: BaseException) -> int | None:
    for owner in (error, getattr(error, "response", None)):
        for attr in ("status_code", "status"):
            value = getattr(owner, attr, None)
            if isinstance(value, int) and not isinstance(value, bool) and 100 <= value <= 599:
                return value
    return None


def link_execution(error: BaseException) -> Execution | None:
    """What one exception (one link of a chain) says, or None when it says nothing
    specific (a generic ``TimeoutError``, an SDK wrapper such as openai's
    ``APIConnectionError``: its cause decides)."""
    names = _names(error)
    if _MCP_ERROR in names:
        code = getattr(getattr(error, "error", None), "code", None)
        if isinstance(code, int) and not isinstance(code, bool):
            if code in _MCP_SDK_CODES:
                return "unknown"
            return "refused"  # the server's own error response, or 32600
    status = _status(error)
    if status in _REFUSED_STATUS:
        return "refused"
    if status in _UNKNOWN_STATUS:
        return "unknown"
    if names & _BEFORE_SEND:
        return "refused"
    if names & _AFTER_SEND:
        return "unknown"
    return None


def execution(chain: Iterable[BaseException]) -> Execution:
    """The first specific evidence along a cause chain (outermost first), else
    ``unknown``.

    >>> wrapper = RuntimeError("Connection error.")  # an SDK's generic wrapper
    >>> execution([wrapper, ConnectionRefusedError()])
    'refused'
    >>> execution([TimeoutError("timed out")])
    'unknown'
    """
    for link in chain:
        found = link_execution(link)
        if found is not None:
            return found
    return "unknown"
