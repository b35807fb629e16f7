"""The chaos benchmark: the task suite under fault mixes, against four ways to build an agent.

The runner: `run_bench` runs every (contender, task, mix, seed) in worker
processes and aggregates the runs into a `BenchReport`; `cmd_bench` is the
``bench`` subcommand. The rooms: `contenders`, `mixes`, `runs` (one run),
`targets` (aggregation and the behaviour targets) and `report` (tables, JSON,
chart); the task suite and its scripted models are in `tasks`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import datetime as dt
import importlib.metadata
import inspect
import multiprocessing
import os
import pathlib
import platform
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from benchmarks.chaos.contenders import (
    CALL_LIMIT,
    CONTENDERS,
    DEFAULT_CONTENDERS,
    RESILIENT_PATHS,
    RESILIENT_POLICY,
    RETRY_POLICY,
)
from benchmarks.chaos.mixes import (
    MIXES,
    QUICK_CONVERSATIONS,
    QUICK_MIXES,
    QUICK_SEEDS,
    Mix,
    quick_tasks,
)
from benchmarks.chaos.report import print_report, write_report
from benchmarks.chaos.runs import RunResult, run_task
from benchmarks.chaos.targets import BenchReport, Row, aggregate, all_targets, check_targets
from benchmarks.chaos.tasks import (
    CONVERSATIONS,
    TASKS,
    Conversation,
    Scenario,
    Task,
    oracle,
)
from langgraph_resilience import (
    ConfigurationError,
    ToolProfile,
    add_resilience,
)

__all__ = [
    "Job",
    "cmd_bench",
    "default_out_dir",
    "measure_overhead",
    "run_bench",
    "run_jobs",
]


@dataclasses.dataclass(frozen=True, slots=True)
class Job:
    """One contender under one mix and seed, over the suite (a picklable unit of work)."""

    contender: str
    mix: str
    seed: int
    tasks: tuple[Scenario, ...]

    @property
    def size(self) -> int:
        """Intended tool calls: how long the job runs, roughly."""
        return sum(t.calls for t in self.tasks)


def _scenarios(
    mix: Mix, suite: Sequence[Task], conversations: Sequence[Conversation], *, quick: bool
) -> tuple[Scenario, ...]:
    """What `mix` runs (`Mix.suite`); a quick run's ``effects`` suite keeps one task with
    side effects per family."""
    if mix.suite == "conversations":
        return tuple(conversations)
    if mix.suite == "effects":
        effects = [t for t in suite if t.side_effects > 0]
        if quick:
            first = {t.family: t for t in reversed(effects)}
            effects = [t for t in effects if first[t.family] is t]
        return tuple(effects)
    return tuple(suite)


def run_jobs(
    jobs: Sequence[Job],
    workers: int | None,
    done: Callable[[Job], None] | None = None,
) -> list[list[RunResult]]:
    """Each job's runs, in job order, over `workers` processes (default: one per CPU),
    the longest jobs first so the workers finish together; `done` hears of each job as
    it finishes (the progress display)."""
    workers = max(1, min(workers if workers is not None else (os.cpu_count() or 1), len(jobs)))
    report = done or (lambda job: None)
    if workers == 1:
        ran_in_order = []
        for job in jobs:
            ran_in_order.append(_run_job(job))
            report(job)
        return ran_in_order
    context = multiprocessing.get_context("spawn")  # no fork of a threaded process
    longest = sorted(range(len(jobs)), key=lambda i: -jobs[i].size)
    ran: dict[int, list[RunResult]] = {}
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        futures = {pool.submit(_run_job, jobs[i]): i for i in longest}
        for future in concurrent.futures.as_completed(futures):
            index = futures[future]
            ran[index] = future.result()
            report(jobs[index])
    return [ran[i] for i in range(len(jobs))]


@contextlib.contextmanager
def _progress(console: Console | None, jobs: Sequence[Job]) -> Iterator[Callable[[Job], None]]:
    """A live bar of the tasks run (done / total, elapsed, ETA) on a terminal; elsewhere
    one line when the runs start, so a log shows what is happening."""
    total = sum(len(job.tasks) for job in jobs)
    if console is None or not console.is_terminal:
        if console is not None:
            console.print(f"running {total} task runs in {len(jobs)} jobs ...")
        yield lambda job: None
        return
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("task runs", total=total)
        yield lambda job: bar.advance(task, len(job.tasks))


def _run_job(job: Job) -> list[RunResult]:
    contender, mix = CONTENDERS[job.contender], MIXES[job.mix]
    return [run_task(contender, task, mix, job.seed) for task in job.tasks]


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in (
        "langgraph",
        "langgraph-prebuilt",
        "langchain-core",
        "langchain",
        "langgraph-resilience",
    ):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def _revision() -> str | None:
    """The package's git commit (``+dirty`` with uncommitted changes), when it is a checkout."""
    root = pathlib.Path(__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return None
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            timeout=5,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}+dirty" if dirty else head


