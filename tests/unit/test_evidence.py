"""Evidence of execution, per transport: each failure is raised by the real client, and
a side effect is retried only when the evidence says the request was not processed."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Callable, Iterator

import anthropic
import anyio
import httpx
import openai
import pytest
import requests
from mcp.shared.exceptions import McpError
from mcp.types import ErrorData

from langgraph_resilience import FailureClass, ToolProfile
from langgraph_resilience.core import classify

T = FailureClass.TRANSIENT
U = FailureClass.UNKNOWN
SIDE_EFFECT = ToolProfile(side_effect=True)
BY_KEY = ToolProfile(side_effect=True, safe_repeat="by_key")


@pytest.fixture(scope="module")
def closed_port() -> int:
    """A loopback port nothing listens on: a connect is refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def _silent_server() -> Iterator[int]:
    """A loopback server that reads the request and never answers (a read timeout)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    accepted: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = server.accept()
                accepted.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield int(server.getsockname()[1])
    finally:
        server.close()
        for conn in accepted:
            conn.close()


@pytest.fixture(scope="module")
def silent_port() -> Iterator[int]:
    with _silent_server() as port:
        yield port


def _raised(call: Callable[[], object]) -> BaseException:
    try:
        call()
    except BaseException as exc:
        return exc
    raise AssertionError("the client did not raise")


def _status_error(status: int) -> httpx.HTTPStatusError:
    request = httpx.Request("POST", "https://pay.example/v1/charges")
    response = httpx.Response(status, request=request)
    return httpx.HTTPStatusError(f"{status}", request=request, response=response)


# ------------------------------------------------------------------------------ httpx


@pytest.mark.parametrize("status", [408, 425, 429, 503])
def test_httpx_refusing_status_is_retried_for_a_side_effect(status: int) -> None:
    """A status by which the server says it did not process the request is TRANSIENT."""
    envelope = classify(_status_error(status), profile=SIDE_EFFECT)
    assert envelope.failure_class is T
    assert envelope.retriable is True


@pytest.mark.parametrize("status", [500, 502, 504])
def test_httpx_status_from_a_server_that_may_have_acted_is_unknown(status: int) -> None:
    """A 5xx that may come after the work started leaves the effect unknown."""
    envelope = classify(_status_error(status), profile=SIDE_EFFECT)
    assert envelope.failure_class is U
    assert envelope.context["maybe_executed"] is True


def test_httpx_connect_error_and_read_timeout(closed_port: int, silent_port: int) -> None:
    """Refused before sending: TRANSIENT; sent and the answer lost: UNKNOWN."""
    refused = _raised(lambda: httpx.post(f"http://127.0.0.1:{closed_port}/pay"))
    lost = _raised(lambda: httpx.post(f"http://127.0.0.1:{silent_port}/pay", timeout=0.2))
    assert isinstance(lost, httpx.ReadTimeout)
    assert classify(refused, profile=SIDE_EFFECT).failure_class is T
    assert classify(lost, profile=SIDE_EFFECT).failure_class is U


# --------------------------------------------------------------------------- requests


def test_requests_refused_connection_is_retried(closed_port: int) -> None:
    """requests wraps the refusal in its own ConnectionError; the urllib3 cause decides."""
    error = _raised(lambda: requests.post(f"http://127.0.0.1:{closed_port}/pay", timeout=2))
    assert isinstance(error, requests.ConnectionError)
    envelope = classify(error, profile=SIDE_EFFECT)
    assert envelope.failure_class is T
    assert envelope.retriable is True


def test_requests_read_timeout_is_unknown(silent_port: int) -> None:
    """A read timeout after the request went out may hide a done effect."""
    error = _raised(lambda: requests.post(f"http://127.0.0.1:{silent_port}/pay", timeout=0.2))
    assert isinstance(error, requests.ReadTimeout)
    assert classify(error, profile=SIDE_EFFECT).failure_class is U


# ---------------------------------------------------------------- openai, anthropic


def test_openai_sdk_errors_follow_their_httpx_cause(closed_port: int, silent_port: int) -> None:
    """The SDK's APIConnectionError / APITimeoutError are read through their cause."""

    def ask(port: int, timeout: float) -> object:
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0, timeout=timeout
        )
        return client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "x"}]
        )

    refused = _raised(lambda: ask(closed_port, 2.0))
    lost = _raised(lambda: ask(silent_port, 0.2))
    assert isinstance(refused, openai.APIConnectionError)
    assert isinstance(lost, openai.APITimeoutError)
    assert classify(refused, profile=SIDE_EFFECT).failure_class is T
    assert classify(lost, profile=SIDE_EFFECT).failure_class is U


