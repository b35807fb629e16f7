"""Rendering a `BenchReport`: the console tables, the JSON file and the PNG chart."""

from __future__ import annotations

import json
import math
import pathlib

from rich.console import Console

from benchmarks.chaos.contenders import CONTENDERS
from benchmarks.chaos.mixes import MIXES
from benchmarks.chaos.targets import BenchReport, Row
from langgraph_resilience.cli.output import fitted_table, table_fits

__all__ = [
    "print_report",
    "write_report",
]


def _pct(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.1%}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


COLUMNS = (
    "mix",
    "class",
    "contender",
    "success",
    "pass^k",
    "turns",
    "crash",
    "dup",
    "after-rm/open",
    "opens",
    "repeat",
    "human",
    "tool calls",
    "LLM calls",
    "max att",
    "recov s",
    "cpu ms/call",
)
COMPACT = ("mix", "contender", "success", "dup", "tool calls", "LLM calls")
"""The columns shown when the terminal is too narrow for all of them."""
_WHOLE = ("mix",)


def _cells(row: Row) -> list[str]:
    label = CONTENDERS[row.contender].label if row.contender in CONTENDERS else row.contender
    return [
        row.mix,
        row.fault_class,
        label,
        _pct(row.success),
        _pct(row.pass_k),
        _pct(row.turn_success),
        str(row.crashed),
        str(row.duplicates),
        f"{row.calls_after_removal}/{row.calls_while_open}",
        f"{row.breaker_opens}/{row.shadow_opens}",
        str(row.repeated_calls),
        str(row.escalations),
        f"{row.tool_calls} ({_ratio(row.tool_calls_vs_clean)})",
        f"{row.llm_calls} ({_ratio(row.llm_calls_vs_clean)})",
        f"{row.max_attempts_per_call}/{row.max_attempts_per_key}",
        _seconds(row.recovery_mean_s),
        f"{row.cpu_ms_per_tool_call:.2f}",
    ]


def _full_width(rows: list[list[str]]) -> int:
    """The terminal width at which every column fits."""
    width = 40
    while not table_fits(COLUMNS, rows, whole=_WHOLE, width=width):
        width += 10
    return width


def print_report(report: BenchReport, console: Console) -> None:
    """The results table, the targets and the notes."""
    config = report.config
    title = (
        f"Chaos benchmark: {config['tasks']} tasks, {config.get('conversations', 0)} "
        f"conversations x {config['seeds']} seeds "
        f"({'quick' if config['quick'] else 'full'}, {config['elapsed_s']}s)"
    )
    order = {m: i for i, m in enumerate(config["mixes"])}
    rank = {c: i for i, c in enumerate(CONTENDERS)}
    ordered = sorted(report.rows, key=lambda r: (order.get(r.mix, 99), rank.get(r.contender, 99)))
    rows = [_cells(row) for row in ordered]
    width = console.width
    if table_fits(COLUMNS, rows, whole=_WHOLE, width=width):
        console.print(fitted_table(title, COLUMNS, rows, whole=_WHOLE, width=width))
    else:  # the columns that say whether it worked; everything is in the JSON report
        keep = [COLUMNS.index(c) for c in COMPACT]
        compact = [[row[i] for i in keep] for row in rows]
        for cells, row in zip(compact, ordered, strict=True):
            cells[COMPACT.index("contender")] = row.contender  # the short name
        console.print(fitted_table(title, COMPACT, compact, whole=_WHOLE, width=width))
        more = len(COLUMNS) - len(COMPACT)
        console.print(
            f"[dim]{more} more columns at {_full_width(rows)}+ wide; all in the JSON report[/dim]"
        )
    if report.targets:
        colours = {"met": "green", "missed": "red", "pending": "yellow", "info": "cyan"}
        targets = [
            [t.name, f"[{colours[t.status]}]{t.status}[/]", t.detail] for t in report.targets
        ]
        console.print(
            fitted_table(
                "Targets for (d) add_resilience",
                ("target", "status", "measured"),
                targets,
                width=console.width,
            )
        )
    for note in report.notes:
        console.print(f"[dim]- {note}[/dim]")


def write_report(
    report: BenchReport, out_dir: pathlib.Path, *, console: Console | None = None
) -> None:
    """``chaos-bench.json`` and, when matplotlib is importable, ``chaos-bench.png``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "chaos-bench.json"
    path.write_text(json.dumps(report.as_dict(), indent=1, default=str) + "\n")
    written = [str(path)]
    chart = _chart(report, out_dir / "chaos-bench.png")
    if chart is not None:
        written.append(str(chart))
    if console is not None:
        console.print(f"wrote {', '.join(written)}", soft_wrap=True)
        if chart is None:
            console.print(
                "no chart: matplotlib is not installed (pip install matplotlib, or the "
                "package's [bench] extra)"
            )


def _chart(report: BenchReport, path: pathlib.Path) -> pathlib.Path | None:
    try:
        import matplotlib as mpl  # noqa: PLC0415 - optional dependency

        mpl.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return None
    mixes = list(report.config["mixes"])
    contenders = list(report.config["contenders"])
    width = 0.8 / max(1, len(contenders))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(8, 1.1 * len(mixes)), 8), sharex=True)
    for i, name in enumerate(contenders):
        xs = [m + (i - (len(contenders) - 1) / 2) * width for m in range(len(mixes))]
        success = [(r.success if (r := report.row(name, m)) else 0.0) for m in mixes]
        dups = [(r.duplicates if (r := report.row(name, m)) else 0) for m in mixes]
        label = CONTENDERS[name].label if name in CONTENDERS else name
        top.bar(xs, success, width, label=label)
        bottom.bar(xs, dups, width, label=label)
    top.set_ylabel("task success")
    top.set_ylim(0, 1.0)
    top.legend(  # above the plot, at most three labels a row: never wider than the chart
        fontsize="small",
        ncols=min(3, len(contenders)),
        loc="lower center",
        bbox_to_anchor=(0.5, 1.0),
    )
    bottom.set_ylabel("duplicate side effects")
    most = max((r.duplicates for r in report.rows), default=0)
    bottom.set_ylim(0, max(1, most) * 1.1)
    bottom.set_xticks(range(len(mixes)))
    bottom.set_xticklabels(
        [f"{m}\n({MIXES[m].fault_class})" for m in mixes], rotation=45, ha="right", fontsize="small"
    )
    fig.suptitle(
        f"Chaos benchmark ({report.config['seeds']} seeds x {report.config['tasks']} tasks)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")  # the legend sits outside the axes
    plt.close(fig)
    return path
