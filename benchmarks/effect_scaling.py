"""Added time per side-effecting call at 1, 4 and 16 calls per step, against its floor.

Issue 36's target: the time the package adds per side-effecting call is at most 4x
the floor (one ``INSERT ... ON CONFLICT DO NOTHING`` that commits, timed in the same
run) at 1, 4 and 16 calls per step, and below what LangGraph's own answer (``@task``)
adds.

A turn: the user's message, the agent (a real chat model, `ScriptedChatModel`) asks
for N parallel calls of two fast side-effecting tools (fresh ids, distinct arguments),
the tools answer, the agent answers; a fresh thread per turn.

- **B** (plain): the same ``StateGraph`` with LangGraph's ``ToolNode`` +
  ``tools_condition``.
- **A** (ours): ``add_resilience`` with both tools profiled
  ``ToolProfile(side_effect=True, status_check=...)``, the idempotency ledger
  (`PostgresIdempotencyStore`) and the shared breakers (`PostgresBreakerStore`), or
  their async twins, on a pool of their own: exactly-once.
- **T** (the ``@task`` anchor): plain ``ToolNode``, each tool's body calls a
  ``langgraph.func.task`` that does the effect and waits for its ``.result()``, or
  under ``ainvoke`` awaits it (``ATASK_TOOLS`` says why): LangGraph saves each task's
  result with the step's writes, so a resumed step does not run it again;
  at-least-once (an effect whose result was not saved yet runs again).
- **The floor**: one ``INSERT INTO lgr_bench_floor (key) VALUES (%s) ON CONFLICT DO
  NOTHING`` on a dedicated connection with the stores' settings (autocommit: the
  statement commits by itself, one round trip and one WAL flush, as the ledger's claim
  does), a fresh key each time.

Two parts, chosen by ``--api sync|async|both`` (``both``, the default: sync, then
async), each in a throw-away database ``lgr_bench_<random>`` of its own (created and
dropped by the script), with its own table and its own section of the JSON:

- **sync**: ``invoke`` on ``PostgresSaver`` (a ``ConnectionPool`` with
  ``POSTGRES_CONNECTION_KWARGS``); A's stores `PostgresIdempotencyStore` and
  `PostgresBreakerStore`; the floor on a ``psycopg.Connection``.
- **async**: ``ainvoke`` on ``AsyncPostgresSaver`` (an ``AsyncConnectionPool`` of the
  same size and settings); A's stores `AsyncPostgresIdempotencyStore` and
  `AsyncPostgresBreakerStore`; the agent awaits the model's ``ainvoke`` (the scripted
  model has no native async path: LangChain runs it on the loop's executor, in every
  graph alike); the floor awaited on a ``psycopg.AsyncConnection``. The tools stay
  sync (LangChain runs a sync tool on the loop's executor), but T's, which await their
  task.

In each part, each round runs, for every N, the floor and the three graphs, mirrored
every other round (F A B T for 1, 4, 16, then T B A F for 16, 4, 1), after warm-up
rounds. Per part and N: the median turn of B, A and T; the added time per call,
(median A - median B) / N and (median T - median B) / N, with 95% bootstrap intervals
over the rounds (the floor, A, B and T of a round are resampled together); A's added
time per call over the floor's median (target <= 4x) and whether it is below T's.

Run it from the repository root::

    python -m benchmarks.effect_scaling              # 500 rounds each, ~5 min on 2 cores
    python -m benchmarks.effect_scaling --api sync   # the sync part only, ~2.5 min
    python -m benchmarks.effect_scaling --api async  # the async part only, ~2.5 min
    python -m benchmarks.effect_scaling --quick      # smoke run, 20 rounds each, ~15 s
    python -m benchmarks.effect_scaling --dsn postgresql://postgres@127.0.0.1:5432/postgres
    python -m benchmarks.effect_scaling --json effect_scaling.json

The DSN must allow ``CREATE DATABASE``. Exit status 0 whether or not the targets are
met (the table says which), 2 if PostgreSQL is unreachable, 130 on Ctrl-C and 143 on
SIGTERM (the database is dropped and every pool closed however the run ends).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib.metadata
import json
import os
import random
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import psycopg
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import tool
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.func import task
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from benchmarks.overhead import probe_postgres, quantile
from benchmarks.scratch import scratch_database
from langgraph_resilience import ResilienceState, ToolProfile, add_resilience
from langgraph_resilience.core.redaction import redact
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
CALLS = (1, 4, 16)
FLOOR_TARGET = 4.0
"""A's added time per call may be at most this many floors."""
POOL_SIZE = 10
"""Connections of the saver's pool and of the stores' pool, sync or async:
``open_postgres``'s default ``max_size``. Under ``invoke`` that is more than the threads
ToolNode runs a step's calls on (``min(32, cpus + 4)``), so 16 parallel calls wait for
a thread, never for a connection. Under ``ainvoke`` the calls' statements are not
bounded by threads, and a wide step's may wait for a connection."""
RESAMPLES = 1000
STOPPED = 130
"""The exit status of a run stopped by Ctrl-C (SIGTERM's is 143)."""
GRAPHS = {
    "B": "plain ToolNode + tools_condition",
    "A": "add_resilience, side effects, Postgres ledger + Postgres breakers",
    "T": "plain ToolNode, each tool's effect in a langgraph.func.task",
}
APIS = {
    "sync": "invoke; PostgresSaver; A: PostgresIdempotencyStore + PostgresBreakerStore",
    "async": "ainvoke; AsyncPostgresSaver; "
    "A: AsyncPostgresIdempotencyStore + AsyncPostgresBreakerStore",
}
"""What each ``--api`` part runs: the same graphs, sizes and statistics (T's tools await
their task under ``ainvoke``: ``ATASK_TOOLS``)."""
FLOOR_TABLE = "lgr_bench_floor"
FLOOR_INSERT = f"INSERT INTO {FLOOR_TABLE} (key) VALUES (%s) ON CONFLICT DO NOTHING"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Sizes:
    warmup: int
    """Rounds run first and not counted (statements, tables and caches warm)."""
    rounds: int
    """Counted rounds: each times the floor and one turn of A, B and T, at every N."""


