"""Resilient chat models: classified retry, a breaker per model, and a fallback chain.

`resilient_model(primary, fallbacks=[...])` wraps the agent's own chat models
into one `BaseChatModel`, so it drops into a normal agent node::

    model = resilient_model(
        ChatOpenAI(model="gpt-4o", max_retries=0),
        [ChatAnthropic(model="claude-sonnet-4-5", max_retries=0)],
    )
    agent = model.bind_tools(tools)          # bound on every model of the chain

Per call, each model of the chain in order is asked through its breaker; an
error is classified (`classify`): TRANSIENT errors are retried with the
package's backoff (`retry.backoff_delay`, through the injected clock, honouring
Retry-After up to ``policy.max_retry_after``) up to ``policy.max_attempts``; a
400/401/403 is never retried. A model whose breaker is open, whose retries ran
out, or which failed in a class of `fallback_on` hands the call to the next
model. Anything else (a POLICY refusal, a SEMANTIC error of our own request) is
raised at once: by default a 401 is never hidden behind a fallback, as
DESIGN.md says of POLICY failures.

A model's breaker counts *calls*, not attempts: each call of the wrapper
records one outcome per model it reached, success when an attempt on that
model succeeded, else the failure class with which the call left it (gave up
or fell back). Retried attempts record nothing, so a call's own recovered
blips never open a breaker; only a half-open probe records at once, because
deciding is what a probe is for. A lone model has no breaker by default: with
nothing to route to, failing fast would only replace the provider's real error
with `CircuitOpenError`.

The wrapped models should not retry on their own: a client's ``max_retries=2``
under ``max_attempts=3`` makes 9 requests of one call, blind to the
classification, the Retry-After cap and the breakers. `resilient_model` warns
(`ResilienceWarning`) for every model with ``max_retries > 0``; construct it with
``max_retries=0``.

Why not langchain-core's ``with_retry`` / ``with_fallbacks``: ``with_retry``
retries by exception *type* with its own wall-clock sleeps, so it cannot tell a
429 from a 401 raised as the same provider exception class, cannot honour
Retry-After, and ignores the injected clock; ``with_fallbacks`` falls through
on any exception. Neither counts outcomes, so a dead primary would still be
called (and retried) on every turn, and both return a runnable rather than a
chat model. The decision step here is one pure function, `next_step`, and the
call sequence one generator (`ResilientChatModel._flow`) driven by a sync and
an async driver that differ only in ``invoke``/``ainvoke``, ``sleep``/``asleep``
and the store's sync/async methods (the pattern of httpx's ``auth_flow``).

Streaming yields the whole reply at once: streaming tokens through a chain that
may retry would show the user the partial output of a failed attempt.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import random
import warnings
from collections.abc import Generator, Iterable, Sequence
from typing import Any, Literal

from langchain_core.callbacks import (
    AsyncCallbackManager,
    AsyncCallbackManagerForLLMRun,
    CallbackManager,
    CallbackManagerForLLMRun,
)
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable, RunnableConfig
from langgraph.constants import TAG_NOSTREAM
from langgraph.errors import GraphBubbleUp
from pydantic import ConfigDict, InstanceOf

from langgraph_resilience.core.backoff import backoff_delay, retry_after_exceeded
from langgraph_resilience.core.classify import classify
from langgraph_resilience.core.clock import Clock, SystemClock
from langgraph_resilience.core.policy import ResiliencePolicy
from langgraph_resilience.errors import (
    CircuitOpenError,
    ConfigurationError,
    FailureClass,
    ResilienceWarning,
    ToolError,
)
from langgraph_resilience.events import Event, emit
from langgraph_resilience.stores.breakers import (
    Admission,
    BreakerConfig,
    BreakerStore,
    InMemoryBreakerStore,
    Outcome,
    Transition,
)

__all__ = [
    "DEFAULT_FALLBACK_ON",
    "ModelStep",
    "ResilientChatModel",
    "model_key",
    "next_step",
    "resilient_model",
]

DEFAULT_FALLBACK_ON = frozenset({FailureClass.TRANSIENT, FailureClass.STRUCTURAL})
"""Failure classes that hand a call to the next model: an overloaded or missing model.
Add POLICY to fall back on a provider's 401/403/quota refusal too."""


