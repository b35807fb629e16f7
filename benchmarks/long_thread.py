"""A long thread: what a turn costs after thousands of calls, against plain LangGraph.

A thread is a long conversation. Each turn here is one task: the history is
trimmed to the new human message (``RemoveMessage(REMOVE_ALL_MESSAGES)``, as an
application that trims or summarises does), the model asks for two tools in
parallel, both succeed, the model answers. Graph A is ``add_resilience`` on
``MessagesState + ResilienceState``; graph B is LangGraph's ``ToolNode`` +
``tools_condition`` on ``MessagesState`` (the graphs of ``overhead.py``). Both
threads are grown to each length in `--calls` (tool calls so far), then A and B
turns are timed interleaved (ABBA) on that length. Reported per length:

- the median turn of each, the ratio A/B with a bootstrap 95% interval
  (target: within 1.15x at 5,000 calls);
- the ``resilience`` channel's size as JSON (target: < 20 KB at any length);
- the bytes of channel values a turn serializes into the saver (new blobs).

``InMemorySaver`` keeps every checkpoint of a thread; to keep the machine's
memory flat over thousands of turns, each thread is pruned to its latest
checkpoint between turns (outside the timed region, the same for A and B).

Then, on ``PostgresSaver`` (a throw-away database ``lgr_bench_<random>``), both
threads grow to `--pg-calls` calls and the thread's rows are measured:
``checkpoint_blobs`` bytes, ``checkpoints`` (JSONB) bytes and ``checkpoint_writes``
bytes (target: blob bytes within 1.2x of plain at 2,000 calls).

    python benchmarks/long_thread.py                 # full: 10, 1,000, 5,000 calls; PG at 2,000
    python benchmarks/long_thread.py --quick         # 10 and 500 calls; PG at 200
    python benchmarks/long_thread.py --calls 10 5000 --pairs 100 --pg-calls 2000
    python benchmarks/long_thread.py --untrimmed     # the history kept: 10, 1,000 calls

With ``--untrimmed`` nothing is removed: each turn appends its five messages to the
whole conversation (1,000 calls are 2,500 messages), so what the package reads of the
history on every step shows; plain LangGraph's own turn grows with it too.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
import uuid
from typing import Any

import psycopg
from langchain_core.messages import HumanMessage, RemoveMessage, ToolMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph.message import REMOVE_ALL_MESSAGES
from overhead import (
    DEFAULT_DSN,
    bootstrap_ratio,
    build_plain,
    build_resilient,
    postgres_saver,
    probe_postgres,
)

CALLS_PER_TURN = 2
TURN_TARGET = 1.15
CHANNEL_TARGET_BYTES = 20_000
BLOB_TARGET = 1.2


class Thread:
    """One graph's long thread: its turns, grown and timed one at a time."""

    def __init__(self, graph: Any, saver: BaseCheckpointSaver[Any], *, trim: bool = True) -> None:
        self.graph = graph
        self.trim = trim
        self.saver = saver
        self.id = uuid.uuid4().hex
        self.config: dict[str, Any] = {"configurable": {"thread_id": self.id}}
        self.turns = 0
        self.values: dict[str, Any] = {}

    def turn(self) -> float:
        """One turn (the history trimmed to its question, unless `trim` is off): its
        wall seconds."""
        question = HumanMessage(f"question {self.turns}")
        trimmed = [RemoveMessage(id=REMOVE_ALL_MESSAGES)] if self.trim else []
        prompt = {"messages": [*trimmed, question]}
        start = time.perf_counter()
        self.values = self.graph.invoke(prompt, self.config)
        elapsed = time.perf_counter() - start
        self.turns += 1
        messages = self.values["messages"][-5:]
        if messages[0].content != question.content or any(
            isinstance(m, ToolMessage) and m.status != "success" for m in messages
        ):
            raise RuntimeError(f"turn {self.turns} did not take the clean path: {messages!r}")
        return elapsed

    @property
    def calls(self) -> int:
        return self.turns * CALLS_PER_TURN

    def channel_bytes(self) -> int:
        ledger = self.values.get("resilience")
        return len(json.dumps(ledger, separators=(",", ":"))) if ledger else 0

    def prune(self) -> None:
        """Keep only the thread's latest checkpoint in an `InMemorySaver`."""
        saver = self.saver
        if not isinstance(saver, InMemorySaver):
            return
        for ns, checkpoints in saver.storage[self.id].items():
            latest = max(checkpoints)
            for checkpoint_id in [c for c in checkpoints if c != latest]:
                del checkpoints[checkpoint_id]
                for key in [k for k in saver.writes if k == (self.id, ns, checkpoint_id)]:
                    del saver.writes[key]
            kept = saver.serde.loads_typed(checkpoints[latest][0])["channel_versions"]
            for key in [k for k in saver.blobs if k[0] == self.id and k[1] == ns]:
                if kept.get(key[2]) != key[3]:
                    del saver.blobs[key]

    def blob_bytes(self) -> int:
        saver = self.saver
        assert isinstance(saver, InMemorySaver)
        return sum(len(v[1]) for k, v in saver.blobs.items() if k[0] == self.id)