QUICK = Sizes(warmup=3, rounds=20)
FULL = Sizes(warmup=30, rounds=500)


# ------------------------------------------------------------------ the graphs


def _echo(name: str, query: str) -> str:
    return f"{name}:{query}"


@tool
def t1(query: str) -> str:
    """First side effect (fast): echoes its query."""
    return _echo("t1", query)


@tool
def t2(query: str) -> str:
    """Second side effect (fast): echoes its query."""
    return _echo("t2", query)


@task
def t1_effect(query: str) -> str:
    """t1's effect as a LangGraph task: its result is saved with the step's writes."""
    return _echo("t1", query)


@task
def t2_effect(query: str) -> str:
    """t2's effect as a LangGraph task."""
    return _echo("t2", query)


@tool("t1")
def t1_task(query: str) -> str:
    """First side effect (fast): echoes its query."""
    return t1_effect(query).result()


@tool("t2")
def t2_task(query: str) -> str:
    """Second side effect (fast): echoes its query."""
    return t2_effect(query).result()


@tool("t1")
async def t1_atask(query: str) -> str:
    """First side effect (fast): echoes its query."""
    return await t1_effect(query)


@tool("t2")
async def t2_atask(query: str) -> str:
    """Second side effect (fast): echoes its query."""
    return await t2_effect(query)


TOOLS = [t1, t2]
TASK_TOOLS = [t1_task, t2_task]
ATASK_TOOLS = [t1_atask, t2_atask]
"""T's tools under ``ainvoke``: they await their task. A sync tool waiting on
``.result()`` there holds one of the loop's default executor threads (``min(32, cpus +
4)``: LangChain runs a sync tool there, LangGraph a sync task) while its task needs
another: from that many calls per step on (6 on 2 cores), every thread waits for a
task that cannot start, and the step never ends."""
NAMES = ("t1", "t2")


def _never_asked(key: str) -> None:
    raise RuntimeError("a clean turn never reconciles")


PROFILES = {name: ToolProfile(side_effect=True, status_check=_never_asked) for name in NAMES}


class ResilientState(MessagesState, ResilienceState):
    """Graph A's state."""


def _reply(calls: int) -> Callable[[list[Any]], AIMessage]:
    """`calls` parallel calls after the user (fresh ids, distinct arguments), then an
    answer: a function of the messages, as in postgres_path.py."""

    def reply(messages: list[Any]) -> AIMessage:
        if isinstance(messages[-1], HumanMessage):
            asked = [
                {
                    "name": NAMES[i % 2],
                    "args": {"query": f"item {i}"},
                    "id": uuid.uuid4().hex,
                }
                for i in range(calls)
            ]
            return AIMessage(content="", tool_calls=asked)
        return AIMessage(content=f"Done: {calls} effects.")

    return reply


