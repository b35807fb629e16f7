"""A real multi-worker LangGraph Server for the distributed tests: stock ``langgraph-api``
on the open Postgres + Redis runtime (``langgraph-runtime-pg``, served by its ``langhost``
CLI), two worker processes on one Postgres database and one Redis, loopback only.

The runtime pins ``langgraph-api==0.11.1``, older than the dev extra's
``langgraph-cli[inmem]``, so it lives in its own venv (``scripts/pg_runtime_venv.sh``):
the one ``LGR_PG_RUNTIME_VENV`` names, else one the tests build once from the package
registry into the user's cache (a minute or two). If it cannot be built, a test fails
under CI and skips elsewhere.

Databases: the runtime gets its own fresh database (its migrations create the
assistants, threads, runs, checkpoints and store tables); ours (``pg_dsn``) holds the
``effects`` table and the package's ledger, saga and breaker tables. Two databases on
one server keep "what the server owns" and "what we own" apart, as the dev-server test
checks they are.

Each worker has its own control folder (``LGR_CONTROL``), so the refund's effect marker
names the worker that ran it; ``hold`` and ``release`` act on both.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any, NoReturn

import httpx
import psycopg
import pytest
from langgraph_sdk import get_sync_client
from langgraph_sdk.client import SyncLangGraphClient

from tests.conftest import ADMIN_DSN, IN_CI
from tests.server.conftest import APP, _free_port
from tests.system_packages import installed

START_TIMEOUT = 60.0
HEARTBEAT_S = 1  # LG_BG_JOB_HEARTBEAT: a dead worker's run is re-queued in about 4-6 s
VENV_HINT = "set LGR_PG_RUNTIME_VENV to a venv built by scripts/pg_runtime_venv.sh"
REPO = pathlib.Path(__file__).resolve().parents[2]
BUILD = REPO / "scripts" / "pg_runtime_venv.sh"


def _unavailable(reason: str) -> NoReturn:
    if IN_CI:
        pytest.fail(reason)
    pytest.skip(reason)


def runtime_venv() -> pathlib.Path:
    """The venv holding ``langhost`` + ``langgraph-runtime-pg``: ``LGR_PG_RUNTIME_VENV``,
    else built once (fails under CI, else skips, when it cannot be)."""
    raw = os.environ.get("LGR_PG_RUNTIME_VENV", "")
    if not raw:
        return _built_venv()
    venv = pathlib.Path(raw)
    if not (venv / "bin" / "langhost").exists():
        _unavailable(f"no bin/langhost in LGR_PG_RUNTIME_VENV={raw}: {VENV_HINT}")
    return venv


def _built_venv() -> pathlib.Path:
    """The runtime venv for this checkout, built by `BUILD` into the user's cache once
    (named by a hash of the script and the checkout's path: it installs it editable),
    under a file lock so two sessions do not build it at once."""
    digest = hashlib.sha256(BUILD.read_bytes() + str(REPO).encode()).hexdigest()[:12]
    cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache")
    venv = cache / "langgraph-resilience-tests" / f"pg-runtime-{digest}"
    built = venv / ".built"
    venv.parent.mkdir(parents=True, exist_ok=True)
    with (venv.parent / f"{venv.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if built.exists():
            return venv
        shutil.rmtree(venv, ignore_errors=True)  # a build that was cut short
        done = subprocess.run(
            ["bash", str(BUILD), str(venv)],
            check=False,
            capture_output=True,
            text=True,
            timeout=900,
        )
        if done.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
            _unavailable(f"cannot build the runtime venv with {BUILD.name}: {tail}; {VENV_HINT}")
        built.touch()
    return venv


def _popen(command: list[str], cwd: pathlib.Path, env: dict[str, str], log: pathlib.Path) -> Any:
    with log.open("ab") as out:
        return subprocess.Popen(
            command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip


def _stop(process: subprocess.Popen[bytes] | None, sig: int) -> None:
    """Signal the process group, then reap it (SIGKILL if it lingers)."""
    if process is None or process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, sig)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def _tail(log: pathlib.Path, lines: int = 40) -> str:
    text = log.read_text(errors="replace") if log.exists() else ""
    return "\n".join(text.splitlines()[-lines:])


@dataclasses.dataclass
class Redis:
    """A throwaway ``redis-server`` on a free loopback port: no persistence."""

    log: pathlib.Path
    port: int = dataclasses.field(default_factory=_free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def uri(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _pong(self) -> bool:
        with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")

    def start(self) -> Redis:
        binary = installed("redis-server", "redis-server")
        if binary is None:
            _unavailable("redis-server is not installed (apt-get install redis-server)")
        command = [str(binary), "--port", str(self.port), "--bind", "127.0.0.1"]
        command += ["--save", "", "--appendonly", "no"]
        self.process = _popen(command, self.log.parent, dict(os.environ), self.log)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"redis-server exited {self.process.returncode}:\n{_tail(self.log)}")
            with contextlib.suppress(OSError):
                if self._pong():
                    return self
            time.sleep(0.05)
        self.stop()
        pytest.fail(f"redis-server did not answer PING in 20s:\n{_tail(self.log)}")

    def stop(self) -> None:
        _stop(self.process, signal.SIGKILL)


@dataclasses.dataclass
class Worker:
    """One ``langhost serve`` process: the HTTP API and a queue worker."""

    name: str
    cwd: pathlib.Path
    control: pathlib.Path
    env: dict[str, str]
    langhost: pathlib.Path
    port: int = dataclasses.field(default_factory=_free_port)
    process: subprocess.Popen[bytes] | None = None
    clients: list[SyncLangGraphClient] = dataclasses.field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> pathlib.Path:
        return self.cwd.parent / f"{self.name}.log"

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def client(self) -> SyncLangGraphClient:
        """A sync client on this worker's API, closed when the worker stops."""
        client = get_sync_client(url=self.url)
        self.clients.append(client)
        return client

    def start(self) -> Worker:
        command = [str(self.langhost), "serve", "--host", "127.0.0.1", "--port", str(self.port)]
        command += ["--config", "langgraph.json", "--n-jobs-per-worker", "2"]
        self.process = _popen(command, self.cwd, self.env, self.log)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"{self.name} exited {self.process.returncode}:\n{self.tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/ok", timeout=1.0).status_code == 200:
                    return self
            time.sleep(0.1)
        self.stop(signal.SIGKILL)
        pytest.fail(f"{self.name} did not answer /ok in {START_TIMEOUT:g}s:\n{self.tail()}")

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop the worker's process group: SIGKILL is a crash."""
        for client in self.clients:
            client.close()
        self.clients.clear()
        _stop(self.process, sig)

    def tail(self, lines: int = 40) -> str:
        return _tail(self.log, lines)

    def effects_started(self) -> set[str]:
        """Orders whose refund this worker started (its effect markers)."""
        return {p.name.removeprefix("effect-") for p in self.control.glob("effect-*")}

    def factory_calls(self) -> int:
        """Calls of the ``shared`` graph factory in this worker (one line each)."""
        opened = self.control / "opened"
        return len(opened.read_text().splitlines()) if opened.exists() else 0


