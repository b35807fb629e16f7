"""A call's outcome is one typed value (`scope.CallOutcome`), kept by the step, never
read back from the messages: the answers the model and the checkpoint see carry none
of our internal fields, and an observer is told the attempt's classified failure."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any, Literal

import pytest
from langchain_core.messages import ToolMessage
from langchain_core.tools import tool
from langgraph.prebuilt.tool_node import ToolCallRequest

from langgraph_resilience import FailureClass, GuardedToolNode, ToolProfile
from langgraph_resilience.errors import ToolError
from langgraph_resilience.events import Outcome, observe, unobserve
from langgraph_resilience.testing import Fault, FaultyTool, text, tool_calls
from tests.conftest import Runner, build_graph


class Told:
    """An observer that keeps how each attempt ended."""

    def __init__(self) -> None:
        self.ends: list[tuple[str, ToolError | None]] = []

    def event(self, kind: str, fields: Mapping[str, Any]) -> None:
        pass

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        yield

    @contextlib.contextmanager
    def attempt(self, tool: str, call_id: str) -> Iterator[Outcome]:
        yield lambda error: self.ends.append((tool, error))


@pytest.fixture
def told() -> Iterator[Told]:
    seen = Told()
    observe(seen)
    yield seen
    unobserve(seen)


def _answers(state: Any) -> list[ToolMessage]:
    return [m for m in state["messages"] if isinstance(m, ToolMessage)]


def test_an_observer_is_told_the_classified_failure_then_none(runner: Runner, told: Told) -> None:
    """A 503 retried inside the step: the observer hears a TRANSIENT `ToolError` for the
    first attempt and None for the second, not a message to pick apart."""

    @tool
    def search(query: str) -> str:
        """Search."""
        return f"found {query}"

    flaky = FaultyTool(search, [Fault.status(503)])
    h = build_graph([flaky], [tool_calls(("search", {"query": "lamp"})), text("done")])
    runner.invoke(h.app, {"messages": [("user", "go")]}, h.config())

    assert [tool for tool, _ in told.ends] == ["search", "search"]
    first, second = (error for _, error in told.ends)
    assert isinstance(first, ToolError)
    assert first.failure_class is FailureClass.TRANSIENT
    assert second is None


def test_answers_carry_no_internal_fields(runner: Runner) -> None:
    """Coerced arguments and a side-effecting batch's item keys reach the step through the
    call's outcome: the answers in the thread hold no ``resilience_*`` metadata of ours
    beside the trail."""

    @tool
    def pay(amount: float, currency: Literal["USD", "EUR"]) -> str:
        """Pay an amount."""
        return f"paid {amount} {currency}"

    @tool
    def send(emails: list[str]) -> str:
        """Send each email."""
        return f"sent {len(emails)}"

    h = build_graph(
        [pay, send],
        [
            tool_calls(
                ("pay", {"amount": "12.5", "currency": "usd"}),
                ("send", {"emails": ["a@x.io", "b@x.io"]}),
            ),
            text("done"),
        ],
        profiles={"send": ToolProfile(side_effect=True, batch_arg="emails")},
    )
    state = runner.invoke(h.app, {"messages": [("user", "go")]}, h.config())

    answers = {m.name: m for m in _answers(state)}
    assert answers["pay"].content == "paid 12.5 USD"
    assert answers["pay"].response_metadata["resilience"]["coercions"]
    assert answers["send"].content == "sent 2"
    for message in answers.values():
        assert [k for k in message.response_metadata if k.startswith("resilience_")] == []


def test_an_interception_outside_a_step_answers_with_the_envelope() -> None:
    """Called by hand, outside a tools step, the interception has no step to settle a
    failure: it answers with the failure's envelope, never an empty placeholder."""

    @tool
    def search(query: str) -> str:
        """Search."""
        raise ConnectionRefusedError("search.example: connection refused")

    node = GuardedToolNode([search], breaker=None)
    call = {"name": "search", "args": {"query": "x"}, "id": "c1", "type": "tool_call"}
    request = ToolCallRequest(tool_call=call, tool=search, state={}, runtime=None)  # type: ignore[arg-type]

    def execute(req: ToolCallRequest) -> ToolMessage:
        return ToolMessage(content=search.invoke(req.tool_call["args"]), tool_call_id="c1")

    answer = node.wrap_tool_call(request, execute)

    assert isinstance(answer, ToolMessage)
    assert answer.status == "error"
    assert '"failure_class":"transient"' in str(answer.content)
