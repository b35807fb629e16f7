"""The side-effecting path on PostgreSQL: a clean turn and async throughput, against plain.

Graph A is the user's graph (a real chat model, `ScriptedChatModel`, as the user's
agent node) + ``add_resilience`` whose two tools are side effects
(``ToolProfile(side_effect=True, status_check=...)``), with the idempotency ledger
(`PostgresIdempotencyStore`) and the shared breakers (`PostgresBreakerStore`) on a
PostgreSQL pool of their own; graph B is the same graph on LangGraph's ``ToolNode``;
graph C is A with the in-memory ledger and breakers (so C/B is what the rest of the
package costs, A/C what the Postgres pieces add).
Both run on ``PostgresSaver`` in a throw-away database ``lgr_bench_<random>``
(created and dropped by the script). A turn is the agent asking for two parallel
calls, the tools answering, the agent answering: 2 side-effecting calls per turn.

1. Clean turn, sync: A, B and C turns interleaved (ABC CBA) on fresh threads, after a
   warm-up; the ratio of medians with a 95% bootstrap interval (target <= 1.10x).
2. Round trips per side-effecting call, counted, not estimated: graph A with its
   stores on one connection traced by libpq (``PGconn.trace``); each frontend
   ``Sync`` (extended protocol) or ``Query`` (simple protocol) ends one round trip.
   Reported with the statements that made them (which of them the answer waits
   for is the code's: the claim does, a deferred outcome and a batch of breaker
   successes do not).
3. Async throughput: ``AsyncPostgresSaver`` on an ``AsyncConnectionPool``, the
   async stores on their own pool; N concurrent threads (N = 1, 8, 32, 100) each
   running turns; A, B and C rounds interleaved (ABC CBA); turns/s of A over B
   (target >= 0.9x at every N).
4. Client CPU (``--part cpu``): process CPU per async turn of A, B and C on one thread
   (``time.process_time``; a CPU-bound process's throughput goes as its inverse), and
   per ledger statement on the async store's pool (a claim, an outcome, and a bare
   ``SELECT 1`` for psycopg's own floor).
5. The floor (``--part floor``, not in the default run): what A's sync clean turn, and
   its async throughput at 1 and 32 threads, would cost without each of its pieces,
   interleaved with A, B and C. Ablations, not
   configurations (each drops a safety the package keeps): A without its outcome write
   (the intent stays pending), A without the wait for its step's save, and A with
   neither, which keeps only the durable claim before the effect.

Run it from the repository root::

    python benchmarks/postgres_path.py            # ~10 min on 2 cores
    python benchmarks/postgres_path.py --quick    # smoke run, ~1 min
    python benchmarks/postgres_path.py --dsn postgresql://postgres@127.0.0.1:5432/postgres
    python benchmarks/postgres_path.py --json path.json
    python benchmarks/postgres_path.py --part floor   # the ablations (~6 min)

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
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import tool
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from overhead import bootstrap_ratio, probe_postgres, quantile
from psycopg import pq
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from benchmarks.scratch import scratch_database
from langgraph_resilience import ResilienceState, ToolProfile, add_resilience
from langgraph_resilience._graph import call_effect
from langgraph_resilience.core.effects import IdempotencyRecord
from langgraph_resilience.core.redaction import redact
from langgraph_resilience.stores.breakers import InMemoryBreakerStore
from langgraph_resilience.stores.memory import InMemoryIdempotencyStore
from langgraph_resilience.stores.persistence import POSTGRES_CONNECTION_KWARGS
from langgraph_resilience.stores.postgres_breakers import (
    AsyncPostgresBreakerStore,
    PostgresBreakerStore,
)
from langgraph_resilience.stores.postgres_ledger import (
    AsyncPostgresIdempotencyStore,
    PostgresIdempotencyStore,
)
from langgraph_resilience.testing import ScriptedChatModel

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
TURN_TARGET = 1.10
THROUGHPUT_TARGET = 0.90
CONCURRENCY = (1, 8, 32, 100)
DEFERRED = False
"""``--deferred``: graph A's ledger defers its outcomes (``deferred_outcomes=True``)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sizes:
    warmup_pairs: int
    pairs: int
    traced_turns: int
    rounds: int
    """ABBA rounds of the throughput part, per concurrency."""
    turns_per_thread: int

    cpu_turns: int
    """Async turns per graph of the CPU part (in interleaved rounds of 10)."""
    cpu_statements: int


