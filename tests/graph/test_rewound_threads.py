"""A done effect that the thread no longer holds (rolled back, a lost flush, a fork) is
answered from the ledger when the agent asks for it again, and the agent is told; an
effect the thread does hold is run again when asked again."""

from __future__ import annotations

from typing import Any

from langchain_core.messages import AIMessage, ToolCall, ToolMessage
from langchain_core.tools import tool

from langgraph_resilience import ToolProfile
from langgraph_resilience._graph.exactly_once import EARLIER_RUN
from langgraph_resilience.stores import InMemoryIdempotencyStore
from langgraph_resilience.stores.saga import InMemorySagaLog
from tests.conftest import Runner, build_graph


def _refund(order: int, n: int) -> AIMessage:
    return AIMessage(
        "",
        tool_calls=[ToolCall(name="refund", args={"order": order}, id=f"c{n}", type="tool_call")],
    )


def _app(refunds: list[int], script: list[Any]) -> Any:
    @tool
    def refund(order: int) -> str:
        """Refund an order."""
        refunds.append(order)
        return f"refunded {order}"

    return build_graph(
        [refund],
        script,
        profiles={"refund": ToolProfile(side_effect=True)},
        options={"idempotency": InMemoryIdempotencyStore(), "saga": InMemorySagaLog()},
    )


def _answers(out: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in out["messages"] if isinstance(m, ToolMessage)]


def test_a_rolled_back_refund_is_answered_from_the_ledger(runner: Runner) -> None:
    """The thread is rewound to before the refund (time travel: a run from an earlier
    checkpoint); asked again, the refund is not paid twice and the agent reads why."""
    refunds: list[int] = []
    h = _app(refunds, [_refund(7, 1), AIMessage("done"), _refund(7, 2), AIMessage("done")])
    config = h.config()
    runner.invoke(h.app, {"messages": [("user", "refund order 7")]}, config)
    [before] = [
        s.config for s in h.app.get_state_history(config) if s.metadata and s.metadata["step"] == -1
    ]

    out = runner.invoke(h.app, {"messages": [("user", "refund order 7")]}, before)

    assert refunds == [7]
    [answer] = _answers(out)
    assert str(answer.content).startswith("refunded 7")
    assert EARLIER_RUN in str(answer.content)
    assert answer.response_metadata["resilience"]["reconciled"] is True


def test_a_refund_the_thread_holds_runs_again_when_asked_again(runner: Runner) -> None:
    """The same request in a later task, on a thread that holds the first refund: a new
    refund, not an answer from the ledger."""
    refunds: list[int] = []
    h = _app(refunds, [_refund(7, 1), AIMessage("done"), _refund(7, 2), AIMessage("done")])
    config = h.config()
    runner.invoke(h.app, {"messages": [("user", "refund order 7")]}, config)

    out = runner.invoke(h.app, {"messages": [("user", "refund order 7 again")]}, config)

    assert refunds == [7, 7]
    assert [str(m.content) for m in _answers(out)] == ["refunded 7", "refunded 7"]
    assert out["resilience"]["held"] == {next(iter(out["resilience"]["held"])): 2}