class _Default(enum.Enum):
    """The type of `resilient_model`'s default ``breaker=``, told apart from None (off)."""

    BREAKER = "default"

    def __repr__(self) -> str:
        return "<BreakerConfig() with fallbacks, None for a lone model>"


def model_key(model: BaseChatModel, index: int) -> str:
    """The breaker key of a model: ``model:<class>:<model name>``, or the chain
    position when the model has no name (two unnamed models must not share one).

    >>> from langgraph_resilience.testing import ScriptedChatModel
    >>> model_key(ScriptedChatModel(responses=[]), 0)
    'model:ScriptedChatModel:#0'
    """
    for attribute in ("model_name", "model", "model_id", "deployment_name"):
        name = getattr(model, attribute, None)
        if isinstance(name, str) and name:
            return f"model:{type(model).__name__}:{name}"
    return f"model:{type(model).__name__}:#{index}"


# ------------------------------------------------------------------ pure decision


@dataclasses.dataclass(frozen=True, slots=True)
class ModelStep:
    """What to do after a model call failed."""

    action: Literal["retry", "fallback", "raise"]
    delay: float = 0.0
    """Seconds to wait before the retry."""
    reason: str = ""
    """``transient`` (a retry), else why the model was left: ``max_attempts``,
    ``deadline``, ``retry_after`` (a Retry-After beyond ``policy.max_retry_after``
    and no fallback), ``retry_after_too_long`` (a Retry-After not waited for
    because a fallback can serve the call), or the failure class that decided."""


def next_step(
    error: ToolError,
    *,
    attempt: int,
    policy: ResiliencePolicy,
    rng: random.Random,
    elapsed: float,
    has_fallback: bool,
    fallback_on: frozenset[FailureClass] = DEFAULT_FALLBACK_ON,
) -> ModelStep:
    """Decide the next step after an attempt on one model failed.

    `attempt` is 0-based: the index of the attempt that just failed on this model
    in this call (0 for its first call), so ``attempt + 1`` attempts have been
    made; the retry it may schedule waits ``backoff_delay(attempt, ...)`` (retry
    number `attempt`, 0-based, in `backoff_delay`'s terms). Everything reported
    outside is 1-based, as for tools: the envelope's ``error.attempt`` and the
    ``attempts`` of the ``model_fallback`` / ``model_gave_up`` events count the
    attempts made (``attempt + 1``), and a ``model_retry`` event's ``attempt`` is
    the number of the attempt that failed.

    Retriable (TRANSIENT) errors are retried with `backoff_delay` while
    ``policy.max_attempts`` and ``policy.deadline`` allow. A server's Retry-After
    is slept only up to ``policy.max_retry_after``: a longer one falls back when
    the next model can take the call (``retry_after_too_long``), else it is
    raised (``retry_after``), never slept. When the next model can take the call
    a Retry-After longer than ``policy.max_delay`` is not waited for either; and
    no wait is started that would not end before the deadline (``deadline``). A
    failure that is not retried falls back when its class is in `fallback_on`
    and a next model exists, else it is raised.

    >>> err = ToolError(type="HTTPError", failure_class="policy", message="401",
    ...                 suggested_action="ask_human", retriable=False)
    >>> next_step(err, attempt=0, policy=ResiliencePolicy(), rng=random.Random(0),
    ...           elapsed=0.0, has_fallback=True).action
    'raise'
    """
    reason = error.failure_class.value
    can_fall_back = has_fallback and error.failure_class in fallback_on
    if error.retriable:
        remaining = None if policy.deadline_s is None else policy.deadline_s - elapsed
        retry_after = None if error.retry_after_ms is None else error.retry_after_ms / 1000.0
        if attempt + 1 >= policy.max_attempts:
            reason = "max_attempts"
        elif remaining is not None and remaining <= 0:
            reason = "deadline"
        elif retry_after_exceeded(retry_after, policy):
            reason = "retry_after_too_long" if can_fall_back else "retry_after"
        elif can_fall_back and retry_after is not None and retry_after > policy.max_delay_s:
            reason = "retry_after_too_long"
        else:
            delay = backoff_delay(
                attempt, policy=policy, rng=rng, retry_after=retry_after, remaining=remaining
            )
            if delay is not None:
                return ModelStep("retry", delay, "transient")
            reason = "deadline"
    if can_fall_back:
        return ModelStep("fallback", reason=reason)
    return ModelStep("raise", reason=reason)


# ------------------------------------------------------- the flow and its actions


