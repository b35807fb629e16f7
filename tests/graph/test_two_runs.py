"""Two runs on one thread at once, on the plain invoke path: with a side-effecting tool
the second is refused (`ThreadBusyError`) before its model is asked, the first's effect
stays in the final thread, and once the first ends the thread takes the next run."""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Callable
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.messages import ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.errors import GraphInterrupt
from langgraph.types import Command, interrupt

from langgraph_resilience import ResilienceMiddleware, ThreadBusyError, ToolProfile
from langgraph_resilience._graph.run_lease import _LOCAL, RUN_LEASES
from langgraph_resilience.testing import FakeClock, ScriptedChatModel, text, tool_calls
from tests.conftest import Harness, Runner, build_graph


class Bank:
    """Payments; the first one waits, mid-effect, until the test lets it finish."""

    def __init__(self) -> None:
        self.paid: list[int] = []
        self.started = threading.Event()
        self.finish = threading.Event()

    def graph(self, *amounts: int, effects: bool = True) -> Harness:
        @tool
        def pay(amount: int) -> str:
            """Pay."""
            self.started.set()
            if not self.paid:
                self.finish.wait(30)
            self.paid.append(amount)
            return f"paid {amount}"

        script = [r for a in amounts for r in (tool_calls(("pay", {"amount": a})), text("ok"))]
        profiles = {"pay": ToolProfile(side_effect=True)} if effects else {}
        return build_graph([pay], script, profiles=profiles)


def _answers(out: dict[str, Any]) -> list[str]:
    return [str(m.content) for m in out["messages"] if isinstance(m, ToolMessage)]


def test_a_second_run_on_a_running_thread_is_refused() -> None:
    """The second run is refused before its model is asked; the first's payment is the
    final thread's, and the thread then takes the second request."""
    bank = Bank()
    h = bank.graph(10, 20)
    config = h.config()
    first: dict[str, Any] = {}
    running = threading.Thread(
        target=lambda: first.update(h.app.invoke({"messages": [("user", "pay 10")]}, config))
    )
    running.start()
    assert bank.started.wait(10)
    asked = h.model.calls

    with pytest.raises(ThreadBusyError):
        h.app.invoke({"messages": [("user", "pay 20")]}, config)
    assert h.model.calls == asked  # refused before its model was asked

    bank.finish.set()
    running.join(30)
    assert _answers(first) == ["paid 10"]
    assert _answers(h.app.get_state(config).values) == ["paid 10"]
    out = h.app.invoke({"messages": [("user", "pay 20")]}, config)
    assert _answers(out) == ["paid 10", "paid 20"]
    assert bank.paid == [10, 20]


def test_create_agent_with_the_middleware_refuses_a_second_run() -> None:
    """The same on `create_agent` + `ResilienceMiddleware`: the second run is refused
    before its model is asked, and the thread takes the next run once the first ended."""
    bank = Bank()

    @tool
    def pay(amount: int) -> str:
        """Pay."""
        bank.started.set()
        if not bank.paid:
            bank.finish.wait(30)
        bank.paid.append(amount)
        return f"paid {amount}"

    script = [r for a in (10, 20) for r in (tool_calls(("pay", {"amount": a})), text("ok"))]
    model = ScriptedChatModel(responses=script)
    middleware = ResilienceMiddleware(
        clock=FakeClock(), profiles={"pay": ToolProfile(side_effect=True)}
    )
    agent = create_agent(model, [pay], middleware=[middleware], checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "t-mw"}}
    first: dict[str, Any] = {}
    running = threading.Thread(
        target=lambda: first.update(agent.invoke({"messages": [("user", "pay 10")]}, config))
    )
    running.start()
    assert bank.started.wait(10)
    asked = model.calls
    with pytest.raises(ThreadBusyError):
        agent.invoke({"messages": [("user", "pay 20")]}, config)
    assert model.calls == asked

    bank.finish.set()
    running.join(30)
    assert _answers(first) == ["paid 10"]
    out = agent.invoke({"messages": [("user", "pay 20")]}, config)
    assert _answers(out) == ["paid 10", "paid 20"]