def _available(name: str) -> str | None:
    """Why contender `name` cannot run here, or None."""
    if name == "create_agent":
        try:
            import langchain.agents  # noqa: F401, PLC0415
        except ImportError:
            return "langchain is not installed (pip install langchain)"
    return None


def _unwired_features() -> list[str]:
    """Recovery features the package offers that `build_resilient` does not wire yet."""
    profile_fields = {f.name for f in dataclasses.fields(ToolProfile)}
    parameters = set(inspect.signature(add_resilience).parameters)
    hints = {
        "idempotency": (
            "add_resilience(idempotency=) / ToolProfile(status_check=)",
            "idempotency" in parameters or "status_check" in profile_fields,
        ),
    }
    return [
        f"{what} exists but build_resilient does not wire it yet (path {path!r})"
        for path, (what, present) in hints.items()
        if present and path not in RESILIENT_PATHS
    ]


def measure_overhead(tasks: Sequence[Task], *, rounds: int = 2) -> dict[str, float]:
    """Clean-run wall time per agent turn of (d) against (a), interleaved in one process.

    Runs of different jobs happen at different times (and loads), so their wall times
    do not compare; here each task runs under (a) and (d) back to back, in ABBA order
    to cancel drift, and the per-turn totals are compared. A timing: reported, never
    checked (``benchmarks/overhead.py`` is the controlled measurement).
    """
    clean = MIXES["clean"]
    walls = {"toolnode": 0.0, "resilient": 0.0}
    turns = {"toolnode": 0, "resilient": 0}
    for round_ in range(rounds):
        for i, task in enumerate(tasks):
            order = ["toolnode", "resilient"]
            if (i + round_) % 2:
                order.reverse()
            for name in order:
                run = run_task(CONTENDERS[name], task, clean, 0)
                walls[name] += run.wall_seconds
                turns[name] += run.agent_turns
    per_turn = {name: 1000 * walls[name] / max(1, turns[name]) for name in walls}
    return {
        "toolnode_ms_per_turn": round(per_turn["toolnode"], 3),
        "resilient_ms_per_turn": round(per_turn["resilient"], 3),
        "ratio": round(per_turn["resilient"] / per_turn["toolnode"], 3),
        "rounds": rounds,
    }


def _notes() -> list[str]:
    """What the report says about how it was measured."""
    return [
        "(a) uses handle_tool_errors=True: ToolNode's default handler re-raises every error "
        "except invalid arguments.",
        "(b) and (c) sleep for real between retries; their backoff is set to 0 here, so their "
        "recovery latency counts tool time only. (d) backs off on the fake clock.",
        "(c)'s ModelFallbackMiddleware never triggers: the scripted model does not fail.",
        f"(d) wires: {', '.join(sorted(RESILIENT_PATHS))}. Its escalations are answered by a "
        "scripted operator (chaos_tasks.operator_decision): retry once, then skip; 'human' "
        "counts those answers. (d') is the same graph without escalation.",
        "Parallel tool calls run one at a time (max_concurrency=1) so per-tool fault schedules "
        "are reproducible. Exception: when a parallel call raises in (b), Executor.map cancels "
        "the siblings that have not started, so which siblings ran before RetryPolicy re-runs "
        "the node depends on thread timing; (b)'s duplicates on parallel turns vary run to run.",
        "Mixes with the same schedule (e.g. the p=0.15 ones) fault the same calls for a seed "
        "(common random numbers): their differences come from the fault kind alone.",
        "Breakers count logical calls (one outcome per call when it leaves the tool); so do "
        "the shadow breakers behind 'open' (see chaos.ChaosTool). The outage mixes use a "
        "demo-sized breaker (one failed call opens it), the background mix a 6-call one.",
        "A conversation is one run: its tasks on one thread, one human message each; "
        "'success' needs every turn right, 'turn success' counts turns.",
        *_unwired_features(),
    ]


