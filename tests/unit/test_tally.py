"""The per-thread tally and its reducer, `merge_tally`."""

import random
import warnings
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from langgraph_resilience._graph.state import (
    INFORMED_KEYS,
    SEEN_KEYS,
    CallRecord,
    Tally,
    empty_tally,
    merge_tally,
    read_tally,
    task_view,
)
from langgraph_resilience.core import classify
from langgraph_resilience.testing import FakeHTTPError


def _record(attempts: int, *, status: str = "failed", tool: str = "search", **extra: Any) -> Any:
    record: dict[str, Any] = {
        "tool": tool,
        "key": f"{tool}:0123456789abcdef0123",
        "attempts": attempts,
        "status": status,
        "due": None,
        "error": None,
    }
    record.update(extra)
    return record


# ----------------------------------------------------------------------- None and empty


def test_merging_nothing_gives_an_empty_ledger() -> None:
    """No current value and no update is a tally with nothing spent."""
    merged = merge_tally(None, None)
    assert merged == empty_tally()
    assert merged["calls"] == {}
    assert merged["tool_attempts"] == 0
    assert merged["task"]["started_at"] is None
    assert merged["events"] == {}


def test_none_update_keeps_the_current_ledger() -> None:
    """A None (or empty) delta changes nothing."""
    current = merge_tally(
        None, {"tool_attempts": 2, "task": {"started_at": 5.0}, "events": {"a": 1}}
    )
    for update in (None, {}):
        merged = merge_tally(current, update)  # type: ignore[arg-type]
        assert merged["tool_attempts"] == 2
        assert merged["task"]["started_at"] == 5.0
        assert merged["events"] == {"a": 1}


def test_first_delta_becomes_the_ledger() -> None:
    """A delta applied to no tally is filled out with defaults."""
    merged = merge_tally(None, {"calls": {"c1": _record(1)}})
    assert merged["calls"] == {"c1": _record(1)}
    assert merged["tool_attempts"] == 0
    assert merged["task"]["started_at"] is None


def test_merge_does_not_mutate_its_inputs() -> None:
    """The reducer returns a new tally; checkpointed values are never changed in place."""
    current: Tally = {
        "calls": {"c1": _record(1)},
        "tool_attempts": 1,
        "task": {"id": "h1", "started_at": 2.0},
        "events": {"attempt": 1},
    }
    update: Tally = {
        "calls": {"c1": _record(2), "c2": _record(1)},
        "tool_attempts": 2,
        "events": {"attempt": 2},
    }
    snapshot = (repr(current), repr(update))
    merge_tally(current, update)
    assert (repr(current), repr(update)) == snapshot


def test_merging_into_a_merged_ledger_leaves_it_and_its_task_untouched() -> None:
    """The reducer's own output (every section present) takes the short path: the new
    tally shares what the delta did not touch and never writes into the old one."""
    current = merge_tally(
        None, {"task": {"id": "h1", "seen": {"k": 1}, "recent": ["k"]}, "tool_attempts": 1}
    )
    snapshot = repr(current)
    merged = merge_tally(current, {"task": {"id": "h1", "seen": {"k": 1}, "recent": ["k"]}})
    assert repr(current) == snapshot
    assert merged["task"]["seen"] == {"k": 2}
    assert merged["task"]["recent"] == ["k", "k"]
    assert merged["gone"] is current["gone"]  # untouched sections are shared
    assert task_view(merged, "h1") is merged["task"]  # a complete section is not copied


def test_a_ledger_with_none_sections_is_filled_before_merging() -> None:
    """A tally written by hand or by an older version (``None`` or missing sections)
    merges as if those sections were empty."""
    old: Any = {"calls": None, "events": None, "task": {"id": "h1"}, "rev": 3}
    merged = merge_tally(old, {"events": {"attempt": 1}, "tool_attempts": 1})
    assert merged["calls"] == {}
    assert merged["events"] == {"attempt": 1}
    assert merged["gone"] == {}
    assert merged["rev"] == 4
    assert task_view(merged, "h1")["seen"] == {}


# ---------------------------------------------------------------------------- counters


