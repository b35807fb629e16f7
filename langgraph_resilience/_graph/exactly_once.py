"""Exactly once: the flow that runs one side-effecting call at most once per effect.

One `core.flow` flow (`exactly_once`) serves the sync and the async tool paths:
claim the call's idempotency key; replay a recorded outcome; ask ``status_check``
about a pending one (never re-run blindly, and not while an abandoned attempt may
still land); before a new claim runs, reconcile an unresolved intent of the same
effect asked for by an earlier call (a model re-issuing a call whose answer was
lost, under a new id); then run the tool once, release the key when it certainly
did nothing, and record what happened. Every ledger operation is retried as a
database error, and a ledger that stays down is never reported as the tool's
failure (`ledger_op`).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.messages import ToolCall, ToolMessage
from langgraph.errors import GraphBubbleUp
from langgraph.types import Command

from langgraph_resilience._graph.effect_keys import (
    calling,
    current_idempotency_key,
    current_item_keys,
    effect_context,
    key_in_effect,
)
from langgraph_resilience._graph.in_flight import Settled, asettle, settle
from langgraph_resilience._graph.saved_step import SavedStep, await_saved, wait_saved
from langgraph_resilience._graph.status_checks import StatusCheck
from langgraph_resilience.core.backoff import ledger_retry_delay
from langgraph_resilience.core.effects import (
    Claim,
    EffectStatus,
    IdempotencyRecord,
    abandoned,
    claim_action,
)
from langgraph_resilience.core.flow import Call, Flow, Sleep
from langgraph_resilience.core.profile import ToolProfile
from langgraph_resilience.errors import (
    ConfigurationError,
    FailureClass,
    LedgerUnavailableError,
    OutputValidationError,
    StepNotSavedError,
    ThreadLockLostError,
    ToolFailure,
)
from langgraph_resilience.events import Event, emit, logger
from langgraph_resilience.stores.effect_ledger import EffectLedger
from langgraph_resilience.stores.held import acheck_fence, check_fence

__all__ = [
    "Effect",
    "EffectNotDone",
    "OutcomeUnknownError",
    "calling",
    "current_idempotency_key",
    "current_item_keys",
    "effect_context",
    "key_in_effect",
    "exactly_once",
    "outcome_of",
    "replayed",
]

Answer = ToolMessage | Command[Any]


class OutcomeUnknownError(ToolFailure):
    """An earlier run of this side effect left no outcome and nothing could tell whether
    it happened: it is not run again blindly (UNKNOWN, ``query_status``).

    ``earlier_call`` says the unknown effect was asked for by an earlier, identical
    call (same tool and arguments in this thread, e.g. a model re-issuing a call
    whose answer was lost under a new id) rather than by this call itself.
    """

    def __init__(self, key: str, *, earlier_call: bool = False, reason: str = "") -> None:
        if earlier_call:
            text = (
                "an identical earlier call (same tool and arguments) in this thread may "
                "already have taken effect; its outcome is unknown, so this call was not "
                "executed. Check whether the earlier one took effect before asking again."
            )
        else:
            text = (
                "an earlier attempt of this side effect may have happened and its outcome "
                "is unknown; it was not run again. Check its status before retrying."
            )
        context: dict[str, Any] = {"idempotency_key": key}
        if earlier_call:
            context["earlier_call"] = True
        if reason:
            context["reason"] = reason
        super().__init__(
            FailureClass.UNKNOWN, text, suggested_action="query_status", context=context
        )


class EffectNotDone(ToolFailure):
    """The service says the effect did not happen, and the call has no attempt left."""

    def __init__(self, key: str) -> None:
        super().__init__(
            FailureClass.TRANSIENT,
            "the service reports this side effect did not happen, and no attempt is left "
            "to run it again",
            context={"idempotency_key": key, "reconciled": "not_done"},
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Effect:
    """One side-effecting call: its key, what the ledger stores of it, how to run it."""

    ledger: EffectLedger
    key: str
    thread_id: str
    args_json: str
    profile: ToolProfile
    args: dict[str, Any]
    fingerprint: str
    may_execute: bool = True
    """False once the call's attempts are spent: a reconcile may only ask status_check."""
    approved: bool = False
    """A human answered retry/edit: an unknown earlier outcome does not block it."""
    told_before: frozenset[str] = frozenset()
    """Keys of unknown effects told to the agent in an earlier task: not blocking."""
    told_now: frozenset[str] = frozenset()
    """Keys of unknown effects told to the agent in this task: a re-issue of one whose
    outcome has since been recorded is answered from it."""
    held: int = 0
    """How many times the thread holds this effect done (the ledger channel's count):
    done records of it beyond that are effects a rewound thread no longer shows."""
    same_message: Callable[[], frozenset[str]] = frozenset
    """Keys of the other calls of this call's assistant message to the same tool, made
    only when the ledger holds another call's intent of the same effect: each position
    is an effect of its own (two identical calls asked at once are two requests), never
    an earlier call this one repeats."""
    grace: float = 0.0
    """How long an abandoned attempt may still be running (the tool's timeout)."""
    looked: Callable[[], bool] = lambda: False
    """Whether the agent, told an identical earlier call's outcome is unknown, has since
    read the world (a successful read tool call after that answer): its re-issue is
    then informed and runs, under the earlier call's key; a blind one does not."""
    check_wait: Callable[[BaseException, int], float | None] = lambda error, attempts: None
    """How long to wait before asking ``status_check`` again after it failed with
    `error` on its `attempts`-th try (None: give up): a check is a read, retried
    within the call's attempts."""
    saved_step: SavedStep | None = None
    """The checkpoint the call's step runs from, to wait for before a first run
    (`langgraph_resilience._graph.saved_step`); None when nothing is to be waited for."""


