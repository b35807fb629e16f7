"""Cheap fixes, reflection repair within MAX_REPAIR, output contracts and the loop guard."""

from __future__ import annotations

import json
from typing import Any, Literal

import pytest
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.types import interrupt
from pydantic import BaseModel

from langgraph_resilience import EVENT_KEY, ResiliencePolicy, ToolProfile
from langgraph_resilience.testing import (
    Fault,
    FaultyTool,
    ScriptedChatModel,
    text,
    tool_calls,
)
from tests.conftest import Runner, build_graph


@tool
def refund(order_id: int, amount: float, currency: Literal["USD", "EUR"]) -> str:
    """Refund an order."""
    return f"refunded {amount} {currency} on {order_id}"


@tool
def lookup(query: str) -> str:
    """Look something up."""
    return f"found {query}"


@tool
def create_order(item: str) -> dict[str, Any]:
    """Create an order."""
    return {"status": "ok"}


class Order(BaseModel):
    order_id: str
    status: str


def tool_messages(state: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in state["messages"] if isinstance(m, ToolMessage)]


def repair_with(*args_list: dict[str, Any], name: str = "refund") -> ScriptedChatModel:
    return ScriptedChatModel(responses=[tool_calls((name, args)) for args in args_list])


def test_case_mismatch_is_fixed_by_coercion_without_an_llm_call(runner: Runner) -> None:
    """currency="usd" and amount="12.5" are coerced losslessly; the repair model is never called."""
    spy = FaultyTool(refund)
    repairer = repair_with()
    h = build_graph(
        [spy],
        [tool_calls(("refund", {"order_id": 7, "amount": "12.5", "currency": "usd"})), text("ok")],
        repair_model=repairer,
    )

    out = runner.invoke(h.app, {"messages": [("user", "refund order 7")]}, h.config())

    [message] = tool_messages(out)
    assert (message.status, message.content) == ("success", "refunded 12.5 USD on 7")
    assert repairer.calls == 0
    assert spy.executions == 1
    assert message.response_metadata["resilience"]["coercions"] == [
        "currency: 'usd' -> 'USD'",
        "amount: '12.5' -> 12.5",
    ]


def test_unfixable_value_is_repaired_by_the_model(runner: Runner) -> None:
    """currency="dollars": the repair model sees the envelope naming the field and fixes it."""
    spy = FaultyTool(refund)
    repairer = repair_with({"order_id": 7, "amount": 12.5, "currency": "USD"})
    ai = tool_calls(("refund", {"order_id": 7, "amount": 12.5, "currency": "dollars"}))
    h = build_graph([spy], [ai, text("ok")], repair_model=repairer)

    out = runner.invoke(h.app, {"messages": [("user", "refund order 7")]}, h.config())

    assert repairer.calls == 1
    [bound] = repairer.bound_tools
    assert bound == {"tools": ["refund"], "tool_choice": "refund"}
    prompt = repairer.received[0][-1].text
    assert "fix_arg:currency" in prompt
    assert "refund order 7" in prompt
    [message] = tool_messages(out)
    original_id = next(m for m in out["messages"] if isinstance(m, AIMessage)).tool_calls[0]["id"]
    assert message.tool_call_id == original_id
    assert (message.status, message.content) == ("success", "refunded 12.5 USD on 7")
    assert spy.executions == 1
    trail = message.artifact["resilience"]
    assert trail["repairs"] == 1
    assert trail["trail"][0]["args"]["currency"] == "dollars"
    assert out["resilience"]["llm_calls"] == 1


@pytest.mark.parametrize("max_repair", [0, 1, 2])
def test_repairs_stop_at_exactly_max_repair(runner: Runner, max_repair: int) -> None:
    """A repair model that keeps proposing new bad values is called exactly max_repair times."""
    repairer = repair_with(*({"order_id": 7, "amount": 1, "currency": f"bad{i}"} for i in range(5)))
    h = build_graph(
        [refund],
        [tool_calls(("refund", {"order_id": 7, "amount": 1, "currency": "dollars"})), text("ok")],
        repair_model=repairer,
        policy=ResiliencePolicy(max_repair=max_repair),
    )

    out = runner.invoke(h.app, {"messages": [("user", "x")]}, h.config())

    assert repairer.calls == max_repair
    [message] = tool_messages(out)
    envelope = json.loads(str(message.content))
    assert envelope["failure_class"] == "semantic"
    assert envelope["context"]["exhausted"] == "max_repair"
    assert out["resilience"]["llm_calls"] == max_repair


def test_repair_with_identical_arguments_is_rejected_without_executing(runner: Runner) -> None:
    """A repair that proposes the same failed arguments again never reaches the tool."""
    picky = FaultyTool(lookup, then=Fault.status(422))
    repairer = repair_with({"query": "x", "reasoning": "try again"}, {"query": "x"}, name="lookup")
    h = build_graph(
        [picky],
        [tool_calls(("lookup", {"query": "x"})), text("ok")],
        repair_model=repairer,
    )

    out = runner.invoke(h.app, {"messages": [("user", "x")]}, h.config())

    assert picky.calls == 1
    assert repairer.calls == 2
    envelope = json.loads(str(tool_messages(out)[0].content))
    assert envelope["context"]["exhausted"] == "max_repair"


