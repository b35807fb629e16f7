"""``python -m benchmarks.agentdojo``: the command line of the AgentDojo evaluation.

Why this module exists: one entry point that CI and people run the same way. It
checks the side-effect lists against AgentDojo (reported, never fatal), runs a
self-check (every selected suite with no faults on the plain ``toolnode``
contender must succeed on every task with no duplicate and no missed call; if
not, the harness itself is broken and the exit status is 2), then the
evaluation, prints the table and writes ``agentdojo-eval.json`` / ``.md`` to
``--out``. Scores never change the exit status: it is 0 unless the harness fails.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime as dt
import hashlib
import importlib.metadata
import multiprocessing
import os
import pathlib
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from .contenders import CONTENDERS
from .faults import DEFAULT_MIXES, MCP_DEFAULT_MIXES, MCP_MIXES, MIXES
from .replay import BEHAVIOURS, ID_STYLES
from .report import aggregate, table, write
from .runner import TaskResult, Unit, cached_suite, failed_unit, run_unit
from .suites import SUITES, verify_side_effects

QUICK_SUITES = ("banking",)
ROOT = pathlib.Path(__file__).resolve().parents[2]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks.agentdojo", description=__doc__)
    p.add_argument("--quick", action="store_true", help="1 seed, the banking suite only")
    p.add_argument("--seeds", type=int, default=5, help="seeds 0..K-1 (default 5)")
    p.add_argument("--suites", nargs="+", choices=SUITES, default=None)
    p.add_argument(
        "--mix",
        nargs="+",
        choices=sorted(MIXES),
        default=None,
        help=f"default: {' '.join(DEFAULT_MIXES)} (http), {' '.join(MCP_DEFAULT_MIXES)} (mcp)",
    )
    p.add_argument("--contenders", nargs="+", choices=list(CONTENDERS), default=list(CONTENDERS))
    p.add_argument("--ids", nargs="+", choices=ID_STYLES, default=list(ID_STYLES))
    p.add_argument(
        "--transport",
        choices=("http", "http_keyed", "mcp"),
        default="http",
        help="http_keyed: services that deduplicate by an Idempotency-Key header; "
        "mcp: serve the functions over a real MCP session (use the mcp_* mixes)",
    )
    p.add_argument(
        "--behaviour",
        nargs="+",
        choices=BEHAVIOURS,
        default=list(BEHAVIOURS),
        help="the replay model: re-issue a failed call blindly, or read before re-issuing",
    )
    p.add_argument("--limit", type=int, default=None, help="only each suite's first N tasks")
    p.add_argument(
        "--llm-seconds",
        type=float,
        default=0.0,
        help="virtual seconds each model call takes (default 0: time moves only in backoff)",
    )
    p.add_argument("--jobs", type=int, default=None, help="worker processes (default: CPUs)")
    p.add_argument("--out", type=pathlib.Path, default=None, help="directory for the JSON")
    args = p.parse_args(argv)
    if args.quick:
        args.seeds = 1
        args.suites = args.suites or list(QUICK_SUITES)
    args.suites = args.suites or list(SUITES)
    if args.mix is None:
        args.mix = list(MCP_DEFAULT_MIXES if args.transport == "mcp" else DEFAULT_MIXES)
    wrong = [m for m in args.mix if (m in MCP_MIXES) != (args.transport == "mcp") and m != "clean"]
    if wrong:
        p.error(f"mixes {wrong} do not fit --transport {args.transport} (mcp_* mixes: mcp)")
    return args


def units_of(args: argparse.Namespace) -> list[Unit]:
    return [
        Unit(
            suite,
            seed,
            mix,
            ids,
            tuple(args.contenders),
            args.limit,
            args.llm_seconds,
            behaviour,
            args.transport,
        )
        for suite in args.suites
        for seed in range(args.seeds)
        for mix in args.mix
        for ids in args.ids
        for behaviour in args.behaviour
    ]


def evaluate(units: Sequence[Unit], jobs: int = 1) -> list[TaskResult]:
    """Run `units`, in `jobs` worker processes (spawned: fresh interpreters) if > 1."""
    if jobs <= 1 or len(units) <= 1:
        return [r for u in units for r in run_unit(u)]
    context = multiprocessing.get_context("spawn")
    results: list[TaskResult] = []
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:
        futures = [pool.submit(run_unit, u) for u in units]
        for unit, future in zip(units, futures, strict=True):
            try:
                results.extend(future.result())
            except Exception as exc:  # e.g. the package failed to import in a worker
                results.extend(failed_unit(unit, exc))
    return results


def self_check(suites: Sequence[str], limit: int | None) -> list[str]:
    """Problems of the harness itself: with no faults, ``toolnode`` must solve everything."""
    units = [Unit(s, 0, "clean", "unique", ("toolnode",), limit) for s in suites]
    results = [r for u in units for r in run_unit(u)]
    return [
        f"{r.suite}/{r.task}: success={r.success} dup={r.duplicates} "
        f"missed={r.missed} raised={r.raised} grade_error={r.grade_error}"
        for r in results
        if not r.success or r.duplicates or r.missed or r.raised
    ]


def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def package_digest() -> str:
    """SHA-256 (12 hex digits) of the package's sources now: the tree changes under us."""
    digest = hashlib.sha256()
    for path in sorted((ROOT / "langgraph_resilience").glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def metadata(
    args: argparse.Namespace, seconds: float, effects: list[dict[str, Any]], digest: str
) -> dict[str, Any]:
    versions = {}
    for dist in ("agentdojo", "langgraph", "langgraph-prebuilt", "langchain", "langchain-core"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    return {
        "revision": _git("rev-parse", "--short", "HEAD"),
        "dirty_tree": bool(_git("status", "--porcelain", "--untracked-files=no")),
        "package_digest": digest,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "seconds": round(seconds, 1),
        "cpus": os.cpu_count(),
        "versions": versions,
        "args": {k: str(v) if isinstance(v, pathlib.Path) else v for k, v in vars(args).items()},
        "mixes": {m: MIXES[m].description for m in args.mix},
        "side_effect_check": effects,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    digest = package_digest()
    effects = []
    for name in args.suites:
        check = verify_side_effects(cached_suite(name))
        effects.append(
            {
                "suite": check.suite,
                "changed": sorted(check.changed),
                "unlisted_changers": sorted(check.unlisted_changers),
                "listed_unchanged": sorted(check.listed_unchanged),
                "listed_uncalled": sorted(check.listed_uncalled),
            }
        )
        if check.unlisted_changers or check.listed_unchanged:
            print(
                f"side effects, {name}: change the environment but not listed: "
                f"{sorted(check.unlisted_changers) or '-'}; listed but no reference call "
                f"changed it: {sorted(check.listed_unchanged) or '-'}",
                file=sys.stderr,
            )
    problems = self_check(args.suites, args.limit)
    if problems:
        print("harness self-check failed (no faults, toolnode):", file=sys.stderr)
        print("\n".join(problems), file=sys.stderr)
        return 2
    units = units_of(args)
    jobs = args.jobs if args.jobs is not None else min(os.cpu_count() or 1, len(units))
    results = evaluate(units, jobs)
    seconds = time.perf_counter() - started
    print(table(aggregate(results)))
    errors = sorted({f"{r.contender}: {r.raised}" for r in results if r.raised})
    if errors:
        print(f"{len(errors)} distinct errors raised by runs, e.g.:")
        print("\n".join(f"  {e[:96]}" for e in errors[:5]))
    print(f"{len(results)} task runs in {seconds:.0f} s")
    if args.out is not None:
        write(args.out, results, metadata(args, seconds, effects, digest))
        print(f"wrote {args.out / 'agentdojo-eval.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
