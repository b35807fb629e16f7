"""A user process for the fencing tests: look something up, then pay, under the thread lock.

``start --block`` blocks inside the lookup (after writing a marker file) until a
release file appears, so the test can make this process's thread lease lapse
meanwhile. ``resume`` continues the thread by thread_id. Either prints
JSON: the thread's last message, or ``{"lost": true}`` when the run stopped because
its lease was lost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import sys
import time
from typing import Any

import psycopg
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import tool
from langgraph.graph import MessagesState, StateGraph

from langgraph_resilience import (
    ResilienceState,
    ToolProfile,
    add_resilience,
    aopen_postgres,
    aresume,
    current_idempotency_key,
    open_postgres,
    resume,
)
from langgraph_resilience.errors import ThreadLockLostError
from langgraph_resilience.stores import Persistence
from langgraph_resilience.testing import FakeClock, ScriptedChatModel, text, tool_calls


class State(MessagesState, ResilienceState):
    pass


def build(dsn: str, p: Persistence, *, block: pathlib.Path | None) -> Any:
    def agent_turn(messages: list[BaseMessage]) -> AIMessage:
        answered = [m.name for m in messages if isinstance(m, ToolMessage)]
        if "pay" in answered:
            return text("paid")
        if "lookup" in answered:
            return tool_calls(("pay", {"amount": 30}))
        return tool_calls(("lookup", {"order": 42}))

    @tool
    def lookup(order: int) -> str:
        """Look the order up."""
        if block is not None:
            block.with_suffix(".blocked").write_text("blocked")
            while not block.exists():  # polling a file another process writes
                time.sleep(0.02)
        return f"order {order}: 30 EUR"

    @tool
    def pay(amount: int) -> str:
        """Charge the customer's card."""
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO payments (key, amount) VALUES (%s, %s)",
                (current_idempotency_key(), amount),
            )
        return f"paid {amount}"

    model = ScriptedChatModel(responses=[agent_turn] * 6)
    builder = StateGraph(State)
    builder.add_node(
        "agent",
        RunnableLambda(
            lambda s: {"messages": [model.invoke(s["messages"])]},
            afunc=lambda s: _acall(model, s),
        ),
    )
    add_resilience(
        builder,
        agent="agent",
        tools=[lookup, pay],
        clock=FakeClock(epoch=time.time()),
        profiles={"pay": ToolProfile(side_effect=True)},
    )
    return builder.compile(checkpointer=p.checkpointer)


async def _acall(model: ScriptedChatModel, state: Any) -> dict[str, Any]:
    return {"messages": [await model.ainvoke(state["messages"])]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("phase", choices=["start", "resume"])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--thread", required=True)
    parser.add_argument("--block")
    parser.add_argument("--mode", choices=["sync", "async"], default="sync")
    args = parser.parse_args()
    block = pathlib.Path(args.block) if args.block else None
    config = {"configurable": {"thread_id": args.thread}}
    inp = {"messages": [("user", "pay order 42")]}
    try:
        if args.mode == "sync":
            with open_postgres(args.dsn) as p:
                app = build(args.dsn, p, block=block)
                if args.phase == "start":
                    with p.thread_lock(args.thread):
                        app.invoke(inp, config, durability="sync")
                else:
                    resume(app, args.thread, lock=p, wait=30)
                result: dict[str, Any] = {
                    "last": app.get_state(config).values["messages"][-1].content
                }
        else:

            async def run() -> dict[str, Any]:
                async with aopen_postgres(args.dsn) as p:
                    app = build(args.dsn, p, block=block)
                    if args.phase == "start":
                        async with p.athread_lock(args.thread):
                            await app.ainvoke(inp, config, durability="sync")
                    else:
                        await aresume(app, args.thread, lock=p, wait=30)
                    state = await app.aget_state(config)
                    return {"last": state.values["messages"][-1].content}

            result = asyncio.run(run())
    except ThreadLockLostError:
        result = {"lost": True}
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
