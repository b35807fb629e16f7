"""The end of a run: the thread's summary (JSON-ready) and its tables."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage
from langgraph.types import StateSnapshot
from rich.console import RenderableType
from rich.markup import escape

from langgraph_resilience.cli.explain import explain_calls
from langgraph_resilience.cli.output import Output, args_text, fitted_table
from langgraph_resilience.cli.session import Session, escalations, resume_command, state_of
from langgraph_resilience.events import EVENT_KEY

__all__ = ["print_summary", "summary"]


def _effects(session: Session, thread_id: str) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """The thread's side effects, one row per key (first execution), and executions per key."""
    effects = session.store.effects(thread_id)
    per_key: dict[str, int] = {}
    for effect in effects:
        per_key[effect["key"]] = per_key.get(effect["key"], 0) + 1
    rows = [
        {"kind": e["kind"], "key": e["key"], "executions": per_key[e["key"]], **e["detail"]}
        for e in effects
        if e["id"] == min(x["id"] for x in effects if x["key"] == e["key"])
    ]
    return rows, per_key


def _cost(values: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    tally = values.get("resilience") or {}
    messages = values.get("messages") or []
    return {
        "tool_executions": int(tally.get("tool_attempts") or 0),
        "agent_llm_calls": sum(1 for m in messages if isinstance(m, AIMessage) and m.name is None),
        "recovery_llm_calls": int(tally.get("llm_calls") or 0),
        "simulated_backoff_s": round(
            sum(float(e.get("seconds") or 0) for e in events if e.get(EVENT_KEY) == "backoff"),
            6,
        ),
        "human_answers": sum(1 for e in events if e.get(EVENT_KEY) == "resolution"),
    }


def summary(
    session: Session, thread_id: str, snapshot: StateSnapshot, args: argparse.Namespace
) -> dict[str, Any]:
    """Where the thread stands, every call explained, its side effects and its cost."""
    values = snapshot.values
    events = session.store.events(thread_id)
    effects, per_key = _effects(session, thread_id)
    tally = values.get("resilience") or {}
    messages = values.get("messages") or []
    last = messages[-1] if messages else None
    state = state_of(snapshot)
    waiting = [i.value for i in escalations(snapshot)]
    return {
        "kind": "summary",
        "thread_id": thread_id,
        "state": state,
        "aborted": bool((tally.get("task") or {}).get("aborted")),
        "answer": last.text if isinstance(last, AIMessage) and not last.tool_calls else None,
        "calls": [dataclasses.asdict(row) for row in explain_calls(values, events)],
        "effects": effects,
        "exactly_once": all(count == 1 for count in per_key.values()),
        "cost": _cost(values, events),
        "waiting_for": [
            {"tool": w["tool"], "reason": w["reason"], "message": w["envelope"].get("message")}
            for w in waiting
        ],
        "resume": (
            resume_command(args, thread_id, "--approve|--skip|--edit JSON|--abort")
            if waiting
            else resume_command(args, thread_id)
            if state == "pending"
            else None
        ),
    }


_STYLE = {"ok": "green", "error": "red"}


def _classes(classes: Sequence[str]) -> str:
    """``TRANSIENT x2 → STRUCTURAL``: the classes of a call's failed attempts."""
    runs: list[list[Any]] = []
    for klass in classes:
        if runs and runs[-1][0] == klass:
            runs[-1][1] += 1
        else:
            runs.append([klass, 1])
    return " → ".join(f"{k.upper()}{f' x{n}' if n > 1 else ''}" for k, n in runs) or "-"


def _short_outcome(row: Mapping[str, Any]) -> str:
    if row["recovery"] == "replan":
        return "replaced by the plan" if row["ok"] else "plan failed"
    if row["recovery"] == "escalation" and not row["ok"]:
        return f"not run ({row['how'].rsplit(' ', 1)[-1]})"
    text = str(row["outcome"])
    if not row["ok"]:
        return text[:50]
    return "ok" if text.startswith(("{", "[")) else f"ok: {text.split(':', maxsplit=1)[0][:40]}"


def _calls_table(calls: Sequence[Mapping[str, Any]], width: int) -> RenderableType:
    rows = []
    for row in calls:
        cost = f"{row['executions']} attempt" + ("s" if row["executions"] != 1 else "")
        if row["llm_calls"]:
            cost += f", {row['llm_calls']} LLM"
        if row["backoff_s"]:
            cost += f", {row['backoff_s']:.2f}s wait"
        style = _STYLE["ok" if row["ok"] else "error"]
        rows.append(
            [
                row["tool"],
                escape(row["failed"]),
                _classes(row["classes"]),
                escape(row["how"]),
                cost,
                f"[{style}]{escape(_short_outcome(row))}[/{style}]",
            ]
        )
    return fitted_table(
        "Every tool call: what failed, how it was classified, what recovered it",
        ("tool", "what failed", "class", "recovered by", "cost", "outcome"),
        rows,
        whole={"tool"},
        width=width,
    )


def _effects_table(effects: Sequence[Mapping[str, Any]], width: int) -> RenderableType:
    """One row per effect; its idempotency key is printed whole below (`_effect_keys`)."""
    rows = []
    for effect in effects:
        detail = {k: v for k, v in effect.items() if k not in ("kind", "key", "executions")}
        rows.append([effect["kind"], str(effect["executions"]), escape(args_text(detail))])
    return fitted_table(
        "Side effects in the back office (one row per execution)",
        ("effect", "executions", "detail"),
        rows,
        whole={"effect"},
        width=width,
    )


def _effect_keys(out: Output, effects: Sequence[Mapping[str, Any]]) -> None:
    """Each effect's idempotency key, whole on its own line (never wrapped: copy it)."""
    for effect in effects:
        out.whole(f"  {effect['kind']} key: {effect['key']}")


def _where(out: Output, summary: Mapping[str, Any]) -> None:
    """The last line: where the thread stands, and the command that continues it."""
    thread = f"\nthread [bold]{summary['thread_id']}[/bold]"
    if summary["state"] == "interrupted":
        out.line(f"{thread} waits for a human; answer with:")
        out.whole(f"  [bold]{escape(summary['resume'])}[/bold]")
    elif summary["state"] == "pending":
        out.line(f"{thread} stopped; continue it with:")
        out.whole(f"  [bold]{escape(summary['resume'])}[/bold]")
    elif summary["aborted"]:
        out.line(f"{thread} was aborted by a human")
    else:
        out.line(f"{thread} is done")


def print_summary(out: Output, summary: Mapping[str, Any]) -> None:
    """The summary: a JSON line, or the tables, the cost and the agent's answer."""
    if out.json:
        out.record("summary", summary)
        return
    out.console.print(_calls_table(summary["calls"], out.console.width))
    if summary["effects"]:
        out.console.print(_effects_table(summary["effects"], out.console.width))
        _effect_keys(out, summary["effects"])
        verdict = "exactly once" if summary["exactly_once"] else "[red]MORE THAN ONCE[/red]"
        out.line(f"every side effect ran {verdict}")
    cost = summary["cost"]
    out.line(
        f"cost: {cost['tool_executions']} tool executions, {cost['agent_llm_calls']} agent LLM "
        f"calls + {cost['recovery_llm_calls']} for recovery, {cost['simulated_backoff_s']:.2f}s "
        f"of backoff (simulated), {cost['human_answers']} human answer(s)"
    )
    if summary["answer"]:
        out.line(f"\n[bold]agent[/bold] {escape(summary['answer'])}")
    _where(out, summary)
