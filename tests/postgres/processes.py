"""Worker processes for the cross-process tests: start one, wait for its kill point,
read its JSON result. Every worker script prints one JSON document on success."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[2]


def spawn(worker: pathlib.Path, *args: str, killed: bool = False) -> subprocess.Popen[str]:
    """Start `worker`; one that will be killed gets no pipes, so none is left unclosed."""
    stream = subprocess.DEVNULL if killed else subprocess.PIPE
    return subprocess.Popen(
        [sys.executable, str(worker), *args],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=stream,
        stderr=stream,
        text=True,
    )


def wait_for_marker(marker: pathlib.Path, process: subprocess.Popen[str]) -> None:
    """Until the worker writes `marker` (its kill point); fails if it exits first."""
    deadline = time.monotonic() + 90
    while not marker.exists():
        assert process.poll() is None, "the worker exited before the kill point"
        assert time.monotonic() < deadline, "the worker never reached the kill point"
        time.sleep(0.05)  # polling a real subprocess, not standing in for a clock


def finish(process: subprocess.Popen[str]) -> dict[str, Any]:
    """The worker's JSON result; it must have exited 0."""
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    result: dict[str, Any] = json.loads(out)
    return result
