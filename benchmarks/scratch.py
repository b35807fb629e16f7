"""A throw-away PostgreSQL database for a benchmark, gone however the run ends.

Why this module exists: every Postgres benchmark measures on a database of its own,
created at the start and dropped at the end. A run stopped by ``timeout`` or ``kill``
(SIGTERM) skips ``finally`` blocks unless the signal is turned into an exception, and
a run that leaves its database behind fills the server; so every benchmark takes its
database from here, where SIGTERM ends the run like Ctrl-C does: through the drop.
"""

from __future__ import annotations

import contextlib
import secrets
import signal
import threading
from collections.abc import Iterator
from types import FrameType

import psycopg
from psycopg import conninfo, sql

__all__ = ["scratch_database"]


def _stop(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def scratch_database(
    admin_dsn: str, prefix: str = "lgr_bench", *, keep: bool = False
) -> Iterator[str]:
    """Create ``<prefix>_<random>`` through `admin_dsn` (which may ``CREATE DATABASE``),
    yield its DSN, then drop it (unless `keep`), also when SIGTERM stops the run."""
    name = f"{prefix}_{secrets.token_hex(5)}"
    with psycopg.connect(admin_dsn, autocommit=True, connect_timeout=5) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _stop) if main else None
    try:
        yield conninfo.make_conninfo(admin_dsn, dbname=name)
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
        if not keep:
            with psycopg.connect(admin_dsn, autocommit=True, connect_timeout=5) as admin:
                drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
                admin.execute(drop.format(sql.Identifier(name)))
