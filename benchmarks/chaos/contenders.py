"""The contenders: four ways to build an agent, each the way its users build it.

Contenders, each built the way its users build it, all driven by the same
scripted agent (`tasks.scripted_agent`) over the same injected tools, each
run on an ``InMemorySaver`` checkpointer:

- ``toolnode`` (a): LangGraph's ``ToolNode(tools, handle_tool_errors=True)`` +
  ``tools_condition``. (``True`` is passed because ``ToolNode``'s default
  handler only catches invalid-argument errors and re-raises everything else.)
- ``retry_policy`` (b): the same with ``handle_tool_errors=False`` and
  ``add_node("tools", ..., retry_policy=RetryPolicy(max_attempts=3))``, so a
  tool's exception reaches LangGraph's retry loop, which re-runs the *whole*
  tools node (every call of the turn) and raises when it gives up.
- ``create_agent`` (c): LangChain's ``create_agent`` with ``ToolRetryMiddleware``
  (2 retries), ``ModelFallbackMiddleware``, ``ToolCallLimitMiddleware`` and
  ``ModelCallLimitMiddleware``.
- ``resilient`` (d): `build_resilient`, i.e. ``add_resilience`` with every path
  that has landed (`RESILIENT_PATHS`): classified retry on the fake clock,
  coercion and reflection repair (`tasks.scripted_repairer`), output
  contracts, the loop guard, circuit breakers, fallbacks to the shop's
  alternative endpoints, exactly-once side effects with a status check,
  verified replanning (`tasks.scripted_planner`) and escalation, answered
  by a scripted operator (`tasks.operator_decision`).
- ``resilient_unattended`` (d'): the same without escalation (not run by
  default; ``--contenders resilient_unattended``).
- ``middleware`` (e): LangChain's ``create_agent`` with `ResilienceMiddleware`, the
  same profiles, policy, repairer, breaker and operator as (d); every path but
  verified replanning (`MIDDLEWARE_PATHS`), which the middleware leaves to the model.

``retry_policy`` and ``create_agent`` sleep with ``time.sleep``; their backoff is
set to 0 (``initial_interval=0``, ``initial_delay=0``, no jitter) so the
benchmark stays fast: their recovery latency counts tool time only. The
``resilient`` contender's backoff runs on the same `FakeClock` the tools charge.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import BaseTool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import RetryPolicy

from benchmarks.chaos.tasks import (
    ALTERNATIVES,
    BATCH_ARGS,
    BATCH_MERGES,
    OUTPUT_SCHEMAS,
    SIDE_EFFECT_TOOLS,
    Scenario,
    Shop,
    scripted_planner,
    scripted_repairer,
)
from langgraph_resilience import (
    BreakerConfig,
    ResiliencePolicy,
    ResilienceState,
    ToolProfile,
    add_resilience,
)
from langgraph_resilience.stores import BreakerStore
from langgraph_resilience.testing import FakeClock, ScriptedChatModel

__all__ = [
    "CALL_LIMIT",
    "CONTENDERS",
    "DEFAULT_CONTENDERS",
    "DEMO_BREAKER",
    "NOISE_BREAKER",
    "RESILIENT_BREAKER",
    "RESILIENT_PATHS",
    "RESILIENT_POLICY",
    "RETRY_POLICY",
    "BuildContext",
    "Built",
    "Contender",
    "build_resilient",
]


@dataclasses.dataclass(frozen=True, slots=True)
class BuildContext:
    """What a contender is built from for one run."""

    task: Scenario
    """The task, or the conversation of tasks, of this run."""
    tools: Sequence[BaseTool]
    model: ScriptedChatModel
    """The scripted agent."""
    clock: FakeClock
    seed: int
    checkpointer: BaseCheckpointSaver[Any]
    shop: Shop
    """The backend, for what a service offers besides its tools (a status check)."""
    breaker: BreakerConfig | None = None
    """The breaker of this run's mix (None: `RESILIENT_BREAKER`)."""
    breaker_store: BreakerStore | None = None
    """Where a contender with breakers keeps them (the run counts what opens there)."""
    status_check: Callable[[str], Any] | None = None
    """The shop's status service as this mix has it (None: there is none)."""


@dataclasses.dataclass(slots=True)
class Built:
    """A compiled contender and the extra models (fallback, repair, planner) whose calls
    count."""

    app: Any
    models: list[ScriptedChatModel]


@dataclasses.dataclass(frozen=True, slots=True)
class Contender:
    """One way to build the agent graph."""

    name: str
    label: str
    build: Callable[[BuildContext], Built]
    simulated_backoff: bool
    """Whether its backoff runs on the fake clock (else it is set to 0)."""


def _agent_node(model: BaseChatModel, tools: Sequence[BaseTool]) -> RunnableLambda[Any, Any]:
    """The user's agent node, as every LangGraph guide writes it."""
    bound = model.bind_tools(tools)

    def agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [bound.invoke(state["messages"])]}

    async def aagent(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [await bound.ainvoke(state["messages"])]}

    return RunnableLambda(agent, afunc=aagent, name="agent")


