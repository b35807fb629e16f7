"""A thread remembers a tool that answered STRUCTURAL: it stops calling it for a while."""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_core.messages import ToolMessage
from langchain_core.tools import tool

from langgraph_resilience import ConfigurationError, FailureClass, ResiliencePolicy, ToolProfile
from langgraph_resilience.core.breaker import BreakerConfig
from langgraph_resilience.events import EVENT_KEY
from langgraph_resilience.stores.breakers import InMemoryBreakerStore
from langgraph_resilience.testing import FakeClock, Fault, FaultyTool, text, tool_calls
from tests.conftest import Runner, build_graph


@tool
def geocode(city: str) -> str:
    """Coordinates of a city (v1)."""
    return f"v1 {city}"


@tool
def geocode_v2(city: str) -> str:
    """Coordinates of a city (v2)."""
    return f"v2 {city}"


def tool_messages(state: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in state["messages"] if isinstance(m, ToolMessage)]


def three_cities() -> list[Any]:
    """Three turns, each a new call (new id, new arguments) to geocode."""
    return [
        tool_calls(("geocode", {"city": "Oslo"})),
        tool_calls(("geocode", {"city": "Lima"})),
        tool_calls(("geocode", {"city": "Pune"})),
        text("done"),
    ]


def test_later_calls_to_a_gone_tool_go_straight_to_its_fallback(runner: Runner) -> None:
    """404 once: v2 serves that call and every later one; v1 is not called again."""
    v1 = FaultyTool(geocode, then=Fault.status(404))
    v2 = FaultyTool(geocode_v2)
    h = build_graph(
        [v1, v2], three_cities(), profiles={"geocode": ToolProfile(fallback="geocode_v2")}
    )

    chunks = runner.stream(
        h.app, {"messages": [("user", "x")]}, h.config(), stream_mode=["custom", "values"]
    )

    assert (v1.calls, v2.executions) == (1, 3)
    final = next(c for mode, c in reversed(chunks) if mode == "values")
    messages = tool_messages(final)
    assert [m.content for m in messages] == ["v2 Oslo", "v2 Lima", "v2 Pune"]
    assert all(m.response_metadata["resilience"]["served_by"] == "geocode_v2" for m in messages)
    fallbacks = [c for mode, c in chunks if mode == "custom" and c[EVENT_KEY] == "fallback"]
    assert [f.get("remembered", False) for f in fallbacks] == [False, True, True]
    assert final["resilience"]["gone"].keys() == {"geocode"}
    assert final["resilience"]["tool_attempts"] == 4  # one failure, three served


def test_without_a_fallback_the_gone_tool_is_answered_without_running(runner: Runner) -> None:
    """No fallback: later calls get a STRUCTURAL ToolGoneError envelope, no execution."""
    v1 = FaultyTool(geocode, then=Fault.status(410))
    h = build_graph([v1], three_cities())

    out = runner.invoke(h.app, {"messages": [("user", "x")]}, h.config())

    assert v1.calls == 1
    envelopes = [json.loads(str(m.content)) for m in tool_messages(out)]
    assert [e["failure_class"] for e in envelopes] == ["structural"] * 3
    assert [e["type"] for e in envelopes[1:]] == ["ToolGoneError"] * 2
    assert envelopes[1]["tool"] == "geocode"
    assert envelopes[1]["context"] == {"remembered": True}
    assert out["resilience"]["tool_attempts"] == 1


def test_the_memory_lapses_and_the_tool_is_tried_again(runner: Runner) -> None:
    """After structural_memory seconds, the endpoint may be back: the tool runs again."""
    v1 = FaultyTool(geocode, [Fault.status(404)])
    clock = FakeClock()
    turns = [[tool_calls(("geocode", {"city": c})), text("ok")] for c in ("Oslo", "Lima", "Pune")]
    h = build_graph(
        [v1],
        [m for t in turns for m in t],
        clock=clock,
        policy=ResiliencePolicy(structural_memory=60),
    )
    config = h.config()

    runner.invoke(h.app, {"messages": [("user", "a")]}, config)
    runner.invoke(h.app, {"messages": [("user", "b")]}, config)
    assert v1.calls == 1
    clock.advance(61)
    out = runner.invoke(h.app, {"messages": [("user", "c")]}, config)

    assert v1.calls == 2
    assert tool_messages(out)[-1].content == "v1 Pune"


