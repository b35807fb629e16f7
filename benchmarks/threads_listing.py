"""How long listing threads takes on a large Postgres database: `list_threads` and the
``langgraph-resilience threads`` command, on 1,000 threads x 50 checkpoints.

The database is built from real rows: the demo runs one thread (``langgraph-resilience
demo``: 34 checkpoints with their blobs and writes), then SQL copies that thread's rows
of LangGraph's ``checkpoints``, ``checkpoint_blobs`` and ``checkpoint_writes`` tables to
every thread (``INSERT ... SELECT``), each checkpoint under a fresh time-ordered id
(`uuid6`, as LangGraph makes them; ``checkpoint -> 'id'`` rewritten to match), the
template's checkpoints spread over `checkpoints` positions (first to first, last to
last). The writes of all threads
are interleaved in a seeded random order, so "most recently written first" is neither
the order of the names nor the order in which the threads started. Each copied thread
reads back as the finished demo thread it was copied from.

Timed (``time.perf_counter``, median of ``--repeat`` runs, after one warm-up):

- ``list_threads(saver)``: one ``GROUP BY thread_id`` statement;
- ``threads --json`` and ``threads`` (the table) run in this process through
  ``cli.main`` (no interpreter start, imports done);
- ``langgraph-resilience threads`` as a user runs it: ``python -m langgraph_resilience
  threads --dsn ...`` in a new process, its start and imports included (the < 5 s
  target);
- for reference, what the previous implementation of `list_threads` paid: a walk of
  ``PostgresSaver.list(None)`` (every checkpoint with its blobs), timed once in full
  (``--walk-sample N`` times the first N checkpoints and extrapolates instead; the
  first one costs the whole query, so that underestimates little and overestimates
  much at small N).

Run it from the repository root::

    python benchmarks/threads_listing.py                # 1,000 threads x 50 checkpoints
    python benchmarks/threads_listing.py --threads 200 --checkpoints 20   # quicker
    python benchmarks/threads_listing.py --dsn postgresql://postgres@127.0.0.1:5432/postgres

The DSN must allow ``CREATE DATABASE``: the script works in ``lgr_bench_threads_<random>``
and drops it at the end (``--keep`` keeps it; the DSN is printed). Wall-clock numbers
depend on the machine's load, printed with them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import psycopg
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.postgres import PostgresSaver

from benchmarks.scratch import scratch_database
from langgraph_resilience.cli import main as cli_main
from langgraph_resilience.core.redaction import redact
from langgraph_resilience.stores.persistence import POSTGRES_CONNECTION_KWARGS
from langgraph_resilience.stores.threads import list_threads

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
TEMPLATE = "lgr-bench-template"
TARGET_SECONDS = 5.0


def run_demo_thread(dsn: str, thread_id: str = TEMPLATE) -> None:
    """One real demo thread (it also creates every table)."""
    out, err = io.StringIO(), io.StringIO()
    code = cli_main(
        ["demo", "--dsn", dsn, "--thread-id", thread_id, "--json"], stdout=out, stderr=err
    )
    if code != 0:
        raise RuntimeError(f"the demo failed ({code}): {err.getvalue()}")


def thread_name(index: int) -> str:
    return f"thread-{index:05d}"


def write_order(threads: int, checkpoints: int, seed: int) -> list[int]:
    """Which thread writes each successive checkpoint: every thread `checkpoints`
    times, interleaved in a seeded random order."""
    order = [i for i in range(threads) for _ in range(checkpoints)]
    random.Random(seed).shuffle(order)
    return order


def expected_order(order: list[int]) -> list[str]:
    """The threads by their last write, most recent first (what `list_threads` owes)."""
    last = {thread: position for position, thread in enumerate(order)}
    return [thread_name(t) for t in sorted(last, key=last.__getitem__, reverse=True)]


_COPY_CHECKPOINTS = """
INSERT INTO checkpoints
    (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata)
SELECT m.thread_id, '', m.checkpoint_id, m.parent_checkpoint_id, c.type,
       jsonb_set(jsonb_set(c.checkpoint, '{id}', to_jsonb(m.checkpoint_id)),
                 '{ts}', to_jsonb(m.ts)),
       c.metadata