def test_counters_add_up() -> None:
    """tool_attempts and events are deltas: they add, never overwrite."""
    tally = merge_tally(None, {"tool_attempts": 1, "events": {"attempt": 1}})
    tally = merge_tally(tally, {"tool_attempts": 2, "events": {"attempt": 2, "retry": 1}})
    tally = merge_tally(tally, {"events": {"retry": 3}})
    assert tally["tool_attempts"] == 3
    assert tally["events"] == {"attempt": 3, "retry": 4}


def test_missing_or_none_counters_count_as_zero() -> None:
    """A delta without a counter (or with None) adds nothing."""
    tally = merge_tally(None, {"tool_attempts": 4})
    tally = merge_tally(tally, {"tool_attempts": None, "events": None})  # type: ignore[typeddict-item]
    assert tally["tool_attempts"] == 4
    assert tally["events"] == {}


# -------------------------------------------------------------------------- call records


def test_call_records_merge_per_call_id() -> None:
    """Records of different calls coexist."""
    tally = merge_tally(None, {"calls": {"c1": _record(1)}})
    tally = merge_tally(tally, {"calls": {"c2": _record(1, tool="lookup")}})
    assert set(tally["calls"]) == {"c1", "c2"}
    assert tally["calls"]["c2"]["tool"] == "lookup"


def test_record_with_more_attempts_wins() -> None:
    """A newer record for a call replaces an older one."""
    tally = merge_tally(None, {"calls": {"c1": _record(1, status="scheduled")}})
    tally = merge_tally(tally, {"calls": {"c1": _record(2, status="ok")}})
    assert tally["calls"]["c1"]["attempts"] == 2
    assert tally["calls"]["c1"]["status"] == "ok"


def test_stale_record_with_fewer_attempts_loses() -> None:
    """A late write of an older record never rolls a call back."""
    tally = merge_tally(None, {"calls": {"c1": _record(3, status="ok")}})
    tally = merge_tally(tally, {"calls": {"c1": _record(2, status="scheduled")}})
    assert tally["calls"]["c1"] == _record(3, status="ok")


def test_tie_goes_to_the_update() -> None:
    """With equal attempts the newer write (e.g. scheduled -> failed) wins."""
    tally = merge_tally(None, {"calls": {"c1": _record(2, status="scheduled", due=9.0)}})
    tally = merge_tally(tally, {"calls": {"c1": _record(2, status="failed")}})
    assert tally["calls"]["c1"]["status"] == "failed"
    assert tally["calls"]["c1"]["due"] is None


def test_unrelated_records_survive_an_update() -> None:
    """Updating one call leaves the others as they were."""
    tally = merge_tally(None, {"calls": {"c1": _record(1), "c2": _record(2)}})
    tally = merge_tally(tally, {"calls": {"c1": _record(2)}})
    assert tally["calls"]["c2"] == _record(2)


# ---------------------------------------------------------------------------- started_at


def _start(tally: Tally) -> float | None:
    return tally["task"]["started_at"]


def test_started_at_takes_the_earliest() -> None:
    """The deadline origin is the task's first tool execution, whichever write arrives first."""
    tally = merge_tally(None, {"task": {"started_at": 20.0}})
    assert _start(merge_tally(tally, {"task": {"started_at": 10.0}})) == 10.0
    assert _start(merge_tally(tally, {"task": {"started_at": 30.0}})) == 20.0


def test_started_at_none_never_erases_a_start() -> None:
    """A delta without a start keeps the known one; a first start is adopted."""
    tally = merge_tally(None, {"task": {"started_at": 20.0}})
    assert _start(merge_tally(tally, {"task": {"started_at": None}})) == 20.0
    assert _start(merge_tally(tally, {"tool_attempts": 1})) == 20.0
    assert _start(merge_tally(merge_tally(None, {}), {"task": {"started_at": 7.5}})) == 7.5


def test_a_new_task_starts_with_nothing_spent() -> None:
    """A delta naming another task starts a fresh task section; lifetime counters go on."""
    first = merge_tally(
        None,
        {
            "tool_attempts": 3,
            "task": {"id": "h1", "tool_attempts": 3, "seen": {"k": 2}, "aborted": True},
        },
    )
    same = merge_tally(first, {"task": {"id": "h1", "tool_attempts": 1, "seen": {"k": 1}}})
    assert (same["task"]["tool_attempts"], same["task"]["seen"]) == (4, {"k": 3})
    nxt = merge_tally(same, {"tool_attempts": 1, "task": {"id": "h2", "tool_attempts": 1}})
    assert nxt["task"]["id"] == "h2"
    assert (nxt["task"]["tool_attempts"], nxt["task"]["seen"], nxt["task"]["aborted"]) == (
        1,
        {},
        False,
    )
    assert nxt["tool_attempts"] == 4


