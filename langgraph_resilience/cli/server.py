"""``threads --url`` and ``resume --url``: the threads of a graph deployed on LangGraph
Server (``langgraph dev``, a ``langgraph.json`` deployment), through its HTTP API.

The server owns the checkpointer, so these read and answer through it (a
`langgraph_sdk` client): `list_threads`, `thread_status` and `resume` with
``Command(resume=...)`` for a pending escalation.
"""

from __future__ import annotations

import argparse
from typing import Any

from langgraph.types import Command
from langgraph_sdk import get_sync_client
from rich.markup import escape

from langgraph_resilience._graph.escalate import ESCALATION_TYPE
from langgraph_resilience.cli.options import UsageError, answer_of
from langgraph_resilience.cli.output import Output, fitted_table
from langgraph_resilience.cli.runner import resolution
from langgraph_resilience.stores.threads import ThreadStatus, list_threads, resume, thread_status

__all__ = ["cmd_server_resume", "cmd_server_threads"]


def _why(status: ThreadStatus) -> str:
    if status.state == "interrupted":
        asks = [
            f"waits for a human on {r.get('tool')} ({r.get('reason')})"
            if isinstance(r, dict) and r.get("type") == ESCALATION_TYPE
            else f"interrupted: {r!r}"
            for r in status.interrupts
        ]
        return "; ".join(asks)
    if status.state == "failed":
        return f"failed: {status.error}"
    if status.state in ("pending", "running"):
        return f"{'running' if status.state == 'running' else 'stopped'} before " + ", ".join(
            status.next
        )
    return status.state


def _row(status: ThreadStatus) -> dict[str, Any]:
    return {
        "thread_id": status.thread_id,
        "state": status.state,
        "why": _why(status),
        "next": list(status.next),
        "updated_at": status.updated_at,
        "tool_executions": status.tally.get("tool_attempts", 0),
    }


def cmd_server_threads(args: argparse.Namespace, out: Output) -> int:
    """The server's threads, most recently updated first, and where each stands."""
    with get_sync_client(url=args.url) as client:
        found = [_row(thread_status(client, t)) for t in list_threads(client, limit=args.limit)]
    if out.json:
        out.document({"target": args.url, "threads": found})
        return 0
    if not found:
        out.line(f"no threads on {escape(args.url)}")
        return 0
    out.whole(f"threads on {escape(args.url)}")
    rows = [
        [t["thread_id"], t["state"], escape(t["why"]), str(t["tool_executions"])] for t in found
    ]
    out.console.print(
        fitted_table(
            "Threads, the most recently updated on top",
            ("thread", "state", "where / why", "tool runs"),
            rows,
            whole={"thread"},
            width=out.console.width,
        )
    )
    return 0


def cmd_server_resume(args: argparse.Namespace, out: Output) -> int:
    """Answer a thread's pending escalation (or continue it) as a new run on the server."""
    answer = answer_of(args)
    with get_sync_client(url=args.url) as client:
        status = thread_status(client, args.thread_id)
        if status.state == "interrupted" and answer is None:
            raise UsageError(
                f"thread {args.thread_id!r} waits for a human; answer with "
                "--approve, --skip, --edit JSON or --abort"
            )
        if answer is not None and status.state != "interrupted":
            raise UsageError(
                f"thread {args.thread_id!r} has no pending escalation to answer ({status.state})"
            )
        command: Command[Any] | None = None
        if answer is not None:
            pairs = zip(status.interrupt_ids, status.interrupts, strict=True)
            command = Command(
                resume={i: resolution(answer, r if isinstance(r, dict) else {}) for i, r in pairs}
            )
        out.record("resume", thread_id=args.thread_id, state=status.state)
        resume(client, args.thread_id, command=command, assistant_id=args.assistant)
        after = thread_status(client, args.thread_id)
    out.record("thread", _row(after))
    out.whole(f"thread {after.thread_id}: {after.state} ({escape(_why(after))})")
    return 0
