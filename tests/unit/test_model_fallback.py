"""`resilient_model`: classified retry, a breaker per model and the fallback chain."""

from __future__ import annotations

import asyncio
import email.utils
import logging
import random
import types
import warnings
from typing import Any

import pytest
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.runnables import RunnableBinding
from langchain_core.tools import tool
from langgraph.errors import GraphInterrupt
from langgraph.graph import START, MessagesState, StateGraph
from pydantic import BaseModel

from langgraph_resilience._graph import model as model_module
from langgraph_resilience._graph.model import (
    ResilientChatModel,
    model_key,
    resilient_model,
)
from langgraph_resilience.core.breaker import BreakerConfig
from langgraph_resilience.core.decision import DEFAULT_FALLBACK_ON, Decision, decide_model
from langgraph_resilience.core.policy import ResiliencePolicy
from langgraph_resilience.core.windows import CountWindow
from langgraph_resilience.errors import (
    CircuitOpenError,
    ConfigurationError,
    FailureClass,
    ResilienceWarning,
    ToolError,
)
from langgraph_resilience.stores.breakers import InMemoryBreakerStore
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


def events(caplog: pytest.LogCaptureFixture, kind: str) -> list[dict[str, Any]]:
    """The fields of every `kind` event logged so far (events are logged at INFO)."""
    found: list[dict[str, Any]] = []
    for record in caplog.records:
        args = record.args
        if record.name == "langgraph_resilience" and isinstance(args, tuple) and len(args) == 2:
            name, fields = args
            if name == kind and isinstance(fields, dict):
                found.append(dict(fields))
    return found


def window(store: InMemoryBreakerStore, key: str) -> tuple[int, int]:
    """(calls, failures) in the closed breaker's count window."""
    state = store.snapshot(key)
    assert isinstance(state.window, CountWindow)
    return state.window.calls, state.window.failures


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


def test_retry_after_beyond_max_retry_after_is_raised_at_once_on_a_lone_model(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A Retry-After of a day is never slept: with no fallback the error is raised at
    once, given up for ``retry_after`` (not for the deadline)."""
    clock = FakeClock()
    primary = scripted(FakeHTTPError(429, headers={"Retry-After": "86400"}), text("never"))
    model = build(primary, clock=clock)
    with (
        caplog.at_level(logging.INFO, logger="langgraph_resilience"),
        pytest.raises(FakeHTTPError) as info,
    ):
        ask(model, mode)
    assert info.value.status_code == 429
    assert (primary.calls, clock.sleeps) == (1, [])
    assert [e["reason"] for e in events(caplog, "model_gave_up")] == ["retry_after"]


def test_retry_after_beyond_max_retry_after_falls_back(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """With a fallback, a Retry-After past max_retry_after (here below max_delay) hands
    the call over without waiting, for ``retry_after_too_long``."""
    clock = FakeClock()
    primary = scripted(FakeHTTPError(503, headers={"Retry-After": "20"}))
    fallback = scripted(text("now"))
    policy = ResiliencePolicy(max_delay=30, max_retry_after=10)
    model = build(primary, fallback, clock=clock, policy=policy)
    with caplog.at_level(logging.INFO, logger="langgraph_resilience"):
        assert ask(model, mode).content == "now"
    assert (primary.calls, clock.sleeps) == (1, [])
    assert [e["reason"] for e in events(caplog, "model_fallback")] == ["retry_after_too_long"]


def test_retry_after_up_to_max_retry_after_is_slept_on_a_lone_model(mode: str) -> None:
    """The cap is inclusive: a Retry-After of exactly max_retry_after is waited for."""
    clock = FakeClock()
    primary = scripted(FakeHTTPError(429, headers={"Retry-After": "120"}), text("ok"))
    model = build(primary, clock=clock, policy=ResiliencePolicy(max_retry_after=120))
    assert ask(model, mode).content == "ok"
    assert clock.sleeps == [120.0]


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
    """Once the primary's breaker opens (after two failed calls of two attempts each:
    it counts calls), calls go straight to the fallback (the primary is not called);
    after open_duration one probe reaches it and closes the breaker."""
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
        breaker=BreakerConfig(minimum_calls=2, window_size=2, open_duration=60.0),
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


def test_a_stored_exception_is_annotated_once(mode: str) -> None:
    """A client that raises one stored exception each time (its connection marked down)
    gets one note on it, however often every model fails: notes do not pile up."""
    down = ConnectionRefusedError("models.example: connection refused")
    model = build(
        scripted(*[down] * 5),
        scripted(*[down] * 5),
        clock=FakeClock(),
        policy=ResiliencePolicy(max_attempts=1),
        breaker=None,
    )
    for _ in range(5):
        with pytest.raises(ConnectionRefusedError):
            ask(model, mode)
    assert len(down.__notes__) == 1


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


def test_a_failed_probe_reopens_at_once_and_is_not_retried(mode: str) -> None:
    """A half-open probe records its outcome at once: a failed probe reopens the breaker,
    so its retry is not executed; CircuitOpenError is raised, caused by the probe's error."""
    clock = FakeClock()
    cfg = BreakerConfig(minimum_calls=1, window_size=1, open_duration=60.0)
    primary = scripted(*[FakeHTTPError(503)] * 3, FakeHTTPError(502), text("never"))
    store = InMemoryBreakerStore()
    policy = ResiliencePolicy(max_attempts=3)
    model = build(primary, clock=clock, breaker=cfg, store=store, policy=policy)
    with pytest.raises(FakeHTTPError) as gave_up:
        ask(model, mode)  # three attempts, one failed call: that opens a window of one
    assert gave_up.value.status_code == 503
    assert store.snapshot(model.keys[0]).status == "open"
    with pytest.raises(CircuitOpenError):
        ask(model, mode)  # refused without calling the model
    assert primary.calls == 3
    clock.advance(60.0)
    with pytest.raises(CircuitOpenError) as info:
        ask(model, mode)  # the probe fails: reopened at once, not retried
    assert primary.calls == 4
    assert isinstance(info.value.__cause__, FakeHTTPError)
    assert info.value.__cause__.status_code == 502
    assert store.snapshot(model.keys[0]).status == "open"
    assert clock.sleeps == pytest.approx(seeded_delays(SEED, 2))  # the first call's only


