"""Input that would wedge a thread: calls with a missing or shared id, a tool that raises
SystemExit. Each is answered or propagates cleanly, and the thread stays resumable."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, ToolCall, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import StateGraph

from langgraph_resilience import add_resilience, tool_error_of
from langgraph_resilience.testing import FakeClock, FakeHTTPError, text
from tests.conftest import Runner, State, build_graph


@tool
def lookup(q: str) -> str:
    """Look something up."""
    return f"found {q}"


def _calls(*ids: str | None) -> AIMessage:
    return AIMessage(
        "",
        tool_calls=[
            ToolCall(name="lookup", args={"q": f"q{n}"}, id=call_id, type="tool_call")
            for n, call_id in enumerate(ids)
        ],
    )


def test_calls_sharing_an_id_are_each_answered_structural_and_not_run(runner: Runner) -> None:
    """Two calls with id c1 (a broken provider): no answer could be matched, so neither
    runs; each gets its envelope; the one with its own id runs."""
    runs: list[str] = []

    @tool
    def search(q: str) -> str:
        """Search."""
        runs.append(q)
        return f"found {q}"

    h = build_graph([search], [_calls("c1", "c1", "c2"), text("done")])
    h.model.responses[0] = AIMessage(
        "",
        tool_calls=[
            ToolCall(name="search", args={"q": f"q{n}"}, id=i, type="tool_call")
            for n, i in enumerate(("c1", "c1", "c2"))
        ],
    )

    out = runner.invoke(h.app, {"messages": [("user", "x")]}, h.config())

    answers = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert runs == ["q2"]
    shared = [tool_error_of(m) for m in answers if m.tool_call_id == "c1"]
    assert len(shared) == 2
    assert all(e is not None and e.type == "InvalidCallId" for e in shared)
    assert all(e is not None and e.failure_class == "structural" for e in shared)


def test_a_call_without_an_id_is_answered_not_run() -> None:
    """A null id (the scripted model would fill one in: an agent node returns it as is):
    the tool does not run (it used to, then failed as a TypeError)."""
    runs: list[str] = []

    @tool
    def search(q: str) -> str:
        """Search."""
        runs.append(q)
        return "x"

    def agent(state: State) -> dict[str, Any]:
        if any(isinstance(m, ToolMessage) for m in state["messages"]):
            return {"messages": [AIMessage("done")]}
        call = ToolCall(name="search", args={"q": "a"}, id=None, type="tool_call")
        return {"messages": [AIMessage("", tool_calls=[call])]}

    builder = StateGraph(State)
    builder.add_node("agent", agent)
    add_resilience(builder, agent="agent", tools=[search], clock=FakeClock())
    app = builder.compile(checkpointer=InMemorySaver())

    out = app.invoke({"messages": [("user", "x")]}, {"configurable": {"thread_id": "t"}})

    assert runs == []
    [answer] = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    error = tool_error_of(answer)
    assert error is not None
    assert error.type == "InvalidCallId"
    assert out["messages"][-1].content == "done"


def test_system_exit_from_a_tool_propagates_cleanly_and_the_thread_resumes(
    runner: Runner,
) -> None:
    """A tool raising SystemExit: it propagates as itself (no ContextVar error on top),
    and resuming the thread runs the call again."""
    calls: list[int] = []

    @tool
    def flaky(q: str) -> str:
        """Exits once."""
        calls.append(1)
        if len(calls) == 1:
            raise SystemExit(3)
        return "ok"

    h = build_graph([flaky], [text("placeholder"), text("done")])
    h.model.responses[0] = AIMessage(
        "", tool_calls=[ToolCall(name="flaky", args={"q": "a"}, id="c1", type="tool_call")]
    )
    config: Any = h.config()
    with pytest.raises(SystemExit):
        runner.invoke(h.app, {"messages": [("user", "x")]}, config)

    out = runner.invoke(h.app, None, config)

    assert out["messages"][-1].content == "done"
    assert len(calls) == 2


class Unprintable(Exception):
    """An exception whose __str__ and status_code both raise (a buggy client library)."""

    def __str__(self) -> str:
        raise RuntimeError("cannot render")

    @property
    def status_code(self) -> int:
        raise RuntimeError("no status")


def test_an_exception_that_cannot_be_printed_is_still_classified(runner: Runner) -> None:
    """It used to escape classify raw and wedge the thread (every resume raised again)."""
    calls: list[int] = []

    @tool
    def broken(q: str) -> str:
        """Raises something unprintable, once."""
        calls.append(1)
        if len(calls) == 1:
            raise Unprintable
        return "ok"

    h = build_graph([broken], [text("placeholder"), text("done")])
    h.model.responses[0] = AIMessage(
        "", tool_calls=[ToolCall(name="broken", args={"q": "a"}, id="c1", type="tool_call")]
    )

    out = runner.invoke(h.app, {"messages": [("user", "x")]}, h.config())

    [answer] = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    error = tool_error_of(answer)
    assert error is not None
    assert (error.type, error.failure_class) == ("Unprintable", "unknown")
    assert out["messages"][-1].content == "done"


def test_a_huge_exception_text_is_classified_quickly_and_bounded(runner: Runner) -> None:
    """A 5 MB error body (a hostile upstream): the envelope stays small."""

    @tool
    def huge(q: str) -> str:
        """Fails with a huge body."""
        raise FakeHTTPError(500, body="a-" * 2_500_000)

    h = build_graph([huge], [text("placeholder"), text("done")])
    h.model.responses[0] = AIMessage(
        "", tool_calls=[ToolCall(name="huge", args={"q": "a"}, id="c1", type="tool_call")]
    )

    out = runner.invoke(h.app, {"messages": [("user", "x")]}, h.config())

    [answer] = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert len(answer.content) < 4_000
