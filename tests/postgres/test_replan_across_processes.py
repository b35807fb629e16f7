"""Replanning and escalation survive process boundaries on PostgresSaver."""

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

WORKER = pathlib.Path(__file__).with_name("replan_worker.py")
ROOT = pathlib.Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def _prepare(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        PostgresSaver(conn).setup()  # type: ignore[arg-type]
        conn.execute("CREATE TABLE executions (id serial PRIMARY KEY, tool text NOT NULL)")


def _run(*args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(WORKER), *args],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _executions(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT tool, count(*) FROM executions GROUP BY tool").fetchall()
    return dict(rows)


def test_exhausted_replans_escalate_and_another_process_skips(pg_dsn: str) -> None:
    """Bad plans: max_replans attempts, an interrupt; a second process resumes with skip."""
    _prepare(pg_dsn)
    thread = uuid.uuid4().hex
    first = _run("start", "--dsn", pg_dsn, "--thread", thread, "--plans", "bad")

    assert first["next"] == ["escalate"]
    assert first["replans"] == 2
    [request] = first["interrupts"]
    assert request["tool"] == "get_weather"

    second = _run("resume", "--dsn", pg_dsn, "--thread", thread, "--answer", '{"action": "skip"}')

    assert second["next"] == []
    assert second["last"] == "done"
    assert _executions(pg_dsn) == {"get_weather": 1}


def test_crash_between_plan_steps_does_not_rerun_the_finished_step(
    pg_dsn: str, tmp_path: pathlib.Path
) -> None:
    """SIGKILL while the second plan step runs; the resumed thread never re-runs geocode."""
    _prepare(pg_dsn)
    thread = uuid.uuid4().hex
    marker = tmp_path / "second-step"
    worker = subprocess.Popen(
        [
            sys.executable,
            str(WORKER),
            "start",
            "--dsn",
            pg_dsn,
            "--thread",
            thread,
            "--block-step",
            str(marker),
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert worker.poll() is None, "the worker exited before the second plan step"
        assert time.monotonic() < deadline, "the worker never reached the second plan step"
        time.sleep(0.05)  # polling a real subprocess, not standing in for a clock
    worker.send_signal(signal.SIGKILL)
    worker.wait(timeout=30)
    assert _executions(pg_dsn) == {"get_weather": 1, "geocode": 1}

    resumed = _run("resume", "--dsn", pg_dsn, "--thread", thread)

    assert resumed["next"] == []
    assert resumed["plan"] == "completed"
    assert resumed["last"] == "done"
    assert _executions(pg_dsn) == {"get_weather": 1, "geocode": 1, "weather_v2": 1}