@dataclasses.dataclass(frozen=True, slots=True)
class Run:
    """What the flow needs from the node: running the tool, and two judgements of its
    outcome (both pure)."""

    tool: Callable[[str], Flow[Answer]]
    """The tool's execution under an idempotency key (in context for the tool): its
    answer. An MCP ``isError`` answer is raised, as the service's refusal."""
    maybe_executed: Callable[[BaseException], bool]
    """Whether a failure may hide a done effect (a lost response): the evidence of
    execution (`core.evidence`), not the failure's class."""
    broken_contract: Callable[[Answer], OutputValidationError | None]
    """The output-contract failure of an answer, or None when it is usable."""


_ABANDONED = "its outcome was never recorded and it was settled as abandoned; it may have happened"
_STILL_RUNNING = (
    "an earlier attempt that timed out is still running, so whether it takes effect is "
    "not known yet; it was not run again"
)


def exactly_once(call: ToolCall, effect: Effect, run: Run) -> Flow[Answer]:
    """The exactly-once flow of one side-effecting call (see the module docstring).

    The claim needs no fence check before it: it is a fenced write (the database
    refuses it from a holder whose lease was taken over). The check that demands a
    third of the lease's TTL, and renews it, comes right before the effect runs."""
    claim: Claim = yield from ledger_op(effect, "claim", _claim(call, effect))
    can_check = effect.profile.status_check is not None
    action = claim_action(claim, can_check_status=can_check)
    if action == "replay" and abandoned(claim.record):
        raise OutcomeUnknownError(effect.key, reason=_ABANDONED)
    if action == "replay":
        return replayed(call, claim.record.result, effect.key)
    key = effect.key
    if action == "unknown" and (effect.approved or effect.profile.safe_repeat):
        # nothing can be asked, but a repeat is safe (the service deduplicates by the
        # key, it is idempotent) or a human vouched for it: send it again
        key = yield from _resent_key(effect)
    elif action == "unknown":
        raise OutcomeUnknownError(effect.key)
    elif action == "check_status":
        reconciled = yield from _reconcile_own(call, effect, claim.record)
        if reconciled is not None:
            return reconciled
    else:
        done = yield from _done_unheld(call, effect, claim.done)
        if done is not None:
            return done
        earlier = yield from _reconcile_earlier(call, effect, claim.unresolved)
        if isinstance(earlier, ToolMessage):
            return earlier
        key = earlier
    return (yield from _send(call, effect, key, run))


