"""The side-effecting path on PostgreSQL: a clean turn and async throughput, against plain.

Graph A is the user's graph + ``add_resilience`` whose two tools are side effects
(``ToolProfile(side_effect=True, status_check=...)``), with the idempotency ledger
(`PostgresIdempotencyStore`) and the shared breakers (`PostgresBreakerStore`) on a
PostgreSQL pool of their own; graph B is the same graph on LangGraph's ``ToolNode``.
Both run on ``PostgresSaver`` in a throw-away database ``lgr_bench_<random>``
(created and dropped by the script). A turn is the agent asking for two parallel
calls, the tools answering, the agent answering: 2 side-effecting calls per turn.

1. Clean turn, sync: A and B turns interleaved (ABBA) on fresh threads, after a
   warm-up; the ratio of medians with a 95% bootstrap interval (target <= 1.10x).
2. Round trips per side-effecting call, counted, not estimated: graph A with its
   stores on one connection traced by libpq (``PGconn.trace``); each frontend
   ``Sync`` (extended protocol) or ``Query`` (simple protocol) ends one round trip.
   Reported with the statements that made them, and which of them the answer
   waits for (those sent from the thread running the tool).
3. Async throughput: ``AsyncPostgresSaver`` on an ``AsyncConnectionPool``, the
   async stores on their own pool; N concurrent threads (N = 1, 8, 32, 100) each
   running turns; A and B rounds interleaved (ABBA); turns/s of A over B
   (target >= 0.9x at every N).

Run it from the repository root::

    python benchmarks/postgres_path.py            # ~10 min on 2 cores
    python benchmarks/postgres_path.py --quick    # smoke run, ~1 min
    python benchmarks/postgres_path.py --dsn postgresql://postgres@127.0.0.1:5432/postgres
    python benchmarks/postgres_path.py --json path.json

The DSN must allow ``CREATE DATABASE``. Exit status 0 whether or not the targets
are met (the tables say which); non-zero only on errors.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import re
import secrets
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from overhead import bootstrap_ratio, probe_postgres, quantile
from psycopg import conninfo, pq, sql
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from langgraph_resilience import ResilienceState, ToolProfile, add_resilience
from langgraph_resilience.core.redaction import redact
from langgraph_resilience.stores.breakers import (
    AsyncPostgresBreakerStore,
    PostgresBreakerStore,
)
from langgraph_resilience.stores.persistence import POSTGRES_CONNECTION_KWARGS
from langgraph_resilience.stores.postgres import (
    AsyncPostgresIdempotencyStore,
    PostgresIdempotencyStore,
)

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
TURN_TARGET = 1.10
THROUGHPUT_TARGET = 0.90
CONCURRENCY = (1, 8, 32, 100)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sizes:
    warmup_pairs: int
    pairs: int
    traced_turns: int
    rounds: int
    """ABBA rounds of the throughput part, per concurrency."""
    turns_per_thread: int


QUICK = Sizes(warmup_pairs=10, pairs=60, traced_turns=20, rounds=2, turns_per_thread=2)
FULL = Sizes(warmup_pairs=40, pairs=400, traced_turns=100, rounds=6, turns_per_thread=4)


# ------------------------------------------------------------------ the graphs


@tool
def t1(query: str) -> str:
    """First side effect (fast): echoes its query."""
    return f"t1:{query}"


@tool
def t2(query: str) -> str:
    """Second side effect (fast): echoes its query."""
    return f"t2:{query}"


TOOLS = [t1, t2]


def _never_asked(key: str) -> None:
    raise RuntimeError("a clean turn never reconciles")


PROFILES = {
    name: ToolProfile(side_effect=True, status_check=_never_asked) for name in ("t1", "t2")
}


class ResilientState(MessagesState, ResilienceState):
    """Graph A's state."""


def agent(state: MessagesState) -> dict[str, Any]:
    """A stateless scripted agent: two parallel calls after the user, then an answer
    (safe under any number of concurrent threads)."""
    if isinstance(state["messages"][-1], HumanMessage):
        calls = [
            {"name": "t1", "args": {"query": "weather in Paris"}, "id": uuid.uuid4().hex},
            {"name": "t2", "args": {"query": "time in Paris"}, "id": uuid.uuid4().hex},
        ]
        return {"messages": [AIMessage(content="", tool_calls=calls)]}
    return {"messages": [AIMessage(content="It is sunny and noon in Paris.")]}


def build_resilient(saver: Any, ledger: Any, breakers: Any) -> Any:
    builder = StateGraph(ResilientState)
    builder.add_node("agent", agent)
    builder.add_edge(START, "agent")
    add_resilience(
        builder,
        agent="agent",
        tools=TOOLS,
        profiles=PROFILES,
        idempotency=ledger,
        breaker_store=breakers,
    )
    return builder.compile(checkpointer=saver)


def build_plain(saver: Any) -> Any:
    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode(TOOLS))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=saver)


PROMPT = "What is the weather and the time in Paris?"


def _check(result: dict[str, Any]) -> None:
    messages = result["messages"]
    if len(messages) != 5 or any(
        isinstance(m, ToolMessage) and m.status != "success" for m in messages
    ):
        raise RuntimeError(f"the turn did not take the clean path: {messages!r}")


