"""`resilient_model`: classified retry, a breaker per model and the fallback chain."""

from __future__ import annotations

import asyncio
import email.utils
import random
from typing import Any

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.errors import GraphInterrupt
from langgraph.graph import START, MessagesState, StateGraph
from pydantic import BaseModel

from langgraph_resilience.breaker import BreakerConfig, InMemoryBreakerStore
from langgraph_resilience.errors import (
    CircuitOpenError,
    ConfigurationError,
    FailureClass,
    ToolError,
)
from langgraph_resilience.model import (
    DEFAULT_FALLBACK_ON,
    ModelStep,
    ResilientChatModel,
    model_key,
    next_step,
    resilient_model,
)
from langgraph_resilience.policy import ResiliencePolicy
from langgraph_resilience.testing import (
    FakeClock,
    FakeHTTPError,
    ScriptedChatModel,
    text,
    tool_calls,
)
from tests.conftest import seeded_delays

SEED = 7


@pytest.fixture(params=["sync", "async"])
def mode(request: pytest.FixtureRequest) -> str:
    """Every model test runs through invoke() and through ainvoke()."""
    return str(request.param)


def ask(model: Any, mode: str, prompt: str = "hello") -> Any:
    """Invoke `model` through the sync or the async API."""
    if mode == "sync":
        return model.invoke(prompt)
    return asyncio.run(model.ainvoke(prompt))


def scripted(*responses: Any) -> ScriptedChatModel:
    """A scripted model: AIMessages are answers, exceptions are raised."""
    return ScriptedChatModel(responses=list(responses))


def build(
    primary: BaseChatModel, *fallbacks: BaseChatModel, clock: FakeClock, **kwargs: Any
) -> ResilientChatModel:
    """resilient_model with a fake clock and a seeded jitter source."""
    return resilient_model(primary, list(fallbacks), clock=clock, rng=random.Random(SEED), **kwargs)


# ------------------------------------------------------------------- acceptance


def test_429_then_500s_fall_back_after_exact_backoff(mode: str) -> None:
    """The primary raises 429 then 500s: it is retried max_attempts times with the
    package's backoff, then the fallback answers."""
    clock = FakeClock()
    primary = scripted(FakeHTTPError(429), FakeHTTPError(500), FakeHTTPError(500))
    fallback = scripted(text("from the fallback"))
    model = build(primary, fallback, clock=clock, policy=ResiliencePolicy(max_attempts=3))
    reply = ask(model, mode)
    assert reply.content == "from the fallback"
    assert (primary.calls, fallback.calls) == (3, 1)
    assert clock.sleeps == pytest.approx(seeded_delays(SEED, 2))


def test_401_is_not_retried_nor_hidden(mode: str) -> None:
    """A 401 on the primary is raised after one call: no retry, no fallback by default."""
    clock = FakeClock()
    primary = scripted(FakeHTTPError(401), text("never reached"))
    fallback = scripted(text("never used"))
    model = build(primary, fallback, clock=clock)
    with pytest.raises(FakeHTTPError) as info:
        ask(model, mode)
    assert info.value.status_code == 401
    assert (primary.calls, fallback.calls) == (1, 0)
    assert clock.sleeps == []


@pytest.mark.parametrize("status", [400, 401, 403])
def test_policy_fallback_is_opt_in_and_still_never_retries(mode: str, status: int) -> None:
    """With POLICY/SEMANTIC in fallback_on a 400/401/403 falls back, still with one call."""
    clock = FakeClock()
    primary = scripted(FakeHTTPError(status), text("never reached"))
    fallback = scripted(text("other provider"))
    model = build(
        primary,
        fallback,
        clock=clock,
        fallback_on={*DEFAULT_FALLBACK_ON, FailureClass.POLICY, FailureClass.SEMANTIC},
    )
    assert ask(model, mode).content == "other provider"
    assert (primary.calls, fallback.calls, clock.sleeps) == (1, 1, [])


def test_structural_failure_falls_back_without_retry(mode: str) -> None:
    """A 404 (model not found) is STRUCTURAL: straight to the fallback."""
    clock = FakeClock()
    primary = scripted(FakeHTTPError(404))
    fallback = scripted(text("served"))
    assert ask(build(primary, fallback, clock=clock), mode).content == "served"
    assert (primary.calls, clock.sleeps) == (1, [])


