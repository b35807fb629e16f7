"""One real step of parallel payments: ``add_resilience`` on LangGraph's own
``PostgresSaver`` with the Postgres ledger, for tests that count what it sends."""

from __future__ import annotations

import threading
import uuid
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import MessagesState, StateGraph
from psycopg_pool import ConnectionPool

from langgraph_resilience import ResilienceState, ToolProfile, add_resilience
from langgraph_resilience.stores.postgres_ledger import PostgresIdempotencyStore
from langgraph_resilience.testing import ScriptedChatModel


class State(MessagesState, ResilienceState):
    pass


def pay_in_one_step(
    pool: ConnectionPool[Any],
    ledger: PostgresIdempotencyStore,
    calls: list[tuple[str, str]],
    profile: ToolProfile,
) -> tuple[dict[str, Any], list[str], str]:
    """Run one turn whose agent asks, in one message, for a ``pay`` call per
    ``(call id, order)`` of `calls`: the turn's output, the orders paid, its thread."""
    paid: list[str] = []
    lock = threading.Lock()

    @tool
    def pay(order: str) -> str:
        """Pay one order."""
        with lock:
            paid.append(order)
        return f"paid {order}"

    def reply(messages: list[Any]) -> AIMessage:
        if isinstance(messages[-1], HumanMessage):
            asked = [{"name": "pay", "args": {"order": o}, "id": i} for i, o in calls]
            return AIMessage(content="", tool_calls=asked)
        return AIMessage(content="all paid")

    model = ScriptedChatModel(responses=[reply, reply])
    saver = PostgresSaver(pool)  # type: ignore[arg-type]
    saver.setup()
    builder = StateGraph(State)
    builder.add_node("agent", lambda s: {"messages": [model.invoke(s["messages"])]})
    add_resilience(
        builder, agent="agent", tools=[pay], profiles={"pay": profile}, idempotency=ledger
    )
    graph = builder.compile(checkpointer=saver)
    thread = uuid.uuid4().hex
    out = graph.invoke(
        {"messages": [HumanMessage("pay all")]}, {"configurable": {"thread_id": thread}}
    )
    return out, paid, thread