def _send(call: ToolCall, effect: Effect, key: str, run: Run) -> Flow[Answer]:
    """Run the claimed effect once, under `key` (its own, or the key of the earlier
    identical call it repeats), once its step is saved and its fence holds; record
    what happened under both keys."""
    try:
        if effect.saved_step is not None:
            yield Call(wait_saved, await_saved, (effect.saved_step, call["name"]))
        yield Call(check_fence, acheck_fence, (effect.thread_id,), {"claimed": True})
    except (ThreadLockLostError, StepNotSavedError):
        yield from _release(effect, effect.key)  # claimed, never run: run it afresh
        raise
    try:
        answer: Answer = yield from run.tool(key)
    except GraphBubbleUp:
        yield from _release(effect, effect.key)  # paused before the effect: run it afresh
        raise
    except Exception as exc:
        if not run.maybe_executed(exc):  # refused, or a definite answer: not done
            yield from _release(effect, effect.key)
        raise
    return (yield from _settle_answer(call, effect, key, answer, run))


def _settle_answer(
    call: ToolCall, effect: Effect, key: str, answer: Answer, run: Run
) -> Flow[Answer]:
    """Record what ran; an unusable answer of an effect that ran is as if lost."""
    broken = run.broken_contract(answer)
    if broken is not None:
        if effect.profile.status_check is None:
            raise OutputValidationError(broken.problems, effect_unknown=True) from broken
        status: EffectStatus = yield from _status(effect, key)
        if not status.done:
            yield from _release(effect, effect.key)
            raise broken  # SEMANTIC: fixing the call cannot do the effect twice
        yield from _settled(call, effect, (key, effect.key), status.result)
        return replayed(call, status.result, key, reconciled=True)
    outcome = outcome_of(answer)
    if key != effect.key:  # it repeated an earlier call: that intent is answered too
        yield from _record(effect, key, outcome)
    yield from _record_behind(effect, outcome)
    yield from _saga(call, effect, key)
    return answer


def _settled(call: ToolCall, effect: Effect, keys: Sequence[str], result: Any) -> Flow[None]:
    """An effect found done by asking its service: its outcome under each key, and its
    saga entry (it happened, so an abandoned plan compensates it like any other)."""
    for key in dict.fromkeys(keys):
        yield from _record(effect, key, storable(result))
    yield from _saga(call, effect, keys[0])


def _saga(call: ToolCall, effect: Effect, key: str) -> Flow[None]:
    """A compensable effect that happened enters the thread's saga log."""
    if effect.profile.compensate is None:
        return
    saga = effect.ledger.saga
    kwargs = {"key": key, "tool": call["name"], "action": "effect", "status": "done"}
    yield from ledger_op(
        effect, "saga", Call(saga.append, saga.aappend, (effect.thread_id,), kwargs)
    )


def _resent_key(effect: Effect) -> Flow[str]:
    """The key a repeat of this call's own unknown effect is sent under: for a service
    that deduplicates by key, the oldest unresolved intent of the same effect (an
    earlier call this one repeated, before a crash); else its own."""
    if effect.profile.safe_repeat != "by_key":
        return effect.key
    store = effect.ledger.idempotency
    unresolved = Call(store.unresolved, store.aunresolved, (effect.thread_id, effect.fingerprint))
    found: Sequence[IdempotencyRecord] = yield from ledger_op(effect, "siblings", unresolved)
    earlier = _siblings(found, effect)
    return earlier[0].key if earlier else effect.key


