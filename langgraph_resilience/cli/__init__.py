"""The ``langgraph-resilience`` command: ``demo``, ``threads`` and ``resume``.

``demo`` runs the support agent (`langgraph_resilience.cli.demo`) on a new thread and
prints, step by step, every tool call that failed, how it was classified, which
path recovered it and what that cost, then a table of every call and the back
office's side-effect log. Its state lives in an embedded SQLite file under
``$XDG_STATE_HOME/langgraph-resilience`` or, with ``--dsn postgresql://...`` (or
``LANGGRAPH_RESILIENCE_DSN``), in Postgres.

The goodwill credit the agent offers is above its limit: a POLICY failure that
only a human may decide. ``demo`` answers it on your behalf with ``--skip`` (the
default: declining grants nothing, so it is the one answer a program may give
for a human), ``--approve``, ``--edit JSON`` or ``--abort``; ``--pause`` leaves
the thread waiting durably instead, for ``resume THREAD_ID --approve`` from any
process, later.

``demo --crash-at STEP`` kills the process (SIGKILL: no cleanup, exit status 137
in a shell) at STEP, after printing the thread id and the command that resumes
it:

- ``refund`` (or ``goodwill_credit``): inside the side-effecting tool, right
  after the money moved and before anything else is recorded, the crash that
  makes naive agents pay twice; ``resume`` reconciles it through the tool's
  status check instead of running it again;
- ``NODE`` or ``NODE:K`` (``agent``, ``tools``, ``retry``, ``repair``, ``planner``,
  ``executor``, ``escalate``): at the node boundary after the K-th (default
  first) run of that node, once its checkpoint is durable;
- ``N``: after step N, as numbered in the left column of the output.

``threads`` lists the threads with where each stands; ``resume`` continues one
(holding its thread lock: a second concurrent ``resume`` is refused). User
mistakes end in one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import importlib
import json
import os
import pathlib
import shlex
import signal
import sqlite3
import sys
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal, NoReturn, TextIO

import psycopg
from langchain_core.messages import AIMessage, AnyMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Command, StateSnapshot
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from langgraph_resilience.cli.demo import (
    CUSTOMER_REQUEST,
    SIDE_EFFECTS,
    AfterEffect,
    DemoStore,
    SupportDemo,
    build_demo,
    is_demo_thread,
    open_demo_store,
)
from langgraph_resilience.core.redaction import redact
from langgraph_resilience.errors import ConfigurationError
from langgraph_resilience.events import EVENT_KEY
from langgraph_resilience.graph.escalate import ESCALATION_TYPE
from langgraph_resilience.graph.state import PLAN_CALL_PREFIX, call_slot
from langgraph_resilience.stores.persistence import (
    Persistence,
    PersistenceError,
    ThreadBusyError,
    ThreadNotFoundError,
    ThreadStatus,
    list_threads,
    open_postgres,
    open_sqlite,
    thread_status,
)

__all__ = ["build_parser", "main", "run"]

DSN_ENV = "LANGGRAPH_RESILIENCE_DSN"
EXIT_USAGE = 2
NODES = ("agent", "tools", "retry", "repair", "planner", "executor", "escalate")
ANSWER_FLAGS = "--approve, --skip, --edit JSON or --abort"


class UsageError(Exception):
    """A user mistake: reported in one line, exit code 2."""


def default_state_dir() -> pathlib.Path:
    """``$XDG_STATE_HOME/langgraph-resilience`` (``~/.local/state/...`` by default)."""
    base = os.environ.get("XDG_STATE_HOME") or str(pathlib.Path.home() / ".local" / "state")
    return pathlib.Path(base) / "langgraph-resilience"


# ------------------------------------------------------------------ arguments


@dataclasses.dataclass(frozen=True, slots=True)
class Answer:
    """A human's answer to a pending escalation, from the command line."""

    action: Literal["approve", "skip", "edit", "abort"]
    edit: dict[str, Any] | None = None

    @property
    def flag(self) -> str:
        return f"--{self.action}"


def _answer(args: argparse.Namespace) -> Answer | None:
    """The answer flag given, validated before anything is opened."""
    if args.edit is not None:
        try:
            edit = json.loads(args.edit)
        except json.JSONDecodeError as exc:
            raise UsageError(
                f"--edit: invalid JSON ({exc.msg} at column {exc.colno}); pass an object "
                "of new arguments, e.g. --edit '{\"amount\": 10}'"
            ) from None
        if not isinstance(edit, dict) or not edit:
            raise UsageError(
                "--edit needs a non-empty JSON object of new arguments, e.g. "
                "--edit '{\"amount\": 10}'"
            )
        return Answer("edit", edit)
    actions: tuple[Literal["approve", "skip", "abort"], ...] = ("approve", "skip", "abort")
    for action in actions:
        if getattr(args, action, False):
            return Answer(action)
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class CrashAt:
    """Where ``--crash-at`` kills the process (see the module docstring)."""

    text: str
    effect: str | None = None
    node: str | None = None
    nth: int = 1
    step: int | None = None


