"""`ResilienceState` and the per-thread tally, merged by a reducer.

The tally is the checkpointed memory of recovery: how often each call ran,
which calls wait for a retry and when, what the current task has spent. Because
it lives in graph state it survives a crash and a resume, so no budget resets
(LangGraph's `RetryPolicy` counter lives in memory and does). It is a tally, not a
ledger: "ledger" in this package is the exactly-once ledger of side effects
(`stores`), which outlives the thread's checkpoints.

A call's identity is its *position* in the thread, its `call_slot`: the
assistant message it belongs to and its index there, never the provider's
tool-call id alone, since providers reuse ids (``call_0`` in every message, or a
counter that restarts with the process). The `ToolMessage` still answers the
provider's id.

A thread is a conversation of many tasks. A task is what one human message
asked for: budgets, the loop guard and an abort are scoped to it (the ``task``
section), so an ordinary long conversation never runs out of budget. Lifetime
counters (``tool_attempts``, ``llm_calls``, ``replans``, ``events``) keep
counting for the whole thread.

Writes to the ``resilience`` channel are *deltas*, merged by `merge_tally`:
call records merge per slot (the record with more attempts wins, ties go to
the newer write), counters add up, and a delta naming a new task starts a fresh
task section. Parallel writers in one super-step therefore never lose an
update. A whole tally (one that came out of `merge_tally`, e.g. a subgraph's
final state handed to its parent) carries a revision and *replaces* an older
one instead of being added to it. This module is the tally's only algebra:
`merge_tally` (the reducer), `compose_deltas` (two deltas of one step as one,
held by a property test to equal merging them in order) and `apply_update` (the
state an update leaves, for recovery steps run inside one node).

Everything in the tally is plain JSON, so every LangGraph checkpointer stores it
without custom serializers.

The tally is bounded: its size does not grow with the thread. A finished call
(``ok``/``failed``) is answered by its `ToolMessage`, so nothing decides on its
record any more (the planner reads the task's answered calls from its messages):
a clean success (one attempt, nothing recovered) is dropped at
once, and a recovered or failed call's record (the audit `explain` shows) is
dropped when the calls of a later assistant message are recorded. Only the
count of dropped records stays (``done``). The loop guard remembers the
`SEEN_KEYS` most recently issued distinct calls of a task, ``informed`` the
`INFORMED_KEYS` latest effects, and a kept finished record's arguments larger
than `INLINE_ARGS_BYTES` are stored by digest. A tally written before this
bound (every record kept) loads as is and is compacted by its first delta.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Annotated, Any, Literal, NamedTuple, NotRequired

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolCall
from langgraph.graph.message import add_messages
from typing_extensions import TypedDict

__all__ = [
    "FINISHED",
    "HELD_KEYS",
    "INFORMED_KEYS",
    "INLINE_ARGS_BYTES",
    "PLAN_CALL_PREFIX",
    "RECENT_KEYS",
    "SEEN_KEYS",
    "CallRecord",
    "CallSlot",
    "Tally",
    "ResilienceTally",
    "ResilienceState",
    "TaskTally",
    "apply_update",
    "call_slot",
    "compose_deltas",
    "current_calls",
    "current_slots",
    "current_task",
    "empty_tally",
    "empty_task",
    "is_clean",
    "last_ai_message",
    "merge_tally",
    "message_slot",
    "read_tally",
    "read_messages",
    "task_view",
]

CallStatus = Literal["scheduled", "repair", "replan", "escalate", "ok", "failed"]
"""scheduled: waits for (re-)execution at `due`; repair / replan / escalate: waits
for that recovery node; ok / failed: answered with a ToolMessage."""

PLAN_CALL_PREFIX = "replan-"
"""Tool-call ids of replan steps start with this: the executor issued them."""

RECENT_KEYS = 8
"""How many recently issued call keys the tally keeps (loop patterns)."""

SEEN_KEYS = 64
"""How many distinct call keys a task's loop guard remembers (``seen``, ``failed``):
the most recently issued ones. A call repeated after 64 other distinct calls is not
counted as a repeat of the first."""

INFORMED_KEYS = 64
"""How many unknown-outcome effects the tally remembers telling the agent of."""

HELD_KEYS = 256
"""How many distinct side effects (tool + arguments) the tally counts as done."""

INLINE_ARGS_BYTES = 1024
"""A kept finished record's arguments above this size (as JSON) are stored by digest."""

