"""Every assistant tool call is answered before the model is called again, on every path:
an abandoned escalation, a run stopped during a backoff, new input on an interrupted thread,
a reply an ``error_handler`` or ``update_state`` wrote after calls left unanswered."""

from __future__ import annotations

from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.errors import NodeError
from langgraph.graph import END, StateGraph
from langgraph.types import Command

from langgraph_resilience import (
    ResilienceMiddleware,
    ToolError,
    ToolProfile,
    add_resilience,
    tool_error_of,
)
from langgraph_resilience._graph.pending import answer_pending, route_entry
from langgraph_resilience._graph.state import empty_tally
from langgraph_resilience.core.backoff import LEDGER_RETRY_DELAYS
from langgraph_resilience.stores.saga import InMemorySagaLog
from langgraph_resilience.testing import (
    FakeClock,
    Fault,
    FaultyTool,
    ScriptedChatModel,
    text,
    tool_calls,
)
from tests.conftest import Runner, State, build_graph
from tests.graph.test_ledger_failures import FlakyLedger


def provider_valid(messages: list[BaseMessage]) -> bool:
    """OpenAI's and Anthropic's rule: an assistant message with tool calls is followed by
    one tool message per call before anything else."""
    for index, message in enumerate(messages):
        if isinstance(message, AIMessage) and message.tool_calls:
            wanted = [c["id"] for c in message.tool_calls]
            following: list[str] = []
            for later in messages[index + 1 :]:
                if not isinstance(later, ToolMessage):
                    break
                following.append(later.tool_call_id)
            if sorted(following) != sorted(wanted):
                return False
    return True


@tool
def refund(order_id: int) -> str:
    """Refund an order."""
    return f"refunded {order_id}"


@tool
def lookup(q: str) -> str:
    """Look something up."""
    return f"found {q}"


def test_a_new_message_instead_of_an_answer_abandons_the_escalation(runner: Runner) -> None:
    """The user writes again while a human decision is pending: the call is answered as
    abandoned, right after its assistant message, and the model sees a valid history."""
    guarded = FaultyTool(refund, [Fault.status(403)])
    h = build_graph(
        [guarded],
        [tool_calls(("refund", {"order_id": 7})), text("ok, something else then")],
        escalate=True,
    )
    config = h.config()
    first = runner.invoke(h.app, {"messages": [("user", "refund order 7")]}, config)
    assert first["__interrupt__"]

    out = runner.invoke(h.app, {"messages": [HumanMessage("never mind, track it")]}, config)

    seen = h.model.received[-1]
    assert provider_valid(seen)
    [answer] = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    error = tool_error_of(answer)
    assert isinstance(error, ToolError)
    assert error.context["abandoned"] is True
    assert [type(m).__name__ for m in out["messages"]] == [
        "HumanMessage",
        "AIMessage",
        "ToolMessage",
        "HumanMessage",
        "AIMessage",
    ]
    assert guarded.calls == 1


def test_an_abort_answers_the_calls_a_human_let_run_again(runner: Runner) -> None:
    """Two refunds of one turn wait for a human: the first is let run again, the second
    aborts the task. The task ends there, so the first is answered as aborted too (not
    left for the next input to find), and it never runs again."""
    guarded = FaultyTool(refund, [Fault.status(403), Fault.status(403)])
    h = build_graph(
        [guarded],
        [tool_calls(("refund", {"order_id": 7}), ("refund", {"order_id": 8})), text("ok")],
        escalate=True,
    )
    config = h.config()
    runner.invoke(h.app, {"messages": [("user", "refund orders 7 and 8")]}, config)
    for action in ("retry", "abort"):
        assert len(h.app.get_state(config).interrupts) == 1
        runner.invoke(h.app, Command(resume={"action": action}), config)

    state = h.app.get_state(config)
    assert not state.next
    messages = state.values["messages"]
    assert provider_valid(messages)
    answers = [tool_error_of(m) for m in messages if isinstance(m, ToolMessage)]
    assert [a.context["human_decision"] for a in answers if a is not None] == ["abort", "abort"]
    assert guarded.calls == 2


class _Stop(BaseException):
    """The process stops (a kill, a cancelled server run) while the retry node waits."""


class StoppingClock(FakeClock):
    def sleep(self, seconds: float) -> None:
        raise _Stop

    async def asleep(self, seconds: float) -> None:
        raise _Stop


