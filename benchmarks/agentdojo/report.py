"""Aggregates task results per contender x mix x id style, and prints and writes them.

Why this module exists: the runner produces one `TaskResult` per (contender, task,
seed, ...); the question is how contenders compare, with the seed-to-seed spread
visible. Each metric is first totalled per seed over every task of every suite
run (success as a rate), then reported as the mean over seeds with its min-max.
The printed table fits 100 columns (one block per mix); `markdown` renders the
same numbers for the README, and `write` stores everything as JSON.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .runner import TaskResult

METRICS = ("success", "duplicates", "repeats", "missed", "llm_calls", "tool_executions", "raised")


@dataclasses.dataclass(frozen=True, slots=True)
class Stat:
    mean: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Stat:
        return cls(statistics.fmean(values), min(values), max(values))


@dataclasses.dataclass(frozen=True, slots=True)
class Row:
    contender: str
    mix: str
    ids: str
    behaviour: str
    seeds: int
    tasks: int
    """Tasks per seed."""
    stats: Mapping[str, Stat]


def aggregate(results: Iterable[TaskResult]) -> list[Row]:
    """One `Row` per (contender, mix, ids, behaviour), in first-seen order."""
    groups: dict[tuple[str, str, str, str], dict[int, list[TaskResult]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for r in results:
        groups[r.contender, r.mix, r.ids, r.behaviour][r.seed].append(r)
    rows = []
    for (contender, mix, ids, behaviour), by_seed in groups.items():
        per_seed: dict[str, list[float]] = defaultdict(list)
        for seed_results in by_seed.values():
            per_seed["success"].append(
                100.0 * sum(r.success for r in seed_results) / len(seed_results)
            )
            per_seed["duplicates"].append(sum(r.duplicates for r in seed_results))
            per_seed["repeats"].append(sum(r.repeats for r in seed_results))
            per_seed["missed"].append(sum(r.missed for r in seed_results))
            per_seed["llm_calls"].append(sum(r.llm_calls for r in seed_results))
            per_seed["tool_executions"].append(sum(r.tool_executions for r in seed_results))
            per_seed["raised"].append(sum(r.raised is not None for r in seed_results))
        tasks = len(next(iter(by_seed.values())))
        stats = {m: Stat.of(per_seed[m]) for m in METRICS}
        rows.append(Row(contender, mix, ids, behaviour, len(by_seed), tasks, stats))
    return rows


def _cell(stat: Stat, digits: int = 0) -> str:
    if stat.low == stat.high:
        return f"{stat.mean:.{digits}f}"
    return f"{stat.mean:.{digits}f} ({stat.low:.{digits}f}-{stat.high:.{digits}f})"


HEADER = ("contender", "ids", "success %", "dup eff", "repeats", "missed", "LLM", "execs", "raised")
WIDTHS = (14, 11, 18, 9, 9, 11, 5, 5, 7)


def table(rows: Sequence[Row]) -> str:
    """The compact text table (<= 100 columns), one block per mix and behaviour."""
    lines = []
    for mix, behaviour in dict.fromkeys((r.mix, r.behaviour) for r in rows):
        block = [r for r in rows if r.mix == mix and r.behaviour == behaviour]
        first = block[0]
        lines.append(
            f"mix {mix}, {behaviour} model: {first.tasks} tasks x {first.seeds} seed(s); "
            "mean (min-max)"
        )
        lines.append(" ".join(h.ljust(w) for h, w in zip(HEADER, WIDTHS, strict=True)).rstrip())
        for r in block:
            s = r.stats
            cells = (
                r.contender,
                r.ids,
                _cell(s["success"], 1),
                _cell(s["duplicates"]),
                _cell(s["repeats"]),
                _cell(s["missed"]),
                f"{s['llm_calls'].mean:.0f}",
                f"{s['tool_executions'].mean:.0f}",
                _cell(s["raised"]),
            )
            lines.append(" ".join(c.ljust(w) for c, w in zip(cells, WIDTHS, strict=True)).rstrip())
        lines.append("")
    return "\n".join(lines)


def markdown(rows: Sequence[Row]) -> str:
    """The same numbers as a Markdown table (for benchmarks/README.md)."""
    out = [
        "| mix | model | contender | ids | success % | duplicate effects | repeats "
        "| missed calls | LLM calls | tool executions | runs raised |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        s = r.stats
        out.append(
            f"| {r.mix} | {r.behaviour} | {r.contender} | {r.ids} | {_cell(s['success'], 1)} "
            f"| {_cell(s['duplicates'])} | {_cell(s['repeats'])} | {_cell(s['missed'])} "
            f"| {_cell(s['llm_calls'])} | {_cell(s['tool_executions'])} | {_cell(s['raised'])} |"
        )
    return "\n".join(out) + "\n"


def write(out: pathlib.Path, results: Sequence[TaskResult], meta: Mapping[str, Any]) -> None:
    """``agentdojo-eval.json`` (metadata, rows, every task result) and ``.md``."""
    out.mkdir(parents=True, exist_ok=True)
    rows = aggregate(results)
    payload = {
        "meta": dict(meta),
        "rows": [
            {
                "contender": r.contender,
                "mix": r.mix,
                "ids": r.ids,
                "behaviour": r.behaviour,
                "seeds": r.seeds,
                "tasks_per_seed": r.tasks,
                **{m: dataclasses.asdict(st) for m, st in r.stats.items()},
            }
            for r in rows
        ],
        "results": [dataclasses.asdict(r) for r in results],
    }
    (out / "agentdojo-eval.json").write_text(json.dumps(payload, indent=1, default=str))
    (out / "agentdojo-eval.md").write_text(markdown(rows))