FINISHED: frozenset[str] = frozenset({"ok", "failed"})
"""The statuses of an answered call, whose record nothing decides on any more."""


class CallRecord(TypedDict):
    """What the tally knows about one tool call (keyed by its `call_slot`).

    Optional keys: ``args`` (the arguments now in force, after coercion or
    repair), ``repairs`` (reflection repairs spent), ``trail`` (each failed
    attempt's arguments and error summary), ``coercions`` (lossless fixes).
    """

    tool: str
    key: str
    """`call_key(tool, args)`: the call's identity for loops and idempotency."""
    attempts: int
    """Executions so far. Only grows."""
    status: CallStatus
    due: float | None
    """Wall-clock time at which a scheduled retry may run."""
    error: dict[str, Any] | None
    """The last `ToolError`, as JSON (kept after a recovery, for audit)."""
    call_id: NotRequired[str]
    """The provider's tool-call id, which the call's `ToolMessage` answers."""
    args: NotRequired[dict[str, Any]]
    repairs: NotRequired[int]
    trail: NotRequired[list[dict[str, Any]]]
    coercions: NotRequired[list[str]]
    served_by: NotRequired[str]
    """The fallback tool now serving the call (the call keeps its id and name)."""
    origin_args: NotRequired[dict[str, Any]]
    """The agent's arguments, kept when a fallback adapts them."""
    tried: NotRequired[list[str]]
    """Tools that already failed this call: a fallback chain never returns to them."""
    tried_errors: NotRequired[list[dict[str, Any]]]
    """The envelopes of the tools in `tried`, in order (the planner sees them all)."""
    fallback_at: NotRequired[int]
    """`attempts` when the current fallback took over: its own attempts count from here."""
    item_keys: NotRequired[list[str]]
    """A redone batch call: the idempotency keys its items had on the first run."""
    done_items: NotRequired[list[Any]]
    """A batch call's items that succeeded in earlier (partial) runs."""
    approved: NotRequired[bool]
    """A human answered retry/edit: an effect of unknown outcome may run again."""
    loop_key: NotRequired[str]
    """The key the loop guard counted when the agent issued the call."""
    effect_key: NotRequired[str]
    """A side effect's idempotency key (set once one of its attempts failed)."""


class TaskTally(TypedDict, total=False):
    """What the current task (the turns since the latest human message) has spent."""

    id: str
    """The task: its human message's id (or ``#<index>``), ``""`` without one."""
    tool_attempts: int
    """Tool executions in this task, across every tool and recovery path."""
    started_at: float | None
    """Wall-clock time of the task's first tool execution (deadline origin)."""
    llm_calls: int
    """LLM calls spent on recovery (repairs, replans) in this task."""
    replans: int
    """Planner attempts in this task (accepted or rejected), bounded by max_replans."""
    seen: dict[str, int]
    """Issued calls per call key (retries of one call do not count): loop guard."""
    failed: dict[str, int]
    """Calls per key whose failure went back to the agent: its re-issue is not a loop
    (it leaves `seen`), but failing `loop_threshold` times is."""
    recent: list[str]
    """The last `RECENT_KEYS` issued call keys, oldest first: loop patterns."""
    aborted: bool
    """A human aborted the task; once true it stays true until the next task."""


