"""Saga compensation: undo a thread's recorded effects, newest first, each exactly once.

The logic is one `~langgraph_resilience.core.flow` flow over the two ledgers (an
`IdempotencyStore` and a `SagaLog`, any backend) and the user's compensators and
status checks: `compensate_thread` drives it with `drive`, `acompensate_thread`
with `adrive` (async store methods; compensators and status checks may be async).
Each compensation is claimed under its own key (``comp:<key>``) before it runs and
its outcome recorded after, so a compensation run that is killed and re-run
compensates each effect exactly once.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, Required, TypedDict, Unpack

from langgraph.errors import GraphBubbleUp

from langgraph_resilience.core.clock import SystemClock
from langgraph_resilience.core.effects import (
    Claim,
    EffectStatus,
    IdempotencyRecord,
    IdempotencyStore,
    SagaEntry,
    SagaLog,
    claim_action,
    compensation_key,
)
from langgraph_resilience.core.flow import Call, Flow, adrive, drive
from langgraph_resilience.core.redaction import redact

__all__ = [
    "CompensationOptions",
    "CompensationOutcome",
    "CompensationReport",
    "CompensationStatusCheck",
    "CompensationStep",
    "Compensator",
    "acompensate_thread",
    "compensate_thread",
]

CompensationOutcome = Literal[
    "compensated", "already_compensated", "failed", "unknown", "no_compensator", "not_attempted"
]
Compensator = Callable[[str, Any], Any]
"""``compensate(key, recorded_result)``: undo one effect. Should itself be
idempotent (send ``compensation_key(key)`` to the service). May be async for
`acompensate_thread`."""
CompensationStatusCheck = Callable[[str], Any]
"""``status_check(compensation_key) -> EffectStatus``: did this compensation happen?"""

_NEVER_SLEEPS = SystemClock()
"""The drivers' clock: a compensation run never waits."""


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


class CompensationOptions(TypedDict, total=False):
    """The keyword arguments of `compensate_thread` and `acompensate_thread`."""

    store: Required[IdempotencyStore]
    """The ledger the effects were claimed in; each compensation is claimed there too."""
    saga: Required[SagaLog]
    """The saga log whose ``effect`` entries are undone."""
    compensators: Required[Mapping[str, Compensator]]
    """The undo of each tool, by tool name; an effect of another tool is reported
    ``no_compensator``."""
    status_checks: Mapping[str, CompensationStatusCheck] | None
    """How to ask, per tool, whether an interrupted compensation happened."""
    stop_on_failure: bool
    """Stop after a failed or unknown compensation (default True): older effects are
    ``not_attempted``, since later undos may depend on it."""
    retry_failed: bool
    """Try previously failed compensations again (default False)."""


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


def _user(fn: Callable[..., Any], what: str, *args: Any) -> Call:
    """A call of the user's `fn`: awaited under `adrive`, refused if async under `drive`."""

    def sync_only(*call_args: Any) -> Any:
        value = fn(*call_args)
        if not inspect.isawaitable(value):
            return value
        if inspect.iscoroutine(value):
            value.close()  # never awaited: say so here, not in a RuntimeWarning
        raise TypeError(
            f"{what} returned an awaitable; use acompensate_thread for async "
            "compensators and status checks"
        )

    return Call(sync_only, fn, args)


