"""Random turns through both entry points, as real agents make them: parallel calls,
ids reused per message, identical calls, arguments to coerce or reject, a tool that
is not there, a tool answering with a `Command`, calls that pause for a human, and
every failure class on the tools. Whatever happens, the invariants hold: the run ends
(no exception), the model is never asked with a call unanswered, every assistant call
is answered by exactly one `ToolMessage`, and a side effect runs at most once per
key within one assistant message (a later message may repeat it under its earlier
key only as DESIGN.md section 5 allows: an informed re-issue, or ``safe_repeat``).
The same turns through plain `ToolNode` end the same way, as the reference that the
script is sound. (A longer run of a generator like this one found the lease a paused
turn kept, now pinned by tests/graph/test_two_runs.py.)"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from typing import Annotated, Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import BaseTool, InjectedToolCallId, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import InjectedState, ToolNode, tools_condition
from langgraph.types import Command, interrupt

from langgraph_resilience import (
    ResilienceMiddleware,
    ResiliencePolicy,
    ResilienceState,
    ToolProfile,
    add_resilience,
    current_idempotency_key,
)
from langgraph_resilience.testing import FakeClock, FakeHTTPError, ScriptedChatModel
from tests.conftest import Runner

SEEDS = range(40)
FAULTS = ["ok"] * 6 + [
    "503",
    "429",
    "429 long",
    "404",
    "401",
    "refused",
    "timeout",
    "timeout after",
    "value",
]


class State(MessagesState, ResilienceState): ...


class World:
    """The services behind the tools: each execution takes the next fault of its tool;
    every charge that happened is kept with its key and the message that asked."""

    def __init__(self, rng: random.Random) -> None:
        names = ("search", "weather", "charge", "handoff")
        self.faults = {name: [rng.choice(FAULTS) for _ in range(30)] for name in names}
        self.charges: list[tuple[str | None, str | None]] = []

    def _fault(self, name: str, effect: Callable[[], None] = lambda: None) -> None:
        fault = self.faults[name].pop(0) if self.faults[name] else "ok"
        errors: dict[str, Exception] = {
            "503": FakeHTTPError(503),
            "429": FakeHTTPError(429, headers={"Retry-After": "0.2"}),
            "429 long": FakeHTTPError(429, headers={"Retry-After": "20"}),
            "404": FakeHTTPError(404),
            "401": FakeHTTPError(401),
            "refused": ConnectionRefusedError("service: connection refused"),
            "timeout": TimeoutError("timed out"),
            "value": ValueError("amount must be positive"),
        }
        if fault in ("ok", "timeout after"):
            effect()
        if fault == "timeout after":
            raise TimeoutError("read timed out")
        if fault != "ok":
            raise errors[fault]

    def tools(self) -> list[BaseTool]:
        world = self

        @tool
        def search(query: str) -> str:
            """Search the catalogue."""
            world._fault("search")
            return f"results for {query}"

        @tool
        def weather(city: str) -> str:
            """Weather in a city."""
            world._fault("weather")
            return f"sunny in {city}"

        @tool
        def charge(amount: int, state: Annotated[dict[str, Any], InjectedState]) -> str:
            """Charge the card."""
            asked = next(m.id for m in reversed(state["messages"]) if isinstance(m, AIMessage))
            world._fault("charge", lambda: world.charges.append((current_key(), asked)))
            return f"charged {amount}"

        @tool
        def handoff(note: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> Command:  # type: ignore[type-arg]
            """Leave a note for a colleague."""
            world._fault("handoff")
            answer = ToolMessage(f"noted {note}", tool_call_id=tool_call_id)
            return Command(update={"messages": [answer]})

        @tool
        def approve(what: str) -> str:
            """Ask a human to approve."""
            return f"{what}: {interrupt(f'approve {what}?')}"

        return [search, weather, charge, handoff, approve]


def current_key() -> str | None:
    try:
        return current_idempotency_key()
    except Exception:  # plain ToolNode: no key
        return None


def _turns(rng: random.Random) -> list[list[dict[str, Any]]]:
    """The assistant messages of one task: 1-3, each with 1-3 calls."""
    ids = rng.choice(["unique", "per message"])
    messages = []
    for m in range(rng.randint(1, 3)):
        calls = []
        for i in range(rng.randint(1, 3)):
            name = rng.choice(
                ["search", "weather", "charge", "charge", "handoff", "approve", "ghost"]
            )
            args = {
                "search": {"query": rng.choice(["a", "b"])},
                "weather": {"city": rng.choice(["Oslo", "Rome"])},
                "charge": rng.choice(
                    [{"amount": 5}, {"amount": 7}, {"amount": "5"}, {}, {"amount": "x"}]
                ),
                "handoff": {"note": "n"},
                "approve": {"what": "w"},
                "ghost": {"x": 1},
            }[name]
            call_id = f"c{m}{i}{rng.randrange(10**6)}" if ids == "unique" else f"call_{i}"
            calls.append({"name": name, "args": args, "id": call_id, "type": "tool_call"})
        messages.append(calls)
    return messages


def _model(turns: list[list[dict[str, Any]]], unanswered: list[str]) -> ScriptedChatModel:
    """Answers the scripted calls, then "done"; records every request whose history
    leaves an assistant call unanswered (providers reject those)."""

    def check(history: list[BaseMessage]) -> None:
        waiting: Counter[str] = Counter()
        for message in history:
            if isinstance(message, AIMessage):
                if waiting:
                    unanswered.append(f"before the next assistant message: {sorted(waiting)}")
                waiting = Counter(c["id"] for c in message.tool_calls)
            elif isinstance(message, ToolMessage):
                if waiting[message.tool_call_id] <= 0:
                    unanswered.append(f"an extra answer: {message.tool_call_id}")
                waiting[message.tool_call_id] -= 1
                waiting += Counter()  # drop the answered
        if waiting:
            unanswered.append(f"asked with {sorted(waiting)} unanswered")

    def asking(index: int, calls: list[dict[str, Any]]) -> Callable[[list[BaseMessage]], AIMessage]:
        def respond(history: list[BaseMessage]) -> AIMessage:
            check(history)
            return AIMessage("", tool_calls=[dict(c) for c in calls], id=f"ai-{index}")  # type: ignore[misc]

        return respond

    def done(history: list[BaseMessage]) -> AIMessage:
        check(history)
        return AIMessage("done")

    return ScriptedChatModel(responses=[*map(asking, range(len(turns)), turns), done, done])


def _profiles(rng: random.Random) -> dict[str, ToolProfile]:
    """A charge is a side effect; sometimes its service deduplicates by our key (then it
    may be sent again under one key); sometimes weather falls back to search."""
    charge: dict[str, Any] = {"side_effect": True}
    if rng.random() < 0.2:
        charge["safe_repeat"] = "by_key"
    profiles = {"charge": ToolProfile(**charge)}
    if rng.random() < 0.3:
        profiles["weather"] = ToolProfile(fallback="search")
    return profiles


def _build(
    system: str, tools: list[BaseTool], model: ScriptedChatModel, options: dict[str, Any]
) -> Any:
    saver = InMemorySaver()
    if system == "ToolNode":
        builder = StateGraph(MessagesState)
        builder.add_node("agent", lambda s: {"messages": [model.invoke(s["messages"])]})
        builder.add_node("tools", ToolNode(tools, handle_tool_errors=True))
        builder.add_edge(START, "agent")
        builder.add_conditional_edges("agent", tools_condition)
        builder.add_edge("tools", "agent")
        return builder.compile(checkpointer=saver)
    if system == "create_agent":
        return create_agent(
            model, tools, middleware=[ResilienceMiddleware(**options)], checkpointer=saver
        )

    async def acall(state: State) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(State)
    call = RunnableLambda(lambda s: {"messages": [model.invoke(s["messages"])]}, afunc=acall)
    builder.add_node("agent", call)
    add_resilience(builder, agent="agent", tools=tools, **options)
    return builder.compile(checkpointer=saver)


def _audit(messages: list[BaseMessage]) -> list[str]:
    """Assistant calls not answered by exactly one ToolMessage right after them."""
    wrong = []
    for index, message in enumerate(messages):
        if isinstance(message, AIMessage) and message.tool_calls:
            answers: Counter[str] = Counter()
            for later in messages[index + 1 :]:
                if not isinstance(later, ToolMessage):
                    break
                answers[later.tool_call_id] += 1
            wanted = Counter(c["id"] for c in message.tool_calls)
            if answers != wanted:
                wrong.append(f"{dict(wanted)} answered by {dict(answers)}")
    return wrong


def _run(runner: Runner, system: str, seed: int) -> dict[str, Any]:
    rng, variant = random.Random(seed), random.Random(seed)
    turns, world, unanswered = _turns(rng), World(rng), []
    model = _model(turns, unanswered)
    policy = ResiliencePolicy(
        max_attempts=variant.randint(1, 4), max_tool_attempts=variant.choice([4, 40])
    )
    profiles = _profiles(variant)
    options = {"policy": policy, "profiles": profiles, "clock": FakeClock(), "rng": variant}
    app = _build(system, world.tools(), model, options)
    config: Any = {"configurable": {"thread_id": f"{system}-{seed}"}, "recursion_limit": 60}
    request: Any = {"messages": [HumanMessage("go")]}
    for _ in range(8):  # a pause is answered "yes" until the task ends
        runner.invoke(app, request, config)
        pending = app.get_state(config).interrupts
        if not pending:
            break
        request = Command(resume={p.id: "yes" for p in pending})
    messages = app.get_state(config).values["messages"]
    by_message = Counter(world.charges)
    resent = profiles["charge"].safe_repeat == "by_key"  # the service deduplicates
    return {
        "ended": messages[-1].content == "done",
        "unanswered": unanswered,
        "audit": _audit(messages),
        "twice": {k: n for k, n in by_message.items() if k[0] and n > 1 and not resent},
    }


@pytest.mark.parametrize("seed", SEEDS)
def test_random_turns_keep_every_invariant(runner: Runner, seed: int) -> None:
    plain = _run(runner, "ToolNode", seed)
    assert (plain["ended"], plain["unanswered"], plain["audit"]) == (True, [], []), plain
    for system in ("add_resilience", "create_agent"):
        ours = _run(runner, system, seed)
        assert ours == {"ended": True, "unanswered": [], "audit": [], "twice": {}}, (system, ours)
