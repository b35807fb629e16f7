"""Short backoffs retried inside the tools step; long ones through the retry node; both
under every budget, and what a crash inside the step repeats (the crash rule)."""

from __future__ import annotations

import json
import random
import uuid
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from langgraph_resilience import (
    ResilienceMiddleware,
    ResiliencePolicy,
    ToolProfile,
    current_idempotency_key,
)
from langgraph_resilience.errors import ConfigurationError
from langgraph_resilience.events import EVENT_KEY
from langgraph_resilience.stores import EffectStatus
from langgraph_resilience.testing import (
    FakeClock,
    Fault,
    FaultyTool,
    ScriptedChatModel,
    text,
    tool_calls,
)
from tests.conftest import Runner, build_graph, seeded_delays


@tool
def search(query: str) -> str:
    """Search the web."""
    return f"results for {query}"


@tool
def weather(city: str) -> str:
    """Weather for a city."""
    return f"sunny in {city}"


class _Stop(BaseException):
    """The process dies (a kill, a deploy) while the step runs."""


class DyingClock(FakeClock):
    """A FakeClock whose `die_at`-th sleep kills the process (1-based; 0: never)."""

    def __init__(self, die_at: int) -> None:
        super().__init__()
        self.die_at = die_at

    def _maybe_die(self) -> None:
        if len(self.sleeps) + 1 == self.die_at:
            self.die_at = 0
            raise _Stop

    def sleep(self, seconds: float) -> None:
        self._maybe_die()
        super().sleep(seconds)

    async def asleep(self, seconds: float) -> None:
        self._maybe_die()
        await super().asleep(seconds)


def _run(runner: Runner, app: Any, inp: Any, config: Any) -> tuple[list[str], list[Any], Any]:
    """The nodes that ran (but the check for calls a stopped run left, on new input), the
    events, and the final state."""
    chunks = runner.stream(app, inp, config, stream_mode=["updates", "custom"])
    nodes = [
        name
        for mode, chunk in chunks
        if mode == "updates"
        for name in chunk
        if name != "answer_pending"
    ]
    events = [c for mode, c in chunks if mode == "custom" and EVENT_KEY in c]
    return nodes, events, app.get_state(config).values


def _attempts(events: list[Any]) -> list[tuple[int, bool]]:
    return [(e["attempt"], e["ok"]) for e in events if e[EVENT_KEY] == "attempt"]


def _answers(state: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in state["messages"] if isinstance(m, ToolMessage)]


def test_a_short_backoff_is_retried_inside_the_tools_step(runner: Runner) -> None:
    """A 503 with a short backoff is retried in the same tools step: no retry node, the
    exact seeded delay slept on the clock, every attempt in the events and the ledger."""
    flaky = FaultyTool(search, [Fault.status(503)])
    h = build_graph([flaky], [tool_calls(("search", {"query": "x"})), text("ok")])

    nodes, events, state = _run(runner, h.app, {"messages": [("user", "x")]}, h.config())

    assert nodes == ["agent", "tools", "agent"]
    assert flaky.calls == 2
    assert h.clock.sleeps == pytest.approx(seeded_delays(7, 1))
    assert _attempts(events) == [(1, False), (2, True)]
    [backoff] = [e for e in events if e[EVENT_KEY] == "backoff"]
    assert backoff["in_step"] is True
    assert backoff["seconds"] == pytest.approx(seeded_delays(7, 1)[0], abs=1e-6)
    assert state["resilience"]["tool_attempts"] == 2
    assert state["resilience"]["events"]["backoff"] == 1
    assert [m.status for m in _answers(state)] == ["success"]


def test_a_long_wait_is_a_checkpointed_retry_node_step(runner: Runner) -> None:
    """A Retry-After beyond inline_retry_max_wait is slept by the retry node, its own step."""
    flaky = FaultyTool(search, [Fault.status(429, retry_after="5")])
    h = build_graph([flaky], [tool_calls(("search", {"query": "x"})), text("ok")])

    nodes, _, state = _run(runner, h.app, {"messages": [("user", "x")]}, h.config())

    assert nodes == ["agent", "tools", "retry", "tools", "agent"]
    assert h.clock.sleeps == [5.0]
    assert state["resilience"]["tool_attempts"] == 2


def test_none_sends_every_retry_through_the_retry_node(runner: Runner) -> None:
    """inline_retry_max_wait=None: even a short backoff is a retry node step."""
    flaky = FaultyTool(search, [Fault.status(503)])
    h = build_graph(
        [flaky],
        [tool_calls(("search", {"query": "x"})), text("ok")],
        policy=ResiliencePolicy(inline_retry_max_wait=None),
    )

    nodes, _, _ = _run(runner, h.app, {"messages": [("user", "x")]}, h.config())

    assert nodes == ["agent", "tools", "retry", "tools", "agent"]


def test_a_negative_threshold_is_rejected() -> None:
    """A wait below zero is no threshold: the policy says how to fix it."""
    with pytest.raises(ConfigurationError, match="inline_retry_max_wait"):
        ResiliencePolicy(inline_retry_max_wait=-1)