def test_a_run_stopped_during_a_backoff_leaves_no_call_unanswered(runner: Runner) -> None:
    """503 with a Retry-After too long to wait inside the step schedules a retry; the run
    dies in the retry node's backoff; the user writes again: the waiting call is answered
    as cancelled (its last error kept) and the sibling's answer stays."""
    flaky = FaultyTool(lookup, [Fault.status(503, retry_after="5")])
    h = build_graph(
        [flaky],
        [
            tool_calls(("lookup", {"q": "a"}), ("lookup", {"q": "b"})),
            text("here is what I have"),
        ],
        clock=StoppingClock(),
    )
    config = h.config()
    with pytest.raises(_Stop):
        runner.invoke(h.app, {"messages": [("user", "look up a and b")]}, config)

    out = runner.invoke(h.app, {"messages": [HumanMessage("hello?")]}, config)

    assert provider_valid(h.model.received[-1])
    answers = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert len(answers) == 2
    cancelled = [tool_error_of(m) for m in answers if m.status == "error"]
    assert len(cancelled) == 1
    assert cancelled[0] is not None
    assert cancelled[0].context == {"cancelled": True, "last_error": "FakeHTTPError"}
    assert cancelled[0].failure_class == "transient"
    assert flaky.calls == 2


def test_a_clean_thread_is_not_rewritten() -> None:
    """Nothing to answer: nothing is written (no history rewrite on the clean path)."""
    messages: list[Any] = [
        HumanMessage("hi"),
        AIMessage("", tool_calls=[{"name": "lookup", "args": {"q": "x"}, "id": "c1"}]),
        ToolMessage("found x", tool_call_id="c1"),
        AIMessage("done"),
        HumanMessage("again"),
    ]
    assert answer_pending(messages, empty_tally()) is None


def test_an_unanswered_call_with_a_reused_id_is_found() -> None:
    """call_0 answered in turn 1 does not count as the answer to turn 2's call_0."""
    call = {"name": "lookup", "args": {"q": "x"}, "id": "call_0"}
    messages: list[Any] = [
        HumanMessage("one"),
        AIMessage("", tool_calls=[call]),
        ToolMessage("found x", tool_call_id="call_0"),
        AIMessage("done"),
        HumanMessage("two"),
        AIMessage("", tool_calls=[call]),
        HumanMessage("three"),
    ]
    found = answer_pending(messages, empty_tally())
    assert found is not None
    patched, _, _ = found
    assert provider_valid(patched)
    assert isinstance(patched[6], ToolMessage)
    assert patched[6].tool_call_id == "call_0"


def test_the_pending_node_runs_only_when_a_stopped_run_left_calls() -> None:
    """A clean thread enters straight at the agent (no extra step, no checkpoint); a
    thread whose run stopped with a call unanswered enters through answer_pending."""
    flaky = FaultyTool(lookup, [Fault.status(503, retry_after="5")])
    h = build_graph(
        [flaky],
        [tool_calls(("lookup", {"q": "a"})), text("done"), text("hello again")],
        clock=StoppingClock(),
    )
    config = h.config()

    def nodes(prompt: str) -> list[str]:
        return [
            name
            for chunk in h.app.stream({"messages": [HumanMessage(prompt)]}, config)
            for name in chunk
        ]

    with pytest.raises(_Stop):
        nodes("look up a")  # the 503 waits 5 s in the retry node; the run stops there
    assert "answer_pending" in nodes("hello?")
    assert "answer_pending" not in nodes("and now?")


def _call(call_id: str) -> AIMessage:
    return AIMessage("", tool_calls=[{"name": "lookup", "args": {"q": call_id}, "id": call_id}])


