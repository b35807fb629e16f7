"""Real MCP servers for tests: started on stdio or loopback HTTP, killed with SIGKILL."""

from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from typing import Any

SERVER = pathlib.Path(__file__).with_name("server.py")
ROOT = SERVER.parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _env(marker: pathlib.Path | None) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if marker is not None:
        env["MCP_TEST_MARKER"] = str(marker)
    return env


def stdio_connection(name: str, marker: pathlib.Path | None = None) -> dict[str, Any]:
    """A connection that spawns the server per session (the adapters' default)."""
    return {
        "transport": "stdio",
        "command": sys.executable,
        "args": [str(SERVER), name, "stdio"],
        "env": _env(marker),
    }


class HttpServer:
    """One server process on 127.0.0.1:<port>, which a test can kill and restart."""

    def __init__(self, name: str, marker: pathlib.Path | None = None) -> None:
        self.name, self.marker, self.port = name, marker, free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def connection(self) -> dict[str, Any]:
        return {"transport": "streamable_http", "url": f"http://127.0.0.1:{self.port}/mcp"}

    def start(self) -> HttpServer:
        self.process = subprocess.Popen(
            [sys.executable, str(SERVER), self.name, "http", str(self.port)],
            env=_env(self.marker),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # bounded polling for start-up, not a clock
            if self.process.poll() is not None:
                raise RuntimeError(f"MCP server {self.name} exited at start-up")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"MCP server {self.name} did not listen within 20s")

    def kill(self) -> None:
        """SIGKILL: the process dies without a goodbye, as a crashed server does."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)
