"""`add_resilience`: add the recovery nodes and routers to a user's `StateGraph`.

The user keeps their graph, their state and their agent node; we add the tools
node and one node per enabled recovery path, plus the conditional edges, the
way `ToolNode` + `tools_condition` are wired by hand in LangGraph's guides::

    agent --tool calls--> tools --all answered--> agent
                            |  ^
        (next_step) retry --+  +-- repair / escalate (human) / executor
                    planner --> executor --plan layer--> tools

Every recovery node ends with the same router, `next_step`, so the order in
which waiting calls are served is defined in one place. The tools node, on every
turn's path, runs it itself (`SelfRouted`) instead of a conditional edge after it.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.config import set_config_context
from langchain_core.tools import BaseTool
from langgraph.channels.binop import BinaryOperatorAggregate
from langgraph.graph import END, START, StateGraph

from langgraph_resilience._graph.escalate import EscalateNode
from langgraph_resilience._graph.node import ResilienceNode
from langgraph_resilience._graph.pending import AnswerPendingNode, route_entry
from langgraph_resilience._graph.planner import PlanExecutorNode, PlannerNode, route_after_executor
from langgraph_resilience._graph.repair import RepairNode
from langgraph_resilience._graph.retry import RetryNode
from langgraph_resilience._graph.router import Next, SelfRouted, next_step, route_after_agent
from langgraph_resilience._graph.state import merge_tally
from langgraph_resilience._graph.tools import DEFAULT_BREAKER, GuardedToolNode
from langgraph_resilience.core.breaker import BreakerConfig, BreakerStore
from langgraph_resilience.core.budget import RetryBudget
from langgraph_resilience.core.classification import Rule
from langgraph_resilience.core.clock import Clock
from langgraph_resilience.core.effects import IdempotencyStore, SagaLog
from langgraph_resilience.core.policy import ResiliencePolicy
from langgraph_resilience.core.profile import ToolProfile
from langgraph_resilience.errors import ConfigurationError
from langgraph_resilience.events import Event, emit
from langgraph_resilience.stores.budgets import InMemoryRetryBudgetStore, PostgresRetryBudgetStore

__all__ = ["DEFAULT_NODE_NAMES", "add_resilience"]

DEFAULT_NODE_NAMES: Mapping[str, str] = {
    "pending": "answer_pending",
    "tools": "tools",
    "retry": "retry",
    "repair": "repair",
    "planner": "planner",
    "executor": "executor",
    "escalate": "escalate",
}
"""The nodes `add_resilience` may add, by role; rename them with ``node_names=``."""


def _check_state(builder: StateGraph[Any, Any, Any, Any], messages_key: str) -> None:
    channels = builder.channels
    if messages_key not in channels:
        raise ConfigurationError(
            f"the graph state has no {messages_key!r} key; build the graph on a state with "
            "messages (e.g. MessagesState) or pass messages_key= naming your messages key"
        )
    channel = channels.get("resilience")
    if not (isinstance(channel, BinaryOperatorAggregate) and channel.operator is merge_tally):
        raise ConfigurationError(
            "the graph state has no 'resilience' tally channel; declare the state as "
            "`class State(MessagesState, ResilienceState): ...` (or add the field "
            "`resilience: ResilienceTally`)"
        )


def _check_names(
    builder: StateGraph[Any, Any, Any, Any],
    agent: str,
    entry: str,
    node_names: Mapping[str, str] | None,
    roles: Sequence[str],
) -> dict[str, str]:
    names = {**DEFAULT_NODE_NAMES, **(node_names or {})}
    applied = [
        name for name, spec in builder.nodes.items() if isinstance(spec.runnable, SelfRouted)
    ]
    if applied:
        raise ConfigurationError(
            f"add_resilience was already applied to this graph (its tools node {applied[0]!r}): "
            "a graph takes it once, for one agent (one entry, one tally a thread). For "
            "several agents, give each a graph of its own with add_resilience, compile it "
            "with checkpointer=True, and add it as a node of your parent graph"
        )
    unknown_roles = set(names) - set(DEFAULT_NODE_NAMES)
    if unknown_roles:
        raise ConfigurationError(
            f"node_names has unknown roles {sorted(unknown_roles)}; "
            f"valid roles are {sorted(DEFAULT_NODE_NAMES)}"
        )
    if agent not in builder.nodes:
        raise ConfigurationError(
            f"the graph has no node {agent!r}; add your agent node before calling "
            f"add_resilience (nodes: {sorted(builder.nodes)})"
        )
    for role in roles:
        name = names[role]
        if name in builder.nodes or name == agent:
            raise ConfigurationError(
                f"node name {name!r} (for {role}) is already taken; pass "
                f"node_names={{{role!r}: 'another_name'}}"
            )
    if any(source == agent for source, _ in builder.edges) or builder.branches.get(agent):
        raise ConfigurationError(
            f"node {agent!r} already has outgoing edges; add_resilience adds them itself "
            "(tool calls -> tools, otherwise END): remove yours"
        )
    if any(source == START for source, _ in builder.edges) or builder.branches.get(START):
        raise ConfigurationError(
            "add_resilience adds the graph's entry itself (START -> your agent, through a "
            "step that answers tool calls a stopped run left unanswered): remove your "
            "builder.add_edge(START, ...); to start at another node, pass entry='that_node'"
        )
    if entry not in builder.nodes:
        raise ConfigurationError(
            f"entry {entry!r} is not a node of the graph (nodes: {sorted(builder.nodes)})"
        )
    return names


def _add_entry(
    builder: StateGraph[Any, Any, Any, Any],
    pending: str,
    entry: str,
    messages_key: str,
    tools: GuardedToolNode,
) -> None:
    """START -> `entry`, through `pending` (the pending-calls node) only when a stopped run
    left calls unanswered (`route_entry`): a clean turn pays no extra step. A graph with
    side effects takes the run's lease of its thread there, first."""
    router = _Router(route_entry, messages_key, leases=tools, entry=True)
    builder.add_conditional_edges(START, router, {"pending": pending, "go": entry})
    builder.add_edge(pending, entry)


