"""The real OpenAI client (`ChatOpenAI`, its SDK and HTTP stack) against a local
OpenAI-compatible server that fails on purpose: `resilient_model` and
`create_agent` + `ResilienceMiddleware` read the SDK's own exceptions, a 429's
Retry-After included, as they read our doubles'."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import openai
import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.memory import InMemorySaver

from langgraph_resilience import ResilienceMiddleware, resilient_model
from langgraph_resilience.testing import FakeClock
from tests.conftest import Runner
from tests.standard.fake_openai import FakeOpenAI


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as running:
        yield running


def _client(server: FakeOpenAI) -> ChatOpenAI:
    return ChatOpenAI(model="gpt-4o-mini", base_url=server.base_url, api_key="test", max_retries=0)


@tool
def magic_function(input: int) -> int:
    """Apply a magic function to an input."""
    return input + 2


def test_a_429_from_the_provider_waits_exactly_its_retry_after(
    server: FakeOpenAI, runner: Runner
) -> None:
    clock = FakeClock()
    server.fail_next(429, {"Retry-After": "3"})
    model = resilient_model(_client(server), clock=clock)
    started = clock.time()
    reply = model.invoke("Hello") if runner.mode == "sync" else asyncio.run(model.ainvoke("Hello"))
    assert "Hello" in reply.text
    assert len(server.requests) == 2
    assert clock.sleeps == [3.0]
    assert clock.time() - started == pytest.approx(3.0)


def test_a_401_from_the_provider_is_raised_at_once(server: FakeOpenAI) -> None:
    clock = FakeClock()
    server.fail_next(401)
    model = resilient_model(_client(server), clock=clock)
    with pytest.raises(openai.AuthenticationError):
        model.invoke("Hello")
    assert len(server.requests) == 1
    assert clock.sleeps == []


def test_create_agent_with_the_middleware_rides_out_a_provider_503(
    server: FakeOpenAI, runner: Runner
) -> None:
    """The agent's model is the real client: its 503 is retried by the middleware's
    model chain, then the model calls the tool and answers."""
    clock = FakeClock()
    server.fail_next(503)
    agent = create_agent(
        _client(server),
        [magic_function],
        middleware=[ResilienceMiddleware(clock=clock)],
        checkpointer=InMemorySaver(),
    )
    config = {"configurable": {"thread_id": uuid.uuid4().hex}}
    result = runner.invoke(
        agent, {"messages": [HumanMessage("What is magic_function(3)? Use the tool.")]}, config
    )
    [call] = result["messages"][1].tool_calls
    assert call["args"] == {"input": 3}
    assert result["messages"][2].content == "5"
    assert result["messages"][-1].text.startswith("The tool answered: 5")
    assert len(server.requests) == 3  # the 503, the tool call, the answer
    assert len(clock.sleeps) == 1
