"""Guarded tool execution: LangGraph's `ToolNode`, with every failure classified.

`GuardedToolNode` composes a real `ToolNode` (so tool-argument injection,
`InjectedState`, `ToolRuntime`, `Command` returns and parallel calls behave
exactly as in LangGraph) and intercepts each call through ToolNode's public
``wrap_tool_call`` hook. Per super-step it runs only the calls of the latest
`AIMessage` that are new or whose retry is due, so a succeeding sibling never
runs twice. Each failure is classified into a `ToolError`; `decide()` picks
retry (the call waits in the ledger, no message yet) or hand-back (an error
`ToolMessage` whose content is the envelope JSON).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import inspect
import itertools
import json
import random
from collections import Counter
from collections.abc import Awaitable, Callable, Generator, Iterator, Mapping, Sequence
from typing import Any, Literal, cast

from langchain_core.messages import AIMessage, AnyMessage, ToolCall, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.errors import GraphBubbleUp, is_invalid_resume
from langgraph.prebuilt import ToolNode
from langgraph.prebuilt.tool_node import ToolCallRequest, ToolInvocationError
from langgraph.types import Command

from langgraph_resilience.core.backoff import ledger_retry_delay
from langgraph_resilience.core.canonical import call_key, canonical_args
from langgraph_resilience.core.classify import DEFAULT_RULES, Rule, classify, unknown_tool_error
from langgraph_resilience.core.clock import Clock
from langgraph_resilience.core.decide import (
    Decision,
    decide,
    decide_repair,
    remembered_gone,
    unrecovered,
)
from langgraph_resilience.core.loops import LoopKind, detect_loop
from langgraph_resilience.core.policy import ResiliencePolicy
from langgraph_resilience.core.profile import ToolProfile
from langgraph_resilience.core.redaction import mask_args, redact
from langgraph_resilience.core.validation import (
    Coercion,
    check_output,
    coerce_args,
    parsed_content,
)
from langgraph_resilience.errors import (
    CircuitOpenError,
    ConfigurationError,
    ExhaustionReason,
    FailureClass,
    LedgerUnavailableError,
    OutputValidationError,
    ThreadLockLostError,
    ToolError,
    ToolFailure,
    ToolGoneError,
)
from langgraph_resilience.events import Event, emit, logger
from langgraph_resilience.graph.in_flight import (
    Settled,
    arun_with_timeout,
    asettle,
    run_with_timeout,
    settle,
)
from langgraph_resilience.graph.state import (
    PLAN_CALL_PREFIX,
    CallRecord,
    Ledger,
    TaskLedger,
    call_slot,
    current_calls,
    current_task,
    last_ai_message,
    read_ledger,
    read_messages,
    task_view,
)
from langgraph_resilience.stores.breakers import (
    BreakerConfig,
    BreakerStore,
    Bulkhead,
    BulkheadFullError,
    InMemoryBreakerStore,
    InMemoryRetryBudgetStore,
    PostgresRetryBudgetStore,
    RetryBudget,
)
from langgraph_resilience.stores.effect_ledger import EffectLedger, LedgerResolver
from langgraph_resilience.stores.fencing import acheck_fence, check_fence
from langgraph_resilience.stores.ledger import (
    Claim,
    CompensationReport,
    EffectStatus,
    IdempotencyRecord,
    IdempotencyStore,
    PartialResult,
    SagaLog,
    acompensate_thread,
    as_partial_result,
    claim_action,
    compensate_thread,
    effect_fingerprint,
    failed_items,
    idempotency_key,
    item_idempotency_key,
)

__all__ = [
    "GuardedToolNode",
    "OutcomeUnknownError",
    "current_idempotency_key",
    "current_item_keys",
    "error_message",
    "tool_error_of",
]

_DUE_TOLERANCE = 1e-3
"""Seconds of clock skew within which a scheduled retry counts as due."""


@dataclasses.dataclass(frozen=True, slots=True)
class _BreakerReport:
    """A failed attempt's outcome for its breaker, reported once the call settles."""

    key: str
    outcome: FailureClass
    duration: float


@dataclasses.dataclass(frozen=True, slots=True)
class _Raised:
    """Carries a tool's exception out of ToolNode's wrapper to the node, never further."""

    error: BaseException
    executed: bool = True
    """False when the call was refused before reaching the tool (open breaker, full
    bulkhead): it spends no attempt."""
    unreported: _BreakerReport | None = None
    """The failure the breaker has not heard of yet: a breaker counts logical calls, so
    an attempt that is retried on the same tool is not reported."""
    effect_key: str | None = None
    """A side effect's idempotency key, to remember once the agent is told its
    outcome is unknown."""


_CURRENT_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "langgraph_resilience_idempotency_key", default=None
)


def current_idempotency_key() -> str | None:
    """The idempotency key of the side-effecting call running now, read inside the tool
    (like LangGraph's ``get_config()``) so it can pass it on, e.g. as an
    ``Idempotency-Key`` header. None outside a side-effecting call.

    The key is not an argument: LangGraph's ToolNode strips caller-supplied values of
    injected arguments, and the model must never see or forge it.
    """
    return _CURRENT_KEY.get()


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


class _NotDoneError(ToolFailure):
    """The service says the effect did not happen, and the call has no attempt left."""

    def __init__(self, key: str) -> None:
        super().__init__(
            FailureClass.TRANSIENT,
            "the service reports this side effect did not happen, and no attempt is left "
            "to run it again",
            context={"idempotency_key": key, "reconciled": "not_done"},
        )


@dataclasses.dataclass(frozen=True, slots=True)
class _Effect:
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
    """Keys of unknown effects told to the agent in an earlier task (`_InStep`)."""
    grace: float = 0.0
    """How long an abandoned attempt may still be running (the tool's timeout)."""


def _effect_status(value: Any) -> EffectStatus:
    """Accept an `EffectStatus`, a bool, None (not done) or the result itself (done)."""
    if isinstance(value, EffectStatus):
        return value
    if value is None or value is False:
        return EffectStatus(done=False)
    if value is True:
        return EffectStatus(done=True)
    return EffectStatus(done=True, result=value)


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return str(value)
    return value


def _outcome_of(result: ToolMessage | Command[Any]) -> Any:
    return _jsonable(result.content) if isinstance(result, ToolMessage) else None


def _replayed(call: ToolCall, result: Any, key: str, *, reconciled: bool = False) -> ToolMessage:
    """The answer for an effect that already happened: its recorded result, not a re-run."""
    content = result if isinstance(result, str) else json.dumps(result, default=str)
    how = "reconciled" if reconciled else "replayed"
    return ToolMessage(
        content=content,
        name=call["name"],
        tool_call_id=call["id"] or "",
        response_metadata={"resilience": {how: True, "idempotency_key": key}},
    )


_EffectOp = tuple[
    Literal["fence", "claim", "siblings", "settle", "status", "record", "release", "run", "saga"],
    Any,
]
"""One I/O step of `GuardedToolNode._effect_flow` and its argument (a key, or for
``record`` a ``(key, result)`` pair)."""


def _ask_status(effect: _Effect, key: str) -> Any:
    """Call the profile's ``status_check`` with ``(key, args)`` or ``(key)``, whichever
    it takes. An exception is the outcome staying unknown, never a "not done"."""
    check = effect.profile.status_check
    if check is None:  # the flow asks only when there is one
        raise RuntimeError("status_check asked for a tool that has none")
    try:
        return check(key, dict(effect.args)) if _takes_args(check) else check(key)
    except GraphBubbleUp:
        raise
    except Exception as exc:
        raise OutcomeUnknownError(key, reason=f"status_check failed: {exc}") from exc


async def _awaited_status(effect: _Effect, key: str, pending: Any) -> Any:
    """An async status_check's answer; its exception leaves the outcome unknown."""
    try:
        return await pending
    except GraphBubbleUp:
        raise
    except Exception as exc:
        raise OutcomeUnknownError(key, reason=f"status_check failed: {exc}") from exc


def _takes_args(check: Callable[..., Any]) -> bool:
    """Whether a status_check accepts the call's arguments as a second argument."""
    try:
        parameters = inspect.signature(check).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in parameters)


_STILL_RUNNING = (
    "an earlier attempt that timed out is still running, so whether it takes effect is "
    "not known yet; it was not run again"
)


def _late_outcome(effect: _Effect) -> Callable[[Any], Any]:
    """Record an abandoned attempt's result when it lands after all."""
    store, key = effect.ledger.idempotency, effect.key
    return lambda result: store.record_outcome(key, _outcome_of(result))


def _alate_outcome(effect: _Effect) -> Callable[[Any], Awaitable[Any]]:
    """Async `_late_outcome`."""
    store, key = effect.ledger.idempotency, effect.key
    return lambda result: store.arecord_outcome(key, _outcome_of(result))


_NOT_THE_TOOLS = (ConfigurationError, LedgerUnavailableError, ThreadLockLostError)
"""Our own misconfiguration, ledger or lock: never the tool's failure, always raised."""

_NOT_EXECUTED = (BulkheadFullError, OutcomeUnknownError, _NotDoneError)
"""Refusals raised before the tool ran: they spend no attempt."""


_LEDGER_OPS = frozenset({"claim", "siblings", "record", "release", "saga"})
_AFTER_OPS = frozenset({"record", "release", "saga"})
"""Ledger writes that follow what happened (or did not): if the ledger stays down they
are given up, never reported as the tool's failure. The intent then stays pending, so
the effect is reconciled later, never re-run blindly."""