def turn(graph: Any) -> float:
    config = {"configurable": {"thread_id": uuid.uuid4().hex}}
    start = time.perf_counter()
    result = graph.invoke({"messages": [HumanMessage(PROMPT)]}, config)
    elapsed = time.perf_counter() - start
    _check(result)
    return elapsed


async def aturn(graph: Any) -> None:
    config = {"configurable": {"thread_id": uuid.uuid4().hex}}
    _check(await graph.ainvoke({"messages": [HumanMessage(PROMPT)]}, config))


# ------------------------------------------------------------------ the database


@contextlib.contextmanager
def scratch_database(dsn: str) -> Iterator[str]:
    """``lgr_bench_<random>``, dropped afterwards; its DSN."""
    name = f"lgr_bench_{secrets.token_hex(4)}"
    with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield conninfo.make_conninfo(dsn, dbname=name)
    finally:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=5) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


def _pool(dsn: str, size: int) -> ConnectionPool[Any]:
    pool: ConnectionPool[Any] = ConnectionPool(
        dsn, min_size=size, max_size=size, kwargs=dict(POSTGRES_CONNECTION_KWARGS), open=True
    )
    pool.wait()
    return pool


@contextlib.asynccontextmanager
async def _apool(dsn: str, size: int) -> AsyncIterator[AsyncConnectionPool[Any]]:
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        dsn, min_size=size, max_size=size, kwargs=dict(POSTGRES_CONNECTION_KWARGS), open=False
    )
    await pool.open(wait=True)
    try:
        yield pool
    finally:
        await pool.close()


# ------------------------------------------------------------------ part 1: a clean turn


def clean_turn(dsn: str, sizes: Sizes) -> dict[str, Any]:
    """Interleaved A/B clean turns on PostgresSaver: the ratio of medians."""
    with (
        _pool(dsn, 4) as saver_conn,
        _pool(dsn, 4) as stores,
    ):
        saver = PostgresSaver(saver_conn)
        saver.setup()
        ledger, breakers = PostgresIdempotencyStore(stores), PostgresBreakerStore(stores)
        ledger.setup()
        breakers.setup()
        graphs = {"A": build_resilient(saver, ledger, breakers), "B": build_plain(saver)}
        for _ in range(sizes.warmup_pairs):
            turn(graphs["A"])
            turn(graphs["B"])
        wall: dict[str, list[float]] = {"A": [], "B": []}
        for i in range(sizes.pairs):
            for name in "AB" if i % 2 == 0 else "BA":
                wall[name].append(turn(graphs[name]))
        _flush(ledger, breakers)
    a, b = wall["A"], wall["B"]
    low, high = bootstrap_ratio(a, b)
    ratio = statistics.median(a) / statistics.median(b)
    return {
        "turns_each": len(a),
        "resilient_ms": {"median": statistics.median(a) * 1e3, "p90": quantile(a, 0.9) * 1e3},
        "plain_ms": {"median": statistics.median(b) * 1e3, "p90": quantile(b, 0.9) * 1e3},
        "ratio": ratio,
        "ratio_ci95": [low, high],
        "extra_us_per_call": (statistics.median(a) - statistics.median(b)) * 1e6 / 2,
        "target": TURN_TARGET,
        "meets_target": ratio <= TURN_TARGET,
    }


def _flush(*stores: Any) -> None:
    """Write what a store holds back (deferred outcomes, aggregated successes)."""
    for store in stores:
        flush = getattr(store, "flush", None)
        if flush is not None:
            flush()


async def _aflush(*stores: Any) -> None:
    for store in stores:
        flush = getattr(store, "aflush", None)
        if flush is not None:
            await flush()


# ------------------------------------------------------------------ part 2: round trips


_QUOTED = re.compile(r'"((?:[^"]|"")*)"')


def _short(text: str) -> str:
    return " ".join(text.replace("\\x0a", " ").split())[:90]


MARK = "SELECT 'lgr-bench: steady state'"


def _ends(trace: str) -> Counter[str]:
    """Round trips by the statement that ended them, from a libpq trace, counted after
    `MARK`: a frontend ``Sync`` ends the extended protocol's (``Parse`` names a
    prepared statement, ``Bind`` uses one), a ``Query`` is one by itself."""
    prepared: dict[str, str] = {}
    ends: Counter[str] = Counter()
    current, counting = "", False
    for line in re.split(r"\n(?=[FB]\t\d+\t)", trace):  # a message may span lines
        parts = line.split("\t", 3)
        if len(parts) < 3 or parts[0] != "F":
            continue
        kind, rest = parts[2], parts[3] if len(parts) > 3 else ""
        if kind == "Parse":
            name, _, text = rest.strip().partition(" ")
            current = _short(text.strip().strip('"').rsplit('"', 1)[0])
            prepared[name.strip('"')] = current
        elif kind == "Bind":
            quoted = _QUOTED.findall(rest)
            if len(quoted) >= 2 and quoted[1]:
                current = prepared.get(quoted[1], quoted[1])
        elif kind == "Query":
            text = _short(rest.strip()[1:].rsplit('"', 1)[0])
            if text == _short(MARK):
                counting = True
            elif counting:
                ends[text] += 1
        elif kind == "Sync" and counting:
            ends[current] += 1
    return ends


