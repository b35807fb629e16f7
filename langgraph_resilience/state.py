"""`ResilienceState` and the per-thread ledger, merged by a reducer.

The ledger is the checkpointed memory of recovery: how often each call ran,
which calls wait for a retry and when, what the thread has spent. Because it
lives in graph state it survives a crash and a resume, so no budget resets
(LangGraph's `RetryPolicy` counter lives in memory and does).

Writes to the ``resilience`` channel are *deltas*, merged by `merge_ledger`:
call records merge per call id (the record with more attempts wins, ties go to
the newer write), counters add up. Parallel writers in one super-step
therefore never lose an update. Everything in it is plain JSON, so every
LangGraph checkpointer stores it without custom serializers.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, NotRequired

from langchain_core.messages import AIMessage, AnyMessage
from typing_extensions import TypedDict

__all__ = [
    "CallRecord",
    "PLAN_CALL_PREFIX",
    "RECENT_KEYS",
    "Ledger",
    "ResilienceLedger",
    "ResilienceState",
    "empty_ledger",
    "current_tool_call_ids",
    "last_ai_message",
    "merge_ledger",
    "read_ledger",
    "read_messages",
]

CallStatus = Literal["scheduled", "repair", "replan", "escalate", "ok", "failed"]
"""scheduled: waits for (re-)execution at `due`; repair / replan / escalate: waits
for that recovery node; ok / failed: answered with a ToolMessage."""

PLAN_CALL_PREFIX = "replan-"
"""Tool-call ids of replan steps start with this: the executor issued them."""

RECENT_KEYS = 8
"""How many recently issued call keys the ledger keeps (loop patterns)."""


class CallRecord(TypedDict):
    """What the ledger knows about one tool call (keyed by its tool_call_id).

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


class Ledger(TypedDict, total=False):
    """The per-thread ledger held in the ``resilience`` channel."""

    calls: dict[str, CallRecord]
    tool_attempts: int
    """Tool executions in this thread, across every tool and recovery path."""
    started_at: float | None
    """Wall-clock time of the thread's first tool execution (deadline origin)."""
    events: dict[str, int]
    """How many events of each kind the thread emitted."""
    llm_calls: int
    """LLM calls spent on recovery (repairs, replans) in this thread."""
    seen: dict[str, int]
    """Issued calls per call key (retries of one call id do not count): loop guard."""
    recent: list[str]
    """The last `RECENT_KEYS` issued call keys, oldest first: loop patterns."""
    replans: int
    """Planner attempts in this thread (accepted or rejected), bounded by max_replans."""
    plan: dict[str, Any] | None
    """The current replan, as JSON: the plan, its status, finished steps and outputs.
    Written whole (last writer wins): only the planner and executor write it."""
    aborted: bool
    """A human aborted the task; once true it stays true."""
    gone: dict[str, float]
    """Tools that answered STRUCTURAL when executed (404/410, contract gone), with the
    wall-clock time of the latest such answer: `policy.structural_memory` applies."""


def empty_ledger() -> Ledger:
    """A ledger with nothing spent."""
    return {
        "calls": {},
        "tool_attempts": 0,
        "llm_calls": 0,
        "started_at": None,
        "events": {},
        "seen": {},
        "recent": [],
        "replans": 0,
        "plan": None,
        "aborted": False,
        "gone": {},
    }


def merge_ledger(current: Ledger | None, update: Ledger | None) -> Ledger:
    """Reducer of the ``resilience`` channel: apply a delta to the ledger.

    Copy-on-write: the result shares the containers the delta does not touch with
    `current`, and replaces (never mutates) those it does, so a checkpointed value
    is never changed in place and a step pays only for what it wrote.

    >>> a = merge_ledger(None, {"tool_attempts": 1, "events": {"attempt": 1}})
    >>> merge_ledger(a, {"tool_attempts": 2, "events": {"attempt": 2}})["tool_attempts"]
    3
    """
    merged = empty_ledger()
    if current:
        for name, value in current.items():
            if value is not None:
                merged[name] = value  # type: ignore[literal-required]
    if not update:
        return merged
    delta_calls = update.get("calls")
    if delta_calls:
        calls = dict(merged["calls"])
        for call_id, record in delta_calls.items():
            existing = calls.get(call_id)
            if existing is None or record["attempts"] >= existing["attempts"]:
                calls[call_id] = record
        merged["calls"] = calls
    if update.get("tool_attempts"):
        merged["tool_attempts"] = int(merged["tool_attempts"]) + int(update["tool_attempts"])
    if update.get("llm_calls"):
        merged["llm_calls"] = int(merged["llm_calls"]) + int(update["llm_calls"])
    if update.get("replans"):
        merged["replans"] = int(merged["replans"]) + int(update["replans"])
    if "plan" in update:
        merged["plan"] = update["plan"]
    if update.get("aborted"):
        merged["aborted"] = True
    started = update.get("started_at")
    if started is not None:
        known = merged.get("started_at")
        merged["started_at"] = started if known is None else min(known, started)
    if update.get("events"):
        merged["events"] = _added(merged["events"], update["events"])
    if update.get("seen"):
        merged["seen"] = _added(merged["seen"], update["seen"])
    if update.get("recent"):
        merged["recent"] = [*merged["recent"], *update["recent"]][-RECENT_KEYS:]
    if update.get("gone"):
        gone = dict(merged["gone"])
        for tool, at in update["gone"].items():
            gone[tool] = max(at, gone.get(tool, at))
        merged["gone"] = gone
    return merged


def _added(totals: dict[str, int], delta: dict[str, int]) -> dict[str, int]:
    """A new count map: `totals` plus `delta`."""
    added = dict(totals)
    for name, count in delta.items():
        added[name] = added.get(name, 0) + int(count)
    return added


ResilienceLedger = Annotated[Ledger, merge_ledger]
"""The channel type, for states that cannot inherit `ResilienceState`:
``resilience: ResilienceLedger`` declares the same channel."""


class ResilienceState(TypedDict, total=False):
    """Mix into your graph state: ``class State(MessagesState, ResilienceState): ...``.

    It is a `typing_extensions.TypedDict`, like LangGraph's `MessagesState`; a
    state built on `typing.TypedDict` declares ``resilience: ResilienceLedger``.
    """

    resilience: ResilienceLedger


def read_ledger(state: Any) -> Ledger:
    """The ledger in a graph state (dict or object), or an empty one."""
    value = (
        state.get("resilience") if isinstance(state, dict) else getattr(state, "resilience", None)
    )
    return value if value else empty_ledger()


def read_messages(state: Any, messages_key: str) -> list[AnyMessage]:
    """The message list in a graph state (dict or object)."""
    if isinstance(state, dict):
        return list(state.get(messages_key) or [])
    return list(getattr(state, messages_key, None) or [])


def last_ai_message(messages: list[AnyMessage]) -> tuple[int, AIMessage] | None:
    """The index and value of the latest `AIMessage`, or None."""
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, AIMessage):
            return index, message
    return None


def current_tool_call_ids(state: Any, messages_key: str) -> list[str]:
    """Ids of every call (valid or invalid) in the latest `AIMessage`."""
    found = last_ai_message(read_messages(state, messages_key))
    if found is None:
        return []
    ai = found[1]
    ids = [call["id"] for call in ai.tool_calls if call.get("id")]
    ids += [call["id"] for call in ai.invalid_tool_calls if call.get("id")]
    return [i for i in ids if i is not None]
