"""Debian's PgBouncer in front of the test server, started and stopped by a test.

`PgBouncer` writes a config to a temporary directory and runs the ``pgbouncer``
binary on a free loopback port in ``pool_mode=transaction`` in front of
127.0.0.1:5432, with a small pool (``pool_size`` server connections per database, so
every client's transactions share a few backends), trust auth and no prepared
statements: PgBouncer before 1.21 (Debian bookworm ships 1.18) has none in
transaction mode, and a newer one is told ``max_prepared_statements = 0`` so it
behaves the same. That is the pooler a managed Postgres's pooled connection string
points at, at its least forgiving. As root (CI), it runs as the ``postgres`` user: it
refuses to run as root.
"""

from __future__ import annotations

import os
import pathlib
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Any

from psycopg.conninfo import conninfo_to_dict, make_conninfo

from tests.system_packages import installed

__all__ = ["PgBouncer", "pgbouncer_binary"]

UPSTREAM = ("127.0.0.1", 5432)


def pgbouncer_binary() -> str | None:
    """The ``pgbouncer`` binary (Debian installs it in /usr/sbin, off a user's PATH);
    under CI, installed from Debian's archive when missing."""
    return installed("pgbouncer", "pgbouncer")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _version(binary: str) -> tuple[int, ...]:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True)
    found = re.search(r"PgBouncer (\d+)\.(\d+)", out.stdout)
    return (int(found[1]), int(found[2])) if found else (0, 0)


class PgBouncer:
    """One PgBouncer process; `dsn` routes a test DSN through it."""

    def __init__(self, binary: str, *, pool_size: int = 2, max_client_conn: int = 400) -> None:
        self.binary = binary
        self.pool_size = pool_size
        self.max_client_conn = max_client_conn
        self.version = _version(binary)
        self.port = _free_port()
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="lgr-pgbouncer-"))
        self.process: subprocess.Popen[bytes] | None = None

    def _config(self) -> pathlib.Path:
        users = self.dir / "users.txt"
        users.write_text('"postgres" ""\n')
        extra = "max_prepared_statements = 0\n" if self.version >= (1, 21) else ""
        config = self.dir / "pgbouncer.ini"
        config.write_text(
            "[databases]\n"
            f"* = host={UPSTREAM[0]} port={UPSTREAM[1]}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {users}\n"
            "pool_mode = transaction\n"
            f"default_pool_size = {self.pool_size}\n"
            f"max_client_conn = {self.max_client_conn}\n"
            "query_wait_timeout = 60\n"
            "server_reset_query =\n"
            "ignore_startup_parameters = extra_float_digits\n"
            f"logfile = {self.dir / 'pgbouncer.log'}\n"
            f"pidfile = {self.dir / 'pgbouncer.pid'}\n" + extra
        )
        return config

    def start(self) -> PgBouncer:
        command = [self.binary]
        config = self._config()
        if os.geteuid() == 0:  # it refuses to run as root
            user = "postgres" if _user_exists("postgres") else "nobody"
            for path in (self.dir, *self.dir.iterdir()):
                shutil.chown(path, user)
            command += ["-u", user]
        self.process = subprocess.Popen(
            [*command, str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        deadline = time.monotonic() + 15
        while True:
            if self.process.poll() is not None:
                _, err = self.process.communicate()
                raise RuntimeError(f"pgbouncer exited at start: {err.decode()}{self.log()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"pgbouncer never listened: {self.log()}") from None
                time.sleep(0.02)  # polling a real process's port

    def log(self) -> str:
        path = self.dir / "pgbouncer.log"
        return path.read_text()[-4000:] if path.exists() else ""

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGINT)  # safe shutdown: closes its connections
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        if process is not None and process.stderr is not None:
            process.stderr.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def dsn(self, dsn: str, **params: Any) -> str:
        """`dsn` through this PgBouncer (same database and user)."""
        parts = conninfo_to_dict(dsn)
        parts.update(host="127.0.0.1", port=str(self.port), **params)
        return make_conninfo("", **parts)

    def __enter__(self) -> PgBouncer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True