EARLIER_RUN = (
    "This was already done by an earlier run on this thread that the conversation no "
    "longer shows (it was rolled back, or lost before it was saved); it was not done again."
)


def _done_unheld(
    call: ToolCall, effect: Effect, known: Sequence[str] | None
) -> Flow[ToolMessage | None]:
    """The same effect done more often than the thread holds it (a rollback, a lost
    flush or a fork rewound the thread past it, and the agent asks for it anew): this
    call is answered with the newest such outcome, and the agent is told, instead of
    doing it again. An effect the agent was told of as unknown in an earlier task is
    not counted: a new human request for it runs."""
    store = effect.ledger.idempotency
    if known is None:
        done_keys = Call(store.done_keys, store.adone_keys, (effect.thread_id, effect.fingerprint))
        known = yield from ledger_op(effect, "siblings", done_keys)
    done = [key for key in known if key != effect.key and not _asked_apart(key, effect)]
    if len(done) <= effect.held:
        return None
    record: IdempotencyRecord | None = yield from ledger_op(
        effect, "siblings", Call(store.get, store.aget, (done[0],))
    )
    if record is None or record.status != "done":  # purged or released meanwhile
        return None
    yield from _record(effect, effect.key, record.result)
    return replayed(call, record.result, done[0], reconciled=True, note=EARLIER_RUN)


def _reconcile_own(
    call: ToolCall, effect: Effect, record: IdempotencyRecord
) -> Flow[ToolMessage | None]:
    """This call's own intent has no outcome (a crash, a lost answer): wait out an
    attempt still in flight (here, or in another process within the tool's timeout),
    then ask the service. Done: answered with its result. Not done: run it once more,
    if attempts are left (None), else it is exhausted."""
    settled: Settled = yield Call(settle, asettle, (effect.key, effect.grace))
    if settled == "running":
        raise OutcomeUnknownError(effect.key, reason=_STILL_RUNNING)
    if settled == "none" and (wait := _young(record, effect.grace)) > 0:
        yield Sleep(wait)  # another process's attempt may still land: let it
        settled = "ended"
    if settled == "ended":  # its late outcome may be recorded by now
        claim: Claim = yield from ledger_op(effect, "claim", _claim(call, effect))
        if claim_action(claim, can_check_status=True) == "replay":
            return replayed(call, claim.record.result, effect.key)
    status: EffectStatus = yield from _status(effect, effect.key)
    if status.done:
        yield from _settled(call, effect, (effect.key,), status.result)
        return replayed(call, status.result, effect.key, reconciled=True)
    if not effect.may_execute and not effect.approved:
        yield from _release(effect, effect.key)
        raise EffectNotDone(effect.key)
    return None