def test_max_attempts_bounds_the_retries_inside_the_step(runner: Runner) -> None:
    """A tool that always answers 503 runs max_attempts times, all in one tools step."""
    down = FaultyTool(search, then=Fault.status(503))
    h = build_graph(
        [down],
        [tool_calls(("search", {"query": "x"})), text("sorry")],
        policy=ResiliencePolicy(max_attempts=3),
    )

    nodes, events, state = _run(runner, h.app, {"messages": [("user", "x")]}, h.config())

    assert nodes == ["agent", "tools", "agent"]
    assert down.calls == 3
    assert _attempts(events) == [(1, False), (2, False), (3, False)]
    assert h.clock.sleeps == pytest.approx(seeded_delays(7, 2))
    [answer] = _answers(state)
    envelope = json.loads(str(answer.content))
    assert (envelope["attempt"], envelope["context"]["exhausted"]) == (3, "max_attempts")


def test_the_task_budget_bounds_the_retries_inside_the_step(runner: Runner) -> None:
    """Two failing calls share max_tool_attempts=3: three executions in all, then both
    are answered, within the one tools step."""
    a = FaultyTool(search, then=Fault.status(503))
    b = FaultyTool(weather, then=Fault.status(503))
    h = build_graph(
        [a, b],
        [tool_calls(("search", {"query": "x"}), ("weather", {"city": "Oslo"})), text("ok")],
        policy=ResiliencePolicy(max_attempts=3, max_tool_attempts=3),
    )

    nodes, _, state = _run(runner, h.app, {"messages": [("user", "x")]}, h.config())

    assert nodes == ["agent", "tools", "agent"]
    assert a.calls + b.calls == 3
    assert state["resilience"]["tool_attempts"] == 3
    reasons = sorted(json.loads(str(m.content))["context"]["exhausted"] for m in _answers(state))
    assert reasons == ["max_tool_attempts", "max_tool_attempts"]


def test_the_deadline_bounds_the_retries_inside_the_step(runner: Runner) -> None:
    """With a 1 s task deadline, the step's backoffs never sleep past it."""
    down = FaultyTool(search, then=Fault.status(503))
    h = build_graph(
        [down],
        [tool_calls(("search", {"query": "x"})), text("sorry")],
        policy=ResiliencePolicy(max_attempts=50, max_delay=0.5, deadline=1.0),
    )

    nodes, _, state = _run(runner, h.app, {"messages": [("user", "x")]}, h.config())

    assert nodes == ["agent", "tools", "agent"]
    assert sum(h.clock.sleeps) <= 1.0
    assert len(h.clock.sleeps) == down.calls - 1
    [answer] = _answers(state)
    assert json.loads(str(answer.content))["context"]["exhausted"] == "deadline"


def test_a_crash_inside_the_step_repeats_its_attempts_once(runner: Runner) -> None:
    """The crash rule: the process dies in the step's second backoff (2 executions made,
    none checkpointed); the resumed step counts from its checkpoint again, so those 2 are
    repeated once: 3 recorded attempts, 5 executions in all."""
    down = FaultyTool(search, then=Fault.status(503))
    h = build_graph(
        [down],
        [tool_calls(("search", {"query": "x"})), text("sorry")],
        policy=ResiliencePolicy(max_attempts=3),
        clock=DyingClock(die_at=2),
    )
    config = h.config()
    with pytest.raises(_Stop):
        runner.invoke(h.app, {"messages": [("user", "x")]}, config)
    assert down.calls == 2
    assert h.app.get_state(config).next == ("tools",)

    nodes, events, state = _run(runner, h.app, None, config)

    assert nodes == ["tools", "agent"]
    assert _attempts(events) == [(1, False), (2, False), (3, False)]
    assert down.calls == 5
    assert state["resilience"]["tool_attempts"] == 3
    [answer] = _answers(state)
    assert json.loads(str(answer.content))["attempt"] == 3


def test_a_crash_during_a_long_backoff_resumes_with_its_attempt_count(runner: Runner) -> None:
    """The process dies in the retry node's backoff: the resumed thread sleeps what is left
    and runs the call as its second attempt (the first one was checkpointed)."""
    flaky = FaultyTool(search, [Fault.status(429, retry_after="5")])
    h = build_graph(
        [flaky],
        [tool_calls(("search", {"query": "x"})), text("ok")],
        clock=DyingClock(die_at=1),
    )
    config = h.config()
    with pytest.raises(_Stop):
        runner.invoke(h.app, {"messages": [("user", "x")]}, config)
    assert h.app.get_state(config).next == ("retry",)

    nodes, events, state = _run(runner, h.app, None, config)

    assert nodes == ["retry", "tools", "agent"]
    assert _attempts(events) == [(2, True)]
    assert flaky.calls == 2
    assert state["resilience"]["tool_attempts"] == 2
    assert h.clock.sleeps == [5.0]