class Tally(TypedDict, total=False):
    """The per-thread tally held in the ``resilience`` channel."""

    calls: dict[str, CallRecord]
    """Per `call_slot`: what happened to each call."""
    task: TaskTally
    """The current task's budgets and loop guard."""
    tool_attempts: int
    """Tool executions in this thread's whole life (the optional lifetime cap)."""
    events: dict[str, int]
    """How many events of each kind the thread emitted."""
    llm_calls: int
    """LLM calls spent on recovery in this thread's whole life."""
    replans: int
    """Planner attempts in this thread's whole life: numbers the plans."""
    plan: dict[str, Any] | None
    """The current replan, as JSON: the plan, its status, finished steps and outputs.
    Written whole (last writer wins): only the planner and executor write it."""
    gone: dict[str, float]
    """Tools that answered STRUCTURAL when executed (404/410, contract gone), with the
    wall-clock time of the latest such answer: `policy.structural_memory` applies."""
    held: dict[str, int]
    """Side effects done in this thread, by `call_key` (tool + canonical arguments): how
    many times. The side-effect ledger outlives a rewind of the thread (a rollback, a
    lost flush, a fork) and this count does not, so an effect done that the thread no
    longer holds is found and answered, not done again (the `HELD_KEYS` latest)."""
    informed: dict[str, str]
    """Side effects of unknown outcome the agent was told of: idempotency key -> task.
    In a later task the same effect asked for anew is not blocked by them (a new
    human request is informed, not a blind re-issue); in the same task it is."""
    message: str
    """In a delta only (never kept): the assistant message whose calls the step finished,
    as its slots' prefix, when `done` counts them instead of `calls` holding them."""
    done: dict[str, int]
    """Finished call records dropped from `calls`, by status: the thread's history of
    answered calls is in its messages, the tally keeps only their count. In a delta:
    clean successes the step counts instead of writing their records."""
    rev: int
    """Set on every merged (whole) tally, never on a delta: a whole tally written
    back (a subgraph's output) replaces an older one instead of adding to it."""


def empty_task(task_id: str = "") -> TaskTally:
    """A task with nothing spent."""
    return {
        "id": task_id,
        "tool_attempts": 0,
        "started_at": None,
        "llm_calls": 0,
        "replans": 0,
        "seen": {},
        "failed": {},
        "recent": [],
        "aborted": False,
    }


def empty_tally() -> Tally:
    """A tally with nothing spent."""
    return {
        "calls": {},
        "task": empty_task(),
        "tool_attempts": 0,
        "llm_calls": 0,
        "events": {},
        "replans": 0,
        "plan": None,
        "gone": {},
        "informed": {},
        "held": {},
        "rev": 0,
    }


def merge_tally(current: Tally | None, update: Tally | None) -> Tally:
    """Reducer of the ``resilience`` channel: apply a delta to the tally.

    Copy-on-write: the result shares the containers the delta does not touch with
    `current`, and replaces (never mutates) those it does, so a checkpointed value
    is never changed in place and a step pays only for what it wrote.

    >>> a = merge_tally(None, {"tool_attempts": 1, "events": {"attempt": 1}})
    >>> merge_tally(a, {"tool_attempts": 2, "events": {"attempt": 2}})["tool_attempts"]
    3
    """
    merged = _filled(current)
    if not update:
        return merged
    if "rev" in update:  # a whole tally: the newer one stands, nothing is added twice
        if int(update["rev"] or 0) < int(merged["rev"]):
            return merged
        whole = empty_tally()
        whole.update({k: v for k, v in update.items() if v is not None})  # type: ignore[typeddict-item]
        return whole
    merged["rev"] = int(merged["rev"]) + 1
    delta_calls = update.get("calls")
    dropped: dict[str, int] = dict(update.get("done") or {})
    message = update.get("message")
    if delta_calls or (message is not None and merged["calls"]):
        merged["calls"], compacted = _merge_calls(merged["calls"], delta_calls or {}, message)
        for status, count in compacted.items():
            dropped[status] = dropped.get(status, 0) + count
    if dropped:
        merged["done"] = _added(merged.get("done") or {}, dropped)
    for counter in ("tool_attempts", "llm_calls", "replans"):
        if update.get(counter):
            merged[counter] = int(merged[counter]) + int(update[counter])
    if "plan" in update:
        merged["plan"] = update["plan"]
    if update.get("task"):
        merged["task"] = _merge_task(merged["task"], update["task"])
    if update.get("events"):
        merged["events"] = _added(merged["events"], update["events"])
    if update.get("informed"):
        informed = {**merged["informed"], **update["informed"]}
        merged["informed"] = _latest(informed, INFORMED_KEYS)
    if update.get("held"):
        held = dict(merged.get("held") or {})
        for key, count in update["held"].items():
            held[key] = held.pop(key, 0) + int(count)  # re-inserted: the latest
        merged["held"] = _latest(held, HELD_KEYS)
    if update.get("gone"):
        merged["gone"] = _later_gone(merged["gone"], update["gone"])
    return merged