def test_a_run_paused_for_a_human_gives_its_thread_back() -> None:
    """A run that stops to ask a human ends: the human's answer (a new run) is taken at
    once, not refused until the paused run's lease lapses."""
    paid: list[int] = []

    @tool
    def pay(amount: int) -> str:
        """Pay."""
        raise PermissionError("needs approval")

    script = [tool_calls(("pay", {"amount": 1})), text("ok")]
    h = build_graph([pay], script, escalate=True, profiles={"pay": ToolProfile(side_effect=True)})
    config = h.config()
    gc.disable()  # no collector to free what the run left: the pause itself must
    try:
        paused = h.app.invoke({"messages": [("user", "pay")]}, config)
        assert paused["__interrupt__"]
        assert _LOCAL.holder(config["configurable"]["thread_id"]) is None
    finally:
        gc.enable()
    out = h.app.invoke(Command(resume={"action": "skip"}), config)  # not ThreadBusyError
    assert "__interrupt__" not in out
    assert paid == []


def test_two_async_runs_on_one_thread() -> None:
    """The same with two tasks of one event loop."""
    bank = Bank()
    h = bank.graph(10, 20)
    config = h.config()

    async def both() -> tuple[Any, Any]:
        first = asyncio.create_task(h.app.ainvoke({"messages": [("user", "pay 10")]}, config))
        await asyncio.to_thread(bank.started.wait, 10)
        second = await asyncio.gather(
            h.app.ainvoke({"messages": [("user", "pay 20")]}, config), return_exceptions=True
        )
        bank.finish.set()
        return await first, second[0]

    out, refused = asyncio.run(both())
    assert isinstance(refused, ThreadBusyError)
    assert _answers(out) == ["paid 10"]
    assert bank.paid == [10]


def test_a_run_that_died_does_not_keep_its_thread() -> None:
    """A run whose model raised: the next run on the thread is taken at once, not
    refused until the dead run's lease lapses."""
    paid: list[int] = []

    @tool
    def pay(amount: int) -> str:
        """Pay."""
        paid.append(amount)
        return "paid"

    def down(messages: list[Any]) -> Any:
        raise RuntimeError("the model is down")

    script = [tool_calls(("pay", {"amount": 1})), down, text("ok")]
    h = build_graph([pay], script, profiles={"pay": ToolProfile(side_effect=True)})
    config = h.config()
    with pytest.raises(RuntimeError, match="the model is down"):
        h.app.invoke({"messages": [("user", "pay")]}, config)
    out = h.app.invoke({"messages": [("user", "hello?")]}, config)
    assert out["messages"][-1].content == "ok"


def test_without_side_effects_runs_are_not_serialized() -> None:
    """No side-effecting tool, no lease: LangGraph's own behaviour, unchanged."""
    bank = Bank()
    h = bank.graph(10, 20, effects=False)
    config = h.config()
    running = threading.Thread(
        target=lambda: h.app.invoke({"messages": [("user", "pay 10")]}, config)
    )
    running.start()
    assert bank.started.wait(10)
    h.app.invoke({"messages": [("user", "pay 20")]}, config)  # not refused
    bank.finish.set()
    running.join(30)
    assert sorted(bank.paid) == [10, 20]


@pytest.mark.parametrize("effects", [False, True], ids=["reads only", "side effects"])
@pytest.mark.parametrize("entry", ["add_resilience", "create_agent"])
def test_steps_are_counted_only_where_a_run_may_hold_its_thread(
    monkeypatch: pytest.MonkeyPatch, entry: str, effects: bool
) -> None:
    """A run's steps are counted (so its lease goes back with the last one) only in a
    graph with a side-effecting tool: without one no run takes a lease, and its steps
    pay nothing for it."""
    counted: list[object] = []
    real = RUN_LEASES.step

    def step(config: Any, **kwargs: Any) -> Any:
        counted.append(config)
        return real(config, **kwargs)

    monkeypatch.setattr(RUN_LEASES, "step", step)
    if entry == "add_resilience":
        bank = Bank()
        bank.finish.set()
        h = bank.graph(10, effects=effects)
        out = h.app.invoke({"messages": [("user", "pay 10")]}, h.config())
        assert out["messages"][-1].content == "ok"
    else:

        @tool
        def pay(amount: int) -> str:
            """Pay."""
            return f"paid {amount}"

        agent = create_agent(
            ScriptedChatModel(responses=[tool_calls(("pay", {"amount": 10})), text("done")]),
            [pay],
            middleware=[
                ResilienceMiddleware(
                    profiles={"pay": ToolProfile(side_effect=True)} if effects else None,
                    clock=FakeClock(),
                )
            ],
            checkpointer=InMemorySaver(),
        )
        out = agent.invoke({"messages": [("user", "pay 10")]}, {"configurable": {"thread_id": "t"}})
        assert out["messages"][-1].content == "done"
    assert bool(counted) is effects


