"""A user process for the saver matrix: one refund agent on each standard saver.

The agent is wired as a user would, with nothing but a checkpointer and one
``ToolProfile(side_effect=True)``: through ``add_resilience`` on a ``StateGraph``
(``--entry graph``) or through ``create_agent`` + ``ResilienceMiddleware``
(``--entry agent``). ``--saver`` names the constructor, opened the way LangGraph's
docs open it (`SAVERS`); the sync savers run with ``invoke``, the async ones with
``ainvoke`` (`ASYNC_SAVERS`). The refund inserts one row into ``refunds`` on the
test database, so effects are counted as rows.

``start`` runs a new thread with LangGraph's default durability; with ``--kill
after`` it writes the marker file right after the refund row is inserted and hangs
there, so the test SIGKILLs it before anything else happens. ``resume`` continues
the thread by its id (`resume` / `aresume`, nothing else wired). Prints JSON: the
thread's `outcome`.

The tests run each phase as `phase`, in a process forked from a server that has
imported this module (``multiprocessing``'s forkserver: a new process, without the
four seconds of imports each).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import pathlib
import sqlite3
import sys
import time
import traceback
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import MessagesState, StateGraph
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from langgraph_resilience import (
    ResilienceMiddleware,
    ResilienceState,
    ToolProfile,
    add_resilience,
    aresume,
    current_idempotency_key,
    resume,
)
from langgraph_resilience.stores import EffectStatus
from langgraph_resilience.testing import FakeClock, ScriptedChatModel, text, tool_calls

SYNC_SAVERS = ("postgres-conn-string", "postgres-pool", "sqlite-conn-string", "sqlite-conn")
ASYNC_SAVERS = ("async-postgres-conn-string", "async-postgres-pool", "async-sqlite")
SAVERS = (*SYNC_SAVERS, *ASYNC_SAVERS, "memory")
DURABLE = SAVERS[:-1]
ENTRIES = ("graph", "agent")

# LangGraph's documented pool configuration for its Postgres savers.
POOL_KWARGS = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}


class State(MessagesState, ResilienceState):
    pass


def prepare(dsn: str) -> None:
    """The table the refunds land in (one row per effect)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS refunds (key text, order_id text)")


def refunds(dsn: str) -> int:
    """How many refunds happened."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM refunds").fetchone()
    return int(row[0]) if row else 0


def hang(marker: pathlib.Path) -> None:
    marker.write_text("after")
    time.sleep(120)  # the test SIGKILLs the process here: a real hang, not a clock


def build(dsn: str, saver: Any, *, entry: str, kill: str, marker: pathlib.Path) -> Any:
    """The user's agent on `saver`: one refund, then "done"."""

    def turn(messages: list[BaseMessage]) -> AIMessage:
        if any(isinstance(m, ToolMessage) for m in messages):
            return text("done")
        return tool_calls(("refund", {"order_id": "A1"}))

    @tool
    def refund(order_id: str) -> str:
        """Refund an order."""
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO refunds (key, order_id) VALUES (%s, %s)",
                (current_idempotency_key(), order_id),
            )
        if kill == "after":
            hang(marker)
        return f"refunded {order_id}"

    def status(key: str) -> EffectStatus:
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT order_id FROM refunds WHERE key = %s", (key,)).fetchone()
        return EffectStatus(done=row is not None, result=f"refunded {row[0]}" if row else None)

    profiles = {"refund": ToolProfile(side_effect=True, status_check=status)}
    clock = FakeClock(epoch=time.time())
    model = ScriptedChatModel(responses=[turn] * 4)
    if entry == "agent":
        middleware = ResilienceMiddleware(clock=clock, profiles=profiles)
        return create_agent(model, [refund], middleware=[middleware], checkpointer=saver)

    async def acall(state: State) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(State)
    builder.add_node(
        "agent",
        RunnableLambda(lambda s: {"messages": [model.invoke(s["messages"])]}, afunc=acall),
    )
    add_resilience(builder, agent="agent", tools=[refund], clock=clock, profiles=profiles)
    return builder.compile(checkpointer=saver)


