"""A step of one call (`create_agent`'s, via `call_step`) plans its message only up to
that call: what it decides for the call must be what planning the whole message
decides, whatever the siblings after it are (budgets, loops, shared ids, bad JSON)."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolCall
from langchain_core.tools import tool

from langgraph_resilience import ResiliencePolicy
from langgraph_resilience._graph.tool_batch import Batch, plan_batch
from langgraph_resilience._graph.tools import GuardedToolNode
from langgraph_resilience.testing import FakeClock


@tool
def lookup(query: str) -> str:
    """Look something up."""
    return query


@tool
def other(query: str) -> str:
    """Look something else up."""
    return query


def _call(call_id: str, name: str = "lookup", query: str | None = None) -> ToolCall:
    return ToolCall(name=name, args={"query": query or call_id}, id=call_id, type="tool_call")


MESSAGES: dict[str, AIMessage] = {
    "budget": AIMessage("", tool_calls=[_call(f"c{i}") for i in range(5)]),
    "loops": AIMessage("", tool_calls=[_call(f"c{i}", query="same") for i in range(4)]),
    "alternating": AIMessage(
        "",
        tool_calls=[
            _call("c0", query="a"),
            _call("c1", query="b"),
            _call("c2", query="a"),
            _call("c3", query="b"),
            _call("c4", name="other"),
        ],
    ),
    "shared ids": AIMessage("", tool_calls=[_call("c0"), _call("dup"), _call("dup"), _call("c3")]),
    "unknown tool": AIMessage("", tool_calls=[_call("c0", name="nope"), _call("c1")]),
    "bad json": AIMessage(
        "",
        tool_calls=[_call("c0"), _call("c1", name="nope")],
        invalid_tool_calls=[
            {"name": "lookup", "args": "{not json", "id": "bad", "error": None, "type": "x"}
        ],
    ),
}


def _decided(batch: Batch | None) -> Any:
    """What a step does with its call: comparable across two plans."""
    assert batch is not None
    return {
        "runnable": batch.runnable,
        "preflight": [
            (p.slot, p.exhausted, p.key, p.repairable, type(p.error).__name__, str(p.error))
            for p in batch.preflight
        ],
        "keys": batch.keys,
        "slots": batch.slots,
        "loop_keys": batch.loop_keys,
        "spent": batch.spent,
        "seen": batch.seen,
        "recent": batch.recent,
        "owns": batch.owns,
    }


@pytest.mark.parametrize("case", sorted(MESSAGES))
def test_planning_up_to_a_call_decides_it_as_the_whole_message_does(case: str) -> None:
    node = GuardedToolNode(
        [lookup, other],
        policy=ResiliencePolicy(max_attempts=1, max_tool_attempts=3, loop_threshold=2),
        clock=FakeClock(),
    )
    ai = MESSAGES[case]
    state = {"messages": [HumanMessage("go"), ai]}
    # create_agent runs a task per valid call only: an invalid one is never a step's own
    ids = [c["id"] for c in ai.tool_calls]
    decisions = set()
    for call_id in dict.fromkeys(ids):
        assert call_id is not None
        whole = plan_batch(node.settings, state)
        upto = plan_batch(node.settings, state, upto=call_id)
        assert whole is not None
        decided = _decided(whole.only(call_id))
        assert _decided(upto.only(call_id) if upto is not None else None) == decided
        decisions.add(repr(decided["preflight"] and decided["preflight"][0][1:5]))
    # each case reaches past the plain path for some call (else it would test nothing)
    assert len(decisions) > 1
