"""Throughput on LangGraph Server (``langgraph dev``): runs/s at 1, 8 and 32 concurrent
threads, ``add_resilience`` against the same graph without the package, in one run.

The graphs are the server tests' (``tests/server/app/``, copied to a temp folder): one
deterministic support agent (a `ScriptedChatModel` policy) whose input "refund <order>"
makes it call ``refund(order=...)`` once and then answer, 2 model steps and 1 tool
call per run.

- ``ours``: `add_resilience` (``ToolProfile(side_effect=True, status_check=...)``), the
  default ledger (under the server, the SQLite ledger beside its ``.langgraph_api``);
- ``plain``: the same agent on LangGraph's ``ToolNode`` + ``tools_condition``.

``refund`` inserts one row into ``effects`` (a fresh database ``bench_srv_<random>`` on
``--dsn``, created and dropped by the script) and returns at once (``LGR_CONTROL`` is an
empty temp folder, so there is no hold file). There is no read-only request in that
policy, so each run does one real write, the same for both graphs.

One ``langgraph dev`` server (in-memory runtime, one process) serves both graphs,
started with ``--n-jobs-per-worker`` (default 64) so that 32 concurrent runs are not
capped by the default 10. For each concurrency c in (1, 8, 32): one warm-up batch per
graph, then ``rounds`` rounds; in each round a batch of K runs of ``plain`` and a batch
of K runs of ``ours`` (ABBA order across rounds: AB, BA, AB, ...), each run on its own new
thread (``runs.wait`` with ``if_not_exists="create"``: one request per run), c at a time
(asyncio tasks behind a semaphore on one async `langgraph_sdk` client). A batch's wall
time gives its runs/s. After each batch, untimed, its threads are deleted, so the
in-memory store (which the server scans and pickles to ``.langgraph_api``) stays small
and later rounds are not slower than earlier ones.

Reported per c: the median runs/s of each graph over the rounds; ours/plain as the
geometric mean of the per-round paired ratios, with a 95% t-interval on the log ratios;
the server's CPU time per run (utime + stime of the server's process group, from
/proc; robust to other load on the machine) and its ratio; the effects per run counted
in the table (each run must refund exactly once: "bad" counts orders refunded other
than once and runs that failed or answered wrongly); and the median latency of a run
(request to answer).

Reading it: at low concurrency the in-memory runtime's queue sets the pace, not the
graph. Its worker loop polls ``Runs.next``, which sleeps 0.5 s when the previous poll
found nothing and takes only runs created before the poll began, so an isolated run
waits about 1 s (p50 ~1000 ms for both graphs at c=1 and c=8) and runs/s is about
c / 1 s whatever the graph does. The server CPU per run is the column that sees the
package's cost at every c; runs/s starts to separate the graphs only once the server
is busy (c=32 here).

Run it from the repository root::

    python benchmarks/server_throughput.py --quick        # < ~2 min
    python benchmarks/server_throughput.py                # < ~8 min
    python benchmarks/server_throughput.py --runs 64 --out server_throughput.json

The numbers measure the server and the graph together: the dev server's in-memory
runtime (one process, one event loop, the GIL, its queue polling and its periodic
pickling of ``.langgraph_api``) is a large and shared part of each run, and the client
runs on the same machine. The exit status is 0 whatever the ratios; non-zero on errors.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib.metadata
import json
import math
import os
import pathlib
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
from langgraph_sdk import get_client

from benchmarks.scratch import scratch_database

ROOT = pathlib.Path(__file__).resolve().parent.parent
APP = ROOT / "tests" / "server" / "app"
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
CONTENDERS = ("plain", "ours")
START_TIMEOUT = 120.0
PACKAGES = (
    "langgraph",
    "langgraph-api",
    "langgraph-cli",
    "langgraph-runtime-inmem",
    "langgraph-sdk",
    "langchain-core",
    "langgraph-resilience",
)
# Two-sided 95% Student t quantiles by degrees of freedom (no scipy here).
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
       9: 2.262, 10: 2.228, 11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131,
       16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086, 25: 2.060, 30: 2.042}  # fmt: skip


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sizes:
    """How much work one run does."""

    concurrency: tuple[int, ...]
    rounds: int
    runs: dict[int, int]
    """K: runs per graph per round, by concurrency."""


QUICK = Sizes(concurrency=(1, 8, 32), rounds=3, runs={1: 6, 8: 24, 32: 64})
FULL = Sizes(concurrency=(1, 8, 32), rounds=6, runs={1: 12, 8: 48, 32: 128})


# ------------------------------------------------------------------ statistics


def t95(df: int) -> float:
    if df in T95:
        return T95[df]
    below = max(k for k in T95 if k <= df)
    return T95[below] if df < 30 else 1.96 + (T95[30] - 1.96) * 30 / df


def ratio_ci(pairs: list[tuple[float, float]]) -> tuple[float, float, float]:
    """Geometric mean of a/b over paired rounds and its 95% t-interval (log scale)."""
    logs = [math.log(a / b) for a, b in pairs]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(mean), float("nan"), float("nan")
    half = t95(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


# ------------------------------------------------------------------ the server


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _langgraph() -> str:
    found = pathlib.Path(sys.executable).with_name("langgraph")
    if found.exists():
        return str(found)
    which = shutil.which("langgraph")
    if which is None:
        raise SystemExit("error: the `langgraph` CLI is not installed (pip install -e '.[dev]')")
    return which


def group_cpu_seconds(pgid: int) -> float:
    """utime + stime of every live process in process group `pgid` (Linux /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        # after the command: state(0) ppid(1) pgrp(2) ... utime(11) stime(12)
        if int(fields[2]) == pgid:
            total += int(fields[11]) + int(fields[12])
    return total / tick


@dataclasses.dataclass
class Server:
    cwd: pathlib.Path
    env: dict[str, str]
    jobs: int
    port: int = dataclasses.field(default_factory=_free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> pathlib.Path:
        return self.cwd / "server.log"

    def tail(self, lines: int = 30) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def start(self) -> None:
        command = [_langgraph(), "dev", "--no-browser", "--no-reload"]
        command += ["--host", "127.0.0.1", "--port", str(self.port)]
        command += ["--n-jobs-per-worker", str(self.jobs), "--server-log-level", "WARNING"]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                command, cwd=self.cwd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"langgraph dev exited {self.process.returncode}:\n{self.tail()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/ok", timeout=1.0).status_code == 200:
                    return
            time.sleep(0.2)
        raise RuntimeError(
            f"langgraph dev did not answer /ok in {START_TIMEOUT:g}s:\n{self.tail()}"
        )

    def cpu(self) -> float:
        return group_cpu_seconds(self.process.pid) if self.process is not None else 0.0

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


@contextlib.contextmanager
def effects_database(dsn: str) -> Iterator[str]:
    """A fresh database ``bench_srv_<random>`` with the ``effects`` table; dropped after."""
    with scratch_database(dsn, "bench_srv") as bench_dsn:
        with psycopg.connect(bench_dsn, autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE effects (order_id text NOT NULL, key text,"
                " at timestamptz DEFAULT now())"
            )
        yield bench_dsn


def count_effects(dsn: str, prefix: str) -> tuple[int, int]:
    """(rows, orders refunded other than exactly once) for orders starting with `prefix`."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT count(*) FROM effects WHERE order_id LIKE %s", (prefix + "%",)
        ).fetchone()
        odd = conn.execute(
            "SELECT count(*) FROM (SELECT order_id FROM effects WHERE order_id LIKE %s"
            " GROUP BY order_id HAVING count(*) <> 1) AS o",
            (prefix + "%",),
        ).fetchone()
    return int(rows[0]) if rows else 0, int(odd[0]) if odd else 0


# ------------------------------------------------------------------ the load


def _answered(values: Any, order: str) -> bool:
    if not isinstance(values, dict):
        return False
    messages = values.get("messages") or []
    last = messages[-1] if messages else {}
    content = last.get("content", "") if isinstance(last, dict) else ""
    return isinstance(content, str) and content.startswith("done: refunded " + order)


async def batch(client: Any, graph: str, runs: int, concurrency: int, tag: str) -> dict[str, Any]:
    """`runs` runs of `graph`, each on a new thread, `concurrency` at a time."""
    gate = asyncio.Semaphore(concurrency)
    failures: list[str] = []
    latencies: list[float] = []
    threads = [str(uuid.uuid4()) for _ in range(runs)]

    async def one(index: int) -> None:
        order = f"{tag}-{index}"
        async with gate:
            begun = time.perf_counter()
            try:
                values = await client.runs.wait(
                    threads[index], graph, if_not_exists="create",
                    input={"messages": [{"role": "user", "content": f"refund {order}"}]},
                )  # fmt: skip
            except Exception as exc:  # counted, reported
                failures.append(f"{type(exc).__name__}: {exc}"[:200])
                return
            latencies.append(time.perf_counter() - begun)
            if not _answered(values, order):
                failures.append(f"unexpected answer: {str(values)[:200]}")

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(runs)))
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "failures": failures, "latencies": latencies, "threads": threads}


async def forget(client: Any, threads: list[str]) -> None:
    """Delete finished threads (untimed), so the in-memory store does not grow."""
    gate = asyncio.Semaphore(8)

    async def one(thread_id: str) -> None:
        async with gate:
            with contextlib.suppress(Exception):
                await client.threads.delete(thread_id)

    await asyncio.gather(*(one(t) for t in threads))


async def measure(
    server: Server, dsn: str, sizes: Sizes, runs_override: int | None
) -> list[dict[str, Any]]:
    client = get_client(url=server.url, timeout=300.0)
    results = []
    try:
        for concurrency in sizes.concurrency:
            runs = runs_override or sizes.runs[concurrency]
            print(f"c={concurrency}: {sizes.rounds} rounds x {runs} runs per graph ...", flush=True)
            for graph in CONTENDERS:  # warm-up, not counted
                warm = await batch(
                    client, graph, max(concurrency, 4), concurrency, f"w{concurrency}{graph}"
                )
                await forget(client, warm["threads"])
            samples: dict[str, list[dict[str, Any]]] = {name: [] for name in CONTENDERS}
            for index in range(sizes.rounds):
                order = CONTENDERS if index % 2 == 0 else CONTENDERS[::-1]
                for graph in order:
                    tag = f"{graph}-c{concurrency}-r{index}"
                    cpu_before = server.cpu()
                    done = await batch(client, graph, runs, concurrency, tag)
                    cpu = server.cpu() - cpu_before
                    rows, odd = count_effects(dsn, tag + "-")
                    await forget(client, done["threads"])
                    samples[graph].append(
                        {
                            "runs": runs,
                            "seconds": done["seconds"],
                            "runs_per_s": runs / done["seconds"],
                            "latency_ms_median": statistics.median(done["latencies"]) * 1e3
                            if done["latencies"]
                            else float("nan"),
                            "server_cpu_ms_per_run": cpu * 1e3 / runs,
                            "effects": rows,
                            "orders_not_once": odd,
                            "failures": done["failures"],
                        }
                    )
            results.append(summarize(concurrency, runs, samples))
    finally:
        await client.aclose()
    return results


def summarize(
    concurrency: int, runs: int, samples: dict[str, list[dict[str, Any]]]
) -> dict[str, Any]:
    row: dict[str, Any] = {"concurrency": concurrency, "runs_per_round": runs, "rounds": {}}
    for graph, rounds in samples.items():
        total_runs = sum(r["runs"] for r in rounds)
        row[graph] = {
            "runs_per_s_median": statistics.median(r["runs_per_s"] for r in rounds),
            "runs_per_s_overall": total_runs / sum(r["seconds"] for r in rounds),
            "server_cpu_ms_per_run": statistics.median(r["server_cpu_ms_per_run"] for r in rounds),
            "latency_ms_median": statistics.median(r["latency_ms_median"] for r in rounds),
            "effects_per_run": sum(r["effects"] for r in rounds) / total_runs,
            "orders_not_once": sum(r["orders_not_once"] for r in rounds),
            "failed_runs": sum(len(r["failures"]) for r in rounds),
            "first_failures": [f for r in rounds for f in r["failures"]][:3],
        }
        row["rounds"][graph] = rounds
    pairs = [
        (o["runs_per_s"], p["runs_per_s"])
        for o, p in zip(samples["ours"], samples["plain"], strict=True)
    ]
    ratio, low, high = ratio_ci(pairs)
    row["ratio"] = ratio
    row["ratio_ci95"] = [low, high]
    row["cpu_ratio"] = row["ours"]["server_cpu_ms_per_run"] / row["plain"]["server_cpu_ms_per_run"]
    return row


# ------------------------------------------------------------------ reporting


def print_table(rows: list[dict[str, Any]]) -> None:
    print("\nThroughput on langgraph dev (each run: a new thread, 2 model steps, 1 refund)")
    header = (
        f"{'c':>3} {'runs':>5}  {'plain r/s':>9} {'ours r/s':>9}  {'ours/plain':>10} "
        f"{'95% CI':>11}  {'p50 p|o':>9} {'CPU ms p|o':>10} {'CPU o/p':>7}  "
        f"{'eff/run':>9} {'bad':>3}"
    )
    print(header)
    print("-" * len(header))
    for row in rows:
        plain, ours = row["plain"], row["ours"]
        low, high = row["ratio_ci95"]
        bad = sum(g["orders_not_once"] + g["failed_runs"] for g in (plain, ours))
        runs = row["runs_per_round"] * len(row["rounds"]["ours"])
        latency = f"{plain['latency_ms_median']:.0f}|{ours['latency_ms_median']:.0f}"
        cpu = f"{plain['server_cpu_ms_per_run']:.1f}|{ours['server_cpu_ms_per_run']:.1f}"
        effects = f"{plain['effects_per_run']:.2f}|{ours['effects_per_run']:.2f}"
        print(
            f"{row['concurrency']:>3} {runs:>5}  {plain['runs_per_s_median']:>9.2f} "
            f"{ours['runs_per_s_median']:>9.2f}  {row['ratio']:>9.3f}x "
            f"{low:>5.3f}-{high:<5.3f}  {latency:>9} {cpu:>10} {row['cpu_ratio']:>6.3f}x  "
            f"{effects:>9} {bad:>3}"
        )
    print(
        "c = concurrent runs, each on its own new thread; runs = runs per graph over all\n"
        "rounds; r/s = median runs/s over rounds; ours/plain = geometric mean of the per-round\n"
        "paired runs/s ratios (<1: ours slower), CI = 95% t-interval over rounds; p50 = median\n"
        "run latency in ms (request to answer; plain|ours); CPU ms = server process CPU per\n"
        "run, o/p its ratio; eff/run = refund rows per run (plain|ours, must be 1.00|1.00);\n"
        "bad = failed runs + orders refunded other than once (both graphs)"
    )
    for row in rows:
        for graph in CONTENDERS:
            for failure in row[graph]["first_failures"]:
                print(f"c={row['concurrency']} {graph}: {failure}")


def environment() -> dict[str, Any]:
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "packages": versions,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and runs (< ~2 min)")
    parser.add_argument(
        "--runs", type=int, metavar="N", help="runs per graph per round, at every concurrency"
    )
    parser.add_argument("--rounds", type=int, metavar="R", help="rounds per concurrency")
    parser.add_argument("--out", metavar="FILE", help="also write the results as JSON to FILE")
    parser.add_argument(
        "--dsn", default=DEFAULT_DSN, help=f"PostgreSQL allowing CREATE DATABASE ({DEFAULT_DSN})"
    )
    parser.add_argument(
        "--jobs", type=int, default=64, help="--n-jobs-per-worker of the server (default 64)"
    )
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    if args.rounds:
        sizes = dataclasses.replace(sizes, rounds=args.rounds)
    if args.jobs < max(sizes.concurrency):
        parser.error(f"--jobs must be >= {max(sizes.concurrency)}")

    started = time.perf_counter()
    env = environment()
    pkgs = env["packages"]
    print(
        f"langgraph-resilience server throughput ({'quick' if args.quick else 'full'}); "
        f"python {env['python']}, langgraph {pkgs['langgraph']}, langgraph-api "
        f"{pkgs['langgraph-api']}, {env['cpus']} CPUs"
    )
    load_before = os.getloadavg()[0]
    if load_before > 0.5 * (os.cpu_count() or 1):
        print(
            f"warning: load average {load_before:.2f} on {os.cpu_count()} CPUs; other work "
            "on this machine adds noise (the interleaving keeps the ratios fair)"
        )
    try:
        with psycopg.connect(args.dsn, autocommit=True, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
    except Exception as exc:
        print(f"error: PostgreSQL unreachable at {args.dsn}: {exc}", file=sys.stderr)
        return 2

    rows: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="lgr-srv-bench-") as tmp,
        effects_database(args.dsn) as dsn,
    ):
        cwd = pathlib.Path(tmp) / "app"
        shutil.copytree(APP, cwd, ignore=shutil.ignore_patterns("__pycache__", ".langgraph_api"))
        control = pathlib.Path(tmp) / "control"
        control.mkdir()
        server_env = {
            **os.environ,
            "EFFECTS_DSN": dsn,
            "LGR_CONTROL": str(control),
            "LANGSMITH_TRACING": "false",
            "LANGCHAIN_TRACING_V2": "false",
            "LANGGRAPH_CLI_NO_ANALYTICS": "1",
            "LANGGRAPH_NO_VERSION_CHECK": "true",
            "LANGSMITH_API_KEY": "",
        }
        server = Server(cwd=cwd, env=server_env, jobs=args.jobs)
        try:
            print(f"starting langgraph dev on {server.url} (--n-jobs-per-worker {args.jobs}) ...",
                  flush=True)  # fmt: skip
            server.start()
            print(f"server up after {time.perf_counter() - started:.1f} s", flush=True)
            rows = asyncio.run(measure(server, dsn, sizes, args.runs))
        except BaseException:
            print(f"server log tail:\n{server.tail()}", file=sys.stderr)
            raise
        finally:
            server.stop()

    print_table(rows)
    elapsed = time.perf_counter() - started
    load_after = os.getloadavg()[0]
    print(
        f"\ndone in {elapsed:.1f} s; load average {load_before:.2f} at start, "
        f"{load_after:.2f} at end"
    )
    if args.out:
        report = {
            "mode": "quick" if args.quick else "full",
            "sizes": {
                "concurrency": list(sizes.concurrency),
                "rounds": sizes.rounds,
                "runs": {str(c): args.runs or sizes.runs[c] for c in sizes.concurrency},
            },
            "server": {"command": "langgraph dev", "n_jobs_per_worker": args.jobs},
            "environment": env,
            "results": rows,
            "seconds": elapsed,
            "load_average": {"start": load_before, "end": load_after},
        }
        with open(args.out, "w", encoding="utf-8") as out:
            json.dump(report, out, indent=2)
            out.write("\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
