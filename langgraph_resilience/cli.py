"""The ``langgraph-resilience`` command.

``demo`` runs the support agent end to end on an embedded SQLite checkpointer
(or Postgres with ``--dsn`` / ``LANGGRAPH_RESILIENCE_DSN``) and prints, call by
call, what failed, how it was classified and which path recovered it.
User mistakes end in one clear line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import sys
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from langchain_core.messages import ToolMessage
from langchain_core.runnables import RunnableConfig
from rich.console import Console
from rich.table import Table

from langgraph_resilience.demo import CUSTOMER_REQUEST, build_demo
from langgraph_resilience.events import EVENT_KEY
from langgraph_resilience.persistence import (
    Persistence,
    PersistenceError,
    open_postgres,
    open_sqlite,
)
from langgraph_resilience.tools import tool_error_of

__all__ = ["main"]

DSN_ENV = "LANGGRAPH_RESILIENCE_DSN"
EXIT_USAGE = 2


class UsageError(Exception):
    """A user mistake: reported in one line, exit code 2."""


def default_state_dir() -> pathlib.Path:
    """``$XDG_STATE_HOME/langgraph-resilience`` (``~/.local/state/...`` by default)."""
    base = os.environ.get("XDG_STATE_HOME") or str(pathlib.Path.home() / ".local" / "state")
    return pathlib.Path(base) / "langgraph-resilience"


@contextlib.contextmanager
def _persistence(args: argparse.Namespace) -> Iterator[Persistence]:
    dsn = args.dsn or os.environ.get(DSN_ENV)
    try:
        if dsn:
            with open_postgres(dsn) as p:
                yield p
        else:
            state_dir = pathlib.Path(args.state_dir or default_state_dir())
            with open_sqlite(state_dir / "threads.sqlite") as p:
                yield p
    except PersistenceError as exc:
        raise UsageError(str(exc)) from None


def _describe(event: dict[str, Any]) -> str | None:
    kind = event[EVENT_KEY]
    tool = event.get("tool")
    if kind == "attempt":
        if event.get("ok"):
            return f"  ok    {tool} (attempt {event['attempt']})"
        return (
            f"  fail  {tool} (attempt {event['attempt']}): {event.get('error')} "
            f"-> classified {str(event.get('failure_class')).upper()}"
        )
    if kind == "retry_scheduled":
        return f"  retry {tool} in {event['delay']:.2f}s (backoff, simulated clock)"
    if kind == "gave_up":
        reason = event.get("exhausted")
        why = f"budget exhausted: {reason}" if reason else "not retriable"
        return f"  back  {tool} -> agent with a {event.get('failure_class')} envelope ({why})"
    return None


def _summary(values: dict[str, Any]) -> Table:
    ledger = values.get("resilience") or {}
    outcomes: dict[str, ToolMessage] = {
        m.tool_call_id: m for m in values.get("messages", []) if isinstance(m, ToolMessage)
    }
    table = Table(title="What happened to each tool call")
    for column in ("call", "tool", "executions", "class", "recovered by", "outcome"):
        table.add_column(column)
    for call_id, record in (ledger.get("calls") or {}).items():
        message = outcomes.get(call_id)
        error = tool_error_of(message) if message is not None else None
        last = record.get("error") or {}
        if error is None:
            klass = str(last.get("failure_class", "-"))
            path = "retry with backoff" if last else "-"
            outcome = "success"
        else:
            klass = error.failure_class.value
            path = "envelope to agent"
            outcome = f"{error.type}: {error.message[:50]}"
        table.add_row(call_id, record["tool"], str(record["attempts"]), klass, path, outcome)
    return table


def cmd_demo(args: argparse.Namespace, console: Console) -> int:
    """Run the support agent on one thread and explain every failure."""
    demo = build_demo(seed=args.seed)
    thread_id = args.thread_id or f"demo-{uuid.uuid4().hex[:8]}"
    config: RunnableConfig = {"configurable": {"thread_id": thread_id}}
    with _persistence(args) as persistence:
        app = demo.builder.compile(checkpointer=persistence.checkpointer, store=persistence.store)
        if not args.json:
            console.print(f"[bold]thread[/bold] {thread_id}  [dim]({persistence.target})[/dim]")
            console.print(f"[bold]customer[/bold] {CUSTOMER_REQUEST}")
        stream = app.stream(
            {"messages": [("user", CUSTOMER_REQUEST)]},
            config,
            stream_mode=["updates", "custom"],
        )
        for mode, chunk in stream:
            if mode == "custom" and isinstance(chunk, dict) and EVENT_KEY in chunk:
                if args.json:
                    print(json.dumps({"thread_id": thread_id, **chunk}, default=str))
                elif (line := _describe(chunk)) is not None:
                    console.print(line, highlight=False)
            elif mode == "updates" and not args.json and isinstance(chunk, dict):
                for node in chunk:
                    console.print(f"[cyan]> {node}[/cyan]", highlight=False)
        values = app.get_state(config).values
    if args.json:
        print(json.dumps({"thread_id": thread_id, "ledger": values.get("resilience")}))
        return 0
    console.print(_summary(values))
    console.print(f"[bold]agent[/bold] {values['messages'][-1].content}")
    waited = sum(demo.clock.sleeps)
    ledger = values.get("resilience") or {}
    console.print(
        f"cost: {ledger.get('tool_attempts', 0)} tool executions, "
        f"{demo.model.calls} LLM calls, {waited:.2f}s of (simulated) backoff"
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``langgraph-resilience`` command."""
    parser = argparse.ArgumentParser(
        prog="langgraph-resilience",
        description="Classification-driven recovery for LangGraph agents.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the support-agent demo and explain each recovery")
    demo.add_argument("--dsn", help=f"PostgreSQL DSN (default: ${DSN_ENV}, else embedded SQLite)")
    demo.add_argument("--state-dir", help="directory of the embedded SQLite state file")
    demo.add_argument("--thread-id", help="thread id to use (default: a new one)")
    demo.add_argument("--seed", type=int, default=7, help="jitter seed (default: 7)")
    demo.add_argument("--json", action="store_true", help="print JSON lines instead of text")
    demo.set_defaults(handler=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script and of ``python -m langgraph_resilience``."""
    parser = build_parser()
    args = parser.parse_args(argv)
    console = Console(highlight=False)
    try:
        code: int = args.handler(args, console)
    except UsageError as exc:
        print(f"langgraph-resilience: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return code


def run() -> None:
    """Console-script entry point: exit with `main`'s code."""
    sys.exit(main())
