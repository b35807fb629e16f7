"""A clean side-effecting turn on each Postgres saver constructor, with nothing wired.

The user's graph (a `ScriptedChatModel` agent + ``add_resilience``, one tool with
``ToolProfile(side_effect=True)``, no ``idempotency=``) on LangGraph's savers as its
docs open them; the ledger follows the saver:

- ``conn``: ``PostgresSaver.from_conn_string``: one connection, the ledger's
  statements on it under the saver's own lock, one at a time, unprepared;
- ``pool``: ``PostgresSaver(ConnectionPool)``: the ledger on the saver's pool;
- ``conn+pool``: ``from_conn_string`` with the ledger passed explicitly on a small
  pool of its own (``idempotency=`` / ``saga=``): what opening our own connections
  beside a single-connection saver would cost instead;
- ``plain conn`` / ``plain pool``: the same graph on LangGraph's ``ToolNode``.

A turn: the agent asks for one refund, the tool answers, the agent answers, on a new
thread, LangGraph's default durability. The variants run interleaved (one turn each,
in an order reversed every round) after a warm-up, sync (``invoke``) and async
(``ainvoke`` on ``AsyncPostgresSaver``); medians, and ratios of medians with a 95%
bootstrap interval. In a throw-away database ``lgr_bench_<random>``, dropped at the end.

    python benchmarks/saver_connections.py            # ~3 min on 2 cores
    python benchmarks/saver_connections.py --quick    # smoke run
    python benchmarks/saver_connections.py --json out.json
    python benchmarks/saver_connections.py --rounds 2   # what the test runs
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import tool
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from overhead import bootstrap_ratio, probe_postgres
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from benchmarks.scratch import scratch_database
from langgraph_resilience import ResilienceState, ToolProfile, add_resilience
from langgraph_resilience.stores import (
    AsyncPostgresIdempotencyStore,
    AsyncPostgresSagaLog,
    PostgresIdempotencyStore,
    PostgresSagaLog,
)
from langgraph_resilience.stores.persistence import POSTGRES_CONNECTION_KWARGS
from langgraph_resilience.testing import ScriptedChatModel, text, tool_calls

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
VARIANTS = ("conn", "pool", "conn+pool", "plain conn", "plain pool")
RATIOS = (("conn", "pool"), ("conn+pool", "pool"), ("conn", "plain conn"), ("pool", "plain pool"))


class State(MessagesState, ResilienceState):
    pass


def turn(messages: list[BaseMessage]) -> AIMessage:
    if any(isinstance(m, ToolMessage) for m in messages):
        return text("done")
    return tool_calls(("refund", {"order_id": "A1"}))


@tool
def refund(order_id: str) -> str:
    """Refund an order."""
    return f"refunded {order_id}"


def build(saver: Any, *, turns: int, plain: bool, ledger: tuple[Any, Any] | None = None) -> Any:
    # two model calls a turn; a longer script costs seconds to build (its repr)
    model = ScriptedChatModel(responses=[turn] * (2 * turns))

    async def acall(state: State) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(State)
    builder.add_node(
        "agent",
        RunnableLambda(lambda s: {"messages": [model.invoke(s["messages"])]}, afunc=acall),
    )
    if plain:
        builder.add_node("tools", ToolNode([refund]))
        builder.add_edge(START, "agent")
        builder.add_conditional_edges("agent", tools_condition)
        builder.add_edge("tools", "agent")
    else:
        wired = {"idempotency": ledger[0], "saga": ledger[1]} if ledger else {}
        profiles = {"refund": ToolProfile(side_effect=True)}
        add_resilience(builder, agent="agent", tools=[refund], profiles=profiles, **wired)
    return builder.compile(checkpointer=saver)


def _inp() -> tuple[dict[str, Any], dict[str, Any]]:
    config = {"configurable": {"thread_id": uuid.uuid4().hex}}
    return {"messages": [("user", "refund A1")]}, config


@contextlib.contextmanager
def sync_apps(dsn: str, turns: int) -> Iterator[dict[str, Any]]:
    with (
        PostgresSaver.from_conn_string(dsn) as conn_saver,
        ConnectionPool(dsn, kwargs=POSTGRES_CONNECTION_KWARGS, open=False) as pool,
        ConnectionPool(
            dsn, kwargs=POSTGRES_CONNECTION_KWARGS, min_size=2, max_size=2, open=False
        ) as own,
    ):
        conn_saver.setup()
        pool_saver = PostgresSaver(pool)
        ledger = (PostgresIdempotencyStore(own), PostgresSagaLog(own))
        for part in ledger:
            part.setup()
        yield {
            "conn": build(conn_saver, turns=turns, plain=False),
            "pool": build(pool_saver, turns=turns, plain=False),
            "conn+pool": build(conn_saver, turns=turns, plain=False, ledger=ledger),
            "plain conn": build(conn_saver, turns=turns, plain=True),
            "plain pool": build(pool_saver, turns=turns, plain=True),
        }


@contextlib.asynccontextmanager
async def async_apps(dsn: str, turns: int) -> AsyncIterator[dict[str, Any]]:
    async with (
        AsyncPostgresSaver.from_conn_string(dsn) as conn_saver,
        AsyncConnectionPool(dsn, kwargs=POSTGRES_CONNECTION_KWARGS, open=False) as pool,
        AsyncConnectionPool(
            dsn, kwargs=POSTGRES_CONNECTION_KWARGS, min_size=2, max_size=2, open=False
        ) as own,
    ):
        await conn_saver.setup()
        pool_saver = AsyncPostgresSaver(pool)
        ledger = (AsyncPostgresIdempotencyStore(own), AsyncPostgresSagaLog(own))
        for part in ledger:
            await part.setup()
        yield {
            "conn": build(conn_saver, turns=turns, plain=False),
            "pool": build(pool_saver, turns=turns, plain=False),
            "conn+pool": build(conn_saver, turns=turns, plain=False, ledger=ledger),
            "plain conn": build(conn_saver, turns=turns, plain=True),
            "plain pool": build(pool_saver, turns=turns, plain=True),
        }


def _order(round_: int) -> tuple[str, ...]:
    return VARIANTS if round_ % 2 == 0 else tuple(reversed(VARIANTS))


def measure_sync(dsn: str, warmup: int, rounds: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    with sync_apps(dsn, warmup + rounds) as apps:
        for round_ in range(warmup + rounds):
            for variant in _order(round_):
                inp, config = _inp()
                start = time.perf_counter()
                out = apps[variant].invoke(inp, config)
                took = time.perf_counter() - start
                assert out["messages"][-1].content == "done", variant
                if round_ >= warmup:
                    times[variant].append(took)
    return times


async def measure_async(dsn: str, warmup: int, rounds: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    async with async_apps(dsn, warmup + rounds) as apps:
        for round_ in range(warmup + rounds):
            for variant in _order(round_):
                inp, config = _inp()
                start = time.perf_counter()
                out = await apps[variant].ainvoke(inp, config)
                took = time.perf_counter() - start
                assert out["messages"][-1].content == "done", variant
                if round_ >= warmup:
                    times[variant].append(took)
    return times


def summary(times: dict[str, list[float]]) -> dict[str, Any]:
    medians = {v: statistics.median(t) * 1000 for v, t in times.items()}
    ratios = {}
    for a, b in RATIOS:
        low, high = bootstrap_ratio(times[a], times[b])
        ratios[f"{a} / {b}"] = (medians[a] / medians[b], low, high)
    return {"median_ms": medians, "ratios": ratios}


def report(mode: str, result: dict[str, Any]) -> None:
    print(f"\n{mode}: median ms per clean side-effecting turn")
    for variant, ms in result["median_ms"].items():
        print(f"  {variant:<11} {ms:7.2f}")
    for name, (ratio, low, high) in result["ratios"].items():
        print(f"  {name:<24} {ratio:.3f}x ({low:.3f}-{high:.3f})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="an admin DSN (CREATE DATABASE)")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--rounds", type=int, help="measured rounds (default 200, quick 30)")
    args = parser.parse_args(argv)
    reason = probe_postgres(args.dsn)
    if reason:
        print(f"PostgreSQL unavailable ({reason})", file=sys.stderr)
        return 1
    warmup, rounds = (5, 30) if args.quick else (20, 200)
    if args.rounds:
        warmup, rounds = min(warmup, args.rounds), args.rounds
    with scratch_database(args.dsn) as dsn:
        results = {
            "sync": summary(measure_sync(dsn, warmup, rounds)),
            "async": summary(asyncio.run(measure_async(dsn, warmup, rounds))),
        }
    for mode, result in results.items():
        report(mode, result)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"rounds": rounds, **results}, out, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
