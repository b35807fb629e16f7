"""The six ways to build the agent, each as its own documentation tells a user to.

Why this module exists: the evaluation compares frameworks, so each contender must
be built the way its users build it, and nothing more. All get the same replay
model, the same tools (over their own `Sandbox`) and an ``InMemorySaver``:

- ``toolnode``: ``StateGraph(MessagesState)``, an agent node,
  ``ToolNode(tools, handle_tool_errors=True)`` and ``tools_condition``.
- ``toolnode_retry``: the same with ``handle_tool_errors=False`` and
  ``add_node("tools", ToolNode(...), retry_policy=RetryPolicy(max_attempts=3,
  initial_interval=0, jitter=False))``. LangGraph's default ``retry_on`` retries
  5xx and other non-builtin errors (the timeouts) but not a 429; when it gives up,
  the run raises.
- ``create_agent``: ``langchain.agents.create_agent(model, tools,
  middleware=[ToolRetryMiddleware(max_retries=2, initial_delay=0, jitter=False)],
  checkpointer=InMemorySaver())``; after the retries, the middleware's default
  ``on_failure="continue"`` answers with an error ``ToolMessage``.
- ``resilient``: ours, exactly as the README shows: ``class State(MessagesState,
  ResilienceState)``, the same agent node, ``add_resilience(builder, agent="agent",
  tools=tools, policy=ResiliencePolicy(max_attempts=3), profiles={name:
  ToolProfile(side_effect=True)}, clock=FakeClock())`` (one clock per conversation) with the suite's
  `SIDE_EFFECTS`; no ``status_check`` (nothing can tell whether a lost send went
  through).
- ``declared``: ``resilient`` with each write declared as the services allow. Over
  plain HTTP nothing deduplicates by key, so only the writes that are idempotent by
  nature on AgentDojo's environments (`suites.IDEMPOTENT`) are declared
  ``ToolProfile(side_effect=True, safe_repeat="idempotent")``. Where the services
  deduplicate by the key we send (``--transport http_keyed``: an
  ``Idempotency-Key`` header; ``mcp``: ``_meta.idempotency_key``), every write is
  ``safe_repeat="by_key"``.
- ``middleware``: ours for ``create_agent`` users, as the README shows:
  ``create_agent(model, tools, middleware=[ResilienceMiddleware(policy=...,
  profiles=..., clock=...)], checkpointer=InMemorySaver())``, with the same policy
  and profiles as ``resilient``.

Nobody sleeps for real: LangGraph's and LangChain's delays are 0, and ours run on
a `FakeClock` (Retry-After included).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.tools import BaseTool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import RetryPolicy

from langgraph_resilience import (
    ResilienceMiddleware,
    ResiliencePolicy,
    ResilienceState,
    ToolProfile,
    add_resilience,
)
from langgraph_resilience.testing import FakeClock

from .suites import IDEMPOTENT

Builder = Callable[..., Any]
"""(model, tools, side-effecting tool names, the conversation's virtual clock) -> a
compiled graph with a checkpointer. Only ``resilient`` has a notion of time to give
the clock to; the others never wait (their delays are 0)."""


def _agent_node(model: BaseChatModel, tools: Sequence[BaseTool]) -> Callable[[Any], Any]:
    """The user's agent node, as every LangGraph guide writes it."""
    bound = model.bind_tools(tools)

    def agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [bound.invoke(state["messages"])]}

    return agent


def build_toolnode(model: BaseChatModel, tools: Sequence[BaseTool], *_: Any, **__: Any) -> Any:
    builder = StateGraph(MessagesState)
    builder.add_node("agent", _agent_node(model, tools))
    builder.add_node("tools", ToolNode(list(tools), handle_tool_errors=True))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=InMemorySaver())


