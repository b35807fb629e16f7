"""Add resilience to an agent built with LangChain's `create_agent`: one middleware.

`create_agent(model, tools)` is how most new agents are built. With
``middleware=[ResilienceMiddleware(...)]`` (marked ``(resilience)`` below) every
failing tool call is classified and recovered as `add_resilience` does it, from
the same code: the order lookup answers 503, then 429 with ``Retry-After: 2``
(retried after exactly 2 s), the refund is a side effect that runs once, and the
audit tool answers 403, which is not for a machine to retry: the run stops for a
human (``interrupt``) and resumes with ``Command(resume={"action": "retry"})``.
The model's own failures are retried too (its first call gets a 503 here).

The script runs offline: a `ScriptedChatModel` stands in for your chat model,
`FaultyTool` injects the faults, and a `FakeClock` keeps time (drop ``clock=`` to
wait for real). Use your model, e.g. ``ChatOpenAI(model="gpt-4o", max_retries=0)``.

Run it from the repository root:

    python examples/create_agent_middleware.py
"""

from __future__ import annotations

import sys

from langchain.agents import create_agent
from langchain_core.messages import ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from langgraph_resilience import ResilienceMiddleware, ToolProfile, tool_error_of
from langgraph_resilience.testing import (
    FakeClock,
    FakeHTTPError,
    Fault,
    FaultyTool,
    ScriptedChatModel,
    text,
    tool_calls,
)

refunds: list[str] = []


@tool
def lookup_order(order_id: str) -> str:
    """The order's status."""
    return f"order {order_id}: delivered, 49.00 EUR"


@tool
def refund(order_id: str, amount: float) -> str:
    """Refund an order (a side effect: it must happen once)."""
    refunds.append(order_id)
    return f"refunded {amount:.2f} EUR for {order_id}"


@tool
def audit(order_id: str) -> str:
    """Record the refund in the audit log (needs a supervisor's grant)."""
    return f"audited {order_id}"


TOOLS = [
    FaultyTool(lookup_order, [Fault.status(503), Fault.status(429, retry_after="2")]),
    refund,
    FaultyTool(audit, [Fault.status(403)]),
]
model = ScriptedChatModel(
    responses=[
        FakeHTTPError(503),  # the model's provider fails once, too
        tool_calls(("lookup_order", {"order_id": "A-17"})),
        tool_calls(
            ("refund", {"order_id": "A-17", "amount": 49.0}), ("audit", {"order_id": "A-17"})
        ),
        text("A-17 is refunded (49.00 EUR) and audited."),
    ]
)
clock = FakeClock()

agent = create_agent(
    model,
    TOOLS,
    middleware=[  # (resilience)
        ResilienceMiddleware(
            profiles={"refund": ToolProfile(side_effect=True)},
            escalate=True,  # a 403 asks a human instead of failing the task
            clock=clock,  # offline only: the default is the system clock
        )
    ],
    checkpointer=InMemorySaver(),  # (resilience) budgets and the ledger live here
)


def main() -> int:
    config = {"configurable": {"thread_id": "create-agent-example"}}
    started = clock.time()
    agent.invoke({"messages": [("user", "Refund order A-17, please.")]}, config)
    [question] = agent.get_state(config).interrupts
    asked = question.value
    print(f"asked a human: {asked['tool']}({asked['args']}) failed ({asked['reason']})")
    agent.invoke(Command(resume={"action": "retry"}), config)  # the supervisor approves
    state = agent.get_state(config).values
    results = [m for m in state["messages"] if isinstance(m, ToolMessage)]
    failed = [m for m in results if tool_error_of(m) is not None]
    print("answer:", state["messages"][-1].content)
    print(f"tool results: {len(results) - len(failed)} ok, {len(failed)} failed")
    print(f"refunds made: {len(refunds)}; waited {clock.time() - started:.1f} s (virtual)")
    return 1 if failed or refunds != ["A-17"] else 0


if __name__ == "__main__":
    sys.exit(main())
