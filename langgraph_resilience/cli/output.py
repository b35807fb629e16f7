"""Where the command writes: text (rich; plain when not a terminal) or JSON lines."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from rich.console import Console
from rich.table import Table

from langgraph_resilience.core.redaction import redact

__all__ = ["Output", "args_text", "class_text", "message_of", "one_line"]


def args_text(args: Mapping[str, Any]) -> str:
    """``k=v, ...``: a call's arguments on one line."""
    return ", ".join(f"{k}={v!r}" for k, v in args.items())


def class_text(value: Any) -> str:
    """A failure class as shown: upper case, ``-`` for none."""
    return str(value or "-").upper()


def message_of(error: Mapping[str, Any] | None, fallback: str) -> str:
    """The first line of an envelope's message (90 characters at most), or `fallback`."""
    if not error:
        return fallback
    text = str(error.get("message") or error.get("type") or fallback)
    return text.splitlines()[0][:90]


def one_line(exc: BaseException) -> str:
    """The first line of an exception's (redacted) text, or its type's name."""
    lines = redact(str(exc)).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


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
