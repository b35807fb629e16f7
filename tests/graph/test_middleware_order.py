"""A retrying middleware listed before `ResilienceMiddleware` wraps it (`create_agent`
makes the first in the list the outermost): when it asks the model again after we
gave up, its retries multiply ours, and that is warned of once. One listed after it
runs inside our one claim of a side effect: it may not run the effect again."""

from __future__ import annotations

import uuid
import warnings
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import (
    AgentMiddleware,
    ModelRetryMiddleware,
    ToolRetryMiddleware,
)
from langchain_core.messages import ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from langgraph_resilience import (
    FailureClass,
    ResilienceMiddleware,
    ResiliencePolicy,
    ResilienceWarning,
    ToolError,
    ToolProfile,
)
from langgraph_resilience.testing import FakeClock, ScriptedChatModel, text, tool_calls
from tests.conftest import Runner

_DOWN = ConnectionRefusedError("model.example: connection refused")
_CONFIG = {"configurable": {"thread_id": "t"}}


@tool
def search(query: str) -> str:
    """Search."""
    return f"found {query}"


def _resilience() -> ResilienceMiddleware:
    return ResilienceMiddleware(clock=FakeClock(), policy=ResiliencePolicy(max_attempts=2))


def _agent(responses: list[Any], middleware: list[Any]) -> tuple[Any, ScriptedChatModel]:
    model = ScriptedChatModel(responses=responses)
    agent = create_agent(model, [search], middleware=middleware, checkpointer=InMemorySaver())
    return agent, model


def _config() -> dict[str, Any]:
    return {"configurable": {"thread_id": uuid.uuid4().hex}}


def _said(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, ResilienceWarning)]


def test_a_retry_around_ours_is_warned_of_once() -> None:
    """The model is down: we try twice and give up, the outer ModelRetryMiddleware asks
    us again (its retry), so the model is asked 2 x 3 times, and one warning says why
    and what to do."""
    outer = ModelRetryMiddleware(max_retries=2, initial_delay=0.0, jitter=False, on_failure="error")
    agent, model = _agent([_DOWN] * 6, [outer, _resilience()])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(ConnectionRefusedError):
            agent.invoke({"messages": [("user", "go")]}, _CONFIG)
    said = _said(caught)
    assert len(said) == 1
    assert "listed before ResilienceMiddleware" in said[0]
    assert "list ResilienceMiddleware first" in said[0]
    assert model.calls == 6


async def test_an_async_run_is_warned_alike() -> None:
    """The async hooks (`awrap_model_call`) tell it the same way."""
    outer = ModelRetryMiddleware(max_retries=1, initial_delay=0.0, jitter=False, on_failure="error")
    agent, _ = _agent([_DOWN] * 4, [outer, _resilience()])
    with (
        pytest.warns(ResilienceWarning, match="listed before ResilienceMiddleware"),
        pytest.raises(ConnectionRefusedError),
    ):
        await agent.ainvoke({"messages": [("user", "go")]}, _CONFIG)


def test_in_the_readme_order_nothing_is_warned() -> None:
    """ResilienceMiddleware first: the retrying middleware are inside it, and a turn
    whose model fails once recovers without a warning."""
    middleware = [
        _resilience(),
        ModelRetryMiddleware(max_retries=0, on_failure="error"),
        ToolRetryMiddleware(),
    ]
    responses = [_DOWN, tool_calls(("search", {"query": "q"})), text("done")]
    agent, _ = _agent(responses, middleware)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = agent.invoke({"messages": [("user", "go")]}, _CONFIG)
    assert result["messages"][-1].content == "done"
    assert _said(caught) == []


def _charging(effects: list[str], failure: Exception | None) -> Any:
    @tool
    def charge(order_id: str) -> str:
        """Charge an order."""
        effects.append(order_id)  # the charge went through
        if failure is not None and len(effects) == 1:
            raise failure  # ... and its first answer was lost (or refused)
        return f"charged {order_id}"

    return charge


def _charge_agent(charge: Any, responses: list[Any]) -> tuple[Any, ScriptedChatModel]:
    inner = ToolRetryMiddleware(max_retries=2, initial_delay=0.0, jitter=False)
    resilience = ResilienceMiddleware(
        clock=FakeClock(),
        policy=ResiliencePolicy(max_attempts=2),
        profiles={"charge": ToolProfile(side_effect=True)},
    )
    model = ScriptedChatModel(responses=responses)
    agent = create_agent(
        model, [charge], middleware=[resilience, inner], checkpointer=InMemorySaver()
    )
    return agent, model


def test_a_retry_inside_ours_never_runs_a_side_effect_again(runner: Runner) -> None:
    """ToolRetryMiddleware listed after ResilienceMiddleware sits inside our one claim
    of the charge: its blind retry of a lost answer would charge twice. The repeat is
    not run (the first outcome is replayed to it), ours judges the lost answer by its
    evidence, and one warning names the order to fix."""
    effects: list[str] = []
    charge = _charging(effects, TimeoutError("payments.example: read timed out"))
    agent, _model = _charge_agent(charge, [tool_calls(("charge", {"order_id": "A1"})), text("ok")])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = runner.invoke(agent, {"messages": [("user", "charge A1")]}, _config())
    assert effects == ["A1"]
    said = _said(caught)
    assert len(said) == 1
    assert "listed after ResilienceMiddleware" in said[0]
    assert "'charge'" in said[0]
    [answer] = [m for m in result["messages"] if isinstance(m, ToolMessage)]
    envelope = ToolError.model_validate_json(str(answer.content))
    assert (answer.status, envelope.failure_class) == ("error", FailureClass.UNKNOWN)
    assert envelope.context["maybe_executed"] is True  # the agent checks, never repeats


