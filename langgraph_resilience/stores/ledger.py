"""Exactly-once side effects: idempotency keys, a durable intent/outcome ledger, sagas.

LangGraph re-runs an interrupted node on resume, so an effect done just before a
crash (a payment, an email, an order) would happen twice. This module is the
durable memory that prevents it, independent of any graph node:

- `idempotency_key` derives a stable key per intended effect: tool + canonical
  arguments + thread id + call identity, hashed with SHA-256 (never ``hash()``),
  so every process computes the same key. The key is also what the tool passes
  to the outside world (e.g. an ``Idempotency-Key`` header), so the service
  deduplicates too.
- An `IdempotencyStore` records an *intent* before the effect and its *outcome*
  after. `IdempotencyStore.claim` is atomic across workers and answers one of
  ``new`` (the intent was written now: execute), ``pending`` (an intent with no
  outcome: the outcome is UNKNOWN, reconcile, never re-run blindly) or ``done``
  (an outcome is recorded: return it). Backends: `InMemoryIdempotencyStore`,
  `PostgresIdempotencyStore` / `AsyncPostgresIdempotencyStore` (our own table,
  ``INSERT ... ON CONFLICT DO NOTHING``: one round trip per new claim, durable
  before the effect, two for a replay, and one per outcome), `SqliteIdempotencyStore` (the same
  statement on the embedded file). LangGraph's ``PostgresStore.put`` is an upsert with no
  put-if-absent, so it cannot claim a key: that is why the ledger has its own
  table.
- A `SagaLog` is an append-only log of effects and compensations per thread;
  `compensate_thread` undoes a thread's recorded effects newest first, each
  compensation claimed under its own key (``comp:<key>``), so a compensation
  run that is killed and re-run compensates each effect exactly once.
- `PartialResult` is the documented marker a batch tool returns when some items
  failed; `failed_items` selects only those, each with its own per-item key.

Integration (the guarded tool node, for a ``ToolProfile(side_effect=True)`` tool)::

    key = idempotency_key(call["name"], call["args"], thread_id=thread_id,
                          call_identity=f"{ai_message.id}:{call['id']}")
    claim = store.claim(key, tool=call["name"], thread_id=thread_id,
                        args_json=canonical_args(call["args"]))
    match claim_action(claim, can_check_status=profile.status_check is not None):
        case "replay":        # outcome recorded: do not execute
            return claim.result            # claim.status == "failed": the recorded failure
        case "unknown":       # intent, no outcome, no way to ask: do not execute
            return UNKNOWN envelope, suggested_action="query_status"
        case "check_status":  # intent, no outcome: ask the service by key
            status = profile.status_check(key)            # -> EffectStatus
            if status.done:
                store.record_outcome(key, status.result); return status.result
            # not done: fall through and execute once, same key, no second claim
        case "execute":
            pass
    result = tool(args, idempotency_key=key)   # injected; the model never sees it
    store.record_outcome(key, result)                      # one round trip
    saga.append(thread_id, key=key, tool=name, action="effect", status="done")  # if compensable

On failure: a timeout or lost response leaves the intent ``pending`` (UNKNOWN);
a failure that certainly happened *before* the effect (the request was refused:
429/503 with nothing done, a validation error) calls ``store.release(key)`` so a
retry with the same key claims ``new`` again; a definite business failure that
must replay identically is ``store.record_outcome(key, error, status="failed")``.
The async node uses ``aclaim`` / ``arecord_outcome`` / ``arelease``. A batch
tool's `PartialResult` is recorded as the outcome like any result; the redo
runs only `failed_items(...)`, each claimed under its own `RedoItem.key`.

``pending`` only means "crashed" when one runner owns the thread: take the
per-thread lock (`langgraph_resilience.stores.persistence.thread_lock`) for every run,
or a second live runner would reconcile the first one's in-flight call.

Retention
---------
The ledger keeps every record until you delete it: nothing is purged
automatically. ``store.purge(older_than)`` (``apurge``; also
`langgraph_resilience.stores.persistence.Persistence.purge`) deletes the records
whose outcome (``done`` or ``failed``) was recorded more than `older_than` ago
(`DEFAULT_RETENTION`, 30 days, when not given), in batches, through an index on
``updated_at``. Run it from a scheduled job, e.g. daily.

Why deleting an old completed record is safe: a record only matters to a
*replay* of its own call, i.e. a thread resumed from a checkpoint taken before
that call was answered (a crash or an interrupt in the tools step). Once the
call is answered, its thread's checkpoint holds the answer, and no run of the
thread asks the ledger again. What the retention bounds is therefore the time
a thread may still be resumed from before the call's answer: a replay of that
exact call after the record was purged finds no record and runs the effect
again (a compensation re-run after its ``comp:`` record was purged likewise
compensates again). So choose a retention longer than the longest time any
thread may sit crashed, interrupted or waiting for a human before it is
resumed (or compensated); 30 days is a conservative default, not a guarantee.

``pending`` records (an intent with no outcome: UNKNOWN) are never purged, at
any age: they are what reconciliation needs, and deleting one would let the
next claim run an effect that may already have happened. ``list_pending(older_than)``
lists them, oldest first, for an operator to reconcile (``status_check``, or a
human) or release.

`InMemoryIdempotencyStore` can also bound itself (``max_entries=``, ``ttl=``),
evicting only completed records, least recently used first, never a pending one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import hashlib
import inspect
import json
import math
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Generator,
    Iterable,
    Iterator,
    Mapping,
)
from collections.abc import Sequence as SequenceABC
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Literal, Protocol, TypeAlias, cast, runtime_checkable

import psycopg
from langgraph.errors import GraphBubbleUp
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool
from pydantic import BaseModel, ConfigDict, Field

from langgraph_resilience.core.canonical import DEFAULT_NOISE_FIELDS, canonical_args
from langgraph_resilience.core.clock import Clock, SystemClock
from langgraph_resilience.core.redaction import redact, redact_value

__all__ = [
    "DEFAULT_RETENTION",
    "AsyncPostgresIdempotencyStore",
    "AsyncPostgresSagaLog",
    "Claim",
    "ClaimAction",
    "ClaimState",
    "CompensationReport",
    "CompensationStep",
    "EffectStatus",
    "FailedItem",
    "IdempotencyRecord",
    "IdempotencyStore",
    "InMemoryIdempotencyStore",
    "InMemorySagaLog",
    "PartialResult",
    "PostgresIdempotencyStore",
    "PostgresSagaLog",
    "RedoItem",
    "SagaEntry",
    "SagaLog",
    "SqliteIdempotencyStore",
    "SqliteSagaLog",
    "acompensate_thread",
    "as_partial_result",
    "claim_action",
    "compensate_thread",
    "compensation_key",
    "failed_items",
    "idempotency_key",
    "item_idempotency_key",
    "summarize_records",
]

ClaimState = Literal["new", "pending", "done"]
"""What a claim found: ``new`` (intent written now), ``pending`` (intent, no
outcome: UNKNOWN) or ``done`` (an outcome, success or failure, is recorded)."""

RecordStatus = Literal["pending", "done", "failed"]
OutcomeStatus = Literal["done", "failed"]
ClaimAction = Literal["execute", "replay", "check_status", "unknown"]
"""What the caller does next; see `claim_action`."""

_KEY_VERSION = "lgr-idem-1"
_CLAIM_RETRIES = 5

DEFAULT_RETENTION = dt.timedelta(days=30)
"""How long `IdempotencyStore.purge` keeps a completed record by default. It must
exceed the longest time a thread may be resumed (or compensated) after a crash,
an interrupt or a wait for a human; see "Retention" in the module docs."""

_PURGE_BATCH = 10_000
"""Rows deleted per statement by the SQL backends' `purge`: short transactions."""


def _seconds(value: float | dt.timedelta, *, field: str, positive: bool) -> float:
    """A duration as finite seconds: > 0 when `positive`, else >= 0."""
    seconds = value.total_seconds() if isinstance(value, dt.timedelta) else value
    ok = (
        not isinstance(seconds, bool)
        and isinstance(seconds, int | float)
        and math.isfinite(seconds)
        and (seconds > 0 if positive else seconds >= 0)
    )
    if not ok:
        bound = "> 0" if positive else ">= 0"
        raise ValueError(
            f"{field} must be a number of seconds or a timedelta {bound}, got {value!r}"
        )
    return float(seconds)


def _limit(limit: int | None) -> int | None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be None or an int >= 1, got {limit!r}")
    return limit


# ------------------------------------------------------------------ keys


