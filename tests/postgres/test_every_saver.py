"""Every standard saver works with a side-effecting tool, with nothing else wired.

Each saver constructor LangGraph documents (Postgres from a connection string or on
a pool, sync and async; SQLite from a connection string, on a connection, async;
in memory) x each entry point (``add_resilience``, ``create_agent`` +
``ResilienceMiddleware``): a clean turn refunds once and the thread completes; for
the durable ones, a process SIGKILLed right after the refund and a new process
resuming the thread by its id still leave one refund, the call answered once.
Refunds are rows in a table on the real server (`saver_worker`). The processes are
forked from a server that imported the worker once (``multiprocessing``'s
forkserver), so a cell pays no four seconds of imports per process.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import pathlib
import time
import uuid
from typing import Any

import pytest

from tests.postgres.saver_worker import (
    ASYNC_SAVERS,
    DURABLE,
    ENTRIES,
    SYNC_SAVERS,
    arun,
    phase,
    prepare,
    refunds,
    run,
)

FORKS = multiprocessing.get_context("forkserver")
FORKS.set_forkserver_preload(["tests.postgres.saver_worker"])

pytestmark = pytest.mark.postgres

COMPLETED = {"next": [], "last": "done", "asked": 1, "answers": 1}
"""A finished thread: the model asked for the refund once, the call was answered once."""

CLEAN = [
    *((saver, "sync") for saver in SYNC_SAVERS),
    *((saver, "async") for saver in ASYNC_SAVERS),
    ("memory", "sync"),
    ("memory", "async"),
]


def _options(dsn: str, tmp_path: pathlib.Path, saver: str, entry: str) -> dict[str, Any]:
    return {
        "saver": saver,
        "entry": entry,
        "dsn": dsn,
        "thread": uuid.uuid4().hex,
        "path": tmp_path / "threads.sqlite",
        "marker": tmp_path / "marker",
    }


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize(("saver", "mode"), CLEAN)
def test_a_clean_turn_refunds_once_and_completes(
    pg_dsn: str, tmp_path: pathlib.Path, saver: str, mode: str, entry: str
) -> None:
    """One side-effecting call on the saver as LangGraph's docs open it: one refund, the
    thread done, the call answered once, and closing the saver raises nothing."""
    prepare(pg_dsn)
    options = _options(pg_dsn, tmp_path, saver, entry)
    if mode == "sync":
        result = run("start", kill="none", **options)
    else:
        result = asyncio.run(arun("start", kill="none", **options))

    assert result == COMPLETED
    assert refunds(pg_dsn) == 1


def _start(name: str, options: dict[str, Any]) -> tuple[Any, pathlib.Path]:
    """Phase `name` in a new process; the process and the file its result goes to."""
    out = options["marker"].with_name(f"{name}.json")
    process = FORKS.Process(target=phase, args=(name, options, str(out)))
    process.start()
    return process, out


def _error(out: pathlib.Path) -> str:
    """What a phase that failed wrote (its traceback), or that it wrote nothing."""
    return str(json.loads(out.read_text())["error"]) if out.exists() else "no result"


def _result(process: Any, out: pathlib.Path) -> dict[str, Any]:
    """The phase's JSON result; it must have exited 0."""
    process.join(timeout=120)
    if process.is_alive():
        process.kill()
        pytest.fail("the worker did not finish in 120 s")
    assert process.exitcode == 0, _error(out)
    result: dict[str, Any] = json.loads(out.read_text())
    return result


@pytest.mark.slow
@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("saver", DURABLE)
def test_sigkill_after_the_refund_then_resume_refunds_once(
    pg_dsn: str, tmp_path: pathlib.Path, saver: str, entry: str
) -> None:
    """Killed right after the refund landed (before anything else), resumed by thread_id
    in a new process: still one refund, the thread done, the call answered once."""
    prepare(pg_dsn)
    options = _options(pg_dsn, tmp_path, saver, entry)
    first, out = _start("start", {**options, "kill": "after"})
    try:
        deadline = time.monotonic() + 90
        while not options["marker"].exists():
            assert first.is_alive(), _error(out)
            assert time.monotonic() < deadline, "the worker never reached the kill point"
            time.sleep(0.02)  # polling a real process, not standing in for a clock
    finally:
        first.kill()  # SIGKILL, right after the refund (or on the way out of a failure)
        first.join(timeout=30)
    assert refunds(pg_dsn) == 1

    result = _result(*_start("resume", {**options, "kill": "none"}))

    assert result == COMPLETED
    assert refunds(pg_dsn) == 1