@dataclasses.dataclass
class Cluster:
    """Two workers on one runtime database and one Redis, serving ``app/``."""

    workers: list[Worker]
    redis: Redis
    dsn: str
    """Our database: ``effects`` and the package's tables."""
    runtime_dsn: str
    """The server's own database."""

    def hold(self) -> None:
        """Refunds wait after their effect until `release` (on every worker)."""
        for worker in self.workers:
            (worker.control / "hold").write_text("x")

    def release(self) -> None:
        for worker in self.workers:
            (worker.control / "hold").unlink(missing_ok=True)

    def tails(self) -> str:
        return "\n".join(f"--- {w.name}\n{w.tail()}" for w in self.workers)

    def worker_running(self, order: str, timeout: float = 30.0) -> Worker:
        """The worker whose refund of `order` has made its effect."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for worker in self.workers:
                if order in worker.effects_started():
                    return worker
            time.sleep(0.05)
        pytest.fail(f"no refund of {order} started within {timeout:g}s:\n{self.tails()}")

    def other(self, worker: Worker) -> Worker:
        return next(w for w in self.workers if w is not worker)


@contextlib.contextmanager
def _database() -> Iterator[str]:
    name = f"lgr_runtime_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(ADMIN_DSN, autocommit=True, connect_timeout=3) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    base, _, _ = ADMIN_DSN.rpartition("/")
    try:
        yield f"{base}/{name}"
    finally:
        with psycopg.connect(ADMIN_DSN, autocommit=True, connect_timeout=3) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(name="cluster")
def cluster_fixture(server_env: dict[str, Any], tmp_path: pathlib.Path) -> Iterator[Cluster]:
    """Redis, then two started workers (one after the other, so one migrates), on a
    fresh runtime database; everything killed afterwards."""
    venv = runtime_venv()
    cwd = tmp_path / "app"
    shutil.copytree(APP, cwd, ignore=shutil.ignore_patterns("__pycache__", ".langgraph_api"))
    redis = Redis(log=tmp_path / "redis.log")
    workers: list[Worker] = []
    with _database() as runtime_dsn:
        try:
            redis.start()
            for name in ("w1", "w2"):
                control = server_env["control"] / name
                control.mkdir()
                env = {
                    **server_env["env"],
                    "LGR_CONTROL": str(control),
                    "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
                    "VIRTUAL_ENV": str(venv),
                    "LANGGRAPH_RUNTIME_EDITION": "pg",
                    "DATABASE_URI": runtime_dsn,
                    "REDIS_URI": redis.uri,
                    "LG_BG_JOB_HEARTBEAT": str(HEARTBEAT_S),
                    "LANGGRAPH_NO_VERSION_CHECK": "true",
                }
                worker = Worker(name, cwd, control, env, venv / "bin" / "langhost")
                workers.append(worker)
                worker.start()
            yield Cluster(workers, redis, server_env["dsn"], runtime_dsn)
        finally:
            for worker in workers:
                (worker.control / "hold").unlink(missing_ok=True)
                worker.stop(signal.SIGKILL)
            redis.stop()
