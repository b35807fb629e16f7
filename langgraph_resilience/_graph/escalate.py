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

``retry`` and ``edit`` buy the call one more execution, even when the task's budget
or deadline is spent (a person deciding is not the agent looping); a human vouches
for an unknown outcome the same way. The thread's lifetime cap
(``max_thread_tool_attempts``) is not theirs to lift: past it only skip and abort
are offered.

An invalid answer does not lose anything: the node interrupts again with the same
request and an ``error`` explaining what was wrong; an ``edit`` whose arguments the
tool's schema rejects (a wrong type, another tool's fields) is such an invalid
answer, and so is one whose ``call_id`` names another call than the request's (an
answer is bound to its call, never applied to another). ``abort`` undoes the
thread's recorded effects (async under ``ainvoke``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal

from langchain_core.messages import AnyMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.errors import GraphInterrupt
from langgraph.types import interrupt
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from langgraph_resilience._graph.node import ResilienceNode
from langgraph_resilience._graph.state import (
    CallRecord,
    Tally,
    current_slots,
    current_task,
    read_messages,
    read_tally,
)
from langgraph_resilience._graph.tools import error_message
from langgraph_resilience.core.canonical import call_key
from langgraph_resilience.core.policy import ResiliencePolicy
from langgraph_resilience.core.redaction import mask_args, redact, redact_value, unmask_args
from langgraph_resilience.errors import FailureClass, ToolError
from langgraph_resilience.events import Event, emit

__all__ = ["ESCALATION_TYPE", "EscalateNode", "Resolution", "edit_problem", "escalation_request"]

ESCALATION_TYPE = "resilience_escalation"
"""The ``type`` of every interrupt value this package raises, to tell them apart."""

Action = Literal["retry", "edit", "skip", "abort"]


class Resolution(BaseModel):
    """A human's answer to an escalation (the ``Command(resume=...)`` value)."""

    model_config = ConfigDict(extra="forbid")

    action: Action
    args: dict[str, Any] | None = Field(default=None, description="New arguments for 'edit'.")
    note: str | None = Field(default=None, description="Shown to the agent with 'skip'/'abort'.")
    call_id: str | None = Field(
        default=None,
        description="The call this answer is for (the request's call_id): an answer meant "
        "for another call is refused, never applied to this one.",
    )

    @model_validator(mode="after")
    def _edit_needs_args(self) -> Resolution:
        if self.action == "edit" and not self.args:
            raise ValueError("action 'edit' needs 'args': the new arguments as an object")
        if self.action != "edit" and self.args is not None:
            raise ValueError(f"'args' only goes with action 'edit', not {self.action!r}")
        return self


def escalation_request(call_id: str, record: CallRecord, error: ToolError) -> dict[str, Any]:
    """The JSON value passed to `interrupt()`: everything a human needs to decide.

    It is stored in the checkpoint and shown to a person, so it holds no secret: the
    call's arguments go through `mask_args` (``"password": "[REDACTED]"``) and the
    envelope is redacted once more (the human's answer is kept as given)."""
    return {
        "type": ESCALATION_TYPE,
        "call_id": call_id,
        "tool": record["tool"],
        "args": mask_args(record.get("args", {})),
        "envelope": redact_value(error.model_dump(mode="json")),
        "reason": error.context.get("exhausted") or error.failure_class.value,
        "options": {
            **({} if _capped(error) else _RUN_AGAIN),
            "skip": {"action": "skip", "note": "<optional, shown to the agent>"},
            "abort": {"action": "abort", "note": "<optional>"},
        },
    }


_RUN_AGAIN = {
    "retry": {"action": "retry"},
    "edit": {"action": "edit", "args": "<new arguments object>"},
}
_THREAD_CAP = "max_thread_tool_attempts"


def _capped(error: ToolError) -> bool:
    """Whether the thread's lifetime cap stopped the call: nothing of this thread may run
    again, so a human is offered only skip and abort (a retry would be refused)."""
    return error.context.get("exhausted") == _THREAD_CAP


Check = Callable[[Resolution], str | None]
"""A check of a well-formed answer: a problem to show the human, or None when fine."""