def make_agent(calls: int, turns: int) -> Any:
    """The user's LLM node: a real chat model scripted for `turns` turns of `calls` calls,
    invoked under ``invoke`` and awaited (``model.ainvoke``) under ``ainvoke``."""
    model = ScriptedChatModel(responses=[_reply(calls)] * (2 * turns))

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    async def aagent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    return RunnableLambda(agent, afunc=aagent)


def build_plain(saver: Any, calls: int, turns: int, tools: list[Any] = TOOLS) -> Any:
    builder = StateGraph(MessagesState)
    builder.add_node("agent", make_agent(calls, turns))
    builder.add_node("tools", ToolNode(tools))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=saver)


def build_task(saver: Any, calls: int, turns: int, *, is_async: bool = False) -> Any:
    """B's graph whose tools do their effect in a ``@task`` (the T anchor), waiting for
    it (``TASK_TOOLS``) or, for ``ainvoke`` (`is_async`), awaiting it (``ATASK_TOOLS``)."""
    return build_plain(saver, calls, turns, ATASK_TOOLS if is_async else TASK_TOOLS)


def build_resilient(saver: Any, calls: int, turns: int, ledger: Any, breakers: Any) -> Any:
    builder = StateGraph(ResilientState)
    builder.add_node("agent", make_agent(calls, turns))
    add_resilience(
        builder,
        agent="agent",
        tools=TOOLS,
        profiles=PROFILES,
        idempotency=ledger,
        breaker_store=breakers,
    )
    return builder.compile(checkpointer=saver)


def build_graphs(
    saver: Any,
    calls: tuple[int, ...],
    turns: int,
    ledger: Any,
    breakers: Any,
    *,
    is_async: bool = False,
) -> dict[int, dict[str, Any]]:
    """A, B and T for every N, each with its own scripted model (T's tools for
    ``ainvoke`` if `is_async`)."""
    return {
        n: {
            "A": build_resilient(saver, n, turns, ledger, breakers),
            "B": build_plain(saver, n, turns),
            "T": build_task(saver, n, turns, is_async=is_async),
        }
        for n in calls
    }


PROMPT = "Record these items."


def check(result: dict[str, Any], calls: int) -> None:
    """The turn took the clean path: every call answered once, with its own echo."""
    messages = result["messages"]
    answers = sorted(m.content for m in messages if isinstance(m, ToolMessage))
    expected = sorted(_echo(NAMES[i % 2], f"item {i}") for i in range(calls))
    statuses = {m.status for m in messages if isinstance(m, ToolMessage)}
    if len(messages) != calls + 3 or answers != expected or statuses != {"success"}:
        raise RuntimeError(f"the turn did not take the clean path: {messages!r}")


def turn(graph: Any, calls: int) -> float:
    """Seconds of one turn on a fresh thread (checked after the clock stops)."""
    config = {"configurable": {"thread_id": uuid.uuid4().hex}}
    start = time.perf_counter()
    result = graph.invoke({"messages": [HumanMessage(PROMPT)]}, config)
    elapsed = time.perf_counter() - start
    check(result, calls)
    return elapsed


async def aturn(graph: Any, calls: int) -> float:
    """`turn` through ``ainvoke``."""
    config = {"configurable": {"thread_id": uuid.uuid4().hex}}
    start = time.perf_counter()
    result = await graph.ainvoke({"messages": [HumanMessage(PROMPT)]}, config)
    elapsed = time.perf_counter() - start
    check(result, calls)
    return elapsed


def floor_insert(conn: psycopg.Connection[Any]) -> float:
    """Seconds of one committed ``INSERT ... ON CONFLICT DO NOTHING`` of a fresh key."""
    key = uuid.uuid4().hex
    start = time.perf_counter()
    conn.execute(FLOOR_INSERT, (key,))
    return time.perf_counter() - start


async def afloor_insert(conn: psycopg.AsyncConnection[Any]) -> float:
    """`floor_insert` awaited on an async connection."""
    key = uuid.uuid4().hex
    start = time.perf_counter()
    await conn.execute(FLOOR_INSERT, (key,))
    return time.perf_counter() - start


# ------------------------------------------------------------------ the run


