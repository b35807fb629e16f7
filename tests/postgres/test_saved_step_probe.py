"""The save wait on LangGraph's Postgres savers, on the real server: its read is one
``SELECT 1`` on the checkpoint's key over the saver's own connection (not ``get_tuple``,
which loads every channel), false until that checkpoint is put, true after; and in real
runs on both savers (including `from_conn_string`'s single connection, which the read
shares under the saver's lock) every payment waits for its step and happens once."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.checkpoint.base import Checkpoint, empty_checkpoint
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

from langgraph_resilience import ToolProfile
from langgraph_resilience._graph import saved_step
from langgraph_resilience._graph.saved_step import SavedStep
from langgraph_resilience.core.clock import SystemClock
from langgraph_resilience.core.flow import Call, Flow, adrive, drive
from langgraph_resilience.stores import InMemoryIdempotencyStore
from langgraph_resilience.stores.saga import InMemorySagaLog
from langgraph_resilience.testing import text, tool_calls
from tests.conftest import build_graph

pytestmark = pytest.mark.postgres


def _step(
    saver: PostgresSaver | AsyncPostgresSaver,
) -> tuple[SavedStep, RunnableConfig, Checkpoint]:
    checkpoint = empty_checkpoint()
    thread: RunnableConfig = {"configurable": {"thread_id": uuid.uuid4().hex, "checkpoint_ns": ""}}
    at: RunnableConfig = {
        "configurable": {**thread["configurable"], "checkpoint_id": checkpoint["id"]}
    }
    return SavedStep(saver, at), thread, checkpoint


def _once(read: Call) -> Flow[bool]:
    return bool((yield read))


def test_the_sync_saver_is_probed_by_key(pg_dsn: str) -> None:
    with PostgresSaver.from_conn_string(pg_dsn) as saver:
        saver.setup()
        step, thread, checkpoint = _step(saver)
        read = saved_step._read(step)
        assert read.args[0] == saved_step._EXISTS_SQL  # the probe, not get_tuple(config)
        assert drive(_once(read), SystemClock()) is False
        saver.put(thread, checkpoint, {"source": "loop", "step": 1}, {})
        assert drive(_once(read), SystemClock()) is True
        other, _, _ = _step(saver)
        assert drive(_once(saved_step._read(other)), SystemClock()) is False


async def test_the_async_saver_is_probed_by_key(pg_dsn: str) -> None:
    async with AsyncPostgresSaver.from_conn_string(pg_dsn) as saver:
        await saver.setup()
        step, thread, checkpoint = _step(saver)
        read = saved_step._read(step)
        assert read.args[0] == saved_step._EXISTS_SQL
        assert await adrive(_once(read), SystemClock()) is False
        await saver.aput(thread, checkpoint, {"source": "loop", "step": 1}, {})
        assert await adrive(_once(read), SystemClock()) is True


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_on_the_postgres_savers_each_payment_waits_once(
    pg_dsn: str, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three turns on from_conn_string's single connection, LangGraph's default
    durability: each payment's wait finds its step saved and pays once."""
    waits: list[str] = []
    until_saved = saved_step._until_saved

    def waited(step: SavedStep, tool: str) -> Flow[None]:
        waits.append(tool)
        return until_saved(step, tool)

    monkeypatch.setattr(saved_step, "_until_saved", waited)
    payments: list[int] = []

    @tool
    def pay(amount: int) -> str:
        """Pay."""
        payments.append(amount)
        return f"paid {amount}"

    def app(saver: Any) -> Any:
        return build_graph(
            [pay],
            [r for n in range(3) for r in (tool_calls(("pay", {"amount": n})), text("done"))],
            profiles={"pay": ToolProfile(side_effect=True)},
            checkpointer=saver,
            options={"idempotency": InMemoryIdempotencyStore(), "saga": InMemorySagaLog()},
        ).app

    config = {"configurable": {"thread_id": uuid.uuid4().hex}}
    if mode == "sync":
        with PostgresSaver.from_conn_string(pg_dsn) as saver:
            saver.setup()
            graph = app(saver)
            for words in ("pay", "again", "again"):
                graph.invoke({"messages": [("user", words)]}, config)
    else:

        async def run() -> None:
            async with AsyncPostgresSaver.from_conn_string(pg_dsn) as saver:
                await saver.setup()
                graph = app(saver)
                for words in ("pay", "again", "again"):
                    await graph.ainvoke({"messages": [("user", words)]}, config)

        asyncio.run(run())

    assert payments == [0, 1, 2]
    assert waits == ["pay"] * 3
