"""The prebuilt nodes are public building blocks: a graph wired by hand from them alone
(as LangGraph's `ToolNode` + `tools_condition`) recovers as `add_resilience`'s does; and
several agents in one graph are each a resilient graph of their own."""

from __future__ import annotations

import random
from typing import Any, Literal

import pytest
from langchain_core.messages import ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph

from langgraph_resilience import (
    AnswerPendingNode,
    ConfigurationError,
    FailureClass,
    GuardedToolNode,
    RepairNode,
    ResiliencePolicy,
    ResilienceState,
    RetryNode,
    ToolProfile,
    add_resilience,
    next_step,
    route_after_agent,
    tool_error_of,
)
from langgraph_resilience._graph.node import ResilienceNode
from langgraph_resilience.core.classification import Verdict
from langgraph_resilience.testing import (
    FakeClock,
    Fault,
    FaultyTool,
    ScriptedChatModel,
    text,
    tool_calls,
)
from tests.conftest import Runner
from tests.graph.test_middleware import transfer_to_writer


class State(MessagesState, ResilienceState):
    """The user's state."""


@tool
def get_weather(city: str) -> str:
    """Current weather for a city."""
    return f"{city}: 14°C"


@tool
def convert(amount: float, currency: Literal["EUR"]) -> str:
    """Convert an amount; only EUR is known (anything else is rejected before it runs)."""
    return f"{amount} {currency}"


def _script() -> list[Any]:
    return [tool_calls(("get_weather", {"city": "Oslo"})), text("14°C in Oslo.")]


def _agent(model: ScriptedChatModel, tools: list[Any]) -> Any:
    def agent(state: State) -> dict[str, Any]:
        return {"messages": [model.bind_tools(tools).invoke(state["messages"])]}

    return agent


def hand_wired(tools: list[Any], model: ScriptedChatModel, clock: FakeClock) -> Any:
    """The README's hand wiring: pending -> agent -> tools -> retry -> tools -> agent."""
    builder = StateGraph(State)
    builder.add_node("agent", _agent(model, tools))
    builder.add_node("answer_pending", AnswerPendingNode())
    node = GuardedToolNode(tools, policy=ResiliencePolicy(), clock=clock, rng=random.Random(0))
    builder.add_node("tools", node)
    builder.add_node("retry", RetryNode(clock=clock))
    builder.add_edge(START, "answer_pending")
    builder.add_edge("answer_pending", "agent")
    builder.add_conditional_edges("agent", route_after_agent, {"tools": "tools", "__end__": END})
    builder.add_conditional_edges(
        "tools", next_step, {"retry": "retry", "agent": "agent", "__end__": END}
    )
    builder.add_edge("retry", "tools")
    return builder.compile(checkpointer=InMemorySaver())


def test_a_hand_wired_graph_retries_like_add_resilience(runner: Runner) -> None:
    """Same faults, same script: the hand-wired graph and add_resilience's end with the
    same messages, the same attempts and the same backoff."""
    results = []
    for wiring in ("hand", "add_resilience"):
        clock = FakeClock()
        tools = [FaultyTool(get_weather, [Fault.status(503), Fault.status(503)])]
        model = ScriptedChatModel(responses=_script())
        if wiring == "hand":
            app = hand_wired(tools, model, clock)
        else:
            builder = StateGraph(State)
            builder.add_node("agent", _agent(model, tools))
            add_resilience(builder, agent="agent", tools=tools, clock=clock, rng=random.Random(0))
            app = builder.compile(checkpointer=InMemorySaver())
        config = {"configurable": {"thread_id": f"hand-{wiring}"}}
        out = runner.invoke(app, {"messages": [("user", "Weather in Oslo?")]}, config)
        answers = [m for m in out["messages"] if isinstance(m, ToolMessage)]
        results.append(
            (
                [(m.content, tool_error_of(m) is None) for m in answers],
                out["resilience"]["tool_attempts"],
                clock.sleeps,
                out["messages"][-1].content,
            )
        )
    assert results[0] == results[1]
    contents, attempts, sleeps, answer = results[0]
    assert contents == [("Oslo: 14°C", True)]
    assert attempts == 3
    assert len(sleeps) == 2
    assert answer == "14°C in Oslo."