def check_profiles(
    profiles: Mapping[str, ToolProfile], known: set[str], *, unknown_hint: str = ""
) -> None:
    """Profiles name known tools (a misspelled one would leave its tool unguarded), and
    fallback chains end. `unknown_hint`: what else to check, said with an unknown name."""
    unknown = set(profiles) - known
    if unknown:
        raise ConfigurationError(
            f"profiles name unknown tools {sorted(unknown)}; known tools: {sorted(known)}"
            + unknown_hint
        )
    for name, profile in profiles.items():
        missing = [f for f in profile.fallbacks if f not in known]
        if missing:
            raise ConfigurationError(
                f"the fallback of {name!r} names unknown tools {missing}; "
                f"pass the fallback tools in tools= too (known: {sorted(known)})" + unknown_hint
            )
        if name in profile.fallbacks:
            raise ConfigurationError(f"{name!r} cannot be its own fallback")
    for start in profiles:  # a chain that comes back to its start is a cycle
        path, frontier = [start], list(profiles[start].fallbacks)
        while frontier:
            nxt = frontier.pop()
            if nxt == start:
                raise ConfigurationError(
                    f"fallback cycle through {start!r}: remove one of the fallbacks so the "
                    "chain ends"
                )
            if nxt not in path:
                path.append(nxt)
                frontier.extend(profiles[nxt].fallbacks if nxt in profiles else ())