@dataclasses.dataclass(frozen=True, slots=True)
class _Acquire:
    index: int


@dataclasses.dataclass(frozen=True, slots=True)
class _Invoke:
    index: int
    probe: bool


@dataclasses.dataclass(frozen=True, slots=True)
class _Record:
    index: int
    outcome: Outcome
    probe: bool
    duration: float


@dataclasses.dataclass(frozen=True, slots=True)
class _Sleep:
    seconds: float


@dataclasses.dataclass(frozen=True, slots=True)
class _Result:
    message: BaseMessage | None
    error: Exception | None
    duration: float
    finished_at: float
    """The clock's monotonic time when the call ended."""
    wall: float
    """The clock's wall time then (for HTTP-date Retry-After headers)."""


_Action = _Acquire | _Invoke | _Record | _Sleep
_Flow = Generator[_Action, Any, BaseMessage]


def _give_up(failures: list[tuple[str, BaseException]]) -> BaseException:
    """The exception to raise when no model answered: the last one, annotated."""
    last = failures[-1][1]
    summary = "; ".join(f"{key}: {type(error).__name__}: {error}" for key, error in failures)
    last.add_note(f"resilient_model: no model answered ({summary})")
    if isinstance(last, CircuitOpenError) and last.__cause__ is None and len(failures) > 1:
        last.__cause__ = failures[-2][1]
    return last