def compose_deltas(first: Tally, then: Tally) -> Tally:
    """Two deltas of one tools step (`then` written after `first`, as a retry inside the
    step does) as the one delta the step writes: ``merge_tally(L, compose_deltas(a,
    b))`` equals ``merge_tally(merge_tally(L, a), b)`` but for the revision (a
    property test holds it to that). Each section combines by `merge_tally`'s rule."""
    task_a, task_b = first.get("task") or {}, then.get("task") or {}
    task: TaskTally = {**task_a, **task_b}
    task["tool_attempts"] = int(task_a.get("tool_attempts") or 0) + int(
        task_b.get("tool_attempts") or 0
    )
    task["seen"] = _summed(task_a.get("seen") or {}, task_b.get("seen") or {})
    task["failed"] = _summed(task_a.get("failed") or {}, task_b.get("failed") or {})
    task["recent"] = [*(task_a.get("recent") or []), *(task_b.get("recent") or [])]
    starts = [at for at in (task_a.get("started_at"), task_b.get("started_at")) if at is not None]
    if starts:
        task["started_at"] = min(starts)
    delta: Tally = {
        "calls": _newer_calls(first.get("calls") or {}, then.get("calls") or {}),
        "task": task,
        "tool_attempts": int(first.get("tool_attempts") or 0) + int(then.get("tool_attempts") or 0),
        "events": _summed(first.get("events") or {}, then.get("events") or {}),
    }
    done = _summed(first.get("done") or {}, then.get("done") or {})
    if done:
        delta["done"] = done
        delta["message"] = then.get("message") or first.get("message") or ""
    gone = _later_gone(first.get("gone") or {}, then.get("gone") or {})
    if gone:
        delta["gone"] = gone
    informed = {**(first.get("informed") or {}), **(then.get("informed") or {})}
    if informed:
        delta["informed"] = informed
    held = _summed(first.get("held") or {}, then.get("held") or {})
    if held:
        delta["held"] = held
    return delta


def apply_update(
    state: Mapping[str, Any], update: Mapping[str, Any], messages_key: str = "messages"
) -> dict[str, Any]:
    """The state a node's `update` leaves, as the graph's reducers would make it: the
    tally merged, the messages added, any other key replaced. Recovery steps run in
    one node read it instead of waiting for the graph to apply each update."""
    new = dict(state)
    for key, value in update.items():
        if key == "resilience":
            new[key] = merge_tally(read_tally(state), value)
        elif key == messages_key:
            new[key] = add_messages(list(state.get(key) or []), list(value or []))
        else:
            new[key] = value
    return new


def _newer_calls(
    current: Mapping[str, CallRecord], delta: Mapping[str, CallRecord]
) -> dict[str, CallRecord]:
    """Call records with `delta`'s in: a call's record with the most attempts stands."""
    calls = dict(current)
    for slot, record in delta.items():
        existing = calls.get(slot)
        if existing is None or record["attempts"] >= existing["attempts"]:
            calls[slot] = record
    return calls


def _later_gone(current: Mapping[str, float], delta: Mapping[str, float]) -> dict[str, float]:
    """A tool's latest STRUCTURAL answer stands, whatever order the writes came in."""
    gone = dict(current)
    for tool, at in delta.items():
        gone[tool] = max(at, gone.get(tool, at))
    return gone