def test_transient_recovery_on_the_primary(mode: str) -> None:
    """A transient error followed by success never touches the fallback."""
    clock = FakeClock()
    primary = scripted(TimeoutError("read timed out"), text("primary again"))
    fallback = scripted()
    assert ask(build(primary, fallback, clock=clock), mode).content == "primary again"
    assert (primary.calls, fallback.calls) == (2, 0)
    assert clock.sleeps == pytest.approx(seeded_delays(SEED, 1))


def test_retry_after_is_honoured(mode: str) -> None:
    """A 429's Retry-After replaces the jittered backoff."""
    clock = FakeClock()
    primary = scripted(FakeHTTPError(429, headers={"Retry-After": "2"}), text("ok"))
    assert ask(build(primary, clock=clock), mode).content == "ok"
    assert clock.sleeps == [2.0]


def test_http_date_retry_after_is_read_on_the_injected_clock(mode: str) -> None:
    """An HTTP-date Retry-After is measured from the fake clock's wall time."""
    clock = FakeClock()
    when = email.utils.formatdate(clock.time() + 3, usegmt=True)
    primary = scripted(FakeHTTPError(503, headers={"Retry-After": when}), text("ok"))
    assert ask(build(primary, clock=clock), mode).content == "ok"
    assert clock.sleeps == [3.0]


def test_long_retry_after_goes_to_the_fallback_instead_of_waiting(mode: str) -> None:
    """A Retry-After beyond max_delay is not waited for when a fallback exists."""
    clock = FakeClock()
    primary = scripted(FakeHTTPError(429, headers={"Retry-After": "120"}))
    fallback = scripted(text("now"))
    model = build(primary, fallback, clock=clock, policy=ResiliencePolicy(max_delay=30))
    assert ask(model, mode).content == "now"
    assert (primary.calls, clock.sleeps) == (1, [])


def test_deadline_stops_retrying(mode: str) -> None:
    """A wait that would not end within the deadline is not started."""
    clock = FakeClock()
    primary = scripted(FakeHTTPError(429, headers={"Retry-After": "5"}))
    model = build(primary, clock=clock, policy=ResiliencePolicy(deadline=3.0))
    with pytest.raises(FakeHTTPError):
        ask(model, mode)
    assert (primary.calls, clock.sleeps) == (1, [])


# ---------------------------------------------------------------------- breakers


def test_breaker_skips_a_dead_primary_then_probes_it(mode: str) -> None:
    """Once the primary's breaker opens, calls go straight to the fallback (the primary
    is not called); after open_duration one probe reaches it and closes the breaker."""
    clock = FakeClock()
    dead = [FakeHTTPError(503)] * 4
    primary = scripted(*dead, text("primary is back"))
    fallback = scripted(text("fb 1"), text("fb 2"), text("fb 3"))
    store = InMemoryBreakerStore()
    model = build(
        primary,
        fallback,
        clock=clock,
        policy=ResiliencePolicy(max_attempts=2),
        breaker=BreakerConfig(minimum_calls=4, window_size=4, open_duration=60.0),
        store=store,
    )
    assert [ask(model, mode).content for _ in range(2)] == ["fb 1", "fb 2"]
    assert primary.calls == 4
    key = model.keys[0]
    assert store.snapshot(key).status == "open"
    assert ask(model, mode).content == "fb 3"
    assert primary.calls == 4  # skipped: not executed while open
    clock.advance(60.0)
    assert ask(model, mode).content == "primary is back"
    assert store.snapshot(key).status == "closed"
    assert store.snapshot(model.keys[1]).status == "closed"


def test_every_model_open_raises_circuit_open(mode: str) -> None:
    """With every breaker open the call fails fast with CircuitOpenError, chained to the cause."""
    clock = FakeClock()
    cfg = BreakerConfig(minimum_calls=1, window_size=1, open_duration=10.0)
    primary = scripted(FakeHTTPError(503))
    fallback = scripted(FakeHTTPError(502))
    model = build(
        primary, fallback, clock=clock, policy=ResiliencePolicy(max_attempts=1), breaker=cfg
    )
    with pytest.raises(FakeHTTPError) as first:
        ask(model, mode)
    assert first.value.status_code == 502
    assert any("no model answered" in note for note in first.value.__notes__)
    with pytest.raises(CircuitOpenError) as info:
        ask(model, mode)
    assert info.value.key == model.keys[1]
    assert info.value.retry_after == 10.0
    assert isinstance(info.value.__cause__, CircuitOpenError)
    assert (primary.calls, fallback.calls) == (1, 1)


