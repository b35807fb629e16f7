"""The command a user runs first: `langgraph-resilience demo`, as a real subprocess."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run_cli(*args: str, state: pathlib.Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_STATE_HOME": str(state), "COLUMNS": "160"}
    env.pop("LANGGRAPH_RESILIENCE_DSN", None)
    return subprocess.run(
        [sys.executable, "-m", "langgraph_resilience", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_demo_recovers_transients_and_envelopes_the_rest(tmp_path: pathlib.Path) -> None:
    """demo exits 0; transients are retried to success, policy and structural are enveloped."""
    result = run_cli("demo", "--json", state=tmp_path)

    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    ledger = lines[-1]["ledger"]
    by_tool = {record["tool"]: record for record in ledger["calls"].values()}
    assert by_tool["lookup_order"]["attempts"] == 3
    assert by_tool["lookup_order"]["status"] == "ok"
    assert by_tool["track_shipment"]["status"] == "ok"
    assert by_tool["refund"]["attempts"] == 1
    assert by_tool["refund"]["error"]["failure_class"] == "policy"
    assert by_tool["escalate_to_human"]["error"]["failure_class"] == "structural"
    assert (tmp_path / "langgraph-resilience" / "threads.sqlite").exists()


def test_demo_prints_a_readable_summary(tmp_path: pathlib.Path) -> None:
    """The text output names each failure's class and the path that handled it."""
    result = run_cli("demo", state=tmp_path)

    assert result.returncode == 0, result.stderr
    assert "classified TRANSIENT" in result.stdout
    assert "classified POLICY" in result.stdout
    assert "retry with backoff" in result.stdout
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://app:s3cr3t-pw@127.0.0.1:1/nowhere",
        "postgresql://app:s3cr3t-pw@127.0.0.1:5432/no_such_database_xyz",
    ],
)
def test_bad_dsn_is_one_line_exit_2_without_password(tmp_path: pathlib.Path, dsn: str) -> None:
    """An unreachable DSN gives one error line, exit code 2, and never the password."""
    result = run_cli("demo", "--dsn", dsn, state=tmp_path)

    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "s3cr3t-pw" not in result.stderr + result.stdout
    assert "Traceback" not in result.stderr


def test_readme_commands_are_what_ci_runs() -> None:
    """The README's two set-up commands are the ones .ci/run executes."""
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    for command in (
        "pip install . && langgraph-resilience demo",
        'pip install -e ".[dev]" && python -m pytest',
    ):
        assert command in readme
        assert command.replace("pip install", "pip install -q") in ci