QUICK = Sizes(
    warmup_pairs=10,
    pairs=60,
    traced_turns=20,
    rounds=2,
    turns_per_thread=2,
    cpu_turns=20,
    cpu_statements=50,
)
FULL = Sizes(
    warmup_pairs=40,
    pairs=400,
    traced_turns=100,
    rounds=6,
    turns_per_thread=4,
    cpu_turns=200,
    cpu_statements=300,
)


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


PROFILES = {name: ToolProfile(side_effect=True, status_check=_never_asked) for name in ("t1", "t2")}


class ResilientState(MessagesState, ResilienceState):
    """Graph A's state."""


def _reply(messages: list[Any]) -> AIMessage:
    """Two parallel calls after the user, then an answer: a function of the messages,
    so one model serves any number of concurrent threads."""
    if isinstance(messages[-1], HumanMessage):
        calls = [
            {"name": "t1", "args": {"query": "weather in Paris"}, "id": uuid.uuid4().hex},
            {"name": "t2", "args": {"query": "time in Paris"}, "id": uuid.uuid4().hex},
        ]
        return AIMessage(content="", tool_calls=calls)
    return AIMessage(content="It is sunny and noon in Paris.")


def make_agent() -> Any:
    """The user's LLM node: a real chat model (`ScriptedChatModel`), one per graph."""
    model = ScriptedChatModel(responses=[_reply] * 200_000)

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    async def aagent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    return RunnableLambda(agent, afunc=aagent)


def build_resilient(saver: Any, ledger: Any, breakers: Any) -> Any:
    builder = StateGraph(ResilientState)
    builder.add_node("agent", make_agent())
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
    builder.add_node("agent", make_agent())
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
        ledger = PostgresIdempotencyStore(stores, deferred_outcomes=DEFERRED)
        breakers = PostgresBreakerStore(stores)
        ledger.setup()
        breakers.setup()
        graphs = _graphs(saver, ledger, breakers)
        for _ in range(sizes.warmup_pairs):
            for graph in graphs.values():
                turn(graph)
        wall: dict[str, list[float]] = {name: [] for name in graphs}
        for i in range(sizes.pairs):
            for name in "ABC" if i % 2 == 0 else "CBA":
                wall[name].append(turn(graphs[name]))
        _flush(ledger, breakers)
    ratio = _ratio(wall["A"], wall["B"])
    return {
        "turns_each": len(wall["A"]),
        "ms": {
            name: {"median": statistics.median(v) * 1e3, "p90": quantile(v, 0.9) * 1e3}
            for name, v in wall.items()
        },
        "ratio": ratio["ratio"],
        "ratio_ci95": ratio["ci95"],
        "in_memory_stores_ratio": _ratio(wall["C"], wall["B"]),
        "postgres_pieces_ratio": _ratio(wall["A"], wall["C"]),
        "extra_us_per_call": (statistics.median(wall["A"]) - statistics.median(wall["B"]))
        * 1e6
        / 2,
        "target": TURN_TARGET,
        "meets_target": ratio["ratio"] <= TURN_TARGET,
    }


GRAPHS = {
    "A": "add_resilience, side effects, Postgres ledger + Postgres breakers",
    "B": "plain ToolNode",
    "C": "add_resilience, side effects, in-memory ledger + in-memory breakers",
}


def _graphs(saver: Any, ledger: Any, breakers: Any) -> dict[str, Any]:
    """A (ours, Postgres pieces), B (plain), C (ours, in-memory pieces: what the rest of
    the package costs, so A/C is what the Postgres pieces add)."""
    return {
        "A": build_resilient(saver, ledger, breakers),
        "B": build_plain(saver),
        "C": build_resilient(saver, InMemoryIdempotencyStore(), InMemoryBreakerStore()),
    }


def _ratio(a: list[float], b: list[float]) -> dict[str, Any]:
    low, high = bootstrap_ratio(a, b)
    return {"ratio": statistics.median(a) / statistics.median(b), "ci95": [low, high]}


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


# ------------------------------------------------------------------ part 5: the floor


class _OutcomeFree(PostgresIdempotencyStore):
    """An ablation: the outcome of an effect is not written (its intent stays pending)."""

    def record_outcome(self, key: str, result: Any, *, status: Any = "done") -> Any:
        return IdempotencyRecord(key=key, status=status, result=result)


_NO_WAIT = frozenset({"A-wait", "A-outcome-wait"})
"""The graphs (by name) whose side effects do not wait for their step's save."""
_STEP_TO_SAVE = call_effect.step_to_save


def _step_to_save(config: Any, tool: str) -> Any:
    graph = config.get("metadata", {}).get("lgr_bench_graph")
    return None if graph in _NO_WAIT else _STEP_TO_SAVE(config, tool)


