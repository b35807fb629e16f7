"""Exactly-once side effects, the pure part: keys, ledger records, claims, the store protocols.

LangGraph re-runs an interrupted node on resume, so an effect done just before a
crash (a payment, an email, an order) would happen twice. The durable memory
that prevents it is a ledger of *intents* and *outcomes*; this module holds what
every backend of it shares and decides, with no I/O:

- `idempotency_key` derives a stable key per intended effect: tool + canonical
  arguments + thread id + call identity, hashed with SHA-256 (never ``hash()``),
  so every process computes the same key. The key is also what the tool passes
  to the outside world (e.g. an ``Idempotency-Key`` header), so the service
  deduplicates too.
- An `IdempotencyStore` records an *intent* before the effect and its *outcome*
  after. `IdempotencyStore.claim` is atomic across workers and answers one of
  ``new`` (the intent was written now: execute), ``pending`` (an intent with no
  outcome: the outcome is UNKNOWN, reconcile, never re-run blindly) or ``done``
  (an outcome is recorded: return it); `claim_action` says what to do next.
  Backends live in `langgraph_resilience.stores`: in memory
  (`~langgraph_resilience.stores.memory.InMemoryIdempotencyStore`), PostgreSQL
  (`~langgraph_resilience.stores.postgres`, our own table: ``INSERT ... ON
  CONFLICT DO NOTHING``, one round trip per new claim, durable before the
  effect, two for a replay, and one per outcome) and SQLite
  (`~langgraph_resilience.stores.sqlite`, the same statement on the embedded
  file). LangGraph's ``PostgresStore.put`` is an upsert with no put-if-absent,
  so it cannot claim a key: that is why the ledger has its own table.
- A `SagaLog` is an append-only log of effects and compensations per thread;
  `langgraph_resilience.core.compensation` undoes a thread's recorded effects.

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
tool's `~langgraph_resilience.core.partial.PartialResult` is recorded as the
outcome like any result; the redo runs only its failed items, each claimed under
its own key.

``pending`` only means "crashed" when one runner owns the thread: take the
per-thread lock (`langgraph_resilience.stores.locks.thread_lock`) for every run,
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

Stale intents
-------------
A pending intent is resolved by the next run of its thread (the same call's replay
asks ``status_check`` or answers UNKNOWN; new input answers the call from the
ledger). An intent whose thread will never run again would stay pending forever:
its thread was deleted, rolled back, or lost (``langgraph dev`` killed before it
flushed its files). The rule (`stale_reason`, applied by
`langgraph_resilience.stores.stale.settle_stale`): a pending intent at least
`STALE_GRACE` old whose thread no longer exists, or any pending intent older than
`PENDING_TTL`, is settled as ``failed`` with an ``IntentAbandoned`` result that
says the outcome is unknown and why. Never released, so never run again: a replay
of its call answers that result. Settling a stale intent only ends the wait; if
the effect may matter, reconcile it with the service first (``list_pending``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
from collections.abc import Iterable
from typing import Any, Literal, Protocol, runtime_checkable

from langgraph_resilience.core.canonical import DEFAULT_NOISE_FIELDS, canonical_args

__all__ = [
    "DEFAULT_RETENTION",
    "Claim",
    "ClaimAction",
    "ClaimState",
    "EffectStatus",
    "IdempotencyRecord",
    "IdempotencyStore",
    "OutcomeStatus",
    "PENDING_TTL",
    "STALE_GRACE",
    "RecordStatus",
    "StaleReason",
    "abandoned",
    "abandoned_result",
    "stale_reason",
    "SagaAction",
    "SagaEntry",
    "SagaLog",
    "claim_action",
    "compensation_key",
    "effect_fingerprint",
    "effect_identity",
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
"""Part of every key's hashed material: changing it orphans every in-flight intent."""

STALE_GRACE = dt.timedelta(minutes=5)
"""How old a pending intent of a thread that no longer exists must be to be stale:
longer than any run takes to write its thread's first checkpoint."""