def _ledger_call(
    op: str, value: Any, effect: _Effect, call: ToolCall
) -> tuple[Any, str, tuple[Any, ...], dict[str, Any]]:
    """The store (or saga log), method and arguments of a ledger operation of the flow."""
    store, saga = effect.ledger.idempotency, effect.ledger.saga
    if op == "claim":
        kwargs = {
            "tool": call["name"],
            "args_json": effect.args_json,
            "thread_id": effect.thread_id,
            "fingerprint": effect.fingerprint,
        }
        return store, "claim", (effect.key,), kwargs
    if op == "siblings":
        return store, "unresolved", (effect.thread_id, effect.fingerprint), {}
    if op == "record":
        return store, "record_outcome", tuple(value), {}
    if op == "release":
        return store, "release", (value,), {}
    kwargs = {"key": effect.key, "tool": call["name"], "action": "effect", "status": "done"}
    return saga, "append", (effect.thread_id,), kwargs


def _ledger_retrying(op: str, attempt: int, exc: BaseException) -> None:
    emit(Event("ledger_retry", operation=op, attempt=attempt, error=type(exc).__name__))


def _ledger_gave_up(op: str, effect: _Effect, exc: BaseException) -> None:
    """The ledger stayed down: before the effect, the run stops loudly (nothing ran);
    after it, the call keeps its answer and the intent stays pending."""
    if op not in _AFTER_OPS:
        raise LedgerUnavailableError(op, exc) from exc
    logger.warning(
        "ledger %s failed for %s (%s): the intent stays pending and is reconciled later",
        op,
        effect.key,
        type(exc).__name__,
    )
    emit(Event("ledger_unavailable", operation=op, key=effect.key, error=type(exc).__name__))


def _siblings(found: Sequence[IdempotencyRecord], effect: _Effect) -> list[IdempotencyRecord]:
    """Unresolved intents of the same effect asked for by other calls (not this key), but
    for those the agent was told of in an earlier task: the user asked anew since."""
    return [r for r in found if r.key != effect.key and r.key not in effect.told_before]


def _note_item_keys(result: Any, item_keys: tuple[str, ...] | None) -> None:
    """Hand a batch call's item keys to `_finish` (which pops them) for a redo."""
    if item_keys is not None and isinstance(result, ToolMessage):
        result.response_metadata["resilience_item_keys"] = list(item_keys)


def _answer_unusable(
    call: ToolCall, key: str, status: EffectStatus, broken: OutputValidationError
) -> ToolMessage:
    """A side effect that ran answered unusably; its service said whether it happened.
    Done: its recorded result answers the call. Not done: the contract failure stands
    (SEMANTIC: fixing the call cannot do the effect twice)."""
    if not status.done:
        raise broken
    return _replayed(call, status.result, key, reconciled=True)


@dataclasses.dataclass(frozen=True, slots=True)
class _Admitted:
    """A call the breaker let through: what to report back once it is done."""

    key: str
    probe: bool
    started: float


def error_message(error: ToolError, *, exhausted: ExhaustionReason | None = None) -> ToolMessage:
    """The `ToolMessage` the model sees for a failure: content is the envelope JSON."""
    if exhausted is not None:
        error = error.model_copy(update={"context": {**error.context, "exhausted": exhausted}})
    return ToolMessage(
        content=error.model_dump_json(exclude_none=True),
        name=error.tool,
        tool_call_id=error.call_id or "",
        status="error",
        artifact={"tool_error": error.model_dump(mode="json")},
    )


def tool_error_of(message: ToolMessage) -> ToolError | None:
    """The `ToolError` behind an error `ToolMessage` produced by this package, or None."""
    artifact = message.artifact
    if message.status == "error" and isinstance(artifact, dict) and "tool_error" in artifact:
        return ToolError.model_validate(artifact["tool_error"])
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class _InStep:
    """What the calls of one tools step share while they run."""

    gone: set[str]
    """Tools that answered STRUCTURAL during this step: its calls that have not
    started yet skip them (the ledger remembers them for later steps)."""
    item_keys: Mapping[str, list[str]]
    """Per call id: the item keys a redone batch keeps from its first run."""
    slots: Mapping[str, str]
    """Per call id: the call's slot (its identity in the thread, for idempotency keys)."""
    spent: frozenset[str] = frozenset()
    """Call ids whose attempts are spent: a reconcile may only ask status_check."""
    approved: frozenset[str] = frozenset()
    """Call ids a human told to run again despite an unknown earlier outcome."""
    ledger: EffectLedger | None = None
    """The side-effect ledger of this run (None: no tool has side effects)."""
    told_before: frozenset[str] = frozenset()
    """Idempotency keys of unknown effects the agent was told of in an earlier task: a
    new human request for the same effect is informed, not a blind re-issue."""


_STEP: contextvars.ContextVar[_InStep | None] = contextvars.ContextVar(
    "langgraph_resilience_step", default=None
)

_CURRENT_ITEM_KEYS: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar(
    "langgraph_resilience_item_keys", default=None
)


def current_item_keys() -> tuple[str, ...] | None:
    """Inside a side-effecting batch tool (`ToolProfile(batch_arg=...)`): one
    idempotency key per item of the batch argument, in order, to send to the service
    per item. A redo of failed items gets the keys those items had on the first run,
    so an item that did go through is deduplicated. None elsewhere."""
    return _CURRENT_ITEM_KEYS.get()


@dataclasses.dataclass(slots=True)
class _Preflight:
    """A call answered without running: unknown tool, loop, spent budget, bad JSON."""

    error: ToolError
    exhausted: ExhaustionReason | None = None
    key: str = ""
    repairable: bool = False
    """Arguments that are not JSON: reflection repair may still produce a valid call."""
    slot: str = ""
    """The call's slot in the ledger."""


@dataclasses.dataclass(slots=True)
class _Batch:
    """One super-step of the tools node: what runs (with the arguments in force), what
    is answered without running, and the loop-guard bookkeeping."""

    ai_index: int
    ai: AIMessage
    now: float
    task: TaskLedger
    """The current task's view of the ledger (a fresh one when this turn starts it)."""
    runnable: list[ToolCall] = dataclasses.field(default_factory=list)
    preflight: list[_Preflight] = dataclasses.field(default_factory=list)
    keys: dict[str, str] = dataclasses.field(default_factory=dict)
    slots: dict[str, str] = dataclasses.field(default_factory=dict)
    """Call id -> slot, for the calls that run."""
    loop_keys: dict[str, str] = dataclasses.field(default_factory=dict)
    """Call id -> the key the loop guard counted, for calls the agent issued now."""
    rerouted: dict[str, tuple[str, dict[str, Any]]] = dataclasses.field(default_factory=dict)
    """Calls sent straight to a fallback: call id -> (the remembered-gone tool, its args)."""
    item_keys: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    """Redone batch calls: the item keys of their first run."""
    spent: set[str] = dataclasses.field(default_factory=set)
    approved: set[str] = dataclasses.field(default_factory=set)
    informed: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """The ledger's unknown effects the agent was told of, by key -> task."""
    seen: dict[str, int] = dataclasses.field(default_factory=dict)
    recent: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(slots=True)
class _Step:
    """What one tools step accumulates while settling its calls."""

    ledger: Ledger
    task: TaskLedger
    task_attempts: int
    elapsed: float
    calls: dict[str, CallRecord] = dataclasses.field(default_factory=dict)
    messages: list[AnyMessage] = dataclasses.field(default_factory=list)
    events: dict[str, int] = dataclasses.field(default_factory=dict)
    gone: dict[str, float] = dataclasses.field(default_factory=dict)
    seen: dict[str, int] = dataclasses.field(default_factory=dict)
    """Loop-guard corrections: a failure handed back leaves `seen` for `failed`."""
    failed: dict[str, int] = dataclasses.field(default_factory=dict)
    unreported: dict[str, _BreakerReport] = dataclasses.field(default_factory=dict)
    """Per call id: this step's failed attempt, not yet told to its breaker."""
    reports: list[_BreakerReport] = dataclasses.field(default_factory=list)
    """Failures of calls that left their tool in this step: one per logical call."""
    informed: dict[str, str] = dataclasses.field(default_factory=dict)
    """Effects of unknown outcome the agent was told of in this step, by key -> task."""

    def count(self, kind: str) -> None:
        self.events[kind] = self.events.get(kind, 0) + 1


