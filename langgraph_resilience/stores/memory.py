"""The in-process ledger (`InMemoryIdempotencyStore`), and the LRU bound that every
in-process store (ledger, breakers, retry budgets) keeps.

Not durable: a crash forgets everything. Tests, notebooks, one-process apps; the
durable twins are in `langgraph_resilience.stores.postgres` and
`langgraph_resilience.stores.sqlite`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from langgraph_resilience.core.clock import Clock, SystemClock
from langgraph_resilience.core.effects import (
    DEFAULT_RETENTION,
    Claim,
    IdempotencyRecord,
    OutcomeStatus,
)
from langgraph_resilience.errors import ConfigurationError
from langgraph_resilience.stores import values

__all__ = ["DEFAULT_MAX_ENTRIES", "SWEEP_EVERY", "InMemoryIdempotencyStore"]


DEFAULT_MAX_ENTRIES = 10_000
SWEEP_EVERY = 256
"""Writes between two sweeps for completed records of threads that are gone."""
"""How many keys an in-process breaker or retry-budget store holds by default."""


def check_max_entries(value: int | None) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ConfigurationError(f"max_entries must be None or an int >= 1, got {value!r}")
    return value


def evict_lru(
    states: OrderedDict[str, Any], limit: int, keep: str, rules: tuple[Callable[[Any], bool], ...]
) -> None:
    """Bring `states` (least recently used first) from over `limit` down to a tenth
    below it, so the scan is paid once per limit/10 new keys. Each rule in turn picks
    victims in LRU order; `keep` (the key just written) is never one, nor any entry
    no rule accepts."""
    excess = len(states) - (limit - limit // 10)
    for rule in rules:
        if excess <= 0:
            return
        victims = []
        for key, value in states.items():
            if key != keep and rule(value):
                victims.append(key)
                if len(victims) == excess:
                    break
        for key in victims:
            del states[key]
        excess -= len(victims)


class InMemoryIdempotencyStore:
    """A thread-safe ledger in this process's memory: tests, notebooks, one-process apps.

    It is not durable: a crash forgets every intent. Values are stored as JSON
    text, so it accepts and returns exactly what the durable backends do.

    Unbounded by default (like the durable tables: nothing is forgotten unless
    you ask). A long-lived process bounds it with `max_entries` (records kept)
    and/or `ttl` (seconds, or a timedelta, a completed record is kept after it
    was last written or replayed). Both evict only *completed* records (``done``
    or ``failed``), least recently used first, on the next write; a ``pending``
    record (outcome UNKNOWN) is never evicted, so pending records alone may
    exceed `max_entries`. With `thread_alive` (what the ledger chosen beside an
    `InMemorySaver` passes: is the thread still in the saver?), completed records of
    threads that are gone are dropped every `SWEEP_EVERY` writes: a deleted thread
    is never resumed, so its records can never be replayed, and a process that
    deletes its threads keeps a store of flat size. An evicted record is forgotten
    exactly as `purge` forgets one: a replay of its call after that runs again, so keep `ttl`
    above the longest time a thread of this process may wait before it is
    resumed (see "Retention" in the module docs).

    >>> store = InMemoryIdempotencyStore()
    >>> store.claim("k", tool="pay", args_json="{}", thread_id="t").state
    'new'
    >>> store.claim("k", tool="pay", args_json="{}", thread_id="t").state
    'pending'
    """

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        max_entries: int | None = None,
        ttl: float | dt.timedelta | None = None,
        thread_alive: Callable[[str], bool] | None = None,
    ) -> None:
        self._thread_alive = thread_alive
        self._writes = 0
        self._clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._rows: dict[str, tuple[IdempotencyRecord, str | None]] = {}
        self._completed: OrderedDict[str, float] = OrderedDict()
        """Completed keys, least recently used first, with when they were last used."""
        self._pending: dict[tuple[str | None, str | None], dict[str, None]] = {}
        """Pending keys by (thread, fingerprint), oldest first: `unresolved` reads its
        thread's few instead of scanning every record the store holds."""
        self._done: dict[tuple[str | None, str | None], dict[str, None]] = {}
        """Done keys by (thread, fingerprint), oldest first (`done_keys`)."""
        self.max_entries = check_max_entries(max_entries)
        self.ttl = None if ttl is None else values.duration_seconds(ttl, field="ttl", positive=True)

    def __len__(self) -> int:
        """The records held (pending and completed)."""
        with self._lock:
            return len(self._rows)

    def _touch(self, key: str, now: float) -> None:
        """Mark a completed record as just used (the LRU order of eviction)."""
        if key in self._completed:
            self._completed[key] = now
            self._completed.move_to_end(key)

    def _evict(self, now: float, keep: str | None = None) -> None:
        """Drop completed records past `ttl`, then the least recently used ones while
        over `max_entries` (never `keep`, the record just written). Pending records
        are never candidates."""
        completed = self._completed
        self._writes += 1
        if self._thread_alive is not None and self._writes % SWEEP_EVERY == 0:
            alive = self._thread_alive
            for key in [k for k in completed if not alive(self._rows[k][0].thread_id or "")]:
                self._drop(key)
        if self.ttl is not None:
            horizon = now - self.ttl
            while completed:
                key, used = next(iter(completed.items()))
                if used > horizon:
                    break
                self._drop(key)
        if self.max_entries is not None:
            while len(self._rows) > self.max_entries and completed:
                key = next(iter(completed))
                if key == keep:
                    break
                self._drop(key)

    def _drop(self, key: str) -> None:
        """Forget a record: out of the rows, the LRU order and the done index."""
        self._completed.pop(key, None)
        row = self._rows.pop(key, None)
        if row is not None and row[0].status == "done":
            index = (row[0].thread_id, row[0].fingerprint)
            keys = self._done.get(index)
            if keys is not None:
                keys.pop(key, None)
                if not keys:
                    del self._done[index]

    def _unindex(self, record: IdempotencyRecord) -> None:
        """A record leaves pending (an outcome, a release): out of `_pending`."""
        if record.status != "pending":
            return
        index = (record.thread_id, record.fingerprint)
        keys = self._pending.get(index)
        if keys is not None:
            keys.pop(record.key, None)
            if not keys:
                del self._pending[index]

    def setup(self) -> None:
        """Nothing to create."""

    def _load(self, key: str) -> IdempotencyRecord | None:
        row = self._rows.get(key)
        return None if row is None else self._loaded(row)

    @staticmethod
    def _loaded(row: tuple[IdempotencyRecord, str | None]) -> IdempotencyRecord:
        """A row as a caller sees it: the result parsed from its JSON, so no caller shares
        the stored value (a pending row has none: its frozen record is handed out as is)."""
        record, result_json = row
        if result_json is None:
            return record  # pending: the record holds no result to share
        return dataclasses.replace(record, result=json.loads(result_json))

    def claim(
        self, key: str, *, tool: str, args_json: str, thread_id: str, fingerprint: str | None = None
    ) -> Claim:
        """Atomically write an intent for `key` unless one exists."""
        args = values.audited(args_json)
        with self._lock:
            existing = self._load(key)
            clock_now = self._clock.time()
            if existing is not None:
                self._touch(key, clock_now)
                return values.claim_found(existing)
            now = values.utc(clock_now)
            record = IdempotencyRecord(
                key, "pending", None, tool, thread_id, args, now, now, fingerprint
            )
            self._rows[key] = (record, None)
            self._pending.setdefault((thread_id, fingerprint), {})[key] = None
            self._evict(clock_now)
            return Claim("new", record)

    def unresolved(self, thread_id: str, fingerprint: str) -> list[IdempotencyRecord]:
        """The thread's pending intents with this fingerprint, oldest first."""
        with self._lock:
            keys = self._pending.get((thread_id, fingerprint)) or {}
            return [self._rows[key][0] for key in keys]

    def done_keys(self, thread_id: str, fingerprint: str) -> list[str]:
        """The thread's done keys with this fingerprint, newest first."""
        with self._lock:
            return list(reversed(self._done.get((thread_id, fingerprint)) or {}))

    def record_outcome(
        self, key: str, result: Any, *, status: OutcomeStatus = "done"
    ) -> IdempotencyRecord:
        """Record the outcome of a pending intent; the first outcome recorded wins."""
        status = values.outcome_status(status)
        text = values.stored_json(result, what="result")
        with self._lock:
            row = self._rows.get(key)
            clock_now = self._clock.time()
            if row is not None and row[0].status != "pending":
                self._touch(key, clock_now)
                return self._loaded(row)
            now = values.utc(clock_now)
            base = (
                row[0]
                if row is not None
                else IdempotencyRecord(key=key, status="pending", created_at=now)
            )
            record = dataclasses.replace(base, status=status, result=None, updated_at=now)
            if row is not None:
                self._unindex(row[0])
            self._rows[key] = (record, text)
            if status == "done":
                self._done.setdefault((record.thread_id, record.fingerprint), {})[key] = None
            self._completed[key] = clock_now
            self._completed.move_to_end(key)
            self._evict(clock_now, keep=key)
            return self._loaded((record, text))

    def release(self, key: str) -> bool:
        """Forget a pending or failed record so that the next claim is ``new``."""
        with self._lock:
            existing = self._rows.get(key)
            if existing is None or existing[0].status == "done":
                return False
            self._unindex(existing[0])
            del self._rows[key]
            self._completed.pop(key, None)
            return True

    def get(self, key: str) -> IdempotencyRecord | None:
        """The record of `key`, or None."""
        with self._lock:
            record = self._load(key)
            if record is not None:
                self._touch(key, self._clock.time())
            return record

    def for_thread(self, thread_id: str) -> list[IdempotencyRecord]:
        """Every record of one thread, oldest first."""
        with self._lock:
            keys = [k for k, (r, _) in self._rows.items() if r.thread_id == thread_id]
            return [r for k in keys if (r := self._load(k)) is not None]

    def purge(self, older_than: float | dt.timedelta = DEFAULT_RETENTION) -> int:
        """Delete the completed records whose outcome is older than `older_than`."""
        horizon = values.utc(
            self._clock.time()
            - values.duration_seconds(older_than, field="older_than", positive=True)
        )
        with self._lock:
            gone = [
                key
                for key, (record, _) in self._rows.items()
                if record.status != "pending"
                and record.updated_at is not None
                and record.updated_at < horizon
            ]
            for key in gone:
                self._drop(key)
            return len(gone)

    def list_pending(
        self, older_than: float | dt.timedelta = 0.0, *, limit: int | None = None
    ) -> list[IdempotencyRecord]:
        """The pending intents claimed at least `older_than` ago, oldest first."""
        seconds = values.duration_seconds(older_than, field="older_than", positive=False)
        limit = values.check_limit(limit)
        horizon = values.utc(self._clock.time() - seconds)
        with self._lock:
            found = sorted(
                (
                    record
                    for record, _ in self._rows.values()
                    if record.status == "pending"
                    and (record.created_at is None or record.created_at <= horizon)
                ),
                key=lambda r: (r.created_at or horizon, r.key),
            )
        return found if limit is None else found[:limit]

    async def aclaim(
        self, key: str, *, tool: str, args_json: str, thread_id: str, fingerprint: str | None = None
    ) -> Claim:
        """Async `claim` (no I/O: runs inline)."""
        return self.claim(
            key, tool=tool, args_json=args_json, thread_id=thread_id, fingerprint=fingerprint
        )

    async def aunresolved(self, thread_id: str, fingerprint: str) -> list[IdempotencyRecord]:
        """Async `unresolved`."""
        return self.unresolved(thread_id, fingerprint)

    async def adone_keys(self, thread_id: str, fingerprint: str) -> list[str]:
        """Async `done_keys`."""
        return self.done_keys(thread_id, fingerprint)

    async def arecord_outcome(
        self, key: str, result: Any, *, status: OutcomeStatus = "done"
    ) -> IdempotencyRecord:
        """Async `record_outcome`."""
        return self.record_outcome(key, result, status=status)

    async def arelease(self, key: str) -> bool:
        """Async `release`."""
        return self.release(key)

    async def aget(self, key: str) -> IdempotencyRecord | None:
        """Async `get`."""
        return self.get(key)

    async def afor_thread(self, thread_id: str) -> list[IdempotencyRecord]:
        """Async `for_thread`."""
        return self.for_thread(thread_id)

    async def apurge(self, older_than: float | dt.timedelta = DEFAULT_RETENTION) -> int:
        """Async `purge`."""
        return self.purge(older_than)

    async def alist_pending(
        self, older_than: float | dt.timedelta = 0.0, *, limit: int | None = None
    ) -> list[IdempotencyRecord]:
        """Async `list_pending`."""
        return self.list_pending(older_than, limit=limit)