@contextlib.contextmanager
def _ablated() -> Iterator[None]:
    """While the floor runs: the graphs in `_NO_WAIT` (named by `_tagged`) skip the wait."""
    call_effect.step_to_save = _step_to_save
    try:
        yield
    finally:
        call_effect.step_to_save = _STEP_TO_SAVE


def _tagged(name: str) -> dict[str, Any]:
    """A fresh thread's config that names its graph (for the wait ablation)."""
    return {"configurable": {"thread_id": uuid.uuid4().hex}, "metadata": {"lgr_bench_graph": name}}


FLOOR = {
    "A": "A (add_resilience, Postgres ledger and breakers)",
    "A-outcome": "A without its outcome write",
    "A-wait": "A without the wait for its step's save",
    "A-outcome-wait": "A with the durable claim only",
    "C": "C (in-memory ledger and breakers)",
}


def _floor_graphs(saver: Any, ledger: Any, free: Any, breakers: Any) -> dict[str, Any]:
    """B, C, A and A's ablations (`FLOOR`) on one saver; `free` is A's ledger without
    outcome writes."""
    return {
        "B": build_plain(saver),
        "C": build_resilient(saver, InMemoryIdempotencyStore(), InMemoryBreakerStore()),
        "A": build_resilient(saver, ledger, breakers),
        "A-outcome": build_resilient(saver, free, breakers),
        "A-wait": build_resilient(saver, ledger, breakers),
        "A-outcome-wait": build_resilient(saver, free, breakers),
    }


def floor(dsn: str, sizes: Sizes) -> dict[str, Any]:
    """A's sync clean turn without each of its pieces, interleaved with A, B and C: the
    ratio of medians over B for each."""
    with _ablated(), _pool(dsn, 4) as saver_conn, _pool(dsn, 4) as stores:
        saver = PostgresSaver(saver_conn)
        saver.setup()
        ledger, free = PostgresIdempotencyStore(stores), _OutcomeFree(stores)
        breakers = PostgresBreakerStore(stores)
        ledger.setup()
        breakers.setup()
        graphs = _floor_graphs(saver, ledger, free, breakers)
        names = list(graphs)
        wall: dict[str, list[float]] = {name: [] for name in names}
        for i in range(sizes.warmup_pairs + sizes.pairs):
            order = names if i % 2 == 0 else names[::-1]
            for name in order:
                elapsed = _tagged_turn(graphs[name], name)
                if i >= sizes.warmup_pairs:
                    wall[name].append(elapsed)
        _flush(ledger, breakers)
    b = wall["B"]
    return {
        "turns_each": len(b),
        "B_ms": statistics.median(b) * 1e3,
        "ratios": {name: _ratio(wall[name], b) for name in FLOOR},
        "throughput": asyncio.run(_async_floor(dsn, sizes)),
    }


FLOOR_CONCURRENCY = (1, 32)


async def _async_floor(dsn: str, sizes: Sizes) -> list[dict[str, Any]]:
    """The same ablations as async throughput (A, B, C rounds and A's ablations
    interleaved) at one thread, where a turn's latency counts, and at 32, where the CPU
    does: turns/s of each over B's."""
    rows = []
    with _ablated():
        async with _apool(dsn, 20) as saver_pool, _apool(dsn, 10) as stores:
            saver = AsyncPostgresSaver(saver_pool)
            await saver.setup()
            ledger, free = AsyncPostgresIdempotencyStore(stores), _AsyncOutcomeFree(stores)
            breakers = AsyncPostgresBreakerStore(stores)
            await ledger.setup()
            await breakers.setup()
            graphs = _floor_graphs(saver, ledger, free, breakers)
            names = list(graphs)
            for threads in FLOOR_CONCURRENCY:
                for name in names:  # warm-up
                    await _tagged_round(graphs[name], name, threads, 1)
                rates: dict[str, list[float]] = {name: [] for name in names}
                for i in range(sizes.rounds):
                    for name in names if i % 2 == 0 else names[::-1]:
                        rate = await _tagged_round(
                            graphs[name], name, threads, sizes.turns_per_thread
                        )
                        rates[name].append(rate)
                b = statistics.median(rates["B"])
                rows.append(
                    {
                        "threads": threads,
                        "B_turns_s": b,
                        "ratios": {name: statistics.median(rates[name]) / b for name in FLOOR},
                    }
                )
            await _aflush(ledger, breakers)
    return rows


class _AsyncOutcomeFree(AsyncPostgresIdempotencyStore):
    """`_OutcomeFree` for the async graphs."""

    async def arecord_outcome(self, key: str, result: Any, *, status: Any = "done") -> Any:
        return IdempotencyRecord(key=key, status=status, result=result)


