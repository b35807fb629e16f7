"""A side-effecting call's effect: its identity and claim, and its run with the keys.

The idempotency key is bound to the call's slot in the thread (its assistant message
and position, `_graph.tool_batch`), never to the provider's tool-call id, which
providers reuse; the tool runs with the key (and a batch call's per-item keys) in
context, so it can hand them to the service it calls, and at most once per attempt,
whatever a middleware inside ours does (`_OneRun`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import random
import uuid
import warnings
import weakref
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolCall, ToolMessage
from langgraph.prebuilt.tool_node import ToolCallRequest
from pydantic import ValidationError

from langgraph_resilience._graph.answers import tool_error_of
from langgraph_resilience._graph.exactly_once import Effect, effect_context
from langgraph_resilience._graph.in_flight import executing
from langgraph_resilience._graph.run_lease import current_run
from langgraph_resilience._graph.saved_step import step_to_save
from langgraph_resilience._graph.scope import STEP, StepScope
from langgraph_resilience._graph.state import call_slot
from langgraph_resilience.core.canonical import call_key
from langgraph_resilience.core.classification import Rule, classify
from langgraph_resilience.core.decision import retry_wait
from langgraph_resilience.core.effects import effect_identity, item_idempotency_key
from langgraph_resilience.core.policy import ResiliencePolicy
from langgraph_resilience.core.profile import ToolProfile
from langgraph_resilience.errors import FailureClass, ResilienceWarning
from langgraph_resilience.stores.effect_ledger import run_checkpointer

__all__ = ["EffectReading", "ascoped", "effect_of", "looked_since_unknown", "messages_of", "scoped"]


@dataclasses.dataclass(frozen=True, slots=True)
class EffectReading:
    """What a side effect's flow needs of its node beyond the call: which tools are
    reads (how the agent looks at the world), and how a failed status check, a read
    too, is retried."""

    is_read: Callable[[str], bool]
    policy: ResiliencePolicy
    rng: random.Random
    rules: Sequence[Rule]
    messages_key: str


_THREADLESS: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
"""A run without a thread (a graph compiled without a checkpointer) -> the identity its
effects are claimed under: each such invoke is a conversation of its own."""


def _thread_of(config: Mapping[str, Any]) -> str:
    """The thread a side effect belongs to: the config's, else the run's own, so that
    two threadless invokes asking for the same effect are two requests, not a repeat."""
    thread = (config.get("configurable") or {}).get("thread_id")
    if thread:
        return str(thread)
    run = current_run()
    if run is None:
        return ""
    try:
        return _THREADLESS.setdefault(run, f"run-{uuid.uuid4().hex}")
    except TypeError:  # a writer that cannot be weakly referenced: one shared identity
        return ""


def _same_message(
    call: ToolCall, slot: str, step: StepScope, thread_id: str, noise: Any
) -> frozenset[str]:
    """The keys of the other calls of `call`'s assistant message to the same tool (the
    only ones that can ask for the same effect)."""
    batch, keys = step.batch, set()
    for position, other in enumerate(batch.ai.tool_calls):
        other_slot = call_slot(batch.ai, batch.ai_index, position)
        if other["name"] == call["name"] and other_slot != slot:
            identity = effect_identity(
                other["name"],
                other["args"],
                thread_id=thread_id,
                call_identity=other_slot,
                noise_fields=noise,
            )
            keys.add(identity[0])
    return frozenset(keys)


def effect_of(
    call: ToolCall,
    request: ToolCallRequest,
    step: StepScope,
    profile: ToolProfile,
    reading: EffectReading,
    *,
    grace: float,
) -> Effect | None:
    """The idempotency key and claim arguments of a side-effecting call (None when the
    run has no ledger). The key is bound to the call's slot (its assistant message and
    position), not to the provider's id, which providers reuse."""
    if step.ledger is None:
        return None
    config = getattr(getattr(request, "runtime", None), "config", None) or {}
    thread_id = _thread_of(config)
    call_id, batch, noise = call["id"] or "", step.batch, reading.policy.noise_fields
    args = call["args"]
    slot = batch.slots.get(call_id, call_id)
    key, fingerprint, args_json = effect_identity(
        call["name"], args, thread_id=thread_id, call_identity=slot, noise_fields=noise
    )

    def looked() -> bool:
        history = messages_of(request, reading.messages_key)[: batch.ai_index]
        same = call_key(call["name"], args, noise_fields=noise)
        return looked_since_unknown(history, same, is_read=reading.is_read, noise=noise)

    def check_wait(error: BaseException, attempts: int) -> float | None:
        envelope = classify(error, tool=call["name"], rules=reading.rules)  # a read's rules
        if not envelope.retriable:
            return None
        limit = profile.max_attempts or reading.policy.max_attempts
        wait = retry_wait(
            envelope,
            attempts=attempts,
            max_attempts=limit,
            remaining=None,
            policy=reading.policy,
            rng=reading.rng,
        )
        return None if isinstance(wait, str) else wait

    return Effect(
        step.ledger,
        key,
        thread_id,
        args_json,
        profile,
        dict(args),
        fingerprint,
        may_execute=call_id not in batch.spent,
        approved=call_id in batch.approved,
        told_before=batch.told_before(),
        told_now=batch.told_now(),
        held=batch.held.get(batch.keys.get(call_id, ""), 0),
        same_message=functools.cache(
            functools.partial(_same_message, call, slot, step, thread_id, noise)
        ),
        grace=grace,
        looked=looked,
        check_wait=check_wait,
        saved_step=step_to_save(run_checkpointer(config), getattr(request, "runtime", None)),
    )


