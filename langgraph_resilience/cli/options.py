"""What the user asked for on the command line: an answer to an escalation, a crash
point, and the one error type a user mistake becomes (one line, exit code 2)."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any, Literal

__all__ = [
    "ANSWER_FLAGS",
    "DSN_ENV",
    "NODES",
    "Answer",
    "CrashAt",
    "UsageError",
    "answer_of",
    "crash_at",
]

NODES = ("agent", "tools", "retry", "repair", "planner", "executor", "escalate")
ANSWER_FLAGS = "--approve, --skip, --edit JSON or --abort"


DSN_ENV = "LANGGRAPH_RESILIENCE_DSN"
"""The environment variable naming the demo's PostgreSQL DSN."""


class UsageError(Exception):
    """A user mistake: reported in one line, exit code 2."""


@dataclasses.dataclass(frozen=True, slots=True)
class Answer:
    """A human's answer to a pending escalation, from the command line."""

    action: Literal["approve", "skip", "edit", "abort"]
    edit: dict[str, Any] | None = None

    @property
    def flag(self) -> str:
        return f"--{self.action}"


def answer_of(args: argparse.Namespace) -> Answer | None:
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
    """Where ``--crash-at`` kills the process (see `langgraph_resilience.cli`)."""

    text: str
    effect: str | None = None
    node: str | None = None
    nth: int = 1
    step: int | None = None


def crash_at(text: str | None) -> CrashAt | None:
    """The crash point ``--crash-at`` names, or None without one."""
    if text is None:
        return None
    from langgraph_resilience.cli.demo import SIDE_EFFECTS  # noqa: PLC0415 (the demo is heavy)

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