@contextlib.contextmanager
def _pool(dsn: str, size: int) -> Iterator[ConnectionPool[Any]]:
    pool: ConnectionPool[Any] = ConnectionPool(
        dsn, min_size=size, max_size=size, kwargs=dict(POSTGRES_CONNECTION_KWARGS), open=False
    )
    try:
        pool.open(wait=True)
        yield pool
    finally:
        pool.close()


@contextlib.asynccontextmanager
async def _apool(dsn: str, size: int) -> AsyncIterator[AsyncConnectionPool[Any]]:
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        dsn, min_size=size, max_size=size, kwargs=dict(POSTGRES_CONNECTION_KWARGS), open=False
    )
    try:
        await pool.open(wait=True)
        yield pool
    finally:
        await pool.close()


Samples = dict[int, dict[str, list[float]]]
"""Seconds by N, then by "F" (the floor), "A", "B" and "T"; index i is round i."""


def schedule(i: int, calls: tuple[int, ...]) -> Iterator[tuple[int, str]]:
    """Round `i`'s order: F A B T at each N ascending, mirrored (T B A F at each N
    descending) every other round."""
    order = "FABT" if i % 2 == 0 else "TBAF"
    for n in calls if i % 2 == 0 else calls[::-1]:
        for name in order:
            yield n, name


def _empty(calls: tuple[int, ...]) -> Samples:
    return {n: {name: [] for name in "FABT"} for n in calls}


def measure(dsn: str, sizes: Sizes, calls: tuple[int, ...] = CALLS) -> Samples:
    """The interleaved rounds on `dsn` (a scratch database): every pool, connection and
    store flushed and closed on the way out, however it ends."""
    turns = sizes.warmup + sizes.rounds
    with (
        _pool(dsn, POOL_SIZE) as saver_pool,
        _pool(dsn, POOL_SIZE) as stores,
        psycopg.connect(dsn, **POSTGRES_CONNECTION_KWARGS) as floor_conn,
    ):
        floor_conn.execute(f"CREATE TABLE IF NOT EXISTS {FLOOR_TABLE} (key text PRIMARY KEY)")
        saver = PostgresSaver(saver_pool)
        saver.setup()
        ledger = PostgresIdempotencyStore(stores)
        breakers = PostgresBreakerStore(stores)
        ledger.setup()
        breakers.setup()
        graphs = build_graphs(saver, calls, turns, ledger, breakers)

        def one_round(i: int, into: Samples) -> None:
            for n, name in schedule(i, calls):
                if name == "F":
                    into[n][name].append(floor_insert(floor_conn))
                else:
                    into[n][name].append(turn(graphs[n][name], n))

        try:
            warm = _empty(calls)
            for i in range(sizes.warmup):
                one_round(i, warm)
            samples = _empty(calls)
            for i in range(sizes.rounds):
                one_round(i, samples)
        finally:
            ledger.flush()  # the ledger's deferred outcomes (none by default)
            breakers.flush()  # the batched breaker successes, before the pool closes
    return samples


async def ameasure(dsn: str, sizes: Sizes, calls: tuple[int, ...] = CALLS) -> Samples:
    """`measure` through ``ainvoke``: the async saver, stores and floor connection, on
    async pools of the same size and settings; every one flushed and closed on the way
    out, however it ends (Ctrl-C cancels this coroutine, SIGTERM raises through it)."""
    turns = sizes.warmup + sizes.rounds
    async with (
        _apool(dsn, POOL_SIZE) as saver_pool,
        _apool(dsn, POOL_SIZE) as stores,
        await psycopg.AsyncConnection.connect(dsn, **POSTGRES_CONNECTION_KWARGS) as floor_conn,
    ):
        await floor_conn.execute(f"CREATE TABLE IF NOT EXISTS {FLOOR_TABLE} (key text PRIMARY KEY)")
        saver = AsyncPostgresSaver(saver_pool)
        await saver.setup()
        ledger = AsyncPostgresIdempotencyStore(stores)
        breakers = AsyncPostgresBreakerStore(stores)
        await ledger.setup()
        await breakers.setup()
        graphs = build_graphs(saver, calls, turns, ledger, breakers, is_async=True)

        async def one_round(i: int, into: Samples) -> None:
            for n, name in schedule(i, calls):
                if name == "F":
                    into[n][name].append(await afloor_insert(floor_conn))
                else:
                    into[n][name].append(await aturn(graphs[n][name], n))

        try:
            warm = _empty(calls)
            for i in range(sizes.warmup):
                await one_round(i, warm)
            samples = _empty(calls)
            for i in range(sizes.rounds):
                await one_round(i, samples)
        finally:
            await ledger.aflush()  # the ledger's outcome tasks (none by default)
            await breakers.aflush()  # the batched breaker successes, before the pool closes
    return samples


