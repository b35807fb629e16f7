"""Where the command writes: text (rich; plain when not a terminal) or JSON lines."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Collection, Mapping, Sequence
from typing import Any, TextIO

from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from langgraph_resilience.core.redaction import redact

__all__ = [
    "Output",
    "args_text",
    "class_text",
    "fitted_table",
    "message_of",
    "one_line",
    "table_fits",
]


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


def _min_widths(
    headers: Sequence[str], rows: Sequence[Sequence[str]], whole: Collection[str]
) -> list[int]:
    """Each column's narrowest width that splits no word (no cell at all in `whole`)."""
    widths = []
    for index, header in enumerate(headers):
        plain = [Text.from_markup(row[index]).plain for row in rows]
        if header in whole:
            widths.append(max([len(header), *(len(cell) for cell in plain)]))
        else:
            words = [word for cell in [header, *plain] for word in cell.split()]
            widths.append(max((len(w) for w in words), default=1))
    return widths


def _widths(
    headers: Sequence[str], rows: Sequence[Sequence[str]], whole: Collection[str], room: int
) -> list[int]:
    """Column widths that fill at most `room` characters: each column its unwrapped
    width when all fit, else its narrowest unsplit width plus a share of the rest in
    proportion to what it lacks (rich's own layout can overshoot the terminal)."""
    least = _min_widths(headers, rows, whole)
    ideal = [
        max(len(header), *(len(Text.from_markup(row[i]).plain) for row in rows))
        for i, header in enumerate(headers)
    ]
    if sum(ideal) <= room:
        return ideal
    spare, wants = room - sum(least), [i - m for i, m in zip(ideal, least, strict=True)]
    total = sum(wants) or 1
    return [m + spare * w // total for m, w in zip(least, wants, strict=True)]


def table_fits(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    whole: Collection[str] = (),
    width: int,
) -> bool:
    """Whether a table of these rows fits `width` columns without splitting a word."""
    widths = _min_widths(headers, rows, whole)
    return sum(widths) + 3 * len(widths) + 1 <= width


def fitted_table(
    title: str,
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    *,
    whole: Collection[str] = (),
    width: int,
) -> RenderableType:
    """Rows that wrap on word boundaries only, at `width` columns: a table whose every
    column is at least as wide as its longest word (the columns in `whole`, ids and
    names, never wrap), or, when those widths do not fit, one block per row (its first
    cell as a heading, then ``header: value`` lines). Cells may hold rich markup."""
    if table_fits(headers, rows, whole=whole, width=width):
        table = Table(title=title)
        widths = _widths(headers, rows, whole, width - 3 * len(headers) - 1)
        for header, chosen in zip(headers, widths, strict=True):
            table.add_column(header, no_wrap=header in whole, width=chosen)
        for row in rows:
            table.add_row(*row)
        return table
    label = max(len(header) for header in headers[1:]) + 2
    blocks: list[RenderableType] = [Text.from_markup(f"[bold]{escape(title)}[/bold]")]
    for row in rows:
        grid = Table.grid(padding=(0, 1))
        grid.add_column(no_wrap=True, width=label, style="dim")
        grid.add_column(ratio=1)
        for header, cell in zip(headers[1:], row[1:], strict=True):
            grid.add_row(f"  {header}", cell)
        blocks += [Text.from_markup(f"[bold]{row[0]}[/bold]"), grid]
    return Group(*blocks)


NODE_WIDTH = len("answer_pending")
"""The step column's width: the longest node name, never cut."""


_MARK = re.compile(r"^(\s*(?:\[[a-z ]+\])?[^\w\s\[(\"'.,:;-](?:\[/[a-z ]*\])?\s)(?=\S)")
"""A step line's leading mark, its style tags and its space (``"[red]✗[/red] "``,
``"  ↻ "``, ``"→ "``)."""


def _hanging(text: str) -> str | Table:
    """`text`, or, when it starts with a mark, a grid whose second column holds the rest,
    so its wrapped lines start under the text."""
    mark = _MARK.match(text)
    if mark is None:
        return text
    grid = Table.grid()
    grid.add_column(width=Text.from_markup(mark.group(1)).cell_len, no_wrap=True)
    grid.add_column(ratio=1, overflow="fold")
    grid.add_row(mark.group(1), text[mark.end() :])
    return grid


class Output:
    """Text (rich; plain when not a terminal), one JSON document (``--json``), or a
    stream of JSON lines (``--jsonl``) on `file` (stdout)."""

    def __init__(self, *, json_mode: bool, file: TextIO | None = None, lines: bool = False) -> None:
        self.json = json_mode or lines
        """Machine-readable output (either form): the text is not printed."""
        self.lines = lines
        """JSON Lines: each record as it happens (for a pipe that reads as it goes)."""
        self.file = file if file is not None else sys.stdout
        self.console = Console(file=self.file, highlight=False, soft_wrap=False)
        self._records: list[dict[str, Any]] = []

    def line(self, text: str = "") -> None:
        """Prose, wrapped to the terminal on word boundaries."""
        if not self.json:
            self.console.print(text)

    def whole(self, text: str) -> None:
        """A line never wrapped (a command or an id to copy): wider than the terminal,
        it runs on, and the terminal folds it visually without breaking the copy."""
        if not self.json:
            self.console.print(text, soft_wrap=True)

    def record(self, kind: str, fields: Mapping[str, Any] | None = None, /, **more: Any) -> None:
        """``{"kind": kind, **fields, **more}``: a line now (``--jsonl``), or one of the
        ``records`` of the document written at the end (``--json``)."""
        if not self.json:
            return
        value = {**(fields or {}), **more, "kind": kind}
        if self.lines:
            self.document(value)
        else:
            self._records.append(value)

    def document(self, value: Any) -> None:
        """One JSON document on its own line, flushed (for pipes)."""
        print(json.dumps(value, default=str), file=self.file, flush=True)

    def step(self, step: int | str, node: str, lines: Sequence[str]) -> None:
        """One step: its number and node, then its lines; a line that starts with a
        mark (✗, ↻, →, ...) wraps under its text, not under the mark."""
        if self.json:
            return
        grid = Table.grid(padding=(0, 1))
        grid.add_column(justify="right", width=3, style="dim")
        grid.add_column(width=NODE_WIDTH, no_wrap=True, style="cyan")
        grid.add_column(ratio=1, overflow="fold")
        for i, text in enumerate(lines or [""]):
            grid.add_row(str(step) if i == 0 else "", node if i == 0 else "", _hanging(text))
        self.console.print(grid)

    def note(self, text: str) -> None:
        """A line under the current step, indented like the step's lines."""
        self.step("", "", [text])

    def flush(self) -> None:
        """Write what is due (``--json``: the document of the records so far, once)."""
        if self._records:
            records, self._records = self._records, []
            self.document({"records": records})
        self.file.flush()
