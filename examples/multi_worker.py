"""Several workers sharing circuit breakers and checkpoints through PostgreSQL.

Two worker processes (``multiprocessing``, spawn) serve different users' threads
with the same agent graph, on one PostgreSQL database: the checkpointer (so any
worker can pick up any thread by its ``thread_id``) and a `PostgresBreakerStore`
(so what one worker learns about a dead upstream, every worker knows). The
``inventory`` service answers 503 to everything. Worker 1 retries until its call
fails, and that failed call trips the shared breaker (a breaker counts calls, not
attempts). Worker 2 then calls the same tool: the
breaker refuses the call before it executes, and the agent gets a STRUCTURAL
envelope with ``retry_after_ms`` at once, with no attempts and no backoff. The
parent process then reads both threads from the shared checkpointer.

The DSN is ``LANGGRAPH_RESILIENCE_DSN`` (tables are created if missing); without
it the script says so in one line and uses `open_sqlite` in a temporary directory,
so it never writes into a database you did not name. Without PostgreSQL, breakers
live in one process (`InMemoryBreakerStore`), so the workers then run as two threads
of this process sharing the store and the SQLite file. The script runs offline: the
model is a `ScriptedChatModel` and the outage comes from `FaultyTool`; the clock
is real, with backoff shortened to milliseconds.

Run it from the repository root:

    python examples/multi_worker.py
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pathlib
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from typing import Any

from langchain_core.messages import ToolMessage
from langchain_core.tools import tool
from langgraph.graph import MessagesState, StateGraph

from langgraph_resilience import (
    EVENT_KEY,
    BreakerConfig,
    ResiliencePolicy,
    ResilienceState,
    ToolProfile,
    add_resilience,
    open_postgres,
    open_sqlite,
    thread_status,
    tool_error_of,
)
from langgraph_resilience.core import SystemClock
from langgraph_resilience.stores import (
    BreakerStore,
    InMemoryBreakerStore,
    Persistence,
    PostgresBreakerStore,
)
from langgraph_resilience.testing import (
    Fault,
    FaultyTool,
    ScriptedChatModel,
    text,
    tool_calls,
)

BREAKER = BreakerConfig(minimum_calls=1, window_size=1, open_duration=60)
"""Demo-sized so that one failed call trips it (the default judges 30+ calls)."""
SHOWN_EVENTS = ("attempt", "retry_scheduled", "breaker", "gave_up")


@tool
def check_stock(sku: str) -> str:
    """How many items of a SKU the warehouse holds."""
    return f"{sku}: 12 in stock"


class State(MessagesState, ResilienceState):
    """The agent's state: messages plus the resilience ledger."""


def build_app(p: Persistence, breakers: BreakerStore, tools: list[Any], breaker_key: str) -> Any:
    """The agent graph every worker runs, on the shared persistence and breakers."""
    model = ScriptedChatModel(
        responses=[
            tool_calls(("check_stock", {"sku": "LAMP-7"})),
            text("I can't reach the warehouse right now; I'll check again shortly."),
        ]
    )

    def agent(state: State) -> dict[str, Any]:
        return {"messages": [model.bind_tools(tools).invoke(state["messages"])]}

    builder = StateGraph(State)
    builder.add_node("agent", agent)
    add_resilience(
        builder,
        agent="agent",
        tools=tools,
        # The breaker is named after the upstream, so tools on one host can share it;
        # the suffix makes every run of this script start with a closed breaker.
        profiles={"check_stock": ToolProfile(breaker_key=breaker_key)},
        breaker=BREAKER,
        breaker_store=breakers,
        idempotency=p.idempotency,
        saga=p.saga,
        # The real clock: a shared breaker compares wall-clock times across workers.
        # Backoff is shortened to milliseconds for the demo (the default starts at 0.5 s).
        policy=ResiliencePolicy(max_attempts=3, base_delay=0.01, max_delay=0.05),
        clock=SystemClock(),
    )
    return builder.compile(checkpointer=p.checkpointer, store=p.store)


def serve(
    worker: str, p: Persistence, breakers: BreakerStore, thread_id: str, key: str
) -> dict[str, Any]:
    """One worker serves one user's thread; returns what happened, for the report."""
    inventory = FaultyTool(check_stock, then=Fault.status(503))  # the upstream is down
    app = build_app(p, breakers, [inventory], key)
    config = {"configurable": {"thread_id": thread_id}}
    question = {"messages": [("user", "Is the LAMP-7 desk lamp in stock?")]}
    events = []
    with p.thread_lock(thread_id):  # one runner per thread
        for chunk in app.stream(question, config, stream_mode="custom", durability="sync"):
            if chunk.get(EVENT_KEY) in SHOWN_EVENTS:
                keep = ("tool", "key", "attempt", "failure_class", "error", "transition", "delay")
                details = {k: chunk[k] for k in keep if chunk.get(k) is not None}
                events.append(f"{chunk[EVENT_KEY]} {details}")
    messages = app.get_state(config).values["messages"]
    [result] = [m for m in messages if isinstance(m, ToolMessage)]
    error = tool_error_of(result)
    return {
        "worker": worker,
        "pid": os.getpid(),
        "thread_id": thread_id,
        "executions": inventory.calls,
        "events": events,
        "envelope": error.model_dump(
            mode="json", include={"type", "failure_class", "retry_after_ms"}
        )
        if error
        else None,
    }