def test_a_refused_side_effect_is_retried_by_ours_not_inside(runner: Runner) -> None:
    """A refusal proves the charge did not run: the repeat inside is still not run, and
    ours retries it under its own budget, so the order is charged exactly once."""
    effects: list[str] = []
    charge = _charging(effects, ConnectionRefusedError("payments.example: refused"))
    agent, _model = _charge_agent(charge, [tool_calls(("charge", {"order_id": "A1"})), text("ok")])
    with pytest.warns(ResilienceWarning, match="listed after ResilienceMiddleware"):
        result = runner.invoke(agent, {"messages": [("user", "charge A1")]}, _config())
    assert effects == ["A1", "A1"]  # the refused attempt, then ours: one charge done
    [answer] = [m for m in result["messages"] if isinstance(m, ToolMessage)]
    assert answer.content == "charged A1"


def test_reads_inside_ours_are_left_to_the_inner_retry() -> None:
    """Only a side effect is held to one run per attempt: a read retried inside is the
    user's choice, and nothing is warned."""
    calls: list[str] = []

    @tool
    def quote(order_id: str) -> str:
        """Quote an order."""
        calls.append(order_id)
        if len(calls) == 1:
            raise ConnectionResetError("quotes.example: reset")
        return "12 EUR"

    inner = ToolRetryMiddleware(max_retries=2, initial_delay=0.0, jitter=False)
    model = ScriptedChatModel(responses=[tool_calls(("quote", {"order_id": "A1"})), text("ok")])
    agent = create_agent(
        model, [quote], middleware=[_resilience(), inner], checkpointer=InMemorySaver()
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = agent.invoke({"messages": [("user", "quote A1")]}, _CONFIG)
    assert calls == ["A1", "A1"]
    assert _said(caught) == []
    assert [m.content for m in result["messages"] if isinstance(m, ToolMessage)] == ["12 EUR"]


class _ErrorsAsAnswers(AgentMiddleware):  # type: ignore[type-arg]
    """What ``ToolErrorMiddleware`` does, on the public middleware API: a tool's
    exception goes back to the model as an error `ToolMessage`."""

    def wrap_tool_call(self, request: Any, handler: Any) -> Any:
        try:
            return handler(request)
        except Exception as exc:
            return _as_answer(request, exc)

    async def awrap_tool_call(self, request: Any, handler: Any) -> Any:
        try:
            return await handler(request)
        except Exception as exc:
            return _as_answer(request, exc)


def _as_answer(request: Any, exc: Exception) -> ToolMessage:
    call = request.tool_call
    return ToolMessage(f"error: {exc}", tool_call_id=call["id"], name=call["name"], status="error")


def _converting_agent(charge: Any, responses: list[Any]) -> Any:
    resilience = ResilienceMiddleware(
        clock=FakeClock(), profiles={"charge": ToolProfile(side_effect=True)}
    )
    model = ScriptedChatModel(responses=responses)
    middleware = [resilience, _ErrorsAsAnswers()]
    return create_agent(model, [charge], middleware=middleware, checkpointer=InMemorySaver())


def test_a_lost_answer_made_an_error_message_inside_ours_is_never_repeated(
    runner: Runner,
) -> None:
    """An error answer made of the timeout inside ours would read as the charge's
    definite answer, and the model's re-issue would charge again. The attempt ends
    with the tool's own exception instead: unknown, and the re-issue is not run."""
    effects: list[str] = []
    charge = _charging(effects, TimeoutError("payments.example: read timed out"))
    again = tool_calls(("charge", {"order_id": "A1"}))
    agent = _converting_agent(charge, [again, again, text("ok")])
    result = runner.invoke(agent, {"messages": [("user", "charge A1")]}, _config())
    assert effects == ["A1"]
    answers = [m for m in result["messages"] if isinstance(m, ToolMessage)]
    kinds = [ToolError.model_validate_json(str(m.content)).failure_class for m in answers]
    assert kinds == [FailureClass.UNKNOWN, FailureClass.UNKNOWN]


def test_a_refusal_made_an_error_message_inside_ours_is_retried_by_ours(
    runner: Runner,
) -> None:
    """A refusal turned into an error answer inside ours would end the call; the
    refusal itself says the charge never ran, so ours retries it and it runs once."""
    effects: list[str] = []
    charge = _charging(effects, ConnectionRefusedError("payments.example: refused"))
    agent = _converting_agent(charge, [tool_calls(("charge", {"order_id": "A1"})), text("ok")])
    result = runner.invoke(agent, {"messages": [("user", "charge A1")]}, _config())
    assert effects == ["A1", "A1"]  # the refused attempt, then the charge
    [answer] = [m for m in result["messages"] if isinstance(m, ToolMessage)]
    assert (answer.status, answer.content) == ("success", "charged A1")
