"""A human's abort under ainvoke on the async Postgres ledger compensates (async)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from langchain_core.messages import BaseMessage
from langchain_core.tools import tool
from langgraph.graph import StateGraph
from langgraph.types import Command

from langgraph_resilience import ToolProfile, add_resilience, aopen_postgres
from langgraph_resilience.testing import (
    FakeClock,
    Fault,
    FaultyTool,
    ScriptedChatModel,
    text,
    tool_calls,
)
from tests.conftest import State

pytestmark = pytest.mark.postgres


def test_abort_on_the_async_ledger_refunds_every_charge(pg_dsn: str) -> None:
    """Two charges, a 403 escalated, the human aborts: both refunded, newest first."""
    charged: list[int] = []
    refunded: list[str] = []

    @tool
    def charge(amount: int) -> str:
        """Charge the card."""
        charged.append(amount)
        return f"charged {amount}"

    @tool
    def ship(order: str) -> str:
        """Ship it."""
        return "shipped"

    async def refund(key: str, result: Any) -> str:
        refunded.append(str(result))
        return "refunded"

    model = ScriptedChatModel(
        responses=[
            tool_calls(("charge", {"amount": 1})),
            tool_calls(("charge", {"amount": 2})),
            tool_calls(("ship", {"order": "o1"})),
            text("unreachable"),
        ]
    )

    async def agent(state: State) -> dict[str, list[BaseMessage]]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    async def run() -> dict[str, Any]:
        async with aopen_postgres(pg_dsn) as p:
            builder = StateGraph(State)
            builder.add_node("agent", agent)
            add_resilience(
                builder,
                agent="agent",
                tools=[charge, FaultyTool(ship, [Fault.status(403)])],
                profiles={"charge": ToolProfile(side_effect=True, compensate=refund)},
                clock=FakeClock(),
                escalate=True,
            )
            app = builder.compile(checkpointer=p.checkpointer)
            config = {"configurable": {"thread_id": uuid.uuid4().hex}}
            await app.ainvoke({"messages": [("user", "buy")]}, config)
            return dict(await app.ainvoke(Command(resume={"action": "abort"}), config))

    out = asyncio.run(run())

    assert out["resilience"]["task"]["aborted"] is True
    assert charged == [1, 2]
    assert refunded == ["charged 2", "charged 1"]
