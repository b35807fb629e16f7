"""Compiled user graphs with add_resilience: classification, retry, budgets, isolation."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from langgraph_resilience import (
    EVENT_KEY,
    ConfigurationError,
    FailureClass,
    ResiliencePolicy,
    ToolProfile,
    tool_error_of,
)
from langgraph_resilience.events import listening
from langgraph_resilience.testing import Fault, FaultyTool, text, tool_calls
from tests.conftest import Runner, build_graph, seeded_delays


@tool
def search(query: str) -> str:
    """Search the catalogue."""
    return f"results for {query}"


@tool
def weather(city: str) -> str:
    """Current weather for a city."""
    return f"sunny in {city}"


@tool
def charge(amount: int) -> str:
    """Charge the customer's card."""
    return f"charged {amount}"


def tool_messages(state: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in state["messages"] if isinstance(m, ToolMessage)]


def test_transient_failures_are_retried_with_exact_backoff(runner: Runner) -> None:
    """A tool failing 429 then 503 runs 3 times; the agent sees one success; delays are exact."""
    flaky = FaultyTool(search, [Fault.status(429), Fault.status(503)])
    h = build_graph([flaky], [tool_calls(("search", {"query": "lamps"})), text("done")])

    out = runner.invoke(h.app, {"messages": [("user", "find lamps")]}, h.config())

    assert flaky.calls == 3
    assert flaky.executions == 1
    messages = tool_messages(out)
    assert [(m.status, m.content) for m in messages] == [("success", "results for lamps")]
    assert h.clock.sleeps == pytest.approx(seeded_delays(7, 2))
    assert out["messages"][-1].content == "done"
    assert out["resilience"]["tool_attempts"] == 3


def test_retry_after_header_is_honoured(runner: Runner) -> None:
    """A 429 with Retry-After: 4 waits exactly 4 s, not the jittered backoff."""
    flaky = FaultyTool(search, [Fault.status(429, retry_after="4")])
    h = build_graph([flaky], [tool_calls(("search", {"query": "x"})), text("done")])

    runner.invoke(h.app, {"messages": [("user", "x")]}, h.config())

    assert h.clock.sleeps == [4.0]
    assert flaky.calls == 2


def test_policy_failure_is_never_retried_and_reaches_agent_as_envelope(runner: Runner) -> None:
    """A 401 runs once and the agent gets a ToolError envelope with failure_class 'policy'."""
    locked = FaultyTool(search, [Fault.status(401)])
    h = build_graph([locked], [tool_calls(("search", {"query": "x"})), text("sorry")])

    out = runner.invoke(h.app, {"messages": [("user", "x")]}, h.config())

    assert locked.calls == 1
    assert h.clock.sleeps == []
    [message] = tool_messages(out)
    assert message.status == "error"
    envelope = json.loads(str(message.content))
    assert envelope["failure_class"] == "policy"
    assert envelope["retriable"] is False
    assert envelope["suggested_action"] == "ask_human"
    assert envelope["context"]["status_code"] == 401
    error = tool_error_of(message)
    assert error is not None
    assert error.failure_class is FailureClass.POLICY
    assert h.model.received[-1][-1] == message  # the agent was shown it


def test_transient_forever_stops_at_max_attempts(runner: Runner) -> None:
    """A tool failing 503 forever executes exactly max_attempts times, then the agent is told."""
    dead = FaultyTool(search, then=Fault.status(503))
    h = build_graph(
        [dead],
        [tool_calls(("search", {"query": "x"})), text("gave up")],
        policy=ResiliencePolicy(max_attempts=3),
    )

    out = runner.invoke(h.app, {"messages": [("user", "x")]}, h.config())

    assert dead.calls == 3
    [message] = tool_messages(out)
    envelope = json.loads(str(message.content))
    assert envelope["failure_class"] == "transient"
    assert envelope["attempt"] == 3
    assert envelope["context"]["exhausted"] == "max_attempts"
    assert len(h.clock.sleeps) == 2


def test_thread_budget_is_shared_across_tools(runner: Runner) -> None:
    """Two tools failing forever share max_tool_attempts: 4 executions in all, not 3 + 3."""
    a = FaultyTool(search, then=Fault.status(503))
    b = FaultyTool(weather, then=Fault.status(502))
    h = build_graph(
        [a, b],
        [tool_calls(("search", {"query": "x"}), ("weather", {"city": "Oslo"})), text("ok")],
        policy=ResiliencePolicy(max_attempts=3, max_tool_attempts=4),
    )

    out = runner.invoke(h.app, {"messages": [("user", "x")]}, h.config())

    assert a.calls + b.calls == 4
    assert out["resilience"]["tool_attempts"] == 4
    reasons = sorted(json.loads(str(m.content))["context"]["exhausted"] for m in tool_messages(out))
    assert "max_tool_attempts" in reasons
    assert len(tool_messages(out)) == 2


