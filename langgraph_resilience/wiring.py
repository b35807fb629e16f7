"""`add_resilience`: add the recovery nodes and routers to a user's `StateGraph`.

The user keeps their graph, their state and their agent node; we add the tools
node, the retry node and the conditional edges between them, the way
`ToolNode` + `tools_condition` are wired by hand in LangGraph's own guides::

    agent --tool calls--> tools --ok/envelope--> agent
                            ^  \\--transient, budget left--> retry
                            \\_____________________________/
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import BaseTool
from langgraph.channels.binop import BinaryOperatorAggregate
from langgraph.graph import END, StateGraph

from langgraph_resilience.classify import DEFAULT_RULES, Rule
from langgraph_resilience.clock import Clock, SystemClock
from langgraph_resilience.errors import ConfigurationError
from langgraph_resilience.policy import ResiliencePolicy
from langgraph_resilience.profile import ToolProfile
from langgraph_resilience.repair import RepairNode
from langgraph_resilience.retry import RetryNode
from langgraph_resilience.router import route_after_agent, route_after_repair, route_after_tools
from langgraph_resilience.state import merge_ledger
from langgraph_resilience.tools import GuardedToolNode

__all__ = ["DEFAULT_NODE_NAMES", "add_resilience"]

DEFAULT_NODE_NAMES: Mapping[str, str] = {"tools": "tools", "retry": "retry", "repair": "repair"}
"""The nodes `add_resilience` adds, by role; rename them with ``node_names=``."""


def _check_state(builder: StateGraph[Any, Any, Any, Any], messages_key: str) -> None:
    channels = builder.channels
    if messages_key not in channels:
        raise ConfigurationError(
            f"the graph state has no {messages_key!r} key; build the graph on a state with "
            "messages (e.g. MessagesState) or pass messages_key= naming your messages key"
        )
    channel = channels.get("resilience")
    if not (isinstance(channel, BinaryOperatorAggregate) and channel.operator is merge_ledger):
        raise ConfigurationError(
            "the graph state has no 'resilience' ledger channel; declare the state as "
            "`class State(MessagesState, ResilienceState): ...` (or add the field "
            "`resilience: ResilienceLedger`)"
        )


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
) -> StateGraph[Any, Any, Any, Any]:
    """Wire guarded tool execution and classified retry into `builder`; return it.

    Args:
        builder: the user's `StateGraph`, whose state includes `ResilienceState`.
        agent: the name of the existing LLM node that emits tool calls. Its
            outgoing edge is added here: tool calls -> tools, otherwise END.
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

    >>> add_resilience(builder, agent="agent", tools=[search])  # doctest: +SKIP
    """
    if not isinstance(builder, StateGraph):
        raise ConfigurationError(f"builder must be a langgraph StateGraph, got {type(builder)!r}")
    names = {**DEFAULT_NODE_NAMES, **(node_names or {})}
    unknown_roles = set(names) - set(DEFAULT_NODE_NAMES)
    if unknown_roles:
        raise ConfigurationError(
            f"node_names has unknown roles {sorted(unknown_roles)}; "
            f"valid roles are {sorted(DEFAULT_NODE_NAMES)}"
        )
    _check_state(builder, messages_key)
    if agent not in builder.nodes:
        raise ConfigurationError(
            f"the graph has no node {agent!r}; add your agent node before calling "
            f"add_resilience (nodes: {sorted(builder.nodes)})"
        )
    roles = ["tools", "retry"] + (["repair"] if repair_model is not None else [])
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
    if not tools:
        raise ConfigurationError("tools is empty; pass the tools your agent may call")
    policy = policy or ResiliencePolicy()
    clock = clock or SystemClock()
    tool_node = GuardedToolNode(
        tools,
        policy=policy,
        clock=clock,
        profiles=profiles,
        rules=(*rules, *DEFAULT_RULES),
        rng=rng,
        messages_key=messages_key,
        can_repair=repair_model is not None,
    )
    unknown_profiles = set(profiles or {}) - set(tool_node.tools_by_name)
    if unknown_profiles:
        raise ConfigurationError(
            f"profiles name unknown tools {sorted(unknown_profiles)}; "
            f"known tools: {sorted(tool_node.tools_by_name)}"
        )
    retry_node = RetryNode(clock=clock, messages_key=messages_key)

    builder.add_node(
        names["tools"], RunnableLambda(tool_node.run, afunc=tool_node.arun, name=names["tools"])
    )
    builder.add_node(
        names["retry"], RunnableLambda(retry_node.run, afunc=retry_node.arun, name=names["retry"])
    )
    builder.add_conditional_edges(
        agent,
        functools.partial(route_after_agent, messages_key=messages_key),
        {"tools": names["tools"], "__end__": END},
    )
    after_tools: dict[Hashable, str] = {"retry": names["retry"], "agent": agent}
    if repair_model is not None:
        repair_node = RepairNode(
            model=repair_model,
            tools_by_name=tool_node.tools_by_name,
            policy=policy,
            clock=clock,
            messages_key=messages_key,
        )
        builder.add_node(
            names["repair"],
            RunnableLambda(repair_node.run, afunc=repair_node.arun, name=names["repair"]),
        )
        builder.add_conditional_edges(
            names["repair"],
            functools.partial(route_after_repair, messages_key=messages_key),
            {"repair": names["repair"], "tools": names["tools"], "agent": agent},
        )
        after_tools["repair"] = names["repair"]
    builder.add_conditional_edges(
        names["tools"],
        functools.partial(route_after_tools, messages_key=messages_key),
        after_tools,
    )
    builder.add_edge(names["retry"], names["tools"])
    return builder