class Bank:
    """A payment service that deduplicates nothing: every charge is a new payment."""

    def __init__(self) -> None:
        self.payments: list[tuple[str, int]] = []
        self.die_after_paying = True

    def status(self, key: str) -> EffectStatus:
        done = [p for p in self.payments if p[0] == key]
        return EffectStatus(done=bool(done), result=f"charged {done[0][1]}" if done else None)


def test_a_crash_inside_the_step_never_repeats_a_side_effect(runner: Runner) -> None:
    """A charge answers 503, is retried inside the step, pays, and the process dies before
    the step ends: the resumed step reconciles the claim it finds (status_check), it does
    not charge again. One payment."""
    bank = Bank()

    @tool
    def charge(amount: int) -> str:
        """Charge the customer's card."""
        key = current_idempotency_key()
        assert key is not None
        bank.payments.append((key, amount))
        if bank.die_after_paying:
            bank.die_after_paying = False
            raise _Stop
        return f"charged {amount}"

    flaky = FaultyTool(charge, [Fault.status(503)])
    h = build_graph(
        [flaky],
        [tool_calls(("charge", {"amount": 30})), text("paid")],
        profiles={"charge": ToolProfile(side_effect=True, status_check=bank.status)},
    )
    config = h.config()
    with pytest.raises(_Stop):
        runner.invoke(h.app, {"messages": [("user", "pay 30")]}, config)
    assert len(h.clock.sleeps) == 1  # the 503's backoff, inside the step

    _, _, state = _run(runner, h.app, None, config)

    assert len(bank.payments) == 1
    [answer] = _answers(state)
    assert (answer.status, answer.content) == ("success", "charged 30")
    assert answer.response_metadata["resilience"]["reconciled"] is True


def _agent(tools: list[Any], responses: list[Any], **options: Any) -> tuple[Any, FakeClock]:
    clock = FakeClock()
    model = ScriptedChatModel(responses=responses)
    middleware = ResilienceMiddleware(clock=clock, **options)
    agent = create_agent(model, tools, middleware=[middleware], checkpointer=InMemorySaver())
    return agent, clock


def test_the_middleware_retries_a_short_backoff_inside_wrap_tool_call(runner: Runner) -> None:
    """Under create_agent a short backoff is retried in the call's own task: the tools node
    runs once and before_model never sends the agent back to the tools."""
    flaky = FaultyTool(search, [Fault.status(503)])
    responses = [tool_calls(("search", {"query": "x"})), text("ok")]
    agent, clock = _agent([flaky], responses, rng=random.Random(7))
    config = {"configurable": {"thread_id": uuid.uuid4().hex}}

    nodes, events, state = _run(runner, agent, {"messages": [("user", "x")]}, config)

    assert [n for n in nodes if n == "tools"] == ["tools"]
    assert flaky.calls == 2
    assert clock.sleeps == pytest.approx(seeded_delays(7, 1))
    assert _attempts(events) == [(1, False), (2, True)]
    assert [m.status for m in _answers(state)] == ["success"]


def test_the_middleware_still_checkpoints_a_long_wait(runner: Runner) -> None:
    """Under create_agent a long Retry-After leaves the call waiting for before_model,
    which sleeps it and sends the agent back to the tools: two tools steps."""
    flaky = FaultyTool(search, [Fault.status(429, retry_after="5")])
    agent, clock = _agent([flaky], [tool_calls(("search", {"query": "x"})), text("ok")])
    config = {"configurable": {"thread_id": uuid.uuid4().hex}}

    nodes, _, state = _run(runner, agent, {"messages": [("user", "x")]}, config)

    assert [n for n in nodes if n == "tools"] == ["tools", "tools"]
    assert clock.sleeps == [5.0]
    assert [m.status for m in _answers(state)] == ["success"]


def test_the_step_waits_exactly_what_the_retry_node_would(runner: Runner) -> None:
    """Two calls failing with different backoffs: the step sleeps until the earliest due
    call each time, the same waits and executions as through the retry node."""

    def run(policy: ResiliencePolicy) -> tuple[list[float], int, list[str]]:
        a = FaultyTool(search, then=Fault.status(503))
        b = FaultyTool(weather, then=Fault.status(502))
        h = build_graph(
            [a, b],
            [tool_calls(("search", {"query": "x"}), ("weather", {"city": "Oslo"})), text("ok")],
            policy=policy,
        )
        nodes, _, _ = _run(runner, h.app, {"messages": [("user", "x")]}, h.config())
        return h.clock.sleeps, a.calls + b.calls, nodes

    inline = run(ResiliencePolicy(max_attempts=3, max_tool_attempts=5))
    through_node = run(
        ResiliencePolicy(max_attempts=3, max_tool_attempts=5, inline_retry_max_wait=None)
    )

    assert inline[0] == pytest.approx(through_node[0])
    assert inline[1] == through_node[1] == 5
    assert inline[2] == ["agent", "tools", "agent"]
    assert "retry" in through_node[2]