def _grow(threads: dict[str, Thread], calls: int) -> None:
    while any(t.calls < calls for t in threads.values()):
        for thread in threads.values():
            if thread.calls < calls:
                thread.turn()
                thread.prune()


def bench_length(threads: dict[str, Thread], calls: int, pairs: int) -> dict[str, Any]:
    """Grow both threads to `calls`, then time `pairs` interleaved turns of each."""
    _grow(threads, calls)
    wall: dict[str, list[float]] = {"A": [], "B": []}
    written: dict[str, list[int]] = {"A": [], "B": []}
    for i in range(pairs):
        for name in "AB" if i % 2 == 0 else "BA":
            thread = threads[name]
            before = set(thread.saver.blobs) if isinstance(thread.saver, InMemorySaver) else set()
            wall[name].append(thread.turn())
            saver = thread.saver
            assert isinstance(saver, InMemorySaver)
            written[name].append(
                sum(
                    len(v[1])
                    for k, v in saver.blobs.items()
                    if k[0] == thread.id and k not in before
                )
            )
            thread.prune()
    a, b = statistics.median(wall["A"]), statistics.median(wall["B"])
    low, high = bootstrap_ratio(wall["A"], wall["B"])
    channel = max(threads["A"].channel_bytes(), 0)
    return {
        "calls": calls,
        "pairs": pairs,
        "resilient_ms": a * 1e3,
        "plain_ms": b * 1e3,
        "ratio": a / b,
        "ratio_ci95": [low, high],
        "channel_bytes": channel,
        "written_per_turn": {k: statistics.median(v) for k, v in written.items()},
        "meets_target": a / b <= TURN_TARGET and channel < CHANNEL_TARGET_BYTES,
    }


