"""Circuit-breaker overhead and effect: what a breaker costs per call, and what it saves.

What it measures, in one run:

1. **In-process check** (``InMemoryBreakerStore``, closed breaker): the time of
   ``acquire`` + ``record`` around a call, per call, with ``timeit`` against an
   empty loop. Target: < 5 us per call. ``CircuitBreaker.call`` (the same plus
   exception handling and the clock reads) is timed too.

2. **No serialization.** 8 threads each call a 10 ms blocking function 80
   times, unwrapped and through a closed in-memory breaker (acquire/record
   around each call); the same with 8 asyncio tasks awaiting a 10 ms sleep.
   Runs are interleaved (ABBA) and the medians compared: target <= 1.2x the
   unwrapped run. For reference, a breaker that holds its lock across the call
   (what pybreaker does) is run once: it serializes the 8 threads.

3. **Postgres store** (``PostgresBreakerStore``) on one connection configured
   as LangGraph's PostgresSaver requires (autocommit, ``prepare_threshold=0``,
   dict rows), on a throw-away database ``lgr_bench_<random>`` created and
   dropped by the script: median latency of ``acquire`` on a closed breaker (one
   plain SELECT), of ``record`` (a locked transaction: two round trips) and of a
   half-open ``acquire`` (locked), against a bare ``SELECT 1`` on the same
   connection, interleaved.

4. **A 60-second outage** (fake clock, deterministic discrete-event simulation):
   50 threads (simulated callers) each run one task a second against a tool that
   answers 503 for the whole minute; a task retries TRANSIENT failures as the
   package does (``ResiliencePolicy()``: 3 attempts, full-jitter backoff from
   ``backoff_delay``). Reported: calls that reached the dead tool without a
   breaker, with a shared breaker (``BreakerConfig()`` defaults and with a 10 s
   ``open_duration``), and with breaker + ``RetryBudget()``; plus the
   retry/first-attempt ratio under the budget alone.

Run it from the repository root::

    python benchmarks/breaker_overhead.py               # full run (~1 min)
    python benchmarks/breaker_overhead.py --quick       # smoke run (~15 s)
    python benchmarks/breaker_overhead.py --dsn postgresql://postgres@127.0.0.1:5432/postgres
    python benchmarks/breaker_overhead.py --json breaker.json

Without ``--dsn`` the default server (``postgresql://postgres@127.0.0.1:5432/postgres``)
is tried and the Postgres part is skipped, with the reason, when unreachable;
with an explicit ``--dsn`` an unreachable server is an error. The DSN must
allow ``CREATE DATABASE``. The exit status is 0 whether or not the targets are
met (the report says which); it is non-zero only on errors.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import heapq
import json
import platform
import random
import statistics
import sys
import threading
import time
import timeit
from collections.abc import Callable
from typing import Any

import psycopg

from benchmarks.scratch import scratch_database
from langgraph_resilience.core.backoff import backoff_delay
from langgraph_resilience.core.breaker import BreakerConfig
from langgraph_resilience.core.budget import RetryBudget
from langgraph_resilience.core.policy import ResiliencePolicy
from langgraph_resilience.errors import FailureClass
from langgraph_resilience.stores.breakers import CircuitBreaker, InMemoryBreakerStore
from langgraph_resilience.stores.budgets import InMemoryRetryBudgetStore
from langgraph_resilience.stores.persistence import POSTGRES_CONNECTION_KWARGS
from langgraph_resilience.stores.postgres_breakers import PostgresBreakerStore
from langgraph_resilience.testing import FakeClock

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
CFG = BreakerConfig()


# ------------------------------------------------------------- 1. in-process


def in_process(quick: bool) -> dict[str, float]:
    """Microseconds per call of the breaker check on a closed in-memory breaker."""
    store, clock = InMemoryBreakerStore(), FakeClock()
    breaker = CircuitBreaker("tool", CFG, store=store, clock=clock)
    number = 50_000 if quick else 300_000
    namespace = {"store": store, "cfg": CFG, "breaker": breaker, "noop": lambda: None}

    def best(stmt: str) -> float:
        runs = timeit.repeat(stmt, globals=namespace, number=number, repeat=3 if quick else 7)
        return min(runs) / number * 1e6

    empty = best("pass")
    acquire = best("store.acquire('tool', cfg, 0.0)") - empty
    record = best("store.record('tool', cfg, 0.0, None, probe=False, duration=0.01)") - empty
    pair = (
        best(
            "a = store.acquire('tool', cfg, 0.0)\n"
            "store.record('tool', cfg, 0.0, None, probe=a.probe, duration=0.01)"
        )
        - empty
    )
    call = best("breaker.call(noop)") - best("noop()")
    return {"acquire_us": acquire, "record_us": record, "check_us": pair, "circuit_call_us": call}


# ---------------------------------------------------------- 2. concurrency

THREADS, CALLS, WORK = 8, 80, 0.010


def _threads(body: Callable[[], None]) -> float:
    start = threading.Barrier(THREADS + 1)

    def worker() -> None:
        start.wait()
        for _ in range(CALLS):
            body()

    workers = [threading.Thread(target=worker) for _ in range(THREADS)]
    for worker_thread in workers:
        worker_thread.start()
    start.wait()
    began = time.perf_counter()
    for worker_thread in workers:
        worker_thread.join()
    return time.perf_counter() - began


def _work() -> None:
    time.sleep(WORK)  # the tool being protected: 10 ms of blocking I/O


def _guarded(store: InMemoryBreakerStore) -> Callable[[], None]:
    def body() -> None:
        admission = store.acquire("tool", CFG, time.time())
        started = time.monotonic()
        _work()
        store.record(
            "tool",
            CFG,
            time.time(),
            None,
            probe=admission.probe,
            duration=time.monotonic() - started,
        )

    return body


def _serializing() -> Callable[[], None]:
    lock = threading.Lock()

    def body() -> None:
        with lock:  # a breaker holding its lock across the call (pybreaker's design)
            _work()

    return body


async def _tasks(body: Callable[[], Any]) -> float:
    async def worker() -> None:
        for _ in range(CALLS):
            await body()

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(THREADS)))
    return time.perf_counter() - began


async def _awork() -> None:
    await asyncio.sleep(WORK)


def _aguarded(store: InMemoryBreakerStore) -> Callable[[], Any]:
    async def body() -> None:
        admission = await store.aacquire("tool", CFG, time.time())
        started = time.monotonic()
        await _awork()
        await store.arecord(
            "tool",
            CFG,
            time.time(),
            None,
            probe=admission.probe,
            duration=time.monotonic() - started,
        )

    return body


def concurrency(quick: bool) -> dict[str, Any]:
    """Wall time of 8 x 80 calls of a 10 ms function, bare and through a breaker."""
    rounds = 2 if quick else 5
    store = InMemoryBreakerStore()
    bare: list[float] = []
    wrapped: list[float] = []
    abare: list[float] = []
    awrapped: list[float] = []
    for index in range(rounds):  # ABBA
        order = [(bare, _work), (wrapped, _guarded(store))]
        for sink, body in order if index % 2 == 0 else reversed(order):
            sink.append(_threads(body))
        aorder = [(abare, _awork), (awrapped, _aguarded(store))]
        for sink, abody in aorder if index % 2 == 0 else reversed(aorder):
            sink.append(asyncio.run(_tasks(abody)))
    serial = _threads(_serializing())
    result = {
        "threads_bare_ms": statistics.median(bare) * 1e3,
        "threads_breaker_ms": statistics.median(wrapped) * 1e3,
        "tasks_bare_ms": statistics.median(abare) * 1e3,
        "tasks_breaker_ms": statistics.median(awrapped) * 1e3,
        "lock_across_call_ms": serial * 1e3,
    }
    result["threads_ratio"] = result["threads_breaker_ms"] / result["threads_bare_ms"]
    result["tasks_ratio"] = result["tasks_breaker_ms"] / result["tasks_bare_ms"]
    return result


# ------------------------------------------------------------- 3. Postgres


def postgres(dsn: str, quick: bool) -> dict[str, float]:
    """Median microseconds of the store's operations vs a bare SELECT 1, same connection."""
    samples = 200 if quick else 1000
    with (
        scratch_database(dsn) as scratch,
        psycopg.connect(scratch, **POSTGRES_CONNECTION_KWARGS) as conn,
    ):
        store = PostgresBreakerStore(conn)
        store.setup()
        half_open_cfg = BreakerConfig(
            minimum_calls=1, window_size=1, half_open_max_calls=1, half_open_timeout=1e-9
        )
        store.record("half-open", half_open_cfg, 0.0, FailureClass.TRANSIENT)
        now = [1000.0]

        def half_open_acquire() -> None:
            now[0] += 1.0  # every call starts a fresh half-open round: always the locked path
            store.acquire("half-open", half_open_cfg, now[0])

        operations: dict[str, Callable[[], Any]] = {
            "select_1": lambda: conn.execute("SELECT 1").fetchone(),
            "acquire_closed": lambda: store.acquire("tool", CFG, 0.0),
            "record": lambda: store.record("tool", CFG, 0.0, None, duration=0.01),
            "acquire_half_open": half_open_acquire,
        }
        times: dict[str, list[float]] = {name: [] for name in operations}
        for _ in range(20):  # warm-up
            for operation in operations.values():
                operation()
        for _ in range(samples):
            for name, operation in operations.items():
                began = time.perf_counter()
                operation()
                times[name].append(time.perf_counter() - began)
    medians = {f"{name}_us": statistics.median(t) * 1e6 for name, t in times.items()}
    base = medians["select_1_us"]
    for name in ("acquire_closed", "record", "acquire_half_open"):
        medians[f"{name}_vs_select_1"] = medians[f"{name}_us"] / base
    return medians