def _reconcile_earlier(
    call: ToolCall, effect: Effect, known: Sequence[IdempotencyRecord] | None = None
) -> Flow[ToolMessage | str]:
    """Before a newly claimed effect runs: the same effect asked for by an earlier call
    whose outcome is unknown (pending in the ledger, or told to the agent as unknown in
    this task and recorded since). Returns this call's answer when the earlier effect
    is known done, else the key to run it under.

    An unknown earlier effect is resolved, in order (DESIGN.md section 5): by its
    ``status_check`` (done: answered from it; not done: released); by a declaration
    that a repeat is safe (``idempotent``: released; ``by_key``: sent again under the
    earlier key, which the service deduplicates) or a human's approval; by the agent,
    once it has looked (an informed re-issue is sent under the earlier key). A blind
    re-issue with none of these is not run. `known`: the pending intents the claim
    already returned (None: asked here)."""
    store = effect.ledger.idempotency
    for key in sorted(effect.told_now - {effect.key}):  # told "unknown", known by now?
        told: IdempotencyRecord | None = yield from ledger_op(
            effect, "siblings", Call(store.get, store.aget, (key,))
        )
        if told is not None and told.status == "done" and told.fingerprint == effect.fingerprint:
            yield from _record(effect, effect.key, told.result)
            return replayed(call, told.result, key, reconciled=True)
    found: Sequence[IdempotencyRecord]
    if known is not None:
        found = known
    else:
        unresolved = Call(
            store.unresolved, store.aunresolved, (effect.thread_id, effect.fingerprint)
        )
        found = yield from ledger_op(effect, "siblings", unresolved)
    for sibling in _siblings(found, effect):
        checkable = effect.profile.status_check is not None
        if effect.approved or effect.profile.safe_repeat == "idempotent":
            yield from _release(effect, sibling.key)  # a repeat is a no-op, or vouched for
            continue
        resend = effect.profile.safe_repeat == "by_key" or (not checkable and effect.looked())
        if not (checkable or resend):
            yield from _release(effect, effect.key)  # this call did not run
            raise OutcomeUnknownError(sibling.key, earlier_call=True)
        try:
            yield from _await_earlier(effect, sibling)
            if resend:
                return sibling.key
            status: EffectStatus = yield from _status(effect, sibling.key)
        except OutcomeUnknownError as exc:
            yield from _release(effect, effect.key)
            reason = str(exc.context.get("reason", ""))
            raise OutcomeUnknownError(sibling.key, earlier_call=True, reason=reason) from exc
        if status.done:
            yield from _settled(call, effect, (sibling.key, effect.key), status.result)
            return replayed(call, status.result, sibling.key, reconciled=True)
        yield from _release(effect, sibling.key)
    return effect.key


def _await_earlier(effect: Effect, sibling: IdempotencyRecord) -> Flow[None]:
    """Before asking about, or repeating, an earlier attempt: let one that may still be
    on the wire land (here: until it ends; elsewhere: its tool's timeout)."""
    settled: Settled = yield Call(settle, asettle, (sibling.key, effect.grace))
    if settled == "running":
        raise OutcomeUnknownError(sibling.key, reason=_STILL_RUNNING)
    if settled == "none" and (wait := _young(sibling, effect.grace)) > 0:
        yield Sleep(wait)


def _young(record: IdempotencyRecord, grace: float) -> float:
    """How much longer a pending intent no attempt of this process holds may still be
    another process's attempt on the wire: its tool's timeout less its age on the
    store's clock (0 when the store does not say, or the tool has no timeout)."""
    if record.age_s is None or grace <= 0:
        return 0.0
    return max(0.0, grace - record.age_s)


# ------------------------------------------------------------------ the ledger's I/O

_AFTER = frozenset({"record", "release", "saga"})
"""Ledger writes that follow what happened (or did not): if the ledger stays down they
are given up, never reported as the tool's failure. The intent then stays pending, so
the effect is reconciled later, never re-run blindly."""


def ledger_op(effect: Effect, op: str, action: Call) -> Flow[Any]:
    """One ledger operation, retried with backoff as a database error; when it keeps
    failing: before the effect the run stops loudly (`LedgerUnavailableError`, nothing
    ran), after it the call keeps its answer and the intent stays pending."""
    attempt = 0
    while True:
        attempt += 1
        try:
            return (yield action)
        except (ThreadLockLostError, ConfigurationError):
            raise  # a stale lease's write refused, or our setup missing: never retried
        except Exception as exc:
            delay = None if _refused_data(exc) else ledger_retry_delay(attempt)
            if delay is None:
                if op not in _AFTER:
                    raise LedgerUnavailableError(op, exc) from exc
                _gave_up(op, effect, exc)
                return None
            emit(Event("ledger_retry", operation=op, attempt=attempt, error=type(exc).__name__))
            yield Sleep(delay)


