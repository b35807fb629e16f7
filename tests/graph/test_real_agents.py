"""What real agents do that our own doubles did not: reused call ids, calls re-issued
under a new id after a lost answer, long conversations of many tasks."""

from __future__ import annotations

import random
from typing import Any

import httpx
from langchain_core.messages import AIMessage, HumanMessage, ToolCall, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph

from langgraph_resilience import (
    ResiliencePolicy,
    ToolProfile,
    add_resilience,
    current_idempotency_key,
    tool_error_of,
)
from langgraph_resilience.core import canonical_args
from langgraph_resilience.core.effects import effect_fingerprint
from langgraph_resilience.stores import EffectStatus, InMemoryIdempotencyStore
from langgraph_resilience.testing import (
    FakeClock,
    FakeHTTPError,
    Fault,
    FaultyTool,
    ScriptedChatModel,
    text,
)
from tests.conftest import Runner, State, build_graph


def call(name: str, args: dict[str, Any], call_id: str) -> AIMessage:
    """An assistant message with one tool call under an explicit (provider) id."""
    return AIMessage("", tool_calls=[ToolCall(name=name, args=args, id=call_id, type="tool_call")])


def answers(state: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in state["messages"] if isinstance(m, ToolMessage)]


class Bank:
    """A payment service that deduplicates nothing and can only be asked by payee and
    amount (not by our idempotency key)."""

    def __init__(self) -> None:
        self.payments: list[dict[str, Any]] = []
        self.status_down = 0

    def status(self, key: str, args: dict[str, Any]) -> EffectStatus:
        if self.status_down:
            self.status_down -= 1
            raise FakeHTTPError(503)
        done = [p for p in self.payments if p["args"] == args]
        return EffectStatus(done=bool(done), result="paid" if done else None)


def make_pay(bank: Bank) -> Any:
    @tool
    def pay(to: str, amount: int) -> str:
        """Pay someone."""
        bank.payments.append(
            {"key": current_idempotency_key(), "args": {"to": to, "amount": amount}}
        )
        return "paid"

    return pay


# ------------------------------------------------------------------ call identity


def test_a_call_id_reused_in_a_later_turn_runs_and_is_answered(runner: Runner) -> None:
    """Providers number ids per message (call_0 every turn): the second turn's call_0 is a
    new call, executed and answered like the first."""
    runs: list[str] = []

    @tool
    def search(q: str) -> str:
        """Search."""
        runs.append(q)
        return f"found {q}"

    h = build_graph(
        [search],
        [
            call("search", {"q": "a"}, "call_0"),
            text("one"),
            call("search", {"q": "b"}, "call_0"),
            text("two"),
        ],
    )
    config = h.config()
    runner.invoke(h.app, {"messages": [("user", "find a")]}, config)
    out = runner.invoke(h.app, {"messages": [("user", "find b")]}, config)

    assert runs == ["a", "b"]
    assert [(m.tool_call_id, m.content) for m in answers(out)] == [
        ("call_0", "found a"),
        ("call_0", "found b"),
    ]
    assert out["messages"][-1].content == "two"


def test_reused_ids_give_side_effects_different_keys(runner: Runner) -> None:
    """Two payments asked for in two turns under the same provider id are two effects."""
    bank = Bank()
    h = build_graph(
        [make_pay(bank)],
        [
            call("pay", {"to": "bob", "amount": 5}, "call_0"),
            text("paid"),
            call("pay", {"to": "bob", "amount": 5}, "call_0"),
            text("paid again"),
        ],
        profiles={"pay": ToolProfile(side_effect=True)},
    )
    config = h.config()
    runner.invoke(h.app, {"messages": [("user", "pay bob 5")]}, config)
    runner.invoke(h.app, {"messages": [("user", "pay bob 5 again, please")]}, config)

    assert len(bank.payments) == 2
    assert len({p["key"] for p in bank.payments}) == 2


# ------------------------------------------------------- exactly once against re-issue


