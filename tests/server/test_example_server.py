"""``examples/server`` as the README tells a user to run it: ``langgraph dev`` in the
folder, then ``python examples/server/client.py --url ...``; once with the default
ledger and once on Postgres (``LANGGRAPH_RESILIENCE_DSN``)."""

from __future__ import annotations

import pathlib
import shutil
import signal
import subprocess
import sys
from typing import Any

import psycopg
import pytest

from tests.server.conftest import DevServer

ROOT = pathlib.Path(__file__).parents[2]
EXAMPLE = ROOT / "examples" / "server"


@pytest.mark.parametrize("ledger", ["default", "postgres"])
def test_the_server_example_runs(
    server_env: dict[str, Any], tmp_path: pathlib.Path, ledger: str
) -> None:
    cwd = tmp_path / "server"
    shutil.copytree(EXAMPLE, cwd, ignore=shutil.ignore_patterns("__pycache__", ".langgraph_api"))
    env = dict(server_env["env"])
    env.pop("LANGGRAPH_RESILIENCE_DSN", None)
    if ledger == "postgres":
        env["LANGGRAPH_RESILIENCE_DSN"] = server_env["dsn"]
    server = DevServer(cwd=cwd, control=server_env["control"], env=env).start()
    try:
        done = subprocess.run(
            [sys.executable, str(EXAMPLE / "client.py"), "--url", server.url],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
    finally:
        server.stop(signal.SIGTERM)
    assert done.returncode == 0, done.stderr + server.tail()
    assert "agent: Done: refunded A-1042" in done.stdout
    assert "done, {'ok': 1}" in done.stdout
    if ledger == "postgres":
        with psycopg.connect(server_env["dsn"]) as conn:
            row = conn.execute("SELECT tool, status FROM lgr_idempotency").fetchall()
        assert row == [("refund", "done")]
    else:
        assert (cwd / ".langgraph_api" / "lgr_ledger.sqlite").exists()