# --------------------------------------------------------------- 4. outage

OUTAGE, CALLERS, TOOL_LATENCY, THINK = 60.0, 50, 0.2, 1.0


@dataclasses.dataclass
class OutageResult:
    """What one strategy did during the simulated minute."""

    reached_dead_tool: int = 0
    first_attempts: int = 0
    retries: int = 0
    refused_by_breaker: int = 0
    retries_refused_by_budget: int = 0
    tasks: int = 0


def outage(
    breaker: BreakerConfig | None, budget: RetryBudget | None, *, seed: int = 1
) -> OutageResult:
    """Simulate CALLERS callers, each running one task a second, against a tool that
    fails 503 for OUTAGE seconds; events are processed in time order on a fake clock."""
    policy, rng, clock = ResiliencePolicy(), random.Random(seed), FakeClock()
    store, budgets = InMemoryBreakerStore(), InMemoryRetryBudgetStore()
    result = OutageResult()
    # (time, sequence, caller, attempt): attempt 0 is a task's first call.
    events = [(caller * THINK / CALLERS, caller, caller, 0) for caller in range(CALLERS)]
    heapq.heapify(events)
    sequence = CALLERS
    while events:
        at, _, caller, attempt = heapq.heappop(events)
        if at >= OUTAGE:
            break
        clock.advance(at - clock.monotonic())
        now = clock.time()
        next_task = at + THINK
        if attempt == 0:
            result.tasks += 1
        admission = store.acquire("tool", breaker, now) if breaker is not None else None
        if admission is not None and not admission.allowed:
            result.refused_by_breaker += 1  # fails fast: the agent takes its fallback path
        else:
            result.reached_dead_tool += 1
            if attempt == 0:
                result.first_attempts += 1
                if budget is not None:
                    budgets.deposit("tool", budget, now)
            else:
                result.retries += 1
            if breaker is not None and admission is not None:
                store.record(
                    "tool",
                    breaker,
                    now + TOOL_LATENCY,
                    FailureClass.TRANSIENT,
                    probe=admission.probe,
                    duration=TOOL_LATENCY,
                )
            if attempt + 1 < policy.max_attempts:
                allowed = budget is None or budgets.try_withdraw("tool", budget, now + TOOL_LATENCY)
                if allowed:
                    delay = backoff_delay(attempt, policy=policy, rng=rng) or 0.0
                    sequence += 1
                    heapq.heappush(
                        events, (at + TOOL_LATENCY + delay, sequence, caller, attempt + 1)
                    )
                    continue
                result.retries_refused_by_budget += 1
            next_task = at + TOOL_LATENCY + THINK
        sequence += 1
        heapq.heappush(events, (next_task, sequence, caller, 0))
    return result