class ResilientChatModel(BaseChatModel):
    """A chat model that is a chain of models with classified retry and breakers.

    Build it with `resilient_model`. It is a real `BaseChatModel`: ``invoke``,
    ``ainvoke``, ``batch``, ``bind_tools`` and ``with_structured_output`` work,
    and callbacks/tracing see each underlying model call as a child run.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    models: list[InstanceOf[BaseChatModel]]
    """The models as given: primary first, then the fallbacks in order."""
    chain: list[InstanceOf[Runnable[Any, Any]]]
    """What is called: `models`, or each model with tools bound (`bind_tools`)."""
    keys: list[str]
    """The breaker key of each model."""
    policy: InstanceOf[ResiliencePolicy]
    breaker: InstanceOf[BreakerConfig] | None
    """The breaker of each model (one outcome per call), or None: no breakers."""
    store: InstanceOf[BreakerStore]
    clock: InstanceOf[Clock]
    rng: InstanceOf[random.Random]
    fallback_on: frozenset[FailureClass]

    @property
    def _llm_type(self) -> str:
        return "resilient"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"models": list(self.keys)}

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Any],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind `tools` on every model of the chain (each through its own
        ``bind_tools``), keeping the retry, the breakers and the fallbacks."""
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
        bound: list[Runnable[Any, Any]] = []
        for key, model in zip(self.keys, self.models, strict=True):
            try:
                bound.append(model.bind_tools(tools, **kwargs))
            except NotImplementedError as exc:
                raise ConfigurationError(
                    f"{key} does not support tool calling (bind_tools); remove it from the "
                    "chain or use a tool-calling model"
                ) from exc
        return self.model_copy(update={"chain": bound})

    # ------------------------------------------------------------------ flow

    def _flow(self, started: float) -> _Flow:
        """The call sequence as actions for a driver; returns the reply or raises.

        Every attempt asks the model's breaker first (another call may have
        opened it meanwhile), but the breaker hears of this call once per model:
        the outcome with which the call left that model (a reply, or the failure
        that gave up or fell back), with the duration of that last attempt. A
        retried attempt records nothing and its admission needs no release: only
        a half-open probe's admission holds a permit, and a probe records its
        outcome at once, so it is never retried unrecorded. A call refused by
        the breaker records nothing either (an open breaker ignores outcomes).
        """
        failures: list[tuple[str, BaseException]] = []
        last = len(self.chain) - 1
        for index, key in enumerate(self.keys):
            attempt, previous = 0, None
            while True:
                probe = False
                if self.breaker is not None:
                    admission: Admission = yield _Acquire(index)
                    if not admission.allowed:
                        refused = CircuitOpenError(key, admission.retry_after)
                        refused.__cause__ = previous  # the attempt before, opened meanwhile
                        failures.append((key, refused))
                        emit(
                            Event(
                                "model_skipped",
                                model=key,
                                reason="circuit_open",
                                retry_after=round(admission.retry_after, 6),
                            )
                        )
                        break
                    probe = admission.probe
                result: _Result = yield _Invoke(index, probe)
                if result.error is None and result.message is not None:
                    if self.breaker is not None:
                        yield _Record(index, None, probe, result.duration)
                    if failures:
                        emit(
                            Event(
                                "model_fallback_served", model=key, after=[k for k, _ in failures]
                            )
                        )
                    return result.message
                error = result.error or RuntimeError(f"{key} returned no message")
                envelope = classify(error, tool=key, attempt=attempt + 1, now=result.wall)
                step = next_step(
                    envelope,
                    attempt=attempt,
                    policy=self.policy,
                    rng=self.rng,
                    elapsed=result.finished_at - started,
                    has_fallback=index < last,
                    fallback_on=self.fallback_on,
                )
                if self.breaker is not None and (probe or step.action != "retry"):
                    # The call leaves this model with this failure, or a probe decides now.
                    transition: Transition | None = yield _Record(
                        index, envelope.failure_class, probe, result.duration
                    )
                    reopened = transition is not None and transition.target == "open"
                    if step.action == "retry" and reopened:
                        # The failed probe reopened the breaker: a retry would be refused.
                        refused = CircuitOpenError(key, self.breaker.open_duration_s)
                        refused.__cause__ = error
                        failures.append((key, refused))
                        emit(Event("model_skipped", model=key, reason="circuit_opened"))
                        break
                if step.action == "retry":
                    emit(
                        Event(
                            "model_retry",
                            model=key,
                            attempt=attempt + 1,
                            delay=round(step.delay, 6),
                            failure_class=envelope.failure_class.value,
                        )
                    )
                    yield _Sleep(step.delay)
                    attempt, previous = attempt + 1, error
                    continue
                failures.append((key, error))
                emit(
                    Event(
                        "model_fallback" if step.action == "fallback" else "model_gave_up",
                        model=key,
                        attempts=attempt + 1,
                        failure_class=envelope.failure_class.value,
                        reason=step.reason,
                    )
                )
                if step.action == "fallback":
                    break
                raise _give_up(failures) if len(failures) > 1 else error
        raise _give_up(failures)

    # --------------------------------------------------------------- drivers

    def _drive(
        self,
        messages: list[BaseMessage],
        config: RunnableConfig | None,
        stop: list[str] | None,
        kwargs: dict[str, Any],
    ) -> BaseMessage:
        clock, store, cfg = self.clock, self.store, self.breaker
        flow = self._flow(clock.monotonic())
        reply: Any = None
        try:
            while True:
                action = flow.send(reply)
                reply = None
                if isinstance(action, _Acquire):
                    assert cfg is not None
                    reply = store.acquire(self.keys[action.index], cfg, clock.time())
                elif isinstance(action, _Invoke):
                    key, started = self.keys[action.index], clock.monotonic()
                    try:
                        message = self.chain[action.index].invoke(
                            messages, config, stop=stop, **kwargs
                        )
                    except GraphBubbleUp:
                        if cfg is not None:
                            store.release(key, cfg, clock.time(), probe=action.probe)
                        raise
                    except Exception as exc:
                        ended = clock.monotonic()
                        reply = _Result(None, exc, ended - started, ended, clock.time())
                    except BaseException:
                        if cfg is not None:
                            store.release(key, cfg, clock.time(), probe=action.probe)
                        raise
                    else:
                        ended = clock.monotonic()
                        reply = _Result(message, None, ended - started, ended, clock.time())
                elif isinstance(action, _Record):
                    assert cfg is not None
                    reply = store.record(
                        self.keys[action.index],
                        cfg,
                        clock.time(),
                        action.outcome,
                        probe=action.probe,
                        duration=action.duration,
                    )
                else:
                    clock.sleep(action.seconds)
        except StopIteration as done:
            result: BaseMessage = done.value
            return result

    async def _adrive(
        self,
        messages: list[BaseMessage],
        config: RunnableConfig | None,
        stop: list[str] | None,
        kwargs: dict[str, Any],
    ) -> BaseMessage:
        clock, store, cfg = self.clock, self.store, self.breaker
        flow = self._flow(clock.monotonic())
        reply: Any = None
        try:
            while True:
                action = flow.send(reply)
                reply = None
                if isinstance(action, _Acquire):
                    assert cfg is not None
                    reply = await store.aacquire(self.keys[action.index], cfg, clock.time())
                elif isinstance(action, _Invoke):
                    key, started = self.keys[action.index], clock.monotonic()
                    try:
                        message = await self.chain[action.index].ainvoke(
                            messages, config, stop=stop, **kwargs
                        )
                    except GraphBubbleUp:
                        if cfg is not None:
                            await store.arelease(key, cfg, clock.time(), probe=action.probe)
                        raise
                    except Exception as exc:
                        ended = clock.monotonic()
                        reply = _Result(None, exc, ended - started, ended, clock.time())
                    except BaseException:  # cancelled: no outcome, give the permit back
                        if cfg is not None:
                            await asyncio.shield(
                                store.arelease(key, cfg, clock.time(), probe=action.probe)
                            )
                        raise
                    else:
                        ended = clock.monotonic()
                        reply = _Result(message, None, ended - started, ended, clock.time())
                elif isinstance(action, _Record):
                    assert cfg is not None
                    reply = await store.arecord(
                        self.keys[action.index],
                        cfg,
                        clock.time(),
                        action.outcome,
                        probe=action.probe,
                        duration=action.duration,
                    )
                else:
                    await clock.asleep(action.seconds)
        except StopIteration as done:
            result: BaseMessage = done.value
            return result

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        message = self._drive(messages, _child_config(run_manager), stop, kwargs)
        return ChatResult(generations=[ChatGeneration(message=message)])

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        message = await self._adrive(messages, _child_config(run_manager), stop, kwargs)
        return ChatResult(generations=[ChatGeneration(message=message)])


