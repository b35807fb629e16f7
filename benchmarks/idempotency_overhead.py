"""Added latency of the idempotency ledger per side-effecting call, on a real PostgreSQL.

What one side-effecting tool call costs on top of the tool itself: writing the
intent before the effect (`PostgresIdempotencyStore.claim`, which must be
durable) and the outcome after (`record_outcome`). Measured on a throw-away
database ``lgr_bench_idem_<random>`` (created and dropped by the script), with a
pool configured exactly as LangGraph's ``PostgresSaver`` needs
(``persistence.POSTGRES_CONNECTION_KWARGS``), a fresh key per call, after a
warm-up, timed with ``time.perf_counter`` around each call. Reported per call:
median, p90, p99 in milliseconds, for

- ``claim + record_outcome``: the added latency per side-effecting call (target
  <= 1 ms median), with the default outcome commit (``synchronous_commit=off``
  for that one statement, see `PostgresIdempotencyStore`) and with
  ``sync_outcomes=True``; ``claim`` and ``record_outcome`` alone; ``claim`` of a
  key that is already done (what a resumed node pays to replay); the async store
  on an ``AsyncConnectionPool``;
- two floors on the same server, for reading the numbers: ``SELECT 1`` (one
  round trip) and a one-row durable ``INSERT`` (one round trip + one WAL flush,
  the least any durable write costs on this disk);
- the same ``claim + record_outcome`` with the whole session at
  ``synchronous_commit=off`` (NOT a recommended setting: it shows what the
  ledger costs in CPU and network once the disk flush is taken out).

Round trips per call are counted, not assumed: libpq's protocol trace
(``PGconn.trace``) records every message of 200 steady-state calls, and each
frontend ``Sync`` (extended protocol) or ``Query`` (simple protocol) ends one
round trip. The first use of a statement on a connection costs one extra round
trip (``prepare_threshold=0`` prepares it), reported separately.

Run it from the repository root::

    python benchmarks/idempotency_overhead.py                  # ~2000 calls per row
    python benchmarks/idempotency_overhead.py --quick          # smoke run
    python benchmarks/idempotency_overhead.py --dsn postgresql://postgres@127.0.0.1:5432/postgres
    python benchmarks/idempotency_overhead.py --json idem.json

The DSN must allow ``CREATE DATABASE``. Exit status 0 whether or not the target
is met (the table says which); non-zero only on errors.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
from psycopg import pq
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from benchmarks.scratch import scratch_database
from langgraph_resilience.core.redaction import redact
from langgraph_resilience.stores.persistence import POSTGRES_CONNECTION_KWARGS
from langgraph_resilience.stores.postgres_ledger import (
    AsyncPostgresIdempotencyStore,
    PostgresIdempotencyStore,
)

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
TARGET_MS = 1.0
ARGS_JSON = '{"amount":1250,"currency":"EUR","order":"o-42","to":"acct-7"}'
RESULT = {"payment_id": "pay_0123456789", "status": "captured", "amount": 1250}

ROWS = (
    "claim + record_outcome (default)",
    "claim + record_outcome (sync_outcomes=True)",
    "claim alone (new key)",
    "record_outcome alone (default)",
    "claim of a done key (replay on resume)",
    "async store: claim + record_outcome (default)",
    "floor: SELECT 1 (1 round trip)",
    "floor: durable 1-row INSERT",
    "claim + record_outcome (session synchronous_commit=off)",
)
"""Display order of the latency table."""

_ids = itertools.count()


def _key() -> str:
    return f"pay:{uuid.uuid4().hex}{next(_ids)}"


def summarize(samples: list[float]) -> dict[str, float]:
    """Median, p90 and p99 in milliseconds."""
    ms = sorted(s * 1000 for s in samples)
    quantiles = statistics.quantiles(ms, n=100)
    return {
        "median_ms": statistics.median(ms),
        "p90_ms": quantiles[89],
        "p99_ms": quantiles[98],
        "n": len(ms),
    }


def make_pool(dsn: str, **extra: Any) -> ConnectionPool[Any]:
    kwargs = {**POSTGRES_CONNECTION_KWARGS, **extra}
    pool: ConnectionPool[Any] = ConnectionPool(
        dsn, min_size=1, max_size=2, kwargs=kwargs, open=True
    )
    pool.wait()
    return pool


Variant = Callable[[], Awaitable[dict[str, float] | None]]
"""One timed operation; it may report named sub-timings instead of its total."""


async def interleaved(variants: dict[str, Variant], calls: int, warmup: int) -> dict[str, Any]:
    """Time each variant once per round, rotating the order every round, so that
    drift and a noisy shared server hit every variant alike."""
    names = list(variants)
    samples: dict[str, list[float]] = {}
    for round_no in range(warmup + calls):
        shift = round_no % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            parts = await variants[name]()
            elapsed = time.perf_counter() - start
            if round_no >= warmup:
                for label, value in (parts or {name: elapsed}).items():
                    samples.setdefault(label, []).append(value)
    return {name: summarize(values) for name, values in samples.items()}


def sync(fn: Callable[[], Any]) -> Variant:
    async def run() -> dict[str, float] | None:
        parts = fn()
        return parts if isinstance(parts, dict) else None

    return run


def claim_and_record(store: PostgresIdempotencyStore) -> Callable[[], None]:
    def call() -> None:
        key = _key()
        store.claim(key, tool="pay", args_json=ARGS_JSON, thread_id="bench")
        store.record_outcome(key, RESULT)

    return call


async def latency_rows(dsn: str, calls: int, warmup: int) -> dict[str, Any]:
    with (
        make_pool(dsn) as pool,
        make_pool(dsn, options="-c synchronous_commit=off") as relaxed_pool,
    ):
        async with AsyncConnectionPool(
            dsn, min_size=1, max_size=2, kwargs=POSTGRES_CONNECTION_KWARGS, open=False
        ) as apool:
            with pool.connection() as conn:
                conn.execute("CREATE TABLE IF NOT EXISTS bench_floor (id bigserial, v text)")
            default = PostgresIdempotencyStore(pool)
            strict = PostgresIdempotencyStore(pool, sync_outcomes=True)
            relaxed = PostgresIdempotencyStore(relaxed_pool)
            astore = AsyncPostgresIdempotencyStore(apool)
            done_key = _key()
            default.claim(done_key, tool="pay", args_json=ARGS_JSON, thread_id="bench")
            default.record_outcome(done_key, RESULT)

            def select_one() -> None:
                with pool.connection() as conn:
                    conn.execute("SELECT 1")

            def durable_insert() -> None:
                with pool.connection() as conn:
                    conn.execute("INSERT INTO bench_floor (v) VALUES (%s)", ("x",))

            def claim_then_record() -> dict[str, float]:
                key = _key()
                start = time.perf_counter()
                default.claim(key, tool="pay", args_json=ARGS_JSON, thread_id="bench")
                middle = time.perf_counter()
                default.record_outcome(key, RESULT)
                return {
                    "claim alone (new key)": middle - start,
                    "record_outcome alone (default)": time.perf_counter() - middle,
                }

            async def aclaim_and_record() -> None:
                key = _key()
                await astore.aclaim(key, tool="pay", args_json=ARGS_JSON, thread_id="bench")
                await astore.arecord_outcome(key, RESULT)

            def replay() -> None:
                default.claim(done_key, tool="pay", args_json=ARGS_JSON, thread_id="bench")

            variants: dict[str, Variant] = {
                "floor: SELECT 1 (1 round trip)": sync(select_one),
                "floor: durable 1-row INSERT": sync(durable_insert),
                "claim + record_outcome (default)": sync(claim_and_record(default)),
                "claim + record_outcome (sync_outcomes=True)": sync(claim_and_record(strict)),
                "claim, record_outcome (timed apart)": sync(claim_then_record),
                "claim of a done key (replay on resume)": sync(replay),
                "claim + record_outcome (session synchronous_commit=off)": sync(
                    claim_and_record(relaxed)
                ),
                "async store: claim + record_outcome (default)": aclaim_and_record,
            }
            results = await interleaved(variants, calls, warmup)
    return {name: results[name] for name in ROWS}


def round_trips(dsn: str, calls: int = 200) -> dict[str, float]:
    """Round trips per call, counted from libpq's protocol trace."""
    counts: dict[str, float] = {}
    with psycopg.connect(dsn, **POSTGRES_CONNECTION_KWARGS) as conn:
        store = PostgresIdempotencyStore(conn)
        done_key = _key()

        def traced(label: str, fn: Callable[[], Any], n: int) -> None:
            with tempfile.TemporaryFile("w+") as trace:
                conn.pgconn.trace(trace.fileno())
                conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
                for _ in range(n):
                    fn()
                conn.pgconn.untrace()
                trace.seek(0)
                ends = sum(
                    1
                    for line in trace
                    if line.startswith("F\t") and line.split("\t")[2].strip() in ("Sync", "Query")
                )
            counts[label] = ends / n

        traced("first claim + record_outcome on a new connection", claim_and_record(store), 1)
        store.claim(done_key, tool="pay", args_json=ARGS_JSON, thread_id="bench")
        store.record_outcome(done_key, RESULT)
        traced("claim + record_outcome (steady state)", claim_and_record(store), calls)
        traced(
            "claim of a done key (replay)",
            lambda: store.claim(done_key, tool="pay", args_json=ARGS_JSON, thread_id="b"),
            calls,
        )
    return counts


