"""Every assistant tool call is answered before the model is called again.

OpenAI and Anthropic reject a history in which an assistant tool call has no
`ToolMessage` (a 400 on the next request). A run can leave one behind: the user
writes again instead of answering an escalation, a server cancels a run during a
backoff (double-texting), a crash loses the tools step. New input starts the graph
at ``START``, so `add_resilience` puts `AnswerPendingNode` there: it answers each
such call with an envelope saying what happened (``cancelled`` or ``abandoned``),
placed right after its assistant message, and settles the calls' ledger records,
as deepagents' PatchToolCalls middleware does for its agents.

The scan is a pure function (`answer_pending`); on a clean thread it writes
nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.types import Overwrite

from langgraph_resilience.errors import FailureClass, ToolError
from langgraph_resilience.events import Event, emit
from langgraph_resilience.graph.node import ResilienceNode
from langgraph_resilience.graph.state import (
    CallRecord,
    Ledger,
    call_slot,
    read_ledger,
    read_messages,
)
from langgraph_resilience.graph.tools import error_message

__all__ = ["AnswerPendingNode", "answer_pending"]

_WHY = {
    "escalate": (
        "abandoned",
        "the question to a human about this call was not answered: a new message "
        "arrived instead, so the call did not run",
    ),
    "scheduled": (
        "cancelled",
        "a retry of this call was waiting when the run stopped and a new message "
        "arrived; it was not run again",
    ),
}
_STOPPED = (
    "cancelled",
    "the run stopped before this call was answered and a new message arrived; it was not run",
)


def _envelope(call: Mapping[str, Any], record: CallRecord | None) -> ToolError:
    reason, text = _WHY.get(record["status"], _STOPPED) if record else _STOPPED
    last = ToolError.model_validate(record["error"]) if record and record["error"] else None
    return ToolError(
        type="CallCancelled" if reason == "cancelled" else "EscalationAbandoned",
        failure_class=last.failure_class if last else FailureClass.TRANSIENT,
        message=text + (f" (last error: {last.message})" if last else ""),
        suggested_action="ask_human" if reason == "abandoned" else "retry",
        retriable=False,
        tool=str(call.get("name") or ""),
        call_id=str(call.get("id") or ""),
        attempt=record["attempts"] if record else 0,
        context={reason: True, **({"last_error": last.type} if last else {})},
    )


def _answered_before_next_ai(messages: Sequence[AnyMessage], ai_index: int) -> set[str]:
    """Tool-call ids answered after the assistant message at `ai_index`, up to the next."""
    answered: set[str] = set()
    for message in messages[ai_index + 1 :]:
        if isinstance(message, AIMessage):
            break
        if isinstance(message, ToolMessage):
            answered.add(message.tool_call_id)
    return answered


def answer_pending(
    messages: Sequence[AnyMessage], ledger: Ledger
) -> tuple[list[AnyMessage], dict[str, CallRecord]] | None:
    """The history with every unanswered tool call answered, and the settled ledger
    records; None when every call already has its answer."""
    calls = ledger.get("calls") or {}
    patched: list[AnyMessage] = []
    settled: dict[str, CallRecord] = {}
    index = 0
    while index < len(messages):
        message = messages[index]
        patched.append(message)
        index += 1
        if not isinstance(message, AIMessage):
            continue
        ai_index = index - 1
        while index < len(messages) and isinstance(messages[index], ToolMessage):
            patched.append(messages[index])
            index += 1
        answered = _answered_before_next_ai(messages, ai_index)
        pending = [
            (call_slot(message, ai_index, position), call)
            for position, call in enumerate(message.tool_calls)
            if call.get("id") and call["id"] not in answered
        ]
        pending += [
            (call_slot(message, ai_index, position, invalid=True), bad)  # type: ignore[misc]
            for position, bad in enumerate(message.invalid_tool_calls)
            if bad.get("id") and bad["id"] not in answered
        ]
        for slot, call in pending:
            record = calls.get(slot)
            error = _envelope(call, record)
            patched.append(error_message(error))
            if record is not None:
                settled[slot] = {**record, "status": "failed", "due": None}
            emit(
                Event(
                    "call_cancelled",
                    tool=error.tool,
                    call_id=error.call_id,
                    reason=next(iter(error.context)),
                )
            )
    if len(patched) == len(messages):
        return None
    return patched, settled


class AnswerPendingNode(ResilienceNode):
    """Runs at ``START``: answers the calls a stopped run left unanswered (`answer_pending`),
    and ends a replan that was running, so the new input starts from a valid history."""

    def __init__(self, *, messages_key: str = "messages") -> None:
        self.messages_key = messages_key

    def run(self, state: Any, config: RunnableConfig) -> dict[str, Any]:
        """Sync body (pure over the state)."""
        return self.step(state)

    async def arun(self, state: Any, config: RunnableConfig) -> dict[str, Any]:
        """Async body."""
        return self.step(state)

    def step(self, state: Any) -> dict[str, Any]:
        """The patched history (whole: calls are answered in place) and ledger delta."""
        ledger = read_ledger(state)
        update: dict[str, Any] = {}
        delta: Ledger = {}
        plan = ledger.get("plan")
        if plan is not None and plan.get("status") == "running":
            delta["plan"] = {**plan, "status": "abandoned"}
        found = answer_pending(read_messages(state, self.messages_key), ledger)
        if found is not None:
            messages, settled = found
            update[self.messages_key] = Overwrite(messages)
            delta["calls"] = settled
            added = len(messages) - len(read_messages(state, self.messages_key))
            delta["events"] = {"call_cancelled": added}
        if delta:
            update["resilience"] = delta
        return update
