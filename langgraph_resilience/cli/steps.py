"""Explaining a step as it streams: one line per resilience event, with the tally delta."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
from rich.markup import escape

from langgraph_resilience.cli.output import args_text, class_text, message_of
from langgraph_resilience.events import EVENT_KEY

__all__ = ["describe_step"]

_RESOLVED = {
    "retry": "runs again",
    "edit": "runs again with the new arguments",
    "skip": "is not run; the agent is told why",
    "abort": "is not run and the task stops (recorded effects are compensated)",
}

Event = Mapping[str, Any]
Record = Mapping[str, Any]
Describer = Callable[[Event, Record, Mapping[str, ToolMessage]], str]


def _records(update: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The step's tally delta per call id."""
    tally = update.get("resilience") or {}
    return {
        str(record.get("call_id") or slot): record
        for slot, record in (tally.get("calls") or {}).items()
        if record
    }


def _attempt(event: Event, record: Record, answers: Mapping[str, ToolMessage]) -> str:
    tool = event.get("tool")
    if not event.get("ok"):
        error = record.get("error")
        return (
            f"[red]✗[/red] {tool} attempt {event['attempt']}: "
            f"{escape(message_of(error, str(event.get('error'))).split(f'{tool}: ', 1)[-1])} "
            f"→ [bold]{class_text(event.get('failure_class'))}[/bold]"
        )
    message = answers.get(str(event.get("call_id") or ""))
    meta = (message.response_metadata.get("resilience") if message else None) or {}
    if meta.get("reconciled"):
        return (
            f"[green]✓[/green] {tool}: status_check found the effect under its "
            "idempotency key → reconciled, [bold]not run again[/bold]"
        )
    if meta.get("replayed"):
        return f"[green]✓[/green] {tool}: outcome already recorded → replayed, not run again"
    return f"[green]✓[/green] {tool} attempt {event['attempt']}"


def _retry_scheduled(event: Event, record: Record, _answers: Mapping[str, ToolMessage]) -> str:
    tool = event.get("tool")
    error = record.get("error") or {}
    if error.get("failure_class") == "unknown":
        return (
            f"  ↻ {tool}: outcome UNKNOWN (the response was lost after the effect) → "
            "reconcile: ask status_check, never re-run blindly"
        )
    how = "capped exponential backoff, full jitter"
    if error.get("retry_after_ms") is not None and event["delay"] == round(
        error["retry_after_ms"] / 1000, 6
    ):
        how = "as the server's Retry-After asks"
    return f"  ↻ retry {tool} in {event['delay']:.2f}s, {how}"


def _repair_outcome(event: Event, record: Record, _answers: Mapping[str, ToolMessage]) -> str:
    trail = record.get("trail") or []
    before = trail[-1]["args"] if trail else {}
    diff = ", ".join(
        f"{k}: {before.get(k)!r} → {v!r}"
        for k, v in (record.get("args") or {}).items()
        if before.get(k) != v
    )
    what = f" ({escape(diff)})" if diff else ""
    if event["outcome"] == "reissued":
        return f"✎ repair model re-issued {event.get('tool')}{what}, 1 LLM call"
    return f"✎ repair of {event.get('tool')}: {event['outcome']}{what}, 1 LLM call"


def _plan_verdict(event: Event) -> str:
    if event.get("accepted"):
        return f"✓ plan verified and accepted: {' → '.join(event.get('steps') or [])}"
    return f"✗ plan rejected: {', '.join(event.get('reasons') or [])}"


def _plan_step(event: Event) -> str:
    if event.get("issue"):
        return f"→ plan step: {', '.join(event['issue'])}"
    return f"plan {event.get('status')}"


def _simple(describe: Callable[[Event], str]) -> Describer:
    """A describer that needs the event only."""
    return lambda event, _record, _answers: describe(event)


_DESCRIBERS: Mapping[str, Describer] = {
    "attempt": _attempt,
    "retry_scheduled": _retry_scheduled,
    "repair_outcome": _repair_outcome,
    "backoff": _simple(
        lambda e: (
            f"⧗ waited {e['seconds']:.2f}s (simulated clock) before retrying"
            if e["seconds"] >= 0.005
            else "⧗ asked again at once (no wait)"
        )
    ),
    "coercion": _simple(
        lambda e: (
            f"≈ {e.get('tool')}: {escape('; '.join(e.get('changes') or []))} → "
            "SEMANTIC fixed by lossless coercion (no LLM call)"
        )
    ),
    "breaker": _simple(
        lambda e: (
            f"⊘ circuit breaker {e['key']}: {e['from_state']} → "
            f"[bold]{e['to_state']}[/bold] ({e['reason']})"
        )
    ),
    "fallback": _simple(
        lambda e: (
            f"⇢ {e.get('tool')} is out ({class_text(e.get('failure_class'))}) → served by {e['to']}"
        )
    ),
    "replan_needed": _simple(
        lambda e: (
            f"⟳ {e.get('tool')} cannot be retried ({class_text(e.get('failure_class'))}) → planner"
        )
    ),
    "plan_verdict": _simple(_plan_verdict),
    "plan_step": _simple(_plan_step),
    "escalate_needed": _simple(
        lambda e: (
            f"⚑ {e.get('tool')}: {class_text(e.get('failure_class'))} → only a human may decide"
        )
    ),
    "resolution": _simple(
        lambda e: (
            f"⚑ [bold]{e['action']}[/bold]: {e.get('tool')} {_RESOLVED.get(str(e['action']), '')}"
        )
    ),
    "gave_up": _simple(
        lambda e: (
            f"↩ {e.get('tool')}: {class_text(e.get('failure_class'))} envelope to the "
            f"agent ({e.get('exhausted') or 'no recovery path'})"
        )
    ),
    "loop_detected": _simple(lambda e: f"∞ {e.get('tool')}: loop detected → not executed"),
    "compensation": _simple(lambda e: f"↶ compensated {e.get('compensated')}"),
}
"""One line per event kind; the others (route, escalation: shown with the interrupt,
repair_requested) are not shown."""


def _agent_lines(messages: Sequence[AnyMessage]) -> list[str]:
    """What the agent said: its words and calls, or that it answers."""
    lines: list[str] = []
    for message in messages:
        if not isinstance(message, AIMessage):
            continue
        if message.tool_calls:
            calls = "  ".join(
                f"{c['name']}({escape(args_text(c['args']))})" for c in message.tool_calls
            )
            lines.append(f"[italic]{escape(message.text)}[/italic]")
            lines.append(f"→ {calls}")
        else:
            lines.append("answers the customer (below)")
    return lines


def describe_step(node: str, update: Any, events: Sequence[Event]) -> list[str]:
    """The lines of one node's step: what the agent/planner said, then its events."""
    update = update if isinstance(update, Mapping) else {}
    messages: list[AnyMessage] = list(update.get("messages") or [])
    answers = {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}
    lines = _agent_lines(messages) if node == "agent" else []
    plan = (update.get("resilience") or {}).get("plan")
    if node == "planner" and plan and plan.get("status") == "running":
        diagnosis = plan["plan"]["diagnosis"]
        lines.append(f"diagnosis: {escape(diagnosis['cause'])}")
        lines.append(f"rationale: {escape(plan['plan']['rationale'])}")
    records = _records(update)
    for event in events:
        describe = _DESCRIBERS.get(event[EVENT_KEY])
        if describe is None:
            continue
        record = records.get(str(event.get("call_id") or "")) or {}
        lines.append(describe(event, record, answers))
    return lines