def test_a_whole_ledger_replaces_an_older_one_instead_of_adding() -> None:
    """A subgraph hands its whole tally back to the parent: counts are not doubled."""
    parent = merge_tally(None, {"tool_attempts": 3, "task": {"id": "h1", "tool_attempts": 3}})
    child = merge_tally(
        merge_tally(None, parent), {"tool_attempts": 1, "task": {"id": "h1", "tool_attempts": 1}}
    )
    back = merge_tally(parent, child)
    assert back["tool_attempts"] == 4
    assert back["task"]["tool_attempts"] == 4
    assert merge_tally(back, parent)["tool_attempts"] == 4  # an older whole tally loses


def test_gone_tools_keep_their_latest_structural_answer() -> None:
    """Parallel or late writes never move a tool's last STRUCTURAL answer back in time."""
    tally = merge_tally(None, {"gone": {"geo": 20.0}})
    assert merge_tally(tally, {"gone": {"geo": 10.0}})["gone"] == {"geo": 20.0}
    both = merge_tally(tally, {"gone": {"geo": 30.0, "map": 5.0}})
    assert both["gone"] == {"geo": 30.0, "map": 5.0}
    assert tally["gone"] == {"geo": 20.0}  # the input is not mutated


# ---------------------------------------------------------------------------- properties

_DELTAS = st.lists(
    st.fixed_dictionaries(
        {},
        optional={
            "tool_attempts": st.integers(0, 5),
            "events": st.dictionaries(
                st.sampled_from(["attempt", "retry", "backoff", "give_up"]),
                st.integers(0, 5),
                max_size=4,
            ),
            "task": st.fixed_dictionaries(
                {}, optional={"started_at": st.none() | st.floats(0, 1e10, allow_nan=False)}
            ),
            "calls": st.dictionaries(
                st.sampled_from(["c1", "c2", "c3"]),
                st.integers(1, 5).map(_record),
                max_size=3,
            ),
        },
    ),
    max_size=8,
)


def _fold(deltas: list[Any], start: Tally | None = None) -> Tally:
    tally = start
    for delta in deltas:
        tally = merge_tally(tally, delta)
    return merge_tally(tally, None)


@settings(deadline=None)
@given(deltas=_DELTAS, seed=st.integers(0, 2**32 - 1))
def test_merge_order_never_changes_the_totals(deltas: list[Any], seed: int) -> None:
    """Parallel writers in any order give the same counters, start and attempt counts."""
    shuffled = list(deltas)
    random.Random(seed).shuffle(shuffled)
    a, b = _fold(deltas), _fold(shuffled)
    assert (
        a["tool_attempts"] == b["tool_attempts"] == sum(d.get("tool_attempts", 0) for d in deltas)
    )
    assert a["events"] == b["events"]
    assert _start(a) == _start(b)
    assert {k: r["attempts"] for k, r in a["calls"].items()} == {
        k: r["attempts"] for k, r in b["calls"].items()
    }


@settings(deadline=None)
@given(deltas=_DELTAS, split=st.integers(0, 8))
def test_merge_is_associative_for_totals(deltas: list[Any], split: int) -> None:
    """Folding the deltas in two halves, the second onto the first, gives the same totals
    as folding them at once."""
    left, right = deltas[:split], deltas[split:]
    combined = _fold(right, _fold(left))
    whole = _fold(deltas)
    assert combined["tool_attempts"] == whole["tool_attempts"]
    assert combined["events"] == whole["events"]
    assert _start(combined) == _start(whole)


@settings(deadline=None)
@given(deltas=_DELTAS)
def test_calls_keep_their_highest_attempt_count(deltas: list[Any]) -> None:
    """Each call's merged record has the maximum attempts written for it."""
    merged = _fold(deltas)
    for call_id, record in merged["calls"].items():
        written = [d["calls"][call_id]["attempts"] for d in deltas if call_id in d.get("calls", {})]
        assert record["attempts"] == max(written)