def idempotency_key(
    tool: str,
    args: Any,
    *,
    thread_id: str,
    call_identity: str,
    noise_fields: Iterable[str] = DEFAULT_NOISE_FIELDS,
) -> str:
    """Return the stable idempotency key of one intended side effect.

    The key covers the tool, its canonical arguments (`canonical_args`: sorted
    keys, noise fields dropped, floats rounded), the thread and the call's
    identity, and is the same in every process and Python version. Use a call
    identity that is unique per intended effect within the thread and stable
    across a resume, e.g. ``f"{ai_message.id}:{tool_call_id}"`` (some providers
    number call ids per message, so the id alone may repeat across turns).

    >>> k = idempotency_key("pay", {"amount": 5, "nonce": 1}, thread_id="t", call_identity="c1")
    >>> k == idempotency_key("pay", {"amount": 5.0}, thread_id="t", call_identity="c1")
    True
    >>> k.startswith("pay:"), len(k)
    (True, 36)
    """
    material = json.dumps(
        [
            _KEY_VERSION,
            tool,
            canonical_args(args, noise_fields=noise_fields),
            thread_id,
            call_identity,
        ],
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return f"{tool}:{hashlib.sha256(material.encode('utf-8')).hexdigest()[:32]}"


def effect_fingerprint(
    tool: str,
    args: Any,
    *,
    thread_id: str,
    noise_fields: Iterable[str] = DEFAULT_NOISE_FIELDS,
) -> str:
    """The identity of *what* an effect does in a thread, whichever call asks for it:
    tool + canonical arguments + thread, without the call's position.

    A model told that a call's outcome is unknown re-issues it under a new id, hence
    a new idempotency key; the fingerprint is how the ledger recognizes it as the
    same effect and reconciles the earlier one first (`IdempotencyStore.unresolved`).

    >>> a = effect_fingerprint("pay", {"amount": 5}, thread_id="t")
    >>> a == effect_fingerprint("pay", {"amount": 5.0, "nonce": 9}, thread_id="t")
    True
    """
    material = json.dumps(
        [_KEY_VERSION, tool, canonical_args(args, noise_fields=noise_fields), thread_id],
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return hashlib.sha256(material.encode("utf-8")).hexdigest()[:32]


def compensation_key(key: str) -> str:
    """The idempotency key under which the compensation of `key` is claimed.

    A compensator that calls an external API should send this key with it.

    >>> compensation_key("pay:abc")
    'comp:pay:abc'
    """
    return f"comp:{key}"


def item_idempotency_key(call_key: str, item: int | str) -> str:
    """The idempotency key of one item of a batch call: ``<call key>#<index or item key>``.

    A batch tool uses it per item on the first run; `failed_items` gives the same
    keys for the redo, so an item that did succeed at the service is deduplicated.

    >>> item_idempotency_key("bulk:1f2e", 3)
    'bulk:1f2e#3'
    """
    return f"{call_key}#{item}"


# ------------------------------------------------------------------ records


@dataclasses.dataclass(frozen=True, slots=True)
class IdempotencyRecord:
    """One row of the ledger: an intent and, once known, its outcome."""

    key: str
    status: RecordStatus
    """``pending`` until an outcome is recorded, then ``done`` or ``failed``."""
    result: Any = None
    """The recorded outcome (JSON value); None while pending."""
    tool: str | None = None
    thread_id: str | None = None
    args: Any = None
    """The canonical arguments, with secret-named fields redacted (audit only)."""
    created_at: dt.datetime | None = None
    updated_at: dt.datetime | None = None
    fingerprint: str | None = None
    """`effect_fingerprint` of the intent: the same effect asked for by another call."""


@dataclasses.dataclass(frozen=True, slots=True)
class Claim:
    """The answer to `IdempotencyStore.claim`: what the ledger held for the key."""

    state: ClaimState
    record: IdempotencyRecord

    @property
    def key(self) -> str:
        """The claimed key."""
        return self.record.key

    @property
    def status(self) -> RecordStatus:
        """The record's status: ``pending``, ``done`` or ``failed``."""
        return self.record.status

    @property
    def result(self) -> Any:
        """The recorded outcome when `state` is ``done``, else None."""
        return self.record.result


@dataclasses.dataclass(frozen=True, slots=True)
class EffectStatus:
    """What a tool's ``status_check(key)`` found out about an effect.

    >>> EffectStatus(done=True, result={"payment_id": "p_1"}).done
    True
    """

    done: bool
    """The effect happened (the service knows the key)."""
    result: Any = None
    """Its result, recorded as the outcome when `done`."""


def claim_action(claim: Claim, *, can_check_status: bool) -> ClaimAction:
    """Decide what to do with a claim (pure; shared by the sync and async paths).

    ``execute`` for a new claim; ``replay`` the recorded outcome when one
    exists; for a pending one (outcome UNKNOWN) ``check_status`` when the tool
    can be asked, else ``unknown``: never execute again blindly.

    >>> rec = IdempotencyRecord(key="k", status="pending")
    >>> claim_action(Claim("pending", rec), can_check_status=False)
    'unknown'
    """
    if claim.state == "new":
        return "execute"
    if claim.state == "done":
        return "replay"
    return "check_status" if can_check_status else "unknown"


def summarize_records(records: Iterable[IdempotencyRecord]) -> dict[str, int]:
    """Count a thread's side effects by status; a finished compensation (its
    ``comp:`` record) counts as ``compensated``, not as one more effect done.

    >>> summarize_records([IdempotencyRecord("a", "done"), IdempotencyRecord("b", "pending"),
    ...                    IdempotencyRecord(compensation_key("a"), "done")])
    {'pending': 1, 'done': 1, 'failed': 0, 'compensated': 1}
    """
    counts = {"pending": 0, "done": 0, "failed": 0, "compensated": 0}
    for record in records:
        compensation = record.key.startswith(compensation_key(""))
        status = "compensated" if compensation and record.status == "done" else record.status
        counts[status] = counts.get(status, 0) + 1
    return counts


def _dumps(value: Any, *, what: str) -> str:
    """JSON text of an outcome: the ledger holds JSON only, in every backend."""
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"{what} must be JSON-serializable (dicts, lists, str, numbers, bool, None): {exc}"
        ) from None


def _audit_args(args_json: str) -> str:
    """The stored copy of the arguments: secret-named fields redacted."""
    try:
        parsed = json.loads(args_json)
    except ValueError:
        raise TypeError("args_json must be JSON text, e.g. canonical_args(args)") from None
    return json.dumps(redact_value(parsed), ensure_ascii=False, separators=(",", ":"))


def _check_status(status: str) -> OutcomeStatus:
    if status not in ("done", "failed"):
        raise ValueError(f"outcome status must be 'done' or 'failed', got {status!r}")
    return cast("OutcomeStatus", status)


# ------------------------------------------------------------------ protocols


@runtime_checkable
class IdempotencyStore(Protocol):
    """The durable intent/outcome ledger. Every method has an async twin (``a*``)."""

    def claim(
        self, key: str, *, tool: str, args_json: str, thread_id: str, fingerprint: str | None = None
    ) -> Claim:
        """Atomically write an intent for `key` unless one exists; say what was found."""
        ...

    def unresolved(self, thread_id: str, fingerprint: str) -> list[IdempotencyRecord]:
        """The thread's pending intents (outcome unknown) with this `effect_fingerprint`,
        oldest first: the same effect asked for by an earlier call."""
        ...

    def record_outcome(
        self, key: str, result: Any, *, status: OutcomeStatus = "done"
    ) -> IdempotencyRecord:
        """Record the outcome of a pending intent; the first outcome recorded wins."""
        ...

    def release(self, key: str) -> bool:
        """Forget an intent whose effect certainly did not happen (or a failed outcome),
        so that the next claim is ``new``. Never for an UNKNOWN outcome. A ``done``
        record is never released. Returns whether a record was removed."""
        ...

    def get(self, key: str) -> IdempotencyRecord | None:
        """The record of `key`, or None."""
        ...

    def for_thread(self, thread_id: str) -> list[IdempotencyRecord]:
        """Every record of one thread, oldest first."""
        ...

    def purge(self, older_than: float | dt.timedelta = DEFAULT_RETENTION) -> int:
        """Delete the records whose outcome (``done`` or ``failed``) was recorded more
        than `older_than` (seconds or a timedelta, > 0) ago; never a ``pending`` one.
        Returns how many were deleted. Only when called: see "Retention"."""
        ...

    def list_pending(
        self, older_than: float | dt.timedelta = 0.0, *, limit: int | None = None
    ) -> list[IdempotencyRecord]:
        """The intents with no outcome (UNKNOWN) claimed at least `older_than` ago,
        oldest first: what an operator reconciles. `purge` never deletes them."""
        ...

    async def aclaim(
        self, key: str, *, tool: str, args_json: str, thread_id: str, fingerprint: str | None = None
    ) -> Claim:
        """Async `claim`."""
        ...

    async def aunresolved(self, thread_id: str, fingerprint: str) -> list[IdempotencyRecord]:
        """Async `unresolved`."""
        ...

    async def arecord_outcome(
        self, key: str, result: Any, *, status: OutcomeStatus = "done"
    ) -> IdempotencyRecord:
        """Async `record_outcome`."""
        ...

    async def arelease(self, key: str) -> bool:
        """Async `release`."""
        ...

    async def aget(self, key: str) -> IdempotencyRecord | None:
        """Async `get`."""
        ...

    async def afor_thread(self, thread_id: str) -> list[IdempotencyRecord]:
        """Async `for_thread`."""
        ...

    async def apurge(self, older_than: float | dt.timedelta = DEFAULT_RETENTION) -> int:
        """Async `purge`."""
        ...

    async def alist_pending(
        self, older_than: float | dt.timedelta = 0.0, *, limit: int | None = None
    ) -> list[IdempotencyRecord]:
        """Async `list_pending`."""
        ...


SagaAction = Literal["effect", "compensate"]


@dataclasses.dataclass(frozen=True, slots=True)
class SagaEntry:
    """One line of the saga log."""

    seq: int
    """Position in the log; grows with every append."""
    thread_id: str
    key: str
    """The effect's idempotency key (also for its compensation entries)."""
    tool: str
    action: str
    """``effect`` (a compensable effect happened) or ``compensate``."""
    status: str
    """``done`` for effects; ``started``, ``done``, ``reconciled``, ``failed``,
    ``unknown`` for compensations."""
    detail: Any = None
    at: dt.datetime | None = None


@runtime_checkable
class SagaLog(Protocol):
    """An append-only log of a thread's effects and compensations."""

    def append(
        self,
        thread_id: str,
        *,
        key: str,
        tool: str,
        action: str,
        status: str,
        detail: Any = None,
    ) -> SagaEntry:
        """Append one entry and return it with its sequence number."""
        ...

    def entries(self, thread_id: str) -> list[SagaEntry]:
        """The thread's entries in append order."""
        ...

    async def aappend(
        self,
        thread_id: str,
        *,
        key: str,
        tool: str,
        action: str,
        status: str,
        detail: Any = None,
    ) -> SagaEntry:
        """Async `append`."""
        ...

    async def aentries(self, thread_id: str) -> list[SagaEntry]:
        """Async `entries`."""
        ...


# ------------------------------------------------------------------ in memory


def _utc(timestamp: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(timestamp, dt.UTC)


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
    exceed `max_entries`. An evicted record is forgotten exactly as `purge`
    forgets one: a replay of its call after that runs again, so keep `ttl`
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
    ) -> None:
        if max_entries is not None and (
            isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1
        ):
            raise ValueError(f"max_entries must be None or an int >= 1, got {max_entries!r}")
        self._clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._rows: dict[str, tuple[IdempotencyRecord, str | None]] = {}
        self._completed: OrderedDict[str, float] = OrderedDict()
        """Completed keys, least recently used first, with when they were last used."""
        self.max_entries = max_entries
        self.ttl = None if ttl is None else _seconds(ttl, field="ttl", positive=True)

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
        if self.ttl is not None:
            horizon = now - self.ttl
            while completed:
                key, used = next(iter(completed.items()))
                if used > horizon:
                    break
                del completed[key]
                self._rows.pop(key, None)
        if self.max_entries is not None:
            while len(self._rows) > self.max_entries and completed:
                key = next(iter(completed))
                if key == keep:
                    break
                del completed[key]
                self._rows.pop(key, None)

    def setup(self) -> None:
        """Nothing to create."""

    def _load(self, key: str) -> IdempotencyRecord | None:
        row = self._rows.get(key)
        if row is None:
            return None
        record, result_json = row
        result = None if result_json is None else json.loads(result_json)
        return dataclasses.replace(record, result=result)

    def claim(
        self, key: str, *, tool: str, args_json: str, thread_id: str, fingerprint: str | None = None
    ) -> Claim:
        """Atomically write an intent for `key` unless one exists."""
        args = json.loads(_audit_args(args_json))
        with self._lock:
            existing = self._load(key)
            clock_now = self._clock.time()
            if existing is not None:
                self._touch(key, clock_now)
                return Claim("pending" if existing.status == "pending" else "done", existing)
            now = _utc(clock_now)
            record = IdempotencyRecord(
                key=key,
                status="pending",
                tool=tool,
                thread_id=thread_id,
                args=args,
                created_at=now,
                updated_at=now,
                fingerprint=fingerprint,
            )
            self._rows[key] = (record, None)
            self._evict(clock_now)
            return Claim("new", record)

    def unresolved(self, thread_id: str, fingerprint: str) -> list[IdempotencyRecord]:
        """The thread's pending intents with this fingerprint, oldest first."""
        with self._lock:
            return [
                record
                for record, _ in self._rows.values()
                if record.status == "pending"
                and record.fingerprint == fingerprint
                and record.thread_id == thread_id
            ]

    def record_outcome(
        self, key: str, result: Any, *, status: OutcomeStatus = "done"
    ) -> IdempotencyRecord:
        """Record the outcome of a pending intent; the first outcome recorded wins."""
        status = _check_status(status)
        text = _dumps(result, what="result")
        with self._lock:
            existing = self._load(key)
            clock_now = self._clock.time()
            if existing is not None and existing.status != "pending":
                self._touch(key, clock_now)
                return existing
            now = _utc(clock_now)
            base = existing or IdempotencyRecord(key=key, status="pending", created_at=now)
            record = dataclasses.replace(base, status=status, result=None, updated_at=now)
            self._rows[key] = (record, text)
            self._completed[key] = clock_now
            self._completed.move_to_end(key)
            loaded = self._load(key)
            assert loaded is not None
            self._evict(clock_now, keep=key)
            return loaded

    def release(self, key: str) -> bool:
        """Forget a pending or failed record so that the next claim is ``new``."""
        with self._lock:
            existing = self._rows.get(key)
            if existing is None or existing[0].status == "done":
                return False
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
        horizon = _utc(self._clock.time() - _seconds(older_than, field="older_than", positive=True))
        with self._lock:
            gone = [
                key
                for key, (record, _) in self._rows.items()
                if record.status != "pending"
                and record.updated_at is not None
                and record.updated_at < horizon
            ]
            for key in gone:
                del self._rows[key]
                self._completed.pop(key, None)
            return len(gone)

    def list_pending(
        self, older_than: float | dt.timedelta = 0.0, *, limit: int | None = None
    ) -> list[IdempotencyRecord]:
        """The pending intents claimed at least `older_than` ago, oldest first."""
        seconds = _seconds(older_than, field="older_than", positive=False)
        limit = _limit(limit)
        horizon = _utc(self._clock.time() - seconds)
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


class InMemorySagaLog:
    """An append-only saga log in this process's memory (not durable)."""

    def __init__(self, *, clock: Clock | None = None) -> None:
        self._clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._entries: list[SagaEntry] = []

    def setup(self) -> None:
        """Nothing to create."""

    def append(
        self,
        thread_id: str,
        *,
        key: str,
        tool: str,
        action: str,
        status: str,
        detail: Any = None,
    ) -> SagaEntry:
        """Append one entry and return it with its sequence number."""
        stored = None if detail is None else json.loads(_dumps(detail, what="detail"))
        with self._lock:
            entry = SagaEntry(
                seq=len(self._entries) + 1,
                thread_id=thread_id,
                key=key,
                tool=tool,
                action=action,
                status=status,
                detail=stored,
                at=_utc(self._clock.time()),
            )
            self._entries.append(entry)
            return entry

    def entries(self, thread_id: str) -> list[SagaEntry]:
        """The thread's entries in append order."""
        with self._lock:
            return [e for e in self._entries if e.thread_id == thread_id]

    async def aappend(
        self,
        thread_id: str,
        *,
        key: str,
        tool: str,
        action: str,
        status: str,
        detail: Any = None,
    ) -> SagaEntry:
        """Async `append`."""
        return self.append(
            thread_id, key=key, tool=tool, action=action, status=status, detail=detail
        )

    async def aentries(self, thread_id: str) -> list[SagaEntry]:
        """Async `entries`."""
        return self.entries(thread_id)


# ------------------------------------------------------------------ Postgres

IDEMPOTENCY_TABLE = "lgr_idempotency"
SAGA_TABLE = "lgr_saga"

_SETUP_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended('langgraph-resilience:setup', 0))"

