"""Explaining a thread after the fact: every tool call, what failed, what recovered it
and what that cost, from the checkpointed tally and the run log."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage, ToolMessage

from langgraph_resilience._graph.state import PLAN_CALL_PREFIX, call_slot
from langgraph_resilience.cli.output import message_of
from langgraph_resilience.events import EVENT_KEY

__all__ = ["CallRow", "envelope_of", "explain_calls"]


@dataclasses.dataclass(slots=True)
class CallRow:
    """One tool call of a thread, explained."""

    call_id: str
    tool: str
    failure_class: str
    """The class that decided the recovery path (the last failure's)."""
    classes: list[str]
    """Every failed attempt's class, in order (from the run log)."""
    failed: str
    recovery: str
    how: str
    ok: bool
    outcome: str
    executions: int
    llm_calls: int
    backoff_s: float


def envelope_of(message: ToolMessage | None) -> dict[str, Any]:
    """The `ToolError` envelope an error `ToolMessage` carries, or ``{}``."""
    if message is None or message.status != "error" or not isinstance(message.artifact, dict):
        return {}
    envelope = message.artifact.get("tool_error")
    return envelope if isinstance(envelope, dict) else {}


def _recovered_by_record(
    klass: str, failed: str, record: Mapping[str, Any], meta: Mapping[str, Any]
) -> tuple[str, str, str, str] | None:
    """The recovery the call's own tally record shows: reconcile, fallback, repair,
    coercion (None when it shows none)."""
    error = record.get("error") or {}
    if meta.get("reconciled") and not error:  # the run stopped before the answer was saved
        stopped = "the run stopped after the effect, before its checkpoint"
        return "unknown", stopped, "reconcile", "reconciled by status_check"
    if meta.get("reconciled"):
        return klass, f"{failed} after the effect", "reconcile", "reconciled by status_check"
    if record.get("served_by"):
        if error.get("type") == "CircuitOpenError":
            failed = "breaker opened after repeated failures"
        return klass, failed, "fallback", f"fallback: {record['served_by']}"
    if record.get("trail"):
        first = record["trail"][0]["error"]
        return (
            str(first.get("failure_class", "semantic")),
            message_of(first, "-").split(": ", 1)[-1],
            "repair",
            "reflection repair",
        )
    if record.get("coercions"):
        return "semantic", "; ".join(record["coercions"]), "coercion", "coercion (no LLM)"
    return None


def _explain(
    call: Mapping[str, Any],
    record: Mapping[str, Any],
    message: ToolMessage | None,
    resolutions: Mapping[str, str],
) -> tuple[str, str, str, str]:
    """(failure class, what failed, recovery key, how) of one call."""
    error = record.get("error") or {}
    meta = (message.response_metadata.get("resilience") if message else None) or {}
    envelope = envelope_of(message)
    context = envelope.get("context") or {}
    klass = str(error.get("failure_class") or "-")
    failed = message_of(error, "-") if error else "-"
    call_id = str(call["id"])
    found = _recovered_by_record(klass, failed, record, meta)
    if found is not None:
        return found
    if "replanned" in context:
        steps = " → ".join(s.split(": ")[-1] for s in context["replanned"].get("steps", []))
        return klass, failed, "replan", f"verified replan: {steps}"
    if call_id in resolutions or "human_decision" in context:
        decision = context.get("human_decision") or resolutions.get(call_id, "?")
        return klass, failed, "escalation", f"a human: {decision}"
    if call_id.startswith(PLAN_CALL_PREFIX):
        return klass, failed, "plan_step", "(a plan step)"
    if record.get("status") == "ok" and error:
        return klass, failed, "retry", "retry"
    if envelope:
        return (
            str(envelope.get("failure_class")),
            message_of(envelope, "-"),
            "envelope",
            "envelope to the agent",
        )
    if record.get("status") in ("scheduled", "escalate", "repair", "replan"):
        return klass, failed, "pending", f"waiting ({record['status']})"
    return "-", "-", "none", "-"


@dataclasses.dataclass(slots=True)
class _Thread:
    """What the thread says beyond each call's record: from the run log, the classes
    of failed attempts, the backoff and the human resolutions per call id; from the
    tally, the plan's status and the task's replans."""

    classes: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    errors: dict[str, str] = dataclasses.field(default_factory=dict)
    """The last failed attempt's error type, per call id."""
    attempts: dict[str, int] = dataclasses.field(default_factory=dict)
    backoff: dict[str, float] = dataclasses.field(default_factory=dict)
    resolutions: dict[str, str] = dataclasses.field(default_factory=dict)
    plan_status: str | None = None
    replans: int = 0

    @classmethod
    def of(cls, tally: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> _Thread:
        plan = tally.get("plan") or {}
        thread = cls(
            plan_status=plan.get("status"),
            replans=int((tally.get("task") or {}).get("replans") or 0) if plan else 0,
        )
        for event in events:
            call_id = str(event.get("call_id"))
            if event.get(EVENT_KEY) == "attempt":
                thread.attempts[call_id] = thread.attempts.get(call_id, 0) + 1
            if event.get(EVENT_KEY) == "attempt" and not event.get("ok"):
                thread.classes.setdefault(call_id, []).append(str(event.get("failure_class")))
                thread.errors[call_id] = str(event.get("error") or "error")
            elif event.get(EVENT_KEY) == "retry_scheduled":
                delay = float(event.get("delay") or 0.0)
                thread.backoff[call_id] = thread.backoff.get(call_id, 0.0) + delay
            elif event.get(EVENT_KEY) == "resolution":
                thread.resolutions[call_id] = str(event.get("action"))
        return thread


def _answered_record(call_id: str, answer: ToolMessage | None, thread: _Thread) -> dict[str, Any]:
    """What the tally no longer keeps of an answered call (the bounded tally drops
    finished records): its answer's recovery trail and the run log's attempts."""
    if answer is None:
        return {}
    meta = answer.response_metadata.get("resilience")
    record: dict[str, Any] = dict(meta) if isinstance(meta, Mapping) else {}
    record["status"] = "failed" if answer.status == "error" else "ok"
    record["attempts"] = thread.attempts.get(call_id) or record.get("attempts") or 1
    if call_id in thread.errors:
        error = thread.errors[call_id]
        record["error"] = {"failure_class": thread.classes[call_id][-1], "type": error}
    return record


def _row(
    call: Mapping[str, Any], record: Mapping[str, Any], answer: ToolMessage | None, thread: _Thread
) -> CallRow:
    call_id = str(call["id"])
    record = record or _answered_record(call_id, answer, thread)
    klass, failed, recovery, how = _explain(call, record, answer, thread.resolutions)
    llm_calls = int(record.get("repairs") or 0)
    ok = answer is not None and answer.status != "error"
    if recovery == "replan":
        llm_calls += thread.replans
        ok = thread.plan_status == "completed"
    outcome = str(answer.text if answer is not None else "(no answer yet)")
    if answer is not None and answer.status == "error":
        outcome = f"error: {message_of(envelope_of(answer), answer.text)}"
    return CallRow(
        call_id=call_id,
        tool=call["name"],
        failure_class=klass,
        classes=thread.classes.get(call_id) or ([klass] if klass != "-" else []),
        failed=failed,
        recovery=recovery,
        how=how,
        ok=ok,
        outcome=outcome[:100],
        executions=int(record.get("attempts") or 0),
        llm_calls=llm_calls,
        backoff_s=round(thread.backoff.get(call_id, 0.0), 6),
    )


def explain_calls(values: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> list[CallRow]:
    """Every tool call of a thread, in order, with its failure, recovery and cost."""
    tally = values.get("resilience") or {}
    records = tally.get("calls") or {}
    messages = values.get("messages") or []
    answers = {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}
    thread = _Thread.of(tally, events)
    rows: list[CallRow] = []
    for index, message in enumerate(messages):
        if not isinstance(message, AIMessage):
            continue
        for position, call in enumerate(message.tool_calls):
            record = records.get(call_slot(message, index, position)) or {}
            rows.append(_row(call, record, answers.get(str(call["id"])), thread))
    return rows