def server_facts(dsn: str) -> dict[str, str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        facts = {}
        for setting in ("server_version", "synchronous_commit", "fsync", "wal_sync_method"):
            row = conn.execute(f"SHOW {setting}").fetchone()
            facts[setting] = str(row[0]) if row else "?"
    return facts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=os.environ.get("LANGGRAPH_RESILIENCE_TEST_DSN"))
    parser.add_argument("--calls", type=int, default=2000, help="timed calls per row")
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="300 calls per row")
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    calls = 300 if args.quick else args.calls
    admin = args.dsn or DEFAULT_DSN
    try:
        with scratch_database(admin, "lgr_bench_idem") as dsn:
            facts = server_facts(dsn)
            with psycopg.connect(dsn, **POSTGRES_CONNECTION_KWARGS) as conn:
                PostgresIdempotencyStore(conn).setup()
            trips = round_trips(dsn)
            rows = asyncio.run(latency_rows(dsn, calls, args.warmup))
    except psycopg.Error as exc:
        print(f"error: PostgreSQL at {redact(admin)}: {redact(str(exc)).strip()}", file=sys.stderr)
        return 1

    print(
        f"PostgreSQL {facts['server_version']} at {redact(admin)}; synchronous_commit="
        f"{facts['synchronous_commit']}, fsync={facts['fsync']}, "
        f"wal_sync_method={facts['wal_sync_method']}; {calls} calls per row\n"
    )
    width = max(len(name) for name in rows)
    print(f"{'per side-effecting call':<{width}}  {'median':>8}  {'p90':>8}  {'p99':>8}  (ms)")
    for name, row in rows.items():
        print(
            f"{name:<{width}}  {row['median_ms']:8.3f}  {row['p90_ms']:8.3f}  {row['p99_ms']:8.3f}"
        )
    print("\nround trips per call (libpq protocol trace)")
    for name, count in trips.items():
        print(f"  {name}: {count:g}")
    added = rows["claim + record_outcome (default)"]["median_ms"]
    verdict = "met" if added <= TARGET_MS else "NOT met"
    print(
        f"\ntarget <= {TARGET_MS:g} ms median added per call: {verdict} ({added:.3f} ms). "
        f"A durable 1-row INSERT costs {rows['floor: durable 1-row INSERT']['median_ms']:.3f} ms "
        "on this server: the intent must be durable before the effect, so one WAL flush per "
        "call is the floor."
    )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump({"server": facts, "calls": calls, "latency": rows, "round_trips": trips}, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
