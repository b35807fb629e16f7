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

import asyncio
import dataclasses
import datetime as dt
import json
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
from langgraph_resilience.errors import ThreadLockLostError
from langgraph_resilience.stores import values
from langgraph_resilience.stores.deferred_outcomes import OutcomeTasks, OutcomeWriter
from langgraph_resilience.stores.group_commit import AsyncGroupCommit, GroupCommit, Items, Rows

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
    """Insert the intent unless the key exists; return the new row's key (or no row).
    The writes of the hot path return the key only: the caller knows the rest, and
    a driver pays for every column it reads back (a JSON parse for ``args``)."""
    get: str
    outcome: str
    """Record the outcome of a pending intent, committed durably; return its key."""
    relaxed_outcome: str
    """The same, not waiting for its commit to be flushed (see ``sync_outcomes``)."""
    outcome_insert: str | None
    """An outcome for a key with no intent, when `outcome` does not insert one (its key)."""
    unresolved: str
    done_keys: str
    """The thread's done keys of a fingerprint, newest first (rows with ``key``)."""
    for_thread: str
    release: str
    purge: str
    """Delete one batch of completed rows older than ``seconds``."""
    list_pending: str
    record_of: Callable[[Any], IdempotencyRecord]
    purged: Callable[[Sequence[Any]], int]
    """How many rows a `purge` batch deleted, from the rows it returned."""
    intent_unresolved: str | None = None
    """`intent` and, in the same round trip, the thread's other records of the same
    fingerprint: rows tagged ``lgr_kind`` (``new``: the intent written, its key;
    ``sibling``: a pending one, whole; ``done``: a done one, its key and creation
    time). None: the claim, `unresolved` and `done_keys` are three statements."""
    fences: Callable[[], str] | None = None
    """The thread leases the writer's context holds (JSON, the ``fences`` parameter of
    the intent, outcome and release statements), when the backend fences writes: the
    intent and the release are refused (`ThreadLockLostError`) once a newer holder
    exists. None: no fencing (SQLite, whose lock is a file lock)."""
    stale_of: Callable[[Any], bool] | None = None
    """Whether an outcome's row says the writer's lease is gone: the outcome is kept
    (an effect that ran is a fact) and the run is stopped right after."""
    intents_unresolved: str | None = None
    """`intent_unresolved` for several keys of one thread (arrays ``keys``, ``tools``,
    ``args``, ``fingerprints``), each row naming the key it answers (``lgr_for``):
    a step's concurrent claims in one statement (`group_commit`). None: one each."""
    outcomes: str | None = None
    """`outcome` for several keys (arrays ``keys``, ``statuses``, ``results``)."""
    relaxed_outcomes: str | None = None
    """`relaxed_outcome` for several keys."""


_ARRAYS = {
    "key": "keys",
    "tool": "tools",
    "args": "args",
    "fingerprint": "fingerprints",
    "status": "statuses",
    "result": "results",
}
"""A grouped statement's per-key parameters, each sent as an array (its name)."""
_SHARED = ("thread_id", "fences")
"""A grouped statement's parameters shared by its group."""
_Groups = tuple[GroupCommit, AsyncGroupCommit]


def _grouped_by(
    send: Callable[[str, str, Items], Flow[Rows]], one: str | None, many: str | None
) -> _Groups | None:
    """Group commit of statement `one` through `many`, when the backend has both."""
    if one is None or many is None:
        return None
    return (
        GroupCommit(lambda items: drive(send(one, many, items), _NEVER_SLEEPS)),
        AsyncGroupCommit(lambda items: adrive(send(one, many, items), _NEVER_SLEEPS)),
    )


def _lost_claim(key: str) -> RuntimeError:
    return RuntimeError(
        f"idempotency key {key!r} was released by another worker {_CLAIM_RETRIES} times "
        "in a row while this one tried to read it; release() is racing claim()"
    )


