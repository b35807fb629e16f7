"""Running a thread: stream it, explain each step, answer escalations, crash on request."""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
from collections.abc import Mapping
from typing import Any, NoReturn

from langchain_core.runnables import RunnableConfig
from langgraph.types import Command, StateSnapshot
from rich.markup import escape

from langgraph_resilience.cli.options import Answer, CrashAt
from langgraph_resilience.cli.output import Output, args_text, class_text
from langgraph_resilience.cli.session import Session, escalations, resume_command, thread_config
from langgraph_resilience.cli.steps import describe_step
from langgraph_resilience.events import EVENT_KEY

__all__ = ["Runner"]


def resolution(answer: Answer, request: Mapping[str, Any]) -> dict[str, Any]:
    """The resume value answering one escalation `request` with a human's `answer`,
    bound to the request's call (the node refuses it for any other)."""
    bound = {"call_id": request["call_id"]} if request.get("call_id") else {}
    if answer.action == "approve":
        return {"action": "retry", **bound}
    if answer.action == "edit":
        args = {**(request.get("args") or {}), **(answer.edit or {})}
        return {"action": "edit", "args": args, **bound}
    note = f"{answer.action} decided by a human operator"
    return {"action": answer.action, "note": note, **bound}


@dataclasses.dataclass(eq=False)
class Runner:
    """Streams a thread, explains each step, answers escalations, crashes on request."""

    session: Session
    thread_id: str
    out: Output
    args: argparse.Namespace
    crash: CrashAt | None = dataclasses.field(default=None, kw_only=True)
    step: int = dataclasses.field(default=0, init=False)
    """The last checkpointed step."""
    runs: dict[str, int] = dataclasses.field(default_factory=dict, init=False)
    """Runs of each node so far (for ``--crash-at NODE:K``)."""
    ran: list[str] = dataclasses.field(default_factory=list, init=False)
    """The nodes that ran since the last checkpoint."""

    @property
    def config(self) -> RunnableConfig:
        """The thread's run config."""
        return thread_config(self.thread_id)

    def die(self, where: str) -> NoReturn:
        """Print how to resume, then SIGKILL this process: no cleanup, like a real crash."""
        command = resume_command(self.args, self.thread_id)
        self.out.record("crash", thread_id=self.thread_id, at=where, resume=command)
        self.out.line(f"\n[bold red]✝ killed[/bold red] at {escape(where)}")
        self.out.line(f"  thread [bold]{self.thread_id}[/bold]; continue it with:")
        self.out.line(f"  [bold]{escape(command)}[/bold]")
        self.out.flush()
        os.kill(os.getpid(), signal.SIGKILL)
        raise SystemExit(137)  # pragma: no cover - SIGKILL does not return

    def after_effect(self, tool: str, key: str) -> None:
        """The demo's crash hook inside a side-effecting tool."""
        if self.crash is not None and self.crash.effect == tool:
            self.die(f"{tool}, after the effect and before any checkpoint (key {key})")

    def _checkpoint(self, step: int) -> None:
        self.step = step
        crash = self.crash
        if crash is None or step < 1:
            return
        if crash.step is not None and step == crash.step:
            self.die(f"step {step}, after its checkpoint")
        if (
            crash.node is not None
            and crash.node in self.ran
            and (self.runs.get(crash.node, 0) == crash.nth)
        ):
            self.die(f"{crash.node} run {crash.nth} (step {step}), after its checkpoint")
        self.ran = []

    def _updates(self, chunk: Mapping[str, Any], events: list[dict[str, Any]]) -> None:
        """Explain each node's update of one step with the events it emitted."""
        cached = bool((chunk.get("__metadata__") or {}).get("cached"))
        for node, update in chunk.items():
            if node.startswith("__"):  # __interrupt__ (shown later), __metadata__
                continue
            self.runs[node] = self.runs.get(node, 0) + 1
            self.ran.append(node)
            self.out.record(
                "step", thread_id=self.thread_id, step=self.step + 1, node=node, saved=cached
            )
            lines = describe_step(node, update, events)
            if cached:
                lines.insert(0, "[dim](its result was saved before the crash: not run again)[/dim]")
            self.out.step(self.step + 1, node, lines)
            self.session.store.log_events(self.thread_id, events)
            events.clear()

    def stream(self, command: Any) -> None:
        """Run until the graph ends or interrupts, printing each step."""
        events: list[dict[str, Any]] = []
        stream = self.session.app.stream(
            command,
            self.config,
            stream_mode=["updates", "custom", "checkpoints"],
            durability="sync",
        )
        for mode, chunk in stream:
            if mode == "checkpoints" and isinstance(chunk, dict):
                self._checkpoint(int((chunk.get("metadata") or {}).get("step", 0)))
            elif mode == "custom" and isinstance(chunk, dict) and EVENT_KEY in chunk:
                events.append(dict(chunk))
                self.out.record("event", chunk, thread_id=self.thread_id, step=self.step + 1)
            elif mode == "updates" and isinstance(chunk, dict):
                self._updates(chunk, events)
        self.session.store.log_events(self.thread_id, events)

    def answer(
        self, snapshot: StateSnapshot, answer: Answer, *, by: str, hint: str = ""
    ) -> Command[Any]:
        """The ``Command(resume=...)`` answering every pending escalation with `answer`."""
        resume: dict[str, Any] = {}
        for pending in escalations(snapshot):
            request = pending.value
            if answer.action == "approve":
                self.session.store.approve(self.thread_id, str(request["tool"]))
            decided = resolution(answer, request)
            resume[pending.id] = decided
            self.out.record(
                "answer", thread_id=self.thread_id, tool=request["tool"], by=by, answer=decided
            )
            detail = f" with {escape(args_text(decided['args']))}" if "args" in decided else ""
            approved = " (the supervisor's approval is recorded in the back office)"
            self.out.note(
                f"⚑ {by} answered [bold]{answer.flag}[/bold]{detail}"
                f"{approved if answer.action == 'approve' else ''}"
            )
            if hint:
                self.out.note(f"  [dim]{escape(hint)}[/dim]")
        return Command(resume=resume)

    def show_request(self, snapshot: StateSnapshot) -> None:
        """Print what each pending escalation asks a human."""
        for pending in escalations(snapshot):
            request = pending.value
            envelope = request.get("envelope") or {}
            self.out.note(
                f"⚑ [bold]{request['tool']}[/bold] waits for a human: "
                f"{escape(str(envelope.get('message', '')))} "
                f"({class_text(envelope.get('failure_class'))})"
            )
            self.out.note(f"  request: {escape(args_text(request.get('args') or {}))}")
            if request.get("error"):  # the previous answer did not fit: asked again
                self.out.note(f"  [red]refused:[/red] {escape(str(request['error']))}")

    def drive(
        self, command: Any, answer: Answer | None, *, by: str, hint: str = ""
    ) -> StateSnapshot:
        """Stream; answer the first escalation with `answer`; stop at any further one."""
        while True:
            self.stream(command)
            snapshot = self.session.app.get_state(self.config)
            if not escalations(snapshot):
                return snapshot
            self.show_request(snapshot)
            if answer is None:
                return snapshot
            command, answer = self.answer(snapshot, answer, by=by, hint=hint), None