def build_toolnode_retry(
    model: BaseChatModel, tools: Sequence[BaseTool], *_: Any, **__: Any
) -> Any:
    builder = StateGraph(MessagesState)
    builder.add_node("agent", _agent_node(model, tools))
    builder.add_node(
        "tools",
        ToolNode(list(tools), handle_tool_errors=False),
        retry_policy=RetryPolicy(max_attempts=3, initial_interval=0, jitter=False),
    )
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=InMemorySaver())


def build_create_agent(model: BaseChatModel, tools: Sequence[BaseTool], *_: Any, **__: Any) -> Any:
    from langchain.agents import create_agent  # noqa: PLC0415 - heavy, only when chosen
    from langchain.agents.middleware import ToolRetryMiddleware  # noqa: PLC0415

    return create_agent(
        model,
        list(tools),
        middleware=[ToolRetryMiddleware(max_retries=2, initial_delay=0, jitter=False)],
        checkpointer=InMemorySaver(),
    )


class State(MessagesState, ResilienceState):
    """The user's state: messages plus the resilience ledger (README, Quick start)."""


def build_resilient(
    model: BaseChatModel,
    tools: Sequence[BaseTool],
    side_effects: frozenset[str],
    clock: FakeClock,
    **_: Any,
) -> Any:
    builder = StateGraph(State)
    builder.add_node("agent", _agent_node(model, tools))
    add_resilience(
        builder,
        agent="agent",
        tools=tools,
        policy=ResiliencePolicy(max_attempts=3),
        profiles={t.name: ToolProfile(side_effect=True) for t in tools if t.name in side_effects},
        clock=clock,
    )
    return builder.compile(checkpointer=InMemorySaver())


def build_middleware(
    model: BaseChatModel,
    tools: Sequence[BaseTool],
    side_effects: frozenset[str],
    clock: FakeClock,
    **_: Any,
) -> Any:
    from langchain.agents import create_agent  # noqa: PLC0415 - heavy, only when chosen

    middleware = ResilienceMiddleware(
        policy=ResiliencePolicy(max_attempts=3),
        profiles={t.name: ToolProfile(side_effect=True) for t in tools if t.name in side_effects},
        clock=clock,
    )
    return create_agent(model, list(tools), middleware=[middleware], checkpointer=InMemorySaver())


def build_declared(
    model: BaseChatModel,
    tools: Sequence[BaseTool],
    side_effects: frozenset[str],
    clock: FakeClock,
    transport: str = "http",
) -> Any:
    """``resilient`` with each write declared as the service allows: over plain HTTP
    nothing deduplicates by key, so only the idempotent-by-nature writes
    (`suites.IDEMPOTENT`) get ``safe_repeat="idempotent"``; the rest stay plain.
    Where the services deduplicate by our key (``http_keyed``, ``mcp``), every write
    is ``by_key``."""
    idempotent = frozenset().union(*IDEMPOTENT.values())

    def repeat(name: str) -> Literal["by_key", "idempotent"] | None:
        if transport in ("http_keyed", "mcp"):
            return "by_key"
        return "idempotent" if name in idempotent else None

    builder = StateGraph(State)
    builder.add_node("agent", _agent_node(model, tools))
    add_resilience(
        builder,
        agent="agent",
        tools=tools,
        policy=ResiliencePolicy(max_attempts=3),
        profiles={
            t.name: ToolProfile(side_effect=True, safe_repeat=repeat(t.name))
            for t in tools
            if t.name in side_effects
        },
        clock=clock,
    )
    return builder.compile(checkpointer=InMemorySaver())


OURS = frozenset({"resilient", "middleware", "declared"})
"""The contenders built on this package (over MCP their tools come from
`aload_mcp_tools`, which sends each side effect's key in ``_meta``)."""

CONTENDERS: Mapping[str, Builder] = {
    "toolnode": build_toolnode,
    "toolnode_retry": build_toolnode_retry,
    "create_agent": build_create_agent,
    "resilient": build_resilient,
    "middleware": build_middleware,
    "declared": build_declared,
}