def messages_of(request: ToolCallRequest, messages_key: str) -> list[Any]:
    """The messages of the state a call runs in (a dict, or a state object)."""
    state = getattr(request, "state", None)
    found = (
        state.get(messages_key) if isinstance(state, dict) else getattr(state, messages_key, None)
    )
    return list(found) if isinstance(found, list) else []


def looked_since_unknown(
    messages: Sequence[BaseMessage],
    key: str,
    *,
    is_read: Callable[[str], bool],
    noise: frozenset[str] | Sequence[str],
) -> bool:
    """Whether, in the current task, the agent was told that a call with this `key`
    (tool + canonical arguments) has an unknown outcome and has since read the world:
    a read tool it called after that answer (in a later assistant message) answered,
    with a result or with the service's own refusal (an error such as "not found"
    says what is there; a transport failure says nothing: `_answered`). A later "unknown"
    answer for the same call starts over, so every re-issue must be preceded by its
    own look.

    `messages` ends before the assistant message that re-issues the call."""
    start = next(
        (i + 1 for i in range(len(messages) - 1, -1, -1) if isinstance(messages[i], HumanMessage)),
        0,
    )
    told_at: int | None = None
    looked = False
    asked_at = 0
    calls: dict[str, ToolCall] = {}
    for index in range(start, len(messages)):
        message = messages[index]
        if isinstance(message, AIMessage):
            calls = {c["id"] or "": c for c in message.tool_calls}
            asked_at = index
            continue
        if not isinstance(message, ToolMessage):
            continue
        call = calls.get(message.tool_call_id)
        if call is None:
            continue
        answered = message.status != "error"
        if not answered:
            error = tool_error_of(message)
            kind = None if error is None else error.failure_class
            if (
                kind is FailureClass.UNKNOWN
                and call_key(call["name"], call["args"], noise_fields=noise) == key
            ):
                told_at, looked = index, False
                continue
            answered = _answered(error)  # the service's own "not found" says what is there
        if answered and told_at is not None and asked_at > told_at and is_read(call["name"]):
            looked = True
    return looked


def _answered(error: Any) -> bool:
    """Whether a read's error is the service's answer, not a failure to reach it: not
    transient, not structural (gone), not a timeout or a maybe-executed drop."""
    if error is None:
        return False
    transport = error.failure_class in (FailureClass.TRANSIENT, FailureClass.STRUCTURAL)
    context = error.context or {}
    return not (transport or context.get("timeout") or context.get("maybe_executed"))


def _item_keys(call: ToolCall, effect: Effect) -> tuple[str, ...] | None:
    """Per-item keys of a side-effecting batch call: the first run's, on a redo."""
    step = STEP.get()
    if effect.profile.batch_arg is None or step is None:
        return None
    kept = step.batch.item_keys.get(call["id"] or "")
    if kept is not None:
        return tuple(kept)
    items = call["args"].get(effect.profile.batch_arg)
    count = len(items) if isinstance(items, list) else 0
    return tuple(item_idempotency_key(effect.key, index) for index in range(count))