def _ask(request: dict[str, Any], asked: Event, check: Check) -> Resolution:
    """Interrupt until the answer is a valid `Resolution` that passes `check` (each retry
    shows the error).

    `asked` is emitted when the question is put, not when a resumed node re-runs and
    `interrupt()` returns the answer it already has (LangGraph re-runs the node)."""
    while True:
        try:
            answer = interrupt(request)
        except GraphInterrupt:
            emit(asked)
            raise
        try:
            resolution = Resolution.model_validate(answer)
        except ValidationError as exc:
            problems = "; ".join(e["msg"] for e in exc.errors(include_url=False))
            request = {**request, "error": redact(f"invalid answer {answer!r}: {problems}")}
            continue
        problem = check(resolution)
        meant = resolution.call_id
        if problem is None and meant is not None and meant != request.get("call_id"):
            problem = (
                f"it is for call {meant!r}, and this request is for call "
                f"{request.get('call_id')!r} ({request.get('tool')})"
            )
        if problem is None:
            return resolution
        request = {**request, "error": redact(f"invalid answer {answer!r}: {problem}")}


def edit_problem(tool: BaseTool | None, args: dict[str, Any]) -> str | None:
    """Why `args` cannot be the arguments of `tool` (its schema rejects them), or None.

    A human's ``edit`` is checked like the model's calls are, before anything runs: a
    wrong type, or another tool's fields, is re-asked, never executed."""
    if tool is None:
        return None
    schema = tool.tool_call_schema
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        fields = set(schema.model_fields)
        unknown = sorted(set(args) - fields)
        if unknown:
            return f"{tool.name} has no argument(s) {unknown}; its arguments: {sorted(fields)}"
        try:
            schema.model_validate(args)
        except ValidationError as exc:
            return "; ".join(
                f"{'.'.join(str(part) for part in e['loc']) or '<root>'}: {e['msg']}"
                for e in exc.errors(include_url=False, include_input=False)
            )
        return None
    if isinstance(schema, dict):
        properties = schema.get("properties") or {}
        unknown = sorted(set(args) - set(properties))
        missing = sorted(set(schema.get("required") or []) - set(args))
        if unknown or missing:
            return f"{tool.name}: unknown arguments {unknown}, missing arguments {missing}"
    return None


def _thread_id(config: RunnableConfig) -> str:
    return str((config.get("configurable") or {}).get("thread_id", ""))


def _answered(error: ToolError, resolution: Resolution, *, by: str) -> ToolMessage:
    decided = {"human_decision": resolution.action, "by": by}
    if resolution.note:
        decided["note"] = resolution.note
    return error_message(error.model_copy(update={"context": {**error.context, **decided}}))


Compensate = Callable[[str, RunnableConfig], Any]
"""``compensate(thread_id, config)``: undo the thread's recorded effects (a report)."""