def _crash_at(text: str | None) -> CrashAt | None:
    if text is None:
        return None
    valid = (
        f"use a side effect ({', '.join(SIDE_EFFECTS)}), a node ({', '.join(NODES)}), "
        "NODE:K for its K-th run, or a step number"
    )
    if text in SIDE_EFFECTS:
        return CrashAt(text, effect=text)
    if text.isdigit():
        return CrashAt(text, step=int(text))
    node, _, nth = text.partition(":")
    if node in NODES and (not nth or (nth.isdigit() and int(nth) >= 1)):
        return CrashAt(text, node=node, nth=int(nth or 1))
    raise UsageError(f"--crash-at {text!r} is not a crash point; {valid}")


# ------------------------------------------------------------------ persistence


def _dsn(args: argparse.Namespace) -> str | None:
    return args.dsn or os.environ.get(DSN_ENV) or None


@contextlib.contextmanager
def _persistence(args: argparse.Namespace) -> Iterator[Persistence]:
    dsn = _dsn(args)
    try:
        if dsn:
            with open_postgres(dsn, timeout=5) as p:
                yield p
        else:
            state_dir = pathlib.Path(args.state_dir or default_state_dir())
            with open_sqlite(state_dir / "threads.sqlite") as p:
                yield p
    except PersistenceError as exc:
        raise UsageError(str(exc)) from None


@dataclasses.dataclass
class Session:
    """An open state store with the demo graph compiled on it."""

    persistence: Persistence
    store: DemoStore
    demo: SupportDemo
    app: CompiledStateGraph[Any, Any, Any, Any]


@contextlib.contextmanager
def _session(
    args: argparse.Namespace, *, after_effect: AfterEffect | None = None
) -> Iterator[Session]:
    with _persistence(args) as p, open_demo_store(p) as store:
        demo = build_demo(
            store=store,
            seed=args.seed,
            idempotency=p.idempotency,
            saga=p.saga,
            after_effect=after_effect,
        )
        app = demo.builder.compile(checkpointer=p.checkpointer, store=p.store)
        yield Session(persistence=p, store=store, demo=demo, app=app)


def _config(thread_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id}, "recursion_limit": 100}


def _resume_command(args: argparse.Namespace, thread_id: str, flags: str = "") -> str:
    """The command that continues `thread_id` (a DSN given with --dsn is redacted)."""
    parts = ["langgraph-resilience", "resume", shlex.quote(thread_id)]
    if args.dsn:
        parts += ["--dsn", shlex.quote(redact(args.dsn))]
    if args.state_dir:
        parts += ["--state-dir", shlex.quote(args.state_dir)]
    if flags:
        parts.append(flags)
    return " ".join(parts)


# ------------------------------------------------------------------ output


def _args_text(args: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in args.items())


def _class(value: Any) -> str:
    return str(value or "-").upper()


class Output:
    """Text (rich; plain when not a terminal) or JSON lines on `file` (stdout)."""

    def __init__(self, *, json_mode: bool, file: TextIO | None = None) -> None:
        self.json = json_mode
        self.file = file if file is not None else sys.stdout
        self.console = Console(file=self.file, highlight=False, soft_wrap=False)

    def line(self, text: str = "") -> None:
        if not self.json:
            self.console.print(text)

    def record(self, kind: str, fields: Mapping[str, Any] | None = None, /, **more: Any) -> None:
        """One JSON line (in JSON mode): ``{"kind": kind, **fields, **more}``."""
        if self.json:
            self.document({**(fields or {}), **more, "kind": kind})

    def document(self, value: Any) -> None:
        """One JSON document on its own line, flushed (for pipes)."""
        print(json.dumps(value, default=str), file=self.file, flush=True)

    def step(self, step: int | str, node: str, lines: Sequence[str]) -> None:
        """One step: its number and node, then its lines (wrapped lines stay indented)."""
        if self.json:
            return
        grid = Table.grid(padding=(0, 1))
        grid.add_column(justify="right", width=3, style="dim")
        grid.add_column(width=9, style="cyan")
        grid.add_column(ratio=1, overflow="fold")
        for i, text in enumerate(lines or [""]):
            grid.add_row(str(step) if i == 0 else "", node if i == 0 else "", text)
        self.console.print(grid)

    def note(self, text: str) -> None:
        """A line under the current step, indented like the step's lines."""
        self.step("", "", [text])

    def flush(self) -> None:
        self.file.flush()


# ------------------------------------------------------------------ explaining a step