def _build_toolnode(ctx: BuildContext) -> Built:
    builder = StateGraph(MessagesState)
    builder.add_node("agent", _agent_node(ctx.model, ctx.tools))
    builder.add_node("tools", ToolNode(list(ctx.tools), handle_tool_errors=True))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return Built(builder.compile(checkpointer=ctx.checkpointer), [])


RETRY_POLICY = RetryPolicy(max_attempts=3, initial_interval=0.0, jitter=False)
"""Contender (b)'s policy: 3 attempts, backoff set to 0 (it would really sleep)."""


def _build_retry_policy(ctx: BuildContext) -> Built:
    builder = StateGraph(MessagesState)
    builder.add_node("agent", _agent_node(ctx.model, ctx.tools))
    builder.add_node(
        "tools", ToolNode(list(ctx.tools), handle_tool_errors=False), retry_policy=RETRY_POLICY
    )
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return Built(builder.compile(checkpointer=ctx.checkpointer), [])


CALL_LIMIT = 60
"""Run limits of contender (c)'s call-limit middleware: above any task's needs."""


def _build_create_agent(ctx: BuildContext) -> Built:
    from langchain.agents import create_agent  # noqa: PLC0415 - optional dependency
    from langchain.agents.middleware import (  # noqa: PLC0415
        AgentMiddleware,
        ModelCallLimitMiddleware,
        ModelFallbackMiddleware,
        ToolCallLimitMiddleware,
        ToolRetryMiddleware,
    )

    fallback = ScriptedChatModel(responses=list(ctx.model.responses))
    middleware: list[AgentMiddleware[Any, Any, Any]] = [
        ToolRetryMiddleware(max_retries=2, initial_delay=0.0, jitter=False),
        ModelFallbackMiddleware(fallback),
        ToolCallLimitMiddleware(run_limit=CALL_LIMIT),
        ModelCallLimitMiddleware(run_limit=CALL_LIMIT),
    ]
    app = create_agent(
        ctx.model, list(ctx.tools), middleware=middleware, checkpointer=ctx.checkpointer
    )
    return Built(app, [fallback])


RESILIENT_POLICY = ResiliencePolicy(max_attempts=3, base_delay=0.5, max_delay=10.0)
"""Contender (d)'s policy: 3 attempts (2 retries), the defaults otherwise."""

RESILIENT_BREAKER = BreakerConfig()
"""Contender (d)'s breaker (the package default: 30 calls in a 50-call window before a
failure rate is judged). The chaos harness's shadow breakers use the same config in
each mix, so "calls while the breaker should be open" means calls this breaker would
have refused, for every contender. A mix may set its own (`Mix.breaker`)."""

DEMO_BREAKER = BreakerConfig(window_size=1, minimum_calls=1, open_duration=60.0)
"""The outage mixes' breaker, as the demo's: one failed call opens it. A task makes a
handful of calls to the broken tool, far below the default's 30, so the default would
never open within a run and "no calls after detection" would hold for anyone."""

NOISE_BREAKER = BreakerConfig(window_size=6, minimum_calls=6)
"""The background mix's breaker: small enough that random faults would trip it if they
were counted per attempt, so the mix tells logical-call counting from per-attempt
counting. It opens when 3 of the last 6 calls failed. At p = 0.15 per attempt a call
that gives up after 3 attempts fails with q = 0.15**3 = 3.4e-3, so a window trips with
P(>= 3 of 6) ~ 20 q**3 = 7.7e-7; counted per attempt it is P(>= 3 of 6 | p) = 4.7% at
every call, and a conversation of ~100 calls trips it somewhere in most runs."""

RESILIENT_PATHS: frozenset[str] = frozenset(
    {
        "retry",
        "repair",
        "coercion",
        "output_contracts",
        "loop_guard",
        "side_effect_profiles",
        "replan",
        "escalation",
        "breaker",
        "fallback",
        "idempotency",
        "partial",
    }
)
"""The recovery paths `build_resilient` wires today. Add a path's name here when you wire
it: the targets of the mixes that need it then count in `check_targets`."""


class _ResilientState(MessagesState, ResilienceState):
    """The user's state: messages plus the resilience ledger."""