# ------------------------------------------------------------------ the statistics


def estimates(samples: Samples, picks: list[int]) -> dict[int, dict[str, float]]:
    """Per N, in ms: the medians, each graph's added time per call over B, A's over the
    floor's median (one floor over every N's samples) and T's minus A's per call."""
    floor = statistics.median([row["F"][i] for row in samples.values() for i in picks])
    out = {}
    for n, row in samples.items():
        med = {name: statistics.median([row[name][i] for i in picks]) for name in "ABT"}
        added_a = (med["A"] - med["B"]) / n
        added_t = (med["T"] - med["B"]) / n
        out[n] = {
            "floor_ms": floor * 1e3,
            "A_ms": med["A"] * 1e3,
            "B_ms": med["B"] * 1e3,
            "T_ms": med["T"] * 1e3,
            "A_added_per_call_ms": added_a * 1e3,
            "T_added_per_call_ms": added_t * 1e3,
            "A_added_over_floor": added_a / floor,
            "T_minus_A_per_call_ms": (added_t - added_a) * 1e3,
        }
    return out


def bootstrap(
    samples: Samples, *, resamples: int = RESAMPLES, seed: int = 0
) -> dict[int, dict[str, list[float]]]:
    """95% intervals of every `estimates` value, resampling whole rounds (a round's
    floor, A, B and T turns at every N stay together, as they were interleaved)."""
    rng = random.Random(seed)
    rounds = len(next(iter(samples.values()))["F"])
    draws: dict[int, dict[str, list[float]]] = {n: {} for n in samples}
    for _ in range(resamples):
        picks = [rng.randrange(rounds) for _ in range(rounds)]
        for n, values in estimates(samples, picks).items():
            for key, value in values.items():
                draws[n].setdefault(key, []).append(value)
    return {
        n: {key: [quantile(v, 0.025), quantile(v, 0.975)] for key, v in by_key.items()}
        for n, by_key in draws.items()
    }


def summarize(samples: Samples, *, resamples: int = RESAMPLES) -> dict[str, Any]:
    rounds = len(next(iter(samples.values()))["F"])
    every = list(range(rounds))
    point = estimates(samples, every)
    ci95 = bootstrap(samples, resamples=resamples)
    floor = [s for row in samples.values() for s in row["F"]]
    rows = []
    for n, values in point.items():
        ratio = values["A_added_over_floor"]
        rows.append(
            {
                "calls": n,
                **{key: {"value": v, "ci95": ci95[n][key]} for key, v in values.items()},
                "p90_ms": {name: quantile(samples[n][name], 0.9) * 1e3 for name in "ABT"},
                "meets_floor_target": ratio <= FLOOR_TARGET,
                "A_below_T": values["A_added_per_call_ms"] < values["T_added_per_call_ms"],
            }
        )
    return {
        "rounds": rounds,
        "floor_ms": {
            "median": statistics.median(floor) * 1e3,
            "p90": quantile(floor, 0.9) * 1e3,
            "ci95": ci95[next(iter(ci95))]["floor_ms"],
            "samples": len(floor),
        },
        "floor_target": FLOOR_TARGET,
        "rows": rows,
        "meets_targets": all(r["meets_floor_target"] and r["A_below_T"] for r in rows),
    }


# ------------------------------------------------------------------ the report


def _interval(row: dict[str, Any], key: str) -> str:
    low, high = row[key]["ci95"]
    return f"{row[key]['value']:6.3f} ({low:6.3f}..{high:6.3f})"


def _line(row: dict[str, Any]) -> str:
    return (
        f"{row['calls']:>3} {row['B_ms']['value']:7.2f} {row['A_ms']['value']:7.2f} "
        f"{row['T_ms']['value']:7.2f}  {_interval(row, 'A_added_per_call_ms')} "
        f"{_interval(row, 'T_added_per_call_ms')} "
        f"{row['A_added_over_floor']['value']:6.2f}x "
        f"{'met' if row['meets_floor_target'] else 'MISSED':>6} "
        f"{'yes' if row['A_below_T'] else 'NO':>4}"
    )


