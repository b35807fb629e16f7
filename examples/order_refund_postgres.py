"""A side-effecting refund tool on PostgreSQL: exactly once, even when the response is lost.

A support agent refunds an order. The payment service performs the refund, but
its response never arrives (a timeout after the effect). Retrying blindly would
refund twice; giving up would tell the customer it failed when it did not. With
``ToolProfile(side_effect=True, status_check=...)`` the call is recorded in a
durable ledger under an idempotency key before it runs; the timeout makes its
outcome UNKNOWN, and the next attempt asks the service, by that key, whether the
refund happened, instead of refunding again. The tool reads the key with
`current_idempotency_key()` and passes it on (as real payment APIs take an
``Idempotency-Key`` header).

The checkpointer, store and ledger come from `open_postgres`, on the DSN in
``LANGGRAPH_RESILIENCE_DSN`` (its tables are created if missing). Without it the
script says so in one line and uses `open_sqlite` in a temporary directory: the
same code, the embedded default, and never a database you did not name. The script runs offline: the
model is a `ScriptedChatModel`, the lost response comes from `FaultyTool` and
time from a `FakeClock`; the payment service is an in-memory stand-in.

Run it from the repository root:

    python examples/order_refund_postgres.py

and on PostgreSQL with
``LANGGRAPH_RESILIENCE_DSN=postgresql://user:password@host:5432/db`` in the
environment.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import sys
import tempfile
import uuid
from collections.abc import Iterator
from typing import Any

from langchain_core.messages import ToolMessage
from langchain_core.tools import tool
from langgraph.graph import MessagesState, StateGraph

from langgraph_resilience import (
    EVENT_KEY,
    ResilienceState,
    ToolProfile,
    add_resilience,
    current_idempotency_key,
    open_postgres,
    open_sqlite,
    thread_status,
)
from langgraph_resilience.stores import EffectStatus, Persistence
from langgraph_resilience.testing import (
    FakeClock,
    Fault,
    FaultyTool,
    ScriptedChatModel,
    text,
    tool_calls,
)


class PaymentService:
    """Stand-in for the payment provider: it performs every refund it is asked for
    (it deduplicates nothing) and can be asked what happened under a key."""

    def __init__(self) -> None:
        self.refunds: dict[str, dict[str, Any]] = {}  # idempotency key -> refund

    def refund(self, key: str, order_id: int, amount: float) -> dict[str, Any]:
        """Refund `amount` on `order_id` (the real call would send ``Idempotency-Key``)."""
        refund = {"refund_id": f"re_{len(self.refunds) + 1}", "order": order_id, "amount": amount}
        self.refunds[key] = refund
        return refund

    def lookup(self, key: str) -> EffectStatus:
        """The status check: did a refund with this idempotency key happen?"""
        refund = self.refunds.get(key)
        return EffectStatus(done=refund is not None, result=refund)


service = PaymentService()


@tool
def lookup_order(order_id: int) -> dict[str, Any]:
    """Look up an order: its items, total and state."""
    return {"order": order_id, "item": "desk lamp", "total": 49.0, "state": "delivered"}


@tool
def refund_order(order_id: int, amount: float) -> dict[str, Any]:
    """Refund an amount on an order to the customer's card."""
    key = current_idempotency_key()
    assert key is not None  # set for every call of a side_effect=True tool
    return service.refund(key, order_id, amount)


# refund_order's response is lost once: the refund happens, then the call times out.
TOOLS = [lookup_order, FaultyTool(refund_order, [Fault.timeout(after_effect=True)])]
PROFILES = {"refund_order": ToolProfile(side_effect=True, status_check=service.lookup)}


class State(MessagesState, ResilienceState):
    """The agent's state: messages plus the resilience ledger."""


def build_app(p: Persistence) -> Any:
    """The support agent on persistence `p`: checkpoints and the effect ledger together."""
    model = ScriptedChatModel(
        responses=[
            tool_calls(("lookup_order", {"order_id": 1042})),
            tool_calls(("refund_order", {"order_id": 1042, "amount": 49.0})),
            text("Done: 49.00 is on its way back to your card."),
        ]
    )

    def agent(state: State) -> dict[str, Any]:
        return {"messages": [model.bind_tools(TOOLS).invoke(state["messages"])]}

    builder = StateGraph(State)
    builder.add_node("agent", agent)
    add_resilience(
        builder,
        agent="agent",
        tools=TOOLS,
        profiles=PROFILES,
        idempotency=p.idempotency,  # durable: next to the checkpoints
        saga=p.saga,
        clock=FakeClock(),  # offline only: the default is the system clock
    )
    return builder.compile(checkpointer=p.checkpointer, store=p.store)


@contextlib.contextmanager
def open_persistence() -> Iterator[Persistence]:
    """PostgreSQL at ``LANGGRAPH_RESILIENCE_DSN`` (the database you named), else embedded
    SQLite in a temporary directory: never a database nobody named."""
    dsn = os.environ.get("LANGGRAPH_RESILIENCE_DSN")
    with contextlib.ExitStack() as stack:
        if dsn is not None:
            p = stack.enter_context(open_postgres(dsn, timeout=5))
            print(f"persistence: PostgreSQL at {p.target}")
        else:
            state_dir = stack.enter_context(tempfile.TemporaryDirectory())
            p = stack.enter_context(open_sqlite(pathlib.Path(state_dir) / "threads.sqlite"))
            print(f"LANGGRAPH_RESILIENCE_DSN is not set: embedded SQLite at {p.target}")
        yield p


def main() -> int:
    """Refund once under a lost response; exit 1 if the service refunded any other number."""
    thread_id = f"refund-{uuid.uuid4().hex[:8]}"
    config = {"configurable": {"thread_id": thread_id}}
    with open_persistence() as p:
        app = build_app(p)
        request = {"messages": [("user", "My lamp arrived broken, please refund order 1042.")]}
        with p.thread_lock(thread_id):  # one runner per thread
            for chunk in app.stream(request, config, stream_mode="custom", durability="sync"):
                if EVENT_KEY in chunk and chunk[EVENT_KEY] != "route":
                    details = {k: v for k, v in chunk.items() if k not in (EVENT_KEY, "call_id")}
                    print(f"  {chunk[EVENT_KEY]:<16} {details}")

        messages = app.get_state(config).values["messages"]
        [refunded] = [
            m for m in messages if isinstance(m, ToolMessage) and m.name == "refund_order"
        ]
        print(f"\nrefund_order result: {refunded.content}")
        print(f"  how: {refunded.response_metadata.get('resilience')}")
        print(f"agent: {messages[-1].content}")
        print(f"\nrefunds the service made: {len(service.refunds)}")
        for record in p.idempotency.for_thread(thread_id):
            print(f"ledger: {record.key} {record.status} {record.result}")
        status = thread_status(app, thread_id, persistence=p)
        print(f"thread {thread_id}: {status.state}, side effects {status.effects}")
    return 0 if len(service.refunds) == 1 and status.state == "done" else 1


if __name__ == "__main__":
    sys.exit(main())