def _summed(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    summed = dict(a)
    for name, count in b.items():
        summed[name] = summed.get(name, 0) + int(count)
    return summed


def _filled(current: Tally | None) -> Tally:
    """A shallow copy of `current` with every section present (a merged tally has them
    all already: only a missing or None one is filled with a fresh empty value)."""
    if not current:
        return empty_tally()
    if "rev" in current and current.keys() >= _TALLY_SECTIONS:
        return {**current}  # merge_tally's own output: complete, no None but `plan`
    merged = empty_tally()
    for name, value in current.items():
        if value is not None:
            merged[name] = value  # type: ignore[literal-required]
    return merged


_TALLY_SECTIONS = frozenset(empty_tally())


def _merge_calls(
    current: dict[str, CallRecord], delta: dict[str, CallRecord], message: str | None
) -> tuple[dict[str, CallRecord], dict[str, int]]:
    """The call records with `delta` merged in, compacted: the records and the count of
    finished ones dropped, by status.

    A finished record goes when it holds nothing to audit (a clean success) or when
    the delta records calls of another assistant message (its own message is done);
    unresolved records always stay."""
    calls = _newer_calls(current, delta)
    messages = {slot.rpartition(":")[0] for slot in delta}
    if message is not None:
        messages.add(message)
    dropped: dict[str, int] = {}
    for slot in list(calls):
        record = calls[slot]
        status = record["status"]
        if status not in FINISHED:
            continue
        if is_clean(record) or slot.rpartition(":")[0] not in messages:
            del calls[slot]
            dropped[status] = dropped.get(status, 0) + 1
        elif slot in delta:
            calls[slot] = _slim(record)
    return calls, dropped


_AUDITED = frozenset({"trail", "coercions", "served_by", "repairs", "done_items", "tried"})


def is_clean(record: CallRecord) -> bool:
    """A success that recovered from nothing: its `ToolMessage` says all there is."""
    return (
        record["status"] == "ok"
        and record["error"] is None
        and record["attempts"] <= 1
        and _AUDITED.isdisjoint(record)
    )


def _slim(record: CallRecord) -> CallRecord:
    """A finished record kept for audit, its large arguments replaced by their digest."""
    large = [
        name
        for name in ("args", "origin_args")
        if name in record and _json_size(record[name]) > INLINE_ARGS_BYTES
    ]
    trail = record.get("trail") or []
    long_trail = any(_json_size(entry.get("args")) > INLINE_ARGS_BYTES for entry in trail)
    if not large and not long_trail:
        return record
    slim: CallRecord = {**record}
    for name in large:
        slim[name] = _digest(slim[name])
    if long_trail:
        slim["trail"] = [
            {**entry, "args": _digest(entry["args"])}
            if _json_size(entry.get("args")) > INLINE_ARGS_BYTES
            else entry
            for entry in trail
        ]
    return slim


def _json_size(value: Any) -> int:
    return len(json.dumps(value, default=str, separators=(",", ":")))


def _digest(value: Any) -> dict[str, Any]:
    """Large arguments by digest: what they were is checkable, not stored."""
    encoded = json.dumps(value, default=str, sort_keys=True, separators=(",", ":")).encode()
    return {"sha256": hashlib.sha256(encoded).hexdigest(), "bytes": len(encoded)}


def _latest(entries: dict[str, Any], limit: int) -> dict[str, Any]:
    """The `limit` most recently inserted entries."""
    if len(entries) <= limit:
        return entries
    return dict(list(entries.items())[-limit:])


def _merge_task(current: TaskTally, update: TaskTally) -> TaskTally:
    """A task delta: added to the current task, or the start of a new one."""
    task_id = update.get("id")
    merged: TaskTally = (
        empty_task(task_id) if task_id is not None and task_id != current.get("id") else current
    )
    if merged.keys() >= _TASK_SECTIONS:
        merged = {**merged}
    else:
        merged = {**empty_task(merged.get("id", "")), **merged}
    for counter in ("tool_attempts", "llm_calls", "replans"):
        if update.get(counter):
            merged[counter] = int(merged[counter]) + int(update[counter])
    started = update.get("started_at")
    if started is not None:
        known = merged.get("started_at")
        merged["started_at"] = started if known is None else min(known, started)
    if update.get("seen"):
        merged["seen"] = _added(merged["seen"], update["seen"], limit=SEEN_KEYS)
    if update.get("failed"):
        merged["failed"] = _added(merged["failed"], update["failed"], limit=SEEN_KEYS)
    if update.get("recent"):
        merged["recent"] = [*merged["recent"], *update["recent"]][-RECENT_KEYS:]
    if update.get("aborted"):
        merged["aborted"] = True
    return merged


_TASK_SECTIONS = frozenset(empty_task())


def _added(
    totals: dict[str, int], delta: dict[str, int], *, limit: int | None = None
) -> dict[str, int]:
    """A new count map: `totals` plus `delta` (entries that reach 0 are dropped).

    With `limit`, a counted entry moves to the end and only the `limit` most recently
    counted stay; a decrement of an entry already forgotten is ignored."""
    added = dict(totals)
    for name, count in delta.items():
        known = added.pop(name, None) if limit is not None else added.get(name)
        if known is None and limit is not None and int(count) < 0:
            continue
        total = (known or 0) + int(count)
        if total:
            added[name] = total
        else:
            added.pop(name, None)
    return _latest(added, limit) if limit is not None else added


ResilienceTally = Annotated[Tally, merge_tally]
"""The channel type, for states that cannot inherit `ResilienceState`:
``resilience: ResilienceTally`` declares the same channel."""


class ResilienceState(TypedDict, total=False):
    """Mix into your graph state: ``class State(MessagesState, ResilienceState): ...``.

    It is a `typing_extensions.TypedDict`, like LangGraph's `MessagesState`; a
    state built on `typing.TypedDict` declares ``resilience: ResilienceTally``.
    In a subgraph, give the parent the channel too (the subgraph's tally then
    replaces the parent's on the way out), or compile the subgraph with
    ``checkpointer=True`` so it keeps its own tally between parent turns.
    """

    resilience: ResilienceTally


def read_tally(state: Any) -> Tally:
    """The tally in a graph state (dict or object), or an empty one."""
    value = (
        state.get("resilience") if isinstance(state, dict) else getattr(state, "resilience", None)
    )
    return value if value else empty_tally()


def read_messages(state: Any, messages_key: str) -> Sequence[AnyMessage]:
    """The message list in a graph state (dict or object), not copied: a long history
    is read on every step, so callers read it and build new lists, never write it."""
    found = (
        state.get(messages_key) if isinstance(state, dict) else getattr(state, messages_key, None)
    )
    if isinstance(found, list):
        return found
    return list(found or [])


def last_ai_message(messages: Sequence[AnyMessage]) -> tuple[int, AIMessage] | None:
    """The index and value of the latest `AIMessage`, or None."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, AIMessage):
            return index, message
    return None


def current_task(messages: Sequence[AnyMessage]) -> str:
    """The current task's id: the latest human message's id (``#<index>`` when it has
    none), or ``""`` in a thread without human messages.

    >>> current_task([HumanMessage("hi", id="h1"), AIMessage("hello")])
    'h1'
    """
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, HumanMessage):
            return message.id or f"#{index}"
    return ""


def task_view(tally: Tally, task_id: str) -> TaskTally:
    """The tally's task section when it is `task_id`'s, else a fresh task (nothing of
    an earlier task counts in a new one). Read it, never write it."""
    task = tally.get("task")
    if task and task.get("id", "") == task_id:
        # read-only: a complete section is shared with the tally, not copied
        return task if task.keys() >= _TASK_SECTIONS else {**empty_task(task_id), **task}
    return empty_task(task_id)


def call_slot(ai: AIMessage, ai_index: int, position: int, *, invalid: bool = False) -> str:
    """A call's identity in the thread: its assistant message (the message id, else its
    index) and its position in that message's calls (``i<n>`` for an invalid call).

    >>> call_slot(AIMessage("", id="run-1"), 4, 0)
    'run-1:0'
    """
    return f"{message_slot(ai, ai_index)}:{'i' if invalid else ''}{position}"


def message_slot(ai: AIMessage, ai_index: int) -> str:
    """An assistant message's part of its calls' slots: its id, else its index.

    >>> message_slot(AIMessage("", id="run-1"), 4), message_slot(AIMessage(""), 4)
    ('run-1', '#4')
    """
    return ai.id or f"#{ai_index}"


class CallSlot(NamedTuple):
    """One call of the latest assistant message: its slot and the call itself."""

    slot: str
    call: ToolCall
    invalid: bool = False


def _slots(ai: AIMessage, ai_index: int) -> Iterator[CallSlot]:
    for position, call in enumerate(ai.tool_calls):
        yield CallSlot(call_slot(ai, ai_index, position), call)
    for position, bad in enumerate(ai.invalid_tool_calls):
        call = ToolCall(name=bad.get("name") or "", args={}, id=bad.get("id"), type="tool_call")
        yield CallSlot(call_slot(ai, ai_index, position, invalid=True), call, invalid=True)


def current_calls(state: Any, messages_key: str) -> list[CallSlot]:
    """Every call (valid or invalid) of the latest `AIMessage`, with its slot."""
    found = last_ai_message(read_messages(state, messages_key))
    if found is None:
        return []
    ai_index, ai = found
    return list(_slots(ai, ai_index))


def current_slots(state: Any, messages_key: str) -> list[str]:
    """The slots of every call of the latest `AIMessage`."""
    return [entry.slot for entry in current_calls(state, messages_key)]