class _Run:
    """One compensation run of one thread: the flow and the calls it asks for."""

    def __init__(
        self,
        thread_id: str,
        *,
        store: IdempotencyStore,
        saga: SagaLog,
        compensators: Mapping[str, Compensator],
        status_checks: Mapping[str, CompensationStatusCheck] | None = None,
        stop_on_failure: bool = True,
        retry_failed: bool = False,
    ) -> None:
        self.thread_id = thread_id
        self.store = store
        self.saga = saga
        self.compensators = compensators
        self.status_checks = status_checks or {}
        self.stop_on_failure = stop_on_failure
        self.retry_failed = retry_failed

    def log(self, effect: SagaEntry, status: str, detail: Any = None) -> Call:
        """Append a ``compensate`` entry for `effect` to the saga log."""
        kwargs = {
            "key": effect.key,
            "tool": effect.tool,
            "action": "compensate",
            "status": status,
            "detail": detail,
        }
        return Call(self.saga.append, self.saga.aappend, (self.thread_id,), kwargs)

    def outcome(self, key: str, result: Any, status: str = "done") -> Call:
        """Record the outcome of the compensation claimed under `key`."""
        kwargs = {"status": status}
        return Call(self.store.record_outcome, self.store.arecord_outcome, (key, result), kwargs)

    def flow(self) -> Flow[CompensationReport]:
        """Every effect of the thread, newest first: compensated, or why not."""
        entries: list[SagaEntry] = yield Call(
            self.saga.entries, self.saga.aentries, (self.thread_id,)
        )
        steps: list[CompensationStep] = []
        halted = False
        for effect in _effects_newest_first(entries):
            compensator = self.compensators.get(effect.tool)
            if halted:
                step = CompensationStep(effect.key, effect.tool, "not_attempted")
            elif compensator is None:
                step = CompensationStep(effect.key, effect.tool, "no_compensator")
            else:
                step = yield from self.one(effect, compensator)
                halted = self.stop_on_failure and step.outcome in ("failed", "unknown")
            steps.append(step)
        return CompensationReport(thread_id=self.thread_id, steps=tuple(steps))

    def one(self, effect: SagaEntry, compensator: Compensator) -> Flow[CompensationStep]:
        """Claim, reconcile or run the compensation of one effect."""
        store, ckey = self.store, compensation_key(effect.key)
        claim_kwargs = {
            "tool": effect.tool,
            "args_json": json.dumps({"compensates": effect.key}),
            "thread_id": self.thread_id,
        }
        claim: Claim = yield Call(store.claim, store.aclaim, (ckey,), claim_kwargs)
        if claim.state == "done" and claim.status == "failed" and self.retry_failed:
            yield Call(store.release, store.arelease, (ckey,))
            claim = yield Call(store.claim, store.aclaim, (ckey,), claim_kwargs)
        check = self.status_checks.get(effect.tool)
        action = claim_action(claim, can_check_status=check is not None)
        if action == "replay":
            return _replayed(effect, claim)
        if action == "unknown":
            reason = "interrupted before its outcome was recorded, and no status check to ask"
            yield self.log(effect, "unknown", {"reason": reason})
            return CompensationStep(effect.key, effect.tool, "unknown", error=reason)
        if action == "check_status":
            assert check is not None
            step = yield from self.reconcile(effect, check)
            if step is not None:
                return step
        # a new claim, or a status check said the compensation did not happen: run it once
        return (yield from self.execute(effect, compensator))

    def reconcile(
        self, effect: SagaEntry, check: CompensationStatusCheck
    ) -> Flow[CompensationStep | None]:
        """Ask whether an interrupted compensation happened; None: it did not, run it."""
        ckey = compensation_key(effect.key)
        try:
            status = yield _user(check, "status_check", ckey)
        except GraphBubbleUp:
            raise
        except Exception as exc:
            reason = f"status check failed: {_error_text(exc)}"
            yield self.log(effect, "unknown", {"reason": reason})
            return CompensationStep(effect.key, effect.tool, "unknown", error=reason)
        if not isinstance(status, EffectStatus):
            raise TypeError(
                f"the status check of {effect.tool!r} must return an EffectStatus, "
                f"got {type(status).__name__}"
            )
        if not status.done:
            return None
        result = _json_safe(status.result)
        yield self.outcome(ckey, result)
        yield self.log(effect, "reconciled")
        return CompensationStep(effect.key, effect.tool, "compensated", result=result)

    def execute(self, effect: SagaEntry, compensator: Compensator) -> Flow[CompensationStep]:
        """Run the compensator once on the effect's recorded result; record what it did."""
        ckey = compensation_key(effect.key)
        record: IdempotencyRecord | None = yield Call(
            self.store.get, self.store.aget, (effect.key,)
        )
        recorded = record.result if record is not None else effect.detail
        yield self.log(effect, "started")
        try:
            result = yield _user(compensator, "compensate", effect.key, recorded)
        except GraphBubbleUp:
            raise
        except Exception as exc:
            error = _error_text(exc)
            yield self.outcome(ckey, {"error": error}, "failed")
            yield self.log(effect, "failed", {"error": error})
            return CompensationStep(effect.key, effect.tool, "failed", error=error)
        result = _json_safe(result)
        yield self.outcome(ckey, result)
        yield self.log(effect, "done")
        return CompensationStep(effect.key, effect.tool, "compensated", result=result)


def _replayed(effect: SagaEntry, claim: Claim) -> CompensationStep:
    """The step of a compensation whose outcome an earlier run recorded."""
    if claim.status == "done":
        return CompensationStep(effect.key, effect.tool, "already_compensated", result=claim.result)
    error = claim.result.get("error") if isinstance(claim.result, dict) else None
    return CompensationStep(effect.key, effect.tool, "failed", error=str(error or claim.result))


def compensate_thread(thread_id: str, **options: Unpack[CompensationOptions]) -> CompensationReport:
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

    >>> from langgraph_resilience.stores.memory import InMemoryIdempotencyStore
    >>> from langgraph_resilience.stores.saga import InMemorySagaLog
    >>> store, saga = InMemoryIdempotencyStore(), InMemorySagaLog()
    >>> _ = saga.append("t", key="k1", tool="pay", action="effect", status="done")
    >>> undo = {"pay": lambda key, result: "refunded"}
    >>> compensate_thread("t", store=store, saga=saga, compensators=undo).compensated
    ['k1']
    """
    return drive(_Run(thread_id, **options).flow(), _NEVER_SLEEPS)


async def acompensate_thread(
    thread_id: str, **options: Unpack[CompensationOptions]
) -> CompensationReport:
    """Async `compensate_thread`: async store methods; compensators may be async."""
    return await adrive(_Run(thread_id, **options).flow(), _NEVER_SLEEPS)