def round_trips(dsn: str, sizes: Sizes) -> dict[str, Any]:
    """Round trips per side-effecting call made by the ledger and the breakers, from
    libpq's protocol trace of the one connection they share here; the ones made by the
    thread running the tool (what the answer waits for) counted apart."""
    with (
        _pool(dsn, 4) as saver_conn,
        psycopg.connect(dsn, **POSTGRES_CONNECTION_KWARGS) as conn,
    ):
        saver = PostgresSaver(saver_conn)
        saver.setup()
        ledger, breakers = PostgresIdempotencyStore(conn), PostgresBreakerStore(conn)
        ledger.setup()
        breakers.setup()
        graph = build_resilient(saver, ledger, breakers)
        with tempfile.TemporaryFile("w+") as trace:
            conn.pgconn.trace(trace.fileno())
            conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
            for _ in range(3):
                turn(graph)  # statements prepared, tables warm
            _flush(ledger, breakers)
            psycopg.ClientCursor(conn).execute(MARK)
            for _ in range(sizes.traced_turns):
                turn(graph)
            _flush(ledger, breakers)
            conn.pgconn.untrace()
            trace.seek(0)
            ends = _ends(trace.read())
    calls = 2 * sizes.traced_turns
    return {
        "calls": calls,
        "per_call": sum(ends.values()) / calls,
        "by_statement": {stmt: n / calls for stmt, n in ends.most_common()},
    }


# ------------------------------------------------------------------ part 3: throughput


async def _round(graph: Any, threads: int, turns: int) -> float:
    """Turns per second of `threads` concurrent threads, each running `turns` turns."""

    async def worker() -> None:
        for _ in range(turns):
            await aturn(graph)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(threads)))
    return threads * turns / (time.perf_counter() - start)


async def throughput(dsn: str, sizes: Sizes) -> list[dict[str, Any]]:
    rows = []
    async with _apool(dsn, 20) as saver_pool, _apool(dsn, 10) as stores:
        saver = AsyncPostgresSaver(saver_pool)
        await saver.setup()
        ledger, breakers = AsyncPostgresIdempotencyStore(stores), AsyncPostgresBreakerStore(stores)
        await ledger.setup()
        await breakers.setup()
        graphs = {"A": build_resilient(saver, ledger, breakers), "B": build_plain(saver)}
        for threads in CONCURRENCY:
            for name in "AB":  # warm-up
                await _round(graphs[name], threads, 1)
            rates: dict[str, list[float]] = {"A": [], "B": []}
            for i in range(sizes.rounds):
                for name in "AB" if i % 2 == 0 else "BA":
                    rates[name].append(await _round(graphs[name], threads, sizes.turns_per_thread))
            await _aflush(ledger, breakers)
            a, b = statistics.median(rates["A"]), statistics.median(rates["B"])
            rows.append(
                {
                    "threads": threads,
                    "resilient_turns_s": a,
                    "plain_turns_s": b,
                    "ratio": a / b,
                    "rounds": sizes.rounds,
                    "meets_target": a / b >= THROUGHPUT_TARGET,
                }
            )
            print(f"  {threads:>3} threads: {a:7.1f} vs {b:7.1f} turns/s = {a / b:.3f}x", flush=True)
    return rows


# ------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (~1 min)")
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="an admin DSN (CREATE DATABASE)")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument(
        "--part", choices=("turn", "trips", "throughput"), action="append", help="only these"
    )
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    parts = set(args.part or ("turn", "trips", "throughput"))
    reason = probe_postgres(args.dsn)
    if reason is not None:
        print(f"PostgreSQL at {redact(args.dsn)} is not reachable: {reason}", file=sys.stderr)
        return 2
    results: dict[str, Any] = {"quick": args.quick, "threads_alive": threading.active_count()}
    with scratch_database(args.dsn) as dsn:
        if "turn" in parts:
            row = clean_turn(dsn, sizes)
            results["clean_turn"] = row
            low, high = row["ratio_ci95"]
            print(
                f"clean turn, PostgresSaver: {row['resilient_ms']['median']:.2f} ms vs "
                f"{row['plain_ms']['median']:.2f} ms = {row['ratio']:.3f}x ({low:.3f}-{high:.3f}), "
                f"target <= {TURN_TARGET}x: {'met' if row['meets_target'] else 'MISSED'}",
                flush=True,
            )
        if "trips" in parts:
            trips = round_trips(dsn, sizes)
            results["round_trips"] = trips
            print(f"round trips per side-effecting call: {trips['per_call']:.2f}")
            for stmt, n in trips["by_statement"].items():
                print(f"  {n:5.2f}  {stmt}")
        if "throughput" in parts:
            print("async throughput (turns/s, ours vs plain):", flush=True)
            results["throughput"] = asyncio.run(throughput(dsn, sizes))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(results, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
