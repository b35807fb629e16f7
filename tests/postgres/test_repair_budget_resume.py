"""The repair budget lives in the Postgres checkpoint: resuming never buys more repairs."""

from __future__ import annotations

import uuid
from typing import Any, Literal

import psycopg
import pytest
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.postgres import PostgresSaver
from psycopg.rows import dict_row

from langgraph_resilience import ResiliencePolicy
from langgraph_resilience.testing import ScriptedChatModel, text, tool_calls
from tests.conftest import build_graph

pytestmark = pytest.mark.postgres


@tool
def refund(order_id: int, currency: Literal["USD", "EUR"]) -> str:
    """Refund an order."""
    return f"refunded {order_id} in {currency}"


def agent_turn(messages: list[BaseMessage]) -> AIMessage:
    """The agent asks for the refund once, then answers: the same in every process."""
    if any(isinstance(m, ToolMessage) for m in messages):
        return text("sorry")
    return tool_calls(("refund", {"order_id": 1, "currency": "dollars"}))


def test_repair_budget_survives_checkpoint_and_resume(pg_dsn: str) -> None:
    """Interrupted before every repair and resumed by fresh processes' worth of graphs:
    exactly max_repair repair calls happen in total."""
    thread: dict[str, Any] = {"configurable": {"thread_id": uuid.uuid4().hex}}
    kwargs: dict[str, Any] = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    repair_calls = 0
    for resume in range(6):
        with psycopg.Connection.connect(pg_dsn, **kwargs) as conn:
            saver = PostgresSaver(conn)
            saver.setup()
            repairer = ScriptedChatModel(
                responses=[tool_calls(("refund", {"order_id": 1, "currency": f"bad{resume}"}))]
            )
            h = build_graph(
                [refund],
                [agent_turn] * 3,
                repair_model=repairer,
                policy=ResiliencePolicy(max_repair=2),
                checkpointer=saver,
                interrupt_before=["repair"],
            )
            h.app.invoke({"messages": [("user", "refund")]} if resume == 0 else None, thread)
            repair_calls += repairer.calls
            state = h.app.get_state(thread)
    assert repair_calls == 2
    assert state.next == ()
    assert state.values["resilience"]["llm_calls"] == 2
    [message] = [m for m in state.values["messages"] if isinstance(m, ToolMessage)]
    assert message.status == "error"
