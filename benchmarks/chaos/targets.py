"""Aggregating runs into rows, and judging them against the behaviour targets."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from benchmarks.chaos.contenders import MIDDLEWARE_PATHS, RESILIENT_PATHS, RESILIENT_POLICY
from benchmarks.chaos.mixes import MIXES, Mix
from benchmarks.chaos.runs import RunResult
from benchmarks.chaos.tasks import (
    Scenario,
)

__all__ = [
    "LLM_RATIO_TARGET",
    "OVERHEAD_TARGET",
    "TRANSIENT_BOUND",
    "BenchReport",
    "Row",
    "TargetResult",
    "aggregate",
    "all_targets",
    "check_targets",
    "evaluate_targets",
]


TRANSIENT_BOUND = 0.957
"""1 - (1 - 0.15**3)**10 minus 1 point: the issue's target for 10-step tasks."""

LLM_RATIO_TARGET = 1.2
OVERHEAD_TARGET = 1.15


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One contender under one mix, over every task and seed."""

    contender: str
    mix: str
    fault_class: str
    runs: int
    success: float
    pass_k: float
    crashed: int
    duplicates: int
    runs_with_duplicates: int
    calls_after_removal: int
    calls_while_open: int
    repeated_calls: int
    tool_calls: int
    executions: int
    llm_calls: int
    escalations: int
    tool_calls_vs_clean: float | None
    llm_calls_vs_clean: float | None
    max_attempts_per_call: int
    max_attempts_per_key: int
    faults: int
    recovery_mean_s: float | None
    recovery_max_s: float | None
    cpu_ms_per_tool_call: float
    wall_ms_per_turn: float
    subsets: dict[str, float]
    """Success rate on task subsets: ``ten_reads``, ``ten_effects``, ``with_effects``."""
    turn_success: float = math.nan
    """Share of turns (tasks) done right, a conversation's counted one by one."""
    breaker_opens: int = 0
    shadow_opens: int = 0
    diverted_calls: int = 0
    refused_calls: int = 0
    unanswered_calls: int = 0


def _rate(values: Sequence[bool]) -> float:
    return sum(values) / len(values) if values else math.nan


_SUBSETS: Mapping[str, Callable[[Scenario], bool]] = {
    "ten_reads": lambda t: t.calls == 10 and t.side_effects == 0,
    "ten_effects": lambda t: t.calls == 10 and t.side_effects > 0,
    "with_effects": lambda t: t.side_effects > 0,
    "read_only": lambda t: t.side_effects == 0,
}


def aggregate(
    runs: Sequence[RunResult],
    mix: Mix,
    clean: Sequence[RunResult] | None,
    tasks: Mapping[str, Scenario],
) -> Row:
    by_task: dict[str, list[bool]] = {}
    for r in runs:
        by_task.setdefault(r.task, []).append(r.success)
    latencies = [x for r in runs for x in r.recovery_latencies]
    tool_calls = sum(r.tool_calls for r in runs)
    llm_calls = sum(r.llm_calls for r in runs)
    clean_tools = clean_llm = None
    if clean:
        per_task = {r.task: r for r in clean}  # a clean run is the same for every seed
        clean_tools = sum(per_task[r.task].tool_calls for r in runs if r.task in per_task)
        clean_llm = sum(per_task[r.task].llm_calls for r in runs if r.task in per_task)
    turns = sum(r.agent_turns for r in runs)
    return Row(
        contender=runs[0].contender,
        mix=mix.name,
        fault_class=mix.fault_class,
        runs=len(runs),
        success=_rate([r.success for r in runs]),
        pass_k=_rate([all(v) for v in by_task.values()]),
        crashed=sum(r.crashed is not None for r in runs),
        duplicates=sum(r.duplicates for r in runs),
        runs_with_duplicates=sum(r.duplicates > 0 for r in runs),
        calls_after_removal=sum(r.calls_after_removal for r in runs),
        calls_while_open=sum(r.calls_while_open for r in runs),
        repeated_calls=sum(r.repeated_calls for r in runs),
        tool_calls=tool_calls,
        executions=sum(r.executions for r in runs),
        llm_calls=llm_calls,
        escalations=sum(r.escalations for r in runs),
        tool_calls_vs_clean=tool_calls / clean_tools if clean_tools else None,
        llm_calls_vs_clean=llm_calls / clean_llm if clean_llm else None,
        max_attempts_per_call=max((r.max_attempts_per_call for r in runs), default=0),
        max_attempts_per_key=max((r.max_attempts_per_key for r in runs), default=0),
        faults=sum(sum(r.faults.values()) for r in runs),
        recovery_mean_s=statistics.fmean(latencies) if latencies else None,
        recovery_max_s=max(latencies) if latencies else None,
        cpu_ms_per_tool_call=1000 * sum(r.cpu_seconds for r in runs) / max(1, tool_calls),
        wall_ms_per_turn=1000 * sum(r.wall_seconds for r in runs) / max(1, turns),
        subsets={
            name: _rate([r.success for r in runs if keep(tasks[r.task])])
            for name, keep in _SUBSETS.items()
            if any(keep(tasks[r.task]) for r in runs)
        },
        turn_success=sum(r.turns_ok for r in runs) / max(1, sum(r.turns for r in runs)),
        breaker_opens=sum(r.breaker_opens for r in runs),
        shadow_opens=sum(r.shadow_opens for r in runs),
        diverted_calls=sum(r.diverted_calls for r in runs),
        refused_calls=sum(r.refused_calls for r in runs),
        unanswered_calls=sum(r.unanswered_calls for r in runs),
    )