def _refused_data(exc: BaseException) -> bool:
    """The database refused the data itself (a value it cannot store): asking again
    would get the same answer, so it is no outage to wait out."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    return bool(names & {"DataError", "UnicodeError"})


def _gave_up(op: str, effect: Effect, exc: BaseException) -> None:
    logger.warning(
        "ledger %s failed for %s (%s): the intent stays pending and is reconciled later",
        op,
        effect.key,
        type(exc).__name__,
    )
    emit(Event("ledger_unavailable", operation=op, key=effect.key, error=type(exc).__name__))


def _claim(call: ToolCall, effect: Effect) -> Call:
    store = effect.ledger.idempotency
    kwargs = {
        "tool": call["name"],
        "args_json": effect.args_json,
        "thread_id": effect.thread_id,
        "fingerprint": effect.fingerprint,
    }
    return Call(store.claim, store.aclaim, (effect.key,), kwargs)


def _record(effect: Effect, key: str, result: Any) -> Flow[Any]:
    store = effect.ledger.idempotency
    return ledger_op(
        effect, "record", Call(store.record_outcome, store.arecord_outcome, (key, result))
    )


def _record_behind(effect: Effect, result: Any) -> Flow[Any]:
    """The outcome of the effect that just ran, without waiting for its write when the
    ledger can defer it (`SqlIdempotencyStore.defer_outcome`): a crash before it is
    written leaves the intent pending, which a resume reconciles (`_reconcile_own`);
    this process's own reads wait for it."""
    store = effect.ledger.idempotency
    defer = getattr(store, "defer_outcome", None)
    if defer is None:
        return (yield from _record(effect, effect.key, result))
    kwargs = {"thread_id": effect.thread_id, "fingerprint": effect.fingerprint}
    action = Call(defer, store.adefer_outcome, (effect.key, result), kwargs)  # type: ignore[attr-defined]
    return (yield from ledger_op(effect, "record", action))


def _release(effect: Effect, key: str) -> Flow[Any]:
    store = effect.ledger.idempotency
    return ledger_op(effect, "release", Call(store.release, store.arelease, (key,)))


def _siblings(found: Sequence[IdempotencyRecord], effect: Effect) -> list[IdempotencyRecord]:
    """Unresolved intents of the same effect asked for by other calls (not this key), but
    for those asked apart from this one."""
    return [r for r in found if r.key != effect.key and not _asked_apart(r.key, effect)]


def _asked_apart(key: str, effect: Effect) -> bool:
    """Whether the same effect under `key` was asked for apart from this call, so this
    one repeats nothing: by the user anew since the agent was told of it in an earlier
    task, or by another call of this call's own assistant message."""
    return key in effect.told_before or key in effect.same_message()


# ------------------------------------------------------------------ status checks


def _status(effect: Effect, key: str) -> Flow[EffectStatus]:
    """Ask the profile's ``status_check`` about `key`. A check is a read: a failure is
    retried as a read's would be, within the call's attempts (`Effect.check_wait`);
    one that stays leaves the outcome unknown (never a "not done")."""
    attempts = 0
    while True:
        attempts += 1
        try:
            status: EffectStatus = yield Call(_ask, _aask, (effect, key))
        except _CheckFailed as failed:
            error = failed.__cause__ or failed
            wait = effect.check_wait(error, attempts)
            if wait is None:
                raise OutcomeUnknownError(key, reason=f"status_check failed: {error}") from error
            emit(Event("status_check_retry", key=key, attempt=attempts, delay=round(wait, 6)))
            yield Sleep(wait)
            continue
        return status


class _CheckFailed(Exception):
    """A ``status_check`` raised (its cause): the flow decides whether to ask again."""


def _ask(effect: Effect, key: str) -> EffectStatus:
    answer = _check(effect, key)
    if inspect.isawaitable(answer):
        if inspect.iscoroutine(answer):
            answer.close()
        raise ConfigurationError(
            f"the status_check of {effect.profile!r} is async: run the graph with "
            "ainvoke/astream, or give the tool a sync status_check"
        )
    return _effect_status(answer)