def table(summary: dict[str, Any]) -> str:
    """The results in at most 100 columns."""
    floor = summary["floor_ms"]
    lines = [
        f"floor, INSERT ... ON CONFLICT DO NOTHING committed (ms): {floor['median']:.3f} "
        f"({floor['ci95'][0]:.3f}..{floor['ci95'][1]:.3f}), p90 {floor['p90']:.3f}",
        f"{summary['rounds']} rounds, {floor['samples']} floors; turn medians (ms); "
        "added per call (ms, 95% CI) = (X - B) / N",
        f"{'N':>3} {'B':>7} {'A':>7} {'T':>7}  {'A added/call':<23} {'T added/call':<23} "
        f"{'A/floor':>7} {'<=' + format(FLOOR_TARGET, 'g') + 'x':>6} {'A<T':>4}",
    ]
    lines.extend(_line(row) for row in summary["rows"])
    verdict = "met" if summary["meets_targets"] else "MISSED"
    lines.append(
        f"target: A's added time per call <= {FLOOR_TARGET:g}x the floor and below T's, "
        f"at every N: {verdict}"
    )
    return "\n".join(lines)


def _versions() -> dict[str, str]:
    names = ("langgraph", "langgraph-checkpoint-postgres", "psycopg", "psycopg-pool")
    return {name: importlib.metadata.version(name) for name in names}


# ------------------------------------------------------------------ main


def _run(api: str, dsn: str, sizes: Sizes) -> Samples:
    """One part's samples, on `dsn`."""
    if api == "sync":
        return measure(dsn, sizes)
    return asyncio.run(ameasure(dsn, sizes))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (~15 s)")
    parser.add_argument(
        "--api",
        choices=("sync", "async", "both"),
        default="both",
        help="invoke on PostgresSaver, ainvoke on AsyncPostgresSaver, or both (the "
        "default: sync, then async)",
    )
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="an admin DSN (CREATE DATABASE)")
    parser.add_argument("--json", help="also write the results to this file")
    # For the smoke test: tiny sizes (not a way to run the benchmark).
    parser.add_argument("--rounds", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--warmup", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--resamples", type=int, default=RESAMPLES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    sizes = dataclasses.replace(
        sizes,
        rounds=sizes.rounds if args.rounds is None else max(1, args.rounds),
        warmup=sizes.warmup if args.warmup is None else max(0, args.warmup),
    )
    apis = ("sync", "async") if args.api == "both" else (args.api,)
    reason = probe_postgres(args.dsn)
    if reason is not None:
        print(f"PostgreSQL at {redact(args.dsn)} is not reachable: {reason}", file=sys.stderr)
        return 2
    print(
        f"{sizes.warmup} warm-up + {sizes.rounds} rounds of B, A, T turns at N = "
        f"{', '.join(map(str, CALLS))} calls per step, and the floor",
        flush=True,
    )
    summaries: dict[str, dict[str, Any]] = {}
    try:
        for api in apis:
            start = time.perf_counter()
            print(f"\n{api}: {APIS[api]}", flush=True)
            with scratch_database(args.dsn) as dsn:
                samples = _run(api, dsn, sizes)
            summaries[api] = summarize(samples, resamples=args.resamples)
            print(table(summaries[api]))
            print(f"({time.perf_counter() - start:.0f} s)", flush=True)
    except (KeyboardInterrupt, SystemExit) as stop:
        # Ctrl-C, or SIGTERM: scratch_database makes it SystemExit(128 + SIGTERM)
        code = STOPPED if isinstance(stop, KeyboardInterrupt) else stop.code
        if not isinstance(code, int) or code <= 128:
            raise
        print("stopped: pools closed, scratch database dropped", file=sys.stderr)
        return code
    if args.json:
        results = {
            "quick": args.quick,
            "warmup_rounds": sizes.warmup,
            "graphs": GRAPHS,
            "apis": {api: APIS[api] for api in apis},
            "pool_size": POOL_SIZE,
            "versions": _versions(),
            **summaries,
        }
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(results, out, indent=2)
    return 0


if __name__ == "__main__":
    status = main()
    if status > 2:
        # Stopped by a signal, after the run's own clean-up. A signal that lands while a
        # thread pool starts a worker (`Thread.start`, e.g. LangGraph's background
        # executor) leaves a worker the pool never registered, which the interpreter
        # would wait for at exit, forever (CPython): do not wait for it.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)
