"""A separate process for the ledger tests: claims, thread locks, compensation, approval.

Each subcommand prints one JSON line on stdout. Commands that must be killed at
a known point write a marker file there and then block until SIGKILL.

- ``claim``: wait at a Postgres barrier (a shared advisory lock the test holds
  exclusively), then claim one key.
- ``hold-lock``: take a thread's run lock (a lease of ``--ttl`` seconds), write the
  marker, block.
- ``try-lock``: try a thread's run lock (waiting ``--wait`` seconds); report
  ``acquired`` or ``busy``.
- ``compensate``: compensate a thread; with ``--block-on`` the compensator of
  that effect writes the marker and blocks, before or after its own effect.
- ``approve-start`` / ``approve-resume``: a graph that asks a human (``interrupt``)
  and then charges once through the ledger; started in one process, resumed in
  another with ``Command(resume=...)``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import pathlib
import sys
import threading
from typing import Any

import psycopg
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from typing_extensions import TypedDict

from langgraph_resilience.core.canonical import canonical_args
from langgraph_resilience.core.compensation import acompensate_thread, compensate_thread
from langgraph_resilience.core.effects import (
    EffectStatus,
    IdempotencyStore,
    compensation_key,
    idempotency_key,
)
from langgraph_resilience.errors import ThreadBusyError
from langgraph_resilience.stores.locks import thread_lock
from langgraph_resilience.stores.persistence import (
    POSTGRES_CONNECTION_KWARGS,
    Persistence,
    aopen_postgres,
    open_postgres,
)
from langgraph_resilience.stores.postgres_ledger import PostgresIdempotencyStore
from langgraph_resilience.stores.threads import (
    aresume,
    athread_status,
    resume,
    thread_status,
)

BARRIER_KEY = 4242


def _block_until_killed(marker: pathlib.Path, text: str = "") -> None:
    marker.write_text(text)
    threading.Event().wait()


def cmd_claim(args: argparse.Namespace) -> dict[str, Any]:
    with psycopg.connect(args.dsn, **POSTGRES_CONNECTION_KWARGS) as conn:
        store = PostgresIdempotencyStore(conn)
        conn.execute("SELECT pg_advisory_lock_shared(%s)", (BARRIER_KEY,))
        conn.execute("SELECT pg_advisory_unlock_shared(%s)", (BARRIER_KEY,))
        claim = store.claim(args.key, tool="pay", args_json='{"amount":5}', thread_id="t")
    return {"state": claim.state}


def cmd_hold_lock(args: argparse.Namespace) -> dict[str, Any]:
    with thread_lock(args.dsn, args.thread, ttl=args.ttl):
        _block_until_killed(pathlib.Path(args.marker))
    return {}


def cmd_try_lock(args: argparse.Namespace) -> dict[str, Any]:
    try:
        with thread_lock(args.dsn, args.thread, wait=args.wait):
            return {"acquired": True}
    except ThreadBusyError as exc:
        return {"acquired": False, "error": str(exc), "thread_id": exc.thread_id}


# ------------------------------------------------------------------ compensation


def _compensation_handlers(
    dsn: str, block_on: str | None, placement: str, marker: pathlib.Path
) -> tuple[dict[str, Any], dict[str, Any]]:
    def refund(key: str, recorded: Any) -> dict[str, Any]:
        if key == block_on and placement == "before":
            _block_until_killed(marker, key)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO refunds (comp_key, payment) VALUES (%s, %s)",
                (compensation_key(key), recorded["payment_id"]),
            )
        if key == block_on and placement == "after":
            _block_until_killed(marker, key)
        return {"refunded": recorded["payment_id"]}

    def refund_status(comp_key: str) -> EffectStatus:
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute("SELECT payment FROM refunds WHERE comp_key = %s", (comp_key,))
            found = row.fetchone()
        return EffectStatus(done=found is not None, result={"refunded": found and found[0]})

    return {"pay": refund}, {"pay": refund_status}


def cmd_compensate(args: argparse.Namespace) -> dict[str, Any]:
    compensators, checks = _compensation_handlers(
        args.dsn, args.block_on, args.placement, pathlib.Path(args.marker)
    )
    if args.mode == "sync":
        with open_postgres(args.dsn, setup=False) as p:
            report = compensate_thread(
                args.thread,
                store=p.idempotency,
                saga=p.saga,
                compensators=compensators,
                status_checks=checks,
            )
    else:

        async def run() -> Any:
            async with aopen_postgres(args.dsn, setup=False) as p:
                return await acompensate_thread(
                    args.thread,
                    store=p.idempotency,
                    saga=p.saga,
                    compensators=compensators,
                    status_checks=checks,
                )

        report = asyncio.run(run())
    return {"ok": report.ok, "steps": [dataclasses.asdict(s) for s in report.steps]}


# ------------------------------------------------------------------ approval graph


class Order(TypedDict, total=False):
    order: str
    decision: str
    charged: Any


def build_approval(dsn: str, ledger: IdempotencyStore) -> StateGraph[Any, Any, Any, Any]:
    """ask (interrupt for a human) -> charge (once, through the ledger) -> END."""

    def ask(state: Order) -> Order:
        decision = interrupt({"question": "charge this order?", "order": state["order"]})
        return {"decision": decision}

    def charge(state: Order, config: RunnableConfig) -> Order:
        if state["decision"] != "yes":
            return {"charged": None}
        thread_id = config["configurable"]["thread_id"]
        args = {"order": state["order"], "amount": 42}
        key = idempotency_key("charge", args, thread_id=thread_id, call_identity="charge-1")
        claim = ledger.claim(
            key, tool="charge", args_json=canonical_args(args), thread_id=thread_id
        )
        if claim.state != "new":
            return {"charged": claim.result}
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO payments (key, order_id) VALUES (%s, %s)", (key, state["order"])
            )
        result = {"payment": key}
        ledger.record_outcome(key, result)
        return {"charged": result}

    builder: StateGraph[Any, Any, Any, Any] = StateGraph(Order)
    builder.add_node("ask", ask)
    builder.add_node("charge", charge)
    builder.add_edge(START, "ask")
    builder.add_edge("ask", "charge")
    builder.add_edge("charge", END)
    return builder


def _status(p: Persistence, app: Any, thread: str) -> dict[str, Any]:
    return dataclasses.asdict(thread_status(app, thread, persistence=p))


def cmd_approve_start(args: argparse.Namespace) -> dict[str, Any]:
    with open_postgres(args.dsn, setup=False) as p:
        app = build_approval(args.dsn, p.idempotency).compile(checkpointer=p.checkpointer)
        config = {"configurable": {"thread_id": args.thread}}
        with p.thread_lock(args.thread):
            app.invoke({"order": "o-17"}, config, durability="sync")
        return _status(p, app, args.thread)


def cmd_approve_resume(args: argparse.Namespace) -> dict[str, Any]:
    command = Command(resume=args.decision)
    if args.mode == "sync":
        with open_postgres(args.dsn, setup=False) as p:
            app = build_approval(args.dsn, p.idempotency).compile(checkpointer=p.checkpointer)
            values = resume(app, args.thread, command=command, lock=p)
            return {"values": values, "status": _status(p, app, args.thread)}

    async def run() -> dict[str, Any]:
        async with aopen_postgres(args.dsn, setup=False) as p:
            app = build_approval(args.dsn, p.idempotency).compile(checkpointer=p.checkpointer)
            values = await aresume(app, args.thread, command=command, lock=p)
            status = await athread_status(app, args.thread, persistence=p)
            return {"values": values, "status": dataclasses.asdict(status)}

    return asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "command",
        choices=["claim", "hold-lock", "try-lock", "compensate", "approve-start", "approve-resume"],
    )
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--key", default="k")
    parser.add_argument("--thread", default="t")
    parser.add_argument("--marker", default="marker")
    parser.add_argument("--block-on")
    parser.add_argument("--placement", choices=["before", "after"], default="before")
    parser.add_argument("--mode", choices=["sync", "async"], default="sync")
    parser.add_argument("--decision", default="yes")
    parser.add_argument("--ttl", type=float, default=None)
    parser.add_argument("--wait", type=float, default=0.0)
    args = parser.parse_args()
    handler = {
        "claim": cmd_claim,
        "hold-lock": cmd_hold_lock,
        "try-lock": cmd_try_lock,
        "compensate": cmd_compensate,
        "approve-start": cmd_approve_start,
        "approve-resume": cmd_approve_resume,
    }[args.command]
    json.dump(handler(args), sys.stdout, default=str)


if __name__ == "__main__":
    main()