class GuardedToolNode:
    """Executes the latest `AIMessage`'s tool calls with classification and budgets.

    Use it through `add_resilience`, which also wires the router, the retry
    node and (with a ``repair_model``) the repair node; the node alone only
    classifies, records and answers, it never waits.
    """

    def __init__(
        self,
        tools: Sequence[BaseTool | Callable[..., Any]],
        *,
        policy: ResiliencePolicy,
        clock: Clock,
        profiles: Mapping[str, ToolProfile] | None = None,
        rules: Sequence[Rule] = DEFAULT_RULES,
        rng: random.Random | None = None,
        messages_key: str = "messages",
        can_repair: bool = False,
        can_replan: bool = False,
        can_escalate: bool = False,
        breaker: BreakerConfig | None = None,
        breaker_store: BreakerStore | None = None,
        retry_budget: RetryBudget | None = None,
        retry_budget_store: InMemoryRetryBudgetStore | PostgresRetryBudgetStore | None = None,
        idempotency: IdempotencyStore | None = None,
        saga: SagaLog | None = None,
    ) -> None:
        self.policy = policy
        self.clock = clock
        self.profiles = dict(profiles or {})
        self.rules = tuple(rules)
        self.rng = rng or random.Random()
        self.messages_key = messages_key
        self.can_repair = can_repair
        self.can_replan = can_replan
        self.can_escalate = can_escalate
        self.breaker = breaker
        self._counted = breaker.counted_classes if breaker is not None else frozenset()
        # `is None`, not `or`: a store may define __len__, and an empty one is falsy
        self.breaker_store: BreakerStore = (
            InMemoryBreakerStore() if breaker_store is None else breaker_store
        )
        self.retry_budget = retry_budget
        self.retry_budget_store = retry_budget_store
        if retry_budget_store is None and retry_budget is not None:
            self.retry_budget_store = InMemoryRetryBudgetStore()
        effects = any(p.side_effect for p in self.profiles.values())
        self.idempotency = idempotency
        """The ledger passed to add_resilience, if any (else: see `effect_ledger`)."""
        self.saga = saga
        self._ledgers = LedgerResolver(idempotency=idempotency, saga=saga, needed=effects)
        self._bulkheads = {
            name: Bulkhead(name, max_concurrent=p.max_concurrent, max_wait=p.max_wait)
            for name, p in self.profiles.items()
            if p.max_concurrent is not None
        }
        self._tool_node = ToolNode(
            list(tools),
            handle_tool_errors=False,
            messages_key=messages_key,
            wrap_tool_call=self._wrap,
            awrap_tool_call=self._awrap,
        )

        self._schemas = {name: t.tool_call_schema for name, t in self.tools_by_name.items()}
        for name, profile in self.profiles.items():
            tool = self.tools_by_name.get(name)
            if (
                profile.batch_arg is not None
                and tool is not None
                and profile.batch_arg not in tool.args
            ):
                raise ConfigurationError(
                    f"ToolProfile.batch_arg {profile.batch_arg!r} is not an argument of "
                    f"{name!r}; its arguments: {sorted(tool.args)}"
                )

    @property
    def tools_by_name(self) -> dict[str, BaseTool]:
        """The tools this node executes, by name."""
        return self._tool_node.tools_by_name

    # ------------------------------------------------------------ interception

    def _timeout_for(self, tool: str) -> float | None:
        profile = self.profiles.get(tool)
        if profile is not None and profile.timeout_s is not None:
            return profile.timeout_s
        return self.policy.tool_timeout_s

    def _checked(self, call: ToolCall, result: Any) -> ToolMessage | Command[Any]:
        """Apply the tool's output contract to a result that looks successful."""
        if isinstance(result, ToolMessage) and result.status != "error":
            profile = self.profiles.get(call["name"])
            if profile is not None and profile.batch_arg and as_partial_result(result.content):
                return result  # a partial batch is judged item by item, not by the contract
            check_output(result.content, profile)
        return cast("ToolMessage | Command[Any]", result)

    def breaker_key(self, tool: str) -> str:
        """The breaker a tool reports to: its profile's `breaker_key`, else its name."""
        profile = self.profiles.get(tool)
        return profile.breaker_key if profile is not None and profile.breaker_key else tool

    def breaker_states(self) -> dict[str, str]:
        """Each tool's breaker status now (closed / open / half_open), for the planner."""
        if self.breaker is None:
            return {}
        now = self.clock.time()
        return {
            name: self.breaker_store.snapshot(self.breaker_key(name)).status_at(self.breaker, now)
            for name in self.tools_by_name
        }

    def _coerced(self, call: ToolCall) -> Coercion | None:
        """Lossless fixes for arguments the tool rejected, or None if there are none.
        Only runs after a rejection, so clean calls pay nothing for it."""
        tool = self.tools_by_name.get(call["name"])
        if tool is None:
            return None
        fixed = coerce_args(call["args"], self._schemas.get(call["name"]))
        if not fixed.changes:
            return None
        emit(Event("coercion", tool=call["name"], call_id=call["id"], changes=fixed.changes))
        return fixed

    def _refused(self, call: ToolCall, key: str, retry_after: float) -> ToolMessage:
        return self._raised(call, CircuitOpenError(key, retry_after), executed=False)

    def _run(
        self,
        call: ToolCall,
        request: ToolCallRequest,
        execute: Callable[[ToolCallRequest], Any],
        effect: _Effect | None = None,
    ) -> ToolMessage | Command[Any]:
        timeout = self._timeout_for(call["name"])
        bulkhead = self._bulkheads.get(call["name"])
        with bulkhead.slot() if bulkhead is not None else contextlib.nullcontext():
            try:
                if timeout is None:
                    return cast("ToolMessage | Command[Any]", execute(request))
                result = run_with_timeout(
                    execute,
                    request,
                    timeout,
                    key=effect.key if effect else None,
                    on_late=_late_outcome(effect) if effect else None,
                )
                return cast("ToolMessage | Command[Any]", result)
            except ToolInvocationError:
                fixed = self._coerced(call)
                if fixed is None:
                    raise
                result = execute(request.override(tool_call={**call, "args": fixed.args}))
                return _with_coercions(result, fixed)

    async def _arun(
        self,
        call: ToolCall,
        request: ToolCallRequest,
        execute: Callable[[ToolCallRequest], Any],
        effect: _Effect | None = None,
    ) -> ToolMessage | Command[Any]:
        timeout = self._timeout_for(call["name"])
        bulkhead = self._bulkheads.get(call["name"])
        async with bulkhead.aslot() if bulkhead is not None else contextlib.nullcontext():
            try:
                if timeout is None:
                    return cast("ToolMessage | Command[Any]", await execute(request))
                result = await arun_with_timeout(
                    execute,
                    request,
                    timeout,
                    key=effect.key if effect else None,
                    on_late=_alate_outcome(effect) if effect else None,
                )
                return cast("ToolMessage | Command[Any]", result)
            except ToolInvocationError:
                fixed = self._coerced(call)
                if fixed is None:
                    raise
                result = await execute(request.override(tool_call={**call, "args": fixed.args}))
                return _with_coercions(result, fixed)

    # ------------------------------------------------------- exactly once

    def _effect(self, call: ToolCall, request: ToolCallRequest) -> _Effect | None:
        """The idempotency key and claim arguments of a side-effecting call, or None.

        The key is bound to the call's slot (its assistant message and position), not to
        the provider's id, which providers reuse."""
        profile = self.profiles.get(call["name"])
        in_step = _STEP.get()
        if profile is None or not profile.side_effect or in_step is None or in_step.ledger is None:
            return None
        runtime = getattr(request, "runtime", None)
        config = getattr(runtime, "config", None) or {}
        thread_id = str((config.get("configurable") or {}).get("thread_id", ""))
        call_id = call["id"] or ""
        slot = in_step.slots.get(call_id, call_id)
        args = call["args"]
        noise = self.policy.noise_fields
        key = idempotency_key(
            call["name"], args, thread_id=thread_id, call_identity=slot, noise_fields=noise
        )
        return _Effect(
            in_step.ledger,
            key,
            thread_id,
            canonical_args(args),
            profile,
            dict(args),
            effect_fingerprint(call["name"], args, thread_id=thread_id, noise_fields=noise),
            may_execute=call_id not in in_step.spent,
            approved=call_id in in_step.approved,
            told_before=in_step.told_before,
            grace=self._timeout_for(call["name"]) or 0.0,
        )

    def _effect_flow(
        self, call: ToolCall, effect: _Effect
    ) -> Generator[_EffectOp, Any, ToolMessage | Command[Any]]:
        """The exactly-once decision for one side-effecting call, as a sequence of I/O
        steps that `_once` and `_aonce` carry out (sync or async).

        Claim the key; replay a recorded outcome; ask `status_check` about a pending
        one (never re-run blindly). A new claim first looks for an unresolved intent of
        the same effect from an earlier call (a re-issue under a new id) and reconciles
        it: done answers this call too, not done releases it, and without a
        status_check this call does not run. Then run the tool once, releasing the key
        when it certainly did nothing, and record what happened."""
        yield "fence", None  # a runner that lost its thread lock claims nothing
        claim: Claim = yield "claim", None
        can_check = effect.profile.status_check is not None
        action = claim_action(claim, can_check_status=can_check)
        if action == "replay":
            return _replayed(call, claim.record.result, effect.key)
        if action == "unknown" and effect.approved:
            action = "execute"  # nothing can be asked; a human vouched for running it
        if action == "unknown":
            raise OutcomeUnknownError(effect.key)
        reconciled = yield from (
            self._reconcile_own(call, effect)
            if action == "check_status"
            else self._reconcile_earlier(call, effect)
        )
        if reconciled is not None:
            return reconciled
        try:
            yield "fence", None
        except ThreadLockLostError:
            yield "release", effect.key  # claimed, never run: the new holder runs it
            raise
        try:
            result_: ToolMessage | Command[Any] = yield "run", None
        except GraphBubbleUp:
            yield "release", effect.key  # paused before the effect: run it afresh
            raise
        except Exception as exc:
            if not self._maybe_executed(call, exc):
                yield "release", effect.key
            raise
        broken = self._broken_contract(call, result_)
        if broken is not None:  # it ran, but its answer is unusable: as if lost
            if not can_check:
                raise OutputValidationError(broken.problems, effect_unknown=True) from broken
            status = yield "status", effect.key
            if status.done:
                yield "record", (effect.key, _jsonable(status.result))
            else:
                yield "release", effect.key
            return _answer_unusable(call, effect.key, status, broken)
        yield "record", (effect.key, _outcome_of(result_))
        if effect.profile.compensate is not None:
            yield "saga", None
        return result_

    @staticmethod
    def _reconcile_own(
        call: ToolCall, effect: _Effect
    ) -> Generator[_EffectOp, Any, ToolMessage | None]:
        """This call's own intent has no outcome (a crash, a lost answer): wait out an
        attempt still in flight, then ask the service. Done: answered with its result.
        Not done: run it once more, if attempts are left (None), else it is exhausted."""
        can_check = effect.profile.status_check is not None
        settled: Settled = yield "settle", effect.key
        if settled == "running":
            raise OutcomeUnknownError(effect.key, reason=_STILL_RUNNING)
        if settled == "ended":  # its late outcome may be recorded by now
            claim: Claim = yield "claim", None
            if claim_action(claim, can_check_status=can_check) == "replay":
                return _replayed(call, claim.record.result, effect.key)
        status: EffectStatus = yield "status", effect.key
        if status.done:
            yield "record", (effect.key, _jsonable(status.result))
            return _replayed(call, status.result, effect.key, reconciled=True)
        if not effect.may_execute and not effect.approved:
            yield "release", effect.key
            raise _NotDoneError(effect.key)
        return None

    @staticmethod
    def _reconcile_earlier(
        call: ToolCall, effect: _Effect
    ) -> Generator[_EffectOp, Any, ToolMessage | None]:
        """Before a newly claimed effect runs: the same effect asked for by an earlier
        call whose outcome is unknown. Done: this call is answered with its result (and
        its own key records it). Not done: released, and this call runs. Unknowable
        (no status_check, or it failed): this call does not run."""
        siblings: list[IdempotencyRecord] = yield "siblings", None
        for sibling in siblings:
            if effect.profile.status_check is None:
                if effect.approved:  # nothing can be asked; a human vouched for running it
                    yield "release", sibling.key
                    continue
                yield "release", effect.key  # this call did not run
                raise OutcomeUnknownError(sibling.key, earlier_call=True)
            settled: Settled = yield "settle", sibling.key
            if settled == "running":
                yield "release", effect.key
                raise OutcomeUnknownError(sibling.key, earlier_call=True, reason=_STILL_RUNNING)
            try:
                status: EffectStatus = yield "status", sibling.key
            except OutcomeUnknownError as exc:
                yield "release", effect.key
                reason = str(exc.context.get("reason", ""))
                raise OutcomeUnknownError(sibling.key, earlier_call=True, reason=reason) from exc
            if status.done:
                result = _jsonable(status.result)
                yield "record", (sibling.key, result)
                yield "record", (effect.key, result)
                return _replayed(call, status.result, sibling.key, reconciled=True)
            yield "release", sibling.key
        return None

    def _ledger(self, op: str, value: Any, effect: _Effect, call: ToolCall) -> Any:
        """One ledger operation, retried with backoff as a database error (`_ledger_call`)."""
        target, name, args, kwargs = _ledger_call(op, value, effect, call)
        for attempt in itertools.count(1):
            try:
                result = getattr(target, name)(*args, **kwargs)
            except Exception as exc:
                delay = ledger_retry_delay(attempt)
                if delay is None:
                    return _ledger_gave_up(op, effect, exc)
                _ledger_retrying(op, attempt, exc)
                self.clock.sleep(delay)
                continue
            return _siblings(result, effect) if op == "siblings" else result
        raise AssertionError("unreachable")  # pragma: no cover

    async def _aledger(self, op: str, value: Any, effect: _Effect, call: ToolCall) -> Any:
        """Async `_ledger`: the store's async methods, the clock's async sleep."""
        target, name, args, kwargs = _ledger_call(op, value, effect, call)
        for attempt in itertools.count(1):
            try:
                result = await getattr(target, f"a{name}")(*args, **kwargs)
            except Exception as exc:
                delay = ledger_retry_delay(attempt)
                if delay is None:
                    return _ledger_gave_up(op, effect, exc)
                _ledger_retrying(op, attempt, exc)
                await self.clock.asleep(delay)
                continue
            return _siblings(result, effect) if op == "siblings" else result
        raise AssertionError("unreachable")  # pragma: no cover

    def _once(
        self,
        call: ToolCall,
        request: ToolCallRequest,
        execute: Callable[[ToolCallRequest], Any],
        effect: _Effect | None,
    ) -> ToolMessage | Command[Any]:
        """Run a side effect at most once per effect (see `_effect_flow`)."""
        if effect is None:
            return self._run(call, request, execute)
        flow = self._effect_flow(call, effect)
        reply: Any = None
        error: BaseException | None = None
        while True:
            try:
                op, value = flow.send(reply) if error is None else flow.throw(error)
            except StopIteration as done:
                return cast("ToolMessage | Command[Any]", done.value)
            reply, error = None, None
            if op in _LEDGER_OPS:
                reply = self._ledger(op, value, effect, call)
            elif op == "settle":
                reply = settle(value, effect.grace)
            elif op == "fence":
                try:
                    check_fence(effect.thread_id)
                except ThreadLockLostError as exc:
                    error = exc
            elif op == "status":
                try:
                    checked = _ask_status(effect, value)
                except OutcomeUnknownError as exc:
                    error = exc
                    continue
                if inspect.isawaitable(checked):
                    if inspect.iscoroutine(checked):
                        checked.close()
                    raise ConfigurationError(
                        f"the status_check of {call['name']!r} is async: run the graph with "
                        "ainvoke/astream, or give the tool a sync status_check"
                    )
                reply = _effect_status(checked)
            elif op == "run":
                with self._effect_context(call, effect) as keys:
                    try:
                        reply = self._run(call, request, execute, effect)
                    except Exception as exc:  # handed to the flow, which re-raises it
                        error = exc
                    else:
                        _note_item_keys(reply, keys)

    async def _aonce(
        self,
        call: ToolCall,
        request: ToolCallRequest,
        execute: Callable[[ToolCallRequest], Any],
        effect: _Effect | None,
    ) -> ToolMessage | Command[Any]:
        """Async `_once`: the same flow on the store's async methods (a sync
        status_check runs as is)."""
        if effect is None:
            return await self._arun(call, request, execute)
        flow = self._effect_flow(call, effect)
        reply: Any = None
        error: BaseException | None = None
        while True:
            try:
                op, value = flow.send(reply) if error is None else flow.throw(error)
            except StopIteration as done:
                return cast("ToolMessage | Command[Any]", done.value)
            reply, error = None, None
            if op in _LEDGER_OPS:
                reply = await self._aledger(op, value, effect, call)
            elif op == "settle":
                reply = await asettle(value, effect.grace)
            elif op == "fence":
                try:
                    await acheck_fence(effect.thread_id)
                except ThreadLockLostError as exc:
                    error = exc
            elif op == "status":
                try:
                    checked = _ask_status(effect, value)
                    if inspect.isawaitable(checked):
                        checked = await _awaited_status(effect, value, checked)
                except OutcomeUnknownError as exc:
                    error = exc
                    continue
                reply = _effect_status(checked)
            elif op == "run":
                with self._effect_context(call, effect) as keys:
                    try:
                        reply = await self._arun(call, request, execute, effect)
                    except Exception as exc:  # handed to the flow, which re-raises it
                        error = exc
                    else:
                        _note_item_keys(reply, keys)

    @contextlib.contextmanager
    def _effect_context(self, call: ToolCall, effect: _Effect) -> Iterator[tuple[str, ...] | None]:
        """While the tool runs: its idempotency key (and per-item keys) for the tool."""
        item_keys = self._item_keys(call, effect.key)
        token = _CURRENT_KEY.set(effect.key)
        items_token = _CURRENT_ITEM_KEYS.set(item_keys)
        try:
            yield item_keys
        finally:
            _CURRENT_KEY.reset(token)
            _CURRENT_ITEM_KEYS.reset(items_token)

    def _item_keys(self, call: ToolCall, key: str) -> tuple[str, ...] | None:
        """Per-item keys of a side-effecting batch call: the first run's, on a redo."""
        profile = self.profiles.get(call["name"])
        if profile is None or profile.batch_arg is None:
            return None
        in_step = _STEP.get()
        kept = in_step.item_keys.get(call["id"] or "") if in_step is not None else None
        if kept is not None:
            return tuple(kept)
        items = call["args"].get(profile.batch_arg)
        count = len(items) if isinstance(items, list) else 0
        return tuple(item_idempotency_key(key, index) for index in range(count))

    def _broken_contract(
        self, call: ToolCall, result: ToolMessage | Command[Any]
    ) -> OutputValidationError | None:
        """The output-contract failure of a result, or None when it is usable."""
        try:
            self._checked(call, result)
        except OutputValidationError as exc:
            return exc
        return None

    def _maybe_executed(self, call: ToolCall, exc: BaseException) -> bool:
        """A lost response (timeout, 5xx other than 429/503) may hide a done effect: the
        intent stays pending. A refusal before the effect releases the key for a retry."""
        profile = self.profiles.get(call["name"])
        verdict = classify(exc, profile=profile, rules=self.rules)
        return verdict.failure_class is FailureClass.UNKNOWN

    def compensate_thread(
        self, thread_id: str, config: RunnableConfig
    ) -> CompensationReport | None:
        """Undo the thread's recorded side effects, newest first, exactly once each."""
        compensators = {n: p.compensate for n, p in self.profiles.items() if p.compensate}
        ledger = self._ledgers.resolve(config) if compensators else None
        if ledger is None:
            return None
        return compensate_thread(
            thread_id, store=ledger.idempotency, saga=ledger.saga, compensators=compensators
        )

    async def acompensate_thread(
        self, thread_id: str, config: RunnableConfig
    ) -> CompensationReport | None:
        """Async `compensate_thread`: the ledger's async methods, async compensators."""
        compensators = {n: p.compensate for n, p in self.profiles.items() if p.compensate}
        ledger = await self._ledgers.aresolve(config) if compensators else None
        if ledger is None:
            return None
        return await acompensate_thread(
            thread_id, store=ledger.idempotency, saga=ledger.saga, compensators=compensators
        )

    def _wrap(
        self,
        request: ToolCallRequest,
        execute: Callable[[ToolCallRequest], ToolMessage | Command[Any]],
    ) -> ToolMessage | Command[Any]:
        """Sync interception of one call: breaker admission, bulkhead, timeout, output
        contract, then the outcome reported back to the breaker."""
        call = request.tool_call
        in_step = _STEP.get()
        step_gone = in_step.gone if in_step is not None else None
        if step_gone is not None and call["name"] in step_gone:
            return self._raised(call, ToolGoneError(call["name"], 0.0), executed=False)
        admitted: _Admitted | None = None
        if self.breaker is not None:
            key = self.breaker_key(call["name"])
            admission = self.breaker_store.acquire(key, self.breaker, self.clock.time())
            if not admission.allowed:
                return self._refused(call, key, admission.retry_after)
            admitted = _Admitted(key, admission.probe, self.clock.monotonic())
        try:
            effect = self._effect(call, request)
            result = self._checked(call, self._once(call, request, execute, effect))
        except (GraphBubbleUp, *_NOT_THE_TOOLS, *_NOT_EXECUTED) as exc:
            # our own misconfiguration or ledger is never the tool's failure
            if admitted is not None and self.breaker is not None:
                self.breaker_store.release(
                    admitted.key, self.breaker, self.clock.time(), probe=admitted.probe
                )
            if isinstance(exc, _NOT_EXECUTED):
                return self._raised(call, exc, executed=False, effect=effect)
            raise
        except Exception as exc:
            if is_invalid_resume(exc):
                raise
            outcome = self._failed(call, exc, step_gone)
            if admitted is not None and admitted.probe:  # a probe decides at once
                self._report(admitted, outcome)
                return self._raised(call, exc, effect=effect)
            unreported = self._unreported(admitted, outcome)
            return self._raised(call, exc, unreported=unreported, effect=effect)
        self._report(admitted, None)
        return result

    async def _awrap(
        self,
        request: ToolCallRequest,
        execute: Callable[[ToolCallRequest], Any],
    ) -> ToolMessage | Command[Any]:
        """Async twin of `_wrap` (the breaker store's async methods, the loop's sleep)."""
        call = request.tool_call
        in_step = _STEP.get()
        step_gone = in_step.gone if in_step is not None else None
        if step_gone is not None and call["name"] in step_gone:
            return self._raised(call, ToolGoneError(call["name"], 0.0), executed=False)
        admitted: _Admitted | None = None
        if self.breaker is not None:
            key = self.breaker_key(call["name"])
            admission = await self.breaker_store.aacquire(key, self.breaker, self.clock.time())
            if not admission.allowed:
                return self._refused(call, key, admission.retry_after)
            admitted = _Admitted(key, admission.probe, self.clock.monotonic())
        try:
            effect = self._effect(call, request)
            result = self._checked(call, await self._aonce(call, request, execute, effect))
        except (GraphBubbleUp, *_NOT_THE_TOOLS, *_NOT_EXECUTED) as exc:
            # our own misconfiguration or ledger is never the tool's failure
            if admitted is not None and self.breaker is not None:
                await self.breaker_store.arelease(
                    admitted.key, self.breaker, self.clock.time(), probe=admitted.probe
                )
            if isinstance(exc, _NOT_EXECUTED):
                return self._raised(call, exc, executed=False, effect=effect)
            raise
        except Exception as exc:
            if is_invalid_resume(exc):
                raise
            outcome = self._failed(call, exc, step_gone)
            if admitted is not None and admitted.probe:  # a probe decides at once
                await self._areport(admitted, outcome)
                return self._raised(call, exc, effect=effect)
            unreported = self._unreported(admitted, outcome)
            return self._raised(call, exc, unreported=unreported, effect=effect)
        await self._areport(admitted, None)
        return result

    def _failed(
        self, call: ToolCall, exc: BaseException, step_gone: set[str] | None
    ) -> FailureClass:
        """Classify an execution's failure for the breaker; a STRUCTURAL answer also
        stops the step's calls to that tool that have not started."""
        failure = classify(exc, profile=self.profiles.get(call["name"]), rules=self.rules)
        if failure.failure_class is FailureClass.STRUCTURAL and step_gone is not None:
            step_gone.add(call["name"])
        return failure.failure_class

    def _unreported(
        self, admitted: _Admitted | None, outcome: FailureClass
    ) -> _BreakerReport | None:
        if admitted is None or outcome not in self._counted:
            return None
        return _BreakerReport(admitted.key, outcome, self.clock.monotonic() - admitted.started)

    def _report(self, admitted: _Admitted | None, outcome: FailureClass | None) -> None:
        if admitted is None or self.breaker is None:
            return
        self.breaker_store.record(
            admitted.key,
            self.breaker,
            self.clock.time(),
            outcome,
            probe=admitted.probe,
            duration=self.clock.monotonic() - admitted.started,
        )

    async def _areport(self, admitted: _Admitted | None, outcome: FailureClass | None) -> None:
        if admitted is None or self.breaker is None:
            return
        await self.breaker_store.arecord(
            admitted.key,
            self.breaker,
            self.clock.time(),
            outcome,
            probe=admitted.probe,
            duration=self.clock.monotonic() - admitted.started,
        )

    def _report_settled(self, reports: Sequence[_BreakerReport]) -> None:
        """Tell the breakers about the calls that left their tool failed in this step."""
        if self.breaker is None:
            return
        for report in reports:
            self.breaker_store.record(
                report.key,
                self.breaker,
                self.clock.time(),
                report.outcome,
                probe=False,
                duration=report.duration,
            )

    async def _areport_settled(self, reports: Sequence[_BreakerReport]) -> None:
        if self.breaker is None:
            return
        for report in reports:
            await self.breaker_store.arecord(
                report.key,
                self.breaker,
                self.clock.time(),
                report.outcome,
                probe=False,
                duration=report.duration,
            )

    @staticmethod
    def _raised(
        call: ToolCall,
        exc: BaseException,
        *,
        executed: bool = True,
        unreported: _BreakerReport | None = None,
        effect: _Effect | None = None,
    ) -> ToolMessage:
        return ToolMessage(
            content="",
            name=call["name"],
            tool_call_id=call["id"] or "",
            status="error",
            artifact=_Raised(exc, executed, unreported, effect.key if effect else None),
        )

    # -------------------------------------------------------------- the step

    def _loop_threshold(self, tool: str) -> int:
        profile = self.profiles.get(tool)
        if profile is not None and profile.loop_threshold is not None:
            return profile.loop_threshold
        return self.policy.loop_threshold

    def _is_loop(
        self,
        batch: _Batch,
        call: ToolCall,
        key: str,
        slot: str,
        *,
        seen: dict[str, int],
        recent: list[str],
    ) -> bool:
        """Count a call the agent issues now; answer it with a loop envelope if it closes one."""
        loop = detect_loop(
            key,
            seen=seen,
            recent=recent,
            threshold=self._loop_threshold(call["name"]),
            failed=batch.task.get("failed") or {},
        )
        for counts, order in ((seen, recent), (batch.seen, batch.recent)):
            counts[key] = counts.get(key, 0) + 1
            order.append(key)
        batch.loop_keys[call["id"] or ""] = key
        if loop is None:
            return False
        count = seen[key] + int((batch.task.get("failed") or {}).get(key, 0))
        error = _loop_error(call, key, loop, count)
        batch.preflight.append(_Preflight(error, "loop", key, slot=slot))
        return True

    def _invalid_calls(
        self, batch: _Batch, answered: set[str], calls: Mapping[str, CallRecord]
    ) -> list[tuple[str, ToolCall]]:
        """Unparseable calls: new ones are answered (or sent to repair) in preflight;
        those a repair already fixed come back as ordinary calls (with their slots)."""
        repaired: list[tuple[str, ToolCall]] = []
        for position, invalid in enumerate(batch.ai.invalid_tool_calls):
            call_id = invalid.get("id")
            if not call_id or call_id in answered:
                continue
            slot = call_slot(batch.ai, batch.ai_index, position, invalid=True)
            if slot in calls:
                name = invalid.get("name") or ""
                repaired.append((slot, ToolCall(name=name, args={}, id=call_id, type="tool_call")))
                continue
            repairable = invalid.get("name") in self.tools_by_name
            error = _invalid_call_error(invalid)
            batch.preflight.append(_Preflight(error, repairable=repairable, slot=slot))
        return repaired

    def _fallbacks(
        self, primary: str, tried: Sequence[str], gone: Mapping[str, float], now: float
    ) -> list[str]:
        """`primary`'s fallbacks still worth a call: not tried for this call, breaker
        not open, not remembered as gone in this thread."""
        chain = self.profiles.get(primary)
        if chain is None:
            return []
        memory = self.policy.structural_memory_s
        return [
            name
            for name in chain.fallbacks
            if name not in tried
            and name in self.tools_by_name
            and remembered_gone(gone, name, now=now, memory=memory) is None
            and not self._breaker_open(name)
        ]

    def _breaker_open(self, tool: str) -> bool:
        """Whether `tool`'s breaker is open now (one store read, only for this tool)."""
        if self.breaker is None:
            return False
        snapshot = self.breaker_store.snapshot(self.breaker_key(tool))
        return snapshot.status_at(self.breaker, self.clock.time()) == "open"

    def _avoid_gone(
        self, batch: _Batch, call: ToolCall, slot: str, gone: Mapping[str, float]
    ) -> tuple[str, dict[str, Any]] | None:
        """A new call to a tool this thread saw answer STRUCTURAL: send it straight to a
        fallback (the tool and arguments to run), else answer it as STRUCTURAL (None).
        Once the memory has lapsed, the tool itself runs again."""
        name, args = call["name"], call["args"]
        at = remembered_gone(gone, name, now=batch.now, memory=self.policy.structural_memory_s)
        if at is None:
            return name, args
        call_id = call["id"] or ""
        candidates = self._fallbacks(name, [name], gone, batch.now)
        if candidates:
            fallback = candidates[0]
            profile = self.profiles[name]
            routed = profile.fallback_args(fallback, dict(args)) if profile.fallback_args else args
            batch.rerouted[call_id] = (name, dict(args))
            return fallback, dict(routed)
        error = classify(
            ToolGoneError(name, batch.now - at),
            tool=name,
            profile=self.profiles.get(name),
            call_id=call_id,
            rules=self.rules,
        )
        batch.preflight.append(_Preflight(error, slot=slot))
        return None

    def _admit(
        self,
        batch: _Batch,
        call: ToolCall,
        key: str,
        slot: str,
        *,
        seen: dict[str, int],
        recent: list[str],
        gone: Mapping[str, float],
    ) -> tuple[str, dict[str, Any], str] | None:
        """A new call passes the loop guard (the agent's calls only: plan steps are
        verified instead) and the thread's memory of gone tools: the tool, arguments
        and key to run, or None when it is answered without running."""
        if not (call["id"] or "").startswith(PLAN_CALL_PREFIX) and self._is_loop(
            batch, call, key, slot, seen=seen, recent=recent
        ):
            return None
        if call["name"] not in gone:
            return call["name"], call["args"], key
        routed = self._avoid_gone(batch, call, slot, gone)
        if routed is None:
            return None
        name, args = routed
        return name, args, call_key(name, args, noise_fields=self.policy.noise_fields)

    def _max_attempts(self, tool: str) -> int:
        profile = self.profiles.get(tool)
        if profile is not None and profile.max_attempts is not None:
            return profile.max_attempts
        return self.policy.max_attempts

    def _exhausted(
        self, batch: _Batch, ledger: Ledger, budget_left: int
    ) -> ExhaustionReason | None:
        """The task budget (or the thread's lifetime cap) that stops a call from running."""
        started_at = batch.task.get("started_at")
        if (
            self.policy.deadline_s is not None
            and started_at is not None
            and batch.now - started_at >= self.policy.deadline_s
        ):
            return "deadline"
        if budget_left <= 0:
            return "max_tool_attempts"
        lifetime = self.policy.max_thread_tool_attempts
        if (
            lifetime is not None
            and int(ledger.get("tool_attempts") or 0) + len(batch.runnable) >= lifetime
        ):
            return "max_thread_tool_attempts"
        return None

    def _plan(self, state: Any) -> _Batch | None:
        messages = read_messages(state, self.messages_key)
        found = last_ai_message(messages)
        if found is None:
            return None
        ai_index, ai = found
        ledger = read_ledger(state)
        calls = ledger.get("calls") or {}
        task = task_view(ledger, current_task(messages))
        batch = _Batch(
            ai_index=ai_index,
            ai=ai,
            now=self.clock.time(),
            task=task,
            informed=ledger.get("informed") or {},
        )
        answered = {m.tool_call_id for m in messages[ai_index + 1 :] if isinstance(m, ToolMessage)}
        repaired_invalid = self._invalid_calls(batch, answered, calls)
        budget_left = self.policy.max_tool_attempts - int(task.get("tool_attempts") or 0)
        seen = dict(task.get("seen") or {})
        recent = list(task.get("recent") or [])
        gone = ledger.get("gone") or {}
        valid = [(call_slot(ai, ai_index, i), call) for i, call in enumerate(ai.tool_calls)]
        ids = Counter(call["id"] for call in ai.tool_calls)
        for slot, call in [*valid, *repaired_invalid]:
            call_id = call["id"] or ""
            if call_id in answered:
                continue
            if not call_id or ids[call_id] > 1:  # ToolMessages could not tell them apart
                batch.preflight.append(_Preflight(_call_id_error(call, ids[call_id]), slot=slot))
                continue
            record = calls.get(slot)
            if record is not None and (
                record["status"] != "scheduled"
                or (record["due"] or 0.0) > batch.now + _DUE_TOLERANCE
            ):
                continue
            # a fallback serves the call under its original id
            name = (record.get("served_by") if record is not None else None) or call["name"]
            if name not in self.tools_by_name:
                error = unknown_tool_error(name, list(self.tools_by_name), call_id=call_id)
                batch.preflight.append(_Preflight(error, slot=slot))
                continue
            args = dict(record["args"]) if record is not None and "args" in record else call["args"]
            key = call_key(name, args, noise_fields=self.policy.noise_fields)
            if record is None:  # a call issued now, not a retry of one in the ledger
                admitted = self._admit(batch, call, key, slot, seen=seen, recent=recent, gone=gone)
                if admitted is None:
                    continue
                name, args, key = admitted
            exhausted = self._exhausted(batch, ledger, budget_left)
            if exhausted is not None:
                last = _last_error(record) or _budget_error(call, exhausted)
                batch.preflight.append(_Preflight(last, exhausted, key, slot=slot))
                continue
            budget_left -= 1
            self._to_run(batch, slot, {**call, "name": name, "args": args}, key, record)
        return batch

    def _to_run(
        self, batch: _Batch, slot: str, call: ToolCall, key: str, record: CallRecord | None
    ) -> None:
        """Add a call to the step's runnable calls, with what its run must know."""
        call_id = call["id"] or ""
        if record is not None:
            if record.get("item_keys"):
                batch.item_keys[call_id] = list(record["item_keys"])
            if _tool_attempts(record) >= self._max_attempts(call["name"]):
                batch.spent.add(call_id)
            if record.get("approved"):
                batch.approved.add(call_id)
        batch.keys[call_id] = key
        batch.slots[call_id] = slot
        batch.runnable.append(call)

    def _input(self, state: Any, batch: _Batch) -> dict[str, Any]:
        messages = read_messages(state, self.messages_key)[: batch.ai_index]
        only_due = batch.ai.model_copy(update={"tool_calls": batch.runnable})
        base = dict(state) if isinstance(state, Mapping) else {}
        return {**base, self.messages_key: [*messages, only_due]}

    def _in_step(self, batch: _Batch, ledger: EffectLedger | None) -> _InStep:
        return _InStep(
            set(),
            batch.item_keys,
            batch.slots,
            spent=frozenset(batch.spent),
            approved=frozenset(batch.approved),
            told_before=frozenset(
                key for key, task in batch.informed.items() if task != batch.task.get("id", "")
            ),
            ledger=ledger,
        )

    def _finish(self, state: Any, batch: _Batch, output: Any) -> tuple[Any, list[_BreakerReport]]:
        ledger = read_ledger(state)
        calls = ledger.get("calls") or {}
        results, commands = _split_output(output, self.messages_key)
        refused = {
            call_id
            for call_id, m in results.items()
            if isinstance(m.artifact, _Raised) and not m.artifact.executed
        }
        executed = len(batch.runnable) - len(refused)
        started_at = batch.task.get("started_at")
        step = _Step(
            ledger=ledger,
            task=batch.task,
            task_attempts=int(batch.task.get("tool_attempts") or 0) + executed,
            elapsed=batch.now - (started_at or batch.now),
        )
        for issued in batch.runnable:
            call_id = issued["id"] or ""
            slot = batch.slots[call_id]
            previous = calls.get(slot)
            attempts = (previous["attempts"] if previous else 0) + (call_id not in refused)
            message = results.get(call_id)
            fixed = message.response_metadata.pop("resilience_coercion", None) if message else None
            call = issued if fixed is None else {**issued, "args": fixed["args"]}
            record = _record(
                call,
                batch.keys[call_id],
                attempts=attempts,
                previous=previous,
                coercions=fixed["changes"] if fixed is not None else None,
            )
            if call_id in batch.loop_keys:
                record["loop_key"] = batch.loop_keys[call_id]
            if call_id not in refused:
                record.pop("approved", None)  # a human's retry buys one more execution
            if call_id in batch.rerouted:
                self._note_reroute(step, slot, record, batch.rerouted[call_id])
            if call_id not in refused:
                step.count("attempt")
                if _tool_attempts(record) == 1:  # a first try of this tool
                    self._deposit(call["name"], batch.now)
            raised = message.artifact if message is not None else None
            if isinstance(raised, _Raised):
                if raised.unreported is not None:
                    step.unreported[call_id] = raised.unreported
                if raised.effect_key is not None:
                    record["effect_key"] = raised.effect_key
                self._settle_failure(step, slot, call, record, raised.error, now=batch.now)
                continue
            partial = self._partial(call, message)
            if partial is not None and message is not None:
                self._settle_partial(
                    step, slot, call, record, message=message, partial=partial, now=batch.now
                )
                continue
            emit(
                Event(
                    "attempt",
                    tool=call["name"],
                    call_id=call_id,
                    attempt=_tool_attempts(record),
                    ok=True,
                )
            )
            record["status"] = "ok"
            step.calls[slot] = record
            if message is not None:
                message.response_metadata.pop("resilience_item_keys", None)
                merged = _with_done_items(message, record, self.profiles.get(call["name"]))
                step.messages.append(_with_trail(merged, record))
        for item in batch.preflight:
            self._settle_preflight(step, item, calls)

        self._end_waits_past_budget(step, state, batch.now)
        delta = _delta(batch, step, executed)
        update: dict[str, Any] = {self.messages_key: step.messages, "resilience": delta}
        return ([*commands, update] if commands else update), step.reports

    def _settle_failure(
        self,
        step: _Step,
        slot: str,
        call: ToolCall,
        record: CallRecord,
        exc: BaseException,
        *,
        now: float,
    ) -> None:
        """Classify one failed execution and carry out `decide()`'s verdict on it."""
        call_id = call["id"] or ""
        attempts = _tool_attempts(record)
        profile = self.profiles.get(call["name"])
        error = classify(
            exc,
            tool=call["name"],
            profile=profile,
            call_id=call_id,
            attempt=attempts,
            rules=self.rules,
            now=now,
        )
        if isinstance(exc, ToolInvocationError):  # rejected before running: safe to repair
            error = error.model_copy(update={"context": {**error.context, "stage": "arguments"}})
        elif error.failure_class is FailureClass.STRUCTURAL and not isinstance(
            exc, CircuitOpenError | ToolGoneError
        ):
            step.gone[call["name"]] = now  # the endpoint answered: remember it for the thread
        record["error"] = error.model_dump(mode="json")
        emit(
            Event(
                "attempt",
                tool=call["name"],
                call_id=call_id,
                attempt=attempts,
                ok=False,
                failure_class=error.failure_class.value,
                error=error.type,
            )
        )
        self._decide(step, slot, call, record, error, now=now)

    def _decide(
        self,
        step: _Step,
        slot: str,
        call: ToolCall,
        record: CallRecord,
        error: ToolError,
        *,
        now: float,
    ) -> None:
        """Carry out `decide()`'s verdict on a failed execution: retry, fall back, or on."""
        decision = decide(
            error,
            attempts=_tool_attempts(record),
            task_attempts=step.task_attempts,
            elapsed=step.elapsed,
            policy=self.policy,
            profile=self.profiles.get(call["name"]),
            rng=self.rng,
            repairs=record.get("repairs", 0),
            llm_calls=int(step.task.get("llm_calls") or 0),
            can_repair=self.can_repair,
            idempotent=True,  # every side effect runs under a key (effect_ledger)
        )
        if decision.route == "retry" and not self._withdraw(call["name"], now):
            decision = Decision("agent", exhausted="retry_budget")
        unreported = step.unreported.pop(call["id"] or "", None)
        if unreported is not None and decision.route != "retry":
            step.reports.append(unreported)  # the call leaves this tool: one outcome
        if self._fall_back(step, slot, record, error, decision):
            return
        self._carry_out(step, slot, record, error, decision, now=now)

    def _partial(self, call: ToolCall, message: ToolMessage | None) -> PartialResult | None:
        """The `PartialResult` a batch tool answered with, or None."""
        profile = self.profiles.get(call["name"])
        if message is None or profile is None or profile.batch_arg is None:
            return None
        return as_partial_result(message.content)

    def _settle_partial(
        self,
        step: _Step,
        slot: str,
        call: ToolCall,
        record: CallRecord,
        *,
        message: ToolMessage,
        partial: PartialResult,
        now: float,
    ) -> None:
        """Some items of a batch failed: redo only those (PARTIAL), each keeping its
        first key; what succeeded is kept for the call's final answer."""
        call_id = call["id"] or ""
        batch_arg = self.profiles[call["name"]].batch_arg or ""
        items = call["args"].get(batch_arg)
        keys = message.response_metadata.pop("resilience_item_keys", None)
        try:
            if not isinstance(items, list):
                raise ValueError(f"the batch argument {batch_arg!r} is not a list")
            redo = failed_items(items, partial, call_key="")
        except ValueError as exc:  # the tool's partial result does not match its batch
            self._settle_failure(step, slot, call, record, exc, now=now)
            return
        done = [*record.get("done_items", []), *partial.succeeded]
        error = ToolError(
            type="PartialResult",
            failure_class=FailureClass.PARTIAL,
            message=redact(
                f"{len(redo)} of {len(items)} items failed: "
                + "; ".join(f.error for f in partial.failed[:3])
            ),
            suggested_action="retry",
            retriable=True,
            tool=call["name"],
            call_id=call_id,
            attempt=_tool_attempts(record),
            context={"failed": [r.item for r in redo], "succeeded": done},
        )
        record["error"] = error.model_dump(mode="json")
        record["done_items"] = done
        record["args"] = {**call["args"], batch_arg: [r.item for r in redo]}
        record["key"] = call_key(
            call["name"], record["args"], noise_fields=self.policy.noise_fields
        )
        if keys is not None and len(keys) == len(items):
            record["item_keys"] = [keys[r.index] for r in redo]
        step.count("partial")
        emit(
            Event(
                "attempt",
                tool=call["name"],
                call_id=call_id,
                attempt=_tool_attempts(record),
                ok=False,
                failure_class=FailureClass.PARTIAL.value,
                failed=len(redo),
                items=len(items),
            )
        )
        self._decide(step, slot, call, record, error, now=now)

    def _deposit(self, tool: str, now: float) -> None:
        """A first attempt earns retry tokens in the shared retry budget."""
        if self.retry_budget is not None and self.retry_budget_store is not None:
            self.retry_budget_store.deposit(self.breaker_key(tool), self.retry_budget, now)

    def _withdraw(self, tool: str, now: float) -> bool:
        """May this call retry? False when the shared retry budget is empty."""
        if self.retry_budget is None or self.retry_budget_store is None:
            return True
        return self.retry_budget_store.try_withdraw(self.breaker_key(tool), self.retry_budget, now)

    def _fall_back(
        self, step: _Step, slot: str, record: CallRecord, error: ToolError, decision: Decision
    ) -> bool:
        """Hand a call whose tool is out (open breaker, STRUCTURAL, retries spent) to the
        next fallback whose breaker is not open; never back to a tool already tried."""
        out = error.failure_class is FailureClass.STRUCTURAL or decision.exhausted in (
            "max_attempts",
            "deadline",
            "retry_after",
            "retry_budget",
        )
        if decision.route != "agent" or not out:
            return False
        tried = [*record.get("tried", []), record["tool"]]
        gone = {**(step.ledger.get("gone") or {}), **step.gone}
        candidates = self._fallbacks(tried[0], tried, gone, self.clock.time())
        if not candidates:
            return False
        fallback = candidates[0]
        chain = self.profiles[tried[0]]
        origin = record.get("origin_args") or record.get("args", {})
        args = dict(origin)
        if chain.fallback_args is not None:
            args = chain.fallback_args(fallback, dict(origin))
        record["origin_args"] = origin
        record["tried"] = tried
        record["served_by"] = fallback
        record["fallback_at"] = record["attempts"]  # the fallback's own attempts start here
        record["tried_errors"] = [*record.get("tried_errors", []), error.model_dump(mode="json")]
        record["args"] = args
        record["status"] = "scheduled"
        record["due"] = None
        record["key"] = call_key(fallback, args, noise_fields=self.policy.noise_fields)
        step.calls[slot] = record
        step.count("fallback")
        emit(
            Event(
                "fallback",
                tool=record["tool"],
                to=fallback,
                call_id=record.get("call_id"),
                failure_class=error.failure_class.value,
            )
        )
        return True

    @staticmethod
    def _note_reroute(
        step: _Step, slot: str, record: CallRecord, rerouted: tuple[str, dict[str, Any]]
    ) -> None:
        """Record a call sent straight to a fallback as served by it, like `_fall_back`."""
        primary, origin = rerouted
        record["served_by"] = record["tool"]
        record["tried"] = [primary]
        record["origin_args"] = origin
        step.count("fallback")
        emit(
            Event(
                "fallback",
                tool=primary,
                to=record["tool"],
                call_id=record.get("call_id"),
                failure_class=FailureClass.STRUCTURAL.value,
                remembered=True,
            )
        )

    def _carry_out(
        self,
        step: _Step,
        slot: str,
        record: CallRecord,
        error: ToolError,
        decision: Decision,
        *,
        now: float,
    ) -> None:
        """Apply a decision to a call's record: wait, repair, replan, escalate or answer."""
        tool = record["tool"]
        call_id = record.get("call_id") or error.call_id or ""
        decision = unrecovered(
            error,
            decision,
            can_replan=self.can_replan,
            can_escalate=self.can_escalate,
            in_plan=call_id.startswith(PLAN_CALL_PREFIX),
        )
        step.calls[slot] = record
        if decision.route in ("replan", "escalate"):
            step.count(f"{decision.route}_needed")
            emit(
                Event(
                    f"{decision.route}_needed",
                    tool=tool,
                    call_id=call_id,
                    failure_class=error.failure_class.value,
                    exhausted=decision.exhausted,
                )
            )
            record["status"] = decision.route
            if decision.exhausted is not None:
                context = {**error.context, "exhausted": decision.exhausted}
                record["error"] = error.model_copy(update={"context": context}).model_dump(
                    mode="json"
                )
        elif decision.route == "retry":
            step.count("retry_scheduled")
            emit(
                Event(
                    "retry_scheduled",
                    tool=tool,
                    call_id=call_id,
                    attempt=_tool_attempts(record),
                    delay=round(decision.delay, 6),
                )
            )
            record["status"] = "scheduled"
            record["due"] = now + decision.delay
        elif decision.route == "repair":
            step.count("repair_needed")
            record["status"] = "repair"
        else:
            step.count("gave_up")
            emit(
                Event(
                    "gave_up",
                    tool=tool,
                    call_id=call_id,
                    attempt=_tool_attempts(record),
                    failure_class=error.failure_class.value,
                    exhausted=decision.exhausted,
                )
            )
            record["status"] = "failed"
            record["due"] = None
            loop_key = record.get("loop_key")
            if loop_key:  # the agent may re-issue a call whose failure it was handed
                step.seen[loop_key] = step.seen.get(loop_key, 0) - 1
                step.failed[loop_key] = step.failed.get(loop_key, 0) + 1
            unknown = error.context.get("idempotency_key") or record.get("effect_key")
            if error.failure_class is FailureClass.UNKNOWN and unknown:
                step.informed[str(unknown)] = str(step.task.get("id", ""))
            step.messages.append(error_message(error, exhausted=decision.exhausted))

    def _end_waits_past_budget(self, step: _Step, state: Any, now: float) -> None:
        """Once the task budget is spent, calls still waiting for a retry would only
        wait to be refused: settle them now instead of sleeping first."""
        if step.task_attempts < self.policy.max_tool_attempts:
            return
        calls = step.ledger.get("calls") or {}
        for entry in current_calls(state, self.messages_key):
            record = step.calls.get(entry.slot) or calls.get(entry.slot)
            if record is None or record["status"] != "scheduled" or record["error"] is None:
                continue
            error = ToolError.model_validate(record["error"])
            decision = Decision("agent", exhausted="max_tool_attempts")
            self._carry_out(step, entry.slot, dict(record), error, decision, now=now)  # type: ignore[arg-type]

    def _settle_preflight(
        self, step: _Step, item: _Preflight, calls: Mapping[str, CallRecord]
    ) -> None:
        """Answer a call that was not run (unknown tool, loop, spent budget, bad JSON),
        or send unparseable arguments to reflection repair."""
        error = item.error
        slot = item.slot
        if item.repairable and error.call_id:
            decision = decide_repair(
                error,
                repairs=0,
                llm_calls=int(step.task.get("llm_calls") or 0),
                policy=self.policy,
                profile=self.profiles.get(error.tool or ""),
                can_repair=self.can_repair,
            )
            if decision.route == "repair":
                step.count("repair_needed")
                step.calls[slot] = {
                    "tool": error.tool or "",
                    "key": "",
                    "attempts": 0,
                    "status": "repair",
                    "due": None,
                    "error": error.model_dump(mode="json"),
                    "call_id": error.call_id,
                    "args": {},
                }
                return
            item.exhausted = decision.exhausted
        onward = unrecovered(
            error,
            Decision("agent", exhausted=item.exhausted),
            can_replan=self.can_replan,
            can_escalate=self.can_escalate,
            in_plan=(error.call_id or "").startswith(PLAN_CALL_PREFIX),
        )
        if item.exhausted == "loop":
            step.count("loop_detected")
            emit(
                Event(
                    "loop_detected",
                    tool=error.tool,
                    call_id=error.call_id,
                    call_key=item.key,
                    count=error.context.get("count"),
                )
            )
        previous = calls.get(slot)
        answered_record: CallRecord = {
            **(previous or {}),  # type: ignore[typeddict-item]
            "tool": error.tool or "",
            "key": item.key or (previous["key"] if previous else ""),
            "attempts": previous["attempts"] if previous else 0,
            "status": "failed",
            "due": None,
            "error": error.model_dump(mode="json"),
            "call_id": error.call_id or "",
        }
        if onward.route in ("replan", "escalate") and error.call_id:
            step.count(f"{onward.route}_needed")
            step.calls[slot] = {**answered_record, "status": onward.route}
            return
        step.count("gave_up")
        emit(
            Event(
                "gave_up",
                tool=error.tool,
                call_id=error.call_id,
                attempt=error.attempt,
                failure_class=error.failure_class.value,
                exhausted=item.exhausted,
            )
        )
        if error.call_id:
            step.calls[slot] = answered_record
        step.messages.append(error_message(error, exhausted=item.exhausted))

    def run(self, state: Any, config: RunnableConfig) -> Any:
        """Sync body of the node."""
        batch = self._plan(state)
        if batch is None:
            return {}
        output: Any = {}
        if batch.runnable:
            previous = _STEP.get()
            _STEP.set(self._in_step(batch, self._ledgers.resolve(config)))
            try:
                output = self._tool_node.invoke(self._input(state, batch), config)
            finally:  # set, not reset: a BaseException may unwind in another context
                _STEP.set(previous)
        update, reports = self._finish(state, batch, output)
        self._report_settled(reports)
        return update

    async def arun(self, state: Any, config: RunnableConfig) -> Any:
        """Async body of the node."""
        batch = self._plan(state)
        if batch is None:
            return {}
        output: Any = {}
        if batch.runnable:
            ledger = await self._ledgers.aresolve(config)
            previous = _STEP.get()
            _STEP.set(self._in_step(batch, ledger))
            try:
                output = await self._tool_node.ainvoke(self._input(state, batch), config)
            finally:  # set, not reset: a BaseException may unwind in another context
                _STEP.set(previous)
        update, reports = self._finish(state, batch, output)
        await self._areport_settled(reports)
        return update


