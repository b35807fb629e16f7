"""The ``demo``, ``resume`` and ``bench`` commands."""

from __future__ import annotations

import argparse
import importlib
import pathlib
import sys
import uuid
from typing import Any

from rich.markup import escape

from langgraph_resilience.cli.demo import CUSTOMER_REQUEST
from langgraph_resilience.cli.options import (
    ANSWER_FLAGS,
    Answer,
    UsageError,
    answer_of,
    crash_at,
)
from langgraph_resilience.cli.output import Output
from langgraph_resilience.cli.runner import Runner
from langgraph_resilience.cli.session import (
    escalations,
    existing,
    locked,
    open_session,
    resume_command,
    state_of,
    unfinished,
)
from langgraph_resilience.cli.summary import print_summary, summary
from langgraph_resilience.errors import ConfigurationError

__all__ = ["cmd_bench", "cmd_demo", "cmd_resume"]

_DEFAULT_HINT = (
    "(the default: declining grants nothing; choose with --approve, --edit JSON "
    "or --abort, or --pause to answer later with `resume`)"
)


def cmd_demo(args: argparse.Namespace, out: Output) -> int:
    """Run the support agent on a new thread and explain every failure."""
    chosen = answer_of(args)
    answer = None if args.pause else (chosen or Answer("skip"))
    crash = crash_at(args.crash_at)
    thread_id = args.thread_id or f"demo-{uuid.uuid4().hex[:8]}"
    runners: list[Runner] = []

    def after_effect(tool: str, key: str) -> None:  # the demo's tools call it; crash there
        runners[0].after_effect(tool, key)

    with open_session(args, after_effect=after_effect) as s:
        runner = Runner(s, thread_id, out, args, crash=crash)
        runners.append(runner)
        with locked(s, thread_id):
            if s.app.get_state(runner.config).created_at is not None:
                raise UsageError(
                    f"thread {thread_id!r} already exists; continue it with "
                    f"`{resume_command(args, thread_id)}` or pick another --thread-id"
                )
            out.record("start", thread_id=thread_id, target=s.persistence.target)
            out.whole(
                f"[bold]thread[/bold] {thread_id}  [dim]({escape(s.persistence.target)})[/dim]"
            )
            out.line(f"[bold]customer[/bold] {escape(CUSTOMER_REQUEST)}\n")
            by, hint = "you", ""
            if chosen is None:
                by, hint = "the demo, on your behalf,", _DEFAULT_HINT
            inputs = {"messages": [("user", CUSTOMER_REQUEST)]}
            snapshot = runner.drive(inputs, answer, by=by, hint=hint)
            print_summary(out, summary(s, thread_id, snapshot, args))
            _refused(snapshot, args, thread_id)
    if crash is not None:  # the run ended without reaching it: the user asked for nothing
        raise UsageError(
            f"--crash-at {crash.text} was never reached: the thread ran {runner.step} steps "
            "and ended; nothing was killed (pick a step the output shows, or a node)"
        )
    return 0


def cmd_resume(args: argparse.Namespace, out: Output) -> int:
    """Continue a thread: after a crash, or answering its pending escalation."""
    answer = answer_of(args)
    thread_id = args.thread_id
    with open_session(args) as s:
        runner = Runner(s, thread_id, out, args)
        with locked(s, thread_id):
            snapshot = existing(s, thread_id)
            pending = escalations(snapshot)
            state = state_of(snapshot)
            if answer is not None and not pending:
                raise UsageError(
                    f"thread {thread_id!r} has no pending escalation to answer ({state}); "
                    f"run `{resume_command(args, thread_id)}` without {answer.flag}"
                )
            if pending and answer is None:
                tool = pending[0].value.get("tool")
                raise UsageError(
                    f"thread {thread_id!r} waits for a human to decide on {tool}; "
                    f"answer with {ANSWER_FLAGS}"
                )
            out.record("resume", thread_id=thread_id, state=state)
            out.whole(
                f"[bold]thread[/bold] {thread_id}  [dim]({escape(s.persistence.target)})[/dim]"
            )
            if state == "done":
                out.line("nothing to resume: the thread is done")
            else:
                runner.step = int((snapshot.metadata or {}).get("step") or 0)
                where = ", ".join(unfinished(snapshot))
                out.line(f"resuming after step {runner.step} (next: {where})\n")
                command: Any = None
                if pending and answer is not None:
                    runner.show_request(snapshot)
                    command = runner.answer(snapshot, answer, by="you")
                snapshot = runner.drive(command, None, by="you")
            print_summary(out, summary(s, thread_id, snapshot, args))
            _refused(snapshot, args, thread_id)
    return 0


def _refused(snapshot: Any, args: argparse.Namespace, thread_id: str) -> None:
    """An answer the escalation refused (an --edit that does not fit the tool): the thread
    still waits, and the command fails in one line saying why and how to answer again."""
    for pending in escalations(snapshot):
        error = pending.value.get("error") if isinstance(pending.value, dict) else None
        if error:
            raise UsageError(
                f"your answer was refused ({str(error).splitlines()[0]}); the thread still "
                f"waits: `{resume_command(args, thread_id)}`"
            )


def cmd_bench(args: argparse.Namespace, out: Output) -> int:
    """Run the chaos benchmark. It is not part of the wheel: it lives in the repository's
    ``benchmarks/chaos`` and runs from a checkout (this command, run from the checkout's
    root, or ``python -m benchmarks.chaos``)."""
    if (pathlib.Path.cwd() / "benchmarks" / "chaos" / "bench.py").is_file():
        sys.path.insert(0, str(pathlib.Path.cwd()))
    try:
        bench = importlib.import_module("benchmarks.chaos.bench")
    except ModuleNotFoundError:
        raise UsageError(
            "the chaos benchmark is not installed with the package: run it from a checkout "
            "of the repository (its root), e.g. python -m benchmarks.chaos --quick"
        ) from None
    try:
        return int(bench.cmd_bench(args, out.console))
    except ConfigurationError as exc:
        raise UsageError(str(exc)) from None
