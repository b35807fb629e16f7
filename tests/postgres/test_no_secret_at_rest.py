"""A run whose side-effecting tool takes and returns planted secrets of every kind, on a
real Postgres: no row of any ``lgr_*`` table holds one of them (ledger arguments *and*
results, saga entries, breaker rows, leases)."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from langchain_core.tools import tool

from langgraph_resilience import ResiliencePolicy, ToolProfile
from langgraph_resilience.stores import PostgresBreakerStore
from langgraph_resilience.stores.persistence import open_postgres
from langgraph_resilience.testing import text, tool_calls
from tests.conftest import build_graph
from tests.unit.test_planted_secrets import PLANTED

pytestmark = [pytest.mark.postgres]

SECRET_TEXT = "\n".join(p.text for p in PLANTED)
PARTS = sorted({part for p in PLANTED for part in p.parts})
paid: list[str] = []


@tool
def pay(order_id: str, card_note: str, api_key: str) -> dict[str, Any]:
    """Charge an order (a side effect)."""
    paid.append(order_id)
    return {
        "receipt": f"paid {order_id}; upstream said: {card_note}",
        "token": "RcptT0ken" + api_key,
        "echo": [{"headers": p.structured} for p in PLANTED],
    }


def _rows_of_our_tables(dsn: str) -> dict[str, str]:
    """Every ``lgr_*`` table's rows, as text."""
    with psycopg.connect(dsn) as conn:
        names = [
            str(row[0])
            for row in conn.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = 'public' AND table_name LIKE 'lgr\\_%'"
            )
        ]
        return {
            name: "\n".join(
                str(row[0]) for row in conn.execute(f'SELECT t::text FROM "{name}" AS t')
            )
            for name in names
        }


def test_no_planted_secret_reaches_any_of_our_tables(pg_dsn: str) -> None:
    """Arguments and results of a side effect, a saga entry's detail and the breaker
    rows are stored redacted: grepping every lgr_* table finds no planted secret."""
    args = {"order_id": "o-1", "card_note": SECRET_TEXT, "api_key": "ArgK3yPlanted99"}
    with open_postgres(pg_dsn) as p:
        harness = build_graph(
            [pay],
            [tool_calls(("pay", args)), text("paid")],
            profiles={"pay": ToolProfile(side_effect=True)},
            checkpointer=p.checkpointer,
            policy=ResiliencePolicy(max_attempts=2),
            options={"breaker_store": PostgresBreakerStore(p.pool)},
        )
        harness.app.invoke(
            {"messages": [("user", "pay order o-1")]},
            harness.config(uuid.uuid4().hex),
            durability="sync",
        )
        p.saga.append(  # what compensation logs: its result or error as the detail
            "t", key="k", tool="pay", action="compensate", status="failed", detail=args
        )
    assert paid == ["o-1"]

    tables = _rows_of_our_tables(pg_dsn)

    assert {"lgr_idempotency", "lgr_saga", "lgr_breakers"} <= set(tables)
    assert "paid o-1" in tables["lgr_idempotency"]  # the result is there, redacted
    leaks = {
        name: [part for part in [*PARTS, "ArgK3yPlanted99"] if part in rows]
        for name, rows in tables.items()
    }
    assert {name: found for name, found in leaks.items() if found} == {}
