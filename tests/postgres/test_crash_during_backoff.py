"""A process killed during backoff resumes by thread_id on PostgresSaver within its budget."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time
import uuid
from typing import Any

import psycopg
import pytest
from langgraph.checkpoint.postgres import PostgresSaver
from psycopg.rows import dict_row

WORKER = pathlib.Path(__file__).with_name("backoff_worker.py")
RETRY_AFTER = 600.0  # backoff_worker.RETRY_AFTER
ROOT = pathlib.Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def _worker(*args: str) -> list[str]:
    return [sys.executable, str(WORKER), *args]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _wait_for_scheduled_retry(dsn: str, thread: str, worker: subprocess.Popen[bytes]) -> None:
    """Until the tools step that scheduled the retry is in Postgres. LangGraph saves a
    step's checkpoint while the next step runs (``durability="async"``, its default), so
    the backoff may start before it lands; a kill before that loses the step, which the
    resume then runs again (the crash rule), and that is not what this test kills."""
    config: Any = {"configurable": {"thread_id": thread}}
    deadline = time.monotonic() + 30
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        saver = PostgresSaver(conn)  # type: ignore[arg-type]
        while True:
            found = saver.get_tuple(config)
            ledger = found.checkpoint["channel_values"].get("resilience") if found else None
            calls = (ledger or {}).get("calls") or {}
            if any(record["status"] == "scheduled" for record in calls.values()):
                return
            assert worker.poll() is None, "the worker exited before its retry was saved"
            assert time.monotonic() < deadline, "the scheduled retry was never saved"
            time.sleep(0.05)  # polling a real subprocess's writes, not standing in for a clock


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_killed_during_backoff_resumes_without_exceeding_budget(
    pg_dsn: str, tmp_path: pathlib.Path, mode: str
) -> None:
    """SIGKILL mid-backoff, resume in a new process: 3 executions in all, remaining wait only."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        PostgresSaver(conn).setup()  # type: ignore[arg-type]
        conn.execute("CREATE TABLE executions (id serial PRIMARY KEY)")
    thread = uuid.uuid4().hex
    marker = tmp_path / "backoff-started"
    common = ["--dsn", pg_dsn, "--thread", thread, "--marker", str(marker), "--mode", mode]

    first = subprocess.Popen(_worker("start", *common), env=_env())
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert first.poll() is None, "the worker exited before reaching its backoff"
        assert time.monotonic() < deadline, "the worker never reached its backoff"
        time.sleep(0.05)  # polling a real subprocess, not standing in for a clock
    _wait_for_scheduled_retry(pg_dsn, thread, first)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    assert RETRY_AFTER - 60 < float(marker.read_text()) <= RETRY_AFTER  # waiting on Retry-After

    resumed = subprocess.run(
        _worker("resume", *common),
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert resumed.returncode == 0, resumed.stderr
    result = json.loads(resumed.stdout)

    with psycopg.connect(pg_dsn) as conn:
        row = conn.execute("SELECT count(*) FROM executions").fetchone()
    assert row is not None
    assert row[0] == 3  # max_attempts, across two processes
    assert result["next"] == []
    assert result["last"] == "found it"
    first_wait, second_wait = result["sleeps"]
    assert 0 < first_wait < RETRY_AFTER  # only what remained of the interrupted backoff
    assert second_wait == RETRY_AFTER
    assert result["ledger"]["tool_attempts"] == 3