def _delta(batch: _Batch, step: _Step, executed: int) -> Ledger:
    """The ledger delta of one tools step."""
    started_at = batch.task.get("started_at")
    task_delta: TaskLedger = {
        "id": batch.task.get("id", ""),
        "tool_attempts": executed,
        "seen": _summed(batch.seen, step.seen),
        "failed": step.failed,
        "recent": batch.recent,
    }
    if started_at is None and executed:
        task_delta["started_at"] = batch.now
    delta: Ledger = {
        "calls": step.calls,
        "task": task_delta,
        "tool_attempts": executed,
        "events": step.events,
    }
    if step.gone:
        delta["gone"] = step.gone
    if step.informed:
        delta["informed"] = step.informed
    return delta


def _summed(counts: Mapping[str, int], more: Mapping[str, int]) -> dict[str, int]:
    """Two count deltas as one."""
    total = dict(counts)
    for name, count in more.items():
        total[name] = total.get(name, 0) + count
    return total


def _tool_attempts(record: CallRecord) -> int:
    """Executions of the call by the tool serving it now: a fallback gets its own
    `max_attempts` and backoff, counted from when it took over."""
    return record["attempts"] - record.get("fallback_at", 0)


def _record(
    call: ToolCall,
    key: str,
    *,
    attempts: int,
    previous: CallRecord | None,
    coercions: list[str] | None,
) -> CallRecord:
    """The call's record after one more execution; status and error are set by the caller.
    An ok record keeps the last failure it recovered from, for audit."""
    record: CallRecord = {
        **(previous or {}),  # type: ignore[typeddict-item]
        "tool": call["name"],
        "key": key,
        "attempts": attempts,
        "status": "scheduled",
        "due": None,
        "error": previous["error"] if previous else None,
        "call_id": call["id"] or "",
        "args": dict(call["args"]),
    }
    if coercions:
        record["coercions"] = [*(record.get("coercions") or []), *coercions]
    return record