def test_output_contract_violation_is_semantic_never_success(runner: Runner) -> None:
    """{"status": "ok"} without the required order_id is reported as SEMANTIC, not passed on."""
    h = build_graph(
        [create_order],
        [tool_calls(("create_order", {"item": "lamp"})), text("ok")],
        profiles={"create_order": ToolProfile(output_schema=Order)},
    )

    out = runner.invoke(h.app, {"messages": [("user", "x")]}, h.config())

    [message] = tool_messages(out)
    assert message.status == "error"
    envelope = json.loads(str(message.content))
    assert envelope["failure_class"] == "semantic"
    assert envelope["context"]["stage"] == "output"
    assert any("order_id" in p for p in envelope["context"]["problems"])


def test_identical_calls_are_stopped_by_the_loop_guard(runner: Runner) -> None:
    """An agent issuing the same call 5 times: the tool runs loop_threshold times, then loops."""
    spy = FaultyTool(lookup, then=Fault.status(403))  # never retried, never remembered as gone
    same = [tool_calls(("lookup", {"query": "x", "thought": f"attempt {i}"})) for i in range(5)]
    h = build_graph([spy], [*same, text("stuck")])

    chunks = runner.stream(
        h.app, {"messages": [("user", "x")]}, h.config(), stream_mode=["custom", "values"]
    )

    assert spy.calls == 2
    loops = [c for mode, c in chunks if mode == "custom" and c[EVENT_KEY] == "loop_detected"]
    assert len(loops) == 3
    final = next(c for mode, c in reversed(chunks) if mode == "values")
    envelopes = [json.loads(str(m.content)) for m in tool_messages(final)]
    assert [e["type"] for e in envelopes].count("LoopDetectedError") == 3
    assert envelopes[-1]["context"]["loop"] == "repeat"


def test_alternating_calls_are_detected(runner: Runner) -> None:
    """A-B-A-B on identical keys is a loop at the fourth call."""
    a, b = FaultyTool(lookup, then=Fault.status(403)), FaultyTool(refund)
    script = [
        tool_calls(("lookup", {"query": "x"})),
        tool_calls(("refund", {"order_id": 1, "amount": 1, "currency": "USD"})),
        tool_calls(("lookup", {"query": "x"})),
        tool_calls(("refund", {"order_id": 1, "amount": 1, "currency": "USD"})),
        text("stuck"),
    ]
    h = build_graph([a, b], script)

    out = runner.invoke(h.app, {"messages": [("user", "x")]}, h.config())

    envelopes = [json.loads(str(m.content)) for m in tool_messages(out) if m.status == "error"]
    assert envelopes[-1]["type"] == "LoopDetectedError"
    assert envelopes[-1]["context"]["loop"] == "alternating"
    assert (a.calls, b.executions) == (2, 1)


def test_repeated_calls_with_different_arguments_are_not_loops(runner: Runner) -> None:
    """Five calls of one tool with different arguments all execute."""
    spy = FaultyTool(lookup)
    script = [tool_calls(("lookup", {"query": f"q{i}"})) for i in range(5)]
    h = build_graph([spy], [*script, text("done")])

    runner.invoke(h.app, {"messages": [("user", "x")]}, h.config())

    assert spy.executions == 5


def test_interrupt_inside_the_repair_model_propagates(runner: Runner) -> None:
    """interrupt() raised while repairing pauses the graph at the repair node."""

    def ask(_: list[BaseMessage]) -> AIMessage:
        interrupt("which currency?")
        return text("unreachable")

    repairer = ScriptedChatModel(responses=[ask])
    h = build_graph(
        [refund],
        [tool_calls(("refund", {"order_id": 7, "amount": 1, "currency": "dollars"})), text("ok")],
        repair_model=repairer,
    )
    config = h.config()

    out = runner.invoke(h.app, {"messages": [("user", "x")]}, config)

    assert out["__interrupt__"][0].value == "which currency?"
    assert h.app.get_state(config).next == ("repair",)


def test_malformed_json_arguments_are_repaired(runner: Runner) -> None:
    """A call whose arguments are not JSON is re-issued by the repair model and answered."""
    broken = AIMessage(
        content="",
        invalid_tool_calls=[
            {
                "name": "lookup",
                "args": '{"query": "lamps',
                "id": "bad1",
                "error": "unterminated string",
                "type": "invalid_tool_call",
            }
        ],
    )
    repairer = repair_with({"query": "lamps"}, name="lookup")
    spy = FaultyTool(lookup)
    h = build_graph([spy], [broken, text("ok")], repair_model=repairer)

    out = runner.invoke(h.app, {"messages": [("user", "find lamps")]}, h.config())

    assert '{\\"query\\": \\"lamps' in repairer.received[0][-1].text
    [message] = tool_messages(out)
    assert (message.tool_call_id, message.status, message.content) == (
        "bad1",
        "success",
        "found lamps",
    )
    assert spy.executions == 1


def test_output_contract_failures_are_not_sent_to_argument_repair(runner: Runner) -> None:
    """A bad result is the tool's fault: the repair model is not asked, the tool runs once."""
    spy = FaultyTool(create_order)
    repairer = repair_with({"item": "lamp"}, name="create_order")
    h = build_graph(
        [spy],
        [tool_calls(("create_order", {"item": "lamp"})), text("ok")],
        profiles={"create_order": ToolProfile(output_schema=Order)},
        repair_model=repairer,
    )

    out = runner.invoke(h.app, {"messages": [("user", "x")]}, h.config())

    assert (spy.executions, repairer.calls) == (1, 0)
    assert json.loads(str(tool_messages(out)[0].content))["context"]["stage"] == "output"