def outages() -> dict[str, dict[str, Any]]:
    """The outage simulation under each strategy."""
    strategies: dict[str, tuple[BreakerConfig | None, RetryBudget | None]] = {
        "no breaker": (None, None),
        "retry budget only": (None, RetryBudget()),
        "breaker (defaults)": (BreakerConfig(), None),
        "breaker (open_duration=10s)": (BreakerConfig(open_duration=10.0), None),
        "breaker (10s) + retry budget": (BreakerConfig(open_duration=10.0), RetryBudget()),
    }
    report = {}
    for name, (breaker, budget) in strategies.items():
        result = outage(breaker, budget)
        report[name] = {
            **dataclasses.asdict(result),
            "retry_ratio": result.retries / max(1, result.first_attempts),
        }
    return report


# ------------------------------------------------------------------- main


def _reachable(dsn: str) -> str | None:
    try:
        psycopg.connect(dsn, connect_timeout=3).close()
    except psycopg.Error as exc:
        return str(exc).strip().splitlines()[0]
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples (smoke run)")
    parser.add_argument("--dsn", help="PostgreSQL DSN allowing CREATE DATABASE")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)

    report: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "quick": args.quick,
    }
    print(f"Python {report['python']} on {report['platform']}")

    check = in_process(args.quick)
    report["in_process"] = check
    verdict = "meets" if check["check_us"] < 5 else "MISSES"
    print("\n1. In-process breaker check (closed, InMemoryBreakerStore), per call:")
    print(f"   acquire {check['acquire_us']:.2f} us, record {check['record_us']:.2f} us")
    print(f"   acquire + record {check['check_us']:.2f} us ({verdict} the < 5 us target)")
    print(f"   CircuitBreaker.call overhead {check['circuit_call_us']:.2f} us")

    conc = concurrency(args.quick)
    report["concurrency"] = conc
    print(f"\n2. {THREADS} threads x {CALLS} calls of a {WORK * 1e3:.0f} ms function (medians):")
    for kind, unit in (("threads", "threads"), ("tasks", "asyncio tasks")):
        ratio = conc[f"{kind}_ratio"]
        verdict = "meets" if ratio <= 1.2 else "MISSES"
        print(
            f"   {unit}: bare {conc[f'{kind}_bare_ms']:.0f} ms, through a closed breaker "
            f"{conc[f'{kind}_breaker_ms']:.0f} ms = {ratio:.3f}x ({verdict} the <= 1.2x target)"
        )
    print(f"   reference, lock held across the call: {conc['lock_across_call_ms']:.0f} ms")

    dsn = args.dsn or DEFAULT_DSN
    reason = _reachable(dsn)
    if reason is not None and args.dsn:
        print(f"error: cannot reach PostgreSQL at {args.dsn}: {reason}", file=sys.stderr)
        return 2
    print("\n3. PostgresBreakerStore, one connection (median per call):")
    if reason is not None:
        print(f"   skipped: PostgreSQL not reachable at {dsn}: {reason}")
        report["postgres"] = {"skipped": reason}
    else:
        pg = postgres(dsn, args.quick)
        report["postgres"] = pg
        print(f"   SELECT 1                     {pg['select_1_us']:8.0f} us")
        for name, label in (
            ("acquire_closed", "acquire, closed (1 SELECT)"),
            ("record", "record (locked, 2 trips)"),
            ("acquire_half_open", "acquire, half-open (locked)"),
        ):
            print(f"   {label:28} {pg[f'{name}_us']:8.0f} us = {pg[f'{name}_vs_select_1']:.2f}x")

    print(f"\n4. {OUTAGE:.0f} s outage, {CALLERS} threads, one task a second each (fake clock):")
    sims = outages()
    report["outage"] = sims
    print(
        f"   {'strategy':30} {'reached dead tool':>17} {'refused fast':>12} "
        f"{'retries':>8} {'retry ratio':>11}"
    )
    for name, row in sims.items():
        print(
            f"   {name:30} {row['reached_dead_tool']:17d} {row['refused_by_breaker']:12d} "
            f"{row['retries']:8d} {row['retry_ratio']:11.3f}"
        )

    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(report, out, indent=2)
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