def test_the_memory_belongs_to_the_thread(runner: Runner) -> None:
    """Another thread has not seen the 404: it calls the tool (a breaker is what shares)."""
    v1 = FaultyTool(geocode, [Fault.status(404)])
    turn = [tool_calls(("geocode", {"city": "Oslo"})), text("ok")]
    h = build_graph([v1], turn * 2)

    runner.invoke(h.app, {"messages": [("user", "a")]}, h.config())
    out = runner.invoke(h.app, {"messages": [("user", "b")]}, h.config())

    assert v1.calls == 2
    assert tool_messages(out)[-1].content == "v1 Oslo"


@pytest.mark.parametrize("fault", [Fault.status(503), Fault.status(403), Fault.status(400)])
def test_only_structural_answers_are_remembered(runner: Runner, fault: Fault) -> None:
    """Transient, policy and semantic failures leave the tool callable."""
    v1 = FaultyTool(geocode, [fault])
    h = build_graph([v1], three_cities())

    out = runner.invoke(h.app, {"messages": [("user", "x")]}, h.config())

    assert not out["resilience"].get("gone")
    assert tool_messages(out)[-1].content == "v1 Pune"


def test_an_open_breaker_is_not_remembered_as_gone(runner: Runner) -> None:
    """A refusal by our own breaker says nothing about the endpoint."""
    store = InMemoryBreakerStore()
    clock = FakeClock()
    trippy = BreakerConfig(minimum_calls=1, window_size=2, failure_rate_threshold=0.5)
    store.record("geocode", trippy, clock.time(), FailureClass.TRANSIENT, probe=False, duration=0)
    v1 = FaultyTool(geocode)
    h = build_graph(
        [v1],
        [tool_calls(("geocode", {"city": "Oslo"})), text("ok")],
        clock=clock,
        policy=ResiliencePolicy(max_attempts=2),
        options={"breaker": trippy, "breaker_store": store},
    )

    out = runner.invoke(h.app, {"messages": [("user", "x")]}, h.config())

    assert v1.calls == 0
    assert json.loads(str(tool_messages(out)[-1].content))["type"] == "CircuitOpenError"
    assert not out["resilience"].get("gone")


def test_structural_memory_is_validated() -> None:
    with pytest.raises(ConfigurationError, match="structural_memory must be >= 0"):
        ResiliencePolicy(structural_memory=-1)
    assert ResiliencePolicy(structural_memory=None).structural_memory_s is None


def test_parallel_calls_not_yet_started_skip_a_tool_that_just_answered_gone() -> None:
    """Three geocode calls in one turn, run one at a time: the first 404 sends the other
    two to the fallback without executing v1 (what the chaos bench's trip tasks do).
    Sync only: asyncio starts every call of a turn at once, so none is left to skip."""
    v1 = FaultyTool(geocode, then=Fault.status(404))
    v2 = FaultyTool(geocode_v2)
    turn = tool_calls(*[("geocode", {"city": c}) for c in ("Oslo", "Lima", "Pune")])
    h = build_graph(
        [v1, v2], [turn, text("done")], profiles={"geocode": ToolProfile(fallback="geocode_v2")}
    )
    config = {**h.config(), "max_concurrency": 1}

    out = h.app.invoke({"messages": [("user", "x")]}, config)

    assert (v1.calls, v2.executions) == (1, 3)
    assert sorted(m.content for m in tool_messages(out)) == ["v2 Lima", "v2 Oslo", "v2 Pune"]
    assert out["resilience"]["tool_attempts"] == 4  # the skipped calls spent nothing