def _errors(update: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    ledger = update.get("resilience") or {}
    return {
        str(record.get("call_id") or slot): record
        for slot, record in (ledger.get("calls") or {}).items()
        if record
    }


def _message_of(error: Mapping[str, Any] | None, fallback: str) -> str:
    if not error:
        return fallback
    text = str(error.get("message") or error.get("type") or fallback)
    return text.splitlines()[0][:90]


_RESOLVED = {
    "retry": "runs again",
    "edit": "runs again with the new arguments",
    "skip": "is not run; the agent is told why",
    "abort": "is not run and the task stops (recorded effects are compensated)",
}


def _describe(
    event: Mapping[str, Any], records: Mapping[str, dict[str, Any]], answers: dict[str, ToolMessage]
) -> str | None:
    """One line for a resilience event, enriched with the step's ledger delta."""
    kind = event[EVENT_KEY]
    tool = event.get("tool")
    call_id = str(event.get("call_id") or "")
    record = records.get(call_id) or {}
    if kind == "attempt":
        if not event.get("ok"):
            error = record.get("error")
            return (
                f"[red]✗[/red] {tool} attempt {event['attempt']}: "
                f"{escape(_message_of(error, str(event.get('error'))).split(f'{tool}: ', 1)[-1])} "
                f"→ [bold]{_class(event.get('failure_class'))}[/bold]"
            )
        message = answers.get(call_id)
        meta = (message.response_metadata.get("resilience") if message else None) or {}
        if meta.get("reconciled"):
            return (
                f"[green]✓[/green] {tool}: status_check found the effect under its "
                "idempotency key → reconciled, [bold]not run again[/bold]"
            )
        if meta.get("replayed"):
            return f"[green]✓[/green] {tool}: outcome already recorded → replayed, not run again"
        return f"[green]✓[/green] {tool} attempt {event['attempt']}"
    if kind == "retry_scheduled":
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
    if kind == "backoff":
        return f"⧗ waited {event['seconds']:.2f}s (simulated clock) before retrying"
    if kind == "coercion":
        changes = "; ".join(event.get("changes") or [])
        return f"≈ {tool}: {escape(changes)} → SEMANTIC fixed by lossless coercion (no LLM call)"
    if kind == "repair_outcome":
        trail = record.get("trail") or []
        before = trail[-1]["args"] if trail else {}
        diff = ", ".join(
            f"{k}: {before.get(k)!r} → {v!r}"
            for k, v in (record.get("args") or {}).items()
            if before.get(k) != v
        )
        what = f" ({escape(diff)})" if diff else ""
        return f"✎ repair model re-issued {tool}: {event['outcome']}{what}, 1 LLM call"
    if kind == "breaker":
        return (
            f"⊘ circuit breaker {event['key']}: {event['from_state']} → "
            f"[bold]{event['to_state']}[/bold] ({event['reason']})"
        )
    if kind == "fallback":
        return f"⇢ {tool} is out ({_class(event.get('failure_class'))}) → served by {event['to']}"
    if kind == "replan_needed":
        return f"⟳ {tool} cannot be retried ({_class(event.get('failure_class'))}) → planner"
    if kind == "plan_verdict":
        if event.get("accepted"):
            return f"✓ plan verified and accepted: {' → '.join(event.get('steps') or [])}"
        return f"✗ plan rejected: {', '.join(event.get('reasons') or [])}"
    if kind == "plan_step":
        if event.get("issue"):
            return f"→ plan step: {', '.join(event['issue'])}"
        return f"plan {event.get('status')}"
    if kind == "escalate_needed":
        return f"⚑ {tool}: {_class(event.get('failure_class'))} → only a human may decide"
    if kind == "resolution":
        effect = _RESOLVED.get(str(event["action"]), "")
        return f"⚑ [bold]{event['action']}[/bold]: {tool} {effect}"
    if kind == "gave_up":
        why = event.get("exhausted") or "no recovery path"
        return f"↩ {tool}: {_class(event.get('failure_class'))} envelope to the agent ({why})"
    if kind == "loop_detected":
        return f"∞ {tool}: loop detected → not executed"
    if kind == "compensation":
        return f"↶ compensated {event.get('compensated')}"
    return None  # route, escalation (shown with the interrupt), repair_requested


def _describe_step(node: str, update: Any, events: Sequence[Mapping[str, Any]]) -> list[str]:
    """The lines of one node's step: what the agent/planner said, then its events."""
    update = update if isinstance(update, Mapping) else {}
    messages: list[AnyMessage] = list(update.get("messages") or [])
    answers = {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}
    lines: list[str] = []
    if node == "agent":
        for message in messages:
            if not isinstance(message, AIMessage):
                continue
            if message.tool_calls:
                calls = "  ".join(
                    f"{c['name']}({escape(_args_text(c['args']))})" for c in message.tool_calls
                )
                lines.append(f"[italic]{escape(message.text)}[/italic]")
                lines.append(f"→ {calls}")
            else:
                lines.append("answers the customer (below)")
    plan = (update.get("resilience") or {}).get("plan")
    if node == "planner" and plan and plan.get("status") == "running":
        diagnosis = plan["plan"]["diagnosis"]
        lines.append(f"diagnosis: {escape(diagnosis['cause'])}")
        lines.append(f"rationale: {escape(plan['plan']['rationale'])}")
    records = _errors(update)
    for event in events:
        text = _describe(event, records, answers)
        if text is not None:
            lines.append(text)
    return lines


# ------------------------------------------------------------------ running a thread


def _escalations(snapshot: StateSnapshot) -> list[Any]:
    """The pending interrupts that are our escalations."""
    return [
        i
        for i in snapshot.interrupts
        if isinstance(i.value, dict) and i.value.get("type") == ESCALATION_TYPE
    ]


def _resolution(answer: Answer, request: Mapping[str, Any]) -> dict[str, Any]:
    if answer.action == "approve":
        return {"action": "retry"}
    if answer.action == "edit":
        return {"action": "edit", "args": {**(request.get("args") or {}), **(answer.edit or {})}}
    return {"action": answer.action, "note": f"{answer.action} decided by a human operator"}


class Runner:
    """Streams a thread, explains each step, answers escalations, crashes on request."""

    def __init__(
        self,
        session: Session,
        thread_id: str,
        out: Output,
        args: argparse.Namespace,
        *,
        crash: CrashAt | None = None,
    ) -> None:
        self.session = session
        self.thread_id = thread_id
        self.out = out
        self.args = args
        self.crash = crash
        self.config = _config(thread_id)
        self.step = 0
        self.runs: dict[str, int] = {}
        self.ran: list[str] = []

    def die(self, where: str) -> NoReturn:
        """Print how to resume, then SIGKILL this process: no cleanup, like a real crash."""
        command = _resume_command(self.args, self.thread_id)
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
                cached = bool((chunk.get("__metadata__") or {}).get("cached"))
                for node, update in chunk.items():
                    if node.startswith("__"):  # __interrupt__ (shown later), __metadata__
                        continue
                    self.runs[node] = self.runs.get(node, 0) + 1
                    self.ran.append(node)
                    self.out.record(
                        "step",
                        thread_id=self.thread_id,
                        step=self.step + 1,
                        node=node,
                        saved=cached,
                    )
                    lines = _describe_step(node, update, events)
                    if cached:
                        lines.insert(
                            0, "[dim](its result was saved before the crash: not run again)[/dim]"
                        )
                    self.out.step(self.step + 1, node, lines)
                    self.session.store.log_events(self.thread_id, events)
                    events = []
        self.session.store.log_events(self.thread_id, events)

    def answer(
        self, snapshot: StateSnapshot, answer: Answer, *, by: str, hint: str = ""
    ) -> Command[Any]:
        """The ``Command(resume=...)`` answering every pending escalation with `answer`."""
        resume: dict[str, Any] = {}
        for pending in _escalations(snapshot):
            request = pending.value
            if answer.action == "approve":
                self.session.store.approve(self.thread_id, str(request["tool"]))
            resolution = _resolution(answer, request)
            resume[pending.id] = resolution
            self.out.record(
                "answer", thread_id=self.thread_id, tool=request["tool"], by=by, answer=resolution
            )
            detail = (
                f" with {escape(_args_text(resolution['args']))}" if "args" in resolution else ""
            )
            approved = " (the supervisor's approval is recorded in the back office)"
            self.out.note(
                f"⚑ {by} answered [bold]{answer.flag}[/bold]{detail}"
                f"{approved if answer.action == 'approve' else ''}"
            )
            if hint:
                self.out.note(f"  [dim]{escape(hint)}[/dim]")
        return Command(resume=resume)

    def show_request(self, snapshot: StateSnapshot) -> None:
        for pending in _escalations(snapshot):
            request = pending.value
            envelope = request.get("envelope") or {}
            self.out.note(
                f"⚑ [bold]{request['tool']}[/bold] waits for a human: "
                f"{escape(str(envelope.get('message', '')))} "
                f"({_class(envelope.get('failure_class'))})"
            )
            self.out.note(f"  request: {escape(_args_text(request.get('args') or {}))}")

    def drive(
        self, command: Any, answer: Answer | None, *, by: str, hint: str = ""
    ) -> StateSnapshot:
        """Stream; answer the first escalation with `answer`; stop at any further one."""
        while True:
            self.stream(command)
            snapshot = self.session.app.get_state(self.config)
            if not _escalations(snapshot):
                return snapshot
            self.show_request(snapshot)
            if answer is None:
                return snapshot
            command, answer = self.answer(snapshot, answer, by=by, hint=hint), None


# ------------------------------------------------------------------ the summary


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


def _envelope(message: ToolMessage | None) -> dict[str, Any]:
    if message is None or message.status != "error" or not isinstance(message.artifact, dict):
        return {}
    envelope = message.artifact.get("tool_error")
    return envelope if isinstance(envelope, dict) else {}


def _explain(
    call: Mapping[str, Any],
    record: Mapping[str, Any],
    message: ToolMessage | None,
    resolutions: Mapping[str, str],
) -> tuple[str, str, str, str]:
    """(failure class, what failed, recovery key, how) of one call."""
    error = record.get("error") or {}
    meta = (message.response_metadata.get("resilience") if message else None) or {}
    envelope = _envelope(message)
    context = envelope.get("context") or {}
    klass = str(error.get("failure_class") or "-")
    failed = _message_of(error, "-") if error else "-"
    call_id = str(call["id"])
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
            _message_of(first, "-").split(": ", 1)[-1],
            "repair",
            "reflection repair",
        )
    if record.get("coercions"):
        return "semantic", "; ".join(record["coercions"]), "coercion", "coercion (no LLM)"
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
            _message_of(envelope, "-"),
            "envelope",
            "envelope to the agent",
        )
    if record.get("status") in ("scheduled", "escalate", "repair", "replan"):
        return klass, failed, "pending", f"waiting ({record['status']})"
    return "-", "-", "none", "-"