@contextlib.contextmanager
def open_saver(name: str, dsn: str, path: pathlib.Path) -> Iterator[Any]:
    """A sync saver opened as LangGraph's docs open it, set up, closed on exit."""
    if name == "postgres-conn-string":
        with PostgresSaver.from_conn_string(dsn) as saver:
            saver.setup()
            yield saver
    elif name == "postgres-pool":
        with ConnectionPool(dsn, kwargs=POOL_KWARGS, open=False) as pool:
            saver = PostgresSaver(pool)
            saver.setup()
            yield saver
    elif name == "sqlite-conn-string":
        with SqliteSaver.from_conn_string(str(path)) as saver:
            yield saver
    elif name == "sqlite-conn":
        conn = sqlite3.connect(path, check_same_thread=False)
        try:
            yield SqliteSaver(conn)
        finally:
            conn.close()
    elif name == "memory":
        yield InMemorySaver()
    else:
        raise ValueError(f"not a sync saver: {name}")


@contextlib.asynccontextmanager
async def aopen_saver(name: str, dsn: str, path: pathlib.Path) -> AsyncIterator[Any]:
    """An async saver opened as LangGraph's docs open it, set up, closed on exit."""
    if name == "async-postgres-conn-string":
        async with AsyncPostgresSaver.from_conn_string(dsn) as saver:
            await saver.setup()
            yield saver
    elif name == "async-postgres-pool":
        async with AsyncConnectionPool(dsn, kwargs=POOL_KWARGS, open=False) as pool:
            saver = AsyncPostgresSaver(pool)
            await saver.setup()
            yield saver
    elif name == "async-sqlite":
        async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
            yield saver
    elif name == "memory":
        yield InMemorySaver()
    else:
        raise ValueError(f"not an async saver: {name}")


def outcome(state: Any) -> dict[str, Any]:
    """What the test checks of a thread: where it stands, its last word, how many
    times the model asked for the refund and how many answers it got."""
    messages = state.values["messages"]
    asked = [c["id"] for m in messages if isinstance(m, AIMessage) for c in m.tool_calls]
    return {
        "next": list(state.next),
        "last": messages[-1].content,
        "asked": len(asked),
        "answers": sum(isinstance(m, ToolMessage) and m.tool_call_id in asked for m in messages),
    }


def run(
    phase: str, *, saver: str, entry: str, dsn: str, thread: str, path: pathlib.Path, **kw: Any
) -> dict[str, Any]:
    """One phase on a sync saver: a new thread (``start``) or its resume."""
    config = {"configurable": {"thread_id": thread}}
    with open_saver(saver, dsn, path) as opened:
        app = build(dsn, opened, entry=entry, **kw)
        if phase == "start":
            app.invoke({"messages": [("user", "refund A1")]}, config)
        else:
            resume(app, thread)
        return outcome(app.get_state(config))


async def arun(
    phase: str, *, saver: str, entry: str, dsn: str, thread: str, path: pathlib.Path, **kw: Any
) -> dict[str, Any]:
    """Async `run`, on an async saver."""
    config = {"configurable": {"thread_id": thread}}
    async with aopen_saver(saver, dsn, path) as opened:
        app = build(dsn, opened, entry=entry, **kw)
        if phase == "start":
            await app.ainvoke({"messages": [("user", "refund A1")]}, config)
        else:
            await aresume(app, thread)
        return outcome(await app.aget_state(config))


def phase(name: str, options: dict[str, Any], out: str) -> None:
    """Run phase `name` with `options` (`run`'s keywords); its JSON `outcome` (or the
    error's traceback, and exit status 1) goes to file `out`."""
    try:
        if options["saver"] in ASYNC_SAVERS:
            result = asyncio.run(arun(name, **options))
        else:
            result = run(name, **options)
    except BaseException:
        pathlib.Path(out).write_text(json.dumps({"error": traceback.format_exc()}))
        raise SystemExit(1) from None
    pathlib.Path(out).write_text(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("phase", choices=["start", "resume"])
    parser.add_argument("--saver", choices=DURABLE, required=True)
    parser.add_argument("--entry", choices=ENTRIES, required=True)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--thread", required=True)
    parser.add_argument("--sqlite", required=True, help="the SQLite savers' file")
    parser.add_argument("--marker", required=True)
    parser.add_argument("--kill", choices=["after", "none"], default="none")
    args = parser.parse_args()
    options: dict[str, Any] = {
        "saver": args.saver,
        "entry": args.entry,
        "dsn": args.dsn,
        "thread": args.thread,
        "path": pathlib.Path(args.sqlite),
        "kill": args.kill if args.phase == "start" else "none",
        "marker": pathlib.Path(args.marker),
    }
    out = pathlib.Path(args.marker).with_suffix(".json")
    phase(args.phase, options, str(out))
    sys.stdout.write(out.read_text())


if __name__ == "__main__":
    main()
