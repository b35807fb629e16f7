"""What a thread lease costs per run, straight to PostgreSQL and through a pooler.

A run under `thread_lock` (or `resume(..., lock=p)`) pays, on PostgreSQL:

- taking and giving back the lease: one statement each (``INSERT ... ON CONFLICT DO
  UPDATE ... RETURNING``, ``DELETE``), on the `Persistence`'s pool;
- a renewal every third of the TTL while it runs (one ``UPDATE``: at the default 30 s,
  one statement per 10 s per running thread, none for a run shorter than that);
- one fence check (a ``SELECT`` on the lease row) before each checkpoint write of the
  savers `open_postgres` makes and before each side effect, as the session lock's
  ``SELECT 1`` did before;
- inside every ledger write, the fence function (``lgr_fenced`` / ``lgr_lease_holds``:
  a PL/pgSQL call and a share lock on the lease row): server time, no round trip.

This script measures each on a throw-away database (created and dropped here), after a
warm-up, with ``time.perf_counter`` around each call; per operation: median and p90 in
milliseconds. For reading them: ``SELECT 1`` (one round trip) on the same pool, and the
session advisory lock the lease replaced (``pg_try_advisory_lock`` + unlock, two round
trips, straight only: through a pooler it does not hold). With ``--pooler`` the same
rows run through a PgBouncer (or any pooler) on that port of 127.0.0.1, in front of
the same server, reaching the scratch database by name.

Run it from the repository root::

    python benchmarks/lease_cost.py
    python benchmarks/lease_cost.py --pooler 6432 --n 1000
    python benchmarks/lease_cost.py --json lease.json

The DSN must allow ``CREATE DATABASE``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import MessagesState, StateGraph
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from benchmarks.scratch import scratch_database
from langgraph_resilience import (
    ResilienceState,
    ToolProfile,
    add_resilience,
    aopen_postgres,
    open_postgres,
)
from langgraph_resilience.stores import athread_lock, thread_lock
from langgraph_resilience.testing import ScriptedChatModel, text, tool_calls

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"


def via_port(dsn: str, port: int) -> str:
    parts = conninfo_to_dict(dsn)
    parts.update(host="127.0.0.1", port=str(port))
    return make_conninfo("", **parts)


def summarize(samples: list[float]) -> dict[str, float]:
    ms = sorted(s * 1000 for s in samples)
    return {
        "median_ms": round(statistics.median(ms), 3),
        "p90_ms": round(statistics.quantiles(ms, n=10)[8], 3),
        "n": len(ms),
    }


def timed(n: int, op: Callable[[int], Any], warmup: int = 20) -> dict[str, float]:
    for i in range(warmup):
        op(-1 - i)
    samples = []
    for i in range(n):
        started = time.perf_counter()
        op(i)
        samples.append(time.perf_counter() - started)
    return summarize(samples)


async def atimed(n: int, op: Callable[[int], Any], warmup: int = 20) -> dict[str, float]:
    for i in range(warmup):
        await op(-1 - i)
    samples = []
    for i in range(n):
        started = time.perf_counter()
        await op(i)
        samples.append(time.perf_counter() - started)
    return summarize(samples)


class State(MessagesState, ResilienceState):
    """The user's state: messages plus the resilience ledger."""


@tool
def pay(amount: int) -> str:
    """Charge the customer's card (a side effect; here, nothing)."""
    return f"paid {amount}"


def _reply(messages: list[Any]) -> AIMessage:
    if any(isinstance(m, ToolMessage) for m in messages):
        return text("paid")
    return tool_calls(("pay", {"amount": 5}))


def side_effect_turn(p: Any) -> Any:
    """A user's graph with one side-effecting tool, on `p`'s saver and ledger."""
    model = ScriptedChatModel(responses=[_reply] * 100_000)
    builder = StateGraph(State)
    builder.add_node("agent", lambda s: {"messages": [model.invoke(s["messages"])]})
    add_resilience(
        builder, agent="agent", tools=[pay], profiles={"pay": ToolProfile(side_effect=True)}
    )
    return builder.compile(checkpointer=p.checkpointer)