def bench_postgres(dsn: str, calls: int) -> dict[str, Any]:
    """Both threads grown to `calls` on one `PostgresSaver`: each thread's stored bytes."""
    with postgres_saver(dsn) as saver:
        turns = calls // CALLS_PER_TURN + 1
        threads = {
            "A": Thread(build_resilient(saver, turns), saver),
            "B": Thread(build_plain(saver, turns), saver),
        }
        _grow(threads, calls)
        conn = saver.conn
        assert isinstance(conn, psycopg.Connection)
        sizes: dict[str, dict[str, int]] = {}
        for name, thread in threads.items():
            row: dict[str, int] = {}
            for table, column in (
                ("checkpoint_blobs", "blob"),
                ("checkpoints", "checkpoint"),
                ("checkpoint_writes", "blob"),
            ):
                found = conn.execute(
                    f"SELECT coalesce(sum(pg_column_size({column})), 0) AS n FROM {table} "
                    "WHERE thread_id = %s",
                    (thread.id,),
                ).fetchone()
                assert found is not None
                row[table] = int(found["n"])
            sizes[name] = row
        channel = threads["A"].channel_bytes()
    ratio = sizes["A"]["checkpoint_blobs"] / max(sizes["B"]["checkpoint_blobs"], 1)
    return {
        "calls": calls,
        "resilient": sizes["A"],
        "plain": sizes["B"],
        "blob_ratio": ratio,
        "channel_bytes": channel,
        "meets_target": ratio <= BLOB_TARGET,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="short thread (< ~1 min)")
    parser.add_argument("--calls", type=int, nargs="+", help="lengths to time, in tool calls")
    parser.add_argument("--pairs", type=int, help="interleaved turn pairs per length")
    parser.add_argument("--pg-calls", type=int, help="length of the PostgresSaver threads")
    parser.add_argument(
        "--dsn", help=f"PostgreSQL allowing CREATE DATABASE (default {DEFAULT_DSN})"
    )
    parser.add_argument(
        "--untrimmed",
        action="store_true",
        help="keep the whole history (default lengths 10, 1,000)",
    )
    parser.add_argument("--json", metavar="OUT", help="also write the results as JSON to OUT")
    args = parser.parse_args(argv)
    full = [10, 1000] if args.untrimmed else [10, 1000, 5000]
    lengths = args.calls or ([10, 500] if args.quick else full)
    pairs = args.pairs or (30 if args.quick or args.untrimmed else 100)
    pg_calls = args.pg_calls or (200 if args.quick else 2000)
    logging.getLogger("langgraph_resilience").setLevel(logging.WARNING)
    started = time.perf_counter()
    load = os.getloadavg()[0]
    print(f"long thread: lengths {lengths}, {pairs} pairs each; load average {load:.2f}")

    turns = max(lengths) // CALLS_PER_TURN + pairs * len(lengths) + 1
    saver_a, saver_b = InMemorySaver(), InMemorySaver()
    threads = {
        "A": Thread(build_resilient(saver_a, turns), saver_a, trim=not args.untrimmed),
        "B": Thread(build_plain(saver_b, turns), saver_b, trim=not args.untrimmed),
    }
    rows = []
    for calls in sorted(lengths):
        print(f"growing both threads to {calls} calls and timing ...", flush=True)
        rows.append(bench_length(threads, calls, pairs))
    history = "whole history" if args.untrimmed else "trimmed history"
    print(f"\nInMemorySaver, {history} (A = add_resilience, B = ToolNode)")
    print("calls    A ms    B ms   A/B (95% CI)           channel   written/turn A, B")
    for row in rows:
        low, high = row["ratio_ci95"]
        written = row["written_per_turn"]
        verdict = "OK" if row["meets_target"] else "MISS"
        print(
            f"{row['calls']:>5} {row['resilient_ms']:>7.2f} {row['plain_ms']:>7.2f}   "
            f"{row['ratio']:.3f}x ({low:.3f}-{high:.3f})  {row['channel_bytes']:>7} B   "
            f"{written['A']:>7.0f} B, {written['B']:.0f} B  {verdict}"
        )

    dsn = args.dsn or DEFAULT_DSN
    reason = probe_postgres(dsn)
    postgres = None
    if reason is not None:
        if args.dsn:
            print(f"error: PostgreSQL at --dsn is unreachable: {reason}", file=sys.stderr)
            return 2
        print(f"\nPostgresSaver part skipped: {reason}")
    else:
        print(f"\ngrowing both threads to {pg_calls} calls on PostgresSaver ...", flush=True)
        postgres = bench_postgres(dsn, pg_calls)
        a, b = postgres["resilient"], postgres["plain"]
        print(f"PostgresSaver at {pg_calls} calls: stored bytes of each thread")
        for table in ("checkpoint_blobs", "checkpoints", "checkpoint_writes"):
            ratio = a[table] / max(b[table], 1)
            print(f"  {table:<18} A {a[table]:>12,}  B {b[table]:>12,}  A/B {ratio:.2f}x")
        verdict = "OK" if postgres["meets_target"] else "MISS"
        print(f"  blob bytes A/B {postgres['blob_ratio']:.2f}x (target {BLOB_TARGET}x) {verdict}")
    print(f"\ndone in {time.perf_counter() - started:.1f} s; load average {os.getloadavg()[0]:.2f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump({"lengths": rows, "postgres": postgres}, out, indent=2)
            out.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
