"""Fixtures of the fault suite: the proxy, the direct connection, and the report.

Every scenario fills a `Tally` (through the ``tally`` fixture); at the end of the
session one table per scenario is printed: trials, payments expected and made,
duplicates, lost payments, the exception types that reached the user, wall time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.faults.harness import Tally
from tests.faults.proxy import PgProxy

_TALLIES: list[Tally] = []


@pytest.fixture
def proxy() -> Iterator[PgProxy]:
    """A proxy to the local server, started here and stopped (thread joined) after."""
    with PgProxy() as running:
        yield running
    left = [t.name for t in threading.enumerate() if t.name == "pg-proxy"]
    assert not left, f"the proxy left threads behind: {left}"


@pytest.fixture
def direct(pg_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """A direct (not proxied) autocommit connection to the test's database."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        yield conn


@pytest.fixture
def tally(request: pytest.FixtureRequest) -> Iterator[Tally]:
    """The scenario's tally, reported at the end of the session."""
    params = request.node.callspec.params if hasattr(request.node, "callspec") else {}
    # the mode, and the route when there is one (straight to PostgreSQL or via PgBouncer)
    mode = "/".join(str(params[k]) for k in ("pg_route", "mode") if k in params) or "-"
    scenario = request.node.originalname.removeprefix("test_")
    record = Tally(scenario=scenario, mode=mode)
    _TALLIES.append(record)
    yield record
    record.wall = time.monotonic() - record.started


def _row(t: Tally) -> list[str]:
    errors = ", ".join(f"{k} x{n}" for k, n in sorted(t.errors.items())) or "-"
    return [
        t.mode,
        str(len(t.trials)),
        str(t.expected),
        str(t.made),
        str(t.duplicates),
        str(t.lost),
        f"{t.wall:.1f}s",
        errors,
    ]


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _TALLIES:
        return
    head = ["mode", "trials", "expected", "made", "dup", "lost", "wall", "exceptions seen by type"]
    write = terminalreporter.write_line
    terminalreporter.write_sep("=", "fault suite: payments per scenario")
    scenarios: dict[str, list[Tally]] = {}
    for t in _TALLIES:
        scenarios.setdefault(t.scenario, []).append(t)
    for scenario, rows in scenarios.items():
        table = [head, *(_row(t) for t in rows)]
        widths = [max(len(r[i]) for r in table) for i in range(len(head) - 1)]
        write(f"{scenario}:")
        for r in table:
            cells = "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False))
            write(f"  {cells}  {r[-1]}")
        for t in rows:
            for fact in t.info:
                write(f"    [{t.mode}] {fact}")
            for note, n in sorted(t.notes.items()):
                write(f"    [{t.mode}] {note}: {n}")