def test_openai_connect_timeout_is_retried_though_the_sdk_calls_it_a_timeout() -> None:
    """APITimeoutError raised from a connect timeout: the request never left."""
    request = httpx.Request("POST", "https://api.openai.example/v1/chat/completions")
    try:
        try:
            raise httpx.ConnectTimeout("connect timed out", request=request)
        except httpx.ConnectTimeout as cause:
            raise openai.APITimeoutError(request=request) from cause
    except openai.APITimeoutError as error:
        envelope = classify(error, profile=SIDE_EFFECT)
    assert envelope.failure_class is T


def test_anthropic_sdk_errors_follow_their_httpx_cause(closed_port: int, silent_port: int) -> None:
    """Anthropic's client wraps httpx the same way."""

    def ask(port: int, timeout: float) -> object:
        client = anthropic.Anthropic(
            base_url=f"http://127.0.0.1:{port}", api_key="k", max_retries=0, timeout=timeout
        )
        return client.messages.create(
            model="m", max_tokens=1, messages=[{"role": "user", "content": "x"}]
        )

    refused = _raised(lambda: ask(closed_port, 2.0))
    lost = _raised(lambda: ask(silent_port, 0.2))
    assert isinstance(refused, anthropic.APIConnectionError)
    assert isinstance(lost, anthropic.APITimeoutError)
    assert classify(refused, profile=SIDE_EFFECT).failure_class is T
    assert classify(lost, profile=SIDE_EFFECT).failure_class is U


# -------------------------------------------------------------------------------- MCP


def test_mcp_error_response_is_a_refusal() -> None:
    """A JSON-RPC error the server answered (here -32603 "503 service unavailable")
    rejects the request: a tool that ran and failed would answer isError instead."""
    error = McpError(ErrorData(code=-32603, message="503 service unavailable"))
    envelope = classify(error, profile=SIDE_EFFECT)
    assert envelope.failure_class is T
    assert envelope.retriable is True


@pytest.mark.parametrize(
    ("code", "message"),
    [(-32000, "Connection closed"), (408, "Timed out while waiting for response")],
)
def test_mcp_sdk_codes_for_a_lost_answer_are_unknown(code: int, message: str) -> None:
    """The SDK's own codes for a request whose transport closed or timed out after the
    request was written: the effect may have happened."""
    envelope = classify(McpError(ErrorData(code=code, message=message)), profile=SIDE_EFFECT)
    assert envelope.failure_class is U


def test_mcp_send_on_a_closed_session_is_a_refusal() -> None:
    """A write on a closed stream (anyio) takes no bytes: nothing reached the server."""

    async def send_on_closed() -> BaseException:
        send, receive = anyio.create_memory_object_stream[str](1)
        await send.aclose()
        try:
            await send.send("tools/call")
        except anyio.ClosedResourceError as exc:
            return exc
        finally:
            await receive.aclose()
        raise AssertionError("no error")

    error = asyncio.run(send_on_closed())
    assert classify(error, profile=SIDE_EFFECT).failure_class is T


def test_mcp_end_of_stream_is_unknown() -> None:
    """The answer's stream ended after the request went out."""

    async def receive_from_closed() -> BaseException:
        send, receive = anyio.create_memory_object_stream[str](1)
        await send.aclose()
        try:
            await receive.receive()
        except anyio.EndOfStream as exc:
            return exc
        finally:
            await receive.aclose()
        raise AssertionError("no error")

    error = asyncio.run(receive_from_closed())
    assert classify(error, profile=SIDE_EFFECT).failure_class is U


# --------------------------------------------------------------------- no evidence


def test_bare_timeout_is_unknown_for_a_side_effect() -> None:
    """A bare TimeoutError says nothing of which side it happened on: conservative."""
    envelope = classify(TimeoutError("timed out"), profile=SIDE_EFFECT)
    assert envelope.failure_class is U
    assert envelope.suggested_action == "query_status"


def test_safe_repeat_keeps_a_lost_answer_retriable() -> None:
    """A service that deduplicates by key makes a repeat safe: TRANSIENT, but the
    envelope still says the effect may have happened."""
    request = httpx.Request("POST", "https://pay.example/v1/charges")
    envelope = classify(httpx.ReadTimeout("lost", request=request), profile=BY_KEY)
    assert envelope.failure_class is T
    assert envelope.retriable is True
    assert envelope.context["maybe_executed"] is True


def test_reads_are_unchanged_by_the_evidence() -> None:
    """Evidence only matters to side effects: a read timeout on a read is TRANSIENT."""
    request = httpx.Request("GET", "https://pay.example/v1/charges")
    envelope = classify(httpx.ReadTimeout("lost", request=request), profile=ToolProfile())
    assert envelope.failure_class is T