def test_parallel_calls_both_recover_and_ledger_counts_both(runner: Runner) -> None:
    """Two failing calls in one turn both recover; the ledger records both call histories."""
    a = FaultyTool(search, [Fault.status(503)])
    b = FaultyTool(weather, [Fault.timeout(), Fault.status(429)])
    h = build_graph(
        [a, b],
        [tool_calls(("search", {"query": "x"}), ("weather", {"city": "Oslo"})), text("ok")],
    )

    out = runner.invoke(h.app, {"messages": [("user", "x")]}, h.config())

    assert (a.calls, b.calls) == (2, 3)
    assert sorted(m.content for m in tool_messages(out)) == ["results for x", "sunny in Oslo"]
    calls = out["resilience"]["calls"]
    assert sorted(r["attempts"] for r in calls.values()) == [2, 3]
    assert all(r["status"] == "ok" for r in calls.values())
    assert out["resilience"]["tool_attempts"] == 5


def test_succeeding_sibling_runs_once_while_other_call_retries(runner: Runner) -> None:
    """A succeeding side effect runs exactly once while its sibling is retried twice."""
    pay = FaultyTool(charge)
    flaky = FaultyTool(search, [Fault.status(503), Fault.status(503)])
    h = build_graph(
        [pay, flaky],
        [tool_calls(("charge", {"amount": 30}), ("search", {"query": "x"})), text("ok")],
        profiles={"charge": ToolProfile(side_effect=True)},
    )

    out = runner.invoke(h.app, {"messages": [("user", "x")]}, h.config())

    assert pay.executions == 1
    assert flaky.calls == 3
    assert sorted(m.content for m in tool_messages(out)) == ["charged 30", "results for x"]


def test_interrupt_inside_a_tool_propagates(runner: Runner) -> None:
    """interrupt() raised inside a tool is control flow: the graph pauses, nothing is enveloped."""
    asking = FaultyTool(search, [Fault.interrupt("approve search?")])
    h = build_graph([asking], [tool_calls(("search", {"query": "x"})), text("ok")])
    config = h.config()

    out = runner.invoke(h.app, {"messages": [("user", "x")]}, config)

    assert "__interrupt__" in out
    assert out["__interrupt__"][0].value == "approve search?"
    assert tool_messages(out) == []
    assert h.app.get_state(config).next == ("tools",)


def test_clean_calls_match_langgraph_tool_node(runner: Runner) -> None:
    """Without failures, the ToolMessages equal what LangGraph's ToolNode produces."""
    h = build_graph(
        [search, weather],
        [tool_calls(("search", {"query": "x"}), ("weather", {"city": "Oslo"})), text("ok")],
    )
    out = runner.invoke(h.app, {"messages": [("user", "x")]}, h.config())
    ai = next(m for m in out["messages"] if isinstance(m, AIMessage) and m.tool_calls)

    plain = StateGraph(MessagesState)
    plain.add_node("tools", ToolNode([search, weather]))
    plain.add_edge(START, "tools")
    expected = plain.compile().invoke({"messages": [ai]})["messages"][1:]

    def shape(m: ToolMessage) -> tuple[Any, ...]:
        return (m.tool_call_id, m.name, m.content, m.status, m.artifact)

    assert [shape(m) for m in tool_messages(out)] == [shape(m) for m in expected]
    assert h.clock.sleeps == []


def test_events_stream_in_order(runner: Runner) -> None:
    """The custom stream shows each attempt, the scheduled retry and the backoff, which a
    short wait spends inside the tools step, then the one route."""
    flaky = FaultyTool(search, [Fault.status(503)])
    h = build_graph([flaky], [tool_calls(("search", {"query": "x"})), text("ok")])

    chunks = runner.stream(h.app, {"messages": [("user", "x")]}, h.config(), stream_mode="custom")

    kinds = [c[EVENT_KEY] for c in chunks if isinstance(c, dict) and EVENT_KEY in c]
    assert kinds == ["attempt", "retry_scheduled", "backoff", "attempt", "route"]
    assert chunks[0]["failure_class"] == "transient"
    assert chunks[2]["in_step"] is True
    assert chunks[4]["to"] == "agent"


