"""benchmarks/lease_cost.py runs as its docstring says, straight and through PgBouncer."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from tests.conftest import ADMIN_DSN
from tests.pgbouncer import PgBouncer

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def test_lease_cost_reports_every_row(tmp_path: pathlib.Path, pgbouncer: PgBouncer) -> None:
    """Every operation is timed on both routes (the advisory lock straight only)."""
    out = tmp_path / "lease.json"
    args = ["--dsn", ADMIN_DSN, "--n", "3", "--pooler", str(pgbouncer.port), "--json", str(out)]
    subprocess.run(
        [sys.executable, "benchmarks/lease_cost.py", *args],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=600,
    )
    report = json.loads(out.read_text())
    assert set(report) == {"straight", "pooler"}
    assert "session advisory lock + unlock (before)" in report["straight"]
    for rows in report.values():
        assert rows["lease: acquire + release (pool)"]["n"] == 3
        assert rows["turn with a side effect, under thread_lock"]["median_ms"] > 0