def test_a_hand_wired_repair_node_fixes_a_semantic_failure(runner: Runner) -> None:
    """A subset of the recovery paths, by hand: the repair node behind next_step's
    ``repair`` branch rewrites the rejected arguments and the call succeeds."""
    clock = FakeClock()
    tools = [convert]
    model = ScriptedChatModel(
        responses=[tool_calls(("convert", {"amount": 5, "currency": "USD"})), text("5 EUR.")]
    )
    repairer = ScriptedChatModel(
        responses=[tool_calls(("convert", {"amount": 5, "currency": "EUR"}))]
    )
    builder = StateGraph(State)
    builder.add_node("agent", _agent(model, tools))
    node = GuardedToolNode(tools, clock=clock, can_repair=True, breaker=None)
    builder.add_node("tools", node)
    builder.add_node("repair", RepairNode(model=repairer, tools_by_name=node.tools_by_name))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", route_after_agent, {"tools": "tools", "__end__": END})
    onward = {"repair": "repair", "tools": "tools", "agent": "agent", "__end__": END}
    builder.add_conditional_edges("tools", next_step, onward)
    builder.add_conditional_edges("repair", next_step, onward)
    app = builder.compile(checkpointer=InMemorySaver())
    out = runner.invoke(
        app, {"messages": [("user", "5 in EUR?")]}, {"configurable": {"thread_id": "r"}}
    )
    answers = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert [(m.content, tool_error_of(m)) for m in answers] == [("5.0 EUR", None)]
    assert out["messages"][-1].content == "5 EUR."


def test_every_prebuilt_node_is_a_resilience_node() -> None:
    """Each node is a Runnable that add_node takes as is (no wrapper)."""
    clock = FakeClock()
    node = GuardedToolNode([get_weather], clock=clock)
    nodes = [node, RetryNode(), AnswerPendingNode()]
    assert all(isinstance(n, ResilienceNode) for n in nodes)


class OutOfStock(Exception):
    """A shop's own exception, which only the user's rule knows."""


def _out_of_stock(error: BaseException, profile: Any) -> Verdict | None:
    if isinstance(error, OutOfStock):
        return Verdict(FailureClass.SEMANTIC, "ask_user")
    return None


def test_rules_extend_the_built_in_table_on_a_hand_wired_node(runner: Runner) -> None:
    """``GuardedToolNode(rules=[mine])`` means what ``add_resilience(rules=[mine])`` means:
    mine first, then the built-in table (a 503 is still TRANSIENT and retried)."""
    clock = FakeClock()
    flaky = FaultyTool(get_weather, [Fault.status(503)])

    @tool
    def buy(item: str) -> str:
        """Buy an item."""
        raise OutOfStock(item)

    model = ScriptedChatModel(
        responses=[
            tool_calls(("get_weather", {"city": "Oslo"}), ("buy", {"item": "umbrella"})),
            text("done"),
        ]
    )
    node = GuardedToolNode([flaky, buy], clock=clock, rules=[_out_of_stock])
    builder = StateGraph(State)
    builder.add_node("agent", _agent(model, [flaky, buy]))
    builder.add_node("tools", node)
    builder.add_node("retry", RetryNode(clock=clock))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", route_after_agent, {"tools": "tools", "__end__": END})
    builder.add_conditional_edges(
        "tools", next_step, {"retry": "retry", "agent": "agent", "__end__": END}
    )
    builder.add_edge("retry", "tools")
    app = builder.compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "rules"}}
    out = runner.invoke(app, {"messages": [("user", "weather, then an umbrella")]}, config)
    answers = {m.name: m for m in out["messages"] if isinstance(m, ToolMessage)}
    assert answers["get_weather"].status == "success"
    refused = tool_error_of(answers["buy"])
    assert refused is not None
    assert refused.failure_class == "semantic"
    assert refused.suggested_action == "ask_user"


