"""The SQL ledger, written once: statement scripts that serve every SQL backend.

A ledger operation is a short *script*: a `~langgraph_resilience.core.flow` flow
that yields ``Call(runner.rows, runner.arows, (sql, params))`` and decides its next
statement from the rows of the last (a claim reads the existing record only when
its insert found one). `SqlIdempotencyStore` and `SqlSagaLog` run every script with
`drive` for their sync methods and `adrive` for their async twins, over a `Runner`
(one SQL backend: `~langgraph_resilience.stores.postgres.Postgres`, sync or async,
or `~langgraph_resilience.stores.sqlite.Sqlite`) and a `LedgerDialect` (that
backend's statements and row readers). So sync PostgreSQL, async PostgreSQL and
SQLite run the same decisions.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from langgraph_resilience.core.clock import SystemClock
from langgraph_resilience.core.effects import (
    DEFAULT_RETENTION,
    Claim,
    IdempotencyRecord,
    OutcomeStatus,
)
from langgraph_resilience.core.flow import Call, Flow, adrive, drive
from langgraph_resilience.stores import values

__all__ = [
    "COLUMNS",
    "LedgerDialect",
    "Runner",
    "SqlIdempotencyStore",
]

T = TypeVar("T")

COLUMNS = "key, tool, thread_id, args, status, result, created_at, updated_at, fingerprint"
"""The ledger's columns, in every backend, in the order the row readers expect."""

_CLAIM_RETRIES = 5
_PURGE_BATCH = 10_000
"""Rows deleted per statement by `purge`: short transactions."""
_NEVER_SLEEPS = SystemClock()
"""The drivers' clock: a statement script never waits."""


class Runner(Protocol):
    """One SQL backend: run a statement, return its rows (sync, and async)."""

    def rows(self, query: str, params: Mapping[str, Any]) -> Sequence[Any]:
        """Run `query` with `params` and commit; the rows it returned (or none)."""
        ...

    async def arows(self, query: str, params: Mapping[str, Any]) -> Sequence[Any]:
        """Async `rows`."""
        ...


@dataclasses.dataclass(frozen=True, slots=True)
class LedgerDialect:
    """The statements and row reader of one SQL backend of the ledger.

    Every statement takes named parameters; the backend adds ``now`` where its
    clock is the store's (SQLite) rather than the server's (PostgreSQL).
    """

    intent: str
    """Insert the intent unless the key exists; return the new row (or none)."""
    get: str
    outcome: str
    """Record the outcome of a pending intent, committed durably."""
    relaxed_outcome: str
    """The same, not waiting for its commit to be flushed (see ``sync_outcomes``)."""
    outcome_insert: str | None
    """An outcome for a key with no intent, when `outcome` does not insert one."""
    unresolved: str
    for_thread: str
    release: str
    purge: str
    """Delete one batch of completed rows older than ``seconds``."""
    list_pending: str
    record_of: Callable[[Any], IdempotencyRecord]
    purged: Callable[[Sequence[Any]], int]
    """How many rows a `purge` batch deleted, from the rows it returned."""


def _lost_claim(key: str) -> RuntimeError:
    return RuntimeError(
        f"idempotency key {key!r} was released by another worker {_CLAIM_RETRIES} times "
        "in a row while this one tried to read it; release() is racing claim()"
    )


