"""Circuit breakers in the tool loop: fail fast while open, fall back, close after a probe."""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_core.messages import ToolMessage
from langchain_core.tools import tool
from langgraph.graph import StateGraph

from langgraph_resilience import (
    ConfigurationError,
    ResiliencePolicy,
    ToolProfile,
    add_resilience,
)
from langgraph_resilience.core.breaker import BreakerConfig
from langgraph_resilience.core.budget import RetryBudget
from langgraph_resilience.events import EVENT_KEY
from langgraph_resilience.stores.breakers import InMemoryBreakerStore
from langgraph_resilience.stores.budgets import InMemoryRetryBudgetStore
from langgraph_resilience.testing import FakeClock, Fault, FaultyTool, text, tool_calls
from tests.conftest import Runner, State, build_graph


@tool
def search(query: str) -> str:
    """Search (v1)."""
    return f"v1 results for {query}"


@tool
def search_v2(query: str) -> str:
    """Search (v2)."""
    return f"v2 results for {query}"


@tool
def search_v3(q: str) -> str:
    """Search (v3, another argument name)."""
    return f"v3 results for {q}"


TRIPPY = BreakerConfig(minimum_calls=1, window_size=1, open_duration=30)
"""Opens once a tool's last call failed; a call counts once, after its own retries."""


def tool_messages(state: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in state["messages"] if isinstance(m, ToolMessage)]


def test_open_breaker_stops_calls_across_threads_and_a_probe_closes_it(runner: Runner) -> None:
    """503 on every attempt: the call fails and trips the breaker; other threads never reach
    the tool; v2 serves; a probe after open_duration finds v1 healthy and closes it."""
    v1 = FaultyTool(search, [Fault.status(503)] * 3)
    v2 = FaultyTool(search_v2)
    store = InMemoryBreakerStore()
    clock = FakeClock()
    turn = [tool_calls(("search", {"query": "lamps"})), text("ok")]
    h = build_graph(
        [v1, v2],
        turn * 3,
        clock=clock,
        profiles={"search": ToolProfile(fallback="search_v2")},
        options={"breaker": TRIPPY, "breaker_store": store},
    )

    first = runner.invoke(h.app, {"messages": [("user", "lamps")]}, h.config())
    assert v1.calls == 3
    assert tool_messages(first)[-1].content == "v2 results for lamps"
    assert store.snapshot("search").status_at(TRIPPY, clock.time()) == "open"

    second = runner.invoke(h.app, {"messages": [("user", "lamps")]}, h.config())
    assert v1.calls == 3  # not executed while open
    served = tool_messages(second)[-1]
    assert served.content == "v2 results for lamps"
    assert served.response_metadata["resilience"]["served_by"] == "search_v2"

    clock.advance(31)
    third = runner.invoke(h.app, {"messages": [("user", "lamps")]}, h.config())
    assert v1.calls == 4
    assert tool_messages(third)[-1].content == "v1 results for lamps"
    assert store.snapshot("search").status_at(TRIPPY, clock.time()) == "closed"
    assert v2.executions == 2


def test_a_calls_own_recovered_retries_never_open_its_breaker(runner: Runner) -> None:
    """503, 503, then success: one call that succeeded, so even a breaker that opens on a
    single failed call stays closed, and the next threads use the tool."""
    v1 = FaultyTool(search, [Fault.status(503), Fault.status(503)])
    store = InMemoryBreakerStore()
    clock = FakeClock()
    turn = [tool_calls(("search", {"query": "x"})), text("ok")]
    h = build_graph(
        [v1], turn * 2, clock=clock, options={"breaker": TRIPPY, "breaker_store": store}
    )
    runner.invoke(h.app, {"messages": [("user", "x")]}, h.config())
    assert store.snapshot("search").status_at(TRIPPY, clock.time()) == "closed"

    out = runner.invoke(h.app, {"messages": [("user", "x")]}, h.config())

    assert v1.calls == 4
    assert tool_messages(out)[-1].content == "v1 results for x"


def test_open_breaker_without_fallback_is_structural_with_retry_after(runner: Runner) -> None:
    """With no fallback, an open breaker answers at once: STRUCTURAL, retry_after_ms set."""
    v1 = FaultyTool(search, then=Fault.status(503))
    store = InMemoryBreakerStore()
    turn = [tool_calls(("search", {"query": "x"})), text("ok")]
    h = build_graph([v1], turn * 2, options={"breaker": TRIPPY, "breaker_store": store})
    runner.invoke(h.app, {"messages": [("user", "x")]}, h.config())

    out = runner.invoke(h.app, {"messages": [("user", "x")]}, h.config())

    assert v1.calls == 3
    envelope = json.loads(str(tool_messages(out)[-1].content))
    assert envelope["failure_class"] == "structural"
    assert envelope["type"] == "CircuitOpenError"
    assert 0 < envelope["retry_after_ms"] <= 30_000
    assert out["resilience"]["tool_attempts"] == 0 + 0  # nothing executed in this thread


