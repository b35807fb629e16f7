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


def test_a_replan_with_long_step_ids_keeps_the_provider_history_valid(
    server: FakeOpenAI, runner: Runner
) -> None:
    """The planner names its steps as it likes (the verifier takes up to 64 characters);
    the calls the executor issues keep ids every provider accepts, so the agent's next
    request to the strict server is answered, not refused with a 400."""
    from langgraph.graph import StateGraph  # noqa: PLC0415

    from langgraph_resilience import add_resilience  # noqa: PLC0415
    from langgraph_resilience.testing import (  # noqa: PLC0415
        Fault,
        FaultyTool,
        ScriptedChatModel,
        tool_calls,
    )
    from tests.conftest import State  # noqa: PLC0415

    @tool
    def get_weather(city: str) -> str:
        """Weather for a city (the old endpoint)."""
        return f"sunny in {city}"

    @tool
    def weather_v2(city: str) -> str:
        """Weather for a city (the new endpoint)."""
        return f"12C in {city}"

    odd = "geocode_oslo_to_coordinates_first_then_the_forecast"
    plan = {
        "diagnosis": {
            "failed_tool": "get_weather",
            "failure_class": "structural",
            "cause": "get_weather answered 410 Gone: the endpoint was removed",
        },
        "rationale": "weather_v2 serves the same forecast from the new endpoint",
        "steps": [{"id": odd, "tool": "weather_v2", "args": {"city": "Oslo"}}],
    }
    agent = _client(server).bind_tools([get_weather, weather_v2])
    builder = StateGraph(State)
    builder.add_node("agent", lambda state: {"messages": [agent.invoke(state["messages"])]})
    add_resilience(
        builder,
        agent="agent",
        tools=[FaultyTool(get_weather, then=Fault.status(410)), weather_v2],
        planner_model=ScriptedChatModel(responses=[tool_calls(("Plan", plan))]),
        clock=FakeClock(),
    )
    app = builder.compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": uuid.uuid4().hex}}
    prompt = "Use get_weather for the weather in 'Oslo'"
    out = runner.invoke(app, {"messages": [HumanMessage(prompt)]}, config)
    assert out["messages"][-1].content.startswith("The tool answered")
    sent = [
        call["id"]
        for body in server.requests
        for message in body["messages"]
        for call in message.get("tool_calls") or []
    ]
    assert any(call_id.startswith("replan-") for call_id in sent)