def _with_coercions(
    result: ToolMessage | Command[Any], fixed: Coercion
) -> ToolMessage | Command[Any]:
    """Mark a result obtained after coercing the arguments, so the node records it."""
    if not isinstance(result, ToolMessage):
        return result
    metadata = {
        **result.response_metadata,
        "resilience_coercion": {"args": fixed.args, "changes": list(fixed.changes)},
    }
    return result.model_copy(update={"response_metadata": metadata})


def _with_done_items(
    message: ToolMessage, record: CallRecord, profile: ToolProfile | None
) -> ToolMessage:
    """A batch finished by redoing its failed items answers for the whole batch:
    `ToolProfile.merge_batches`, else ``{"succeeded_earlier": [...], "result": last}``."""
    done = record.get("done_items")
    if not done:
        return message
    final = parsed_content(message.content)
    if profile is not None and profile.merge_batches is not None:
        merged = profile.merge_batches(list(done), final)
    else:
        merged = {"succeeded_earlier": done, "result": final}
    content = merged if isinstance(merged, str) else json.dumps(merged, default=str)
    return message.model_copy(update={"content": content})


def _with_trail(message: ToolMessage, record: CallRecord) -> ToolMessage:
    """Attach the recovery trail (repairs, coercions) to a successful ToolMessage."""
    trail: dict[str, Any] = {
        k: v
        for k in ("repairs", "trail", "coercions", "served_by", "tried")
        if (v := record.get(k))
    }
    if not trail:
        return message
    if "trail" in trail:  # the failed attempts' arguments, shown: secret-named ones masked
        trail["trail"] = [{**entry, "args": mask_args(entry["args"])} for entry in trail["trail"]]
    trail["attempts"] = record["attempts"]
    metadata = {**message.response_metadata, "resilience": trail}
    update: dict[str, Any] = {"response_metadata": metadata}
    if message.artifact is None:
        update["artifact"] = {"resilience": trail}
    return message.model_copy(update=update)