def add_resilience(
    builder: StateGraph[Any, Any, Any, Any],
    *,
    agent: str,
    tools: Sequence[BaseTool | Callable[..., Any]],
    policy: ResiliencePolicy | None = None,
    profiles: Mapping[str, ToolProfile] | None = None,
    clock: Clock | None = None,
    rng: random.Random | None = None,
    rules: Sequence[Rule] = (),
    messages_key: str = "messages",
    node_names: Mapping[str, str] | None = None,
    repair_model: BaseChatModel | None = None,
    planner_model: BaseChatModel | None = None,
    escalate: bool = False,
    breaker: BreakerConfig | None = DEFAULT_BREAKER,
    breaker_store: BreakerStore | None = None,
    retry_budget: RetryBudget | None = None,
    retry_budget_store: InMemoryRetryBudgetStore | PostgresRetryBudgetStore | None = None,
    idempotency: IdempotencyStore | None = None,
    saga: SagaLog | None = None,
    entry: str | None = None,
) -> StateGraph[Any, Any, Any, Any]:
    """Wire guarded tool execution and the enabled recovery paths into `builder`.

    Args:
        builder: the user's `StateGraph`, whose state includes `ResilienceState`.
        agent: the name of the existing LLM node that emits tool calls. Its
            outgoing edge is added here: tool calls -> tools, otherwise END. So is the
            graph's entry (START -> agent): add no edge from START yourself.
        tools: the tools the agent may call (as for `ToolNode`).
        policy: budgets and backoff; defaults to `ResiliencePolicy()`.
        profiles: per-tool `ToolProfile`s, by tool name.
        clock: time source for backoff and deadlines; `SystemClock()` by default.
        rng: jitter source; a fresh `random.Random()` by default.
        rules: classification rules tried before the built-in table.
        messages_key: the state key holding the messages.
        node_names: rename the added nodes, e.g. ``{"tools": "act"}``.
        repair_model: a tool-calling chat model for reflection repair of SEMANTIC
            failures (adds the ``repair`` node); without it they go to the agent.
        planner_model: a chat model for verified replanning of STRUCTURAL
            failures, loops and exhausted budgets (adds ``planner``/``executor``).
        escalate: interrupt for a human on POLICY/UNKNOWN failures and exhausted
            replans (adds ``escalate``); needs a checkpointer, as every interrupt.
        breaker: the circuit breaker every tool (or ``ToolProfile.breaker_key``)
            gets; None turns breakers off.
        breaker_store: where breaker state lives: in-process by default; a
            `PostgresBreakerStore` shares it across threads and worker processes.
        retry_budget: an optional token bucket bounding retries to a fraction of
            first attempts, per tool, across threads (`retry_budget_store` shares it).
        idempotency: the durable intent/outcome ledger of side effects
            (``ToolProfile(side_effect=True)``); in-process by default, which is
            exactly-once only within one process: pass ``Persistence.idempotency``
            (Postgres or SQLite) so a crashed and resumed thread never repeats one.
        saga: the log of compensable effects (``ToolProfile(compensate=...)``),
            undone newest first when a human aborts; ``Persistence.saga`` to share it.
        entry: the node the graph starts at (default: `agent`), for a graph that
            prepares the model's input in a node of its own first.

    Returns the same builder, for chaining.

    >>> add_resilience(builder, agent="agent", tools=[search])  # doctest: +SKIP
    """
    if not isinstance(builder, StateGraph):
        raise ConfigurationError(f"builder must be a langgraph StateGraph, got {type(builder)!r}")
    _check_state(builder, messages_key)
    roles = _roles(repair_model is not None, planner_model is not None, escalate)
    names = _check_names(builder, agent, entry or agent, node_names, roles)
    if not tools:
        raise ConfigurationError("tools is empty; pass the tools your agent may call")
    tool_node = GuardedToolNode(
        tools,
        policy=policy,
        clock=clock,
        profiles=profiles,
        rules=rules,
        rng=rng,
        messages_key=messages_key,
        can_repair=repair_model is not None,
        can_replan=planner_model is not None,
        can_escalate=escalate,
        breaker=breaker,
        breaker_store=breaker_store,
        retry_budget=retry_budget,
        retry_budget_store=retry_budget_store,
        idempotency=idempotency,
        saga=saga,
    )
    check_profiles(profiles or {}, set(tool_node.tools_by_name))
    nodes = recovery_nodes(
        tool_node,
        repair_model=repair_model,
        planner_model=planner_model,
        escalate=escalate,
    )
    onward = _onward(agent, names, roles)
    for role, node in nodes.items():
        if role == "tools":  # on every turn's path: it routes itself, no branch after it
            routes = {str(to): name for to, name in onward.items()}
            routed = SelfRouted(node, routes, messages_key)
            builder.add_node(
                names[role], routed, destinations=tuple(dict.fromkeys(routes.values()))
            )
        else:
            builder.add_node(names[role], node)
    _add_entry(builder, names["pending"], entry or agent, messages_key, tool_node)
    _add_edges(
        builder,
        agent,
        names=names,
        roles=roles,
        onward=onward,
        messages_key=messages_key,
        tools=tool_node,
    )
    return builder


def _onward(agent: str, names: Mapping[str, str], roles: Sequence[str]) -> dict[Hashable, str]:
    """Where a recovery node may go, by `Next` value: the agent, the end, the paths enabled."""
    onward: dict[Hashable, str] = {"agent": agent, "__end__": END}
    onward.update({role: names[role] for role in roles if role != "pending"})
    return onward


def _roles(repair: bool, replan: bool, escalate: bool) -> list[str]:
    """The roles of the nodes to add: the three always there and the paths enabled."""
    roles = ["pending", "tools", "retry"]
    roles += ["repair"] if repair else []
    roles += ["planner", "executor"] if replan else []
    return roles + (["escalate"] if escalate else [])


