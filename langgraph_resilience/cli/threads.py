"""The ``threads`` command: every thread in the store and where each stands."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
from collections.abc import Mapping
from typing import Any

from langchain_core.messages import AIMessage
from rich.console import RenderableType
from rich.markup import escape

from langgraph_resilience._graph.escalate import ESCALATION_TYPE
from langgraph_resilience.cli.demo import is_demo_thread
from langgraph_resilience.cli.output import Output, fitted_table, one_line
from langgraph_resilience.cli.session import (
    Session,
    open_session,
    resume_command,
    thread_config,
    unfinished,
)
from langgraph_resilience.stores.threads import (
    ThreadStatus,
    list_threads,
    thread_status,
)

__all__ = ["cmd_threads"]


def _interrupted_why(status: ThreadStatus) -> str:
    parts = []
    for request in status.interrupts:
        if isinstance(request, dict) and request.get("type") == ESCALATION_TYPE:
            message = (request.get("envelope") or {}).get("message", "")
            parts.append(f"waits for a human on {request['tool']} ({request['reason']}): {message}")
        else:
            parts.append(f"interrupted: {request!r}")
    return "; ".join(parts)


def _why(status: ThreadStatus, values: Mapping[str, Any]) -> str:
    if status.state == "interrupted":
        return _interrupted_why(status)
    if status.state == "failed":
        return f"failed: {status.error}"
    if status.state in ("pending", "running"):
        unknown = status.effects.get("pending", 0)
        effects = (
            f"; {unknown} side effect(s) of unknown outcome, reconciled on resume"
            if unknown
            else ""
        )
        who = "being run by another process" if status.state == "running" else "stopped"
        where = f"before {', '.join(status.next)} (step {status.step})"
        return f"{who} {where if status.next else f'at step {status.step}'}{effects}"
    tally = values.get("resilience") or {}
    if (tally.get("task") or {}).get("aborted"):
        return "aborted by a human"
    messages = values.get("messages") or []
    last = messages[-1] if messages else None
    return f"answered: {last.text[:70]}…" if isinstance(last, AIMessage) else "done"


def _updated(text: str | None) -> str:
    if not text:
        return "-"
    try:
        return dt.datetime.fromisoformat(text).astimezone().strftime("%Y-%m-%d %H:%M:%S")
    except ValueError:
        return text


def _thread_row(session: Session, args: argparse.Namespace, thread_id: str) -> dict[str, Any]:
    """Where one thread stands, as a row of `threads`: one read of its latest state."""
    try:
        snapshot = session.app.get_state(thread_config(thread_id))
        status = thread_status(
            session.app, thread_id, persistence=session.persistence, snapshot=snapshot
        )
    except (ValueError, KeyError, TypeError) as exc:  # e.g. another graph's thread
        return {"thread_id": thread_id, "state": "unreadable", "why": one_line(exc)}
    values = snapshot.values
    if status.state == "done" and unfinished(snapshot):  # see `unfinished`
        status = dataclasses.replace(status, state="pending", next=unfinished(snapshot))
    answers = "--approve|--skip|--edit JSON|--abort" if status.state == "interrupted" else ""
    return {
        "thread_id": thread_id,
        "state": status.state,
        "why": _why(status, values) if is_demo_thread(values) else "not a demo thread",
        "next": list(status.next),
        "step": status.step,
        "updated_at": status.updated_at,
        "demo": is_demo_thread(values),
        "tool_executions": status.tally.get("tool_attempts", 0),
        "effects": dict(status.effects),
        "resume": resume_command(args, thread_id, answers)
        if status.state in ("pending", "interrupted") and is_demo_thread(values)
        else None,
    }


_COLORS = {"done": "green", "interrupted": "yellow", "pending": "yellow", "failed": "red"}


def _table(found: list[dict[str, Any]], width: int) -> RenderableType:
    rows = []
    for item in found:
        effects = ", ".join(f"{n} {k}" for k, n in item.get("effects", {}).items() if n)
        color = _COLORS.get(item["state"], "white")
        rows.append(
            [
                item["thread_id"],
                f"[{color}]{item['state']}[/{color}]",
                escape(item["why"]),
                str(item.get("tool_executions", "-")),
                effects or "-",
                _updated(item.get("updated_at")),
            ]
        )
    return fitted_table(
        "Threads, the most recently written on top",
        ("thread", "state", "where / why", "tool runs", "effects", "updated"),
        rows,
        whole={"thread", "updated"},
        width=width,
    )


def cmd_threads(args: argparse.Namespace, out: Output) -> int:
    """List the threads in the store with where each stands, most recent first: one
    query lists them (`list_threads`), then one state read per thread listed."""
    with open_session(args) as s:
        found = [
            _thread_row(s, args, thread_id)
            for thread_id in list_threads(s.persistence.checkpointer, limit=args.limit)
        ]
        if out.lines:
            for item in found:
                out.document({"target": s.persistence.target, **item})
            return 0
        if out.json:
            out.document({"target": s.persistence.target, "threads": found})
            return 0
        if not found:
            out.line(
                f"no threads in {escape(s.persistence.target)}; run `langgraph-resilience demo`"
            )
            return 0
        out.whole(f"threads in {escape(s.persistence.target)}")  # a path to copy: whole
        out.console.print(_table(found, out.console.width))
        for item in found:
            if item.get("resume"):
                out.whole(f"  {escape(item['resume'])}")
    return 0