def build_resilient(
    tools: Sequence[BaseTool],
    model: BaseChatModel,
    *,
    clock: FakeClock,
    seed: int,
    repair_model: BaseChatModel | None = None,
    planner_model: BaseChatModel | None = None,
    escalate: bool = True,
    checkpointer: BaseCheckpointSaver[Any] | None = None,
    side_effect_tools: Iterable[str] = SIDE_EFFECT_TOOLS,
    output_schemas: Mapping[str, Any] = OUTPUT_SCHEMAS,
    fallbacks: Mapping[str, str] = ALTERNATIVES,
    status_check: Callable[[str], Any] | None = None,
    policy: ResiliencePolicy = RESILIENT_POLICY,
    breaker: BreakerConfig | None = RESILIENT_BREAKER,
    breaker_store: BreakerStore | None = None,
) -> Any:
    """Contender (d): the user's graph with ``add_resilience`` and every landed path on.

    This is the one place that decides what "every landed path" means: extend
    it (and `RESILIENT_PATHS`) as more lands in ``add_resilience``. Side effects
    run exactly once per idempotency key through the package's default
    in-process ledger; `status_check` (asked by key) reconciles a lost response.
    Escalation interrupts the graph, so it needs a checkpointer and someone to
    answer (`run_task` plays the operator).
    """
    profiles = shop_profiles(
        tools,
        status_check,
        side_effect_tools=side_effect_tools,
        output_schemas=output_schemas,
        fallbacks=fallbacks,
    )
    builder = StateGraph(_ResilientState)
    builder.add_node("agent", _agent_node(model, tools))
    add_resilience(
        builder,
        agent="agent",
        tools=tools,
        policy=policy,
        profiles=profiles,
        clock=clock,
        rng=random.Random(seed),
        repair_model=repair_model,
        planner_model=planner_model,
        escalate=escalate,
        breaker=breaker,
        breaker_store=breaker_store,
    )
    return builder.compile(checkpointer=checkpointer)


MIDDLEWARE_PATHS: frozenset[str] = RESILIENT_PATHS - {"replan"}
"""The recovery paths contender (e) has: (d)'s but verified replanning."""


def shop_profiles(
    tools: Sequence[BaseTool],
    status_check: Callable[[str], Any] | None,
    *,
    side_effect_tools: Iterable[str] = SIDE_EFFECT_TOOLS,
    output_schemas: Mapping[str, Any] = OUTPUT_SCHEMAS,
    fallbacks: Mapping[str, str] = ALTERNATIVES,
) -> dict[str, ToolProfile]:
    """The shop's tool profiles, as contenders (d) and (e) declare them."""
    names = {t.name for t in tools}
    effects = set(side_effect_tools) & names
    return {
        name: ToolProfile(
            side_effect=name in effects,
            output_schema=output_schemas.get(name),
            fallback=fallbacks[name] if fallbacks.get(name) in names else None,
            status_check=status_check if name in effects else None,
            batch_arg=BATCH_ARGS.get(name),
            merge_batches=BATCH_MERGES.get(name),
        )
        for name in sorted(names)
        if name in effects or name in output_schemas or name in fallbacks or name in BATCH_ARGS
    }


def _build_middleware(ctx: BuildContext) -> Built:
    from langchain.agents import create_agent  # noqa: PLC0415 - optional dependency

    from langgraph_resilience import ResilienceMiddleware  # noqa: PLC0415

    repairer = scripted_repairer()
    middleware = ResilienceMiddleware(
        policy=RESILIENT_POLICY,
        profiles=shop_profiles(ctx.tools, ctx.status_check),
        clock=ctx.clock,
        rng=random.Random(ctx.seed),
        repair_model=repairer,
        escalate=True,
        breaker=ctx.breaker or RESILIENT_BREAKER,
        breaker_store=ctx.breaker_store,
    )
    app = create_agent(
        ctx.model, list(ctx.tools), middleware=[middleware], checkpointer=ctx.checkpointer
    )
    return Built(app, [repairer])


def _resilient(*, escalate: bool) -> Callable[[BuildContext], Built]:
    def build(ctx: BuildContext) -> Built:
        repairer, planner = scripted_repairer(), scripted_planner(ctx.task)
        app = build_resilient(
            ctx.tools,
            ctx.model,
            clock=ctx.clock,
            seed=ctx.seed,
            repair_model=repairer,
            planner_model=planner,
            escalate=escalate,
            checkpointer=ctx.checkpointer,
            status_check=ctx.status_check,
            breaker=ctx.breaker or RESILIENT_BREAKER,
            breaker_store=ctx.breaker_store,
        )
        return Built(app, [repairer, planner])

    return build


CONTENDERS: Mapping[str, Contender] = {
    c.name: c
    for c in (
        Contender("toolnode", "(a) ToolNode", _build_toolnode, simulated_backoff=False),
        Contender(
            "retry_policy",
            "(b) ToolNode+RetryPolicy",
            _build_retry_policy,
            simulated_backoff=False,
        ),
        Contender(
            "create_agent",
            "(c) create_agent+middleware",
            _build_create_agent,
            simulated_backoff=False,
        ),
        Contender(
            "resilient",
            "(d) add_resilience",
            _resilient(escalate=True),
            simulated_backoff=True,
        ),
        Contender(
            "resilient_unattended",
            "(d') add_resilience, no human",
            _resilient(escalate=False),
            simulated_backoff=True,
        ),
        Contender(
            "middleware",
            "(e) create_agent+ResilienceMiddleware",
            _build_middleware,
            simulated_backoff=True,
        ),
    )
}
"""Every contender, by name; `DEFAULT_CONTENDERS` run unless told otherwise."""

DEFAULT_CONTENDERS: tuple[str, ...] = (
    "toolnode",
    "retry_policy",
    "create_agent",
    "resilient",
    "middleware",
)