# ------------------------------------------------------------------------- serialization


def _realistic_ledger() -> Tally:
    error = classify(
        FakeHTTPError(503, headers={"Retry-After": "2"}), tool="search", call_id="c1", attempt=1
    )
    record: CallRecord = {
        "tool": "search",
        "key": "search:0123456789abcdef0123",
        "attempts": 1,
        "status": "scheduled",
        "due": 1_700_000_002.25,
        "error": error.model_dump(mode="json"),
    }
    return merge_tally(
        None,
        {
            "calls": {"c1": record, "c2": _record(2, status="ok")},
            "tool_attempts": 3,
            "task": {"id": "h1", "started_at": 1_700_000_000.125},
            "events": {"attempt": 3, "retry_scheduled": 1},
        },
    )


def test_ledger_round_trips_through_the_checkpoint_serializer() -> None:
    """LangGraph's JsonPlusSerializer stores and restores the tally unchanged, silently."""
    serde = JsonPlusSerializer()
    tally = _realistic_ledger()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        restored = serde.loads_typed(serde.dumps_typed(tally))
    assert restored == tally
    assert restored["calls"]["c1"]["error"]["failure_class"] == "transient"


def test_empty_ledger_round_trips_through_the_checkpoint_serializer() -> None:
    """Even the empty tally (None start, empty maps) survives a checkpoint."""
    serde = JsonPlusSerializer()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert serde.loads_typed(serde.dumps_typed(empty_tally())) == empty_tally()


def test_read_ledger_of_a_state_without_one_is_empty() -> None:
    """A fresh thread (no channel value yet) reads as an empty tally."""
    assert read_tally({}) == empty_tally()
    assert read_tally({"resilience": None}) == empty_tally()
    tally = _realistic_ledger()
    assert read_tally({"resilience": tally}) is tally


# ----------------------------------------------------------------------- bounded


def _turn(tally: Tally | None, turn: int, *, recovered: bool = False) -> Tally:
    """One task's tools step: two calls of a new assistant message, answered."""
    first = _record(2 if recovered else 1, status="ok", key=f"search:{turn:020d}")
    if recovered:
        first["error"] = {"type": "HTTPError", "failure_class": "transient"}
    delta: Any = {
        "calls": {f"ai{turn}:0": first, f"ai{turn}:1": _record(1, status="ok")},
        "task": {"id": f"h{turn}", "tool_attempts": 2, "seen": {f"k{turn}": 1}},
        "tool_attempts": 2,
        "events": {"attempt": 2},
    }
    return merge_tally(tally, delta)


def _size(tally: Tally) -> int:
    return len(JsonPlusSerializer().dumps_typed(tally)[1])


def test_the_ledger_does_not_grow_with_the_thread() -> None:
    """After 5,000 calls the channel is the size it was after 100, and far below 20 KB;
    the counters still count every call."""
    tally: Tally | None = None
    sizes = {}
    for turn in range(2500):
        tally = _turn(tally, turn, recovered=turn % 7 == 0)
        if turn + 1 in (50, 2500):
            sizes[turn + 1] = _size(tally)
    assert tally is not None
    assert sizes[2500] <= sizes[50] + 16  # only the counters' digits grow
    assert sizes[2500] < 20_000
    assert tally["tool_attempts"] == 5000
    assert sum(tally["done"].values()) + len(tally["calls"]) == 5000


def test_a_clean_success_is_dropped_and_counted_at_once() -> None:
    """One attempt, nothing recovered: its ToolMessage says everything."""
    merged = merge_tally(None, {"calls": {"m:0": _record(1, status="ok")}})
    assert merged["calls"] == {}
    assert merged["done"] == {"ok": 1}