def _loop_error(call: ToolCall, key: str, kind: LoopKind, count: int) -> ToolError:
    what = (
        f"this exact call was already issued {count - 1} times"
        if kind == "repeat"
        else "the calls alternate between the same two requests"
    )
    return ToolError(
        type="LoopDetectedError",
        failure_class=FailureClass.STRUCTURAL,
        message=f"Loop detected: {what}; it was not executed. Change the approach "
        "or the arguments, or ask the user.",
        suggested_action="ask_human",
        retriable=False,
        tool=call["name"],
        call_id=call["id"],
        context={"loop": kind, "call_key": key, "count": count},
    )


def _last_error(record: CallRecord | None) -> ToolError | None:
    if record is None or record["error"] is None:
        return None
    return ToolError.model_validate(record["error"])


def _call_id_error(call: ToolCall, count: int) -> ToolError:
    """The envelope of a call whose id is missing or shared with another call of its
    message: its answer could not be matched to it, so it is not run."""
    what = "has no id" if not call["id"] else f"shares its id with {count - 1} other call(s)"
    return ToolError(
        type="InvalidCallId",
        failure_class=FailureClass.STRUCTURAL,
        message=f"this tool call {what} in the same message, so its answer could not be "
        "told apart; it was not executed. Issue each call with its own id.",
        suggested_action="ask_human",
        retriable=False,
        tool=call["name"],
        call_id=call["id"] or None,
        context={"call_id": call["id"] or None, "duplicates": count if call["id"] else 0},
    )


