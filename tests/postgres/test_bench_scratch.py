"""A benchmark stopped by ``timeout`` or ``kill`` (SIGTERM) drops its scratch database
(`benchmarks.scratch`): by default SIGTERM ends Python without running ``finally``."""

from __future__ import annotations

import pathlib
import signal
import subprocess
import sys
import uuid

import psycopg

from tests.conftest import ADMIN_DSN

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent


def _databases(prefix: str) -> int:
    with psycopg.connect(ADMIN_DSN, autocommit=True, connect_timeout=3) as admin:
        row = admin.execute(
            "SELECT count(*) FROM pg_database WHERE datname LIKE %s", (f"{prefix}%",)
        ).fetchone()
    return int(row[0]) if row else 0


def test_a_benchmark_stopped_by_sigterm_drops_its_database(pg_dsn: str) -> None:
    prefix = f"lgr_bench_sigterm_{uuid.uuid4().hex[:6]}"
    code = (
        "import time\n"
        "from benchmarks.scratch import scratch_database\n"
        f"with scratch_database({ADMIN_DSN!r}, {prefix!r}):\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(60)\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True
    ) as run:
        try:
            assert run.stdout is not None
            assert run.stdout.readline().strip() == "ready"
            assert _databases(prefix) == 1
            run.send_signal(signal.SIGTERM)
            assert run.wait(timeout=30) == 128 + signal.SIGTERM
        finally:
            run.kill()
    assert _databases(prefix) == 0
