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

    >>> a = merge_ledger(None, {"tool_attempts": 1, "events": {"attempt": 1}})
    >>> merge_ledger(a, {"tool_attempts": 2, "events": {"attempt": 2}})["tool_attempts"]
    3
    """
    merged = empty_ledger()
    if current:
        merged["calls"] = dict(current.get("calls") or {})
        merged["tool_attempts"] = int(current.get("tool_attempts") or 0)
        merged["llm_calls"] = int(current.get("llm_calls") or 0)
        merged["started_at"] = current.get("started_at")
        merged["events"] = dict(current.get("events") or {})
        merged["seen"] = dict(current.get("seen") or {})
        merged["recent"] = list(current.get("recent") or [])
        merged["replans"] = int(current.get("replans") or 0)
        merged["plan"] = current.get("plan")
        merged["aborted"] = bool(current.get("aborted"))
        merged["gone"] = dict(current.get("gone") or {})
    if not update:
        return merged
    calls = merged["calls"]
    for call_id, record in (update.get("calls") or {}).items():
        existing = calls.get(call_id)
        if existing is None or record["attempts"] >= existing["attempts"]:
            calls[call_id] = record
    merged["tool_attempts"] = merged["tool_attempts"] + int(update.get("tool_attempts") or 0)
    merged["llm_calls"] = merged["llm_calls"] + int(update.get("llm_calls") or 0)
    merged["replans"] = merged["replans"] + int(update.get("replans") or 0)
    if "plan" in update:
        merged["plan"] = update["plan"]
    merged["aborted"] = merged["aborted"] or bool(update.get("aborted"))
    started = [t for t in (merged.get("started_at"), update.get("started_at")) if t is not None]
    merged["started_at"] = min(started) if started else None
    for tool, at in (update.get("gone") or {}).items():
        merged["gone"][tool] = max(at, merged["gone"].get(tool, at))
    _add_counts(merged["events"], update.get("events"))
    _add_counts(merged["seen"], update.get("seen"))
    merged["recent"] = (merged["recent"] + list(update.get("recent") or []))[-RECENT_KEYS:]
    return merged


def _add_counts(totals: dict[str, int], delta: dict[str, int] | None) -> None:
    for name, count in (delta or {}).items():
        totals[name] = totals.get(name, 0) + int(count)


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
