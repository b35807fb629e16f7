"""Two ledger deltas of one tools step (a retry inside it) compose into the one delta the
step writes: applying it equals applying the two in order."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from langgraph_resilience._graph.state import compose_deltas, merge_tally


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
    """merge(L, compose_deltas(a, b)) == merge(merge(L, a), b), on a ledger with history."""
    before = merge_tally(
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

    in_order = merge_tally(merge_tally(before, FIRST), THEN)
    at_once = merge_tally(before, compose_deltas(FIRST, THEN))

    assert _without_rev(at_once) == _without_rev(in_order)


def test_the_later_record_of_a_call_stands() -> None:
    """The retried call's record is its last run's; counters add up."""
    delta = compose_deltas(FIRST, THEN)

    assert delta["calls"]["m1:0"]["attempts"] == 2
    assert delta["calls"]["m1:0"]["status"] == "failed"
    assert delta["calls"]["m1:1"]["status"] == "ok"
    assert delta["tool_attempts"] == 3
    assert delta["task"]["tool_attempts"] == 3
    assert delta["task"]["started_at"] == 10.0
    assert delta["events"] == {"attempt": 3, "retry_scheduled": 1, "gave_up": 1}


# ---------------------------------------------------------------------------- property

_KEYS = st.sampled_from([f"tool:{i}" for i in range(6)])
_SLOTS = ["m1:0", "m1:1", "m1:2"]
_STATUS = st.sampled_from(["scheduled", "repair", "ok", "failed"])


def _sections(draw: st.DrawFn, calls: dict[str, Any], seen: Any, failed: Any) -> Any:
    """A delta around its call records: task counters and loop-guard maps, the thread's
    counters, and (sometimes) the effect and structural sections."""
    task: dict[str, Any] = {"id": "t1", "tool_attempts": draw(st.integers(0, 3))}
    task["seen"] = draw(st.dictionaries(_KEYS, seen, max_size=3))
    task["failed"] = draw(st.dictionaries(_KEYS, failed, max_size=3))
    task["recent"] = draw(st.lists(_KEYS, max_size=10))
    if draw(st.booleans()):
        task["started_at"] = draw(st.floats(0, 1e6, allow_nan=False))
    delta: dict[str, Any] = {
        "calls": calls,
        "task": task,
        "tool_attempts": draw(st.integers(0, 3)),
        "events": draw(st.dictionaries(st.sampled_from(["attempt", "gave_up"]), st.integers(0, 3))),
    }
    optional = {
        "gone": st.dictionaries(st.sampled_from(["geo", "map"]), st.floats(0, 1e6), min_size=1),
        "informed": st.dictionaries(st.sampled_from(["k1", "k2"]), st.just("t1"), min_size=1),
        "held": st.dictionaries(_KEYS, st.integers(1, 2), min_size=1, max_size=3),
    }
    for name, strategy in optional.items():
        if draw(st.booleans()):
            delta[name] = draw(strategy)
    if draw(st.booleans()):
        delta["done"] = {"ok": draw(st.integers(1, 2))}
        delta["message"] = "m1"
    return delta


@st.composite
def _step(draw: st.DrawFn) -> tuple[Any, Any, Any]:
    """A ledger's history, and two deltas of one tools step as a retry inside it writes
    them: the second run re-executes only calls the first scheduled, one attempt more;
    it issues nothing (the loop guard's counts only go down, failures up)."""
    old = {slot: _record(draw(st.integers(1, 3)), draw(_STATUS)) for slot in ("m0:0", "m0:1")}
    history = _sections(draw, old, st.integers(1, 2), st.integers(0, 1))
    first_calls = {
        slot: _record(draw(st.integers(1, 3)), draw(_STATUS))
        for slot in draw(st.lists(st.sampled_from(_SLOTS), unique=True, max_size=3))
    }
    first = _sections(draw, first_calls, st.integers(-1, 1), st.integers(0, 1))
    seen = history["task"]["seen"]  # a first-run give-up is of a call issued before
    first["task"]["seen"] = {k: c for k, c in first["task"]["seen"].items() if c >= 0 or k in seen}
    then_calls = {
        slot: _record(record["attempts"] + 1, draw(_STATUS))
        for slot, record in first_calls.items()
        if record["status"] == "scheduled" and draw(st.booleans())
    }
    then = _sections(draw, then_calls, st.just(-1), st.just(1))
    counted = dict(history["task"]["seen"])
    for key, count in first["task"]["seen"].items():
        counted[key] = counted.get(key, 0) + count
    # a call given up in the second run was issued before: its count is still there
    then["task"]["seen"] = {k: -1 for k in then["task"]["seen"] if counted.get(k, 0) > 0}
    return history, first, then


@settings(deadline=None, max_examples=300)
@given(step=_step())
def test_composing_two_step_deltas_equals_applying_them_in_order(step: Any) -> None:
    """For any ledger and two deltas of one tools step, applying the composed delta gives
    the ledger applying the two in order gives (but for its revision)."""
    history, first, then = step
    before = merge_tally(None, history)
    in_order = merge_tally(merge_tally(before, first), then)
    at_once = merge_tally(before, compose_deltas(first, then))
    assert _without_rev(at_once) == _without_rev(in_order)