class SqlIdempotencyStore:
    """The `~langgraph_resilience.core.effects.IdempotencyStore` over one `Runner`:
    each method drives one statement script, `drive` for it and `adrive` for its twin."""

    def __init__(
        self,
        runner: Runner,
        dialect: LedgerDialect,
        *,
        relaxed: bool,
        deferred: bool = False,
        is_async: bool = False,
    ) -> None:
        self._rows = runner.rows
        self._arows = runner.arows
        self._runner = runner
        self._dialect = dialect
        self._outcome_sql = dialect.relaxed_outcome if relaxed else dialect.outcome
        many = dialect.relaxed_outcomes if relaxed else dialect.outcomes
        self._claims = _grouped_by(
            self._sent, dialect.intent_unresolved, dialect.intents_unresolved
        )
        """A step's concurrent claims, sent as one statement (None: each on its own)."""
        self._outcomes = _grouped_by(self._sent, self._outcome_sql, many)
        self._behind = OutcomeWriter(self._write_deferred) if deferred and not is_async else None
        """Outcomes handed over by `defer_outcome`, not written yet (None: never deferred)."""
        self._tasks = OutcomeTasks(self._awrite_deferred) if deferred and is_async else None
        """An async runner's deferred outcomes: tasks on its loop."""

    # ----------------------------------------------------------- deferred outcomes

    def _write_deferred(self, key: str, result: Any, status: OutcomeStatus) -> None:
        drive(self._record(key, result, status), _NEVER_SLEEPS)

    async def _awrite_deferred(self, key: str, result: Any, status: OutcomeStatus) -> None:
        await adrive(self._record(key, result, status), _NEVER_SLEEPS)

    def _wait(
        self, key: str | None = None, thread_id: str | None = None, fp: str | None = None
    ) -> None:
        """Before a read or a write that could see them: the deferred outcomes of `key`
        or of `thread_id`'s effect `fp` (any of its effects when None) written (every
        one when `key` and `thread_id` are both None)."""
        if self._behind is not None:
            self._behind.wait(key, thread_id, fp)
        tasks, loop = self._tasks, getattr(self._runner, "loop", None)
        if tasks is not None and loop is not None and tasks.matching(key, thread_id, fp):
            asyncio.run_coroutine_threadsafe(tasks.wait(key, thread_id, fp), loop).result()

    async def _await(
        self, key: str | None = None, thread_id: str | None = None, fp: str | None = None
    ) -> None:
        behind = self._behind
        if behind is not None and behind.holds(key, thread_id, fp):
            await asyncio.to_thread(behind.wait, key, thread_id, fp)
        if self._tasks is not None:
            await self._tasks.wait(key, thread_id, fp)

    def defer_outcome(
        self,
        key: str,
        result: Any,
        *,
        status: OutcomeStatus = "done",
        thread_id: str | None = None,
        fingerprint: str | None = None,
    ) -> None:
        """Record the outcome of a pending intent without waiting for it (when the store
        defers outcomes; else at once): a daemon thread writes it. Until it is written,
        this store's reads of `key` or of `thread_id`'s effect `fingerprint` (a claim
        that returns the unresolved intents, `unresolved`, `for_thread`) wait for it, so
        this process never
        sees the intent pending; a crash before it is written leaves the intent pending,
        reconciled on resume, never re-run blindly."""
        if self._behind is None:
            self.record_outcome(key, result, status=status)
            return
        values.json_text(result, what="result")  # refused here, not in the writer
        self._behind.put(key, result, status, thread_id, fingerprint)

    async def adefer_outcome(
        self,
        key: str,
        result: Any,
        *,
        status: OutcomeStatus = "done",
        thread_id: str | None = None,
        fingerprint: str | None = None,
    ) -> None:
        """Async `defer_outcome` (handing over does not block the loop; an async store
        writes it in a task on its loop)."""
        if self._tasks is not None:
            values.json_text(result, what="result")
            self._tasks.put(key, result, status, thread_id, fingerprint)
            return
        if self._behind is None:
            await self.arecord_outcome(key, result, status=status)
            return
        self.defer_outcome(key, result, status=status, thread_id=thread_id, fingerprint=fingerprint)

    def _wait_claim(self, key: str, thread_id: str, fingerprint: str | None) -> None:
        """A claim reads its key, and the effect's unresolved intents when it returns them."""
        if fingerprint is not None and self._dialect.intent_unresolved is not None:
            self._wait(key, thread_id, fingerprint)
        else:
            self._wait(key)

    async def aflush(self) -> None:
        """Async `flush` (an async store's outcome tasks awaited)."""
        if self._tasks is not None:
            await self._tasks.wait(None, None)
        if self._behind is not None:
            await asyncio.to_thread(self._behind.wait, None, None, None)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every deferred outcome is written (or given up); False on timeout."""
        return self._behind is None or self._behind.wait(None, None, None, timeout=timeout)

    # ----------------------------------------------------------- the scripts

    def _fenced(self) -> dict[str, str]:
        """The ``fences`` parameter of a write: the leases of the caller's context."""
        fences = self._dialect.fences
        return {} if fences is None else {"fences": fences()}

    def _run(self, query: str, params: Mapping[str, Any]) -> Call:
        """One statement of a script: its rows are sent back into the script."""
        return Call(self._rows, self._arows, (query, params))

    def _grouped(self, groups: _Groups | None, sql: str, params: dict[str, Any]) -> Call:
        """A statement of one key, sent with the concurrent ones of its group (its
        thread and lease) when the backend can send them as one."""
        if groups is None:
            return self._run(sql, params)
        sync, async_ = groups
        group = (params.get("thread_id"), params.get("fences"))
        return Call(sync.rows, async_.rows, (group, params["key"], params))

    def _sent(self, one: str, many: str, items: Items) -> Flow[Rows]:
        """One statement for the items: `one`'s for a lone key, else `many`'s with each
        per-key parameter as an array, its rows split by the key they answer."""
        if len(items) == 1:
            ((key, params),) = items.items()
            return {key: (yield self._run(one, params))}
        first = next(iter(items.values()))
        arrays: dict[str, Any] = {name: first[name] for name in _SHARED if name in first}
        for name, plural in _ARRAYS.items():
            if name in first:
                arrays[plural] = [params[name] for params in items.values()]
        rows = yield self._run(many, arrays)
        found: dict[str, list[Any]] = {key: [] for key in items}
        for row in rows:
            found[row["lgr_for" if "lgr_for" in row else "key"]].append(row)
        return dict(found.items())

    def _claim(
        self, key: str, tool: str, args_json: str, thread_id: str, fingerprint: str | None
    ) -> Flow[Claim]:
        """The intent (``new``), else the record already there (``pending``/``done``)."""
        dialect = self._dialect
        args = values.audited(args_json)
        params = {
            "key": key,
            "tool": tool,
            "thread_id": thread_id,
            "args": values.json_text(args, what="args"),
            "fingerprint": fingerprint,
            **self._fenced(),
        }
        # what the intent holds, known here: the statement returns its key only
        intent = IdempotencyRecord(
            key=key,
            status="pending",
            tool=tool,
            thread_id=thread_id,
            args=args,
            fingerprint=fingerprint,
        )
        together = dialect.intent_unresolved if fingerprint is not None else None
        for _ in range(_CLAIM_RETRIES):
            if together is not None:
                rows = yield self._grouped(self._claims, together, params)
                if any(row["lgr_kind"] == "new" for row in rows):
                    found = [dialect.record_of(r) for r in rows if r["lgr_kind"] == "sibling"]
                    found.sort(key=lambda r: (r.created_at, r.key))
                    done = [r for r in rows if r["lgr_kind"] == "done"]
                    done.sort(key=lambda r: (r["created_at"], r["key"]), reverse=True)
                    keys = tuple(str(r["key"]) for r in done)
                    return Claim("new", intent, unresolved=tuple(found), done=keys)
            else:
                rows = yield self._run(dialect.intent, params)
                if rows:
                    return Claim("new", intent)
            rows = yield self._run(dialect.get, {"key": key})
            if rows:  # else it was released since: claim again
                return values.claim_found(dialect.record_of(rows[0]))
        raise _lost_claim(key)

    def _record(self, key: str, result: Any, status: str) -> Flow[IdempotencyRecord]:
        """The outcome on the pending intent; else the recorded outcome wins; else (no
        intent at all) a new record."""
        dialect = self._dialect
        outcome, text = values.outcome_status(status), values.stored_json(result, what="result")
        params = {"key": key, "status": outcome, "result": text, **self._fenced()}
        # what it records, known here (as the ledger holds it: JSON); the statement
        # returns its key only
        recorded = IdempotencyRecord(key=key, status=outcome, result=json.loads(text))
        for _ in range(_CLAIM_RETRIES):
            rows = yield self._grouped(self._outcomes, self._outcome_sql, params)
            if rows:
                if dialect.stale_of is not None and dialect.stale_of(rows[0]):
                    raise ThreadLockLostError(str(rows[0]["thread_id"]), "outcome kept")
                return recorded
            rows = yield self._run(dialect.get, {"key": key})
            if rows and rows[0]["status"] != "pending":
                return dialect.record_of(rows[0])
            if not rows and dialect.outcome_insert is not None:
                rows = yield self._run(dialect.outcome_insert, params)
                if rows:
                    return recorded
        raise _lost_claim(key)

    def _records(self, query: str, params: Mapping[str, Any]) -> Flow[list[IdempotencyRecord]]:
        rows = yield self._run(query, params)
        return [self._dialect.record_of(row) for row in rows]

    def _get(self, key: str) -> Flow[IdempotencyRecord | None]:
        records = yield from self._records(self._dialect.get, {"key": key})
        return records[0] if records else None

    def _release(self, key: str) -> Flow[bool]:
        rows = yield self._run(self._dialect.release, {"key": key, **self._fenced()})
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

    def _done_keys(self, thread_id: str, fingerprint: str) -> Flow[list[str]]:
        params = {"thread_id": thread_id, "fingerprint": fingerprint}
        rows = yield self._run(self._dialect.done_keys, params)
        return [str(row["key"]) for row in rows]

    def _for_thread(self, thread_id: str) -> Flow[list[IdempotencyRecord]]:
        return (yield from self._records(self._dialect.for_thread, {"thread_id": thread_id}))

    # ----------------------------------------------------------- sync

    def claim(
        self, key: str, *, tool: str, args_json: str, thread_id: str, fingerprint: str | None = None
    ) -> Claim:
        """Atomically write an intent for `key` unless one exists (one round trip); with a
        `fingerprint`, the claim also returns the unresolved intents of that effect."""
        self._wait_claim(key, thread_id, fingerprint)
        return drive(self._claim(key, tool, args_json, thread_id, fingerprint), _NEVER_SLEEPS)

    def unresolved(self, thread_id: str, fingerprint: str) -> list[IdempotencyRecord]:
        """The thread's pending intents with this fingerprint, oldest first (one round trip)."""
        self._wait(None, thread_id, fingerprint)
        return drive(self._unresolved(thread_id, fingerprint), _NEVER_SLEEPS)

    def record_outcome(
        self, key: str, result: Any, *, status: OutcomeStatus = "done"
    ) -> IdempotencyRecord:
        """Record the outcome of a pending intent (one round trip); the first wins."""
        self._wait(key)
        return drive(self._record(key, result, status), _NEVER_SLEEPS)

    def release(self, key: str) -> bool:
        """Forget a pending or failed record so that the next claim is ``new``."""
        self._wait(key)
        return drive(self._release(key), _NEVER_SLEEPS)

    def get(self, key: str) -> IdempotencyRecord | None:
        """The record of `key`, or None."""
        self._wait(key)
        return drive(self._get(key), _NEVER_SLEEPS)

    def for_thread(self, thread_id: str) -> list[IdempotencyRecord]:
        """Every record of one thread, oldest first."""
        self._wait(None, thread_id)
        return drive(self._for_thread(thread_id), _NEVER_SLEEPS)

    def purge(self, older_than: float | dt.timedelta = DEFAULT_RETENTION) -> int:
        """Delete the completed records whose outcome is older than `older_than` (by the
        backend's clock), in batches of 10,000 rows; never a pending one."""
        self._wait()
        return drive(self._purge(older_than), _NEVER_SLEEPS)

    def list_pending(
        self, older_than: float | dt.timedelta = 0.0, *, limit: int | None = None
    ) -> list[IdempotencyRecord]:
        """The pending intents claimed at least `older_than` ago, oldest first."""
        self._wait()
        return drive(self._pending(older_than, limit), _NEVER_SLEEPS)

    # ----------------------------------------------------------- async

    async def aclaim(
        self, key: str, *, tool: str, args_json: str, thread_id: str, fingerprint: str | None = None
    ) -> Claim:
        """Async `claim`."""
        if fingerprint is not None and self._dialect.intent_unresolved is not None:
            await self._await(key, thread_id, fingerprint)
        else:
            await self._await(key)
        flow = self._claim(key, tool, args_json, thread_id, fingerprint)
        return await adrive(flow, _NEVER_SLEEPS)

    def done_keys(self, thread_id: str, fingerprint: str) -> list[str]:
        """The thread's done keys with this fingerprint, newest first (one round trip)."""
        self._wait(None, thread_id, fingerprint)
        return drive(self._done_keys(thread_id, fingerprint), _NEVER_SLEEPS)

    async def adone_keys(self, thread_id: str, fingerprint: str) -> list[str]:
        """Async `done_keys`."""
        await self._await(None, thread_id, fingerprint)
        return await adrive(self._done_keys(thread_id, fingerprint), _NEVER_SLEEPS)

    async def aunresolved(self, thread_id: str, fingerprint: str) -> list[IdempotencyRecord]:
        """Async `unresolved`."""
        await self._await(None, thread_id, fingerprint)
        return await adrive(self._unresolved(thread_id, fingerprint), _NEVER_SLEEPS)

    async def arecord_outcome(
        self, key: str, result: Any, *, status: OutcomeStatus = "done"
    ) -> IdempotencyRecord:
        """Async `record_outcome`."""
        await self._await(key)
        return await adrive(self._record(key, result, status), _NEVER_SLEEPS)

    async def arelease(self, key: str) -> bool:
        """Async `release`."""
        await self._await(key)
        return await adrive(self._release(key), _NEVER_SLEEPS)

    async def aget(self, key: str) -> IdempotencyRecord | None:
        """Async `get`."""
        await self._await(key)
        return await adrive(self._get(key), _NEVER_SLEEPS)

    async def afor_thread(self, thread_id: str) -> list[IdempotencyRecord]:
        """Async `for_thread`."""
        await self._await(None, thread_id)
        return await adrive(self._for_thread(thread_id), _NEVER_SLEEPS)

    async def apurge(self, older_than: float | dt.timedelta = DEFAULT_RETENTION) -> int:
        """Async `purge`."""
        await self._await()
        return await adrive(self._purge(older_than), _NEVER_SLEEPS)

    async def alist_pending(
        self, older_than: float | dt.timedelta = 0.0, *, limit: int | None = None
    ) -> list[IdempotencyRecord]:
        """Async `list_pending`."""
        await self._await()
        return await adrive(self._pending(older_than, limit), _NEVER_SLEEPS)
