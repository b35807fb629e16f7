"""A turn paused by LangChain's `HumanInTheLoopMiddleware` (in its `after_model`, a node
the package does not see end) is answered by another process at once: a web app
whose reviewer's "approve" lands on another worker than the one that paused. The
pausing worker is alive and idle, so its run's lease would otherwise stay until it
lapsed (`ThreadBusyError` for up to 30 s)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.types import Command

from langgraph_resilience.errors import ThreadBusyError
from tests.postgres.hitl_worker import reviewed_agent
from tests.postgres.processes import ROOT

pytestmark = pytest.mark.postgres

WORKER = ROOT / "tests" / "postgres" / "hitl_worker.py"


def _paused_elsewhere(pg_dsn: str, thread: str) -> subprocess.Popen[str]:
    """A worker process that paused `thread` for its reviewer and stays alive, idle."""
    pausing = subprocess.Popen(
        [sys.executable, str(WORKER), pg_dsn, thread],
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert pausing.stdout is not None
    line = pausing.stdout.readline()
    assert line.strip() == "paused", pausing.stderr.read() if pausing.stderr else line
    return pausing


@pytest.mark.parametrize("api", ["sync", "async"])
def test_a_review_paused_in_one_worker_is_answered_in_another_at_once(
    pg_dsn: str, api: str
) -> None:
    thread = f"reviewed-{api}"
    pausing = _paused_elsewhere(pg_dsn, thread)
    paid: list[int] = []
    approve = Command(resume={"decisions": [{"type": "approve"}]})
    config: Any = {"configurable": {"thread_id": thread}}

    async def aanswer() -> Any:
        async with AsyncPostgresSaver.from_conn_string(pg_dsn) as saver:
            return await reviewed_agent(saver, paid, resumed=True).ainvoke(approve, config)

    try:
        started = time.monotonic()
        if api == "sync":
            with PostgresSaver.from_conn_string(pg_dsn) as saver:
                out = reviewed_agent(saver, paid, resumed=True).invoke(approve, config)
        else:
            out = asyncio.run(aanswer())
        took = time.monotonic() - started
        assert pausing.poll() is None  # the pausing worker was alive all along
    finally:
        pausing.communicate(timeout=30)
    assert out["messages"][-1].content == "paid"
    assert paid == [5]
    assert took < 10, f"the answer waited {took:.1f}s for the paused run's lease"


def test_a_second_answer_while_the_first_runs_is_refused(pg_dsn: str) -> None:
    """The reviewer's "approve" is sent twice (a double click): the second arrives while
    the first answer's run is paying. The first run's lease notes a checkpoint after
    the pause, so the second is refused (`ThreadBusyError`) and pays nothing."""
    thread = "reviewed-twice"
    pausing = _paused_elsewhere(pg_dsn, thread)
    paid: list[int] = []
    second: list[BaseException] = []
    approve = Command(resume={"decisions": [{"type": "approve"}]})
    config: Any = {"configurable": {"thread_id": thread}}
    try:
        with PostgresSaver.from_conn_string(pg_dsn) as saver:

            def answer_again() -> None:
                try:
                    agent.invoke(approve, config)
                except BaseException as exc:  # kept for the assertion
                    second.append(exc)

            def paying() -> None:
                if not second:
                    again = threading.Thread(target=answer_again)
                    again.start()
                    again.join(60)

            agent = reviewed_agent(saver, paid, resumed=True, paying=paying)
            out = agent.invoke(approve, config)
    finally:
        pausing.communicate(timeout=30)
    assert [type(e) for e in second] == [ThreadBusyError], second
    assert out["messages"][-1].content == "paid"
    assert paid == [5]
