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
chat model. The decision step here is one pure function, `core.decision.decide_model`
(on the same retry rule as tools), and the call sequence one `core.flow` flow
(`ResilientChatModel.flow`) driven by the package's one sync and one async driver.

Streaming is real (``stream`` yields the model's chunks as they come): a failure
before the first chunk is retried or falls back like any other, so a reader never
sees the partial output of a failed attempt; one after it is raised, as the model
itself would. One call is one chat-model run for callbacks and tracing (usage is
counted once): the underlying attempts run without the caller's callbacks, and
are seen through this package's events (``model_retry``, ``model_fallback``, ...).
``with_structured_output`` is each model's own (its ``method=``), behind the same
retry, breakers and fallbacks.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import itertools
import random
import warnings
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from typing import Any, Literal

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.language_models.base import LangSmithParams
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableBinding, RunnableConfig
from langgraph.errors import GraphBubbleUp
from pydantic import ConfigDict, InstanceOf

from langgraph_resilience._graph.model_streaming import (
    Ask,
    ResilientRunnable,
    afirst_chunk,
    as_chunk,
    first_chunk,
)
from langgraph_resilience.core.breaker import BreakerConfig, BreakerStore, Outcome
from langgraph_resilience.core.classification import classify
from langgraph_resilience.core.clock import Clock, SystemClock
from langgraph_resilience.core.decision import DEFAULT_FALLBACK_ON, Decision, decide_model
from langgraph_resilience.core.flow import Call, Flow, Sleep, adrive, drive
from langgraph_resilience.core.policy import ResiliencePolicy
from langgraph_resilience.core.redaction import redact
from langgraph_resilience.errors import (
    CircuitOpenError,
    ConfigurationError,
    FailureClass,
    ResilienceWarning,
    ToolError,
)
from langgraph_resilience.events import Event, emit
from langgraph_resilience.stores.breakers import InMemoryBreakerStore

__all__ = [
    "DEFAULT_FALLBACK_ON",
    "ResilientChatModel",
    "ResilientRunnable",
    "decide_model",
    "model_key",
    "resilient_model",
]


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


# ------------------------------------------------------------------ the flow


@dataclasses.dataclass(frozen=True, slots=True)
class _Result:
    """How one attempt on one model ended."""

    message: Any
    """The model's reply (a message, or the agent handler's `ModelResponse`)."""
    error: Exception | None
    duration: float
    finished_at: float
    """The clock's monotonic time when the call ended."""
    wall: float
    """The clock's wall time then (for HTTP-date Retry-After headers)."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Failed:
    """An attempt that failed, classified once, with what was decided about it."""

    error: Exception
    envelope: ToolError
    step: Decision
    attempts: int
    """Attempts made on this model in this call, the failed one included."""
    probe: bool
    duration: float


def _refused(key: str, retry_after: float, previous: Exception | None) -> CircuitOpenError:
    """A model skipped because its breaker is open (after `previous`, when a retry found
    it opened meanwhile)."""
    refused = CircuitOpenError(key, retry_after)
    refused.__cause__ = previous
    emit(
        Event("model_skipped", model=key, reason="circuit_open", retry_after=round(retry_after, 6))
    )
    return refused


def _give_up(failures: list[tuple[str, BaseException]]) -> BaseException:
    """The exception to raise when no model answered: the last one, annotated once (a
    client may raise one stored exception every time: its notes must not pile up)."""
    last = failures[-1][1]
    summary = "; ".join(f"{key}: {type(error).__name__}: {error}" for key, error in failures)
    note = redact(f"resilient_model: no model answered ({summary})", limit=None)
    if note not in getattr(last, "__notes__", ()):
        last.add_note(note)
    if isinstance(last, CircuitOpenError) and last.__cause__ is None and len(failures) > 1:
        last.__cause__ = failures[-2][1]
    return last


class ResilientChatModel(BaseChatModel):
    """A chat model that is a chain of models with classified retry and breakers.

    Build it with `resilient_model`. It is a real `BaseChatModel`: ``invoke``,
    ``stream`` (real chunks), ``batch``, ``bind_tools`` (a `RunnableBinding`) and
    ``with_structured_output`` (each model's own ``method=``) work, and its LangSmith
    parameters are its primary model's.
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
        return RunnableBinding(bound=self.model_copy(update={"chain": bound}), kwargs={})

    def with_structured_output(
        self, schema: dict[str, Any] | type, *, include_raw: bool = False, **kwargs: Any
    ) -> Runnable[LanguageModelInput, Any]:
        """Each model's own ``with_structured_output(schema, method=..., ...)``, asked in
        the chain's order with the same retry, breakers and fallbacks."""
        chain = [
            model.with_structured_output(schema, include_raw=include_raw, **kwargs)
            for model in self.models
        ]
        return ResilientRunnable(owner=self, chain=chain)

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        """The primary model's (provider, model name, temperature, ...)."""
        return self.models[0]._get_ls_params(stop=stop, **kwargs)

    # ------------------------------------------------------------------ flow

    def flow(self, started: float, ask: Ask) -> Flow[Any]:
        """The call sequence as `core.flow` actions; returns the reply or raises.
        `started` is the clock's monotonic time when the call began (its deadline).

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
        for index in range(len(self.chain)):
            reply = yield from self._on_model(started, ask, index, failures)
            if reply is not None:
                return reply
        raise _give_up(failures)

    def _on_model(
        self, started: float, ask: Ask, index: int, failures: list[tuple[str, BaseException]]
    ) -> Flow[Any]:
        """Attempts on one model: its reply, or None after a failure it falls back on."""
        key, attempts, previous = self.keys[index], 0, None
        while True:
            probe = False
            if self.breaker is not None:
                admission = yield Call(
                    self.store.acquire, self.store.aacquire, (key, self.breaker, self.clock.time())
                )
                if not admission.allowed:
                    failures.append((key, _refused(key, admission.retry_after, previous)))
                    return None
                probe = admission.probe
            result: _Result = yield Call(self._invoke, self._ainvoke, (ask, index, probe))
            attempts += 1
            if result.error is None and result.message is not None:
                if self.breaker is not None:
                    yield self._store_call(key, None, probe, result.duration)
                if failures:
                    served = [k for k, _ in failures]
                    emit(Event("model_fallback_served", model=key, after=served))
                return result.message
            failed = self._judge(started, index, attempts, probe, result)
            if not (yield from self._after_failure(key, failed, failures)):
                return None
            previous = failed.error

    def _judge(
        self, started: float, index: int, attempts: int, probe: bool, result: _Result
    ) -> _Failed:
        """Classify a failed attempt once and decide what follows it."""
        key = self.keys[index]
        error = result.error or RuntimeError(f"{key} returned no message")
        envelope = classify(error, tool=key, attempt=attempts, now=result.wall)
        step = decide_model(
            envelope,
            attempts=attempts,
            policy=self.policy,
            rng=self.rng,
            elapsed=result.finished_at - started,
            has_fallback=index < len(self.chain) - 1,
            fallback_on=self.fallback_on,
        )
        return _Failed(error, envelope, step, attempts, probe, result.duration)

    def _after_failure(
        self, key: str, failed: _Failed, failures: list[tuple[str, BaseException]]
    ) -> Flow[bool]:
        """Carry out the decision on a failed attempt: True to retry the model, False to
        fall back; a failure that is raised leaves the flow."""
        step, failure_class, attempts = failed.step, failed.envelope.failure_class, failed.attempts
        if self.breaker is not None and (failed.probe or step.route != "retry"):
            # The call leaves this model with this failure, or a probe decides now.
            transition = yield self._store_call(key, failure_class, failed.probe, failed.duration)
            if step.route == "retry" and transition is not None and transition.target == "open":
                # The failed probe reopened the breaker: a retry would be refused.
                refused = CircuitOpenError(key, self.breaker.open_duration_s)
                refused.__cause__ = failed.error
                failures.append((key, refused))
                emit(Event("model_skipped", model=key, reason="circuit_opened"))
                return False
        if step.route == "retry":
            delay = round(step.delay, 6)
            emit(
                Event(
                    "model_retry",
                    model=key,
                    attempt=attempts,
                    delay=delay,
                    failure_class=failure_class.value,
                )
            )
            yield Sleep(step.delay)
            return True
        failures.append((key, failed.error))
        emit(
            Event(
                "model_fallback" if step.route == "fallback" else "model_gave_up",
                model=key,
                attempts=attempts,
                failure_class=failure_class.value,
                reason=step.reason,
            )
        )
        if step.route == "fallback":
            return False
        raise _give_up(failures) if len(failures) > 1 else failed.error

    def _store_call(self, key: str, outcome: Outcome, probe: bool, duration: float) -> Call:
        """Record one call's outcome on a model's breaker."""
        store, args = self.store, (key, self.breaker, self.clock.time(), outcome)
        return Call(store.record, store.arecord, args, {"probe": probe, "duration": duration})

    # --------------------------------------------------------------- one attempt

    def _invoke(self, ask: Ask, index: int, probe: bool) -> _Result:
        """Ask one model; a failure is returned, an interrupt gives the permit back."""
        started = self.clock.monotonic()
        try:
            message = ask.sync(index)
        except GraphBubbleUp:
            self._release(index, probe)
            raise
        except Exception as exc:
            return self._result(None, exc, started)
        except BaseException:
            self._release(index, probe)
            raise
        return self._result(message, None, started)

    async def _ainvoke(self, ask: Ask, index: int, probe: bool) -> _Result:
        """Async `_invoke` (a cancelled call gives its permit back, shielded)."""
        started = self.clock.monotonic()
        try:
            message = await ask.asynchronous(index)
        except GraphBubbleUp:
            await self._arelease(index, probe)
            raise
        except Exception as exc:
            return self._result(None, exc, started)
        except BaseException:  # cancelled: no outcome, give the permit back
            await asyncio.shield(self._arelease(index, probe))
            raise
        return self._result(message, None, started)

    def _result(self, message: Any, error: Exception | None, started: float) -> _Result:
        ended = self.clock.monotonic()
        return _Result(message, error, ended - started, ended, self.clock.time())

    def _release(self, index: int, probe: bool) -> None:
        if self.breaker is not None:
            self.store.release(self.keys[index], self.breaker, self.clock.time(), probe=probe)

    async def _arelease(self, index: int, probe: bool) -> None:
        if self.breaker is not None:
            await self.store.arelease(
                self.keys[index], self.breaker, self.clock.time(), probe=probe
            )

    def _ask(self, messages: list[BaseMessage], stop: list[str] | None, kwargs: Any) -> Ask:
        def sync(index: int) -> Any:
            return self.chain[index].invoke(messages, _ATTEMPT, stop=stop, **kwargs)

        async def asynchronous(index: int) -> Any:
            return await self.chain[index].ainvoke(messages, _ATTEMPT, stop=stop, **kwargs)

        return Ask(sync, asynchronous)

    def _ask_stream(self, messages: list[BaseMessage], stop: list[str] | None, kwargs: Any) -> Ask:
        """An attempt that succeeds once the model's first chunk arrives."""

        def sync(index: int) -> Any:
            return first_chunk(self.chain[index].stream(messages, _ATTEMPT, stop=stop, **kwargs))

        async def asynchronous(index: int) -> Any:
            chunks = self.chain[index].astream(messages, _ATTEMPT, stop=stop, **kwargs)
            return await afirst_chunk(chunks)

        return Ask(sync, asynchronous)

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        ask = self._ask_stream(messages, stop, kwargs)
        first, rest = drive(self.flow(self.clock.monotonic(), ask), self.clock)
        for chunk in itertools.chain([first], rest):
            yield ChatGenerationChunk(message=as_chunk(chunk))

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        ask = self._ask_stream(messages, stop, kwargs)
        first, rest = await adrive(self.flow(self.clock.monotonic(), ask), self.clock)
        yield ChatGenerationChunk(message=as_chunk(first))
        async for chunk in rest:
            yield ChatGenerationChunk(message=as_chunk(chunk))

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        ask = self._ask(messages, stop, kwargs)
        message = drive(self.flow(self.clock.monotonic(), ask), self.clock)
        return ChatResult(generations=[ChatGeneration(message=message)])

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        ask = self._ask(messages, stop, kwargs)
        message = await adrive(self.flow(self.clock.monotonic(), ask), self.clock)
        return ChatResult(generations=[ChatGeneration(message=message)])


_ATTEMPT: RunnableConfig = {"callbacks": []}
"""An attempt's config: none of the caller's callbacks. The call is one chat-model run
(this model's); its attempts would count the tokens twice and stream a failed
attempt's partial output."""


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