# --------------------------------------------------------------------- targets


@dataclasses.dataclass(frozen=True, slots=True)
class TargetResult:
    """One target of the issue, judged on a report."""

    name: str
    status: Literal["met", "missed", "pending", "info"]
    detail: str
    checked: bool = True
    """Counts toward `check_targets` (behaviour counts only, never timings)."""


@dataclasses.dataclass(slots=True, kw_only=True)
class BenchReport:
    """What `run_bench` measured."""

    config: dict[str, Any]
    rows: list[Row]
    runs: list[RunResult]
    targets: list[TargetResult] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)

    def row(self, contender: str, mix: str) -> Row | None:
        """The aggregate of `contender` under `mix`, if it ran."""
        return next((r for r in self.rows if r.contender == contender and r.mix == mix), None)

    def counts(self) -> list[dict[str, Any]]:
        """Every run's behaviour counts (no timings): equal for equal seeds."""
        skip = {"cpu_seconds", "wall_seconds"}
        return [
            {k: v for k, v in dataclasses.asdict(r).items() if k not in skip} for r in self.runs
        ]

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "config": self.config,
            "notes": self.notes,
            "targets": [dataclasses.asdict(t) for t in self.targets],
            "results": [dataclasses.asdict(r) for r in self.rows],
            "runs": [dataclasses.asdict(r) for r in self.runs],
        }


def _judge(
    name: str, ok: bool, detail: str, missing: frozenset[str], *, checked: bool = True
) -> TargetResult:
    if ok:
        return TargetResult(name, "met", detail, checked)
    if missing:
        return TargetResult(
            name, "pending", f"{detail} (needs {', '.join(sorted(missing))}: not landed)", checked
        )
    return TargetResult(name, "missed", detail, checked)