async def _tagged_round(graph: Any, name: str, threads: int, turns: int) -> float:
    """`_round` with each turn's config naming its graph (`_tagged`)."""

    async def worker() -> None:
        for _ in range(turns):
            _check(await graph.ainvoke({"messages": [HumanMessage(PROMPT)]}, _tagged(name)))

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(threads)))
    return threads * turns / (time.perf_counter() - start)


def _tagged_turn(graph: Any, name: str) -> float:
    """One clean turn whose config names its graph (`_tagged`)."""
    config = _tagged(name)
    start = time.perf_counter()
    result = graph.invoke({"messages": [HumanMessage(PROMPT)]}, config)
    elapsed = time.perf_counter() - start
    _check(result)
    return elapsed


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
        ledger = PostgresIdempotencyStore(conn, deferred_outcomes=DEFERRED)
        breakers = PostgresBreakerStore(conn)
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


@dataclasses.dataclass(frozen=True)
class AsyncRig:
    """Graphs A, B and C on ``AsyncPostgresSaver``, and A's async stores' pool."""

    graphs: dict[str, Any]
    ledger: Any
    breakers: Any
    stores: AsyncConnectionPool[Any]


@contextlib.asynccontextmanager
async def _async_rig(dsn: str, saver_size: int, stores_size: int) -> AsyncIterator[AsyncRig]:
    """The async saver and A's stores, each on a pool of its own, set up."""
    async with _apool(dsn, saver_size) as saver_pool, _apool(dsn, stores_size) as stores:
        saver = AsyncPostgresSaver(saver_pool)
        await saver.setup()
        ledger = AsyncPostgresIdempotencyStore(stores, deferred_outcomes=DEFERRED)
        breakers = AsyncPostgresBreakerStore(stores)
        await ledger.setup()
        await breakers.setup()
        yield AsyncRig(_graphs(saver, ledger, breakers), ledger, breakers, stores)


async def throughput(dsn: str, sizes: Sizes) -> list[dict[str, Any]]:
    rows = []
    async with _async_rig(dsn, 20, 10) as rig:
        graphs, ledger, breakers = rig.graphs, rig.ledger, rig.breakers
        for threads in CONCURRENCY:
            for graph in graphs.values():  # warm-up
                await _round(graph, threads, 1)
            rates: dict[str, list[float]] = {name: [] for name in graphs}
            for i in range(sizes.rounds):
                for name in "ABC" if i % 2 == 0 else "CBA":
                    rates[name].append(await _round(graphs[name], threads, sizes.turns_per_thread))
            await _aflush(ledger, breakers)
            a, b, c = (statistics.median(rates[name]) for name in "ABC")
            rows.append(
                {
                    "threads": threads,
                    "resilient_turns_s": a,
                    "plain_turns_s": b,
                    "in_memory_turns_s": c,
                    "ratio": a / b,
                    "in_memory_ratio": c / b,
                    "rounds": sizes.rounds,
                    "meets_target": a / b >= THROUGHPUT_TARGET,
                }
            )
            print(
                f"  {threads:>3} threads: {a:7.1f} vs {b:7.1f} turns/s = {a / b:.3f}x "
                f"(in-memory pieces: {c / b:.3f}x)",
                flush=True,
            )
    return rows


# ------------------------------------------------------------------ part 4: client CPU