PENDING_TTL = dt.timedelta(days=30)
"""The longest a thread may wait (crashed, interrupted, with a human) before its
pending intents are settled as abandoned, whether or not the thread still exists."""

StaleReason = Literal["thread_gone", "expired"]

DEFAULT_RETENTION = dt.timedelta(days=30)
"""How long `IdempotencyStore.purge` keeps a completed record by default. It must
exceed the longest time a thread may be resumed (or compensated) after a crash,
an interrupt or a wait for a human; see "Retention" in the module docs."""


# ------------------------------------------------------------------ keys


def _digest(*material: Any) -> str:
    text = json.dumps(list(material), separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


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
    return _key(tool, canonical_args(args, noise_fields=noise_fields), thread_id, call_identity)


def _key(tool: str, args_text: str, thread_id: str, call_identity: str) -> str:
    return f"{tool}:{_digest(_KEY_VERSION, tool, args_text, thread_id, call_identity)}"


def _fingerprint(tool: str, args_text: str, thread_id: str) -> str:
    return _digest(_KEY_VERSION, tool, args_text, thread_id)


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
    return _fingerprint(tool, canonical_args(args, noise_fields=noise_fields), thread_id)


def effect_identity(
    tool: str,
    args: Any,
    *,
    thread_id: str,
    call_identity: str,
    noise_fields: Iterable[str] = DEFAULT_NOISE_FIELDS,
) -> tuple[str, str, str]:
    """`idempotency_key`, `effect_fingerprint` and `canonical_args` of one call at once:
    the arguments are made canonical once, not three times, on every side effect.

    >>> key, fingerprint, text = effect_identity("pay", {"amount": 5}, thread_id="t",
    ...                                          call_identity="c1")
    >>> key == idempotency_key("pay", {"amount": 5}, thread_id="t", call_identity="c1")
    True
    >>> fingerprint == effect_fingerprint("pay", {"amount": 5}, thread_id="t"), text
    (True, '{"amount":5}')
    """
    noise = noise_fields if isinstance(noise_fields, frozenset) else frozenset(noise_fields)
    text = canonical_args(args, noise_fields=noise)
    stored = text if noise == DEFAULT_NOISE_FIELDS else canonical_args(args)
    return _key(tool, text, thread_id, call_identity), _fingerprint(tool, text, thread_id), stored


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
    """The effect's idempotency key (`idempotency_key`), or a ``comp:`` key."""
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
    age_s: float | None = None
    """Seconds since the record last changed, on the store's own clock (None: the store
    does not say). A pending intent younger than the tool's timeout may be an attempt
    of another process still on the wire."""


@dataclasses.dataclass(frozen=True, slots=True)
class Claim:
    """The answer to `IdempotencyStore.claim`: what the ledger held for the key."""

    state: ClaimState
    record: IdempotencyRecord
    unresolved: tuple[IdempotencyRecord, ...] | None = None
    """On a ``new`` claim whose store looked them up in the same round trip: the
    thread's other pending intents of the same fingerprint, oldest first (what
    `IdempotencyStore.unresolved` returns, this key left out). None: not looked up."""
    done: tuple[str, ...] | None = None
    """Likewise: the keys of the thread's done records of the same fingerprint, newest
    first (what `IdempotencyStore.done_keys` returns). None: not looked up."""

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


def stale_reason(
    record: IdempotencyRecord,
    *,
    thread_exists: bool,
    grace: float = STALE_GRACE.total_seconds(),
    ttl: float = PENDING_TTL.total_seconds(),
) -> StaleReason | None:
    """Why a pending intent is stale (see "Stale intents"), or None while it may still
    be resolved by its thread (pure).

    >>> old = IdempotencyRecord(key="k", status="pending", age_s=600.0)
    >>> stale_reason(old, thread_exists=False), stale_reason(old, thread_exists=True)
    ('thread_gone', None)
    """
    if record.status != "pending" or record.age_s is None:
        return None
    if record.age_s >= ttl:
        return "expired"
    if not thread_exists and record.age_s >= grace:
        return "thread_gone"
    return None


def abandoned_result(reason: StaleReason) -> dict[str, Any]:
    """The outcome a stale intent is settled with: unknown, and why."""
    why = {
        "thread_gone": "its thread no longer exists (deleted, rolled back or lost)",
        "expired": "it waited longer than the pending TTL",
    }[reason]
    return {
        "type": "IntentAbandoned",
        "outcome": "unknown",
        "reason": reason,
        "message": f"this side effect's outcome was never recorded and {why}; it may "
        "have happened. It is not run again.",
    }


def abandoned(record: IdempotencyRecord) -> bool:
    """Whether a record is a stale intent settled as abandoned: its outcome is unknown.

    >>> abandoned(IdempotencyRecord("k", "failed", abandoned_result("expired")))
    True
    """
    result = record.result
    return isinstance(result, dict) and result.get("type") == "IntentAbandoned"


def summarize_records(records: Iterable[IdempotencyRecord]) -> dict[str, int]:
    """Count a thread's side effects by status; a finished compensation (its
    ``comp:`` record) counts as ``compensated``, not as one more effect done, and an
    abandoned intent as ``unknown``, not as failed.

    >>> summarize_records([IdempotencyRecord("a", "done"), IdempotencyRecord("b", "pending"),
    ...                    IdempotencyRecord(compensation_key("a"), "done")])
    {'pending': 1, 'done': 1, 'failed': 0, 'unknown': 0, 'compensated': 1}
    """
    counts = {"pending": 0, "done": 0, "failed": 0, "unknown": 0, "compensated": 0}
    for record in records:
        compensation = record.key.startswith(compensation_key(""))
        status: str = record.status
        if compensation and status == "done":
            status = "compensated"
        elif abandoned(record):
            status = "unknown"
        counts[status] = counts.get(status, 0) + 1
    return counts


# ------------------------------------------------------------------ protocols


@runtime_checkable
class IdempotencyStore(Protocol):
    """The durable intent/outcome ledger. Every method has an async twin (``a*``)."""

    def claim(
        self, key: str, *, tool: str, args_json: str, thread_id: str, fingerprint: str | None = None
    ) -> Claim:
        """Atomically write an intent for `key` unless one exists; say what was found
        (a new intent's record holds what was written; its timestamps may be left out)."""
        ...

    def unresolved(self, thread_id: str, fingerprint: str) -> list[IdempotencyRecord]:
        """The thread's pending intents (outcome unknown) with this `effect_fingerprint`,
        oldest first: the same effect asked for by an earlier call."""
        ...

    def done_keys(self, thread_id: str, fingerprint: str) -> list[str]:
        """The keys of the thread's done records with this `effect_fingerprint`, newest
        first: the same effect done by earlier calls, which a rewound thread may no
        longer hold."""
        ...

    def record_outcome(
        self, key: str, result: Any, *, status: OutcomeStatus = "done"
    ) -> IdempotencyRecord:
        """Record the outcome of a pending intent; the first outcome recorded wins. The
        record returned holds at least its key, status and result (`get` reads it whole)."""
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

    async def adone_keys(self, thread_id: str, fingerprint: str) -> list[str]:
        """Async `done_keys`."""
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
        self, thread_id: str, *, key: str, tool: str, action: str, status: str, detail: Any = None
    ) -> SagaEntry:
        """Append one entry and return it with its sequence number."""
        ...

    def entries(self, thread_id: str) -> list[SagaEntry]:
        """The thread's entries in append order."""
        ...

    async def aappend(
        self, thread_id: str, *, key: str, tool: str, action: str, status: str, detail: Any = None
    ) -> SagaEntry:
        """Async `append`."""
        ...

    async def aentries(self, thread_id: str) -> list[SagaEntry]:
        """Async `entries`."""
        ...
