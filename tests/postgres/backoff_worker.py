"""A user process for the crash test: runs (or resumes) a resilient graph on PostgresSaver.

``start`` uses the real clock and, when the retry node starts its backoff, writes a
marker file and sleeps for real, so the test can SIGKILL it mid-backoff.
``resume`` continues the thread by thread_id with a fake clock and prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import random
import sys
import time
from typing import Any

import psycopg
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import tool
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph import MessagesState, StateGraph
from psycopg.rows import dict_row

from langgraph_resilience import ResiliencePolicy, ResilienceState, add_resilience
from langgraph_resilience.core import SystemClock
from langgraph_resilience.testing import (
    FakeClock,
    FakeHTTPError,
    ScriptedChatModel,
    text,
    tool_calls,
)

RETRY_AFTER = 600


class State(MessagesState, ResilienceState):
    pass


class MarkerClock(SystemClock):
    """The real clock, announcing each backoff through a marker file before sleeping."""

    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def _announce(self, seconds: float) -> None:
        """Write the marker atomically: the test reads it as soon as it exists."""
        partial = self.marker.with_suffix(".partial")
        partial.write_text(str(seconds))
        partial.replace(self.marker)

    def sleep(self, seconds: float) -> None:
        self._announce(seconds)
        time.sleep(seconds)

    async def asleep(self, seconds: float) -> None:
        self._announce(seconds)
        await asyncio.sleep(seconds)


def build(dsn: str, responses: list[Any], clock: Any) -> StateGraph[Any, Any, Any, Any]:
    @tool
    def lookup(query: str) -> str:
        """Look up a record; the first two executions of the thread fail with 503.

        Retry-After is ten minutes so that no scheduling delay on a loaded machine
        between the kill and the resume can use up the interrupted backoff.
        """
        with psycopg.connect(dsn, autocommit=True) as conn:
            done = conn.execute("SELECT count(*) FROM executions").fetchone()
            conn.execute("INSERT INTO executions DEFAULT VALUES")
        if done is not None and done[0] < 2:
            raise FakeHTTPError(503, headers={"Retry-After": str(RETRY_AFTER)})
        return f"record for {query}"

    model = ScriptedChatModel(responses=responses)
    builder = StateGraph(State)
    builder.add_node(
        "agent",
        RunnableLambda(
            lambda s: {"messages": [model.invoke(s["messages"])]},
            afunc=lambda s: _acall(model, s),
        ),
    )
    add_resilience(
        builder,
        agent="agent",
        tools=[lookup],
        policy=ResiliencePolicy(max_attempts=3, max_delay=RETRY_AFTER, max_retry_after=RETRY_AFTER),
        clock=clock,
        rng=random.Random(1),
    )
    return builder


async def _acall(model: ScriptedChatModel, state: Any) -> dict[str, Any]:
    return {"messages": [await model.ainvoke(state["messages"])]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("phase", choices=["start", "resume"])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--thread", required=True)
    parser.add_argument("--marker", required=True)
    parser.add_argument("--mode", choices=["sync", "async"], default="sync")
    args = parser.parse_args()
    config = {"configurable": {"thread_id": args.thread}}
    if args.phase == "start":
        clock: Any = MarkerClock(pathlib.Path(args.marker))
        responses: list[Any] = [tool_calls(("lookup", {"query": "order 42"}))]
        inp: Any = {"messages": [("user", "find order 42")]}
    else:
        clock = FakeClock(epoch=time.time())
        responses = [text("found it")]
        inp = None
    builder = build(args.dsn, responses, clock)
    conn_kwargs: dict[str, Any] = {
        "autocommit": True,
        "prepare_threshold": 0,
        "row_factory": dict_row,
    }
    if args.mode == "sync":
        with psycopg.Connection.connect(args.dsn, **conn_kwargs) as conn:
            app = builder.compile(checkpointer=PostgresSaver(conn))
            app.invoke(inp, config)
            state = app.get_state(config)
    else:

        async def run() -> Any:
            async with await psycopg.AsyncConnection.connect(args.dsn, **conn_kwargs) as conn:
                app = builder.compile(checkpointer=AsyncPostgresSaver(conn))
                await app.ainvoke(inp, config)
                return await app.aget_state(config)

        state = asyncio.run(run())
    json.dump(
        {
            "sleeps": getattr(clock, "sleeps", []),
            "next": list(state.next),
            "last": state.values["messages"][-1].content,
            "ledger": state.values["resilience"],
        },
        sys.stdout,
    )


if __name__ == "__main__":
    main()