class _Sequenced(AgentMiddleware):  # type: ignore[type-arg]
    """Outside ResilienceMiddleware, orders a turn's calls (each a task of its own): with
    ``pay_first``, the payment is under way before the approvals pause; else it starts
    once both have paused."""

    def __init__(self, *, pay_first: bool) -> None:
        super().__init__()
        self.pay_first = pay_first
        self.paying, self.paused = threading.Event(), threading.Event()
        self.leased_while_paying: list[bool] = []
        self._pauses = 0
        self._guard = threading.Lock()

    def wrap_tool_call(self, request: Any, handler: Any) -> Any:
        if request.tool_call["name"] == "pay":
            if not self.pay_first:
                assert self.paused.wait(10)
            return handler(request)
        if self.pay_first:
            assert self.paying.wait(10)
        try:
            return handler(request)
        except GraphInterrupt:
            self._paused()
            raise

    async def awrap_tool_call(self, request: Any, handler: Any) -> Any:
        if request.tool_call["name"] == "pay":
            if not self.pay_first:
                assert await asyncio.to_thread(self.paused.wait, 10)
            return await handler(request)
        if self.pay_first:
            assert await asyncio.to_thread(self.paying.wait, 10)
        try:
            return await handler(request)
        except GraphInterrupt:
            self._paused()
            raise

    def _paused(self) -> None:
        with self._guard:
            self._pauses += 1
            if self._pauses == 2:
                self.paused.set()


def approving_agent(
    paid: list[int],
    *,
    pay_first: bool,
    leased: Callable[[], bool],
    checkpointer: BaseCheckpointSaver[Any] | None = None,
) -> tuple[Any, _Sequenced]:
    """create_agent + the middleware, whose model asks two humans and pays in one turn;
    `leased` says whether the thread is leased now (checked while paying)."""
    order = _Sequenced(pay_first=pay_first)

    @tool
    def approve(what: str) -> str:
        """Ask a human to approve."""
        return f"{what}: {interrupt(f'approve {what}?')}"

    @tool
    def pay(amount: int) -> str:
        """Pay."""
        order.paying.set()
        if order.pay_first:
            assert order.paused.wait(10)
        order.leased_while_paying.append(leased())
        paid.append(amount)
        return f"paid {amount}"

    calls = tool_calls(
        ("approve", {"what": "a"}), ("approve", {"what": "b"}), ("pay", {"amount": 5})
    )
    model = ScriptedChatModel(responses=[calls, text("ok")])
    ours = ResilienceMiddleware(clock=FakeClock(), profiles={"pay": ToolProfile(side_effect=True)})
    agent = create_agent(
        model,
        [approve, pay],
        middleware=[order, ours],
        checkpointer=checkpointer or InMemorySaver(),
    )
    return agent, order


@pytest.mark.parametrize("pay_first", [False, True], ids=["paused-first", "paying-first"])
def test_a_turn_paused_by_parallel_calls_gives_its_thread_back(
    runner: Runner, pay_first: bool
) -> None:
    """Two calls of one turn pause for a human while a sibling pays (create_agent runs
    each call as a task of its own): the run keeps its lease until its last call is
    done, so the payment is never cut off, then gives it back, so the answers are taken
    at once instead of refused until a lease lapses."""
    paid: list[int] = []
    thread = f"t-hitl-{pay_first}-{runner.mode}"
    leased = lambda: _LOCAL.holder(thread) is not None  # noqa: E731
    agent, order = approving_agent(paid, pay_first=pay_first, leased=leased)
    config: Any = {"configurable": {"thread_id": thread}}
    gc.disable()  # no collector to free what the run left: the pause itself must
    try:
        runner.invoke(agent, {"messages": [("user", "approve and pay")]}, config)
        pending = agent.get_state(config).interrupts
        assert len(pending) == 2
        assert order.leased_while_paying == [True]
        assert _LOCAL.holder(thread) is None
        out = runner.invoke(agent, Command(resume={i.id: "yes" for i in pending}), config)
    finally:
        gc.enable()
    assert out["messages"][-1].content == "ok"
    assert sorted(_answers(out)) == ["a: yes", "b: yes", "paid 5"]
    assert paid == [5]