def test_a_breaker_opened_meanwhile_refuses_the_retry(mode: str) -> None:
    """Every attempt asks the breaker: when other calls opened it during our backoff,
    the retry is refused with CircuitOpenError, caused by our last real error."""
    clock = FakeClock()
    cfg = BreakerConfig(minimum_calls=1, window_size=1, open_duration=60.0)
    store = InMemoryBreakerStore()

    def others_fail_meanwhile(messages: list[BaseMessage]) -> AIMessage:
        store.record("model:lone", cfg, clock.time(), FailureClass.TRANSIENT)  # another call
        raise FakeHTTPError(503)

    primary = scripted(others_fail_meanwhile, text("never"))
    model = build(primary, clock=clock, breaker=cfg, store=store, keys=["model:lone"])
    with pytest.raises(CircuitOpenError) as info:
        ask(model, mode)
    assert primary.calls == 1
    assert isinstance(info.value.__cause__, FakeHTTPError)
    assert info.value.__cause__.status_code == 503


# ------------------------------------------- breakers count calls, not attempts


def test_a_lone_model_has_no_breaker_by_default(mode: str) -> None:
    """With nothing to route to, a lone model is never locked out: three calls that each
    recover from a 500 blip are never refused, and a later 401 is raised as the 401."""
    clock = FakeClock()
    primary = scripted(*[FakeHTTPError(500), text("recovered")] * 3, FakeHTTPError(401))
    store = InMemoryBreakerStore()
    model = build(primary, clock=clock, store=store)
    assert model.breaker is None
    assert [ask(model, mode).content for _ in range(3)] == ["recovered"] * 3
    with pytest.raises(FakeHTTPError) as info:
        ask(model, mode)
    assert info.value.status_code == 401
    assert primary.calls == 7
    assert store.snapshot(model.keys[0]).window is None  # never asked


def test_a_chain_gets_a_breaker_by_default_and_an_explicit_one_always_wins() -> None:
    """With fallbacks the default breaker stays a BreakerConfig(); breaker=None turns it
    off, and an explicit BreakerConfig is honoured for a lone model too."""
    cfg = BreakerConfig(minimum_calls=2, window_size=2)
    assert resilient_model(scripted(), [scripted()]).breaker == BreakerConfig()
    assert resilient_model(scripted(), [scripted()], breaker=None).breaker is None
    assert resilient_model(scripted(), breaker=cfg).breaker is cfg
    assert resilient_model(scripted(), breaker=None).breaker is None


