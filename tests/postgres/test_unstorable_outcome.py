"""A side effect's result the database cannot store (NUL, a lone surrogate) is still
the effect's outcome: recorded in a safe form, never taken for a database outage."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import ToolMessage
from langchain_core.tools import tool

from langgraph_resilience import ToolProfile, open_postgres
from langgraph_resilience.testing import FakeClock, text, tool_calls
from tests.conftest import build_graph

pytestmark = pytest.mark.postgres


@pytest.mark.parametrize("raw", ["ok\x00tail", "ok\ud800tail"], ids=["nul", "surrogate"])
def test_an_unstorable_result_is_recorded_replaced(pg_dsn: str, raw: str) -> None:
    """The call is answered with the tool's own result; the ledger holds it with U+FFFD
    in place of what PostgreSQL refuses, as a done outcome, without a ledger retry."""

    @tool
    def send(to: str) -> str:
        """Send a message."""
        return raw

    clock = FakeClock()
    with open_postgres(pg_dsn) as p:
        h = build_graph(
            [send],
            [tool_calls(("send", {"to": "bob"})), text("sent")],
            profiles={"send": ToolProfile(side_effect=True)},
            checkpointer=p.checkpointer,
            clock=clock,
            options={"idempotency": p.idempotency, "saga": p.saga},
        )
        config: dict[str, Any] = h.config()
        out = h.app.invoke({"messages": [("user", "send")]}, config)
        [answer] = [m for m in out["messages"] if isinstance(m, ToolMessage)]
        assert answer.content == raw
        [record] = p.idempotency.for_thread(config["configurable"]["thread_id"])
    assert record.status == "done"
    assert record.result == "ok\ufffdtail"
    assert clock.sleeps == []  # no ledger retry was waited for
