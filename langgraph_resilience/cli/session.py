"""Where the demo's threads live: the state store (SQLite or Postgres), the demo graph
compiled on it, thread locks, and the command that resumes a thread."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import pathlib
import shlex
from collections.abc import Iterator
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import StateSnapshot

from langgraph_resilience._graph.escalate import ESCALATION_TYPE
from langgraph_resilience.cli.back_office import DemoStore, open_demo_store
from langgraph_resilience.cli.demo import AfterEffect, SupportDemo, build_demo, is_demo_thread
from langgraph_resilience.cli.options import DSN_ENV, UsageError
from langgraph_resilience.core.redaction import redact
from langgraph_resilience.errors import PersistenceError, ThreadBusyError
from langgraph_resilience.stores.persistence import (
    Persistence,
    open_postgres,
    open_sqlite,
)

__all__ = [
    "DSN_ENV",
    "Session",
    "default_state_dir",
    "escalations",
    "existing",
    "locked",
    "open_session",
    "resume_command",
    "state_of",
    "thread_config",
    "unfinished",
]


def default_state_dir() -> pathlib.Path:
    """``$XDG_STATE_HOME/langgraph-resilience`` (``~/.local/state/...`` by default)."""
    base = os.environ.get("XDG_STATE_HOME") or str(pathlib.Path.home() / ".local" / "state")
    return pathlib.Path(base) / "langgraph-resilience"


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
def open_session(
    args: argparse.Namespace, *, after_effect: AfterEffect | None = None
) -> Iterator[Session]:
    """The store ``--dsn`` / ``--state-dir`` name, with the demo graph compiled on it."""
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


def thread_config(thread_id: str) -> RunnableConfig:
    """The run config of `thread_id`."""
    return {"configurable": {"thread_id": thread_id}, "recursion_limit": 100}


def resume_command(args: argparse.Namespace, thread_id: str, flags: str = "") -> str:
    """The command that continues `thread_id` (a DSN given with --dsn is redacted)."""
    parts = ["langgraph-resilience", "resume", shlex.quote(thread_id)]
    if args.dsn:
        parts += ["--dsn", shlex.quote(redact(args.dsn))]
    if args.state_dir:
        parts += ["--state-dir", shlex.quote(args.state_dir)]
    if flags:
        parts.append(flags)
    return " ".join(parts)


@contextlib.contextmanager
def locked(session: Session, thread_id: str) -> Iterator[None]:
    """Hold `thread_id`'s lock; another process holding it is a usage error."""
    try:
        with session.persistence.thread_lock(thread_id):
            yield
    except ThreadBusyError:
        raise UsageError(
            f"thread {thread_id!r} is being run by another process; wait for it to finish"
        ) from None


def existing(session: Session, thread_id: str) -> StateSnapshot:
    """The latest state of a thread the demo started; anything else is a usage error."""
    snapshot = session.app.get_state(thread_config(thread_id))
    if snapshot.created_at is None:
        raise UsageError(
            f"no thread {thread_id!r} in {session.persistence.target}; "
            "`langgraph-resilience threads` lists them"
        )
    if not is_demo_thread(snapshot.values):
        raise UsageError(f"thread {thread_id!r} was not started by the demo; cannot resume it here")
    return snapshot


def escalations(snapshot: StateSnapshot) -> list[Any]:
    """The pending interrupts that are our escalations."""
    return [
        i
        for i in snapshot.interrupts
        if isinstance(i.value, dict) and i.value.get("type") == ESCALATION_TYPE
    ]


def unfinished(snapshot: StateSnapshot) -> tuple[str, ...]:
    """The nodes of the thread's open step. LangGraph leaves a task whose result was
    saved (the process died before the step was committed) out of ``next``, but a
    finished thread has no tasks at all."""
    return tuple(snapshot.next) or tuple(task.name for task in snapshot.tasks)


def state_of(snapshot: StateSnapshot) -> str:
    """``interrupted``, ``pending`` (stopped mid-run) or ``done``."""
    if escalations(snapshot) or snapshot.interrupts:
        return "interrupted"
    if unfinished(snapshot):
        return "pending"
    return "done"