def test_recovered_blips_on_a_lone_model_with_a_breaker_are_successes(mode: str) -> None:
    """An explicit breaker on a lone model counts each call once: three calls that each
    recover from a 500 are three successes, and a call that gives up is one failure,
    raised as the provider's error, not as CircuitOpenError."""
    clock = FakeClock()
    primary = scripted(*[FakeHTTPError(500), text("recovered")] * 3, *[FakeHTTPError(503)] * 3)
    store = InMemoryBreakerStore()
    cfg = BreakerConfig(window_size=10, minimum_calls=3, failure_rate_threshold=0.5)
    policy = ResiliencePolicy(max_attempts=3)
    model = build(primary, clock=clock, store=store, breaker=cfg, policy=policy)
    assert [ask(model, mode).content for _ in range(3)] == ["recovered"] * 3
    assert window(store, model.keys[0]) == (3, 0)
    with pytest.raises(FakeHTTPError) as info:
        ask(model, mode)
    assert info.value.status_code == 503
    assert window(store, model.keys[0]) == (4, 1)
    assert store.snapshot(model.keys[0]).status == "closed"


def test_one_call_recovering_on_the_primary_records_one_success(mode: str) -> None:
    """The primary fails 503, 503, then answers: its breaker hears of one call, a success."""
    clock = FakeClock()
    primary = scripted(FakeHTTPError(503), FakeHTTPError(503), text("third time lucky"))
    fallback = scripted()
    store = InMemoryBreakerStore()
    model = build(
        primary,
        fallback,
        clock=clock,
        store=store,
        breaker=BreakerConfig(window_size=10, minimum_calls=2),
        policy=ResiliencePolicy(max_attempts=3),
    )
    assert ask(model, mode).content == "third time lucky"
    assert window(store, model.keys[0]) == (1, 0)
    assert store.snapshot(model.keys[1]).window is None  # the fallback was not reached


def test_a_dead_primary_opens_after_minimum_calls_calls_not_attempts(mode: str) -> None:
    """A primary that keeps failing records one TRANSIENT failure per call, when the call
    falls back: with minimum_calls=3 it opens on the third call (nine attempts), not
    on the third attempt of the first call; then it is skipped."""
    clock = FakeClock()
    primary = scripted(*[FakeHTTPError(503)] * 9)
    fallback = scripted(*[text(f"fb {n}") for n in range(4)])
    store = InMemoryBreakerStore()
    model = build(
        primary,
        fallback,
        clock=clock,
        store=store,
        breaker=BreakerConfig(window_size=3, minimum_calls=3, open_duration=60.0),
        policy=ResiliencePolicy(max_attempts=3),
    )
    key = model.keys[0]
    for calls in (1, 2):
        assert ask(model, mode).content == f"fb {calls - 1}"
        assert (primary.calls, window(store, key)) == (3 * calls, (calls, calls))
        assert store.snapshot(key).status == "closed"
    assert ask(model, mode).content == "fb 2"
    assert (primary.calls, store.snapshot(key).status) == (9, "open")
    assert ask(model, mode).content == "fb 3"
    assert primary.calls == 9  # skipped while open


def test_the_failure_that_leaves_a_model_is_the_one_recorded(mode: str) -> None:
    """A 503 retried, then a 404 that falls back: the breaker records the STRUCTURAL 404
    once; a 503 retried, then a 400 raised: the SEMANTIC 400 is recorded, which the
    breaker ignores (neither success nor failure)."""
    clock = FakeClock()
    primary = scripted(
        FakeHTTPError(503), FakeHTTPError(404), FakeHTTPError(503), FakeHTTPError(400)
    )
    fallback = scripted(text("served"))
    store = InMemoryBreakerStore()
    cfg = BreakerConfig(window_size=10, minimum_calls=10)
    model = build(primary, fallback, clock=clock, store=store, breaker=cfg)
    assert ask(model, mode).content == "served"
    assert window(store, model.keys[0]) == (1, 1)
    with pytest.raises(FakeHTTPError) as info:
        ask(model, mode)
    assert info.value.status_code == 400
    assert window(store, model.keys[0]) == (1, 1)


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
    assert isinstance(bound, RunnableBinding)  # as every chat model's bind_tools returns
    assert isinstance(bound.bound, ResilientChatModel)
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
    assert "".join(str(m.content) for m in streamed) == "final answer"  # once, and only it


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


