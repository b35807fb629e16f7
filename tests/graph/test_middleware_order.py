"""A retrying middleware listed before `ResilienceMiddleware` wraps it (`create_agent`
makes the first in the list the outermost): when it asks the model again after we
gave up, its retries multiply ours, and that is warned of once."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import ModelRetryMiddleware, ToolRetryMiddleware
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from langgraph_resilience import ResilienceMiddleware, ResiliencePolicy, ResilienceWarning
from langgraph_resilience.testing import FakeClock, ScriptedChatModel, text, tool_calls

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