class EscalateNode(ResilienceNode):
    """Asks a human about each call of the turn waiting for escalation, then applies it."""

    def __init__(
        self,
        *,
        policy: ResiliencePolicy | None = None,
        tools_by_name: Mapping[str, BaseTool] | None = None,
        compensate: Compensate | None = None,
        acompensate: Callable[[str, RunnableConfig], Awaitable[Any]] | None = None,
        messages_key: str = "messages",
    ) -> None:
        self.policy = policy or ResiliencePolicy()
        self.tools_by_name = dict(tools_by_name or {})
        self.compensate = compensate
        self.acompensate = acompensate
        self.messages_key = messages_key

    def run(self, state: Any, config: RunnableConfig) -> dict[str, Any]:
        """Sync body: ask, then undo the thread's effects if the human aborted."""
        update, aborted = self.step(state)
        if aborted and self.compensate is not None:
            _announce(_thread_id(config), self.compensate(_thread_id(config), config))
        return update

    async def arun(self, state: Any, config: RunnableConfig) -> dict[str, Any]:
        """Async body: the same, with the ledger's async methods (and async compensators)."""
        update, aborted = self.step(state)
        if aborted and self.acompensate is not None:
            thread_id = _thread_id(config)
            _announce(thread_id, await self.acompensate(thread_id, config))
        elif aborted and self.compensate is not None:
            _announce(_thread_id(config), self.compensate(_thread_id(config), config))
        return update

    def _check(self, record: CallRecord, error: ToolError) -> Check:
        """An edit must fit the schema of the tool that will run it; nothing runs again
        past the thread's lifetime cap."""
        tool = self.tools_by_name.get(record.get("served_by") or record["tool"])

        def check(resolution: Resolution) -> str | None:
            if resolution.action in _RUN_AGAIN and _capped(error):
                cap = self.policy.max_thread_tool_attempts
                return (
                    f"the thread's lifetime cap ({_THREAD_CAP}={cap}) is spent, so no call "
                    "of this thread can run again; answer skip or abort"
                )
            if resolution.action != "edit" or resolution.args is None:
                return None
            return edit_problem(tool, resolution.args)

        return check

    def step(self, state: Any) -> tuple[dict[str, Any], bool]:
        """Escalate every waiting call, in call order: the update, and whether the human
        aborted the task (the caller then compensates)."""
        tally = read_tally(state)
        calls = tally.get("calls") or {}
        messages_in = read_messages(state, self.messages_key)
        task_id = current_task(messages_in)
        waiting = [
            (slot, calls[slot])
            for slot in current_slots(state, self.messages_key)
            if slot in calls and calls[slot]["status"] == "escalate"
        ]
        updates: dict[str, CallRecord] = {}
        messages: list[AnyMessage] = []
        informed: dict[str, str] = {}
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
            request = escalation_request(call_id, record, error)
            resolution = _ask(request, asked, self._check(record, error))
            emit(
                Event("resolution", tool=record["tool"], call_id=call_id, action=resolution.action)
            )
            updated: CallRecord = dict(record)  # type: ignore[assignment]
            if resolution.action in ("retry", "edit"):
                self._rerun(updated, resolution)
            else:
                updated["status"] = "failed"
                messages.append(_answered(error, resolution, by="human"))
                aborted = resolution.action == "abort"
                unknown = error.context.get("idempotency_key") or record.get("effect_key")
                if error.failure_class is FailureClass.UNKNOWN and unknown:
                    informed[str(unknown)] = task_id
            updates[slot] = updated
        if aborted:  # nothing of this turn may stay unanswered once the task ends
            self._end_waiting(state, calls, updates, messages)
        delta: Tally = {"calls": updates, "events": {"escalation": len(waiting)}}
        if informed:
            delta["informed"] = informed
        if aborted:
            delta["task"] = {"id": task_id, "aborted": True}
        return {self.messages_key: messages, "resilience": delta}, aborted

    def _rerun(self, record: CallRecord, resolution: Resolution) -> None:
        """Schedule a call the human let run again, with their arguments if they edited."""
        if resolution.args is not None:
            # "[REDACTED]" sent back (the payload masks secrets) keeps the real value
            args = unmask_args(resolution.args, record.get("args", {}))
            tool = record.get("served_by") or record["tool"]
            record["args"] = args
            record["key"] = call_key(tool, args, noise_fields=self.policy.noise_fields)
        record["status"] = "scheduled"
        record["due"] = None  # run at once: next_step routes straight to tools
        record["approved"] = True  # a human vouched: an unknown outcome may rerun

    def _end_waiting(
        self,
        state: Any,
        calls: Mapping[str, CallRecord],
        updates: dict[str, CallRecord],
        messages: list[AnyMessage],
    ) -> None:
        """An aborted task answers every call of this turn still waiting: for a replan, a
        repair, a retry (one a human let run again, before another call's abort)."""
        for slot in current_slots(state, self.messages_key):
            left = updates.get(slot) or calls.get(slot)
            if left is None or left["status"] not in _WAITING or not left["error"]:
                continue
            error = ToolError.model_validate(left["error"])
            updates[slot] = {**left, "status": "failed", "due": None}
            messages.append(_answered(error, Resolution(action="abort"), by="abort"))


_WAITING = frozenset({"scheduled", "repair", "replan", "escalate"})
"""Statuses of a call not answered yet: an aborted task answers them."""


def _announce(thread_id: str, report: Any) -> None:
    """The compensation event, when the abort undid anything."""
    if report is None:
        return
    emit(
        Event(
            "compensation",
            thread_id=thread_id,
            ok=report.ok,
            compensated=report.compensated,
            outstanding=report.outstanding,
        )
    )