def test_a_re_issue_after_a_lost_answer_does_not_pay_twice(runner: Runner) -> None:
    """The payment commits, its answer is lost (UNKNOWN); the model re-issues the same call
    under a new id. Without a status_check it is not run: the envelope says why."""
    bank = Bank()
    pay = FaultyTool(make_pay(bank), [Fault.timeout(after_effect=True)])
    h = build_graph(
        [pay],
        [
            call("pay", {"to": "bob", "amount": 5}, "call_a"),
            call("pay", {"to": "bob", "amount": 5}, "call_b"),
            text("I could not confirm the payment"),
        ],
        profiles={"pay": ToolProfile(side_effect=True)},
    )

    out = runner.invoke(h.app, {"messages": [("user", "pay bob 5")]}, h.config())

    assert len(bank.payments) == 1
    first, second = (tool_error_of(m) for m in answers(out))
    assert first is not None
    assert first.failure_class == "unknown"
    assert second is not None
    assert second.failure_class == "unknown"
    assert second.context["earlier_call"] is True
    assert second.suggested_action == "query_status"
    assert pay.executions == 1


def test_a_re_issue_is_answered_by_reconciling_the_earlier_call(runner: Runner) -> None:
    """The status service stayed down for the call's three tries when the answer was
    lost, so the agent re-issued the call; now status_check(key, args) finds the
    payment: the re-issue is answered with it, and nothing runs twice."""
    bank = Bank()
    bank.status_down = 3
    pay = FaultyTool(make_pay(bank), [Fault.timeout(after_effect=True)])
    h = build_graph(
        [pay],
        [
            call("pay", {"to": "bob", "amount": 5}, "call_a"),
            call("pay", {"to": "bob", "amount": 5}, "call_b"),
            text("done"),
        ],
        profiles={"pay": ToolProfile(side_effect=True, status_check=bank.status)},
    )

    out = runner.invoke(h.app, {"messages": [("user", "pay bob 5")]}, h.config())

    assert len(bank.payments) == 1
    first, second = answers(out)
    assert first.status == "error"
    assert (second.status, second.content) == ("success", "paid")
    assert second.response_metadata["resilience"]["reconciled"] is True


def test_an_earlier_call_that_did_not_happen_is_released_and_the_re_issue_runs(
    runner: Runner,
) -> None:
    """The status service says the earlier payment did not happen: the re-issue pays once."""
    bank = Bank()
    bank.status_down = 3
    pay = FaultyTool(make_pay(bank), [Fault.timeout(after_effect=False)])
    h = build_graph(
        [pay],
        [
            call("pay", {"to": "bob", "amount": 5}, "call_a"),
            call("pay", {"to": "bob", "amount": 5}, "call_b"),
            text("done"),
        ],
        profiles={"pay": ToolProfile(side_effect=True, status_check=bank.status)},
    )

    out = runner.invoke(h.app, {"messages": [("user", "pay bob 5")]}, h.config())

    assert len(bank.payments) == 1
    assert answers(out)[-1].content == "paid"


def test_unknown_on_the_last_attempt_is_still_reconciled(runner: Runner) -> None:
    """max_attempts=1: the lost answer of the only attempt is asked about, not handed back."""
    bank = Bank()
    pay = FaultyTool(make_pay(bank), [Fault.timeout(after_effect=True)])
    h = build_graph(
        [pay],
        [call("pay", {"to": "bob", "amount": 5}, "call_a"), text("done")],
        policy=ResiliencePolicy(max_attempts=1),
        profiles={"pay": ToolProfile(side_effect=True, status_check=bank.status)},
    )

    out = runner.invoke(h.app, {"messages": [("user", "pay bob 5")]}, h.config())

    [answer] = answers(out)
    assert (answer.status, answer.content) == ("success", "paid")
    assert len(bank.payments) == 1


def test_a_connect_timeout_is_retried_even_for_a_side_effect(runner: Runner) -> None:
    """The client says the request never left (httpx.ConnectTimeout): safe to retry, and
    the retry keeps the same key. A read timeout is UNKNOWN and is not retried blindly."""
    bank = Bank()
    pay = FaultyTool(
        make_pay(bank),
        [
            Fault.raises(httpx.ConnectTimeout("connect timed out")),
            None,
            Fault.raises(httpx.ReadTimeout("read timed out")),
        ],
    )
    h = build_graph(
        [pay],
        [
            call("pay", {"to": "bob", "amount": 5}, "call_a"),
            call("pay", {"to": "ann", "amount": 7}, "call_b"),
            text("done"),
        ],
        profiles={"pay": ToolProfile(side_effect=True)},
    )

    out = runner.invoke(h.app, {"messages": [("user", "pay bob 5 and ann 7")]}, h.config())

    first, second = answers(out)
    assert (first.status, first.content) == ("success", "paid")
    error = tool_error_of(second)
    assert error is not None
    assert error.failure_class == "unknown"
    assert [p["args"]["to"] for p in bank.payments] == ["bob"]
    assert pay.calls == 3