def explain_calls(values: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> list[CallRow]:
    """Every tool call of a thread, in order, with its failure, recovery and cost."""
    ledger = values.get("resilience") or {}
    records = ledger.get("calls") or {}
    messages = values.get("messages") or []
    answers = {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}
    backoff: dict[str, float] = {}
    resolutions: dict[str, str] = {}
    classes: dict[str, list[str]] = {}
    for event in events:
        if event.get(EVENT_KEY) == "attempt" and not event.get("ok"):
            classes.setdefault(str(event.get("call_id")), []).append(
                str(event.get("failure_class"))
            )
        elif event.get(EVENT_KEY) == "retry_scheduled":
            call_id = str(event.get("call_id"))
            backoff[call_id] = backoff.get(call_id, 0.0) + float(event.get("delay") or 0.0)
        elif event.get(EVENT_KEY) == "resolution":
            resolutions[str(event.get("call_id"))] = str(event.get("action"))
    plan = ledger.get("plan") or {}
    rows: list[CallRow] = []
    for index, message in enumerate(messages):
        if not isinstance(message, AIMessage):
            continue
        for position, call in enumerate(message.tool_calls):
            call_id = str(call["id"])
            record = records.get(call_slot(message, index, position)) or {}
            answer = answers.get(call_id)
            klass, failed, recovery, how = _explain(call, record, answer, resolutions)
            llm_calls = int(record.get("repairs") or 0)
            if recovery == "replan":
                llm_calls += int((ledger.get("task") or {}).get("replans") or 0) if plan else 0
            ok = answer is not None and answer.status != "error"
            if recovery == "replan":
                ok = plan.get("status") == "completed"
            outcome = str(answer.text if answer is not None else "(no answer yet)")
            if answer is not None and answer.status == "error":
                outcome = f"error: {_message_of(_envelope(answer), answer.text)}"
            rows.append(
                CallRow(
                    call_id=call_id,
                    tool=call["name"],
                    failure_class=klass,
                    classes=classes.get(call_id) or ([klass] if klass != "-" else []),
                    failed=failed,
                    recovery=recovery,
                    how=how,
                    ok=ok,
                    outcome=outcome[:100],
                    executions=int(record.get("attempts") or 0),
                    llm_calls=llm_calls,
                    backoff_s=round(backoff.get(call_id, 0.0), 6),
                )
            )
    return rows


def _unfinished(snapshot: StateSnapshot) -> tuple[str, ...]:
    """The nodes of the thread's open step. LangGraph leaves a task whose result was
    saved (the process died before the step was committed) out of ``next``, but a
    finished thread has no tasks at all."""
    return tuple(snapshot.next) or tuple(task.name for task in snapshot.tasks)


def _state_of(snapshot: StateSnapshot) -> str:
    if _escalations(snapshot) or snapshot.interrupts:
        return "interrupted"
    if _unfinished(snapshot):
        return "pending"
    return "done"


def _summary(
    session: Session, thread_id: str, snapshot: StateSnapshot, args: argparse.Namespace
) -> dict[str, Any]:
    values = snapshot.values
    events = session.store.events(thread_id)
    rows = explain_calls(values, events)
    effects = session.store.effects(thread_id)
    per_key: dict[str, int] = {}
    for effect in effects:
        per_key[effect["key"]] = per_key.get(effect["key"], 0) + 1
    ledger = values.get("resilience") or {}
    messages = values.get("messages") or []
    agent_calls = sum(1 for m in messages if isinstance(m, AIMessage) and m.name is None)
    last = messages[-1] if messages else None
    state = _state_of(snapshot)
    waiting = [i.value for i in _escalations(snapshot)]
    return {
        "kind": "summary",
        "thread_id": thread_id,
        "state": state,
        "aborted": bool((ledger.get("task") or {}).get("aborted")),
        "answer": last.text if isinstance(last, AIMessage) and not last.tool_calls else None,
        "calls": [dataclasses.asdict(row) for row in rows],
        "effects": [
            {"kind": e["kind"], "key": e["key"], "executions": per_key[e["key"]], **e["detail"]}
            for e in effects
            if e["id"] == min(x["id"] for x in effects if x["key"] == e["key"])
        ],
        "exactly_once": all(count == 1 for count in per_key.values()),
        "cost": {
            "tool_executions": int(ledger.get("tool_attempts") or 0),
            "agent_llm_calls": agent_calls,
            "recovery_llm_calls": int(ledger.get("llm_calls") or 0),
            "simulated_backoff_s": round(
                sum(float(e.get("seconds") or 0) for e in events if e.get(EVENT_KEY) == "backoff"),
                6,
            ),
            "human_answers": sum(1 for e in events if e.get(EVENT_KEY) == "resolution"),
        },
        "waiting_for": [
            {"tool": w["tool"], "reason": w["reason"], "message": w["envelope"].get("message")}
            for w in waiting
        ],
        "resume": (
            _resume_command(args, thread_id, "--approve|--skip|--edit JSON|--abort")
            if waiting
            else _resume_command(args, thread_id)
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


def _print_summary(out: Output, summary: Mapping[str, Any]) -> None:
    if out.json:
        out.record("summary", summary)
        return
    table = Table(title="Every tool call: what failed, how it was classified, what recovered it")
    for column in ("tool", "what failed", "class", "recovered by", "cost", "outcome"):
        table.add_column(column, overflow="fold", no_wrap=column == "tool")
    for row in summary["calls"]:
        cost = f"{row['executions']} attempt" + ("s" if row["executions"] != 1 else "")
        if row["llm_calls"]:
            cost += f", {row['llm_calls']} LLM"
        if row["backoff_s"]:
            cost += f", {row['backoff_s']:.2f}s wait"
        style = _STYLE["ok" if row["ok"] else "error"]
        table.add_row(
            row["tool"],
            escape(row["failed"]),
            _classes(row["classes"]),
            escape(row["how"]),
            cost,
            f"[{style}]{escape(_short_outcome(row))}[/{style}]",
        )
    out.console.print(table)
    if summary["effects"]:
        effects = Table(title="Side effects in the back office (one row per execution)")
        for column in ("effect", "idempotency key", "executions", "detail"):
            effects.add_column(column)
        for effect in summary["effects"]:
            detail = {k: v for k, v in effect.items() if k not in ("kind", "key", "executions")}
            effects.add_row(
                effect["kind"], effect["key"], str(effect["executions"]), _args_text(detail)
            )
        out.console.print(effects)
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
    if summary["state"] == "interrupted":
        out.line(f"\nthread [bold]{summary['thread_id']}[/bold] waits for a human; answer with:")
        out.line(f"  [bold]{escape(summary['resume'])}[/bold]")
    elif summary["state"] == "pending":
        out.line(f"\nthread [bold]{summary['thread_id']}[/bold] stopped; continue it with:")
        out.line(f"  [bold]{escape(summary['resume'])}[/bold]")
    elif summary["aborted"]:
        out.line(f"\nthread [bold]{summary['thread_id']}[/bold] was aborted by a human")
    else:
        out.line(f"\nthread [bold]{summary['thread_id']}[/bold] is done")


# ------------------------------------------------------------------ commands


def cmd_demo(args: argparse.Namespace, out: Output) -> int:
    """Run the support agent on a new thread and explain every failure."""
    chosen = _answer(args)
    answer = None if args.pause else (chosen or Answer("skip"))
    crash = _crash_at(args.crash_at)
    thread_id = args.thread_id or f"demo-{uuid.uuid4().hex[:8]}"
    runners: list[Runner] = []

    def after_effect(tool: str, key: str) -> None:  # the demo's tools call it; crash there
        runners[0].after_effect(tool, key)

    with _session(args, after_effect=after_effect) as s:
        runner = Runner(s, thread_id, out, args, crash=crash)
        runners.append(runner)
        with _locked(s, thread_id):
            if s.app.get_state(runner.config).created_at is not None:
                raise UsageError(
                    f"thread {thread_id!r} already exists; continue it with "
                    f"`{_resume_command(args, thread_id)}` or pick another --thread-id"
                )
            out.record("start", thread_id=thread_id, target=s.persistence.target)
            out.line(
                f"[bold]thread[/bold] {thread_id}  [dim]({escape(s.persistence.target)})[/dim]"
            )
            out.line(f"[bold]customer[/bold] {escape(CUSTOMER_REQUEST)}\n")
            by, hint = "you", ""
            if chosen is None:
                by = "the demo, on your behalf,"
                hint = (
                    "(the default: declining grants nothing; choose with --approve, --edit JSON "
                    "or --abort, or --pause to answer later with `resume`)"
                )
            inputs = {"messages": [("user", CUSTOMER_REQUEST)]}
            snapshot = runner.drive(inputs, answer, by=by, hint=hint)
            if crash is not None:
                out.line(f"[yellow]--crash-at {crash.text} was never reached[/yellow]")
            _print_summary(out, _summary(s, thread_id, snapshot, args))
    return 0


@contextlib.contextmanager
def _locked(session: Session, thread_id: str) -> Iterator[None]:
    try:
        with session.persistence.thread_lock(thread_id):
            yield
    except ThreadBusyError:
        raise UsageError(
            f"thread {thread_id!r} is being run by another process; wait for it to finish"
        ) from None


def _existing(session: Session, thread_id: str) -> StateSnapshot:
    snapshot = session.app.get_state(_config(thread_id))
    if snapshot.created_at is None:
        raise UsageError(
            f"no thread {thread_id!r} in {session.persistence.target}; "
            "`langgraph-resilience threads` lists them"
        )
    if not is_demo_thread(snapshot.values):
        raise UsageError(f"thread {thread_id!r} was not started by the demo; cannot resume it here")
    return snapshot


def cmd_resume(args: argparse.Namespace, out: Output) -> int:
    """Continue a thread: after a crash, or answering its pending escalation."""
    answer = _answer(args)
    thread_id = args.thread_id
    with _session(args) as s:
        runner = Runner(s, thread_id, out, args)
        with _locked(s, thread_id):
            snapshot = _existing(s, thread_id)
            pending = _escalations(snapshot)
            state = _state_of(snapshot)
            if answer is not None and not pending:
                raise UsageError(
                    f"thread {thread_id!r} has no pending escalation to answer ({state}); "
                    f"run `{_resume_command(args, thread_id)}` without {answer.flag}"
                )
            if pending and answer is None:
                tool = pending[0].value.get("tool")
                raise UsageError(
                    f"thread {thread_id!r} waits for a human to decide on {tool}; "
                    f"answer with {ANSWER_FLAGS}"
                )
            out.record("resume", thread_id=thread_id, state=state)
            out.line(
                f"[bold]thread[/bold] {thread_id}  [dim]({escape(s.persistence.target)})[/dim]"
            )
            if state == "done":
                out.line("nothing to resume: the thread is done")
            else:
                runner.step = int((snapshot.metadata or {}).get("step") or 0)
                where = ", ".join(_unfinished(snapshot))
                out.line(f"resuming after step {runner.step} (next: {where})\n")
                if pending and answer is not None:
                    runner.show_request(snapshot)
                    command: Any = runner.answer(snapshot, answer, by="you")
                else:
                    command = None
                snapshot = runner.drive(command, None, by="you")
            _print_summary(out, _summary(s, thread_id, snapshot, args))
    return 0


def _why(status: ThreadStatus, values: Mapping[str, Any]) -> str:
    if status.state == "interrupted":
        parts = []
        for request in status.interrupts:
            if isinstance(request, dict) and request.get("type") == ESCALATION_TYPE:
                message = (request.get("envelope") or {}).get("message", "")
                parts.append(
                    f"waits for a human on {request['tool']} ({request['reason']}): {message}"
                )
            else:
                parts.append(f"interrupted: {request!r}")
        return "; ".join(parts)
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
        return f"{who} before {', '.join(status.next)} (step {status.step}){effects}"
    ledger = values.get("resilience") or {}
    if (ledger.get("task") or {}).get("aborted"):
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
        snapshot = session.app.get_state(_config(thread_id))
        status = thread_status(
            session.app, thread_id, persistence=session.persistence, snapshot=snapshot
        )
    except (ValueError, KeyError, TypeError) as exc:  # e.g. another graph's thread
        return {"thread_id": thread_id, "state": "unreadable", "why": _one_line(exc)}
    values = snapshot.values
    if status.state == "done" and _unfinished(snapshot):  # see _unfinished
        status = dataclasses.replace(status, state="pending", next=_unfinished(snapshot))
    answers = "--approve|--skip|--edit JSON|--abort" if status.state == "interrupted" else ""
    return {
        "thread_id": thread_id,
        "state": status.state,
        "why": _why(status, values) if is_demo_thread(values) else "not a demo thread",
        "next": list(status.next),
        "step": status.step,
        "updated_at": status.updated_at,
        "demo": is_demo_thread(values),
        "tool_executions": status.ledger.get("tool_attempts", 0),
        "effects": dict(status.effects),
        "resume": _resume_command(args, thread_id, answers)
        if status.state in ("pending", "interrupted") and is_demo_thread(values)
        else None,
    }


def cmd_threads(args: argparse.Namespace, out: Output) -> int:
    """List the threads in the store with where each stands, most recent first: one
    query lists them (`list_threads`), then one state read per thread listed."""
    with _session(args) as s:
        found = [
            _thread_row(s, args, thread_id)
            for thread_id in list_threads(s.persistence.checkpointer, limit=args.limit)
        ]
        if out.json:
            out.document({"target": s.persistence.target, "threads": found})
            return 0
        if not found:
            out.line(
                f"no threads in {escape(s.persistence.target)}; run `langgraph-resilience demo`"
            )
            return 0
        table = Table(title=f"Threads in {s.persistence.target}")
        for column in ("thread", "state", "where / why", "tool runs", "effects", "updated"):
            table.add_column(column, overflow="fold")
        colors = {"done": "green", "interrupted": "yellow", "pending": "yellow", "failed": "red"}
        for item in found:
            effects = ", ".join(f"{n} {k}" for k, n in item.get("effects", {}).items() if n)
            color = colors.get(item["state"], "white")
            table.add_row(
                item["thread_id"],
                f"[{color}]{item['state']}[/{color}]",
                escape(item["why"]),
                str(item.get("tool_executions", "-")),
                effects or "-",
                _updated(item.get("updated_at")),
            )
        out.console.print(table)
        for item in found:
            if item.get("resume"):
                out.line(f"  {escape(item['resume'])}")
    return 0


# ------------------------------------------------------------------ parser and entry point


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (no usage block)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _answer_flags(parser: argparse.ArgumentParser, *, pause: bool) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--approve", action="store_true", help="a supervisor approves; the call runs again"
    )
    group.add_argument(
        "--skip",
        action="store_true",
        help="decline: the call is not run; the agent is told" + (" (default)" if pause else ""),
    )
    group.add_argument(
        "--edit",
        metavar="JSON",
        help="run the call with new arguments (a JSON object merged over the request's)",
    )
    group.add_argument(
        "--abort", action="store_true", help="stop the task (compensable effects are undone)"
    )
    if pause:
        group.add_argument(
            "--pause",
            action="store_true",
            help="leave the escalation pending; answer it later with `resume`",
        )


DEMO_EPILOG = """\
crash points (--crash-at STEP; the process is killed with SIGKILL, exit status 137,
after printing the command that resumes the thread):
  refund, goodwill_credit  inside the side-effecting tool, right after the effect and
                           before any checkpoint: `resume` reconciles it through the
                           tool's status check and never runs it twice
  NODE or NODE:K           at the boundary after the K-th run (default 1) of agent, tools,
                           retry, repair, planner, executor or escalate, once its
                           checkpoint is durable
  N                        after step N (the left column of the output)

the goodwill credit needs a human (POLICY). Without a flag the demo answers --skip on
your behalf: declining grants nothing, so it is the one answer a program may give for a
human. --pause leaves it waiting instead: `langgraph-resilience resume THREAD_ID --approve`
answers it later, from any process.
"""


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``langgraph-resilience`` command."""
    common = _Parser(add_help=False)
    common.add_argument(
        "--dsn", help=f"PostgreSQL DSN (default: ${DSN_ENV}, else the embedded SQLite file)"
    )
    common.add_argument(
        "--state-dir",
        help="directory of the SQLite file (default: $XDG_STATE_HOME/langgraph-resilience)",
    )
    common.add_argument("--json", action="store_true", help="machine-readable JSON output")
    parser = _Parser(
        prog="langgraph-resilience",
        description="Classification-driven recovery for LangGraph agents: see it work.",
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    demo = sub.add_parser(
        "demo",
        parents=[common],
        help="run the support agent whose tools fail in every way; explain each recovery",
        description="Run the support agent on a new thread and explain every recovery.",
        epilog=DEMO_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demo.add_argument("--thread-id", help="thread id to use (default: a new one)")
    demo.add_argument("--seed", type=int, default=7, help="jitter seed (default: 7)")
    demo.add_argument(
        "--crash-at",
        metavar="STEP",
        help="kill the process at STEP: refund (inside the side effect, after it happened), "
        "a node name (agent, tools, retry, ...) or NODE:K, or a step number",
    )
    _answer_flags(demo, pause=True)
    demo.set_defaults(handler=cmd_demo)

    threads = sub.add_parser(
        "threads",
        parents=[common],
        help="list threads and where each stands",
        description="List the threads in the store, most recently written first: done, "
        "interrupted (why), failed, stopped.",
    )
    threads.add_argument(
        "--limit",
        type=_positive_int,
        metavar="N",
        help="only the N most recently written threads (default: all)",
    )
    threads.set_defaults(handler=cmd_threads, seed=7)

    resume = sub.add_parser(
        "resume",
        parents=[common],
        help="continue a thread, answering its pending escalation",
        description="Continue a thread after a crash, or answer the escalation it waits on.",
    )
    resume.add_argument("thread_id", metavar="THREAD_ID")
    resume.add_argument("--seed", type=int, default=7, help="jitter seed (default: 7)")
    _answer_flags(resume, pause=False)
    resume.set_defaults(handler=cmd_resume)

    bench = sub.add_parser(
        "bench",
        help="chaos benchmark: recovery under injected faults against plain LangGraph",
        description="Run the seeded task suite under fault mixes for each contender; print the "
        "table, write JSON and a PNG chart; exit 1 if add_resilience misses a behaviour target.",
    )
    bench.add_argument("--quick", action="store_true", help="a small suite (< 1 minute)")
    bench.add_argument(
        "--contenders",
        nargs="+",
        help="contenders to run (default: toolnode retry_policy create_agent resilient)",
    )
    bench.add_argument("--mix", nargs="+", help="fault mixes to run (default: all)")
    bench.add_argument("--seeds", type=int, help="fault seeds per task (pass^k)")
    bench.add_argument("--out", help="directory for the JSON report and the chart")
    bench.set_defaults(handler=cmd_bench, json=False)
    return parser


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


def _one_line(exc: BaseException) -> str:
    lines = redact(str(exc)).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def main(
    argv: Sequence[str] | None = None,
    *,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
) -> int:
    """Entry point of the console script and of ``python -m langgraph_resilience``.

    `stdout`/`stderr` default to the process's streams; passing them lets a caller
    (a test, an embedding program) capture the output without swapping globals.
    """
    err = stderr if stderr is not None else sys.stderr
    try:
        args = build_parser().parse_args(argv)
        out = Output(json_mode=args.json, file=stdout)
        code: int = args.handler(args, out)
    except (UsageError, PersistenceError, ThreadBusyError, ThreadNotFoundError) as exc:
        print(f"langgraph-resilience: error: {_one_line(exc)}", file=err)
        return EXIT_USAGE
    except (psycopg.OperationalError, sqlite3.OperationalError) as exc:
        print(f"langgraph-resilience: error: database failure: {_one_line(exc)}", file=err)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("langgraph-resilience: interrupted; `resume` continues the thread", file=err)
        return 130
    except BrokenPipeError:  # e.g. `| head`: stop quietly; the thread stays resumable
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    return code


def run() -> None:
    """Console-script entry point: exit with `main`'s code."""
    sys.exit(main())
