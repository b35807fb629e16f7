"""Two ledger deltas of one tools step (a retry inside it) compose into the one delta the
step writes: applying it equals applying the two in order."""

from __future__ import annotations

from typing import Any

from langgraph_resilience.graph.state import merge_ledger
from langgraph_resilience.graph.step_retry import composed


def _record(attempts: int, status: str, due: float | None = None) -> dict[str, Any]:
    return {
        "tool": "search",
        "key": "search:x",
        "attempts": attempts,
        "status": status,
        "due": due,
        "error": None,
        "call_id": "c1",
        "args": {"query": "x"},
    }


FIRST: Any = {
    "calls": {"m1:0": _record(1, "scheduled", 10.2), "m1:1": _record(1, "ok")},
    "task": {
        "id": "t1",
        "tool_attempts": 2,
        "seen": {"search:x": 1, "weather:y": 1},
        "failed": {},
        "recent": ["search:x", "weather:y"],
        "started_at": 10.0,
    },
    "tool_attempts": 2,
    "events": {"attempt": 2, "retry_scheduled": 1},
    "gone": {"geo": 10.0},
}
THEN: Any = {
    "calls": {"m1:0": _record(2, "failed")},
    "task": {"id": "t1", "tool_attempts": 1, "seen": {"search:x": -1}, "failed": {"search:x": 1}},
    "tool_attempts": 1,
    "events": {"attempt": 1, "gave_up": 1},
    "informed": {"k1": "t1"},
}


def _without_rev(ledger: Any) -> dict[str, Any]:
    return {k: v for k, v in ledger.items() if k != "rev"}


def test_the_composed_delta_applies_as_the_two_in_order() -> None:
    """merge(L, composed(a, b)) == merge(merge(L, a), b), on a ledger with history."""
    before = merge_ledger(
        None,
        {
            "calls": {"m0:0": _record(1, "ok")},
            "task": {
                "id": "t1",
                "tool_attempts": 1,
                "seen": {"lookup:z": 1},
                "recent": ["lookup:z"],
            },
            "tool_attempts": 5,
            "events": {"attempt": 5},
        },
    )

    in_order = merge_ledger(merge_ledger(before, FIRST), THEN)
    at_once = merge_ledger(before, composed(FIRST, THEN))

    assert _without_rev(at_once) == _without_rev(in_order)


def test_the_later_record_of_a_call_stands() -> None:
    """The retried call's record is its last run's; counters add up."""
    delta = composed(FIRST, THEN)

    assert delta["calls"]["m1:0"]["attempts"] == 2
    assert delta["calls"]["m1:0"]["status"] == "failed"
    assert delta["calls"]["m1:1"]["status"] == "ok"
    assert delta["tool_attempts"] == 3
    assert delta["task"]["tool_attempts"] == 3
    assert delta["task"]["started_at"] == 10.0
    assert delta["events"] == {"attempt": 3, "retry_scheduled": 1, "gave_up": 1}