def run_bench(
    *,
    quick: bool,
    contenders: list[str] | None = None,
    mixes: list[str] | None = None,
    seeds: int | None = None,
    out_dir: pathlib.Path | None = None,
    console: Console | None = None,
    tasks: Sequence[Task] | None = None,
    workers: int | None = None,
    conversations: Sequence[Conversation] | None = None,
) -> BenchReport:
    """Run the task suite under each mix for each contender and seed; print, save, return.

    `quick` runs `QUICK_MIXES` with 2 seeds over `quick_tasks` unless `mixes` /
    `seeds` / `tasks` say otherwise; a mix whose `Mix.suite` is ``effects`` runs the
    suite's tasks with side effects (quick: one per family), one whose suite is
    ``conversations`` runs `conversations` (default `CONVERSATIONS`, quick:
    `QUICK_CONVERSATIONS`). A mix with nothing random runs one seed.
    The clean mix always runs (the other mixes are compared with it), and so does
    each mix's `Mix.baseline`. With
    `out_dir`, ``chaos-bench.json`` and (if matplotlib is installed)
    ``chaos-bench.png`` are written there. `console` gets the table; None prints
    nothing. Runs are spread over `workers` processes (default: one per CPU);
    every run is seeded on its own, so the counts do not depend on it.
    """
    names = list(contenders or DEFAULT_CONTENDERS)
    unknown = [n for n in names if n not in CONTENDERS]
    if unknown:
        raise ConfigurationError(f"unknown contenders {unknown}; choose from {sorted(CONTENDERS)}")
    mix_names = list(mixes or (QUICK_MIXES if quick else MIXES))
    unknown = [m for m in mix_names if m not in MIXES]
    if unknown:
        raise ConfigurationError(f"unknown mixes {unknown}; choose from {sorted(MIXES)}")
    if "clean" not in mix_names:
        mix_names.insert(0, "clean")
    for baseline in dict.fromkeys(MIXES[m].baseline for m in list(mix_names)):
        if baseline not in mix_names:
            mix_names.insert(mix_names.index("clean") + 1, baseline)
    seed_count = seeds if seeds is not None else (QUICK_SEEDS if quick else 5)
    if seed_count < 1:
        raise ConfigurationError(f"seeds must be >= 1, got {seed_count}")
    suite = list(tasks or (quick_tasks() if quick else TASKS))
    dialogues = list(
        conversations
        or ([c for c in CONVERSATIONS if c.id in QUICK_CONVERSATIONS] if quick else CONVERSATIONS)
    )
    scenarios: list[Scenario] = [*suite, *dialogues]
    for scenario in scenarios:
        oracle(scenario)
    notes = _notes()
    skipped = {n: why for n in names if (why := _available(n)) is not None}
    for name, why in skipped.items():
        notes.append(f"contender {name} skipped: {why}")
    started = time.perf_counter()
    revision = _revision()  # before running: others may commit while it runs
    jobs = [
        Job(
            name,
            mix_name,
            seed,
            _scenarios(MIXES[mix_name], suite, dialogues, quick=quick),
        )
        for name in names
        if name not in skipped
        for mix_name in mix_names
        for seed in (range(seed_count) if MIXES[mix_name].seeded else [0])
    ]
    with _progress(console, jobs) as done:
        runs = [r for batch in run_jobs(jobs, workers, done) for r in batch]
    rows: list[Row] = []
    task_map: dict[str, Scenario] = {t.id: t for t in scenarios}
    for name in names:
        for mix_name in mix_names:
            mix = MIXES[mix_name]
            mix_runs = [r for r in runs if r.contender == name and r.mix == mix_name]
            base = [r for r in runs if r.contender == name and r.mix == mix.baseline]
            if mix_runs:
                rows.append(aggregate(mix_runs, mix, base, task_map))
    report = BenchReport(
        config={
            "quick": quick,
            "contenders": [n for n in names if n not in skipped],
            "mixes": mix_names,
            "seeds": seed_count,
            "tasks": len(suite),
            "conversations": len(dialogues),
            "policy": {
                "resilient": {
                    "max_attempts": RESILIENT_POLICY.max_attempts,
                    "base_delay": RESILIENT_POLICY.base_delay_s,
                    "max_repair": RESILIENT_POLICY.max_repair,
                    "loop_threshold": RESILIENT_POLICY.loop_threshold,
                },
                "retry_policy": {"max_attempts": RETRY_POLICY.max_attempts, "backoff": 0},
                "create_agent": {"max_retries": 2, "backoff": 0, "call_limits": CALL_LIMIT},
            },
            "elapsed_s": round(time.perf_counter() - started, 2),
            "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "cpus": os.cpu_count(),
            "versions": _versions(),
            "revision": revision,
        },
        rows=rows,
        runs=runs,
        notes=notes,
    )
    pair = {"toolnode", "resilient"} <= set(report.config["contenders"])
    if pair:
        report.config["overhead"] = measure_overhead(suite, rounds=1 if quick else 2)
    report.targets = all_targets(report)
    if console is not None:
        print_report(report, console)
    if out_dir is not None:
        write_report(report, out_dir, console=console)
    return report


def default_out_dir(now: dt.datetime | None = None) -> pathlib.Path:
    """Where `bench` writes without ``--out``: ``chaos-bench-<UTC date-time>`` here."""
    when = (now or dt.datetime.now(dt.UTC)).strftime("%Y%m%d-%H%M%S")
    return pathlib.Path.cwd() / f"chaos-bench-{when}"


def cmd_bench(args: Any, console: Console) -> int:
    """The ``bench`` subcommand: run, print, save.

    Exit 0 when (d) meets every landed target (or did not run), 1 when it misses
    one (each is printed); a usage mistake raises ConfigurationError.
    """
    report = run_bench(
        quick=bool(args.quick),
        contenders=args.contenders,
        mixes=args.mix,
        seeds=args.seeds,
        out_dir=pathlib.Path(args.out) if args.out else default_out_dir(),
        console=console,
    )
    if "resilient" not in report.config["contenders"]:
        return 0
    failures = check_targets(report)
    for failure in failures:
        console.print(f"[red]target missed[/red] {failure}")
    return 1 if failures else 0