def test_a_clean_call_is_an_event_only_for_someone_listening(
    runner: Runner, caplog: pytest.LogCaptureFixture
) -> None:
    """A clean first try streams its attempt to ``custom``; a node asks `listening()`
    before building an event, which is false in a run nobody streams nor logs at INFO
    (LangGraph's writer then does nothing) and true in one that does."""
    seen: list[bool] = []

    @tool
    def probe(query: str) -> str:
        """Report whether events reach anyone now."""
        seen.append(listening())
        return query

    def graph() -> Any:
        return build_graph([probe], [tool_calls(("probe", {"query": "x"})), text("ok")])

    h = graph()
    chunks = runner.stream(h.app, {"messages": [("user", "x")]}, h.config(), stream_mode="custom")
    attempts = [c for c in chunks if isinstance(c, dict) and c.get(EVENT_KEY) == "attempt"]
    assert [(c["tool"], c["ok"]) for c in attempts] == [("probe", True)]

    h = graph()
    runner.invoke(h.app, {"messages": [("user", "x")]}, h.config())
    with caplog.at_level(logging.INFO, logger="langgraph_resilience"):
        h = graph()
        runner.invoke(h.app, {"messages": [("user", "x")]}, h.config())
    assert seen == [True, False, True]
    assert any("attempt" in r.getMessage() for r in caplog.records)


def test_events_stream_in_order_for_a_long_wait(runner: Runner) -> None:
    """A wait beyond inline_retry_max_wait routes to the retry node: the backoff is a step."""
    flaky = FaultyTool(search, [Fault.status(429, retry_after="5")])
    h = build_graph([flaky], [tool_calls(("search", {"query": "x"})), text("ok")])

    chunks = runner.stream(h.app, {"messages": [("user", "x")]}, h.config(), stream_mode="custom")

    kinds = [c[EVENT_KEY] for c in chunks if isinstance(c, dict) and EVENT_KEY in c]
    assert kinds == ["attempt", "retry_scheduled", "route", "backoff", "attempt", "route"]
    assert chunks[2]["to"] == "retry"
    assert "in_step" not in chunks[3]
    assert h.clock.sleeps == [5.0]


def test_no_backoff_is_waited_once_the_thread_budget_is_spent(runner: Runner) -> None:
    """When the last budgeted attempts fail, waiting retries are settled at once, not slept on."""
    a = FaultyTool(search, then=Fault.status(503))
    b = FaultyTool(weather, then=Fault.status(503))
    h = build_graph(
        [a, b],
        [tool_calls(("search", {"query": "x"}), ("weather", {"city": "Oslo"})), text("ok")],
        policy=ResiliencePolicy(max_attempts=2, max_tool_attempts=2),
    )

    out = runner.invoke(h.app, {"messages": [("user", "x")]}, h.config())

    assert (a.calls, b.calls) == (1, 1)
    assert h.clock.sleeps == []
    reasons = [json.loads(str(m.content))["context"]["exhausted"] for m in tool_messages(out)]
    assert reasons == ["max_tool_attempts", "max_tool_attempts"]


def test_route_event_accounts_for_siblings_still_waiting(runner: Runner) -> None:
    """A step that settles one call while a sibling waits reports the route to retry (both
    waits too long to spend inside the step)."""
    slow = FaultyTool(search, [Fault.status(429, retry_after="5")])
    quick = FaultyTool(weather, [Fault.status(429, retry_after="2")])
    h = build_graph(
        [slow, quick],
        [tool_calls(("search", {"query": "x"}), ("weather", {"city": "Oslo"})), text("ok")],
    )

    chunks = runner.stream(h.app, {"messages": [("user", "x")]}, h.config(), stream_mode="custom")

    routes = [c["to"] for c in chunks if c[EVENT_KEY] == "route"]
    assert routes == ["retry", "retry", "agent"]


def test_an_async_only_tool_under_invoke_is_a_setup_error_not_a_failure() -> None:
    """Plain LangGraph raises for it; it used to be classified as the tool's failure of
    unknown outcome, and a payment was claimed, then told it may have been made. It is
    a typed error before any claim, and the run resumed with ainvoke pays once."""
    paid: list[int] = []

    @tool
    async def pay(amount: int) -> str:
        """Pay."""
        paid.append(amount)
        return f"paid {amount}"

    h = build_graph(
        [pay],
        [tool_calls(("pay", {"amount": 5})), text("done")],
        profiles={"pay": ToolProfile(side_effect=True)},
    )
    config = h.config()
    with pytest.raises(ConfigurationError, match=r"'pay' has only an async body.*ainvoke"):
        h.app.invoke({"messages": [("user", "pay 5")]}, config)

    out = asyncio.run(h.app.ainvoke(None, config))

    assert paid == [5]
    assert [m.content for m in out["messages"] if isinstance(m, ToolMessage)] == ["paid 5"]