@pytest.mark.parametrize(
    ("tail", "route"),
    [
        ([_call("b"), HumanMessage("and?")], "pending"),  # a run stopped before its tools
        ([_call("b"), HumanMessage("and?"), HumanMessage("hello?")], "pending"),
        ([_call("b"), ToolMessage("x", tool_call_id="b"), _call("c")], "pending"),
        ([_call("b"), ToolMessage("x", tool_call_id="b"), AIMessage("done")], "go"),
        ([AIMessage("done"), HumanMessage("next")], "go"),
        # a final answer the model did not give, right after calls left unanswered
        ([_call("b"), AIMessage("sorry"), HumanMessage("and?")], "pending"),
        ([_call("b"), AIMessage("one"), AIMessage("two"), HumanMessage("and?")], "pending"),
        ([_call("b"), ToolMessage("x", tool_call_id="b"), AIMessage("1"), AIMessage("2")], "go"),
    ],
)
def test_the_entry_finds_what_a_stopped_run_left_at_the_end_of_a_long_thread(
    tail: list[BaseMessage], route: str
) -> None:
    """The entry reads the thread back to its latest final answer: a call a stopped run
    left is found behind any number of new inputs, however long the thread before."""
    history: list[BaseMessage] = [HumanMessage("start")]
    for turn in range(300):
        history += [
            _call(f"old{turn}"),
            ToolMessage("ok", tool_call_id=f"old{turn}"),
            AIMessage(f"answer {turn}"),
            HumanMessage(f"follow-up {turn}"),
        ]
    state = {"messages": [*history, *tail], "resilience": empty_tally()}
    assert route_entry(state) == route
    if route == "pending":
        found = answer_pending(state["messages"], empty_tally())
        assert found is not None
        assert provider_valid(found[0])


def test_an_error_handlers_reply_to_a_failed_step_is_answered_next_turn(runner: Runner) -> None:
    """LangGraph's ``error_handler`` catches our step's failure (the ledger down, before
    any effect) and writes a reply after the turn's calls, which stay unanswered. The next
    turn answers them before the model is asked, and the refund asked again runs once."""
    ledger, refunded = FlakyLedger(), []

    @tool
    def refund(order_id: int) -> str:
        """Refund an order."""
        refunded.append(order_id)
        return f"refunded {order_id}"

    def handler(state: State, error: NodeError) -> Command[Any]:
        return Command(update={"messages": [AIMessage("sorry, try again later")]}, goto=END)

    model = ScriptedChatModel(
        responses=[
            tool_calls(("refund", {"order_id": 7}), ("lookup", {"q": "7"})),
            tool_calls(("refund", {"order_id": 7})),
            text("refunded"),
        ]
    )
    builder = StateGraph(State).set_node_defaults(error_handler=handler)
    builder.add_node(
        "agent",
        RunnableLambda(
            lambda s: {"messages": [model.invoke(s["messages"])]},
            afunc=_async_agent(model),
        ),
    )
    add_resilience(
        builder,
        agent="agent",
        tools=[refund, lookup],
        profiles={"refund": ToolProfile(side_effect=True)},
        clock=FakeClock(),
        idempotency=ledger,
        saga=InMemorySagaLog(),
    )
    app = builder.compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "handled"}}
    ledger.failing["claim"] = len(LEDGER_RETRY_DELAYS) + 1  # outlasts our own retries

    first = runner.invoke(app, {"messages": [("user", "refund order 7")]}, config)
    assert first["messages"][-1].content == "sorry, try again later"
    assert refunded == []

    out = runner.invoke(app, {"messages": [HumanMessage("please try again")]}, config)

    assert all(provider_valid(seen) for seen in model.received)
    assert provider_valid(out["messages"])
    assert refunded == [7]
    assert out["messages"][-1].content == "refunded"


def _async_agent(model: ScriptedChatModel) -> Any:
    async def agent(state: State) -> dict[str, list[BaseMessage]]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    return agent


def test_a_reply_put_in_after_unanswered_calls_is_answered_by_the_middleware(
    runner: Runner,
) -> None:
    """An operator's ``update_state`` writes a final answer after calls a stopped run
    left: create_agent's next turn answers them before the model is asked."""
    model = ScriptedChatModel(responses=[text("back again")])
    app = create_agent(
        model, [lookup], middleware=[ResilienceMiddleware()], checkpointer=InMemorySaver()
    )
    config: Any = {"configurable": {"thread_id": "edited"}}
    left = [HumanMessage("look up a"), _call("a"), AIMessage("(edited by support)")]
    app.update_state(config, {"messages": left}, as_node="model")

    out = runner.invoke(app, {"messages": [HumanMessage("hello?")]}, config)

    assert provider_valid(model.received[-1])
    assert provider_valid(out["messages"])
    assert out["messages"][-1].content == "back again"
