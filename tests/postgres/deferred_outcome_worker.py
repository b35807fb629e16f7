"""A user process for the deferred-outcome test: a payment agent on PostgresSaver whose
ledger defers the outcome of the payment, killed between the effect and that write.

``start`` pays, then the ledger's writer thread SIGKILLs the process the moment it would
write the outcome (the checkpointer is held so the tools step is never saved either):
the effect happened, nothing recorded it. ``resume`` continues the thread from its
checkpoint with the same graph and prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import sys
import threading
from typing import Any

import psycopg
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import MessagesState, StateGraph
from psycopg_pool import ConnectionPool

from langgraph_resilience import (
    ResilienceState,
    ToolProfile,
    add_resilience,
    current_idempotency_key,
)
from langgraph_resilience.stores import EffectStatus
from langgraph_resilience.stores.persistence import POSTGRES_CONNECTION_KWARGS
from langgraph_resilience.stores.postgres_ledger import (
    PostgresIdempotencyStore,
    PostgresSagaLog,
)
from langgraph_resilience.testing import FakeClock, ScriptedChatModel, text, tool_calls

PAID = threading.Event()


class State(MessagesState, ResilienceState):
    pass


class HeldSaver(PostgresSaver):
    """Saves nothing once the payment happened: the tools step is never checkpointed."""

    def put_writes(self, *args: Any, **kwargs: Any) -> None:
        if PAID.is_set():
            threading.Event().wait()  # held until the process is killed
        super().put_writes(*args, **kwargs)

    def put(self, *args: Any, **kwargs: Any) -> Any:
        if PAID.is_set():
            threading.Event().wait()
        return super().put(*args, **kwargs)


def build(dsn: str, pool: ConnectionPool[Any], marker: pathlib.Path, *, kill: bool) -> Any:
    def turn(messages: list[BaseMessage]) -> AIMessage:
        if any(isinstance(m, ToolMessage) for m in messages):
            return text("paid")
        return tool_calls(("charge", {"amount": 30}))

    model = ScriptedChatModel(responses=[turn] * 4)

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    @tool
    def charge(amount: int) -> str:
        """Charge the customer's card."""
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO payments (key, amount) VALUES (%s, %s)",
                (current_idempotency_key(), amount),
            )
        if kill:
            PAID.set()
        return f"charged {amount}"

    def status(key: str) -> EffectStatus:
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT amount FROM payments WHERE key = %s", (key,)).fetchone()
        return EffectStatus(done=row is not None, result=f"reconciled {row[0]}" if row else None)

    ledger = PostgresIdempotencyStore(pool, deferred_outcomes=True)
    if kill:
        behind = ledger._behind
        assert behind is not None

        def killed(key: str, result: Any, status: str) -> None:
            marker.write_text(key)
            os.kill(os.getpid(), signal.SIGKILL)

        behind._write = killed
    builder = StateGraph(State)
    builder.add_node("agent", agent)
    add_resilience(
        builder,
        agent="agent",
        tools=[charge],
        clock=FakeClock(),
        profiles={"charge": ToolProfile(side_effect=True, status_check=status)},
        idempotency=ledger,
        saga=PostgresSagaLog(pool),
    )
    saver = HeldSaver(pool) if kill else PostgresSaver(pool)
    return builder.compile(checkpointer=saver)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("phase", choices=["start", "resume"])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--thread", required=True)
    parser.add_argument("--marker", required=True)
    args = parser.parse_args()
    config = {"configurable": {"thread_id": args.thread}}
    with ConnectionPool(args.dsn, kwargs=POSTGRES_CONNECTION_KWARGS, max_size=4) as pool:
        kill = args.phase == "start"
        app = build(args.dsn, pool, pathlib.Path(args.marker), kill=kill)
        if kill:
            app.invoke({"messages": [("user", "pay 30")]}, config, durability="sync")
            result: dict[str, Any] = {"error": "not killed"}
        else:
            state = app.invoke(None, config)
            result = {"last": state["messages"][-1].content}
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
