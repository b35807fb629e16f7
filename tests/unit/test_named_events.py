"""Each way a call ends without running has its own event (issue 35): a call skipped
because its MCP server is down, a run stopped by its fence, a request an MCP server
answers from its key ledger. Read through an `events.Observer`, as OpenTelemetry's is."""

from __future__ import annotations

import asyncio
import contextlib
import types
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from langchain_core.messages import ToolCall
from langchain_core.tools import tool

from langgraph_resilience.errors import ThreadLockLostError
from langgraph_resilience.events import Outcome, observe, unobserve


class Recorder:
    """An observer that keeps every event."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []

    def event(self, kind: str, fields: Mapping[str, Any]) -> None:
        self.events.append((kind, dict(fields)))

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        yield

    @contextlib.contextmanager
    def attempt(self, tool: str, call_id: str) -> Iterator[Outcome]:
        yield lambda answer: None

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.events]


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    seen = Recorder()
    observe(seen)
    yield seen
    unobserve(seen)


def test_a_call_skipped_for_a_down_server_is_a_call_skipped_event(recorder: Recorder) -> None:
    from langgraph_resilience._graph.mcp import skipped_message  # noqa: PLC0415

    call = ToolCall(name="weather", args={}, id="c1", type="tool_call")
    skipped_message(call, "weather-server", ["weather"])
    assert recorder.events == [
        ("call_skipped", {"tool": "weather", "call_id": "c1", "server": "weather-server"})
    ]


class LostFence:
    """A held lease whose check finds it taken over."""

    thread_id, token, db = "t1", 7, "test"

    def check(self) -> None:
        raise ThreadLockLostError("t1", "taken over by a newer token")

    async def acheck(self) -> None:
        self.check()

    def fresh(self) -> bool:
        return False


def test_a_run_stopped_by_its_fence_is_a_fenced_event(recorder: Recorder) -> None:
    from langgraph_resilience.stores.held import (  # noqa: PLC0415
        acheck_fence,
        check_fence,
        holding,
    )

    with holding(LostFence()):
        with pytest.raises(ThreadLockLostError):
            check_fence("t1")
        with pytest.raises(ThreadLockLostError):
            asyncio.run(acheck_fence("t1"))
    assert recorder.events == [("fenced", {"thread_id": "t1", "fence": 7})] * 2


def test_a_repeat_an_mcp_server_answers_from_its_ledger_is_deduplicated(
    recorder: Recorder,
) -> None:
    pytest.importorskip("langchain_mcp_adapters", reason="the mcp extra is not installed")
    from langgraph_resilience._graph.mcp import IDEMPOTENCY_META, mcp_server_tool  # noqa: PLC0415

    runs: list[int] = []

    @tool
    def refund(order: int) -> str:
        """Refund an order."""
        runs.append(order)
        return f"refunded {order}"

    served = mcp_server_tool(refund)
    meta = types.SimpleNamespace(model_extra={IDEMPOTENCY_META: "k1"})
    context = types.SimpleNamespace(request_context=types.SimpleNamespace(meta=meta))
    first = asyncio.run(served.fn(lgr_context=context, order=7))
    again = asyncio.run(served.fn(lgr_context=context, order=7))
    assert first == again
    assert runs == [7]
    assert ("effect_deduplicated", {"tool": "refund", "key": "k1"}) in recorder.events
