"""A user process for the exactly-once tests: a payment agent on Postgres.

``start`` runs a new thread and, with ``--kill-at``, hangs at that point (after
writing a marker file) so the test can SIGKILL it: ``before`` the payment row is
inserted, ``after`` it is inserted but before the tools step is checkpointed, or
once the tools step ``completed``. ``resume`` continues the thread by thread_id
under the thread lock and prints JSON (``{"busy": true}`` if another runner holds it).

``--slow [SECONDS]`` holds the payment in flight (3 s) after writing ``running``;
``--timeout`` gives the tool a timeout (and the graph the system clock, so waits for
an attempt in flight are real).

``--late-save SECONDS`` delays, in ``start``, every save of the model's step (its
checkpoint and its task's writes) by that long, as a loaded database does under
LangGraph's default ``durability="async"``: the payment must wait for the save.

``--wiring`` says how the user wired the ledger: ``explicit`` passes
``idempotency=``/``saga=`` from `open_postgres`; ``default`` passes nothing next to
`open_postgres`'s checkpointer; ``saver`` passes nothing next to LangGraph's own
``PostgresSaver`` on a pool of the user's (the ledger must follow it, safe by default).
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
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph import MessagesState, StateGraph
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from langgraph_resilience import (
    ResilienceState,
    ThreadBusyError,
    ToolProfile,
    add_resilience,
    aopen_postgres,
    aresume,
    current_idempotency_key,
    open_postgres,
    resume,
)
from langgraph_resilience.core import SystemClock
from langgraph_resilience.errors import ThreadLockLostError
from langgraph_resilience.stores import EffectStatus, Persistence
from langgraph_resilience.stores.persistence import POSTGRES_CONNECTION_KWARGS
from langgraph_resilience.testing import FakeClock, ScriptedChatModel, text, tool_calls


class State(MessagesState, ResilienceState):
    pass


def hang(marker: pathlib.Path, what: str) -> None:
    marker.write_text(what)
    time.sleep(120)  # the test SIGKILLs the process here: a real hang, not a clock


def save_late(seconds: float) -> None:
    """Delay the saves of the model's step (step 1's checkpoint, the writes that route
    to the tools) on every Postgres saver of this process: a real wait, as a slow disk."""

    def late(metadata: Any = None, writes: Any = ()) -> bool:
        return (metadata or {}).get("step", -1) >= 1 or any(
            c == "branch:to:tools" for c, _ in writes
        )

    put, put_writes = PostgresSaver.put, PostgresSaver.put_writes
    aput, aput_writes = AsyncPostgresSaver.aput, AsyncPostgresSaver.aput_writes

    def slow_put(self: Any, config: Any, checkpoint: Any, metadata: Any, versions: Any) -> Any:
        if late(metadata=metadata):
            time.sleep(seconds)
        return put(self, config, checkpoint, metadata, versions)

    def slow_put_writes(self: Any, config: Any, writes: Any, *rest: Any) -> Any:
        if late(writes=writes):
            time.sleep(seconds)
        return put_writes(self, config, writes, *rest)

    async def slow_aput(
        self: Any, config: Any, checkpoint: Any, metadata: Any, versions: Any
    ) -> Any:
        if late(metadata=metadata):
            await asyncio.sleep(seconds)
        return await aput(self, config, checkpoint, metadata, versions)

    async def slow_aput_writes(self: Any, config: Any, writes: Any, *rest: Any) -> Any:
        if late(writes=writes):
            await asyncio.sleep(seconds)
        return await aput_writes(self, config, writes, *rest)

    PostgresSaver.put, PostgresSaver.put_writes = slow_put, slow_put_writes  # type: ignore[method-assign]
    AsyncPostgresSaver.aput = slow_aput  # type: ignore[method-assign]
    AsyncPostgresSaver.aput_writes = slow_aput_writes  # type: ignore[method-assign]


def build(
    dsn: str,
    p: Persistence,
    *,
    kill_at: str,
    marker: pathlib.Path,
    slow: float,
    hold_until: pathlib.Path | None = None,
    wiring: str = "explicit",
    checkpointer: Any = None,
    timeout: float | None = None,
) -> Any:
    def agent_turn(messages: list[BaseMessage]) -> AIMessage:
        if any(isinstance(m, ToolMessage) for m in messages):
            if kill_at == "completed":
                hang(marker, "completed")
            return text("paid")
        return tool_calls(("charge", {"amount": 30}))

    @tool
    def charge(amount: int) -> str:
        """Charge the customer's card."""
        if kill_at == "before":
            hang(marker, "before")
        if slow:
            marker.write_text("running")
            time.sleep(slow)  # in flight while a second runner tries (a real wait)
        if hold_until is not None:
            marker.write_text("running")
            deadline = time.monotonic() + 120
            while not hold_until.exists() and time.monotonic() < deadline:
                time.sleep(0.05)  # in flight until the test says (polling a file)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO payments (key, amount) VALUES (%s, %s)",
                (current_idempotency_key(), amount),
            )
        if kill_at == "after":
            hang(marker, "after")
        return f"charged {amount}"

    def status(key: str) -> EffectStatus:
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT amount FROM payments WHERE key = %s", (key,)).fetchone()
        return EffectStatus(done=row is not None, result=f"charged {row[0]}" if row else None)

    model = ScriptedChatModel(responses=[agent_turn] * 4)
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
        tools=[charge],
        # with a timeout, waits for an attempt in flight are real: the system clock
        clock=FakeClock(epoch=time.time()) if timeout is None else SystemClock(),
        profiles={"charge": ToolProfile(side_effect=True, status_check=status, timeout=timeout)},
        **({"idempotency": p.idempotency, "saga": p.saga} if wiring == "explicit" else {}),
    )
    return builder.compile(checkpointer=checkpointer or p.checkpointer, store=p.store)