# ------------------------------------------------------------------ PostgreSQL: processes


def postgres_worker(
    worker: str, dsn: str, thread_id: str, key: str, *, start_after: Any, then: Any, results: Any
) -> None:
    """A worker process: its own pool on the shared database (tables already set up)."""
    if start_after is not None:
        start_after.wait(timeout=120)
    with open_postgres(dsn, setup=False) as p:
        results.put(serve(worker, p, PostgresBreakerStore(p.pool), thread_id, key))
    if then is not None:
        then.set()


def run_processes(dsn: str, thread_ids: list[str], key: str) -> list[dict[str, Any]]:
    """Worker 1 and worker 2 as two spawned processes, started together; worker 2
    begins its run once worker 1 has finished, so the breaker is open by then."""
    spawn = multiprocessing.get_context("spawn")
    results = spawn.Queue()
    worker_1_done = spawn.Event()
    workers = [
        spawn.Process(
            target=postgres_worker,
            args=("worker 1", dsn, thread_ids[0], key),
            kwargs={"start_after": None, "then": worker_1_done, "results": results},
        ),
        spawn.Process(
            target=postgres_worker,
            args=("worker 2", dsn, thread_ids[1], key),
            kwargs={"start_after": worker_1_done, "then": None, "results": results},
        ),
    ]
    for process in workers:
        process.start()
    reports = [results.get(timeout=120) for _ in workers]
    for process in workers:
        process.join(timeout=60)
        if process.exitcode != 0:
            raise RuntimeError(f"{process.name} exited with {process.exitcode}")
    return reports


# ------------------------------------------------------------------ SQLite: threads


def run_threads(p: Persistence, thread_ids: list[str], key: str) -> list[dict[str, Any]]:
    """Without PostgreSQL breakers are per process: two threads share one in-memory store."""
    breakers = InMemoryBreakerStore()
    worker_1_done = threading.Event()
    reports: list[dict[str, Any]] = []

    def worker_1() -> None:
        reports.append(serve("worker 1", p, breakers, thread_ids[0], key))
        worker_1_done.set()

    def worker_2() -> None:
        worker_1_done.wait(timeout=120)
        reports.append(serve("worker 2", p, breakers, thread_ids[1], key))

    workers = [threading.Thread(target=worker_1), threading.Thread(target=worker_2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return reports


@contextlib.contextmanager
def open_persistence(dsn: str | None) -> Iterator[Persistence]:
    """PostgreSQL at `dsn` (the database you named), else embedded SQLite in a
    temporary directory: the example never writes into a database nobody named."""
    with contextlib.ExitStack() as stack:
        if dsn is not None:
            p = stack.enter_context(open_postgres(dsn, timeout=5))
            print(f"persistence: PostgreSQL at {p.target}; workers are processes")
        else:
            state_dir = stack.enter_context(tempfile.TemporaryDirectory())
            p = stack.enter_context(open_sqlite(pathlib.Path(state_dir) / "threads.sqlite"))
            print(
                f"LANGGRAPH_RESILIENCE_DSN is not set: embedded SQLite at {p.target}, where "
                "breakers are in-process: the workers are threads of this process"
            )
        yield p


def main() -> int:
    """Run both workers, print what each did; exit 1 unless worker 2 never executed the tool."""
    dsn = os.environ.get("LANGGRAPH_RESILIENCE_DSN")
    run = uuid.uuid4().hex[:8]
    key = f"inventory-api:{run}"
    thread_ids = [f"user-a-{run}", f"user-b-{run}"]
    with open_persistence(dsn) as p:  # also creates every table, once, before the workers
        if p.pool is not None:
            reports = run_processes(dsn, thread_ids, key)
        else:
            reports = run_threads(p, thread_ids, key)
        for report in sorted(reports, key=lambda r: r["worker"]):
            print(f"\n{report['worker']} (pid {report['pid']}), thread {report['thread_id']}:")
            for event in report["events"]:
                print(f"  {event}")
            print(f"  inventory executions: {report['executions']}")
            print(f"  the agent got: {report['envelope']}")

        # Any process sees every thread through the shared checkpointer.
        app = build_app(p, InMemoryBreakerStore(), [check_stock], key)
        print()
        for thread_id in thread_ids:
            status = thread_status(app, thread_id, persistence=p)
            print(f"thread {thread_id}: {status.state}, tally {status.tally}")

    first, second = sorted(reports, key=lambda r: r["worker"])
    ok = (
        first["executions"] == 3
        and second["executions"] == 0
        and second["envelope"]["type"] == "CircuitOpenError"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