def evaluate_targets(
    report: BenchReport, *, contender: str = "resilient", paths: frozenset[str] = RESILIENT_PATHS
) -> list[TargetResult]:
    """Judge the issue's targets for `contender` (built with `RESILIENT_POLICY`) on
    `report`, from its counts. `paths` are the recovery paths it has."""
    results: list[TargetResult] = []
    mixes = [MIXES[m] for m in report.config.get("mixes", []) if m in MIXES]
    clean = report.row(contender, "clean")
    if clean is not None:
        results.append(
            _judge("clean success 100%", clean.success == 1.0, f"{clean.success:.1%}", frozenset())
        )
    transient = report.row(contender, "transient")
    if transient is not None:
        subsets = (("reads", frozenset[str]()), ("effects", MIXES["transient"].requires))
        for subset, needs in subsets:
            rate = transient.subsets.get(f"ten_{subset}")
            if rate is not None:
                results.append(
                    _judge(
                        f"transient: 10-step {subset} tasks >= {TRANSIENT_BOUND:.1%}",
                        rate >= TRANSIENT_BOUND,
                        f"{rate:.1%}",
                        needs - paths,
                    )
                )
    per_call = RESILIENT_POLICY.max_attempts
    per_key = per_call * RESILIENT_POLICY.loop_threshold
    for mix in mixes:
        row = report.row(contender, mix.name)
        if row is None:
            continue
        missing = mix.requires - paths
        results.append(
            _judge(
                f"{mix.name}: no duplicate side effects",
                row.duplicates == 0,
                f"{row.duplicates} duplicates over {row.runs} runs"
                + (f" ({row.runs_with_duplicates} runs with any)" if row.duplicates else ""),
                mix.dedup_requires - paths,
            )
        )
        runs = [r for r in report.runs if r.contender == contender and r.mix == mix.name]
        over = [r for r in runs if _over_budget(r, per_call, per_key)]
        approved = sum(len(r.human_retries) for r in runs)
        results.append(
            _judge(
                f"{mix.name}: attempt budget ({per_call}/call, {per_key}/identical call)",
                not over,
                f"max {row.max_attempts_per_call} per call, {row.max_attempts_per_key} per "
                f"identical call, {len(over)} runs over"
                + (f" ({approved} more approved by the operator)" if approved else ""),
                frozenset(),
            )
        )
        if mix.detection:
            calls = row.calls_after_removal + row.calls_while_open
            results.append(
                _judge(
                    f"{mix.name}: no calls after detection",
                    calls == 0,
                    f"{row.calls_after_removal} after removal, {row.calls_while_open} while open",
                    (mix.detect_requires or frozenset()) - paths,
                )
            )
            results.append(
                _judge(
                    f"{mix.name}: permanent fault recovered 100%",
                    row.success == 1.0,
                    f"{row.success:.1%}",
                    missing,
                )
            )
        transient_mix = mix.fault_class == "transient" and not mix.detection
        if transient_mix and row.llm_calls_vs_clean is not None:
            results.append(
                _judge(
                    f"{mix.name}: LLM calls <= {LLM_RATIO_TARGET}x {mix.baseline}",
                    row.llm_calls_vs_clean <= LLM_RATIO_TARGET,
                    f"{row.llm_calls_vs_clean:.3f}x",
                    frozenset(),
                )
            )
        results.extend(_extra_targets(report, mix, row, missing))
    overhead = report.config.get("overhead")
    if overhead:
        results.append(
            TargetResult(
                f"clean overhead <= {OVERHEAD_TARGET}x (a) per turn",
                "info",
                f"{overhead['ratio']:.2f}x ({overhead['resilient_ms_per_turn']:.2f} vs "
                f"{overhead['toolnode_ms_per_turn']:.2f} ms/turn, interleaved; a timing, "
                "never checked: benchmarks/overhead.py measures it properly)",
                checked=False,
            )
        )
    return results