async def _aask(effect: Effect, key: str) -> EffectStatus:
    check = effect.profile.status_check
    try:
        if isinstance(check, StatusCheck):
            return await check.acheck(key, dict(effect.args))
        answer = _check(effect, key)
        if inspect.isawaitable(answer):
            answer = await answer
    except (GraphBubbleUp, _CheckFailed):
        raise
    except Exception as exc:
        raise _CheckFailed() from exc
    return _effect_status(answer)


def _check(effect: Effect, key: str) -> Any:
    check = effect.profile.status_check
    if check is None:  # the flow asks only when there is one
        raise RuntimeError("status_check asked for a tool that has none")
    try:
        return check(key, dict(effect.args)) if _takes_args(check) else check(key)
    except GraphBubbleUp:
        raise
    except Exception as exc:
        raise _CheckFailed() from exc


def _takes_args(check: Callable[..., Any]) -> bool:
    """Whether a status_check accepts the call's arguments as a second argument."""
    try:
        parameters = inspect.signature(check).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in parameters)


def _effect_status(value: Any) -> EffectStatus:
    """Accept an `EffectStatus`, a bool, None (not done) or the result itself (done)."""
    if isinstance(value, EffectStatus):
        return value
    if value is None or value is False:
        return EffectStatus(done=False)
    if value is True:
        return EffectStatus(done=True)
    return EffectStatus(done=True, result=value)


# ------------------------------------------------------------------ answers


def storable(value: Any) -> Any:
    """What the ledger keeps of a result: a JSON value (else its text) without the
    characters no database stores, NUL and lone surrogates, each replaced by U+FFFD
    and said so in the log. A result is an effect's outcome, never an outage: a value
    the database refuses would leave the intent pending though the effect is done."""
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        value = str(value)
    cleaned = _cleaned(value)
    if cleaned is not value:
        logger.warning("a side effect's result held NUL or lone surrogates: stored replaced")
        emit(Event("outcome_sanitized"))
    return cleaned


_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")
"""NUL (PostgreSQL text and jsonb refuse it) and lone surrogates (not UTF-8)."""


def _cleaned(value: Any) -> Any:
    """`value` with unstorable characters replaced; the same object when it has none."""
    if isinstance(value, str):
        return _UNSTORABLE.sub("\ufffd", value) if _UNSTORABLE.search(value) else value
    if isinstance(value, dict):
        pairs = [(_cleaned(k), _cleaned(v)) for k, v in value.items()]
        changed = any(
            k2 is not k or v2 is not v
            for (k, v), (k2, v2) in zip(value.items(), pairs, strict=True)
        )
        return dict(pairs) if changed else value
    if isinstance(value, list):
        items = [_cleaned(item) for item in value]
        return items if any(a is not b for a, b in zip(value, items, strict=True)) else value
    return value


def outcome_of(answer: Answer) -> Any:
    """What the ledger records of an answer: its content (JSON), or None for a Command."""
    return storable(answer.content) if isinstance(answer, ToolMessage) else None


def replayed(
    call: ToolCall, result: Any, key: str, *, reconciled: bool = False, note: str = ""
) -> ToolMessage:
    """The answer for an effect that already happened: its recorded result, not a
    re-run (with `note`, what the agent should know of how it happened). Its event
    says which: ``effect_replayed`` (from the ledger) or ``effect_reconciled`` (the
    service was asked, or the ledger held another call's outcome of the same effect)."""
    content = result if isinstance(result, str) else json.dumps(result, default=str)
    if note:
        content = f"{content}\n\n{note}"
    how = "reconciled" if reconciled else "replayed"
    emit(
        Event(
            f"effect_{how}",
            tool=call["name"],
            call_id=call["id"] or "",
            key=key,
            earlier_run=note == EARLIER_RUN,
        )
    )
    return ToolMessage(
        content=content,
        name=call["name"],
        tool_call_id=call["id"] or "",
        response_metadata={"resilience": {how: True, "idempotency_key": key}},
    )