def _budget_error(call: ToolCall, exhausted: ExhaustionReason) -> ToolError:
    return ToolError(
        type="BudgetExhausted",
        failure_class=FailureClass.TRANSIENT,
        message=f"the thread's {exhausted} budget is spent; the call was not executed",
        suggested_action="ask_human",
        retriable=False,
        tool=call["name"],
        call_id=call["id"],
        context={"exhausted": exhausted},
    )


def _invalid_call_error(invalid: Mapping[str, Any]) -> ToolError:
    return ToolError(
        type="InvalidToolCall",
        failure_class=FailureClass.SEMANTIC,
        message=f"the arguments are not valid JSON: {invalid.get('error') or 'unparseable'}",
        suggested_action="fix_args",
        retriable=False,
        tool=invalid.get("name") or "",
        call_id=invalid.get("id"),
        context={"args": redact(str(invalid.get("args") or ""), limit=200), "stage": "arguments"},
    )


def _split_output(
    output: Any, messages_key: str
) -> tuple[dict[str, ToolMessage], list[Command[Any]]]:
    """ToolNode returns ``{messages: [...]}`` or, when a tool returned a `Command`,
    a list mixing Commands and such dicts."""
    results: dict[str, ToolMessage] = {}
    commands: list[Command[Any]] = []
    items = output if isinstance(output, list) else [output]
    for item in items:
        if isinstance(item, Command):
            commands.append(item)
        elif isinstance(item, Mapping):
            for message in item.get(messages_key) or []:
                if isinstance(message, ToolMessage):
                    results[message.tool_call_id] = message
    return results, commands