def test_a_recovered_call_stays_for_audit_until_the_next_message() -> None:
    """A call that recovered (or failed) keeps its record while its message is the
    latest; the next message's calls drop it, and it is counted."""
    recovered = _record(2, status="ok", error={"type": "HTTPError"})
    tally = merge_tally(None, {"calls": {"m1:0": recovered, "m1:1": _record(3)}})
    assert set(tally["calls"]) == {"m1:0", "m1:1"}
    tally = merge_tally(tally, {"events": {"route": 1}})  # no calls: nothing dropped
    assert set(tally["calls"]) == {"m1:0", "m1:1"}
    tally = merge_tally(tally, {"calls": {"m2:0": _record(1, status="scheduled")}})
    assert set(tally["calls"]) == {"m2:0"}
    assert tally["done"] == {"ok": 1, "failed": 1}


def test_unresolved_calls_are_never_dropped() -> None:
    """A call waiting for a retry, a repair, a replan or a human keeps its record, with its
    full arguments, whatever comes after it."""
    big = {"text": "x" * 5000}
    waiting = {
        f"m1:{i}": _record(1, status=status, args=big)
        for i, status in enumerate(("scheduled", "repair", "replan", "escalate"))
    }
    tally = merge_tally(None, {"calls": waiting})
    for turn in range(20):
        tally = _turn(tally, turn)
    assert {slot: r["args"] for slot, r in tally["calls"].items()} == dict.fromkeys(waiting, big)


def test_a_kept_finished_records_large_arguments_are_stored_by_digest() -> None:
    """Audit keeps what the arguments were (digest and size), not the megabytes."""
    big = {"text": "x" * 5000}
    trail = [{"args": big, "error": {"type": "ValueError"}}, {"args": {"n": 1}, "error": {}}]
    record = _record(2, status="ok", args=big, trail=trail, error={"type": "ValueError"})
    kept = merge_tally(None, {"calls": {"m:0": record}})["calls"]["m:0"]
    assert kept["args"] == {"sha256": kept["args"]["sha256"], "bytes": 5011}
    assert len(kept["args"]["sha256"]) == 64
    assert kept["trail"][0]["args"] == kept["args"]
    assert kept["trail"][1]["args"] == {"n": 1}
    assert _size({"calls": {"m:0": kept}}) < 1000  # type: ignore[typeddict-item]


def test_the_loop_guard_remembers_the_most_recent_distinct_calls() -> None:
    """`seen` keeps the SEEN_KEYS most recently counted keys: a hot key survives any
    number of others, and a decrement of a forgotten key does not go negative."""
    tally = merge_tally(None, {"task": {"id": "t", "seen": {"hot": 1}}})
    for i in range(3 * SEEN_KEYS):
        seen: dict[str, int] = {f"k{i}": 1}
        if i % 10 == 0:
            seen["hot"] = 1
        tally = merge_tally(tally, {"task": {"id": "t", "seen": seen}})
    task = tally["task"]
    assert len(task["seen"]) == SEEN_KEYS
    assert task["seen"]["hot"] == 1 + len(range(0, 3 * SEEN_KEYS, 10))
    assert "k0" not in task["seen"]
    tally = merge_tally(tally, {"task": {"id": "t", "seen": {"k0": -1}}})
    assert "k0" not in tally["task"]["seen"]


def test_informed_effects_are_bounded() -> None:
    """The agent-was-told map keeps the latest INFORMED_KEYS effects."""
    tally = merge_tally(None, None)
    for i in range(INFORMED_KEYS + 10):
        tally = merge_tally(tally, {"informed": {f"e{i}": "t"}})
    assert len(tally["informed"]) == INFORMED_KEYS
    assert f"e{INFORMED_KEYS + 9}" in tally["informed"]
    assert "e0" not in tally["informed"]


def test_a_step_that_only_counts_clean_successes_still_compacts() -> None:
    """A tools step whose calls all succeeded at once writes no records, only their count
    and its message: an earlier message's kept records go, the count adds up."""
    recovered = _record(2, status="ok", error={"type": "HTTPError"})
    tally = merge_tally(None, {"calls": {"m1:0": recovered}})
    tally = merge_tally(tally, {"calls": {}, "done": {"ok": 2}, "message": "m2"})
    assert tally["calls"] == {}
    assert tally["done"] == {"ok": 3}
    assert "message" not in tally
    kept = merge_tally(
        merge_tally(None, {"calls": {"m1:0": recovered}}), {"done": {"ok": 1}, "message": "m1"}
    )
    assert set(kept["calls"]) == {"m1:0"}  # its own message: kept for audit
