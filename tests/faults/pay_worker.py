"""A worker process of the pooler scenarios: the fault suite's payment agent, run on a
thread under its lease, through whatever DSN it is given (straight or a pooler).

``--ready`` / ``--go``: after its imports, write the ready marker and wait for the go
file, so several workers start their ``open_postgres`` (and its setup) at once.
``--locked``: a marker written once the thread's lease is held (the test's clock for a
SIGKILL at a random point). The bank is reached over ``--bank`` (straight: it is the
payment service, someone else's system). Prints one JSON document: the thread's last
message and the lease token it ran under.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import random
import sys
import time
from typing import Any

from langgraph_resilience import aopen_postgres, open_postgres
from tests.faults.harness import Bank, build_app, config_of, user_input


def _barrier(ready: str | None, go: str | None) -> None:
    if ready is not None:
        pathlib.Path(ready).write_text("ready")
    if go is not None:
        deadline = time.monotonic() + 120
        while not pathlib.Path(go).exists():  # polling a file the test writes
            if time.monotonic() > deadline:
                raise TimeoutError("never told to go")
            time.sleep(0.005)


def _marked(path: str | None) -> None:
    if path is not None:
        pathlib.Path(path).write_text("locked")


def run_sync(args: argparse.Namespace, plan: list[int]) -> dict[str, Any]:
    bank = Bank(args.bank)
    options: Any = {"lease_ttl": args.ttl, "setup_timeout": args.setup_timeout}
    with open_postgres(args.dsn, **options) as p:
        app = build_app(p, bank, plan, mode="sync", rng=random.Random(args.seed), think=args.think)
        with p.thread_lock(args.thread, wait=args.wait) as lease:
            _marked(args.locked)
            app.invoke(user_input(plan), config_of(args.thread), durability="sync")
        last = app.get_state(config_of(args.thread)).values["messages"][-1].content
    return {"last": last, "token": getattr(lease, "token", None)}


async def run_async(args: argparse.Namespace, plan: list[int]) -> dict[str, Any]:
    bank = Bank(args.bank)
    options: Any = {"lease_ttl": args.ttl, "setup_timeout": args.setup_timeout}
    async with aopen_postgres(args.dsn, **options) as p:
        rng = random.Random(args.seed)
        app = build_app(p, bank, plan, mode="async", rng=rng, think=args.think)
        async with p.athread_lock(args.thread, wait=args.wait) as lease:
            _marked(args.locked)
            await app.ainvoke(user_input(plan), config_of(args.thread), durability="sync")
        state = await app.aget_state(config_of(args.thread))
    return {"last": state.values["messages"][-1].content, "token": getattr(lease, "token", None)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--bank", required=True)
    parser.add_argument("--thread", required=True)
    parser.add_argument("--plan", required=True, help="amounts, comma-separated")
    parser.add_argument("--mode", choices=["sync", "async"], default="sync")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--think", type=float, default=0.0)
    parser.add_argument("--ttl", type=float, default=30.0)
    parser.add_argument("--wait", type=float, default=0.0)
    parser.add_argument("--setup-timeout", type=float, default=60.0)
    parser.add_argument("--ready")
    parser.add_argument("--go")
    parser.add_argument("--locked")
    args = parser.parse_args()
    plan = [int(a) for a in args.plan.split(",")]
    _barrier(args.ready, args.go)
    result = run_sync(args, plan) if args.mode == "sync" else asyncio.run(run_async(args, plan))
    json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
