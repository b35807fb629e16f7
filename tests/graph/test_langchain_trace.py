"""Recovery in LangChain's trace: each attempt is its own tool run, and each event is a
custom event (``resilience.<kind>``) of the tools step it happened in, so LangSmith,
or any callback handler, shows what recovery did where it did it."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import pytest
from langchain.agents import create_agent
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import MessagesState, StateGraph

from langgraph_resilience import ResilienceMiddleware, ResilienceState, add_resilience
from langgraph_resilience import events as events_module
from langgraph_resilience.testing import FakeClock, ScriptedChatModel, text, tool_calls


class Recorder(BaseCallbackHandler):
    """Records runs by id, the tool runs and the custom events, as a tracer sees them."""

    def __init__(self) -> None:
        self.names: dict[UUID, str] = {}
        self.tool_runs: list[tuple[str, str]] = []
        self.events: list[tuple[str, str, dict[str, Any]]] = []

    def on_chain_start(
        self, serialized: dict[str, Any] | None, inputs: Any, *, run_id: UUID, **kw: Any
    ) -> None:
        self.names[run_id] = str(kw.get("name") or (serialized or {}).get("name"))

    def on_tool_start(
        self, serialized: dict[str, Any], input_str: str, *, run_id: UUID, **kw: Any
    ) -> None:
        self.tool_runs.append((serialized["name"], self.names.get(kw["parent_run_id"], "")))

    def on_custom_event(self, name: str, data: Any, *, run_id: UUID, **kw: Any) -> None:
        self.events.append((name, self.names.get(run_id, ""), data))


def _flaky_search() -> Any:
    asked: list[str] = []

    @tool
    def search(query: str) -> str:
        """Search the catalogue."""
        asked.append(query)
        if len(asked) == 1:
            raise ConnectionRefusedError("catalogue.example: connection refused")
        return "3 results"

    return search


def _graph() -> Any:
    search = _flaky_search()
    model = ScriptedChatModel(responses=[tool_calls(("search", {"query": "q"})), text("done")])

    class State(MessagesState, ResilienceState): ...

    builder = StateGraph(State)
    builder.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
    add_resilience(builder, agent="agent", tools=[search], clock=FakeClock())
    return builder.compile(checkpointer=InMemorySaver())


def _check(recorder: Recorder) -> None:
    """Two attempts as two tool runs of the tools step, and the decisions between them
    as that step's custom events, with what the stream carries."""
    assert recorder.tool_runs == [("search", "tools"), ("search", "tools")]
    named = [(name, where) for name, where, _ in recorder.events]
    assert named[:2] == [("resilience.attempt", "tools"), ("resilience.retry_scheduled", "tools")]
    assert named.count(("resilience.attempt", "tools")) == 2
    first = recorder.events[0][2]
    assert first["tool"] == "search"
    assert first["failure_class"] == "transient"


def test_a_retried_call_is_in_the_trace() -> None:
    """`add_resilience`, invoked with a callback handler."""
    recorder = Recorder()
    config = {"configurable": {"thread_id": "t"}, "callbacks": [recorder]}
    _graph().invoke({"messages": [("user", "go")]}, config)
    _check(recorder)


async def test_an_async_run_is_traced_alike() -> None:
    """The same through ``ainvoke``."""
    recorder = Recorder()
    config = {"configurable": {"thread_id": "t"}, "callbacks": [recorder]}
    await _graph().ainvoke({"messages": [("user", "go")]}, config)
    _check(recorder)


def test_create_agent_is_traced_alike() -> None:
    """`ResilienceMiddleware`: the events are custom events of the agent's tools step."""
    model = ScriptedChatModel(responses=[tool_calls(("search", {"query": "q"})), text("done")])
    agent = create_agent(
        model,
        [_flaky_search()],
        middleware=[ResilienceMiddleware(clock=FakeClock())],
        checkpointer=InMemorySaver(),
    )
    recorder = Recorder()
    config = {"configurable": {"thread_id": "t"}, "callbacks": [recorder]}
    agent.invoke({"messages": [("user", "go")]}, config)
    _check(recorder)


def test_a_run_without_handlers_dispatches_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """No callback handler: no custom event is built or sent (the common case costs
    one context-variable read per event)."""
    sent: list[str] = []
    monkeypatch.setattr(events_module, "dispatch_custom_event", lambda name, _: sent.append(name))
    _graph().invoke({"messages": [("user", "go")]}, {"configurable": {"thread_id": "t"}})
    assert sent == []