class SqlIdempotencyStore:
    """The `~langgraph_resilience.core.effects.IdempotencyStore` over one `Runner`:
    each method drives one statement script, `drive` for it and `adrive` for its twin."""

    def __init__(self, runner: Runner, dialect: LedgerDialect, *, relaxed: bool) -> None:
        self._rows = runner.rows
        self._arows = runner.arows
        self._dialect = dialect
        self._outcome_sql = dialect.relaxed_outcome if relaxed else dialect.outcome

    # ----------------------------------------------------------- the scripts

    def _run(self, query: str, params: Mapping[str, Any]) -> Call:
        """One statement of a script: its rows are sent back into the script."""
        return Call(self._rows, self._arows, (query, params))

    def _claim(
        self, key: str, tool: str, args_json: str, thread_id: str, fingerprint: str | None
    ) -> Flow[Claim]:
        """The intent (``new``), else the record already there (``pending``/``done``)."""
        dialect = self._dialect
        params = {
            "key": key,
            "tool": tool,
            "thread_id": thread_id,
            "args": values.audit_args(args_json),
            "fingerprint": fingerprint,
        }
        for _ in range(_CLAIM_RETRIES):
            rows = yield self._run(dialect.intent, params)
            if rows:
                return Claim("new", dialect.record_of(rows[0]))
            rows = yield self._run(dialect.get, {"key": key})
            if rows:  # else it was released since: claim again
                return values.claim_found(dialect.record_of(rows[0]))
        raise _lost_claim(key)

    def _record(self, key: str, result: Any, status: str) -> Flow[IdempotencyRecord]:
        """The outcome on the pending intent; else the recorded outcome wins; else (no
        intent at all) a new record."""
        dialect = self._dialect
        params = {
            "key": key,
            "status": values.outcome_status(status),
            "result": values.json_text(result, what="result"),
        }
        for _ in range(_CLAIM_RETRIES):
            rows = yield self._run(self._outcome_sql, params)
            if rows:
                return dialect.record_of(rows[0])
            rows = yield self._run(dialect.get, {"key": key})
            if rows and rows[0]["status"] != "pending":
                return dialect.record_of(rows[0])
            if not rows and dialect.outcome_insert is not None:
                rows = yield self._run(dialect.outcome_insert, params)
                if rows:
                    return dialect.record_of(rows[0])
        raise _lost_claim(key)

    def _records(self, query: str, params: Mapping[str, Any]) -> Flow[list[IdempotencyRecord]]:
        rows = yield self._run(query, params)
        return [self._dialect.record_of(row) for row in rows]

    def _get(self, key: str) -> Flow[IdempotencyRecord | None]:
        records = yield from self._records(self._dialect.get, {"key": key})
        return records[0] if records else None

    def _release(self, key: str) -> Flow[bool]:
        rows = yield self._run(self._dialect.release, {"key": key})
        return bool(rows)

    def _purge(self, older_than: float | dt.timedelta) -> Flow[int]:
        """Delete completed records in batches until a batch comes back short."""
        seconds = values.duration_seconds(older_than, field="older_than", positive=True)
        total = 0
        while True:
            rows = yield self._run(self._dialect.purge, {"seconds": seconds, "batch": _PURGE_BATCH})
            deleted = self._dialect.purged(rows)
            total += deleted
            if deleted < _PURGE_BATCH:
                return total

    def _pending(
        self, older_than: float | dt.timedelta, limit: int | None
    ) -> Flow[list[IdempotencyRecord]]:
        seconds = values.duration_seconds(older_than, field="older_than", positive=False)
        params = {"seconds": seconds, "limit": values.check_limit(limit)}
        return (yield from self._records(self._dialect.list_pending, params))

    def _unresolved(self, thread_id: str, fingerprint: str) -> Flow[list[IdempotencyRecord]]:
        params = {"thread_id": thread_id, "fingerprint": fingerprint}
        return (yield from self._records(self._dialect.unresolved, params))

    def _for_thread(self, thread_id: str) -> Flow[list[IdempotencyRecord]]:
        return (yield from self._records(self._dialect.for_thread, {"thread_id": thread_id}))

    # ----------------------------------------------------------- sync

    def claim(
        self, key: str, *, tool: str, args_json: str, thread_id: str, fingerprint: str | None = None
    ) -> Claim:
        """Atomically write an intent for `key` unless one exists (one round trip)."""
        return drive(self._claim(key, tool, args_json, thread_id, fingerprint), _NEVER_SLEEPS)

    def unresolved(self, thread_id: str, fingerprint: str) -> list[IdempotencyRecord]:
        """The thread's pending intents with this fingerprint, oldest first (one round trip)."""
        return drive(self._unresolved(thread_id, fingerprint), _NEVER_SLEEPS)

    def record_outcome(
        self, key: str, result: Any, *, status: OutcomeStatus = "done"
    ) -> IdempotencyRecord:
        """Record the outcome of a pending intent (one round trip); the first wins."""
        return drive(self._record(key, result, status), _NEVER_SLEEPS)

    def release(self, key: str) -> bool:
        """Forget a pending or failed record so that the next claim is ``new``."""
        return drive(self._release(key), _NEVER_SLEEPS)

    def get(self, key: str) -> IdempotencyRecord | None:
        """The record of `key`, or None."""
        return drive(self._get(key), _NEVER_SLEEPS)

    def for_thread(self, thread_id: str) -> list[IdempotencyRecord]:
        """Every record of one thread, oldest first."""
        return drive(self._for_thread(thread_id), _NEVER_SLEEPS)

    def purge(self, older_than: float | dt.timedelta = DEFAULT_RETENTION) -> int:
        """Delete the completed records whose outcome is older than `older_than` (by the
        backend's clock), in batches of 10,000 rows; never a pending one."""
        return drive(self._purge(older_than), _NEVER_SLEEPS)

    def list_pending(
        self, older_than: float | dt.timedelta = 0.0, *, limit: int | None = None
    ) -> list[IdempotencyRecord]:
        """The pending intents claimed at least `older_than` ago, oldest first."""
        return drive(self._pending(older_than, limit), _NEVER_SLEEPS)

    # ----------------------------------------------------------- async

    async def aclaim(
        self, key: str, *, tool: str, args_json: str, thread_id: str, fingerprint: str | None = None
    ) -> Claim:
        """Async `claim`."""
        flow = self._claim(key, tool, args_json, thread_id, fingerprint)
        return await adrive(flow, _NEVER_SLEEPS)

    async def aunresolved(self, thread_id: str, fingerprint: str) -> list[IdempotencyRecord]:
        """Async `unresolved`."""
        return await adrive(self._unresolved(thread_id, fingerprint), _NEVER_SLEEPS)

    async def arecord_outcome(
        self, key: str, result: Any, *, status: OutcomeStatus = "done"
    ) -> IdempotencyRecord:
        """Async `record_outcome`."""
        return await adrive(self._record(key, result, status), _NEVER_SLEEPS)

    async def arelease(self, key: str) -> bool:
        """Async `release`."""
        return await adrive(self._release(key), _NEVER_SLEEPS)

    async def aget(self, key: str) -> IdempotencyRecord | None:
        """Async `get`."""
        return await adrive(self._get(key), _NEVER_SLEEPS)

    async def afor_thread(self, thread_id: str) -> list[IdempotencyRecord]:
        """Async `for_thread`."""
        return await adrive(self._for_thread(thread_id), _NEVER_SLEEPS)

    async def apurge(self, older_than: float | dt.timedelta = DEFAULT_RETENTION) -> int:
        """Async `purge`."""
        return await adrive(self._purge(older_than), _NEVER_SLEEPS)

    async def alist_pending(
        self, older_than: float | dt.timedelta = 0.0, *, limit: int | None = None
    ) -> list[IdempotencyRecord]:
        """Async `list_pending`."""
        return await adrive(self._pending(older_than, limit), _NEVER_SLEEPS)