# ----------------------------------------------------------------- decide_model


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
        (
            envelope("transient", retry_after_ms=86_400_000),
            0,
            False,
            0.0,
            ("raise", "retry_after"),
        ),
        (
            envelope("transient", retry_after_ms=86_400_000),
            0,
            True,
            0.0,
            ("fallback", "retry_after_too_long"),
        ),
        (
            envelope("transient", retry_after_ms=86_400_000),
            2,
            False,
            0.0,
            ("raise", "max_attempts"),
        ),
        (envelope("structural"), 0, True, 0.0, ("fallback", "structural")),
        (envelope("policy"), 0, True, 0.0, ("raise", "policy")),
        (envelope("semantic"), 0, True, 0.0, ("raise", "semantic")),
        (envelope("unknown"), 0, True, 0.0, ("raise", "unknown")),
    ],
)
def test_decide_model_table(
    error: ToolError, attempt: int, has_fallback: bool, elapsed: float, expected: tuple[str, str]
) -> None:
    """The pure decision: retry TRANSIENT within budget, fall back on the configured
    classes when a next model exists, raise everything else."""
    policy = ResiliencePolicy(max_attempts=3, deadline=100.0, max_delay=30.0)
    step = decide_model(
        error,
        attempts=attempt + 1,
        policy=policy,
        rng=random.Random(SEED),
        elapsed=elapsed,
        has_fallback=has_fallback,
    )
    assert (step.route, step.reason) == expected
    if step.route == "retry" and error.retry_after_ms is None:
        assert step == Decision("retry", delay=seeded_delays(SEED, 1)[0], reason="transient")


@pytest.mark.parametrize(
    ("retry_after_ms", "has_fallback", "fallback_on", "expected"),
    [
        (20_000, True, DEFAULT_FALLBACK_ON, ("fallback", "retry_after_too_long", 0.0)),
        (20_000, False, DEFAULT_FALLBACK_ON, ("raise", "retry_after", 0.0)),
        # the next model cannot take a TRANSIENT failure: as good as no fallback
        (20_000, True, frozenset({FailureClass.STRUCTURAL}), ("raise", "retry_after", 0.0)),
        (10_000, False, DEFAULT_FALLBACK_ON, ("retry", "transient", 10.0)),
        (8_000, True, frozenset({FailureClass.STRUCTURAL}), ("retry", "transient", 8.0)),
        (6_000, True, DEFAULT_FALLBACK_ON, ("fallback", "retry_after_too_long", 0.0)),
    ],
)
def test_decide_model_caps_retry_after_at_max_retry_after(
    retry_after_ms: int,
    has_fallback: bool,
    fallback_on: frozenset[FailureClass],
    expected: tuple[str, str, float],
) -> None:
    """A Retry-After past max_retry_after is never slept (fall back, else raise), even when
    it is below max_delay; a wait within the cap is the server's, except that a model
    that can hand the call to the next one does not wait longer than max_delay."""
    policy = ResiliencePolicy(base_delay=0.5, max_delay=5.0, max_retry_after=10.0)
    step = decide_model(
        envelope("transient", retry_after_ms=retry_after_ms),
        attempts=1,
        policy=policy,
        rng=random.Random(SEED),
        elapsed=0.0,
        has_fallback=has_fallback,
        fallback_on=fallback_on,
    )
    assert (step.route, step.reason, step.delay) == expected