def _child_config(
    run_manager: CallbackManagerForLLMRun | AsyncCallbackManagerForLLMRun | None,
) -> RunnableConfig | None:
    """Callbacks for the underlying model calls: nested under our run (tracing shows
    every attempt), and tagged ``nostream`` so LangGraph's ``messages`` stream shows
    only the final reply, never the partial output of a failed attempt."""
    if run_manager is None:
        return None
    manager: CallbackManager | AsyncCallbackManager = (
        AsyncCallbackManager(handlers=[], parent_run_id=run_manager.run_id)
        if isinstance(run_manager, AsyncCallbackManagerForLLMRun)
        else CallbackManager(handlers=[], parent_run_id=run_manager.run_id)
    )
    manager.set_handlers(run_manager.inheritable_handlers)
    manager.add_tags(run_manager.inheritable_tags)
    manager.add_metadata(run_manager.inheritable_metadata)
    manager.add_tags([TAG_NOSTREAM], inherit=False)
    return {"callbacks": manager}


def _own_retries(model: BaseChatModel) -> int:
    """How often `model`'s own client retries a failed request: its integer
    ``max_retries`` (ChatOpenAI, ChatAnthropic, ...); when that is
    None (ChatOpenAI's default, which leaves the openai SDK's own default of 2),
    the ``max_retries`` of the client it built. 0 when it says nothing."""
    retries = getattr(model, "max_retries", None)
    if retries is None:
        for attribute in ("root_client", "root_async_client"):
            retries = getattr(getattr(model, attribute, None), "max_retries", None)
            if retries is not None:
                break
    if isinstance(retries, bool) or not isinstance(retries, int):
        return 0
    return retries


def _warn_of_own_retries(
    models: Sequence[BaseChatModel], keys: Sequence[str], policy: ResiliencePolicy
) -> None:
    """One `ResilienceWarning` per model that retries on its own under our retries."""
    for model, key in zip(models, keys, strict=True):
        retries = _own_retries(model)
        if retries > 0:
            warnings.warn(
                f"{key} retries failed requests on its own (max_retries={retries}) under "
                f"resilient_model's retries, so one call can make up to "
                f"{policy.max_attempts * (retries + 1)} requests to it, retried blind to the "
                "failure class, the Retry-After cap, the breaker and the injected clock; "
                f"construct it with max_retries=0 (e.g. {type(model).__name__}(..., "
                "max_retries=0)): its client is built at construction, so changing the "
                "attribute afterwards does not stop its retries",
                ResilienceWarning,
                stacklevel=3,
            )


