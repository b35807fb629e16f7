"""``langgraph dev`` servers for the server tests: started per test on a free loopback
port, in a copy of ``app/``, stopped (or killed) by the test.

The server is real (``langgraph-cli[inmem]``, a dev dependency); a test that cannot
start it fails under CI and skips elsewhere with the reason.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
from langgraph_sdk import get_sync_client
from langgraph_sdk.client import SyncLangGraphClient

from tests.conftest import IN_CI

APP = pathlib.Path(__file__).parent / "app"
START_TIMEOUT = 90.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _langgraph() -> str:
    found = pathlib.Path(sys.executable).with_name("langgraph")
    if found.exists():
        return str(found)
    which = shutil.which("langgraph")
    if which is None:
        reason = "the `langgraph` CLI is not installed (pip install -e '.[dev]')"
        if IN_CI:
            pytest.fail(reason)
        pytest.skip(reason)
    return which


@dataclasses.dataclass
class DevServer:
    """One ``langgraph dev`` process serving `app/`; restartable on the same folder
    (its threads and runs persist in ``.langgraph_api/``, as a user's do)."""

    cwd: pathlib.Path
    control: pathlib.Path
    env: dict[str, str]
    port: int = dataclasses.field(default_factory=_free_port)
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0
    clients: list[SyncLangGraphClient] = dataclasses.field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> pathlib.Path:
        return self.cwd / "server.log"

    def client(self) -> SyncLangGraphClient:
        """A sync client, closed when the server stops."""
        client = get_sync_client(url=self.url)
        self.clients.append(client)
        return client

    def start(self) -> DevServer:
        command = [_langgraph(), "dev", "--no-browser", "--no-reload"]
        command += ["--host", "127.0.0.1", "--port", str(self.port)]
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                command, cwd=self.cwd, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        self.starts += 1
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"langgraph dev exited {self.process.returncode}:\n{self.tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/ok", timeout=1.0).status_code == 200:
                    return self
            time.sleep(0.2)
        self.stop(signal.SIGKILL)
        pytest.fail(f"langgraph dev did not answer /ok in {START_TIMEOUT:g}s:\n{self.tail()}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop the server (its whole process group): SIGTERM is a graceful shutdown,
        SIGKILL a crash."""
        for client in self.clients:
            client.close()
        self.clients.clear()
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    # ------------------------------------------------------------ the refund tool

    def hold(self) -> None:
        """Refunds wait after their effect until `release`."""
        (self.control / "hold").write_text("x")

    def release(self) -> None:
        (self.control / "hold").unlink(missing_ok=True)

    def wait_for_effect(self, order: str, timeout: float = 60.0) -> None:
        marker = self.control / f"effect-{order}"
        deadline = time.monotonic() + timeout
        while not marker.exists():
            if time.monotonic() > deadline:
                pytest.fail(f"no refund of {order} started within {timeout:g}s:\n{self.tail()}")
            time.sleep(0.05)


def new_order() -> str:
    """A fresh order id: effects are counted per order."""
    return "o" + uuid.uuid4().hex[:8]


def start_run(client: SyncLangGraphClient, graph: str, content: str, **kwargs: Any) -> Any:
    """A run of `graph` on a new thread, asked `content`: (thread id, run id)."""
    thread = client.threads.create()
    message: dict[str, Any] = {"messages": [{"role": "user", "content": content}]}
    run = client.runs.create(thread["thread_id"], graph, input=message, **kwargs)
    return thread["thread_id"], run["run_id"]


def run_finished(
    client: SyncLangGraphClient, thread_id: str, run_id: str, timeout: float = 120.0
) -> str:
    """The run's final status, polled (bounded) until it leaves pending/running."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = str(client.runs.get(thread_id, run_id)["status"])
        if status not in ("pending", "running"):
            return status
        time.sleep(0.1)
    pytest.fail(f"run {run_id} still running after {timeout:g}s")


def effects(dsn: str, order: str) -> int:
    """Real refunds of `order`: rows the tool inserted."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute("SELECT count(*) FROM effects WHERE order_id = %s", (order,)).fetchone()
    return int(row[0]) if row else 0


@pytest.fixture
def server_env(pg_dsn: str, tmp_path: pathlib.Path) -> dict[str, Any]:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE effects (order_id text NOT NULL, key text, at timestamptz DEFAULT now())"
        )
    control = tmp_path / "control"
    control.mkdir()
    env = {
        **os.environ,
        "EFFECTS_DSN": pg_dsn,
        "LGR_CONTROL": str(control),
        "LGR_SHARED_DSN": pg_dsn,
        "LANGSMITH_TRACING": "false",
        "LANGCHAIN_TRACING_V2": "false",
        "LANGGRAPH_CLI_NO_ANALYTICS": "1",
        "LANGSMITH_API_KEY": "",
    }
    return {"env": env, "control": control, "dsn": pg_dsn}


@pytest.fixture
def dev_server(server_env: dict[str, Any], tmp_path: pathlib.Path) -> Iterator[DevServer]:
    """A started ``langgraph dev`` on `app/`, stopped after the test."""
    cwd = tmp_path / "app"
    shutil.copytree(APP, cwd, ignore=shutil.ignore_patterns("__pycache__", ".langgraph_api"))
    server = DevServer(cwd=cwd, control=server_env["control"], env=server_env["env"])
    try:
        yield server.start()
    finally:
        server.release()
        server.stop(signal.SIGKILL)