def scoped(execute: Callable[..., Any], call: ToolCall, effect: Effect) -> Callable[..., Any]:
    """`execute` with the effect's keys in context (`current_idempotency_key`), its
    tool run at most once (`_OneRun`)."""
    items, step = _item_keys(call, effect), STEP.get()

    def run(request: ToolCallRequest) -> Any:
        once = _OneRun(request)
        with effect_context(effect.key, items), executing(effect.key), once.told():
            result = execute(once.request)
        return _note_item_keys(once.outcome(result), call, items, step)

    return run


def ascoped(
    execute: Callable[..., Awaitable[Any]], call: ToolCall, effect: Effect
) -> Callable[..., Awaitable[Any]]:
    """Async `scoped`."""
    items, step = _item_keys(call, effect), STEP.get()

    async def run(request: ToolCallRequest) -> Any:
        once = _OneRun(request)
        with effect_context(effect.key, items), executing(effect.key), once.told():
            result = await execute(once.request)
        return _note_item_keys(once.outcome(result), call, items, step)

    return run


class _OneRun:
    """A side effect's tool for one attempt: it runs once. A middleware inside ours
    (listed after `ResilienceMiddleware`, such as ``ToolRetryMiddleware``) that runs it
    again would repeat the effect under one claim; the repeat gets the first outcome
    instead, and the attempt ends with that outcome, which the exactly-once flow
    judges by its evidence."""

    def __init__(self, request: ToolCallRequest) -> None:
        self.tool, self.request = request.tool, request
        self.ran = self.repeated = False
        self.failure: BaseException | None = None
        self.value: Any = None
        if self.tool is not None:
            gated = self.tool.model_copy()  # same name, schema and description
            object.__setattr__(gated, "invoke", self._invoke)
            object.__setattr__(gated, "ainvoke", self._ainvoke)
            self.request = request.override(tool=gated)

    def _invoke(self, *args: Any, **kwargs: Any) -> Any:
        if self.ran:
            return self._replayed()
        self.ran = True
        try:
            self.value = self.tool.invoke(*args, **kwargs)  # type: ignore[union-attr]
        except BaseException as exc:
            self.failure = exc
            raise
        return self.value

    async def _ainvoke(self, *args: Any, **kwargs: Any) -> Any:
        if self.ran:
            return self._replayed()
        self.ran = True
        try:
            self.value = await self.tool.ainvoke(*args, **kwargs)  # type: ignore[union-attr]
        except BaseException as exc:
            self.failure = exc
            raise
        return self.value

    def _replayed(self) -> Any:
        self.repeated = True
        if self.failure is not None:
            raise self.failure
        return self.value

    def outcome(self, result: Any) -> Any:
        """The attempt's result, or the tool's own failure when a middleware inside ours
        answered in its place: a refused repeat, or an error `ToolMessage` made of the
        exception (``ToolErrorMiddleware``), which would hide from the exactly-once flow
        whether the effect may have run. Rejected arguments (a ``ValidationError``,
        which ToolNode answers itself) stay answered."""
        if self.failure is None:
            return result
        hidden = isinstance(result, ToolMessage) and result.status == "error"
        if self.repeated or (hidden and not isinstance(self.failure, ValidationError)):
            raise self.failure
        return result

    @contextlib.contextmanager
    def told(self) -> Iterator[None]:
        """Warn, however the attempt ends, that a repeat was refused."""
        try:
            yield
        finally:
            if self.repeated:
                name = self.request.tool_call["name"]
                warnings.warn(
                    "a middleware listed after ResilienceMiddleware in create_agent("
                    "middleware=[...]), such as ToolRetryMiddleware, ran the side-effecting "
                    f"tool {name!r} again within one exactly-once attempt: the repeat was "
                    "not run and got the first outcome; drop that retry for side effects "
                    "(ResilienceMiddleware retries them when the evidence says it is safe) "
                    "or list it before ResilienceMiddleware",
                    ResilienceWarning,
                    stacklevel=2,
                )


def _note_item_keys(
    result: Any, call: ToolCall, item_keys: tuple[str, ...] | None, step: StepScope | None
) -> Any:
    """Hand a batch call's item keys to the step (`CallOutcome`) for a redo."""
    if item_keys is not None and step is not None and isinstance(result, ToolMessage):
        step.outcome(call["id"]).item_keys = item_keys
    return result