# ---------------------------------------------------------------- Retry-After cap


def test_a_day_long_retry_after_is_never_slept(runner: Runner) -> None:
    """Retry-After: 86400 is past max_retry_after: reported exhausted, with the wait."""

    @tool
    def quote(symbol: str) -> str:
        """Quote a stock."""
        return "42"

    flaky = FaultyTool(quote, [Fault.status(503, retry_after=86400)])
    h = build_graph([flaky], [call("quote", {"symbol": "X"}, "c1"), text("later")])

    out = runner.invoke(h.app, {"messages": [("user", "quote X")]}, h.config())

    [answer] = answers(out)
    error = tool_error_of(answer)
    assert error is not None
    assert error.context["exhausted"] == "retry_after"
    assert error.retry_after_ms == 86_400_000
    assert h.clock.sleeps == []
    assert flaky.calls == 1


# ---------------------------------------------------------- loops and tasks


def _cd_tool(fails: set[int]) -> tuple[Any, list[str]]:
    runs: list[str] = []

    @tool
    def cd(path: str) -> str:
        """Change directory."""
        runs.append(path)
        if len(runs) in fails:
            raise FakeHTTPError(409, body="directory is busy")
        return f"now in {path}"

    return cd, runs


def test_the_same_request_in_later_turns_is_not_a_loop(runner: Runner) -> None:
    """`cd temp` asked in three turns runs three times: a loop is a stuck task, not a user
    who asks again."""
    cd, runs = _cd_tool(set())
    responses: list[Any] = []
    for n in range(3):
        responses += [call("cd", {"path": "temp"}, f"c{n}"), text("ok")]
    h = build_graph([cd], responses)
    config = h.config()
    for _ in range(3):
        out = runner.invoke(h.app, {"messages": [("user", "cd temp")]}, config)

    assert runs == ["temp"] * 3
    assert all(m.status == "success" for m in answers(out))


def test_a_re_issue_after_a_handed_back_failure_is_not_a_loop(runner: Runner) -> None:
    """Within one task: answered, failed and handed back, re-issued: all three run. Failing
    loop_threshold times and asking again is a loop."""
    cd, runs = _cd_tool({2, 3})
    h = build_graph(
        [cd],
        [
            call("cd", {"path": "temp"}, "c1"),
            call("cd", {"path": "temp"}, "c2"),  # fails (404), handed back
            call("cd", {"path": "temp"}, "c3"),  # the re-issue: fails again
            call("cd", {"path": "temp"}, "c4"),  # two failures handed back: a loop
            text("giving up"),
        ],
    )

    out = runner.invoke(h.app, {"messages": [("user", "cd temp")]}, h.config())

    assert runs == ["temp"] * 3
    loop = tool_error_of(answers(out)[-1])
    assert loop is not None
    assert loop.context["exhausted"] == "loop"


def test_a_500_turn_conversation_with_the_default_policy_refuses_nothing(runner: Runner) -> None:
    """A chat thread is many tasks: every budget is per task, so turn 500 runs like turn 1."""
    runs = 0

    @tool
    def lookup(q: str) -> str:
        """Look something up."""
        nonlocal runs
        runs += 1
        return "result"

    turns = 500
    responses: list[Any] = []
    for n in range(turns):
        responses += [
            AIMessage(
                "",
                tool_calls=[
                    ToolCall(name="lookup", args={"q": "same"}, id="call_0", type="tool_call"),
                    ToolCall(name="lookup", args={"q": f"q{n}"}, id="call_1", type="tool_call"),
                ],
            ),
            text(f"answer {n}"),
        ]
    h = build_graph([lookup], responses)
    config = h.config()
    refused = 0
    for n in range(turns):
        out = runner.invoke(h.app, {"messages": [HumanMessage(f"question {n}")]}, config)
        refused += sum(1 for m in out["messages"][-3:-1] if m.status == "error")

    assert (runs, refused) == (2 * turns, 0)
    assert out["resilience"]["tool_attempts"] == 2 * turns
    assert out["resilience"]["task"]["tool_attempts"] == 2


# --------------------------------------------------------------------- subgraphs