def test_fallback_chain_adapts_args_and_never_returns_to_a_tried_tool(runner: Runner) -> None:
    """v1 (gone) -> v2 (gone) -> v3 with adapted arguments; each tool runs once."""
    v1 = FaultyTool(search, then=Fault.status(410))
    v2 = FaultyTool(search_v2, then=Fault.status(404))
    v3 = FaultyTool(search_v3)
    h = build_graph(
        [v1, v2, v3],
        [tool_calls(("search", {"query": "lamps"})), text("ok")],
        profiles={
            "search": ToolProfile(
                fallback=["search_v2", "search_v3"],
                fallback_args=lambda name, a: {"q": a["query"]} if name == "search_v3" else a,
            )
        },
    )

    out = runner.invoke(h.app, {"messages": [("user", "x")]}, h.config())

    assert (v1.calls, v2.calls, v3.calls) == (1, 1, 1)
    [message] = tool_messages(out)
    assert message.content == "v3 results for lamps"
    assert message.response_metadata["resilience"]["tried"] == ["search", "search_v2"]


def test_a_fallback_gets_its_own_attempts_and_backoff(runner: Runner) -> None:
    """v1 answers 503 until its 3 attempts are spent; v2 takes over and its own first
    503 is retried (it is its attempt 1 of 3, not the call's 4th)."""
    v1 = FaultyTool(search, then=Fault.status(503))
    v2 = FaultyTool(search_v2, [Fault.status(503)])
    h = build_graph(
        [v1, v2],
        [tool_calls(("search", {"query": "lamps"})), text("ok")],
        profiles={"search": ToolProfile(fallback="search_v2")},
        policy=ResiliencePolicy(max_attempts=3),
    )

    chunks = runner.stream(
        h.app, {"messages": [("user", "x")]}, h.config(), stream_mode=["custom", "values"]
    )

    assert (v1.calls, v2.calls) == (3, 2)
    final = next(c for mode, c in reversed(chunks) if mode == "values")
    [message] = tool_messages(final)
    assert message.content == "v2 results for lamps"
    attempts = [
        (c["tool"], c["attempt"])
        for mode, c in chunks
        if mode == "custom" and c[EVENT_KEY] == "attempt"
    ]
    assert attempts == [
        ("search", 1),
        ("search", 2),
        ("search", 3),
        ("search_v2", 1),
        ("search_v2", 2),
    ]
    assert len(h.clock.sleeps) == 3  # two backoffs for v1, one for v2


def test_retry_budget_refuses_retries_when_empty(runner: Runner) -> None:
    """An empty shared retry budget turns a would-be retry into an envelope at once."""
    flaky = FaultyTool(search, then=Fault.status(503))
    budget = RetryBudget(ratio=0.01, max_tokens=1, min_retries_per_second=0.0)
    store = InMemoryRetryBudgetStore()
    clock = FakeClock()
    assert store.try_withdraw("search", budget, clock.time())  # another thread spent it
    h = build_graph(
        [flaky],
        [tool_calls(("search", {"query": "x"})), text("ok")],
        clock=clock,
        options={"breaker": None, "retry_budget": budget, "retry_budget_store": store},
    )

    out = runner.invoke(h.app, {"messages": [("user", "x")]}, h.config())

    assert flaky.calls == 1
    envelope = json.loads(str(tool_messages(out)[-1].content))
    assert envelope["context"]["exhausted"] == "retry_budget"


@pytest.mark.parametrize(
    ("profiles", "problem"),
    [
        ({"search": ToolProfile(fallback="nope")}, "unknown tools"),
        ({"search": ToolProfile(fallback="search")}, "its own fallback"),
        (
            {
                "search": ToolProfile(fallback="search_v2"),
                "search_v2": ToolProfile(fallback="search"),
            },
            "fallback cycle",
        ),
    ],
)
def test_bad_fallback_configuration_fails_at_construction(
    profiles: dict[str, ToolProfile], problem: str
) -> None:
    """Unknown fallbacks, self-fallbacks and cycles are rejected when the graph is built."""
    builder = StateGraph(State)
    builder.add_node("agent", lambda s: s)
    with pytest.raises(ConfigurationError, match=problem):
        add_resilience(
            builder,
            agent="agent",
            tools=[search, search_v2],
            profiles=profiles,
            policy=ResiliencePolicy(),
        )


def test_an_open_breaker_never_sends_a_new_threads_call_to_a_human(runner: Runner) -> None:
    """An outage learned by an earlier thread (the shared breaker is open): a brand-new
    thread's read-only call is answered with the breaker's retry_after for the agent to
    plan around, even with escalation on; no interrupt, nothing executed."""
    v1 = FaultyTool(search, then=Fault.status(503))
    store = InMemoryBreakerStore()
    turn = [tool_calls(("search", {"query": "x"})), text("ok")]
    shared = {"breaker": TRIPPY, "breaker_store": store}
    outage = build_graph([v1], turn, options=shared)
    runner.invoke(outage.app, {"messages": [("user", "x")]}, outage.config())
    h = build_graph([v1], turn, escalate=True, options=shared)

    out = runner.invoke(h.app, {"messages": [("user", "x")]}, h.config())

    assert "__interrupt__" not in out
    assert v1.calls == 3
    envelope = json.loads(str(tool_messages(out)[-1].content))
    assert envelope["type"] == "CircuitOpenError"
    assert envelope["retry_after_ms"] > 0
    assert out["messages"][-1].content == "ok"