def resilient_model(
    primary: BaseChatModel,
    fallbacks: Sequence[BaseChatModel] = (),
    *,
    policy: ResiliencePolicy | None = None,
    breaker: BreakerConfig | Literal[_Default.BREAKER] | None = _Default.BREAKER,
    store: BreakerStore | None = None,
    clock: Clock | None = None,
    rng: random.Random | None = None,
    fallback_on: Iterable[FailureClass] = DEFAULT_FALLBACK_ON,
    keys: Sequence[str] | None = None,
) -> ResilientChatModel:
    """Wrap `primary` and its `fallbacks` into one resilient `BaseChatModel`.

    Construct the wrapped models with ``max_retries=0`` (e.g.
    ``ChatOpenAI(model="gpt-4o", max_retries=0)``): their clients' own retries
    would multiply ours (``max_retries=2`` under ``max_attempts=3``: 9 requests
    for one call). A `ResilienceWarning` names every model whose integer
    ``max_retries`` is above 0 (or, when it is None as ChatOpenAI's default is,
    whose built client's is); its client is built at construction, so only
    constructing the model anew with ``max_retries=0`` fixes it.

    Args:
        primary: the model to use while it works.
        fallbacks: models tried in order when the one before it is open,
            exhausted its retries, or failed in a class of `fallback_on`.
        policy: ``max_attempts``, backoff (``base_delay``, ``max_delay``), the
            longest Retry-After slept (``max_retry_after``) and ``deadline`` of
            each call; `ResiliencePolicy()` by default.
        breaker: the breaker of each model, which counts one outcome per call
            (not per attempt). By default a `BreakerConfig()` when there are
            fallbacks, and none for a lone `primary`: with nothing to route to,
            failing fast would only replace the provider's own error with
            `CircuitOpenError`. None disables breakers; a `BreakerConfig` is
            always used, a lone model's too.
        store: where the breakers live; a new `InMemoryBreakerStore` by default.
            Pass a shared one (e.g. `PostgresBreakerStore`) so all workers learn
            of an outage together.
        clock: time for backoff waits and breaker decisions; `SystemClock()`.
        rng: jitter source; a fresh `random.Random()`.
        fallback_on: failure classes that fall through to the next model.
        keys: breaker keys, one per model; `model_key` by default.

    >>> from langgraph_resilience.testing import ScriptedChatModel, FakeClock, text
    >>> model = resilient_model(ScriptedChatModel(responses=[text("hi")]), clock=FakeClock())
    >>> model.invoke("hello").content
    'hi'
    >>> model.breaker is None  # a lone model: no breaker unless one is passed
    True
    """
    models = [primary, *fallbacks]
    for position, model in enumerate(models):
        if not isinstance(model, BaseChatModel):
            role = "primary" if position == 0 else f"fallbacks[{position - 1}]"
            raise ConfigurationError(
                f"{role} must be a langchain BaseChatModel (e.g. ChatOpenAI(...)), got "
                f"{type(model).__name__}; configure the model itself instead of wrapping it"
            )
    if policy is not None and not isinstance(policy, ResiliencePolicy):
        raise ConfigurationError(f"policy must be a ResiliencePolicy, got {policy!r}")
    if breaker is _Default.BREAKER:
        breaker = BreakerConfig() if len(models) > 1 else None
    elif breaker is not None and not isinstance(breaker, BreakerConfig):
        raise ConfigurationError(f"breaker must be a BreakerConfig or None, got {breaker!r}")
    if store is not None and not isinstance(store, BreakerStore):
        raise ConfigurationError(
            f"store must implement BreakerStore (e.g. InMemoryBreakerStore), got {store!r}"
        )
    try:
        fall = frozenset(FailureClass(c) for c in fallback_on)
    except (TypeError, ValueError):
        raise ConfigurationError(
            f"fallback_on must be a collection of FailureClass values, got {fallback_on!r}"
        ) from None
    if keys is None:
        keys = [model_key(model, index) for index, model in enumerate(models)]
    elif len(keys) != len(models) or not all(isinstance(k, str) and k for k in keys):
        raise ConfigurationError(
            f"keys must give one non-empty breaker key per model ({len(models)}), got {keys!r}"
        )
    policy = policy or ResiliencePolicy()
    _warn_of_own_retries(models, keys, policy)
    return ResilientChatModel(
        models=models,
        chain=list(models),
        keys=list(keys),
        policy=policy,
        breaker=breaker,
        store=store if store is not None else InMemoryBreakerStore(),
        clock=clock or SystemClock(),
        rng=rng or random.Random(),
        fallback_on=fall,
    )