@tool("search")
def _search(q: str) -> str:
    """Search the notes."""
    return f"found {q}"


def _echo(state: State) -> dict[str, Any]:
    return {"messages": []}


def test_a_second_add_resilience_on_one_graph_says_how_to_build_several_agents() -> None:
    builder = StateGraph(State)
    builder.add_node("researcher", _echo)
    builder.add_node("writer", _echo)
    add_resilience(builder, agent="researcher", tools=[_search])
    with pytest.raises(ConfigurationError, match=r"already applied .*checkpointer=True"):
        add_resilience(builder, agent="writer", tools=[_search], node_names={"tools": "w_tools"})


def test_several_agents_are_each_a_resilient_graph_of_their_own(runner: Runner) -> None:
    """A researcher and a writer, each compiled with add_resilience, as the nodes of one
    parent graph: the researcher's 503 is retried, the writer's payment runs once a
    turn, and every call of both is answered."""
    flaky = FaultyTool(_search, [Fault.status(503)])
    paid: list[str] = []

    @tool
    def pay(item: str) -> str:
        """Pay for an item."""
        paid.append(item)
        return f"paid {item}"

    def agent(name: str, tools: list[Any], calls: Any, **options: Any) -> Any:
        model = ScriptedChatModel(responses=[calls, text(f"{name} done")] * 2)
        graph = StateGraph(State)
        graph.add_node(name, lambda state: {"messages": [model.invoke(state["messages"])]})
        add_resilience(graph, agent=name, tools=tools, clock=FakeClock(), **options)
        return graph.compile(checkpointer=True)

    parent = StateGraph(MessagesState)
    parent.add_node("researcher", agent("researcher", [flaky], tool_calls(("search", {"q": "a"}))))
    profiles = {"pay": ToolProfile(side_effect=True)}
    parent.add_node(
        "writer", agent("writer", [pay], tool_calls(("pay", {"item": "a"})), profiles=profiles)
    )
    parent.add_edge(START, "researcher")
    parent.add_edge("researcher", "writer")
    parent.add_edge("writer", END)
    app = parent.compile(checkpointer=InMemorySaver())
    config: Any = {"configurable": {"thread_id": "two-agents"}}

    for ask in ("first", "second"):
        out = runner.invoke(app, {"messages": [("user", ask)]}, config)

    answers = [m.content for m in out["messages"] if isinstance(m, ToolMessage)]
    assert answers == ["found a", "paid a"] * 2
    assert (flaky.calls, paid) == (3, ["a", "a"])


def test_a_handoff_from_a_resilient_agent_reaches_the_parent_graph(runner: Runner) -> None:
    """A handoff tool's `Command` to the parent graph (langgraph-swarm's) goes there."""
    model = ScriptedChatModel(responses=[tool_calls(("transfer_to_writer", {}))])
    researcher = StateGraph(State)
    researcher.add_node("agent", lambda state: {"messages": [model.invoke(state["messages"])]})
    add_resilience(researcher, agent="agent", tools=[transfer_to_writer], clock=FakeClock())
    writer = ScriptedChatModel(responses=[text("writer here")])
    parent = StateGraph(State)
    parent.add_node("researcher", researcher.compile(), destinations=("writer",))
    parent.add_node("writer", lambda state: {"messages": [writer.invoke(state["messages"])]})
    parent.add_edge(START, "researcher")
    parent.add_edge("writer", END)
    app = parent.compile(checkpointer=InMemorySaver())

    out = runner.invoke(app, {"messages": [("user", "write me a poem")]}, _config_of("handoff"))

    assert [m.content for m in out["messages"][1:]] == ["Transferred to writer", "writer here"]


def _config_of(thread: str) -> Any:
    return {"configurable": {"thread_id": thread}}