def test_decide_model_counts_attempts_as_the_envelope_and_the_events_do(
    mode: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """One convention, the tools' one: `decide_model` is given the attempts made (the
    failed one included), the envelope it decides on counts them the same (as
    ToolError.attempt does for tools), and so do the events."""
    seen: list[tuple[int, int]] = []

    def spy(error: ToolError, *, attempts: int, **kwargs: Any) -> Decision:
        seen.append((attempts, error.attempt))
        return decide_model(error, attempts=attempts, **kwargs)

    monkeypatch.setattr(model_module, "decide_model", spy)
    clock = FakeClock()
    primary = scripted(*[FakeHTTPError(503)] * 3)
    fallback = scripted(text("served"))
    model = build(primary, fallback, clock=clock, policy=ResiliencePolicy(max_attempts=3))
    with caplog.at_level(logging.INFO, logger="langgraph_resilience"):
        assert ask(model, mode).content == "served"
    assert seen == [(1, 1), (2, 2), (3, 3)]
    assert [e["attempt"] for e in events(caplog, "model_retry")] == [1, 2]
    assert [e["attempts"] for e in events(caplog, "model_fallback")] == [3]
    assert clock.sleeps == pytest.approx(seeded_delays(SEED, 2))  # retries 0 and 1


# ------------------------------------------------------- models that retry on their own


class SelfRetrying(ScriptedChatModel):
    """A provider model whose client retries on its own, as ChatOpenAI's does."""

    max_retries: int = 2


class ClientRetrying(ScriptedChatModel):
    """ChatOpenAI's shape: max_retries None, the built client's own default counts."""

    max_retries: int | None = None
    root_client: Any = None


def test_a_model_retrying_on_its_own_is_warned_of() -> None:
    """max_retries=2 under max_attempts=3 is 9 requests per call: one ResilienceWarning
    names the model, the product and the fix, pointing at the caller."""
    with pytest.warns(ResilienceWarning) as caught:
        model = resilient_model(SelfRetrying(responses=[]), clock=FakeClock())
    assert len(caught) == 1
    message = str(caught[0].message)
    assert model.keys[0] in message
    assert "max_retries=2" in message
    assert "up to 9 requests" in message
    assert "construct it with max_retries=0" in message
    assert caught[0].filename == __file__


def test_each_self_retrying_model_of_a_chain_is_named() -> None:
    """One warning per model that retries on its own, each naming its model."""
    client = types.SimpleNamespace(max_retries=2)  # openai.OpenAI's default
    with pytest.warns(ResilienceWarning) as caught:
        model = resilient_model(
            SelfRetrying(responses=[], max_retries=1),
            [ClientRetrying(responses=[], root_client=client), scripted()],
            keys=["openai", "azure", "local"],
            policy=ResiliencePolicy(max_attempts=2),
        )
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2
    assert messages[0].startswith("openai ")
    assert "max_retries=1" in messages[0]
    assert messages[1].startswith("azure ")
    assert "max_retries=2" in messages[1]
    assert "up to 6 requests" in messages[1]
    assert model.keys == ["openai", "azure", "local"]


@pytest.mark.parametrize(
    "model",
    [
        SelfRetrying(responses=[], max_retries=0),
        ClientRetrying(responses=[]),
        ClientRetrying(responses=[], root_client=types.SimpleNamespace(max_retries=0)),
        ScriptedChatModel(responses=[]),
    ],
    ids=["max_retries=0", "no-client", "client-max_retries=0", "no-attribute"],
)
def test_a_model_that_does_not_retry_is_not_warned_of(model: BaseChatModel) -> None:
    """max_retries=0 (or nothing saying it retries): no warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resilient_model(model)


def test_a_key_echoed_by_the_primary_is_in_no_note_nor_logged_traceback(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The primary's 401 echoes its key ("Incorrect API key provided: sk-test-..."),
    the fallback fails too: neither the give-up note on the raised exception nor the
    traceback `logger.exception` writes of it holds the key."""
    key = "sk-test-Ech0edK3y****************abcd"
    refused = FakeHTTPError(401)
    refused.args = (f"Error code: 401 - Incorrect API key provided: {key}. See docs.",)
    model = build(
        scripted(refused),
        scripted(FakeHTTPError(503)),
        clock=FakeClock(),
        policy=ResiliencePolicy(max_attempts=1),
        fallback_on=frozenset(FailureClass),
    )
    with pytest.raises(FakeHTTPError) as raised:
        ask(model, mode)
    notes = "\n".join(raised.value.__notes__)
    assert "no model answered" in notes
    assert "Incorrect API key provided: [REDACTED]" in notes
    with caplog.at_level(logging.ERROR):
        try:
            raise raised.value
        except FakeHTTPError:
            logging.getLogger("app").exception("the model call failed")
    assert "Ech0edK3y" not in notes + caplog.text