def _subgraph(tool_runs: list[str], model: ScriptedChatModel) -> Any:
    @tool
    def lookup(q: str) -> str:
        """Look something up."""
        tool_runs.append(q)
        return "result"

    builder = StateGraph(State)
    builder.add_node("agent", lambda s: {"messages": [model.invoke(s["messages"])]})
    add_resilience(builder, agent="agent", tools=[lookup], clock=FakeClock(), rng=random.Random(1))
    return builder


def _script(turns: int) -> ScriptedChatModel:
    responses: list[Any] = []
    for n in range(turns):
        responses += [call("lookup", {"q": f"q{n}"}, f"c{n}"), text(f"a{n}")]
    return ScriptedChatModel(responses=responses)


def test_a_subgraph_ledger_is_not_added_to_its_parents_twice() -> None:
    """add_resilience in a subgraph whose parent has the ledger too: four real executions
    count four, turn after turn (the child's whole ledger replaces the parent's)."""
    runs: list[str] = []
    child = _subgraph(runs, _script(4)).compile()
    parent = StateGraph(State)
    parent.add_node("assistant", child)
    parent.add_edge(START, "assistant")
    app = parent.compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "t"}}
    for n in range(4):
        out = app.invoke({"messages": [("user", f"question {n}")]}, config)

    assert len(runs) == 4
    assert out["resilience"]["tool_attempts"] == 4
    assert out["resilience"]["task"]["tool_attempts"] == 1


def test_a_subgraph_under_a_parent_without_the_ledger_keeps_its_own() -> None:
    """A parent without the channel: the subgraph compiled with checkpointer=True keeps its
    ledger between parent turns, as ResilienceState's docstring says."""
    runs: list[str] = []
    child = _subgraph(runs, _script(3)).compile(checkpointer=True)
    parent = StateGraph(MessagesState)
    parent.add_node("assistant", child)
    parent.add_edge(START, "assistant")
    app = parent.compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "t"}}
    for n in range(3):
        app.invoke({"messages": [("user", f"question {n}")]}, config)

    own = app.checkpointer.get_tuple(
        {"configurable": {"thread_id": "t", "checkpoint_ns": "assistant"}}
    )
    assert len(runs) == 3
    assert own.checkpoint["channel_values"]["resilience"]["tool_attempts"] == 3


def test_a_later_task_may_ask_again_for_an_effect_it_was_told_is_unknown(
    runner: Runner,
) -> None:
    """Turn 1: the payment's answer is lost and the agent is told (its re-issue refused).
    Turn 2, a new human request for the same payment: informed, not blind, so it runs."""
    bank = Bank()
    pay = FaultyTool(make_pay(bank), [Fault.timeout(after_effect=True)])
    h = build_graph(
        [pay],
        [
            call("pay", {"to": "bob", "amount": 5}, "call_a"),
            call("pay", {"to": "bob", "amount": 5}, "call_b"),
            text("I could not confirm it"),
            call("pay", {"to": "bob", "amount": 5}, "call_c"),
            text("paid"),
        ],
        profiles={"pay": ToolProfile(side_effect=True)},
    )
    config = h.config()
    runner.invoke(h.app, {"messages": [("user", "pay bob 5")]}, config)
    assert len(bank.payments) == 1

    out = runner.invoke(h.app, {"messages": [("user", "it did not arrive: pay again")]}, config)

    assert len(bank.payments) == 2
    assert answers(out)[-1].content == "paid"


def test_an_unknown_effect_nobody_was_told_of_blocks_a_later_identical_call(
    runner: Runner,
) -> None:
    """A run cancelled (or crashed) mid-payment left an intent nobody was told about: the
    same payment asked for later is not run blindly."""
    bank = Bank()
    store = InMemoryIdempotencyStore()
    thread = "t-cancelled"
    args = {"to": "bob", "amount": 5}
    store.claim(
        "pay:cancelled-run",
        tool="pay",
        args_json=canonical_args(args),
        thread_id=thread,
        fingerprint=effect_fingerprint("pay", args, thread_id=thread),
    )
    h = build_graph(
        [make_pay(bank)],
        [call("pay", args, "call_0"), text("could not confirm")],
        profiles={"pay": ToolProfile(side_effect=True)},
        options={"idempotency": store},
    )

    out = runner.invoke(h.app, {"messages": [("user", "pay bob 5")]}, h.config(thread))

    assert bank.payments == []
    error = tool_error_of(answers(out)[-1])
    assert error is not None
    assert error.context["earlier_call"] is True