def test_breaker_opening_mid_retry_stops_the_retries(mode: str) -> None:
    """When the model's own failures open its breaker, the next retry is not executed:
    CircuitOpenError is raised, caused by the last real error."""
    clock = FakeClock()
    cfg = BreakerConfig(minimum_calls=2, window_size=2, open_duration=60.0)
    primary = scripted(FakeHTTPError(503), FakeHTTPError(502), text("never"))
    model = build(primary, clock=clock, breaker=cfg, policy=ResiliencePolicy(max_attempts=5))
    with pytest.raises(CircuitOpenError) as info:
        ask(model, mode)
    assert primary.calls == 2
    assert isinstance(info.value.__cause__, FakeHTTPError)
    assert info.value.__cause__.status_code == 502
    assert clock.sleeps == pytest.approx(seeded_delays(SEED, 1))  # no wait for a refusal


def test_breaker_keys_are_per_model() -> None:
    """Each model gets its own key; named models by name, unnamed ones by position."""
    primary, fallback = scripted(), scripted()
    model = resilient_model(primary, [fallback])
    assert model.keys == ["model:ScriptedChatModel:#0", "model:ScriptedChatModel:#1"]

    class Named(ScriptedChatModel):
        model_name: str = "gpt-test"

    assert model_key(Named(responses=[]), 3) == "model:Named:gpt-test"
    custom = resilient_model(primary, [fallback], keys=["openai", "anthropic"])
    assert custom.keys == ["openai", "anthropic"]


def test_breakers_can_be_disabled(mode: str) -> None:
    """breaker=None: no admission, only classified retry and fallback."""
    clock = FakeClock()
    primary = scripted(*[FakeHTTPError(503)] * 6)
    fallback = scripted(text("a"), text("b"))
    store = InMemoryBreakerStore()
    model = build(
        primary,
        fallback,
        clock=clock,
        breaker=None,
        store=store,
        policy=ResiliencePolicy(max_attempts=3),
    )
    assert [ask(model, mode).content for _ in range(2)] == ["a", "b"]
    assert primary.calls == 6
    assert store.snapshot(model.keys[0]).window is None


def test_interrupt_propagates_and_releases_the_probe(mode: str) -> None:
    """A GraphInterrupt from a model is control flow: re-raised, its probe permit returned."""
    clock = FakeClock()
    cfg = BreakerConfig(minimum_calls=1, window_size=1, open_duration=1.0)
    primary = scripted(FakeHTTPError(503), GraphInterrupt(()), text("after"))
    store = InMemoryBreakerStore()
    policy = ResiliencePolicy(max_attempts=1)
    model = build(primary, clock=clock, breaker=cfg, store=store, policy=policy)
    with pytest.raises(FakeHTTPError):
        ask(model, mode)  # opens the breaker (1 failed call is the whole window)
    clock.advance(1.0)
    with pytest.raises(GraphInterrupt):
        ask(model, mode)
    assert store.snapshot(model.keys[0]).permits == 0
    assert ask(model, mode).content == "after"


def test_unknown_errors_are_raised_not_retried(mode: str) -> None:
    """An exception nobody recognizes is UNKNOWN: raised at once, never retried."""
    clock = FakeClock()
    primary = scripted(KeyError("bug"), text("never"))
    fallback = scripted(text("never either"))
    with pytest.raises(KeyError):
        ask(build(primary, fallback, clock=clock), mode)
    assert (primary.calls, fallback.calls) == (1, 0)


# ------------------------------------------------------------- bind_tools & co.


@tool
def search(query: str) -> str:
    """Search the web."""
    return query


def test_bind_tools_binds_every_model_and_keeps_the_resilience(mode: str) -> None:
    """bind_tools binds on each model of the chain; the bound model still falls back."""
    clock = FakeClock()
    primary = scripted(FakeHTTPError(503), FakeHTTPError(503), FakeHTTPError(503))
    fallback = scripted(tool_calls(("search", {"query": "x"})))
    bound = build(primary, fallback, clock=clock).bind_tools([search], tool_choice="auto")
    assert isinstance(bound, ResilientChatModel)
    reply = ask(bound, mode)
    assert reply.tool_calls[0]["name"] == "search"
    assert primary.bound_tools == [{"tools": ["search"], "tool_choice": "auto"}]
    assert fallback.bound_tools == primary.bound_tools


def test_bind_tools_on_a_model_without_tool_calling_fails_clearly() -> None:
    """A model that cannot bind tools is named in a ConfigurationError."""

    class NoTools(BaseChatModel):
        @property
        def _llm_type(self) -> str:
            return "no-tools"

        def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    model = resilient_model(scripted(), [NoTools()])
    with pytest.raises(ConfigurationError, match=r"model:NoTools:#1 does not support"):
        model.bind_tools([search])


