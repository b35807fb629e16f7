"""Bad tool calls become envelopes; budgets live in the checkpoint and survive resumes."""

from __future__ import annotations

import json
from typing import Any, Literal

import pytest
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool

from langgraph_resilience import ResiliencePolicy
from langgraph_resilience.errors import ToolFailure
from langgraph_resilience.testing import FakeHTTPError, Fault, FaultyTool, text, tool_calls
from tests.conftest import Runner, build_graph


@tool
def refund(order_id: int, currency: Literal["USD", "EUR"]) -> str:
    """Refund an order."""
    return f"refunded {order_id} in {currency}"


@tool
def lookup(query: str) -> str:
    """Look something up."""
    return f"found {query}"


def envelopes(state: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        json.loads(str(m.content))
        for m in state["messages"]
        if isinstance(m, ToolMessage) and m.status == "error"
    ]


def test_unknown_tool_is_structural_and_suggests_the_closest_tool(runner: Runner) -> None:
    """A call naming a missing tool becomes a STRUCTURAL envelope, no crash, no execution."""
    h = build_graph([lookup], [tool_calls(("lookup_v1", {"query": "x"})), text("ok")])

    out = runner.invoke(h.app, {"messages": [("user", "x")]}, h.config())

    [envelope] = envelopes(out)
    assert envelope["failure_class"] == "structural"
    assert envelope["suggested_action"] == "use_tool:lookup"
    assert out["messages"][-1].content == "ok"


def test_non_json_arguments_are_semantic(runner: Runner) -> None:
    """An invalid tool call (arguments that are not JSON) is answered with a SEMANTIC envelope."""
    broken = AIMessage(
        content="",
        invalid_tool_calls=[
            {
                "name": "lookup",
                "args": '{"query": "x',
                "id": "bad1",
                "error": "EOF",
                "type": "invalid_tool_call",
            }
        ],
    )
    h = build_graph([lookup], [broken, text("ok")])

    out = runner.invoke(h.app, {"messages": [("user", "x")]}, h.config())

    [message] = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert message.tool_call_id == "bad1"
    envelope = json.loads(str(message.content))
    assert envelope["failure_class"] == "semantic"
    assert envelope["suggested_action"] == "fix_args"


def test_arguments_failing_the_schema_are_semantic_and_name_the_field(runner: Runner) -> None:
    """Args that fail the tool's schema produce a SEMANTIC envelope naming the bad field."""
    h = build_graph(
        [refund],
        [tool_calls(("refund", {"order_id": 7, "currency": "dollars"})), text("ok")],
    )

    out = runner.invoke(h.app, {"messages": [("user", "x")]}, h.config())

    [envelope] = envelopes(out)
    assert envelope["failure_class"] == "semantic"
    assert envelope["suggested_action"] == "fix_arg:currency"
    assert envelope["retriable"] is False


def test_secrets_never_reach_the_envelope(runner: Runner) -> None:
    """Authorization headers and passwords in an exception never appear in what the model sees."""
    leaky = FaultyTool(
        lookup,
        [
            Fault.raises(
                FakeHTTPError(
                    403,
                    headers={"Authorization": "Bearer sk-live-0123456789abcdef"},
                    body='{"password": "hunter2", "detail": "forbidden for '
                    'Authorization: Bearer sk-live-0123456789abcdef"}',
                )
            )
        ],
    )
    h = build_graph([leaky], [tool_calls(("lookup", {"query": "x"})), text("ok")])

    out = runner.invoke(h.app, {"messages": [("user", "x")]}, h.config())

    dumped = json.dumps([m.model_dump() for m in out["messages"]], default=str)
    dumped += json.dumps(out["resilience"], default=str)
    assert "hunter2" not in dumped
    assert "sk-live-0123456789abcdef" not in dumped
    assert envelopes(out)[0]["failure_class"] == "policy"


def test_tool_failure_raised_on_purpose_keeps_its_class(runner: Runner) -> None:
    """A tool raising ToolFailure(POLICY) is enveloped as policy with its own message."""
    refuser = FaultyTool(lookup, [Fault.raises(ToolFailure("policy", "refund limit exceeded"))])
    h = build_graph([refuser], [tool_calls(("lookup", {"query": "x"})), text("ok")])

    out = runner.invoke(h.app, {"messages": [("user", "x")]}, h.config())

    [envelope] = envelopes(out)
    assert (envelope["failure_class"], envelope["message"]) == ("policy", "refund limit exceeded")
    assert refuser.calls == 1


@pytest.mark.parametrize("resumes", [3, 10])
def test_attempt_budget_survives_any_number_of_resumes(runner: Runner, resumes: int) -> None:
    """Interrupting before every tools step and resuming never exceeds max_attempts executions."""
    dead = FaultyTool(lookup, then=Fault.status(503))
    h = build_graph(
        [dead],
        [tool_calls(("lookup", {"query": "x"})), text("gave up")],
        policy=ResiliencePolicy(max_attempts=2),
        interrupt_before=["tools"],
    )
    config = h.config()

    runner.invoke(h.app, {"messages": [("user", "x")]}, config)
    for _ in range(resumes):
        runner.invoke(h.app, None, config)

    assert dead.calls == 2
    state = h.app.get_state(config)
    assert state.next == ()
    assert state.values["messages"][-1].content == "gave up"


def test_deadline_stops_retrying_before_a_wait_that_cannot_finish(runner: Runner) -> None:
    """A Retry-After longer than the remaining deadline ends retrying instead of waiting."""
    slow = FaultyTool(lookup, [Fault.status(429, retry_after="50")])
    h = build_graph(
        [slow],
        [tool_calls(("lookup", {"query": "x"})), text("later")],
        policy=ResiliencePolicy(deadline=10),
    )

    out = runner.invoke(h.app, {"messages": [("user", "x")]}, h.config())

    assert slow.calls == 1
    assert h.clock.sleeps == []
    [envelope] = envelopes(out)
    assert envelope["context"]["exhausted"] == "deadline"
    assert envelope["retry_after_ms"] == 50_000