def _extra_targets(
    report: BenchReport, mix: Mix, row: Row, missing: frozenset[str]
) -> list[TargetResult]:
    """The targets `mix` adds (`Mix.checks`, from `EXTRA_TARGETS`), judged on `row`, the
    row of (d); those about the other contenders only when they ran."""
    out: list[TargetResult] = []
    others = [r for r in report.rows if r.mix == mix.name and r.contender not in _OURS and r.runs]
    plain = report.row("toolnode", mix.name)
    if "hazard" in mix.checks and plain is not None:
        if mix.detection:
            hazard, seen = (
                plain.calls_while_open + plain.calls_after_removal,
                "calls after detection",
            )
        else:
            hazard, seen = plain.duplicates, "duplicate side effects"
        out.append(
            _judge(
                f"{mix.name}: the hazard is real, (a) makes {seen}",
                hazard > 0,
                f"(a): {hazard} {seen}",
                frozenset(),
            )
        )
    if "breaker_opens" in mix.checks:
        out.append(
            _judge(
                f"{mix.name}: (d)'s breaker opens",
                row.breaker_opens > 0,
                f"{row.breaker_opens} opens in {row.runs} runs",
                frozenset({"breaker"}) - RESILIENT_PATHS,
            )
        )
    if "answered" in mix.checks:
        out.append(
            _judge(
                f"{mix.name}: every tool call answered",
                row.unanswered_calls == 0,
                f"{row.unanswered_calls} calls without a ToolMessage",
                frozenset(),
            )
        )
    twin = report.row(row.contender, mix.twin) if mix.twin else None
    if "same_as_twin" in mix.checks and twin is not None:
        out.append(
            _judge(
                f"{mix.name}: ids do not matter (same as {mix.twin})",
                (row.success, row.duplicates) == (twin.success, twin.duplicates),
                f"success {row.success:.1%} vs {twin.success:.1%}, duplicates "
                f"{row.duplicates} vs {twin.duplicates}",
                missing,
            )
        )
    if "all_succeed" in mix.checks:
        out.append(
            _judge(
                f"{mix.name}: every task on one thread succeeds",
                row.success == 1.0 and row.turn_success == 1.0,
                f"{row.success:.1%} of runs, {row.turn_success:.1%} of turns",
                missing,
            )
        )
    if "not_diverted" in mix.checks:
        out.append(
            _judge(
                f"{mix.name}: no call refused or diverted (loop guard, budgets per task)",
                row.diverted_calls == 0,
                f"{row.diverted_calls} calls did not run on their tool ({row.refused_calls} "
                "refused)",
                frozenset(),
            )
        )
    if "breakers_closed" in mix.checks:
        out.append(
            _judge(
                f"{mix.name}: breakers never open under background faults",
                row.breaker_opens == 0 and row.calls_while_open == 0,
                f"{row.breaker_opens} opens of (d)'s breakers, {row.calls_while_open} calls "
                f"while one should be open ((a): "
                f"{plain.shadow_opens if plain is not None else '-'} shadow opens)",
                frozenset({"breaker"}) - RESILIENT_PATHS,
            )
        )
    if "best_success" in mix.checks and others:
        best = max(others, key=lambda r: (r.success, r.turn_success))
        best_turns = max(r.turn_success for r in others)
        out.append(
            _judge(
                f"{mix.name}: success >= the best other contender",
                row.success >= best.success and row.turn_success >= best_turns,
                f"{row.success:.1%} ({row.turn_success:.1%} of turns) vs {best.contender} "
                f"{best.success:.1%} (best turns {best_turns:.1%})",
                missing,
            )
        )
    return out


_OURS = frozenset({"resilient", "resilient_unattended", "middleware"})


def _over_budget(run: RunResult, per_call: int, per_key: int) -> bool:
    """More attempts than the automatic budget allows, beyond the operator's explicit
    ``retry`` answers (each allows one more run of its call)."""
    approved = Counter(run.human_retries)
    for name, attempts in run.attempts_by_call.items():
        if attempts > per_call + approved[name.split(":", 1)[1]]:
            return True
    if run.max_attempts_per_key > per_key + len(run.human_retries):
        return True
    return run.max_tool_calls_per_task > RESILIENT_POLICY.max_tool_attempts


def all_targets(report: BenchReport) -> list[TargetResult]:
    """(d)'s targets, then the same targets for (e) (named ``(e) ...``) when each ran:
    the middleware must meet what `add_resilience` meets, on every mix."""
    ran = set(report.config.get("contenders", []))
    results = evaluate_targets(report) if "resilient" in ran else []
    if "middleware" in ran:
        results += [
            dataclasses.replace(t, name=f"(e) {t.name}")
            for t in evaluate_targets(report, contender="middleware", paths=MIDDLEWARE_PATHS)
            if t.checked
        ]
    return results


def check_targets(report: BenchReport) -> list[str]:
    """The behaviour targets (d) or (e) misses in `report`, one line each; empty when
    all are met.

    Counts only, never timings; targets whose recovery path has not landed are
    pending, not failures.
    """
    return [
        f"{t.name}: {t.detail}" for t in all_targets(report) if t.checked and t.status == "missed"
    ]