class Answer(BaseModel):
    """A structured answer."""

    value: int


def test_with_structured_output_works_through_the_chain(mode: str) -> None:
    """with_structured_output parses the fallback's tool call into the schema."""
    clock = FakeClock()
    primary = scripted(FakeHTTPError(404))
    fallback = scripted(tool_calls(("Answer", {"value": 42})))
    structured = build(primary, fallback, clock=clock).with_structured_output(Answer)
    assert ask(structured, mode) == Answer(value=42)


def test_messages_stream_shows_only_the_final_reply() -> None:
    """In a graph streamed with stream_mode="messages", failed attempts are invisible:
    the reply is streamed once."""
    clock = FakeClock()
    primary = scripted(FakeHTTPError(503), text("final answer"))
    model = build(primary, clock=clock)

    def agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_edge(START, "agent")
    app = builder.compile()
    inputs: MessagesState = {"messages": [HumanMessage("hi")]}
    chunks = list(app.stream(inputs, stream_mode="messages"))
    streamed = [message for message, _ in chunks if isinstance(message, AIMessage)]
    assert [m.content for m in streamed] == ["final answer"]


# --------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    ("kwargs", "hint"),
    [
        ({"primary": "gpt-4o"}, "primary must be a langchain BaseChatModel"),
        ({"fallbacks": [object()]}, "fallbacks[0] must be a langchain BaseChatModel"),
        ({"policy": {"max_attempts": 3}}, "policy must be a ResiliencePolicy"),
        ({"breaker": {"minimum_calls": 3}}, "breaker must be a BreakerConfig"),
        ({"store": object()}, "store must implement BreakerStore"),
        ({"fallback_on": ["sometimes"]}, "fallback_on must be a collection"),
        ({"keys": ["only-one"]}, "one non-empty breaker key per model"),
    ],
)
def test_bad_configuration_fails_at_construction(kwargs: dict[str, Any], hint: str) -> None:
    """Misconfiguration raises ConfigurationError saying what to pass instead."""
    arguments: dict[str, Any] = {"primary": scripted(), "fallbacks": [scripted()], **kwargs}
    with pytest.raises(ConfigurationError) as info:
        resilient_model(arguments.pop("primary"), arguments.pop("fallbacks"), **arguments)
    assert hint in str(info.value)


# ----------------------------------------------------------------- next_step


def envelope(failure_class: str, *, retry_after_ms: int | None = None) -> ToolError:
    """A classified model error."""
    return ToolError(
        type="HTTPError",
        failure_class=failure_class,
        message="x",
        suggested_action="retry",
        retriable=failure_class == "transient",
        retry_after_ms=retry_after_ms,
    )


@pytest.mark.parametrize(
    ("error", "attempt", "has_fallback", "elapsed", "expected"),
    [
        (envelope("transient"), 0, True, 0.0, ("retry", "transient")),
        (envelope("transient"), 2, True, 0.0, ("fallback", "max_attempts")),
        (envelope("transient"), 2, False, 0.0, ("raise", "max_attempts")),
        (envelope("transient"), 0, True, 100.0, ("fallback", "deadline")),
        (
            envelope("transient", retry_after_ms=60_000),
            0,
            True,
            0.0,
            ("fallback", "retry_after_too_long"),
        ),
        (envelope("transient", retry_after_ms=60_000), 0, False, 0.0, ("retry", "transient")),
        (envelope("structural"), 0, True, 0.0, ("fallback", "structural")),
        (envelope("policy"), 0, True, 0.0, ("raise", "policy")),
        (envelope("semantic"), 0, True, 0.0, ("raise", "semantic")),
        (envelope("unknown"), 0, True, 0.0, ("raise", "unknown")),
    ],
)
def test_next_step_table(
    error: ToolError, attempt: int, has_fallback: bool, elapsed: float, expected: tuple[str, str]
) -> None:
    """The pure decision: retry TRANSIENT within budget, fall back on the configured
    classes when a next model exists, raise everything else."""
    policy = ResiliencePolicy(max_attempts=3, deadline=100.0, max_delay=30.0)
    step = next_step(
        error,
        attempt=attempt,
        policy=policy,
        rng=random.Random(SEED),
        elapsed=elapsed,
        has_fallback=has_fallback,
    )
    assert (step.action, step.reason) == expected
    if step.action == "retry" and error.retry_after_ms is None:
        assert step == ModelStep("retry", seeded_delays(SEED, 1)[0], "transient")