async def client_cpu(dsn: str, sizes: Sizes) -> dict[str, Any]:
    """CPU of this process per async turn (A, B, C, one thread, rounds of 10 turns
    interleaved ABC CBA) and per ledger statement on the stores' pool."""
    async with _async_rig(dsn, 4, 4) as rig:
        graphs, ledger, breakers = rig.graphs, rig.ledger, rig.breakers
        for graph in graphs.values():
            for _ in range(5):
                await aturn(graph)
        per_turn: dict[str, list[float]] = {name: [] for name in graphs}
        for i in range(max(1, sizes.cpu_turns // 10)):
            for name in "ABC" if i % 2 == 0 else "CBA":
                start = time.process_time()
                for _ in range(10):
                    await aturn(graphs[name])
                per_turn[name].append((time.process_time() - start) / 10)
        await _aflush(ledger, breakers)
        statements = await _statement_cpu(ledger, rig.stores, sizes.cpu_statements)
    turn_ms = {name: statistics.median(v) * 1e3 for name, v in per_turn.items()}
    return {
        "turn_cpu_ms": turn_ms,
        "cpu_ratio": {"A/B": turn_ms["A"] / turn_ms["B"], "C/B": turn_ms["C"] / turn_ms["B"]},
        "statement_cpu_ms": statements,
    }


async def _statement_cpu(ledger: Any, pool: Any, n: int) -> dict[str, float]:
    """Client CPU (ms) of one claim, one outcome and one bare ``SELECT 1``."""
    keys = [uuid.uuid4().hex for _ in range(n)]

    async def claim(key: str) -> None:
        await ledger.aclaim(
            key, tool="t1", args_json='{"query":"x"}', thread_id="cpu", fingerprint=key
        )

    async def outcome(key: str) -> None:
        await ledger.arecord_outcome(key, "t1:x")

    async def select(_: str) -> None:
        async with pool.connection() as conn:
            await conn.execute("SELECT 1")

    out = {}
    for name, op in (("claim", claim), ("outcome", outcome), ("select_1", select)):
        start = time.process_time()
        for key in keys:
            await op(key)
        out[name] = (time.process_time() - start) / n * 1e3
    return out


# ------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (~1 min)")
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="an admin DSN (CREATE DATABASE)")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument(
        "--part",
        choices=("turn", "trips", "throughput", "cpu", "floor"),
        action="append",
        help="only these (floor: not in the default run)",
    )
    parser.add_argument(
        "--deferred", action="store_true", help="A's ledger defers outcomes (off by default)"
    )
    args = parser.parse_args(argv)
    global DEFERRED  # noqa: PLW0603 - a run-wide switch, read by the three parts
    DEFERRED = args.deferred
    sizes = QUICK if args.quick else FULL
    parts = set(args.part or ("turn", "trips", "throughput", "cpu"))
    reason = probe_postgres(args.dsn)
    if reason is not None:
        print(f"PostgreSQL at {redact(args.dsn)} is not reachable: {reason}", file=sys.stderr)
        return 2
    results: dict[str, Any] = {"quick": args.quick, "deferred_outcomes": args.deferred}
    with scratch_database(args.dsn) as dsn:
        if "turn" in parts:
            row = clean_turn(dsn, sizes)
            results["clean_turn"] = row
            low, high = row["ratio_ci95"]
            ms = row["ms"]
            print(
                f"clean turn, PostgresSaver: {ms['A']['median']:.2f} ms vs "
                f"{ms['B']['median']:.2f} ms = {row['ratio']:.3f}x ({low:.3f}-{high:.3f}), "
                f"target <= {TURN_TARGET}x: {'met' if row['meets_target'] else 'MISSED'}",
                flush=True,
            )
            for label, key in (
                ("in-memory pieces vs plain (C/B)", "in_memory_stores_ratio"),
                ("Postgres pieces vs in-memory (A/C)", "postgres_pieces_ratio"),
            ):
                r = row[key]
                print(f"  {label}: {r['ratio']:.3f}x ({r['ci95'][0]:.3f}-{r['ci95'][1]:.3f})")
        if "trips" in parts:
            trips = round_trips(dsn, sizes)
            results["round_trips"] = trips
            print(f"round trips per side-effecting call: {trips['per_call']:.2f}")
            for stmt, n in trips["by_statement"].items():
                print(f"  {n:5.2f}  {stmt}")
        if "throughput" in parts:
            print("async throughput (turns/s, ours vs plain):", flush=True)
            results["throughput"] = asyncio.run(throughput(dsn, sizes))
        if "cpu" in parts:
            cpu = asyncio.run(client_cpu(dsn, sizes))
            results["client_cpu"] = cpu
            ms, ratio = cpu["turn_cpu_ms"], cpu["cpu_ratio"]
            print(
                f"client CPU per async turn: A {ms['A']:.2f} ms, B {ms['B']:.2f} ms, "
                f"C {ms['C']:.2f} ms (A/B {ratio['A/B']:.3f}x, C/B {ratio['C/B']:.3f}x)"
            )
            per = ", ".join(f"{k} {v:.3f} ms" for k, v in cpu["statement_cpu_ms"].items())
            print(f"client CPU per ledger statement: {per}")
        if "floor" in parts:
            found = floor(dsn, sizes)
            results["floor"] = found
            print(f"the floor: sync clean turn over plain ({found['B_ms']:.2f} ms), ablations")
            for name, label in FLOOR.items():
                r = found["ratios"][name]
                low, high = r["ci95"]
                print(f"  {r['ratio']:.3f}x ({low:.3f}-{high:.3f})  {label}")
            for row in found["throughput"]:
                print(f"  async throughput over plain, {row['threads']} threads:")
                for name, label in FLOOR.items():
                    print(f"    {row['ratios'][name]:.3f}x  {label}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(results, out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