FROM lgr_bench_map m
JOIN checkpoints c
  ON c.thread_id = %(template)s AND c.checkpoint_ns = '' AND c.checkpoint_id = m.source_id
"""
_COPY_WRITES = """
INSERT INTO checkpoint_writes
    (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob)
SELECT m.thread_id, '', m.checkpoint_id, w.task_id, w.task_path, w.idx, w.channel, w.type,
       w.blob
FROM lgr_bench_map m
JOIN checkpoint_writes w
  ON w.thread_id = %(template)s AND w.checkpoint_ns = '' AND w.checkpoint_id = m.source_id
"""
_COPY_BLOBS = """
INSERT INTO checkpoint_blobs (thread_id, checkpoint_ns, channel, version, type, blob)
SELECT t.thread_id, b.checkpoint_ns, b.channel, b.version, b.type, b.blob
FROM (SELECT DISTINCT thread_id FROM lgr_bench_map) AS t
CROSS JOIN checkpoint_blobs AS b
WHERE b.thread_id = %(template)s
"""


def copy_threads(
    dsn: str,
    *,
    threads: int,
    checkpoints: int,
    seed: int = 0,
    template: str = TEMPLATE,
    drop_template: bool = True,
) -> list[str]:
    """Copy the `template` thread's rows to `threads` threads of `checkpoints`
    checkpoints each (see the module docs); return the thread ids in the order
    `list_threads` must give them: most recently written first."""
    order = write_order(threads, checkpoints, seed)
    ids: dict[int, list[tuple[str, str]]] = {t: [] for t in range(threads)}
    now = dt.datetime.now(dt.UTC)
    for position, thread in enumerate(order):  # uuid6 is strictly increasing in a process
        ts = (now + dt.timedelta(milliseconds=position)).isoformat()
        ids[thread].append((str(uuid6(clock_seq=len(ids[thread]))), ts))
    with psycopg.connect(dsn) as conn:  # one transaction
        conn.execute("SET LOCAL synchronous_commit = off")
        sources = [
            row[0]
            for row in conn.execute(
                "SELECT checkpoint_id FROM checkpoints WHERE thread_id = %s "
                "AND checkpoint_ns = '' ORDER BY checkpoint_id",
                (template,),
            )
        ]
        if not sources:
            raise RuntimeError(f"template thread {template!r} has no checkpoint")
        conn.execute(
            "CREATE TEMP TABLE lgr_bench_map (thread_id text, checkpoint_id text, "
            "parent_checkpoint_id text, source_id text, ts text) ON COMMIT DROP"
        )
        with conn.cursor().copy(
            "COPY lgr_bench_map (thread_id, checkpoint_id, parent_checkpoint_id, source_id, ts) "
            "FROM STDIN"
        ) as copy:
            for thread, chain in ids.items():
                name = thread_name(thread)
                for position, (checkpoint_id, ts) in enumerate(chain):
                    source = sources[position * (len(sources) - 1) // max(1, checkpoints - 1)]
                    parent = chain[position - 1][0] if position else None
                    copy.write_row((name, checkpoint_id, parent, source, ts))
        params = {"template": template}
        for statement in (_COPY_CHECKPOINTS, _COPY_WRITES, _COPY_BLOBS):
            conn.execute(statement, params)
        if drop_template:
            for table in ("checkpoints", "checkpoint_writes", "checkpoint_blobs"):
                conn.execute(f"DELETE FROM {table} WHERE thread_id = %s", (template,))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE checkpoints")
    return expected_order(order)


def build_database(dsn: str, *, threads: int, checkpoints: int, seed: int = 0) -> list[str]:
    """A database of `threads` copies of a real demo thread; the expected listing."""
    run_demo_thread(dsn)
    return copy_threads(dsn, threads=threads, checkpoints=checkpoints, seed=seed)


def timed(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    """(median seconds over `repeat` runs after one warm-up, the last result)."""
    result = fn()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples), result


def run_command(*argv: str) -> None:
    """``python -m langgraph_resilience ARGV`` as a user runs it: a new interpreter,
    its imports included."""
    subprocess.run(
        [sys.executable, "-m", "langgraph_resilience", *argv],
        stdout=subprocess.DEVNULL,
        check=True,
        timeout=600,
    )


def run_cli(*argv: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    code = cli_main(list(argv), stdout=out, stderr=err)
    if code != 0:
        raise RuntimeError(f"`threads` failed ({code}): {err.getvalue()}")
    return out.getvalue()


def measure(
    dsn: str, expected: list[str], *, repeat: int, walk_sample: int | None
) -> dict[str, Any]:
    with psycopg.connect(dsn, **POSTGRES_CONNECTION_KWARGS) as conn:
        saver = PostgresSaver(conn)
        total = conn.execute("SELECT count(*) AS n FROM checkpoints").fetchone()
        size = conn.execute("SELECT pg_database_size(current_database()) AS n").fetchone()
        assert total is not None
        assert size is not None
        listing, listed = timed(lambda: list_threads(saver), repeat)
        limited, top = timed(lambda: list_threads(saver, limit=20), repeat)
        start = time.perf_counter()
        walked = sum(1 for _ in itertools.islice(saver.list(None), walk_sample))
        walk = time.perf_counter() - start
        full_walk = walk_sample is None or walked >= total["n"]
    cli_json, document = timed(lambda: run_cli("threads", "--json", "--dsn", dsn), repeat)
    cli_table, _ = timed(lambda: run_cli("threads", "--dsn", dsn), repeat)
    command, _ = timed(lambda: run_command("threads", "--dsn", dsn), repeat)
    rows = json.loads(document)["threads"]
    return {
        "threads": len(expected),
        "checkpoints": total["n"],
        "database_mb": round(size["n"] / 2**20, 1),
        "list_threads_s": listing,
        "list_threads_limit_20_s": limited,
        "threads_json_s": cli_json,
        "threads_table_s": cli_table,
        "threads_command_s": command,
        "load_average": os.getloadavg(),
        "old_walk_checkpoints": walked,
        "old_walk_s": walk if full_walk else walk / max(1, walked) * total["n"],
        "old_walk_extrapolated": not full_walk,
        "listing_complete_and_ordered": listed == expected and top == expected[:20],
        "cli_complete_and_ordered": [r["thread_id"] for r in rows] == expected,
        "cli_states": sorted({r["state"] for r in rows}),
    }


def report(result: dict[str, Any]) -> None:
    load = ", ".join(f"{x:.2f}" for x in result["load_average"])
    print(
        f"{result['threads']} threads, {result['checkpoints']} checkpoints, "
        f"{result['database_mb']} MB (load average {load}, {os.cpu_count()} CPUs)"
    )
    rows = (
        ("list_threads(saver)", result["list_threads_s"]),
        ("list_threads(saver, limit=20)", result["list_threads_limit_20_s"]),
        ("threads --json (in process)", result["threads_json_s"]),
        ("threads (table, in process)", result["threads_table_s"]),
        ("langgraph-resilience threads (a new process)", result["threads_command_s"]),
        (
            "before: list(None) walk"
            + (" (extrapolated)" if result["old_walk_extrapolated"] else " (all of it)"),
            result["old_walk_s"],
        ),
    )
    for label, seconds in rows:
        print(f"  {label:<52} {seconds:10.3f} s")
    verdict = "met" if result["threads_command_s"] < TARGET_SECONDS else "NOT met"
    print(f"  target: `threads` < {TARGET_SECONDS:g} s: {verdict}")
    print(
        f"  complete and ordered: list_threads {result['listing_complete_and_ordered']}, "
        f"threads {result['cli_complete_and_ordered']} (states {result['cli_states']})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="an admin DSN (CREATE DATABASE)")
    parser.add_argument("--threads", type=int, default=1000)
    parser.add_argument("--checkpoints", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--walk-sample", type=int, default=None, help="default: the whole walk")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the database")
    args = parser.parse_args(argv)
    try:
        with scratch_database(args.dsn, "lgr_bench_threads", keep=args.keep) as dsn:
            start = time.perf_counter()
            expected = build_database(
                dsn, threads=args.threads, checkpoints=args.checkpoints, seed=args.seed
            )
            built = time.perf_counter() - start
            print(f"built in {built:.1f} s: {redact(dsn)}")
            result = measure(dsn, expected, repeat=args.repeat, walk_sample=args.walk_sample)
            result["build_s"] = built
            report(result)
    except psycopg.OperationalError as exc:
        print(f"cannot use PostgreSQL at {redact(args.dsn)}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(result, file, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
