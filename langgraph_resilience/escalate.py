"""Human escalation through LangGraph's `interrupt()` and ``Command(resume=...)``.

POLICY failures, UNKNOWN outcomes and exhausted replans are not for a machine
to decide. The escalate node calls `interrupt()` with a JSON request (what
failed, the envelope, the options), so the thread waits durably in the
checkpointer and resumes by ``thread_id`` — in another process, days later.
The human answers with one of::

    Command(resume={"action": "retry"})                       # run the call again
    Command(resume={"action": "edit", "args": {...}})         # run it with new arguments
    Command(resume={"action": "skip", "note": "..."})         # don't; tell the agent
    Command(resume={"action": "abort", "note": "..."})        # stop the task

An invalid answer does not lose anything: the node interrupts again with the
same request and an ``error`` explaining what was wrong.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from langchain_core.messages import AnyMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.errors import GraphInterrupt
from langgraph.types import interrupt
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from langgraph_resilience.canonical import call_key
from langgraph_resilience.errors import ToolError
from langgraph_resilience.events import Event, emit
from langgraph_resilience.policy import ResiliencePolicy
from langgraph_resilience.state import (
    CallRecord,
    Ledger,
    current_slots,
    current_task,
    read_ledger,
    read_messages,
)
from langgraph_resilience.tools import error_message

__all__ = ["ESCALATION_TYPE", "EscalateNode", "Resolution", "escalation_request"]

ESCALATION_TYPE = "resilience_escalation"
"""The ``type`` of every interrupt value this package raises, to tell them apart."""

Action = Literal["retry", "edit", "skip", "abort"]


class Resolution(BaseModel):
    """A human's answer to an escalation (the ``Command(resume=...)`` value)."""

    model_config = ConfigDict(extra="forbid")

    action: Action
    args: dict[str, Any] | None = Field(default=None, description="New arguments for 'edit'.")
    note: str | None = Field(default=None, description="Shown to the agent with 'skip'/'abort'.")

    @model_validator(mode="after")
    def _edit_needs_args(self) -> Resolution:
        if self.action == "edit" and not self.args:
            raise ValueError("action 'edit' needs 'args': the new arguments as an object")
        if self.action != "edit" and self.args is not None:
            raise ValueError(f"'args' only goes with action 'edit', not {self.action!r}")
        return self


def escalation_request(call_id: str, record: CallRecord, error: ToolError) -> dict[str, Any]:
    """The JSON value passed to `interrupt()`: everything a human needs to decide."""
    return {
        "type": ESCALATION_TYPE,
        "call_id": call_id,
        "tool": record["tool"],
        "args": record.get("args", {}),
        "envelope": error.model_dump(mode="json"),
        "reason": error.context.get("exhausted") or error.failure_class.value,
        "options": {
            "retry": {"action": "retry"},
            "edit": {"action": "edit", "args": "<new arguments object>"},
            "skip": {"action": "skip", "note": "<optional, shown to the agent>"},
            "abort": {"action": "abort", "note": "<optional>"},
        },
    }


def _ask(request: dict[str, Any], asked: Event) -> Resolution:
    """Interrupt until the answer is a valid `Resolution` (each retry shows the error).

    `asked` is emitted when the question is put, not when a resumed node re-runs and
    `interrupt()` returns the answer it already has (LangGraph re-runs the node)."""
    while True:
        try:
            answer = interrupt(request)
        except GraphInterrupt:
            emit(asked)
            raise
        try:
            return Resolution.model_validate(answer)
        except ValidationError as exc:
            problems = "; ".join(e["msg"] for e in exc.errors(include_url=False))
            request = {**request, "error": f"invalid answer {answer!r}: {problems}"}


def _thread_id(config: RunnableConfig) -> str:
    return str((config.get("configurable") or {}).get("thread_id", ""))


def _answered(error: ToolError, resolution: Resolution, *, by: str) -> ToolMessage:
    decided = {"human_decision": resolution.action, "by": by}
    if resolution.note:
        decided["note"] = resolution.note
    return error_message(error.model_copy(update={"context": {**error.context, **decided}}))


class EscalateNode:
    """Asks a human about each call of the turn waiting for escalation, then applies it."""

    def __init__(
        self,
        *,
        policy: ResiliencePolicy,
        compensate: Callable[[str], Any] | None = None,
        messages_key: str = "messages",
    ) -> None:
        self.policy = policy
        self.compensate = compensate
        self.messages_key = messages_key

    def run(self, state: Any, config: RunnableConfig) -> dict[str, Any]:
        """Sync body (interrupt works the same from sync and async nodes)."""
        return self.step(state, _thread_id(config))

    async def arun(self, state: Any, config: RunnableConfig) -> dict[str, Any]:
        """Async body (compensation handlers are sync callables, run as they are)."""
        return self.step(state, _thread_id(config))

    def step(self, state: Any, thread_id: str = "") -> dict[str, Any]:
        """Escalate every waiting call, in call order; abort ends the thread."""
        ledger = read_ledger(state)
        calls = ledger.get("calls") or {}
        waiting = [
            (slot, calls[slot])
            for slot in current_slots(state, self.messages_key)
            if slot in calls and calls[slot]["status"] == "escalate"
        ]
        updates: dict[str, CallRecord] = {}
        messages: list[AnyMessage] = []
        aborted = False
        for slot, record in waiting:
            error = ToolError.model_validate(record["error"])
            call_id = record.get("call_id") or error.call_id or ""
            if aborted:
                updates[slot] = {**record, "status": "failed"}
                messages.append(_answered(error, Resolution(action="abort"), by="abort"))
                continue
            asked = Event(
                "escalation",
                tool=record["tool"],
                call_id=call_id,
                failure_class=error.failure_class.value,
            )
            resolution = _ask(escalation_request(call_id, record, error), asked)
            emit(
                Event("resolution", tool=record["tool"], call_id=call_id, action=resolution.action)
            )
            updated: CallRecord = dict(record)  # type: ignore[assignment]
            if resolution.action in ("retry", "edit"):
                if resolution.args is not None:
                    updated["args"] = resolution.args
                    updated["key"] = call_key(
                        record["tool"], resolution.args, noise_fields=self.policy.noise_fields
                    )
                updated["status"] = "scheduled"
                updated["due"] = None  # run at once: next_step routes straight to tools
                updated["approved"] = True  # a human vouched: an unknown outcome may rerun
            else:
                updated["status"] = "failed"
                messages.append(_answered(error, resolution, by="human"))
                aborted = resolution.action == "abort"
            updates[slot] = updated
        if aborted:  # nothing of this turn may stay unanswered once the task ends
            for slot in current_slots(state, self.messages_key):
                left = calls.get(slot)
                if left is not None and left["status"] == "replan" and left["error"]:
                    error = ToolError.model_validate(left["error"])
                    updates[slot] = {**left, "status": "failed"}
                    messages.append(_answered(error, Resolution(action="abort"), by="abort"))
        delta: Ledger = {"calls": updates, "events": {"escalation": len(waiting)}}
        if aborted:
            task_id = current_task(read_messages(state, self.messages_key))
            delta["task"] = {"id": task_id, "aborted": True}
            report = self.compensate(thread_id) if self.compensate is not None else None
            if report is not None:
                emit(
                    Event(
                        "compensation",
                        thread_id=thread_id,
                        ok=report.ok,
                        compensated=report.compensated,
                        outstanding=report.outstanding,
                    )
                )
        return {self.messages_key: messages, "resilience": delta}
