"""A user process for the `create_agent` tests: LangChain's agent with
`ResilienceMiddleware`, on LangGraph's own ``PostgresSaver`` (the ledger of side
effects follows it: nothing else is wired).

Phases: ``start`` runs a new thread and, with ``--kill-at``, hangs at that point
(after writing a marker file) so the test can SIGKILL it: ``before`` the refund row
is inserted, ``after`` it (before the tools step is checkpointed), ``completed``
once it is. ``resume`` continues the thread by thread_id (``invoke(None)``);
``answer`` resumes an escalation with ``Command(resume={"action": ...})``. ``--ask
audit`` calls a tool a 403 refuses in the ``start`` process (POLICY: escalated). With
``--flaky`` the lookup tool fails with 503 on every attempt, each recorded in the
``attempts`` table, and hangs on its ``--hang-on``-th attempt of this process.
Prints JSON: the last message, the pending interrupts and the ledger's attempts.
``--direct`` makes the refund ``return_direct`` (the turn ends after its tools);
``--model-down`` fails every model call with a 503 (the run raises once the
middleware gives up, and the JSON says which error).
With ``--stay FILE`` the worker, its turn done, writes the marker and lives on until
FILE exists, its collector off (a busy server's often has not reached a finished run):
a worker that keeps serving while the thread's next turn goes to another.
Runs use ``durability="sync"``, as the README asks of graphs with side effects.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import pathlib
import sys
import time
from typing import Any

import psycopg
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.types import Command
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from langgraph_resilience import (
    ResilienceMiddleware,
    ResiliencePolicy,
    ToolProfile,
    current_idempotency_key,
)
from langgraph_resilience.stores import EffectStatus
from langgraph_resilience.stores.persistence import POSTGRES_CONNECTION_KWARGS
from langgraph_resilience.testing import FakeClock, FakeHTTPError, ScriptedChatModel, text
from langgraph_resilience.testing import tool_calls as calls


def hang(marker: pathlib.Path, what: str) -> None:
    marker.write_text(what)
    time.sleep(120)  # the test SIGKILLs the process here: a real hang, not a clock


def build(
    dsn: str,
    saver: Any,
    *,
    kill_at: str,
    marker: pathlib.Path,
    hang_on: int,
    forbid: bool,
    in_step: bool = True,
    direct: bool = False,
    model_down: bool = False,
) -> Any:
    attempts_here = [0]

    def turn(messages: list[BaseMessage]) -> AIMessage:
        if model_down:
            raise FakeHTTPError(503)
        if any(isinstance(m, ToolMessage) for m in messages):
            if kill_at == "completed":
                hang(marker, "completed")
            return text("done")
        wanted = next(m for m in messages if m.type == "human").content
        if wanted in ("lookup", "audit"):
            return calls((wanted, {"order_id": "A1"}))
        return calls(("refund", {"order_id": "A1"}))

    @tool(return_direct=direct)
    def refund(order_id: str) -> str:
        """Refund an order."""
        if kill_at == "before":
            hang(marker, "before")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO refunds (key, order_id) VALUES (%s, %s)",
                (current_idempotency_key(), order_id),
            )
        if kill_at == "after":
            hang(marker, "after")
        return f"refunded {order_id}"

    @tool
    def lookup(order_id: str) -> str:
        """Look up an order (down: 503, or 403 for order F1)."""
        attempts_here[0] += 1
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO attempts (pid) VALUES (pg_backend_pid())")
        if attempts_here[0] == hang_on:
            hang(marker, "attempt")
        raise FakeHTTPError(503)

    @tool
    def audit(order_id: str) -> str:
        """Audit an order (forbidden until a human approves)."""
        if forbid:
            raise FakeHTTPError(403)
        return f"audited {order_id}"

    def status(key: str) -> EffectStatus:
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT order_id FROM refunds WHERE key = %s", (key,)).fetchone()
        return EffectStatus(done=row is not None, result=f"refunded {row[0]}" if row else None)

    middleware = ResilienceMiddleware(
        clock=FakeClock(epoch=time.time()),
        policy=ResiliencePolicy(max_attempts=3, inline_retry_max_wait=1.0 if in_step else None),
        profiles={"refund": ToolProfile(side_effect=True, status_check=status)},
        escalate=True,
    )
    model = ScriptedChatModel(responses=[turn] * 6)
    return create_agent(model, [refund, lookup, audit], middleware=[middleware], checkpointer=saver)


def summary(state: Any) -> dict[str, Any]:
    ledger = state.values.get("resilience") or {}
    return {
        "last": state.values["messages"][-1].content,
        "interrupts": len(state.interrupts),
        "attempts": sorted(r["attempts"] for r in (ledger.get("calls") or {}).values()),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("phase", choices=["start", "resume", "answer"])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--thread", required=True)
    parser.add_argument("--marker", required=True)
    parser.add_argument("--kill-at", choices=["before", "after", "completed", "none"])
    parser.add_argument("--ask", default="refund")
    parser.add_argument("--hang-on", type=int, default=0)
    parser.add_argument("--mode", choices=["sync", "async"], default="sync")
    parser.add_argument("--action", default="retry")
    parser.add_argument(
        "--no-in-step", action="store_true", help="every retry through a checkpointed step"
    )
    parser.add_argument("--stay", help="after the turn, live on until this file exists")
    parser.add_argument("--direct", action="store_true", help="the refund returns directly")
    parser.add_argument("--model-down", action="store_true", help="every model call: 503")
    args = parser.parse_args()
    kill_at = args.kill_at if args.phase == "start" else "none"
    marker = pathlib.Path(args.marker)
    config = {"configurable": {"thread_id": args.thread}}
    inp: Any = {"messages": [("user", args.ask)]} if args.phase == "start" else None
    if args.phase == "answer":
        inp = Command(resume={"action": args.action})
    forbid = args.phase == "start"
    options = {"kill_at": kill_at, "marker": marker, "hang_on": args.hang_on, "forbid": forbid}
    options["in_step"] = not args.no_in_step
    options["direct"] = args.direct
    options["model_down"] = args.model_down
    if args.mode == "sync":
        with ConnectionPool(args.dsn, kwargs=POSTGRES_CONNECTION_KWARGS) as pool:
            saver = PostgresSaver(pool)
            saver.setup()
            app = build(args.dsn, saver, **options)
            try:
                app.invoke(inp, config, durability="sync")
                failed = None
            except FakeHTTPError as exc:  # --model-down: the middleware gave up
                failed = type(exc).__name__
            result = {**summary(app.get_state(config)), "error": failed}
    else:

        async def run() -> dict[str, Any]:
            pool = AsyncConnectionPool(args.dsn, kwargs=POSTGRES_CONNECTION_KWARGS, open=False)
            await pool.open()
            try:
                saver = AsyncPostgresSaver(pool)
                await saver.setup()
                app = build(args.dsn, saver, **options)
                try:
                    await app.ainvoke(inp, config, durability="sync")
                    failed = None
                except FakeHTTPError as exc:  # --model-down: the middleware gave up
                    failed = type(exc).__name__
                return {**summary(await app.aget_state(config)), "error": failed}
            finally:
                await pool.close()

        result = asyncio.run(run())
    if args.stay:
        stay(pathlib.Path(args.stay), marker)
    json.dump(result, sys.stdout)


def stay(until: pathlib.Path, marker: pathlib.Path) -> None:
    """Live on, serving nothing and collecting nothing, until the test says."""
    gc.disable()
    marker.write_text("turn done")
    deadline = time.monotonic() + 120
    while not until.exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # until the test writes the file (polling a file)


if __name__ == "__main__":
    main()