async def _acall(model: ScriptedChatModel, state: Any) -> dict[str, Any]:
    return {"messages": [await model.ainvoke(state["messages"])]}


def summary(state: Any) -> dict[str, Any]:
    return {"next": list(state.next), "last": state.values["messages"][-1].content}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("phase", choices=["start", "resume"])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--thread", required=True)
    parser.add_argument("--marker", required=True)
    parser.add_argument("--kill-at", choices=["before", "after", "completed", "none"])
    parser.add_argument("--mode", choices=["sync", "async"], default="sync")
    parser.add_argument("--slow", type=float, nargs="?", const=3.0, default=0.0)
    parser.add_argument("--timeout", type=float, default=None)
    parser.add_argument("--wiring", choices=["explicit", "default", "saver"], default="explicit")
    parser.add_argument("--late-save", type=float, default=0.0)
    parser.add_argument("--hold-until", default=None, help="in flight until this file exists")
    args = parser.parse_args()
    if args.late_save and args.phase == "start":
        save_late(args.late_save)
    kill_at = args.kill_at if args.phase == "start" else "none"
    marker = pathlib.Path(args.marker)
    hold_until = pathlib.Path(args.hold_until) if args.hold_until else None
    config = {"configurable": {"thread_id": args.thread}}
    inp = {"messages": [("user", "pay 30")]}
    try:
        if args.mode == "sync":
            with open_postgres(args.dsn) as p:
                pool = ConnectionPool(args.dsn, kwargs=POSTGRES_CONNECTION_KWARGS)
                saver = PostgresSaver(pool)
                app = build(
                    args.dsn,
                    p,
                    kill_at=kill_at,
                    marker=marker,
                    slow=args.slow,
                    hold_until=hold_until,
                    wiring=args.wiring,
                    checkpointer=saver if args.wiring == "saver" else None,
                    timeout=args.timeout,
                )
                if args.phase == "start":
                    app.invoke(inp, config)
                else:
                    resume(app, args.thread, lock=p)
                result = summary(app.get_state(config))
        else:

            async def run() -> dict[str, Any]:
                async with (
                    aopen_postgres(args.dsn) as p,
                    AsyncConnectionPool(
                        args.dsn, kwargs=POSTGRES_CONNECTION_KWARGS, open=False
                    ) as pool,
                ):
                    app = build(
                        args.dsn,
                        p,
                        kill_at=kill_at,
                        marker=marker,
                        slow=args.slow,
                        hold_until=hold_until,
                        wiring=args.wiring,
                        checkpointer=AsyncPostgresSaver(pool) if args.wiring == "saver" else None,
                        timeout=args.timeout,
                    )
                    if args.phase == "start":
                        await app.ainvoke(inp, config)
                    else:
                        await aresume(app, args.thread, lock=p)
                    return summary(await app.aget_state(config))

            result = asyncio.run(run())
    except ThreadLockLostError:  # another runner took the thread over meanwhile
        result = {"lost": True}
    except ThreadBusyError:
        result = {"busy": True}
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
