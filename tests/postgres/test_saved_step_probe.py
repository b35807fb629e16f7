"""The save wait's read on LangGraph's Postgres savers, on the real server: one
``SELECT 1`` on the checkpoint's key (not ``get_tuple``, which loads every channel),
false until that checkpoint is put, true after."""

from __future__ import annotations

import uuid

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import Checkpoint, empty_checkpoint
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

from langgraph_resilience.core.clock import SystemClock
from langgraph_resilience.core.flow import Call, Flow, adrive, drive
from langgraph_resilience.graph.saved_step import SavedStep, _PostgresProbe, _read

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
        read = _read(step)
        assert read.args == ()  # the probe, not get_tuple(config)
        assert drive(_once(read), SystemClock()) is False
        saver.put(thread, checkpoint, {"source": "loop", "step": 1}, {})
        assert drive(_once(read), SystemClock()) is True
        other, _, _ = _step(saver)
        assert _PostgresProbe(other).exists() is False


async def test_the_async_saver_is_probed_by_key(pg_dsn: str) -> None:
    async with AsyncPostgresSaver.from_conn_string(pg_dsn) as saver:
        await saver.setup()
        step, thread, checkpoint = _step(saver)
        read = _read(step)
        assert read.args == ()
        assert await adrive(_once(read), SystemClock()) is False
        await saver.aput(thread, checkpoint, {"source": "loop", "step": 1}, {})
        assert await adrive(_once(read), SystemClock()) is True
