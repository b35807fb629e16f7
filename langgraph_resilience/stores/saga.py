"""The saga log: an append-only log of a thread's effects and compensations.

`InMemorySagaLog` keeps it in this process; `SqlSagaLog` is the log over one SQL
`~langgraph_resilience.stores.sql.Runner` (each method one statement, driven by
`drive` or `adrive`), which `~langgraph_resilience.stores.postgres` (``lgr_saga``)
and `~langgraph_resilience.stores.sqlite` build on.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable, Mapping
from typing import Any

from langgraph_resilience.core.clock import Clock, SystemClock
from langgraph_resilience.core.effects import SagaEntry
from langgraph_resilience.core.flow import Call, Flow, adrive, drive
from langgraph_resilience.stores import values
from langgraph_resilience.stores.sql import Runner

__all__ = ["SAGA_COLUMNS", "InMemorySagaLog", "SagaDialect", "SqlSagaLog"]

_NEVER_SLEEPS = SystemClock()

SAGA_COLUMNS = "seq, thread_id, key, tool, action, status, detail, at"
"""The saga log's columns, in every backend, in the order `SagaEntry` has them."""


@dataclasses.dataclass(frozen=True, slots=True)
class SagaDialect:
    """The statements and row reader of one SQL backend of the saga log."""

    append: str
    """Insert one entry; return it."""
    entries: str
    entry_of: Callable[[Any], SagaEntry]


class InMemorySagaLog:
    """An append-only saga log in this process's memory (not durable)."""

    def __init__(self, *, clock: Clock | None = None) -> None:
        self._clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._entries: list[SagaEntry] = []

    def setup(self) -> None:
        """Nothing to create."""

    def append(
        self, thread_id: str, *, key: str, tool: str, action: str, status: str, detail: Any = None
    ) -> SagaEntry:
        """Append one entry and return it with its sequence number."""
        stored = None if detail is None else json.loads(values.stored_json(detail, what="detail"))
        with self._lock:
            at = values.utc(self._clock.time())
            entry = SagaEntry(
                len(self._entries) + 1, thread_id, key, tool, action, status, stored, at
            )
            self._entries.append(entry)
            return entry

    def entries(self, thread_id: str) -> list[SagaEntry]:
        """The thread's entries in append order."""
        with self._lock:
            return [e for e in self._entries if e.thread_id == thread_id]

    async def aappend(
        self, thread_id: str, *, key: str, tool: str, action: str, status: str, detail: Any = None
    ) -> SagaEntry:
        """Async `append`."""
        return self.append(
            thread_id, key=key, tool=tool, action=action, status=status, detail=detail
        )

    async def aentries(self, thread_id: str) -> list[SagaEntry]:
        """Async `entries`."""
        return self.entries(thread_id)


class SqlSagaLog:
    """The `~langgraph_resilience.core.effects.SagaLog` over one `Runner` (append-only:
    no update, no delete)."""

    def __init__(self, runner: Runner, dialect: SagaDialect) -> None:
        self._runner = runner
        self._dialect = dialect

    def _append(self, thread_id: str, entry: Mapping[str, Any]) -> Flow[SagaEntry]:
        detail = entry["detail"]
        text = None if detail is None else values.stored_json(detail, what="detail")
        params = {**entry, "thread_id": thread_id, "detail": text}
        rows = yield Call(self._runner.rows, self._runner.arows, (self._dialect.append, params))
        return self._dialect.entry_of(rows[0])

    def _entries(self, thread_id: str) -> Flow[list[SagaEntry]]:
        query, params = self._dialect.entries, {"thread_id": thread_id}
        rows = yield Call(self._runner.rows, self._runner.arows, (query, params))
        return [self._dialect.entry_of(row) for row in rows]

    def append(
        self, thread_id: str, *, key: str, tool: str, action: str, status: str, detail: Any = None
    ) -> SagaEntry:
        """Append one entry (one round trip) and return it with its sequence number."""
        entry = {"key": key, "tool": tool, "action": action, "status": status, "detail": detail}
        flow = self._append(thread_id, entry)
        return drive(flow, _NEVER_SLEEPS)

    def entries(self, thread_id: str) -> list[SagaEntry]:
        """The thread's entries in append order."""
        return drive(self._entries(thread_id), _NEVER_SLEEPS)

    async def aappend(
        self, thread_id: str, *, key: str, tool: str, action: str, status: str, detail: Any = None
    ) -> SagaEntry:
        """Async `append`."""
        entry = {"key": key, "tool": tool, "action": action, "status": status, "detail": detail}
        flow = self._append(thread_id, entry)
        return await adrive(flow, _NEVER_SLEEPS)

    async def aentries(self, thread_id: str) -> list[SagaEntry]:
        """Async `entries`."""
        return await adrive(self._entries(thread_id), _NEVER_SLEEPS)