def turn_rows(p: Any, n: int) -> dict[str, dict[str, float]]:
    """A clean turn with one side effect (agent, tools, agent: ``durability="sync"``),
    without a lock and under `thread_lock`, interleaved."""
    app, tag = side_effect_turn(p), uuid.uuid4().hex[:6]
    inputs = {"messages": [("user", "pay 5")]}

    def run(thread: str) -> None:
        app.invoke(inputs, {"configurable": {"thread_id": thread}}, durability="sync")

    def locked(thread: str) -> None:
        with thread_lock(p, thread):
            run(thread)

    plain: list[float] = []
    leased: list[float] = []
    for i in range(-10, n):
        for samples, op in ((plain, run), (leased, locked)):
            started = time.perf_counter()
            op(f"{tag}-{len(samples)}-{op.__name__}-{i}")
            if i >= 0:
                samples.append(time.perf_counter() - started)
    return {
        "turn with a side effect, no lock": summarize(plain),
        "turn with a side effect, under thread_lock": summarize(leased),
    }


def sync_rows(dsn: str, n: int) -> dict[str, dict[str, float]]:
    rows: dict[str, dict[str, float]] = {}
    with open_postgres(dsn) as p:
        pool: Any = p.pool
        tag = uuid.uuid4().hex[:6]

        def select_one(_: int) -> None:
            with pool.connection() as conn:
                conn.execute("SELECT 1").fetchall()

        def lock(i: int) -> None:
            with thread_lock(p, f"{tag}-lock-{i}"):
                pass

        def lock_dsn(i: int) -> None:
            with thread_lock(dsn, f"{tag}-dsn-{i}"):
                pass

        rows["SELECT 1 (one round trip)"] = timed(n, select_one)
        rows["lease: acquire + release (pool)"] = timed(n, lock)
        rows["lease: acquire + release (DSN)"] = timed(n, lock_dsn)
        with thread_lock(p, f"{tag}-held") as lease:
            assert lease is not None
            rows["lease: fence check"] = timed(n, lambda _: lease.check())
            rows["lease: renewal"] = timed(n, lambda _: lease.renew())

            def fenced_claim(i: int) -> None:
                p.idempotency.claim(
                    f"{tag}-f-{i}", tool="pay", args_json="{}", thread_id=f"{tag}-held"
                )

            rows["ledger claim, fenced (holding the lease)"] = timed(n, fenced_claim)

        def claim(i: int) -> None:
            p.idempotency.claim(f"{tag}-u-{i}", tool="pay", args_json="{}", thread_id="free")

        rows["ledger claim, no lease held"] = timed(n, claim)
        rows.update(turn_rows(p, max(20, n // 4)))
    return rows


async def async_rows(dsn: str, n: int) -> dict[str, dict[str, float]]:
    rows: dict[str, dict[str, float]] = {}
    async with aopen_postgres(dsn) as p:
        tag = uuid.uuid4().hex[:6]

        async def lock(i: int) -> None:
            async with athread_lock(p, f"{tag}-alock-{i}"):
                pass

        rows["lease: acquire + release (async pool)"] = await atimed(n, lock)
        async with athread_lock(p, f"{tag}-aheld") as lease:
            assert lease is not None
            rows["lease: fence check (async)"] = await atimed(n, lambda _: lease.acheck())
    return rows


def advisory_rows(dsn: str, n: int) -> dict[str, dict[str, float]]:
    """The session lock the lease replaced, on one connection (straight only)."""
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=None) as conn:

        def lock(i: int) -> None:
            key = f"bench:{i}"
            conn.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (key,))
            conn.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (key,))

        return {"session advisory lock + unlock (before)": timed(n, lock)}


def measure(dsn: str, n: int, route: str) -> dict[str, dict[str, float]]:
    rows = sync_rows(dsn, n)
    rows.update(asyncio.run(async_rows(dsn, n)))
    if route == "straight":
        rows.update(advisory_rows(dsn, n))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=DEFAULT_DSN)
    parser.add_argument("--pooler", type=int, help="a pooler's port on 127.0.0.1")
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--json")
    args = parser.parse_args()
    report: dict[str, Any] = {}
    with scratch_database(args.dsn, "lgr_bench_lease") as scratch:
        with open_postgres(scratch):
            pass  # the tables, once
        routes = {"straight": scratch}
        if args.pooler:
            routes["pooler"] = via_port(scratch, args.pooler)
        for route, dsn in routes.items():
            report[route] = measure(dsn, args.n, route)
    for route, rows in report.items():
        print(f"{route}:")
        for name, row in rows.items():
            print(f"  {name:<44} {row['median_ms']:>8.3f} ms  p90 {row['p90_ms']:>8.3f} ms")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=2)


if __name__ == "__main__":
    main()