_PG_IDEMPOTENCY_DDL = (
    _SETUP_LOCK,
    """
    CREATE TABLE IF NOT EXISTS lgr_idempotency (
        key text PRIMARY KEY,
        tool text,
        thread_id text,
        args jsonb,
        status text NOT NULL DEFAULT 'pending'
            CHECK (status IN ('pending', 'done', 'failed')),
        result jsonb,
        created_at timestamptz NOT NULL DEFAULT now(),
        updated_at timestamptz NOT NULL DEFAULT now()
    )
    """,
    "CREATE INDEX IF NOT EXISTS lgr_idempotency_thread_idx ON lgr_idempotency (thread_id)",
    "ALTER TABLE lgr_idempotency ADD COLUMN IF NOT EXISTS fingerprint text",
    "CREATE INDEX IF NOT EXISTS lgr_idempotency_unresolved_idx "
    "ON lgr_idempotency (thread_id, fingerprint) WHERE status = 'pending'",
    # `purge`: completed rows by age. On a large table created by an earlier version,
    # create it beforehand with CREATE INDEX CONCURRENTLY (same name) to avoid
    # blocking writes while it builds; this statement is then a no-op.
    "CREATE INDEX IF NOT EXISTS lgr_idempotency_completed_idx "
    "ON lgr_idempotency (updated_at) WHERE status IN ('done', 'failed')",
)

_PG_SAGA_DDL = (
    _SETUP_LOCK,
    """
    CREATE TABLE IF NOT EXISTS lgr_saga (
        seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        thread_id text NOT NULL,
        key text NOT NULL,
        tool text NOT NULL,
        action text NOT NULL,
        status text NOT NULL,
        detail jsonb,
        at timestamptz NOT NULL DEFAULT clock_timestamp()
    )
    """,
    "CREATE INDEX IF NOT EXISTS lgr_saga_thread_idx ON lgr_saga (thread_id, seq)",
)

_COLUMNS = "key, tool, thread_id, args, status, result, created_at, updated_at, fingerprint"

# The intent: one durable round trip for a new key. A key that exists returns no
# row, and `_claim_script` reads it (a second round trip, only on a replay).
_PG_INTENT = f"""
INSERT INTO lgr_idempotency (key, tool, thread_id, args, fingerprint)
VALUES (%(key)s, %(tool)s, %(thread_id)s, %(args)s::jsonb, %(fingerprint)s)
ON CONFLICT (key) DO NOTHING
RETURNING {_COLUMNS}
"""

# The outcome of a pending intent; first outcome wins (a recorded one is never
# overwritten). The async-commit variant does not wait for its WAL flush:
# ``set_config(..., true)`` is transaction-local, so it applies to this one
# autocommit statement and never leaks into the pooled session.
_PG_OUTCOME_SYNC = f"""
UPDATE lgr_idempotency
SET status = %(status)s, result = %(result)s::jsonb, updated_at = now()
WHERE key = %(key)s AND status = 'pending'
RETURNING {_COLUMNS}
"""
_PG_OUTCOME_ASYNC = f"""
UPDATE lgr_idempotency
SET status = %(status)s, result = %(result)s::jsonb, updated_at = now()
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS commit_mode
WHERE key = %(key)s AND status = 'pending'
RETURNING {_COLUMNS}
"""

# An outcome for a key with no intent (never claimed, or released): inserted,
# unless another writer got there first.
_PG_OUTCOME_INSERT = f"""
INSERT INTO lgr_idempotency (key, status, result)
VALUES (%(key)s, %(status)s, %(result)s::jsonb)
ON CONFLICT (key) DO NOTHING
RETURNING {_COLUMNS}
"""

_PG_GET = f"SELECT {_COLUMNS} FROM lgr_idempotency WHERE key = %(key)s"
_PG_FOR_THREAD = (
    f"SELECT {_COLUMNS} FROM lgr_idempotency WHERE thread_id = %(thread_id)s "
    "ORDER BY created_at, key"
)
_PG_UNRESOLVED = (
    f"SELECT {_COLUMNS} FROM lgr_idempotency WHERE thread_id = %(thread_id)s "
    "AND fingerprint = %(fingerprint)s AND status = 'pending' ORDER BY created_at, key"
)
_PG_RELEASE = "DELETE FROM lgr_idempotency WHERE key = %(key)s AND status <> 'done' RETURNING key"
# One batch of `purge`: completed rows older than the retention, oldest first, through
# lgr_idempotency_completed_idx; locked rows (a concurrent purge) are skipped. A pending
# row never qualifies, and the outer WHERE re-checks it on the row version it deletes.
_PG_PURGE = """
WITH gone AS (
    DELETE FROM lgr_idempotency
    WHERE key IN (
        SELECT key FROM lgr_idempotency
        WHERE status IN ('done', 'failed')
          AND updated_at < now() - make_interval(secs => %(seconds)s)
        ORDER BY updated_at
        LIMIT %(batch)s
        FOR UPDATE SKIP LOCKED
    )
    AND status IN ('done', 'failed')
    RETURNING 1
)
SELECT count(*) AS n FROM gone
"""
_PG_LIST_PENDING = (
    f"SELECT {_COLUMNS} FROM lgr_idempotency WHERE status = 'pending' "
    "AND created_at <= now() - make_interval(secs => %(seconds)s) "
    "ORDER BY created_at, key LIMIT %(limit)s"
)

