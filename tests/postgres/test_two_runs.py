"""Two processes invoke one thread at once on the plain path (no lock of their own) while
the first one's payment is in flight, on the real server: the second is refused with
`ThreadBusyError` before it does anything, the payment happens once, and the thread's
final state holds it. Twenty trials, sync and async."""

from __future__ import annotations

import pathlib
import uuid
from typing import Any

import psycopg
import pytest

from tests.postgres.processes import finish, spawn, wait_for_marker

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

WORKER = pathlib.Path(__file__).with_name("effect_worker.py")
TRIALS = 20


def _payments(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM payments").fetchone()
    return int(row[0]) if row else 0


def test_two_runs_on_one_thread_at_once(pg_dsn: str, tmp_path: pathlib.Path) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE payments (id serial PRIMARY KEY, key text, amount int)")
    results: list[dict[str, Any]] = []
    for trial in range(TRIALS):
        mode = "sync" if trial % 2 == 0 else "async"
        thread = uuid.uuid4().hex
        running, release = tmp_path / f"running-{trial}", tmp_path / f"release-{trial}"
        common = ["--dsn", pg_dsn, "--thread", thread, "--mode", mode, "--kill-at", "none"]
        first = spawn(WORKER, "start", *common, "--marker", str(running),
                      "--hold-until", str(release))  # fmt: skip
        wait_for_marker(running, first)
        second = finish(spawn(WORKER, "start", *common, "--marker", str(tmp_path / "unused")))
        release.write_text("go")
        results.append({"first": finish(first), "second": second})

    assert [r["second"] for r in results] == [{"busy": True}] * TRIALS
    assert [r["first"] for r in results] == [{"next": [], "last": "paid"}] * TRIALS
    assert _payments(pg_dsn) == TRIALS  # one per thread: nothing ran twice or went missing