def recovery_nodes(
    tool_node: GuardedToolNode,
    *,
    repair_model: BaseChatModel | None,
    planner_model: BaseChatModel | None,
    escalate: bool,
) -> dict[str, ResilienceNode]:
    """The nodes to add, by role: the tools node and the recovery paths enabled."""
    policy, key, tools = tool_node.policy, tool_node.messages_key, tool_node.tools_by_name
    nodes: dict[str, ResilienceNode] = {
        "pending": AnswerPendingNode(messages_key=key, tools=tool_node),
        "tools": tool_node,
        "retry": RetryNode(clock=tool_node.clock, messages_key=key),
    }
    if repair_model is not None:
        nodes["repair"] = RepairNode(
            model=repair_model, tools_by_name=tools, policy=policy, messages_key=key
        )
    if planner_model is not None:
        nodes["planner"] = PlannerNode(
            model=planner_model,
            tools_by_name=tools,
            policy=policy,
            can_escalate=escalate,
            breaker_states=tool_node.breaker_states,
            side_effects={n for n, p in tool_node.profiles.items() if p.side_effect},
            messages_key=key,
        )
        nodes["executor"] = PlanExecutorNode(messages_key=key)
    if escalate:
        nodes["escalate"] = EscalateNode(
            policy=policy,
            tools_by_name=tools,
            compensate=tool_node.compensate_thread,
            acompensate=tool_node.acompensate_thread,
            messages_key=key,
        )
    return nodes


def _add_edges(
    builder: StateGraph[Any, Any, Any, Any],
    agent: str,
    *,
    names: Mapping[str, str],
    roles: Sequence[str],
    onward: dict[Hashable, str],
    messages_key: str,
    tools: GuardedToolNode,
) -> None:
    """The agent's edge to the tools, and every recovery node's router (the tools node
    routes itself: `SelfRouted`). A run that ends there gives its thread's lease back."""
    router = _traced(announced_next_step, messages_key)
    builder.add_conditional_edges(
        agent,
        _Router(route_after_agent, messages_key, leases=tools),
        {"tools": names["tools"], "__end__": END},
    )
    for role in roles:
        if role in ("pending", "tools"):
            continue  # pending: its edges are the entry's (_add_entry); tools: SelfRouted
        if role == "retry":
            builder.add_edge(names["retry"], names["tools"])
        elif role == "executor":
            builder.add_conditional_edges(
                names["executor"],
                _traced(route_after_executor, messages_key),
                onward,
            )
        else:
            builder.add_conditional_edges(names[role], router, onward)


class _Router(Runnable[Any, Any]):
    """A router of the clean path (after the agent, at the entry), bound to the graph's
    messages key and named after it (LangGraph names the branch so), run as plain code:
    not a traced run of its own. A function given to ``add_conditional_edges`` becomes a
    traced run (callbacks start and end it) on every turn; three such runs were over a
    third of a clean turn's overhead over plain ``ToolNode``. These routers emit no
    events; those after the recovery nodes, off the clean path, do (`_traced`).

    With `leases` (a graph with side effects), the entry router takes the run's lease of
    its thread (`_graph.run_lease`) and the router after the agent gives it back when the
    run ends there; in the run's context, as a node has it."""

    def __init__(
        self,
        route: Callable[..., Any],
        messages_key: str,
        *,
        leases: GuardedToolNode | None = None,
        entry: bool = False,
    ) -> None:
        self.route, self.messages_key = route, messages_key
        self.leases = leases if leases is not None and leases.has_side_effects else None
        self.entry = entry
        self.name = route.__name__

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        leases = self.leases
        if leases is None or config is None:
            return self.route(input, messages_key=self.messages_key)
        if self.entry:
            with set_config_context(config) as context:
                context.run(leases.enter_run, config)
        route = self.route(input, messages_key=self.messages_key)
        if route == END:
            with set_config_context(config) as context:
                context.run(leases.leave_run, config)
        return route

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        leases = self.leases
        if leases is None or config is None:
            return self.route(input, messages_key=self.messages_key)
        if self.entry:
            with set_config_context(config) as context:
                await asyncio.create_task(leases.aenter_run(config), context=context)
        route = self.route(input, messages_key=self.messages_key)
        if route == END:
            with set_config_context(config) as context:
                await asyncio.create_task(leases.aleave_run(config), context=context)
        return route


def _traced(route: Callable[..., Any], messages_key: str) -> Callable[[Any], Any]:
    """A router off the clean path, given to LangGraph as a function (a traced run of its
    own): its ``route`` event reaches the run's stream through the context it sets."""

    def routed(state: Any) -> Any:
        return route(state, messages_key=messages_key)

    routed.__name__ = routed.__qualname__ = route.__name__
    return routed


def announced_next_step(state: Any, messages_key: str = "messages") -> Next:
    """`next_step` as the graph's router after a recovery node, announced as a
    ``route`` event (the router computes it anyway; the nodes never do)."""
    to = next_step(state, messages_key)
    emit(Event("route", to=to))
    return to