_SAGA_COLUMNS = "seq, thread_id, key, tool, action, status, detail, at"
_PG_SAGA_APPEND = f"""
INSERT INTO lgr_saga (thread_id, key, tool, action, status, detail)
VALUES (%(thread_id)s, %(key)s, %(tool)s, %(action)s, %(status)s, %(detail)s::jsonb)
RETURNING {_SAGA_COLUMNS}
"""
_PG_SAGA_ENTRIES = (
    f"SELECT {_SAGA_COLUMNS} FROM lgr_saga WHERE thread_id = %(thread_id)s ORDER BY seq"
)


def _record_of(row: Mapping[str, Any]) -> IdempotencyRecord:
    return IdempotencyRecord(
        key=row["key"],
        status=row["status"],
        result=row["result"],
        tool=row["tool"],
        thread_id=row["thread_id"],
        args=row["args"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        fingerprint=row["fingerprint"],
    )


Script: TypeAlias = Generator[tuple[str, Mapping[str, Any]], SequenceABC[Any], Any]
"""A sequence of statements whose next one depends on the rows of the last: the
one decision logic that every SQL ledger (Postgres sync and async, SQLite) runs."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Dialect:
    """The statements and row reader of one SQL backend of the ledger."""

    intent: str
    """Insert the intent unless the key exists; return the new row (or none)."""
    get: str
    outcome_insert: str | None
    """An outcome for a key with no intent, when the outcome statement does not insert."""
    record_of: Callable[[Any], IdempotencyRecord]


def _claim_script(dialect: _Dialect, key: str, params: Mapping[str, Any]) -> Script:
    """Claim `key`: the intent (new), else the record already there (pending/done)."""
    for _ in range(_CLAIM_RETRIES):
        rows = yield dialect.intent, params
        if rows:
            return Claim("new", dialect.record_of(rows[0]))
        rows = yield dialect.get, {"key": key}
        if rows:  # else it was released since: claim again
            record = dialect.record_of(rows[0])
            return Claim("pending" if record.status == "pending" else "done", record)
    raise _lost_claim(key)


def _outcome_script(
    dialect: _Dialect, key: str, params: Mapping[str, Any], outcome_sql: str
) -> Script:
    """Record an outcome: on the pending intent; else the recorded outcome wins;
    else (no intent at all) a new record."""
    for _ in range(_CLAIM_RETRIES):
        rows = yield outcome_sql, params
        if rows:
            return dialect.record_of(rows[0])
        rows = yield dialect.get, {"key": key}
        if rows and rows[0]["status"] != "pending":
            return dialect.record_of(rows[0])
        if not rows and dialect.outcome_insert is not None:
            rows = yield dialect.outcome_insert, params
            if rows:
                return dialect.record_of(rows[0])
    raise _lost_claim(key)


def _purge_script(query: str, params: Mapping[str, Any]) -> Script:
    """Delete completed records in batches until a batch comes back short."""
    total = 0
    while True:
        rows = yield query, {**params, "batch": _PURGE_BATCH}
        deleted = int(rows[0]["n"]) if rows else 0
        total += deleted
        if deleted < _PURGE_BATCH:
            return total


def _purge_params(older_than: float | dt.timedelta) -> dict[str, Any]:
    return {"seconds": _seconds(older_than, field="older_than", positive=True)}


def _pending_params(older_than: float | dt.timedelta, limit: int | None) -> dict[str, Any]:
    return {
        "seconds": _seconds(older_than, field="older_than", positive=False),
        "limit": _limit(limit),
    }


def _run_script(script: Script, rows: Callable[[str, Mapping[str, Any]], SequenceABC[Any]]) -> Any:
    """Drive a statement script with a sync statement runner."""
    try:
        query, params = next(script)
        while True:
            query, params = script.send(rows(query, params))
    except StopIteration as done:
        return done.value


async def _arun_script(
    script: Script, rows: Callable[[str, Mapping[str, Any]], Awaitable[SequenceABC[Any]]]
) -> Any:
    """Drive a statement script with an async statement runner."""
    try:
        query, params = next(script)
        while True:
            query, params = script.send(await rows(query, params))
    except StopIteration as done:
        return done.value


def _entry_of(row: Mapping[str, Any]) -> SagaEntry:
    return SagaEntry(
        seq=int(row["seq"]),
        thread_id=row["thread_id"],
        key=row["key"],
        tool=row["tool"],
        action=row["action"],
        status=row["status"],
        detail=row["detail"],
        at=row["at"],
    )


def _claim_params(
    key: str, tool: str, args_json: str, thread_id: str, fingerprint: str | None
) -> dict[str, Any]:
    return {
        "key": key,
        "tool": tool,
        "thread_id": thread_id,
        "args": _audit_args(args_json),
        "fingerprint": fingerprint,
    }


def _record_params(key: str, result: Any, status: str) -> dict[str, Any]:
    return {"key": key, "status": _check_status(status), "result": _dumps(result, what="result")}


def _saga_params(
    thread_id: str, *, key: str, tool: str, action: str, status: str, detail: Any
) -> dict[str, Any]:
    return {
        "thread_id": thread_id,
        "key": key,
        "tool": tool,
        "action": action,
        "status": status,
        "detail": None if detail is None else _dumps(detail, what="detail"),
    }


def _lost_claim(key: str) -> RuntimeError:
    return RuntimeError(
        f"idempotency key {key!r} was released by another worker {_CLAIM_RETRIES} times "
        "in a row while this one tried to read it; release() is racing claim()"
    )


SyncConn: TypeAlias = "psycopg.Connection[Any] | ConnectionPool[Any]"
AsyncConn: TypeAlias = "psycopg.AsyncConnection[Any] | AsyncConnectionPool[Any]"


class _SyncPostgres:
    """A pool or a single connection, used one statement at a time with dict rows."""

    def __init__(self, conn: SyncConn) -> None:
        self.conn = conn
        self._lock = threading.Lock()

    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        if isinstance(self.conn, ConnectionPool):
            with self.conn.connection() as conn:
                yield conn
        else:
            with self._lock:
                yield self.conn

    def _rows(self, query: str, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        with self._connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            cur.execute(query, params)
            rows = cur.fetchall() if cur.description is not None else []
            if not conn.autocommit:
                conn.commit()
            return rows

    def _ddl(self, statements: Iterable[str]) -> None:
        with self._connection() as conn:
            with conn.transaction():
                for statement in statements:
                    conn.execute(statement)
            if not conn.autocommit:
                conn.commit()


class _AsyncPostgres:
    """An async pool or connection; sync calls are forwarded to its event loop."""

    def __init__(self, conn: AsyncConn) -> None:
        self.conn = conn
        self._lock = asyncio.Lock()
        try:
            self.loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self.loop = None

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        if self.loop is None:
            self.loop = asyncio.get_running_loop()
        if isinstance(self.conn, AsyncConnectionPool):
            async with self.conn.connection() as conn:
                yield conn
        else:
            async with self._lock:
                yield self.conn

    async def _rows(self, query: str, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        async with self._connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(query, params)
            rows = await cur.fetchall() if cur.description is not None else []
            if not conn.autocommit:
                await conn.commit()
            return rows

    async def _ddl(self, statements: Iterable[str]) -> None:
        async with self._connection() as conn:
            async with conn.transaction():
                for statement in statements:
                    await conn.execute(statement)
            if not conn.autocommit:
                await conn.commit()

    def _sync(self, coro: Any) -> Any:
        """Run `coro` on the store's loop from another thread (as AsyncPostgresSaver does)."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if self.loop is None or running is self.loop:
            coro.close()
            raise asyncio.InvalidStateError(
                f"synchronous calls to {type(self).__name__} are only allowed from a thread "
                "other than its event loop's; use the async methods (aclaim, ...) instead"
            )
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()


class _OutcomeMode:
    """The choice of outcome commit, shared by the sync and async Postgres ledgers."""

    _record_sql: str

    def _set_outcome_mode(self, *, sync_outcomes: bool) -> None:
        self.sync_outcomes = sync_outcomes
        self._record_sql = _PG_OUTCOME_SYNC if sync_outcomes else _PG_OUTCOME_ASYNC


class PostgresIdempotencyStore(_SyncPostgres, _OutcomeMode):
    """The ledger in PostgreSQL table ``lgr_idempotency``, over a psycopg pool or connection.

    Works with the pool configuration LangGraph's `PostgresSaver` needs
    (``autocommit=True, prepare_threshold=0, row_factory=dict_row``). Claiming a
    new key is one ``INSERT ... ON CONFLICT DO NOTHING`` round trip, atomic across
    workers (a replay reads the existing record: one more); an outcome is one
    ``UPDATE``. Call `setup` once (``open_postgres`` does).
    Async methods run the sync ones in a worker thread; inside an event loop
    prefer `AsyncPostgresIdempotencyStore`.

    The intent's commit always waits for its WAL flush: it must survive a server
    crash before the effect starts. The outcome's commit does not, unless
    ``sync_outcomes=True``: the next durable commit (the step's checkpoint, on
    any connection) flushes it, and if the server crashes before that the
    intent is simply ``pending`` again, so it is reconciled, never re-executed
    blindly. That saves one disk flush per side-effecting call.
    """

    def __init__(self, conn: SyncConn, *, sync_outcomes: bool = False) -> None:
        super().__init__(conn)
        self._set_outcome_mode(sync_outcomes=sync_outcomes)

    def setup(self) -> None:
        """Create the table and its index if they do not exist."""
        self._ddl(_PG_IDEMPOTENCY_DDL)

    def claim(
        self, key: str, *, tool: str, args_json: str, thread_id: str, fingerprint: str | None = None
    ) -> Claim:
        """Atomically write an intent for `key` unless one exists (one round trip)."""
        params = _claim_params(key, tool, args_json, thread_id, fingerprint)
        return cast("Claim", _run_script(_claim_script(_PG, key, params), self._rows))

    def unresolved(self, thread_id: str, fingerprint: str) -> list[IdempotencyRecord]:
        """The thread's pending intents with this fingerprint, oldest first (one round trip)."""
        rows = self._rows(_PG_UNRESOLVED, {"thread_id": thread_id, "fingerprint": fingerprint})
        return [_record_of(r) for r in rows]

    def record_outcome(
        self, key: str, result: Any, *, status: OutcomeStatus = "done"
    ) -> IdempotencyRecord:
        """Record the outcome of a pending intent (one round trip); the first wins."""
        params = _record_params(key, result, status)
        script = _outcome_script(_PG, key, params, self._record_sql)
        return cast("IdempotencyRecord", _run_script(script, self._rows))

    def release(self, key: str) -> bool:
        """Forget a pending or failed record so that the next claim is ``new``."""
        return bool(self._rows(_PG_RELEASE, {"key": key}))

    def get(self, key: str) -> IdempotencyRecord | None:
        """The record of `key`, or None."""
        rows = self._rows(_PG_GET, {"key": key})
        return _record_of(rows[0]) if rows else None

    def for_thread(self, thread_id: str) -> list[IdempotencyRecord]:
        """Every record of one thread, oldest first."""
        return [_record_of(r) for r in self._rows(_PG_FOR_THREAD, {"thread_id": thread_id})]

    def purge(self, older_than: float | dt.timedelta = DEFAULT_RETENTION) -> int:
        """Delete the completed records whose outcome is older than `older_than` (by the
        server's clock), in batches of 10,000 rows; never a pending one."""
        return cast(
            "int", _run_script(_purge_script(_PG_PURGE, _purge_params(older_than)), self._rows)
        )

    def list_pending(
        self, older_than: float | dt.timedelta = 0.0, *, limit: int | None = None
    ) -> list[IdempotencyRecord]:
        """The pending intents claimed at least `older_than` ago, oldest first."""
        rows = self._rows(_PG_LIST_PENDING, _pending_params(older_than, limit))
        return [_record_of(r) for r in rows]

    async def aclaim(
        self, key: str, *, tool: str, args_json: str, thread_id: str, fingerprint: str | None = None
    ) -> Claim:
        """Async `claim`, in a worker thread."""
        return await asyncio.to_thread(
            self.claim,
            key,
            tool=tool,
            args_json=args_json,
            thread_id=thread_id,
            fingerprint=fingerprint,
        )

    async def aunresolved(self, thread_id: str, fingerprint: str) -> list[IdempotencyRecord]:
        """Async `unresolved`, in a worker thread."""
        return await asyncio.to_thread(self.unresolved, thread_id, fingerprint)

    async def arecord_outcome(
        self, key: str, result: Any, *, status: OutcomeStatus = "done"
    ) -> IdempotencyRecord:
        """Async `record_outcome`, in a worker thread."""
        return await asyncio.to_thread(self.record_outcome, key, result, status=status)

    async def arelease(self, key: str) -> bool:
        """Async `release`, in a worker thread."""
        return await asyncio.to_thread(self.release, key)

    async def aget(self, key: str) -> IdempotencyRecord | None:
        """Async `get`, in a worker thread."""
        return await asyncio.to_thread(self.get, key)

    async def afor_thread(self, thread_id: str) -> list[IdempotencyRecord]:
        """Async `for_thread`, in a worker thread."""
        return await asyncio.to_thread(self.for_thread, thread_id)

    async def apurge(self, older_than: float | dt.timedelta = DEFAULT_RETENTION) -> int:
        """Async `purge`, in a worker thread."""
        return await asyncio.to_thread(self.purge, older_than)

    async def alist_pending(
        self, older_than: float | dt.timedelta = 0.0, *, limit: int | None = None
    ) -> list[IdempotencyRecord]:
        """Async `list_pending`, in a worker thread."""
        return await asyncio.to_thread(self.list_pending, older_than, limit=limit)


class AsyncPostgresIdempotencyStore(_AsyncPostgres, _OutcomeMode):
    """`PostgresIdempotencyStore` over a psycopg `AsyncConnectionPool` or `AsyncConnection`.

    Sync methods are allowed from threads other than the store's event loop
    only (they run on that loop), exactly like LangGraph's `AsyncPostgresSaver`.
    Call ``await store.setup()`` once (``aopen_postgres`` does). Outcomes commit
    as in `PostgresIdempotencyStore` (``sync_outcomes``).
    """

    def __init__(self, conn: AsyncConn, *, sync_outcomes: bool = False) -> None:
        super().__init__(conn)
        self._set_outcome_mode(sync_outcomes=sync_outcomes)

    async def setup(self) -> None:
        """Create the table and its index if they do not exist."""
        await self._ddl(_PG_IDEMPOTENCY_DDL)

    async def aclaim(
        self, key: str, *, tool: str, args_json: str, thread_id: str, fingerprint: str | None = None
    ) -> Claim:
        """Atomically write an intent for `key` unless one exists (one round trip)."""
        params = _claim_params(key, tool, args_json, thread_id, fingerprint)
        return cast("Claim", await _arun_script(_claim_script(_PG, key, params), self._rows))

    async def aunresolved(self, thread_id: str, fingerprint: str) -> list[IdempotencyRecord]:
        """The thread's pending intents with this fingerprint, oldest first (one round trip)."""
        params = {"thread_id": thread_id, "fingerprint": fingerprint}
        return [_record_of(r) for r in await self._rows(_PG_UNRESOLVED, params)]

    async def arecord_outcome(
        self, key: str, result: Any, *, status: OutcomeStatus = "done"
    ) -> IdempotencyRecord:
        """Record the outcome of a pending intent (one round trip); the first wins."""
        params = _record_params(key, result, status)
        script = _outcome_script(_PG, key, params, self._record_sql)
        return cast("IdempotencyRecord", await _arun_script(script, self._rows))

    async def arelease(self, key: str) -> bool:
        """Forget a pending or failed record so that the next claim is ``new``."""
        return bool(await self._rows(_PG_RELEASE, {"key": key}))

    async def aget(self, key: str) -> IdempotencyRecord | None:
        """The record of `key`, or None."""
        rows = await self._rows(_PG_GET, {"key": key})
        return _record_of(rows[0]) if rows else None

    async def afor_thread(self, thread_id: str) -> list[IdempotencyRecord]:
        """Every record of one thread, oldest first."""
        rows = await self._rows(_PG_FOR_THREAD, {"thread_id": thread_id})
        return [_record_of(r) for r in rows]

    async def apurge(self, older_than: float | dt.timedelta = DEFAULT_RETENTION) -> int:
        """Delete the completed records whose outcome is older than `older_than` (by the
        server's clock), in batches of 10,000 rows; never a pending one."""
        script = _purge_script(_PG_PURGE, _purge_params(older_than))
        return cast("int", await _arun_script(script, self._rows))

    async def alist_pending(
        self, older_than: float | dt.timedelta = 0.0, *, limit: int | None = None
    ) -> list[IdempotencyRecord]:
        """The pending intents claimed at least `older_than` ago, oldest first."""
        rows = await self._rows(_PG_LIST_PENDING, _pending_params(older_than, limit))
        return [_record_of(r) for r in rows]

    def claim(
        self, key: str, *, tool: str, args_json: str, thread_id: str, fingerprint: str | None = None
    ) -> Claim:
        """Sync `aclaim`, from a thread other than the store's event loop."""
        coro = self.aclaim(
            key, tool=tool, args_json=args_json, thread_id=thread_id, fingerprint=fingerprint
        )
        return cast("Claim", self._sync(coro))

    def unresolved(self, thread_id: str, fingerprint: str) -> list[IdempotencyRecord]:
        """Sync `aunresolved`, from a thread other than the store's event loop."""
        return cast("list[IdempotencyRecord]", self._sync(self.aunresolved(thread_id, fingerprint)))

    def record_outcome(
        self, key: str, result: Any, *, status: OutcomeStatus = "done"
    ) -> IdempotencyRecord:
        """Sync `arecord_outcome`, from a thread other than the store's event loop."""
        return cast(
            "IdempotencyRecord", self._sync(self.arecord_outcome(key, result, status=status))
        )

    def release(self, key: str) -> bool:
        """Sync `arelease`, from a thread other than the store's event loop."""
        return cast("bool", self._sync(self.arelease(key)))

    def get(self, key: str) -> IdempotencyRecord | None:
        """Sync `aget`, from a thread other than the store's event loop."""
        return cast("IdempotencyRecord | None", self._sync(self.aget(key)))

    def for_thread(self, thread_id: str) -> list[IdempotencyRecord]:
        """Sync `afor_thread`, from a thread other than the store's event loop."""
        return cast("list[IdempotencyRecord]", self._sync(self.afor_thread(thread_id)))

    def purge(self, older_than: float | dt.timedelta = DEFAULT_RETENTION) -> int:
        """Sync `apurge`, from a thread other than the store's event loop."""
        return cast("int", self._sync(self.apurge(older_than)))

    def list_pending(
        self, older_than: float | dt.timedelta = 0.0, *, limit: int | None = None
    ) -> list[IdempotencyRecord]:
        """Sync `alist_pending`, from a thread other than the store's event loop."""
        coro = self.alist_pending(older_than, limit=limit)
        return cast("list[IdempotencyRecord]", self._sync(coro))


class PostgresSagaLog(_SyncPostgres):
    """The saga log in PostgreSQL table ``lgr_saga`` (append-only: no update, no delete)."""

    def setup(self) -> None:
        """Create the table and its index if they do not exist."""
        self._ddl(_PG_SAGA_DDL)

    def append(
        self,
        thread_id: str,
        *,
        key: str,
        tool: str,
        action: str,
        status: str,
        detail: Any = None,
    ) -> SagaEntry:
        """Append one entry (one round trip) and return it with its sequence number."""
        params = _saga_params(
            thread_id, key=key, tool=tool, action=action, status=status, detail=detail
        )
        return _entry_of(self._rows(_PG_SAGA_APPEND, params)[0])

    def entries(self, thread_id: str) -> list[SagaEntry]:
        """The thread's entries in append order."""
        return [_entry_of(r) for r in self._rows(_PG_SAGA_ENTRIES, {"thread_id": thread_id})]

    async def aappend(
        self,
        thread_id: str,
        *,
        key: str,
        tool: str,
        action: str,
        status: str,
        detail: Any = None,
    ) -> SagaEntry:
        """Async `append`, in a worker thread."""
        return await asyncio.to_thread(
            self.append, thread_id, key=key, tool=tool, action=action, status=status, detail=detail
        )

    async def aentries(self, thread_id: str) -> list[SagaEntry]:
        """Async `entries`, in a worker thread."""
        return await asyncio.to_thread(self.entries, thread_id)


class AsyncPostgresSagaLog(_AsyncPostgres):
    """`PostgresSagaLog` over a psycopg `AsyncConnectionPool` or `AsyncConnection`."""

    async def setup(self) -> None:
        """Create the table and its index if they do not exist."""
        await self._ddl(_PG_SAGA_DDL)

    async def aappend(
        self,
        thread_id: str,
        *,
        key: str,
        tool: str,
        action: str,
        status: str,
        detail: Any = None,
    ) -> SagaEntry:
        """Append one entry (one round trip) and return it with its sequence number."""
        params = _saga_params(
            thread_id, key=key, tool=tool, action=action, status=status, detail=detail
        )
        return _entry_of((await self._rows(_PG_SAGA_APPEND, params))[0])

    async def aentries(self, thread_id: str) -> list[SagaEntry]:
        """The thread's entries in append order."""
        rows = await self._rows(_PG_SAGA_ENTRIES, {"thread_id": thread_id})
        return [_entry_of(r) for r in rows]

    def append(
        self,
        thread_id: str,
        *,
        key: str,
        tool: str,
        action: str,
        status: str,
        detail: Any = None,
    ) -> SagaEntry:
        """Sync `aappend`, from a thread other than the store's event loop."""
        coro = self.aappend(
            thread_id, key=key, tool=tool, action=action, status=status, detail=detail
        )
        return cast("SagaEntry", self._sync(coro))

    def entries(self, thread_id: str) -> list[SagaEntry]:
        """Sync `aentries`, from a thread other than the store's event loop."""
        return cast("list[SagaEntry]", self._sync(self.aentries(thread_id)))


# ------------------------------------------------------------------ SQLite

_SQLITE_DDL = (
    """
    CREATE TABLE IF NOT EXISTS lgr_idempotency (
        key TEXT PRIMARY KEY,
        tool TEXT,
        thread_id TEXT,
        args TEXT,
        status TEXT NOT NULL DEFAULT 'pending'
            CHECK (status IN ('pending', 'done', 'failed')),
        result TEXT,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        fingerprint TEXT
    )
    """,
    "CREATE INDEX IF NOT EXISTS lgr_idempotency_thread_idx ON lgr_idempotency (thread_id)",
    """
    CREATE TABLE IF NOT EXISTS lgr_saga (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        thread_id TEXT NOT NULL,
        key TEXT NOT NULL,
        tool TEXT NOT NULL,
        action TEXT NOT NULL,
        status TEXT NOT NULL,
        detail TEXT,
        at REAL NOT NULL
    )
    """,
    "CREATE INDEX IF NOT EXISTS lgr_saga_thread_idx ON lgr_saga (thread_id, seq)",
)

_SQLITE_CLAIM = f"""
INSERT INTO lgr_idempotency
    (key, tool, thread_id, args, status, created_at, updated_at, fingerprint)
VALUES (:key, :tool, :thread_id, :args, 'pending', :now, :now, :fingerprint)
ON CONFLICT (key) DO NOTHING
RETURNING {_COLUMNS}
"""
_SQLITE_RECORD = f"""
INSERT INTO lgr_idempotency (key, status, result, created_at, updated_at)
VALUES (:key, :status, :result, :now, :now)
ON CONFLICT (key) DO UPDATE
    SET status = excluded.status, result = excluded.result, updated_at = excluded.updated_at
    WHERE lgr_idempotency.status = 'pending'
RETURNING {_COLUMNS}
"""
_SQLITE_GET = f"SELECT {_COLUMNS} FROM lgr_idempotency WHERE key = :key"
_SQLITE_FOR_THREAD = (
    f"SELECT {_COLUMNS} FROM lgr_idempotency WHERE thread_id = :thread_id ORDER BY created_at, key"
)
_SQLITE_UNRESOLVED = (
    f"SELECT {_COLUMNS} FROM lgr_idempotency WHERE thread_id = :thread_id "
    "AND fingerprint = :fingerprint AND status = 'pending' ORDER BY created_at, key"
)
_SQLITE_UNRESOLVED_INDEX = (
    "CREATE INDEX IF NOT EXISTS lgr_idempotency_unresolved_idx "
    "ON lgr_idempotency (thread_id, fingerprint) WHERE status = 'pending'"
)
_SQLITE_RELEASE = "DELETE FROM lgr_idempotency WHERE key = :key AND status <> 'done' RETURNING key"
_SQLITE_COMPLETED_INDEX = (
    "CREATE INDEX IF NOT EXISTS lgr_idempotency_completed_idx "
    "ON lgr_idempotency (updated_at) WHERE status IN ('done', 'failed')"
)
_SQLITE_PURGE = """
DELETE FROM lgr_idempotency
WHERE key IN (
    SELECT key FROM lgr_idempotency
    WHERE status IN ('done', 'failed') AND updated_at < :horizon
    ORDER BY updated_at
    LIMIT :batch
)
AND status IN ('done', 'failed')
"""
_SQLITE_LIST_PENDING = (
    f"SELECT {_COLUMNS} FROM lgr_idempotency WHERE status = 'pending' "
    "AND created_at <= :horizon ORDER BY created_at, key LIMIT :limit"
)
_SQLITE_SAGA_APPEND = f"""
INSERT INTO lgr_saga (thread_id, key, tool, action, status, detail, at)
VALUES (:thread_id, :key, :tool, :action, :status, :detail, :now)
RETURNING {_SAGA_COLUMNS}
"""
_SQLITE_SAGA_ENTRIES = (
    f"SELECT {_SAGA_COLUMNS} FROM lgr_saga WHERE thread_id = :thread_id ORDER BY seq"
)


def _sqlite_record(row: sqlite3.Row) -> IdempotencyRecord:
    return IdempotencyRecord(
        key=row["key"],
        status=row["status"],
        result=None if row["result"] is None else json.loads(row["result"]),
        tool=row["tool"],
        thread_id=row["thread_id"],
        args=None if row["args"] is None else json.loads(row["args"]),
        created_at=_utc(row["created_at"]),
        updated_at=_utc(row["updated_at"]),
        fingerprint=row["fingerprint"],
    )


_PG = _Dialect(
    intent=_PG_INTENT, get=_PG_GET, outcome_insert=_PG_OUTCOME_INSERT, record_of=_record_of
)
_SQLITE = _Dialect(
    intent=_SQLITE_CLAIM, get=_SQLITE_GET, outcome_insert=None, record_of=_sqlite_record
)
"""SQLite's outcome statement is an upsert: it also inserts a key with no intent."""


class _Sqlite:
    """One sqlite3 connection (autocommit) shared by the ledger and the saga log."""

    def __init__(self, conn: sqlite3.Connection, *, clock: Clock | None = None) -> None:
        conn.row_factory = sqlite3.Row
        self.conn = conn
        self._clock = clock or SystemClock()
        self._lock = threading.Lock()

    def setup(self) -> None:
        """Create the ledger and saga tables if they do not exist (and add the
        ``fingerprint`` column to a ledger made by an earlier version)."""
        with self._lock:
            for statement in _SQLITE_DDL:
                self.conn.execute(statement)
            columns = {row[1] for row in self.conn.execute("PRAGMA table_info(lgr_idempotency)")}
            if "fingerprint" not in columns:
                self.conn.execute("ALTER TABLE lgr_idempotency ADD COLUMN fingerprint TEXT")
            self.conn.execute(_SQLITE_UNRESOLVED_INDEX)
            self.conn.execute(_SQLITE_COMPLETED_INDEX)

    def _rows(self, query: str, params: Mapping[str, Any]) -> list[sqlite3.Row]:
        with self._lock:
            cursor = self.conn.execute(query, {**params, "now": self._clock.time()})
            rows = cursor.fetchall()
            if self.conn.in_transaction:
                self.conn.commit()
            return rows

    def _count(self, query: str, params: Mapping[str, Any]) -> int:
        """Run one write statement; how many rows it changed."""
        with self._lock:
            changed = self.conn.execute(query, params).rowcount
            if self.conn.in_transaction:
                self.conn.commit()
            return changed


class SqliteIdempotencyStore(_Sqlite):
    """The ledger in the embedded SQLite file (``INSERT ... ON CONFLICT DO NOTHING``).

    A single SQLite statement is atomic, also across processes sharing the file,
    so claims are exclusive. Give it its own connection (``isolation_level=None``,
    ``check_same_thread=False``): `open_sqlite` does. Async methods run in a
    worker thread.
    """

    def claim(
        self, key: str, *, tool: str, args_json: str, thread_id: str, fingerprint: str | None = None
    ) -> Claim:
        """Atomically write an intent for `key` unless one exists."""
        params = _claim_params(key, tool, args_json, thread_id, fingerprint)
        return cast("Claim", _run_script(_claim_script(_SQLITE, key, params), self._rows))

    def unresolved(self, thread_id: str, fingerprint: str) -> list[IdempotencyRecord]:
        """The thread's pending intents with this fingerprint, oldest first."""
        rows = self._rows(_SQLITE_UNRESOLVED, {"thread_id": thread_id, "fingerprint": fingerprint})
        return [_sqlite_record(r) for r in rows]

    def record_outcome(
        self, key: str, result: Any, *, status: OutcomeStatus = "done"
    ) -> IdempotencyRecord:
        """Record the outcome of a pending intent; the first outcome recorded wins."""
        params = _record_params(key, result, status)
        script = _outcome_script(_SQLITE, key, params, _SQLITE_RECORD)
        return cast("IdempotencyRecord", _run_script(script, self._rows))

    def release(self, key: str) -> bool:
        """Forget a pending or failed record so that the next claim is ``new``."""
        return bool(self._rows(_SQLITE_RELEASE, {"key": key}))

    def get(self, key: str) -> IdempotencyRecord | None:
        """The record of `key`, or None."""
        rows = self._rows(_SQLITE_GET, {"key": key})
        return _sqlite_record(rows[0]) if rows else None

    def for_thread(self, thread_id: str) -> list[IdempotencyRecord]:
        """Every record of one thread, oldest first."""
        return [_sqlite_record(r) for r in self._rows(_SQLITE_FOR_THREAD, {"thread_id": thread_id})]

    def purge(self, older_than: float | dt.timedelta = DEFAULT_RETENTION) -> int:
        """Delete the completed records whose outcome is older than `older_than` (by the
        store's clock), in batches of 10,000 rows; never a pending one."""
        seconds = _seconds(older_than, field="older_than", positive=True)
        params = {"horizon": self._clock.time() - seconds, "batch": _PURGE_BATCH}
        total = 0
        while True:
            deleted = self._count(_SQLITE_PURGE, params)
            total += deleted
            if deleted < _PURGE_BATCH:
                return total

    def list_pending(
        self, older_than: float | dt.timedelta = 0.0, *, limit: int | None = None
    ) -> list[IdempotencyRecord]:
        """The pending intents claimed at least `older_than` ago, oldest first."""
        seconds = _seconds(older_than, field="older_than", positive=False)
        limit = _limit(limit)
        params = {"horizon": self._clock.time() - seconds, "limit": -1 if limit is None else limit}
        return [_sqlite_record(r) for r in self._rows(_SQLITE_LIST_PENDING, params)]

    async def aclaim(
        self, key: str, *, tool: str, args_json: str, thread_id: str, fingerprint: str | None = None
    ) -> Claim:
        """Async `claim`, in a worker thread."""
        return await asyncio.to_thread(
            self.claim,
            key,
            tool=tool,
            args_json=args_json,
            thread_id=thread_id,
            fingerprint=fingerprint,
        )

    async def aunresolved(self, thread_id: str, fingerprint: str) -> list[IdempotencyRecord]:
        """Async `unresolved`, in a worker thread."""
        return await asyncio.to_thread(self.unresolved, thread_id, fingerprint)

    async def arecord_outcome(
        self, key: str, result: Any, *, status: OutcomeStatus = "done"
    ) -> IdempotencyRecord:
        """Async `record_outcome`, in a worker thread."""
        return await asyncio.to_thread(self.record_outcome, key, result, status=status)

    async def arelease(self, key: str) -> bool:
        """Async `release`, in a worker thread."""
        return await asyncio.to_thread(self.release, key)

    async def aget(self, key: str) -> IdempotencyRecord | None:
        """Async `get`, in a worker thread."""
        return await asyncio.to_thread(self.get, key)

    async def afor_thread(self, thread_id: str) -> list[IdempotencyRecord]:
        """Async `for_thread`, in a worker thread."""
        return await asyncio.to_thread(self.for_thread, thread_id)

    async def apurge(self, older_than: float | dt.timedelta = DEFAULT_RETENTION) -> int:
        """Async `purge`, in a worker thread."""
        return await asyncio.to_thread(self.purge, older_than)

    async def alist_pending(
        self, older_than: float | dt.timedelta = 0.0, *, limit: int | None = None
    ) -> list[IdempotencyRecord]:
        """Async `list_pending`, in a worker thread."""
        return await asyncio.to_thread(self.list_pending, older_than, limit=limit)


class SqliteSagaLog(_Sqlite):
    """The saga log in the embedded SQLite file (append-only)."""

    def append(
        self,
        thread_id: str,
        *,
        key: str,
        tool: str,
        action: str,
        status: str,
        detail: Any = None,
    ) -> SagaEntry:
        """Append one entry and return it with its sequence number."""
        params = _saga_params(
            thread_id, key=key, tool=tool, action=action, status=status, detail=detail
        )
        row = self._rows(_SQLITE_SAGA_APPEND, params)[0]
        return self._entry(row)

    def entries(self, thread_id: str) -> list[SagaEntry]:
        """The thread's entries in append order."""
        return [self._entry(r) for r in self._rows(_SQLITE_SAGA_ENTRIES, {"thread_id": thread_id})]

    @staticmethod
    def _entry(row: sqlite3.Row) -> SagaEntry:
        return SagaEntry(
            seq=int(row["seq"]),
            thread_id=row["thread_id"],
            key=row["key"],
            tool=row["tool"],
            action=row["action"],
            status=row["status"],
            detail=None if row["detail"] is None else json.loads(row["detail"]),
            at=_utc(row["at"]),
        )

    async def aappend(
        self,
        thread_id: str,
        *,
        key: str,
        tool: str,
        action: str,
        status: str,
        detail: Any = None,
    ) -> SagaEntry:
        """Async `append`, in a worker thread."""
        return await asyncio.to_thread(
            self.append, thread_id, key=key, tool=tool, action=action, status=status, detail=detail
        )

    async def aentries(self, thread_id: str) -> list[SagaEntry]:
        """Async `entries`, in a worker thread."""
        return await asyncio.to_thread(self.entries, thread_id)


# ------------------------------------------------------------------ saga compensation

CompensationOutcome = Literal[
    "compensated", "already_compensated", "failed", "unknown", "no_compensator", "not_attempted"
]
Compensator = Callable[[str, Any], Any]
"""``compensate(key, recorded_result)``: undo one effect. Should itself be
idempotent (send ``compensation_key(key)`` to the service). May be async for
`acompensate_thread`."""
CompensationStatusCheck = Callable[[str], Any]
"""``status_check(compensation_key) -> EffectStatus``: did this compensation happen?"""


@dataclasses.dataclass(frozen=True, slots=True)
class CompensationStep:
    """What happened to one effect during a compensation run."""

    key: str
    """The effect's idempotency key."""
    tool: str
    outcome: CompensationOutcome
    result: Any = None
    """The compensator's (recorded) result."""
    error: str | None = None
    """Why it failed or is unknown (redacted)."""


@dataclasses.dataclass(frozen=True, slots=True)
class CompensationReport:
    """The result of `compensate_thread`: every recorded effect, newest first.

    Nothing is dropped: a failed, unknown or skipped compensation is a step
    with that outcome, and `ok` is False while any compensation failed or is
    unknown.
    """

    thread_id: str
    steps: tuple[CompensationStep, ...]

    @property
    def ok(self) -> bool:
        """No compensation failed, is unknown, or was left unattempted after one did."""
        return not any(s.outcome in ("failed", "unknown", "not_attempted") for s in self.steps)

    @property
    def compensated(self) -> list[str]:
        """Keys whose effect is compensated (in this run or an earlier one)."""
        return [s.key for s in self.steps if s.outcome in ("compensated", "already_compensated")]

    @property
    def outstanding(self) -> list[CompensationStep]:
        """Steps whose effect is still in place (failed, unknown, no compensator, skipped)."""
        return [s for s in self.steps if s.outcome not in ("compensated", "already_compensated")]


@dataclasses.dataclass(frozen=True, slots=True)
class _Op:
    """One I/O step the compensation flow asks its driver to perform."""

    target: Literal["store", "saga", "user"]
    name: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    fn: Callable[..., Any] | None = None


def _effects_newest_first(entries: Iterable[SagaEntry]) -> list[SagaEntry]:
    """Each effect once (its first entry), newest first: the LIFO compensation order."""
    seen: dict[str, SagaEntry] = {}
    for entry in entries:
        if entry.action == "effect" and entry.key not in seen:
            seen[entry.key] = entry
    return sorted(seen.values(), key=lambda e: e.seq, reverse=True)


def _json_safe(value: Any) -> Any:
    """A compensator's result as JSON: non-JSON values become their ``str``."""
    try:
        return json.loads(json.dumps(value, default=str, allow_nan=False))
    except ValueError:  # NaN or infinity somewhere inside
        return str(value)


def _error_text(exc: BaseException) -> str:
    return redact(f"{type(exc).__name__}: {exc}")[:500]


_Flow = Generator[_Op, Any, CompensationReport]
_StepFlow = Generator[_Op, Any, CompensationStep]


def _log(thread_id: str, effect: SagaEntry, status: str, detail: Any = None) -> _Op:
    kwargs = {
        "key": effect.key,
        "tool": effect.tool,
        "action": "compensate",
        "status": status,
        "detail": detail,
    }
    return _Op("saga", "append", (thread_id,), kwargs)


def _compensation_flow(
    thread_id: str,
    compensators: Mapping[str, Compensator],
    status_checks: Mapping[str, CompensationStatusCheck],
    *,
    stop_on_failure: bool,
    retry_failed: bool,
) -> _Flow:
    """The pure compensation logic; `_drive` / `_adrive` perform its I/O steps."""
    entries: list[SagaEntry] = yield _Op("saga", "entries", (thread_id,))
    steps: list[CompensationStep] = []
    halted = False
    for effect in _effects_newest_first(entries):
        compensator = compensators.get(effect.tool)
        if halted:
            step = CompensationStep(effect.key, effect.tool, "not_attempted")
        elif compensator is None:
            step = CompensationStep(effect.key, effect.tool, "no_compensator")
        else:
            step = yield from _compensate_one(
                thread_id,
                effect,
                compensator,
                status_checks.get(effect.tool),
                retry_failed=retry_failed,
            )
            halted = stop_on_failure and step.outcome in ("failed", "unknown")
        steps.append(step)
    return CompensationReport(thread_id=thread_id, steps=tuple(steps))


def _compensate_one(
    thread_id: str,
    effect: SagaEntry,
    compensator: Compensator,
    check: CompensationStatusCheck | None,
    *,
    retry_failed: bool,
) -> _StepFlow:
    """Claim, reconcile or run the compensation of one effect."""
    ckey = compensation_key(effect.key)
    claim_kwargs = {
        "tool": effect.tool,
        "args_json": json.dumps({"compensates": effect.key}),
        "thread_id": thread_id,
    }
    claim: Claim = yield _Op("store", "claim", (ckey,), claim_kwargs)
    if claim.state == "done" and claim.status == "failed" and retry_failed:
        yield _Op("store", "release", (ckey,))
        claim = yield _Op("store", "claim", (ckey,), claim_kwargs)
    action = claim_action(claim, can_check_status=check is not None)
    if action == "replay":
        if claim.status == "done":
            return CompensationStep(
                effect.key, effect.tool, "already_compensated", result=claim.result
            )
        error = claim.result.get("error") if isinstance(claim.result, dict) else None
        return CompensationStep(effect.key, effect.tool, "failed", error=str(error or claim.result))
    if action == "unknown":
        reason = "interrupted before its outcome was recorded, and no status check to ask"
        yield _log(thread_id, effect, "unknown", {"reason": reason})
        return CompensationStep(effect.key, effect.tool, "unknown", error=reason)
    if action == "check_status":
        assert check is not None
        try:
            status = yield _Op("user", "status_check", (ckey,), fn=check)
        except GraphBubbleUp:
            raise
        except Exception as exc:
            reason = f"status check failed: {_error_text(exc)}"
            yield _log(thread_id, effect, "unknown", {"reason": reason})
            return CompensationStep(effect.key, effect.tool, "unknown", error=reason)
        if not isinstance(status, EffectStatus):
            raise TypeError(
                f"the status check of {effect.tool!r} must return an EffectStatus, "
                f"got {type(status).__name__}"
            )
        if status.done:
            result = _json_safe(status.result)
            yield _Op("store", "record_outcome", (ckey, result))
            yield _log(thread_id, effect, "reconciled")
            return CompensationStep(effect.key, effect.tool, "compensated", result=result)
    # a new claim, or a status check said the compensation did not happen: run it once
    record: IdempotencyRecord | None = yield _Op("store", "get", (effect.key,))
    recorded = record.result if record is not None else effect.detail
    yield _log(thread_id, effect, "started")
    try:
        result = yield _Op("user", "compensate", (effect.key, recorded), fn=compensator)
    except GraphBubbleUp:
        raise
    except Exception as exc:
        error = _error_text(exc)
        yield _Op("store", "record_outcome", (ckey, {"error": error}), {"status": "failed"})
        yield _log(thread_id, effect, "failed", {"error": error})
        return CompensationStep(effect.key, effect.tool, "failed", error=error)
    result = _json_safe(result)
    yield _Op("store", "record_outcome", (ckey, result))
    yield _log(thread_id, effect, "done")
    return CompensationStep(effect.key, effect.tool, "compensated", result=result)


def _drive(flow: _Flow, store: IdempotencyStore, saga: SagaLog) -> CompensationReport:
    op = next(flow)
    while True:
        try:
            if op.target == "user":
                assert op.fn is not None
                value = op.fn(*op.args)
                if inspect.isawaitable(value):
                    if inspect.iscoroutine(value):
                        value.close()
                    raise TypeError(
                        f"{op.name} returned an awaitable; use acompensate_thread for async "
                        "compensators and status checks"
                    )
            else:
                target: Any = store if op.target == "store" else saga
                value = getattr(target, op.name)(*op.args, **op.kwargs)
        except Exception as exc:
            try:
                op = flow.throw(exc)
            except StopIteration as stop:
                return cast("CompensationReport", stop.value)
            continue
        try:
            op = flow.send(value)
        except StopIteration as stop:
            return cast("CompensationReport", stop.value)


async def _adrive(flow: _Flow, store: IdempotencyStore, saga: SagaLog) -> CompensationReport:
    op = next(flow)
    while True:
        try:
            if op.target == "user":
                assert op.fn is not None
                value = op.fn(*op.args)
                if inspect.isawaitable(value):
                    value = await value
            else:
                target: Any = store if op.target == "store" else saga
                value = await getattr(target, f"a{op.name}")(*op.args, **op.kwargs)
        except Exception as exc:
            try:
                op = flow.throw(exc)
            except StopIteration as stop:
                return cast("CompensationReport", stop.value)
            continue
        try:
            op = flow.send(value)
        except StopIteration as stop:
            return cast("CompensationReport", stop.value)


def compensate_thread(
    thread_id: str,
    *,
    store: IdempotencyStore,
    saga: SagaLog,
    compensators: Mapping[str, Compensator],
    status_checks: Mapping[str, CompensationStatusCheck] | None = None,
    stop_on_failure: bool = True,
    retry_failed: bool = False,
) -> CompensationReport:
    """Undo a thread's recorded effects, newest first, each exactly once.

    For every ``effect`` entry of the thread's saga log (LIFO), the compensation
    is claimed under ``compensation_key(key)`` before `compensators[tool]` runs
    with ``(key, recorded_result)``, and its outcome is recorded after; so a run
    killed midway and re-run skips what was compensated and reconciles the one
    in flight through `status_checks[tool]` (never re-running it blindly;
    without a status check it is reported ``unknown``). A compensator that
    raises is recorded and reported ``failed``; by default the run then stops
    (older effects are ``not_attempted``) since later undos may depend on it.
    ``retry_failed=True`` tries previously failed compensations again. Take the
    thread's lock around it when runners may race.

    >>> store, saga = InMemoryIdempotencyStore(), InMemorySagaLog()
    >>> _ = saga.append("t", key="k1", tool="pay", action="effect", status="done")
    >>> undo = {"pay": lambda key, result: "refunded"}
    >>> compensate_thread("t", store=store, saga=saga, compensators=undo).compensated
    ['k1']
    """
    flow = _compensation_flow(
        thread_id,
        compensators,
        status_checks or {},
        stop_on_failure=stop_on_failure,
        retry_failed=retry_failed,
    )
    return _drive(flow, store, saga)


async def acompensate_thread(
    thread_id: str,
    *,
    store: IdempotencyStore,
    saga: SagaLog,
    compensators: Mapping[str, Compensator],
    status_checks: Mapping[str, CompensationStatusCheck] | None = None,
    stop_on_failure: bool = True,
    retry_failed: bool = False,
) -> CompensationReport:
    """Async `compensate_thread`: async store methods; compensators may be async."""
    flow = _compensation_flow(
        thread_id,
        compensators,
        status_checks or {},
        stop_on_failure=stop_on_failure,
        retry_failed=retry_failed,
    )
    return await _adrive(flow, store, saga)


# ------------------------------------------------------------------ partial results


class FailedItem(BaseModel):
    """One failed item of a batch call. Identify it by `index`, `key` or `item`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    item: Any = None
    """The item itself (matched against the original items when no index/key is given)."""
    error: str = Field(description="Why this item failed (redacted by the tool).")
    index: int | None = Field(default=None, description="Its position in the original items.")
    key: str | None = Field(
        default=None, description="Its own stable key (e.g. an order id), with `item_key=`."
    )


class PartialResult(BaseModel):
    """The partial-success marker a batch tool returns when some items failed.

    Shape (JSON)::

        {"partial": true,
         "succeeded": [...],
         "failed": [{"item": ..., "error": "...", "index": 2}]}

    Only the failed items are redone (`failed_items`), each under its own key.

    >>> PartialResult(succeeded=["a"], failed=[FailedItem(index=1, error="503")]).partial
    True
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    partial: Literal[True] = True
    """The marker that tells a partial result from an ordinary one."""
    succeeded: list[Any] = Field(default_factory=list)
    failed: list[FailedItem]


def as_partial_result(value: Any) -> PartialResult | None:
    """The `PartialResult` in a tool's return value (model, dict or JSON text), or None.

    >>> as_partial_result({"partial": True, "failed": [{"index": 0, "error": "x"}]}).failed[0].index
    0
    >>> as_partial_result({"succeeded": []}) is None
    True
    """
    if isinstance(value, PartialResult):
        return value
    if isinstance(value, str | bytes):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if isinstance(value, Mapping) and value.get("partial") is True and "failed" in value:
        return PartialResult.model_validate(dict(value))
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class RedoItem:
    """One item to redo, with the idempotency key it had on the first run."""

    index: int
    """Its position in the original items."""
    item: Any
    key: str
    """``<call key>#<index>`` or ``<call key>#<item key>``."""


def failed_items(
    items: SequenceABC[Any],
    partial: PartialResult,
    *,
    call_key: str,
    item_key: Callable[[Any], str] | None = None,
) -> list[RedoItem]:
    """Select only the failed items of a batch, in their original order, with their keys.

    Each failed entry is matched to the original items by `index`, else by
    `key` (through `item_key`), else by canonical equality of `item`. The
    per-item key is ``item_idempotency_key(call_key, item_key(item))`` when
    `item_key` is given, else ``item_idempotency_key(call_key, index)``: the
    same key the first run used, so the service deduplicates an item that did
    go through. An entry that names no original item is a bug in the tool and
    raises ValueError.

    >>> p = PartialResult(succeeded=["a", "c"], failed=[FailedItem(item="b", error="503")])
    >>> [(r.index, r.key) for r in failed_items(["a", "b", "c"], p, call_key="bulk:9")]
    [(1, 'bulk:9#1')]
    """
    canon = [canonical_args(item, noise_fields=()) for item in items]
    own_keys = [item_key(item) for item in items] if item_key is not None else None
    chosen: dict[int, None] = {}
    for failed in partial.failed:
        index = _match_item(failed, items, canon, own_keys, chosen)
        chosen[index] = None
    result = []
    for index in sorted(chosen):
        suffix: int | str = own_keys[index] if own_keys is not None else index
        result.append(RedoItem(index, items[index], item_idempotency_key(call_key, suffix)))
    return result


def _match_item(
    failed: FailedItem,
    items: SequenceABC[Any],
    canon: list[str],
    own_keys: list[str] | None,
    chosen: Mapping[int, None],
) -> int:
    if failed.index is not None:
        if not 0 <= failed.index < len(items):
            raise ValueError(
                f"partial result names item index {failed.index}, "
                f"but the batch has {len(items)} items"
            )
        return failed.index
    if failed.key is not None:
        if own_keys is None:
            raise ValueError(
                f"partial result names item key {failed.key!r}; pass item_key= to map keys"
            )
        if failed.key not in own_keys:
            raise ValueError(f"partial result names item key {failed.key!r}, not in the batch")
        return own_keys.index(failed.key)
    wanted = canonical_args(failed.item, noise_fields=())
    for index, text in enumerate(canon):
        if text == wanted and index not in chosen:
            return index
    raise ValueError(f"partial result names an item that is not in the batch: {failed.item!r}")
