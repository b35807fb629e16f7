"""The demo: a support agent whose tools fail in every way the taxonomy knows.

It is an ordinary user graph (an ``agent`` node over a scripted model, then
`add_resilience`), so what it prints is exactly what a user's graph does.
The clock is a `FakeClock` anchored at the real time: backoff is simulated, so
the demo finishes instantly, yet due times stored in the checkpoint are real
wall-clock times.
"""

from __future__ import annotations

import dataclasses
import random
import time
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import BaseTool, tool
from langgraph.graph import START, MessagesState, StateGraph

from langgraph_resilience.errors import ToolFailure
from langgraph_resilience.policy import ResiliencePolicy
from langgraph_resilience.profile import ToolProfile
from langgraph_resilience.state import ResilienceState
from langgraph_resilience.testing import (
    FakeClock,
    Fault,
    FaultyTool,
    ScriptedChatModel,
    text,
    tool_calls,
)
from langgraph_resilience.wiring import add_resilience

__all__ = ["DemoState", "SupportDemo", "build_demo"]

CUSTOMER_REQUEST = "Hi, where is my order 1042? The lamp arrived broken, please refund it (USD 80)."


class DemoState(MessagesState, ResilienceState):
    """The demo graph's state: messages plus the resilience ledger."""


@tool
def lookup_order(order_id: int) -> dict[str, Any]:
    """Look up an order by id."""
    return {"order_id": order_id, "item": "desk lamp", "status": "delivered", "total": 80.0}


@tool
def track_shipment(order_id: int) -> str:
    """Tracking status of an order's shipment."""
    return f"order {order_id}: delivered 2026-11-27, signed by R. Ito"


@tool
def refund(order_id: int, amount: float, currency: str) -> str:
    """Refund part or all of an order."""
    if amount > 50:
        raise ToolFailure(
            "policy",
            f"refunds above 50 {currency} need a supervisor's approval",
            context={"limit": 50, "requested": amount},
        )
    return f"refunded {amount} {currency} on order {order_id}"


@tool
def open_ticket(order_id: int, summary: str) -> str:
    """Open a ticket for a human agent."""
    return f"ticket T-{order_id}-1 opened: {summary}"


@dataclasses.dataclass
class SupportDemo:
    """The demo graph builder and its doubles."""

    builder: StateGraph[Any, Any, Any, Any]
    model: ScriptedChatModel
    clock: FakeClock
    tools: dict[str, BaseTool]


def _script() -> list[AIMessage]:
    return [
        tool_calls(
            ("lookup_order", {"order_id": 1042}),
            ("track_shipment", {"order_id": 1042}),
        ),
        tool_calls(("refund", {"order_id": 1042, "amount": 80.0, "currency": "USD"})),
        tool_calls(("escalate_to_human", {"order_id": 1042})),
        tool_calls(
            ("open_ticket", {"order_id": 1042, "summary": "refund of USD 80 needs approval"})
        ),
        text(
            "Your lamp (order 1042) was delivered on 27 November. A refund above USD 50 "
            "needs a supervisor, so I opened ticket T-1042-1; you will hear back within a day."
        ),
    ]


def build_demo(*, seed: int = 7) -> SupportDemo:
    """Build the support-agent graph with deterministic faults on its tools."""
    clock = FakeClock(epoch=time.time())
    tools: dict[str, BaseTool] = {
        "lookup_order": FaultyTool(
            lookup_order, [Fault.status(429, retry_after="2"), Fault.status(503)]
        ),
        "track_shipment": FaultyTool(track_shipment, [Fault.timeout()]),
        "refund": FaultyTool(refund),
        "open_ticket": FaultyTool(open_ticket),
    }
    model = ScriptedChatModel(responses=_script())

    def agent(state: DemoState) -> dict[str, list[BaseMessage]]:
        return {"messages": [model.invoke(state["messages"])]}

    async def aagent(state: DemoState) -> dict[str, list[BaseMessage]]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(DemoState)
    builder.add_node("agent", RunnableLambda(agent, afunc=aagent))
    builder.add_edge(START, "agent")
    add_resilience(
        builder,
        agent="agent",
        tools=list(tools.values()),
        policy=ResiliencePolicy(max_attempts=3, base_delay=0.5, max_delay=10),
        profiles={"refund": ToolProfile(side_effect=True)},
        clock=clock,
        rng=random.Random(seed),
    )
    return SupportDemo(builder=builder, model=model, clock=clock, tools=tools)
