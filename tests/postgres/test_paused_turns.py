"""A `create_agent` turn whose calls pause for a human while a sibling pays, on the
deployment users run (`PostgresSaver.from_conn_string`, the ledger and the thread's
lease in Postgres): the payment keeps the run's lease, the pause gives it back, and
the resumed calls, starting at once, share their run's one lease."""

from __future__ import annotations

import gc
from typing import Any

import psycopg
import pytest
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.types import Command

from tests.graph.test_two_runs import approving_agent

pytestmark = pytest.mark.postgres


def _leased(dsn: str, thread: str) -> bool:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT 1 FROM lgr_thread_leases WHERE thread_id = %s AND expires_at > now()",
            (thread,),
        ).fetchone()
    return row is not None


@pytest.mark.parametrize("pay_first", [False, True], ids=["paused-first", "paying-first"])
def test_a_paused_turn_on_postgres_keeps_then_gives_back_its_thread(
    pg_dsn: str, pay_first: bool
) -> None:
    paid: list[int] = []
    thread = f"paused-{pay_first}"
    config: Any = {"configurable": {"thread_id": thread}}
    with PostgresSaver.from_conn_string(pg_dsn) as saver:
        saver.setup()
        agent, order = approving_agent(
            paid, pay_first=pay_first, leased=lambda: _leased(pg_dsn, thread), checkpointer=saver
        )
        gc.disable()  # no collector to free what the run left: the pause itself must
        try:
            agent.invoke({"messages": [("user", "approve and pay")]}, config)
            pending = agent.get_state(config).interrupts
            assert len(pending) == 2
            assert order.leased_while_paying == [True]
            assert not _leased(pg_dsn, thread)
            resumed = Command(resume={i.id: "yes" for i in pending})
            out = agent.invoke(resumed, config)  # two calls take the lease at once
        finally:
            gc.enable()
    assert out["messages"][-1].content == "ok"
    assert paid == [5]
