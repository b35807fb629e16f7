"""The chaos benchmark: the task suite under fault mixes, against four ways to build an agent.

Contenders, each built the way its users build it, all driven by the same
scripted agent (`chaos_tasks.scripted_agent`) over the same injected tools, each
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
  coercion and reflection repair (`chaos_tasks.scripted_repairer`), output
  contracts, the loop guard, circuit breakers, fallbacks to the shop's
  alternative endpoints, exactly-once side effects with a status check,
  verified replanning (`chaos_tasks.scripted_planner`) and escalation, answered
  by a scripted operator (`chaos_tasks.operator_decision`).
- ``resilient_unattended`` (d'): the same without escalation (not run by
  default; ``--contenders resilient_unattended``).

``retry_policy`` and ``create_agent`` sleep with ``time.sleep``; their backoff is
set to 0 (``initial_interval=0``, ``initial_delay=0``, no jitter) so the
benchmark stays fast: their recovery latency counts tool time only. The
``resilient`` contender's backoff runs on the same `FakeClock` the tools charge.

A mix is data (`MIXES`): a `FaultPlan`, the failure class it exercises and the
recovery paths ``resilient`` needs to meet the targets in it, and what else
differs from the plain setting: how the scripted agent behaves
(`chaos_tasks.AgentStyle`: re-issuing a failed call under a new id, ids numbered
per message), what runs (every task, the tasks with side effects, or
conversations of many tasks on one thread), the breaker (`Mix.breaker`: the
outage mixes use `DEMO_BREAKER`, the background mix `NOISE_BREAKER`) and the
shop's status service (up, flaky, none). Run it with `run_bench`;
`check_targets` lists the behaviour targets (counts, never timings) that
``resilient`` misses, leaving out those whose paths have not landed yet
(reported as *pending*). Besides the common targets, a mix may add some of
`EXTRA_TARGETS` (`Mix.checks`).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime as dt
import importlib.metadata
import inspect
import json
import math
import multiprocessing
import os
import pathlib
import platform
import random
import statistics
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langchain_core.tools import BaseTool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command, RetryPolicy
from rich.console import Console
from rich.table import Table

from benchmarks.chaos.tasks import (
    ALTERNATIVES,
    BATCH_ARGS,
    BATCH_MERGES,
    CONVERSATIONS,
    OUTPUT_SCHEMAS,
    SIDE_EFFECT_TOOLS,
    TASKS,
    AgentStyle,
    Conversation,
    Scenario,
    Shop,
    Task,
    extra_effects,
    judge,
    operator_decision,
    oracle,
    scripted_agent,
    scripted_planner,
    scripted_repairer,
    turn_judged,
    turns_of,
)
from langgraph_resilience.core.canonical import call_key
from langgraph_resilience.core.policy import ResiliencePolicy
from langgraph_resilience.core.profile import ToolProfile
from langgraph_resilience.errors import ConfigurationError
from langgraph_resilience.graph.state import ResilienceState
from langgraph_resilience.graph.wiring import add_resilience
from langgraph_resilience.stores.breakers import (
    BreakerConfig,
    BreakerStore,
    InMemoryBreakerStore,
    Outcome,
    Transition,
)
from langgraph_resilience.testing import FakeClock, FakeHTTPError, ScriptedChatModel
from langgraph_resilience.testing.faults import (
    ChaosTool,
    FaultPlan,
    burst,
    chaos_stats,
    inject,
    intermittent,
    persistent,
    single,
)

__all__ = [
    "CONTENDERS",
    "DEFAULT_CONTENDERS",
    "DEMO_BREAKER",
    "EXTRA_TARGETS",
    "MIXES",
    "NOISE_BREAKER",
    "QUICK_CONVERSATIONS",
    "QUICK_MIXES",
    "RESILIENT_BREAKER",
    "RESILIENT_PATHS",
    "RESILIENT_POLICY",
    "BenchReport",
    "BuildContext",
    "Built",
    "Contender",
    "Mix",
    "Row",
    "RunResult",
    "TargetResult",
    "build_resilient",
    "check_targets",
    "cmd_bench",
    "evaluate_targets",
    "measure_overhead",
    "print_report",
    "quick_tasks",
    "run_bench",
    "run_task",
    "write_report",
]

TRANSIENT_BOUND = 0.957
"""1 - (1 - 0.15**3)**10 minus 1 point: the issue's target for 10-step tasks."""

LLM_RATIO_TARGET = 1.2
OVERHEAD_TARGET = 1.15
RECURSION_LIMIT = 200
MAX_ESCALATIONS = 40
"""Resumes the scripted operator answers per run before the run counts as stuck."""


# ------------------------------------------------------------------ contenders


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
    names = {t.name for t in tools}
    effects = set(side_effect_tools) & names
    profiles = {
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
    builder = StateGraph(_ResilientState)
    builder.add_node("agent", _agent_node(model, tools))
    builder.add_edge(START, "agent")
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
    )
}
"""Every contender, by name; `DEFAULT_CONTENDERS` run unless told otherwise."""

DEFAULT_CONTENDERS: tuple[str, ...] = ("toolnode", "retry_policy", "create_agent", "resilient")


# ------------------------------------------------------------------------ mixes

_READS = ("get_customer", "get_order", "list_orders", "check_stock", "geocode", "get_weather")
_EFFECTS = tuple(sorted(SIDE_EFFECT_TOOLS))
_TRANSIENT = (
    "http_429",
    "http_429_retry_after",
    "http_500",
    "http_502",
    "http_503",
    "http_504",
    "timeout",
    "connection_reset",
)


_PLAIN_AGENT = AgentStyle()


@dataclasses.dataclass(frozen=True, slots=True)
class Mix:
    """A named fault plan, the failure class it exercises, and what (d) needs for it."""

    name: str
    fault_class: str
    plan: FaultPlan
    description: str
    requires: frozenset[str] = frozenset()
    """Recovery paths (d) needs to *recover* here; while one is missing, the success
    targets of this mix are pending rather than missed."""
    dedup_requires: frozenset[str] = frozenset()
    """Recovery paths (d) needs for zero duplicate side effects here. Empty when every
    fault fires before the tool runs: then any duplicate is a bug."""
    detect_requires: frozenset[str] | None = None
    """For a permanent fault: the paths (d) needs to make no call to the broken tool after
    detecting it (the 'no calls after detection' target); None: not applicable."""
    agent: AgentStyle = _PLAIN_AGENT
    """How the scripted agent behaves here (re-issues, id style); the default follows
    each step's ``on_error`` alone, with ids unique on the thread."""
    suite: Literal["tasks", "effects", "conversations"] = "tasks"
    """What runs: every task, the tasks with side effects, or the conversations (many
    tasks on one thread)."""
    breaker: BreakerConfig | None = None
    """The breaker of (d) and of the shadow breakers here (None: `RESILIENT_BREAKER`)."""
    status: Literal["up", "flaky", "none"] = "up"
    """The shop's status service (``ToolProfile.status_check``): up; down for
    `STATUS_DOWN` of the queries at random (503), so a lost answer sometimes cannot be
    reconciled at once; or none at all (nothing can tell whether a lost effect happened,
    as on AgentDojo)."""
    baseline: str = "clean"
    """The fault-free mix this one is compared with (``x clean`` ratios)."""
    checks: frozenset[str] = frozenset()
    """Extra targets of this mix, from `EXTRA_TARGETS`."""
    twin: str | None = None
    """A mix that differs from this one in the agent's id style alone: ids must not
    change what (d) achieves (the ``same_as_twin`` target)."""

    @property
    def detection(self) -> bool:
        """Whether the permanent-fault targets apply."""
        return self.detect_requires is not None

    @property
    def seeded(self) -> bool:
        """Whether anything here is random: else one seed says it all."""
        return bool(self.plan.specs) or self.status == "flaky"


def _mix(
    name: str,
    fault_class: str,
    description: str,
    *specs: Any,
    requires: Iterable[str] = (),
    dedup_requires: Iterable[str] = (),
    detect_requires: Iterable[str] | None = None,
    **options: Any,
) -> Mix:
    checks = frozenset(options.pop("checks", ()))
    unknown = checks - set(EXTRA_TARGETS)
    if unknown:
        raise ConfigurationError(f"unknown targets {sorted(unknown)}; see EXTRA_TARGETS")
    return Mix(
        name,
        fault_class,
        FaultPlan(tuple(specs), name),
        description,
        frozenset(requires),
        frozenset(dedup_requires),
        None if detect_requires is None else frozenset(detect_requires),
        checks=checks,
        **options,
    )


EXTRA_TARGETS: Mapping[str, str] = {
    "hazard": "the mix is a hazard: (a) ToolNode makes duplicates, or calls while open",
    "breaker_opens": "(d)'s own breaker opens on the outage",
    "answered": "(d) answers every tool call the agent made",
    "same_as_twin": "(d) does as well as in the twin mix (ids alone differ)",
    "all_succeed": "(d) completes every conversation (every turn right, one thread)",
    "not_diverted": "every call (d)'s agent made ran on the tool it asked for",
    "breakers_closed": "(d)'s breakers never open, and it makes no call while one should be",
    "best_success": "(d)'s success (and per-turn success) >= every other contender's",
}
"""The targets a mix may add to the common ones (`Mix.checks`), by name."""

STATUS_DOWN = 0.5
"""In a ``flaky`` status mix, the share of status queries answered 503."""

_LOST = "side-effecting calls time out after committing, p=0.2"


MIXES: Mapping[str, Mix] = {
    m.name: m
    for m in (
        _mix("clean", "none", "no faults"),
        _mix(
            "transient",
            "transient",
            "every call fails with p=0.15, kind drawn from 429 (+/- Retry-After), 500, 502, "
            "503, 504, timeout, connection reset",
            intermittent(_TRANSIENT, p=0.15),
            requires=("idempotency",),  # only for side-effecting tasks, see the targets
        ),
        _mix(
            "rate_limit",
            "transient",
            "bursts of 2 x 429 with Retry-After: 2 (onset p=0.1 per call)",
            burst("http_429_retry_after", length=2, start=None, p=0.1),
        ),
        _mix(
            "server_errors",
            "transient",
            "500/502/503/504 with p=0.15 per call",
            intermittent(("http_500", "http_502", "http_503", "http_504"), p=0.15),
            requires=("idempotency",),
        ),
        _mix(
            "timeouts",
            "transient",
            "timeout before executing, p=0.15 per call",
            intermittent("timeout", p=0.15),
            requires=("idempotency",),
        ),
        _mix(
            "connection_reset",
            "transient",
            "connection reset before executing, p=0.15 per call",
            intermittent("connection_reset", p=0.15),
            requires=("idempotency",),
        ),
        _mix(
            "burst_503",
            "transient",
            "the first 3 calls of every tool get 503",
            burst("http_503", length=3, start=0),
            requires=("idempotency",),
        ),
        _mix(
            "outage",
            "transient",
            "get_weather answers 503 from its first call on (an outage); demo-sized breaker",
            persistent("http_503", tools=("get_weather",)),
            requires=("replan",),
            detect_requires=("breaker",),
            breaker=DEMO_BREAKER,
            checks=("hazard", "breaker_opens"),
        ),
        _mix(
            "timeout_after_commit",
            "unknown",
            "side-effecting calls time out after committing, p=0.2",
            intermittent("timeout_after_commit", p=0.2, tools=_EFFECTS),
            requires=("idempotency",),
            dedup_requires=("idempotency",),
        ),
        _mix(
            "bad_request",
            "semantic",
            "the first call of every read tool gets 400",
            single("http_400", tools=_READS),
        ),
        _mix(
            "auth",
            "policy",
            "the first call of every tool gets 401 or 403",
            single(("http_401", "http_403")),
            requires=("escalation",),
        ),
        _mix(
            "not_found",
            "structural",
            "the first call of every read tool gets 404",
            single("http_404", tools=_READS),
            requires=("replan",),
        ),
        _mix(
            "malformed",
            "semantic",
            "truncated JSON output, p=0.1 per call",
            intermittent("malformed_output", p=0.1),
            requires=("idempotency",),
        ),
        _mix(
            "wrong_output",
            "semantic",
            "every number in the output negated, p=0.1 per call",
            intermittent("wrong_output", p=0.1),
            requires=("idempotency",),
        ),
        _mix(
            "schema_drift",
            "semantic",
            "get_order, create_order and get_weather rename their first argument (x -> x_v2)",
            persistent("schema_drift", tools=("get_order", "create_order", "get_weather")),
        ),
        _mix(
            "tool_removed",
            "structural",
            "geocode answers 404 'unknown tool' from its second call on; demo-sized breaker",
            persistent("tool_removed", start=1, tools=("geocode",)),
            requires=("replan",),
            detect_requires=("breaker",),
            breaker=DEMO_BREAKER,
            checks=("hazard",),
        ),
        _mix(
            "partial",
            "partial",
            "send_bulk_email sends only the first half of its recipients, first call",
            single("partial_success", tools=("send_bulk_email",)),
            requires=("partial",),
            dedup_requires=("partial",),
        ),
        _mix(
            "reissue",
            "unknown",
            f"{_LOST}; the agent re-issues a failed call once under a new id; the status "
            f"service answers 503 to {STATUS_DOWN:.0%} of queries",
            intermittent("timeout_after_commit", p=0.2, tools=_EFFECTS),
            requires=("idempotency",),
            dedup_requires=("idempotency",),
            agent=AgentStyle(reissue=True),
            suite="effects",
            status="flaky",
            checks=("hazard",),
        ),
        _mix(
            "per_message_ids",
            "unknown",
            "as reissue, with ids numbered per message (call_0, call_1 in every assistant message)",
            intermittent("timeout_after_commit", p=0.2, tools=_EFFECTS),
            requires=("idempotency",),
            dedup_requires=("idempotency",),
            agent=AgentStyle(reissue=True, ids="per_message"),
            suite="effects",
            status="flaky",
            checks=("hazard", "answered", "same_as_twin"),
            twin="reissue",
        ),
        _mix(
            "conversation",
            "none",
            "no faults; each conversation's tasks on ONE thread, one human message each, "
            "identical calls repeated across turns (one has 100+ tool calls)",
            suite="conversations",
            checks=("all_succeed", "not_diverted"),
        ),
        _mix(
            "background",
            "transient",
            "the conversations under independent faults at p=0.15 per attempt on every tool: "
            "429 (Retry-After: 2), 503, httpx.ConnectTimeout before sending; a 6-call breaker",
            intermittent(("http_429_retry_after", "http_503", "connect_timeout"), p=0.15),
            requires=("idempotency",),
            agent=AgentStyle(reissue=True),
            suite="conversations",
            breaker=NOISE_BREAKER,
            baseline="conversation",
            checks=("breakers_closed", "best_success"),
        ),
    )
}
"""Every mix, by name. Add a mix by adding an entry."""

QUICK_MIXES: tuple[str, ...] = (
    "clean",
    "transient",
    "schema_drift",
    "timeout_after_commit",
    "reissue",
    "per_message_ids",
    "conversation",
    "background",
)
"""What ``bench --quick`` runs: the issue's transient target, a repair path, the
lost-response hazard with an agent that re-issues (ids unique and per message), and
conversations of many tasks on one thread, clean and under background faults."""

QUICK_SEEDS = 2

QUICK_CONVERSATIONS: tuple[str, ...] = ("conv-shift",)
"""The conversations ``--quick`` runs: the long one (over 100 tool calls, the same
lookups in up to 7 turns, one email asked for twice)."""


def quick_tasks() -> tuple[Task, ...]:
    """The ``--quick`` suite: every 10-step task (the transient target's) and the first
    task of every other family."""
    kept: list[Task] = []
    families: set[str] = set()
    for task in TASKS:
        if task.calls == 10 or task.family not in families:
            kept.append(task)
        families.add(task.family)
    return tuple(kept)


# ------------------------------------------------------------------------- runs


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RunResult:
    """One task run under one contender, mix and seed."""

    contender: str
    mix: str
    seed: int
    task: str
    success: bool
    crashed: str | None
    """The exception type that ended the run, if the graph raised."""
    answer: str | None
    duplicates: int
    tool_calls: int
    """Calls that reached a tool (attempts)."""
    executions: int
    llm_calls: int
    """Model calls: the agent's, plus fallback and repair models'."""
    agent_turns: int
    escalations: int
    """Times the scripted operator had to answer an escalation."""
    repeated_calls: int
    """Agent-issued calls identical (tool + canonical args) to an earlier one."""
    calls_after_removal: int
    calls_while_open: int
    max_attempts_per_call: int
    max_attempts_per_key: int
    attempts_by_call: dict[str, int]
    """``tool:call_id`` -> calls, for calls that reached their tool more than once."""
    human_retries: tuple[str, ...]
    """Tool-call ids the operator answered ``retry``: each may run once more than the
    automatic budget allows, by a human's decision."""
    faults: dict[str, int]
    recovery_latencies: tuple[float, ...]
    virtual_seconds: float
    cpu_seconds: float
    wall_seconds: float
    turns: int = 1
    """Human messages (tasks) the run has; a conversation has several."""
    turns_ok: int = 0
    """Turns that gave the oracle's answer and committed exactly the oracle's effects."""
    answers: tuple[str | None, ...] = ()
    """Each turn's final answer (None where there was none)."""
    max_tool_calls_per_task: int = 0
    """The most calls that reached a tool within one turn (the per-task budget's count)."""
    breaker_opens: int = 0
    """Times one of the contender's own breakers opened (only (d) has breakers)."""
    shadow_opens: int = 0
    """Times a shadow breaker opened: a breaker fed with what the tools saw."""
    diverted_calls: int = 0
    """Calls the agent made that never ran on the tool they named (refused, or served
    by a fallback)."""
    refused_calls: int = 0
    """Of those, the calls answered with an error (or not at all)."""
    unanswered_calls: int = 0
    """Calls the agent made that no ToolMessage answered."""


def _seed_for(seed: int, task: Scenario) -> int:
    return random.Random(f"{seed}:{task.id}").randrange(2**31)


def _repeated(messages: Sequence[BaseMessage]) -> int:
    """Agent-issued calls identical to an earlier one of the same task (turn)."""
    seen: Counter[str] = Counter()
    repeated = 0
    for message in messages:
        if isinstance(message, HumanMessage):
            repeated += sum(n - 1 for n in seen.values() if n > 1)
            seen.clear()
        if isinstance(message, AIMessage):
            for call in message.tool_calls:
                seen[call_key(call["name"], call["args"])] += 1
    return repeated + sum(n - 1 for n in seen.values() if n > 1)


class _CountingBreakerStore(InMemoryBreakerStore):
    """The default in-process breaker store, counting the transitions that open one."""

    def __init__(self) -> None:
        super().__init__()
        self.opens = 0

    def __bool__(self) -> bool:
        return True  # a store is given, even while it holds no breaker (and has len 0)

    def record(
        self,
        key: str,
        cfg: BreakerConfig,
        now: float,
        outcome: Outcome,
        *,
        probe: bool = False,
        duration: float | None = None,
    ) -> Transition | None:
        transition = super().record(key, cfg, now, outcome, probe=probe, duration=duration)
        if transition is not None and transition.target == "open":
            self.opens += 1
        return transition


def _status_service(shop: Shop, status: str, seed: int) -> Callable[[str], Any] | None:
    """The shop's status check as `Mix.status` has it: seeded, so every contender meets
    the same outages of it."""
    if status == "none":
        return None
    if status == "up":
        return shop.status_check
    rng = random.Random(f"{seed}:status")

    def status_check(key: str) -> Any:
        if rng.random() < STATUS_DOWN:
            raise FakeHTTPError(503, body="status service unavailable")
        return shop.status_check(key)

    return status_check


@dataclasses.dataclass(frozen=True, slots=True)
class _CallAudit:
    diverted: int
    refused: int
    unanswered: int


def _audit(messages: Sequence[BaseMessage], tools: Sequence[BaseTool]) -> _CallAudit:
    """What became of each call the agent made (its k-th reply is epoch k): did it run on
    the tool it named, and was it answered? A `ToolMessage` answers the latest waiting
    call with its id, so per-message ids pair up as they do for a model."""
    ran: set[tuple[str, str | None, int | None]] = set()
    for t in tools:
        if isinstance(t, ChaosTool):
            ran.update((t.name, e.call_id, e.epoch) for e in t.log)
    waiting: dict[str, list[int]] = {}
    answers: dict[tuple[str, int], ToolMessage] = {}
    mine: list[tuple[str, str, int, int]] = []
    replies = 0
    for position, message in enumerate(messages):
        if isinstance(message, ToolMessage):
            queue = waiting.get(message.tool_call_id)
            if queue:
                answers[(message.tool_call_id, queue.pop())] = message
            continue
        if not isinstance(message, AIMessage):
            continue
        ours = not message.name
        replies += ours
        for call in message.tool_calls:
            call_id = call.get("id") or ""
            waiting.setdefault(call_id, []).append(position)
            if ours:
                mine.append((call["name"], call_id, replies, position))
    diverted = refused = unanswered = 0
    for name, call_id, epoch, position in mine:
        answer = answers.get((call_id, position))
        unanswered += answer is None
        if (name, call_id, epoch) not in ran:
            diverted += 1
            refused += answer is None or answer.status == "error"
    return _CallAudit(diverted, refused, unanswered)


@dataclasses.dataclass(slots=True)
class _Operator:
    """The scripted operator on call for one run (`operator_decision`) and its answers."""

    budget: int
    """Escalations it answers before the run counts as stuck."""
    epoch: Callable[[], int]
    """The agent's reply count: the same id in another assistant message is another call."""
    asked: Counter[str] = dataclasses.field(default_factory=Counter)
    approved: list[str] = dataclasses.field(default_factory=list)
    escalations: int = 0

    def answer(self, request: Mapping[str, Any]) -> dict[str, Any]:
        self.escalations += 1
        call_id = str(request.get("call_id"))
        decision = operator_decision(request, self.asked, call=f"{call_id}@{self.epoch()}")
        if decision["action"] == "retry":
            self.approved.append(call_id)
        return decision


def _ask(
    app: Any,
    prompt: str,
    config: RunnableConfig,
    operator: _Operator,
    values: dict[str, Any],
) -> tuple[dict[str, Any], str | None]:
    """One human message, run until the graph stops, its escalations answered by
    `operator`: the latest state values and the exception type that ended it, if any."""
    request: Any = {"messages": [HumanMessage(prompt)]}
    try:
        while True:
            for chunk in app.stream(request, config, stream_mode="values"):
                if isinstance(chunk, dict) and "messages" in chunk:
                    values = chunk
            waiting = app.get_state(config).interrupts
            if not waiting:
                return values, None
            if operator.escalations >= operator.budget:
                return values, "TooManyEscalations"
            request = Command(resume=operator.answer(waiting[0].value))
    except Exception as exc:  # a framework that gives up raises: the task failed
        return values, type(exc).__name__


def _turn_counts(tools: Sequence[ChaosTool], marks: Sequence[int]) -> tuple[int, int]:
    """Attempts since `marks` (each tool's log length at the turn's start), and the most
    of them on one identical call: what the per-task budgets count."""
    log = [e for t, mark in zip(tools, marks, strict=True) for e in t.log[mark:]]
    return len(log), max(Counter(e.key for e in log).values(), default=0)


def _final_answer(values: Mapping[str, Any]) -> str | None:
    messages = values.get("messages") or []
    final = messages[-1] if messages else None
    return final.text if isinstance(final, AIMessage) and not final.tool_calls else None


def run_task(contender: Contender, task: Scenario, mix: Mix, seed: int) -> RunResult:
    """Run `task` once: a fresh shop, the mix's faults from `seed`, the contender's graph.

    A conversation's tasks are asked one after another on the same thread, one human
    message each. When the graph interrupts for a human (escalation),
    `operator_decision` answers with ``Command(resume=...)``, as an operator on call
    would.
    """
    run_seed = _seed_for(seed, task)
    shop = Shop()
    clock = FakeClock()
    model = scripted_agent(task, style=mix.agent)
    breaker = mix.breaker or RESILIENT_BREAKER
    tools = inject(
        shop.tools(), mix.plan, run_seed, clock=clock, breaker=breaker, epoch=lambda: model.calls
    )
    store = _CountingBreakerStore()
    built = contender.build(
        BuildContext(
            task,
            tools,
            model,
            clock,
            run_seed,
            InMemorySaver(),
            shop,
            breaker=breaker,
            breaker_store=store,
            status_check=_status_service(shop, mix.status, run_seed),
        )
    )
    config: RunnableConfig = {
        "recursion_limit": RECURSION_LIMIT,
        "max_concurrency": 1,
        "configurable": {"thread_id": f"{task.id}:{seed}"},
    }
    turns = turns_of(task)
    operator = _Operator(MAX_ESCALATIONS * len(turns), lambda: model.calls)
    chaos_tools = [t for t in tools if isinstance(t, ChaosTool)]
    values: dict[str, Any] = {}
    crashed: str | None = None
    answers: list[str | None] = []
    turn_effects: list[dict[str, int]] = []
    per_turn: list[tuple[int, int]] = []
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for turn in turns:
        marks = [len(t.log) for t in chaos_tools]
        effects_before = Counter(shop.effects)
        values, crashed = _ask(built.app, turn.prompt, config, operator, values)
        per_turn.append(_turn_counts(chaos_tools, marks))
        turn_effects.append(dict(shop.effects - effects_before))
        answers.append(_final_answer(values) if crashed is None else None)
        if crashed is not None:
            break  # the thread is stuck: the later requests of the conversation are lost
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    messages: list[BaseMessage] = list(values.get("messages") or [])
    stats = chaos_stats(tools)
    audit = _audit(messages, tools)
    answer = answers[-1] if answers else None
    judged = turn_judged(task, turn_effects, answers) if crashed is None else []
    complete = crashed is None and len(answers) == len(turns)
    return RunResult(
        contender=contender.name,
        mix=mix.name,
        seed=seed,
        task=task.id,
        success=complete
        and judge(task, shop, answer if isinstance(task, Task) else tuple(answers)),
        crashed=crashed,
        answer=answer,
        duplicates=extra_effects(task, shop),
        tool_calls=stats.calls,
        executions=stats.executions,
        llm_calls=model.calls + sum(m.calls for m in built.models),
        agent_turns=model.calls,
        escalations=operator.escalations,
        repeated_calls=_repeated(messages),
        calls_after_removal=stats.calls_after_removal,
        calls_while_open=stats.calls_while_open,
        max_attempts_per_call=stats.max_attempts_per_call,
        max_attempts_per_key=max((k for _, k in per_turn), default=0),
        attempts_by_call=stats.attempts_by_call,
        human_retries=tuple(operator.approved),
        faults=stats.faults,
        recovery_latencies=stats.recovery_latencies,
        virtual_seconds=clock.monotonic(),
        cpu_seconds=cpu,
        wall_seconds=wall,
        turns=len(turns),
        turns_ok=sum(judged),
        answers=tuple(answers),
        max_tool_calls_per_task=max((n for n, _ in per_turn), default=0),
        breaker_opens=store.opens,
        shadow_opens=stats.shadow_opens,
        diverted_calls=audit.diverted,
        refused_calls=audit.refused,
        unanswered_calls=audit.unanswered,
    )


# ---------------------------------------------------------------- aggregation


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One contender under one mix, over every task and seed."""

    contender: str
    mix: str
    fault_class: str
    runs: int
    success: float
    pass_k: float
    crashed: int
    duplicates: int
    runs_with_duplicates: int
    calls_after_removal: int
    calls_while_open: int
    repeated_calls: int
    tool_calls: int
    executions: int
    llm_calls: int
    escalations: int
    tool_calls_vs_clean: float | None
    llm_calls_vs_clean: float | None
    max_attempts_per_call: int
    max_attempts_per_key: int
    faults: int
    recovery_mean_s: float | None
    recovery_max_s: float | None
    cpu_ms_per_tool_call: float
    wall_ms_per_turn: float
    subsets: dict[str, float]
    """Success rate on task subsets: ``ten_reads``, ``ten_effects``, ``with_effects``."""
    turn_success: float = math.nan
    """Share of turns (tasks) done right, a conversation's counted one by one."""
    breaker_opens: int = 0
    shadow_opens: int = 0
    diverted_calls: int = 0
    refused_calls: int = 0
    unanswered_calls: int = 0


def _rate(values: Sequence[bool]) -> float:
    return sum(values) / len(values) if values else math.nan


_SUBSETS: Mapping[str, Callable[[Scenario], bool]] = {
    "ten_reads": lambda t: t.calls == 10 and t.side_effects == 0,
    "ten_effects": lambda t: t.calls == 10 and t.side_effects > 0,
    "with_effects": lambda t: t.side_effects > 0,
    "read_only": lambda t: t.side_effects == 0,
}


def _aggregate(
    runs: Sequence[RunResult],
    mix: Mix,
    clean: Sequence[RunResult] | None,
    tasks: Mapping[str, Scenario],
) -> Row:
    by_task: dict[str, list[bool]] = {}
    for r in runs:
        by_task.setdefault(r.task, []).append(r.success)
    latencies = [x for r in runs for x in r.recovery_latencies]
    tool_calls = sum(r.tool_calls for r in runs)
    llm_calls = sum(r.llm_calls for r in runs)
    clean_tools = clean_llm = None
    if clean:
        per_task = {r.task: r for r in clean}  # a clean run is the same for every seed
        clean_tools = sum(per_task[r.task].tool_calls for r in runs if r.task in per_task)
        clean_llm = sum(per_task[r.task].llm_calls for r in runs if r.task in per_task)
    turns = sum(r.agent_turns for r in runs)
    return Row(
        contender=runs[0].contender,
        mix=mix.name,
        fault_class=mix.fault_class,
        runs=len(runs),
        success=_rate([r.success for r in runs]),
        pass_k=_rate([all(v) for v in by_task.values()]),
        crashed=sum(r.crashed is not None for r in runs),
        duplicates=sum(r.duplicates for r in runs),
        runs_with_duplicates=sum(r.duplicates > 0 for r in runs),
        calls_after_removal=sum(r.calls_after_removal for r in runs),
        calls_while_open=sum(r.calls_while_open for r in runs),
        repeated_calls=sum(r.repeated_calls for r in runs),
        tool_calls=tool_calls,
        executions=sum(r.executions for r in runs),
        llm_calls=llm_calls,
        escalations=sum(r.escalations for r in runs),
        tool_calls_vs_clean=tool_calls / clean_tools if clean_tools else None,
        llm_calls_vs_clean=llm_calls / clean_llm if clean_llm else None,
        max_attempts_per_call=max((r.max_attempts_per_call for r in runs), default=0),
        max_attempts_per_key=max((r.max_attempts_per_key for r in runs), default=0),
        faults=sum(sum(r.faults.values()) for r in runs),
        recovery_mean_s=statistics.fmean(latencies) if latencies else None,
        recovery_max_s=max(latencies) if latencies else None,
        cpu_ms_per_tool_call=1000 * sum(r.cpu_seconds for r in runs) / max(1, tool_calls),
        wall_ms_per_turn=1000 * sum(r.wall_seconds for r in runs) / max(1, turns),
        subsets={
            name: _rate([r.success for r in runs if keep(tasks[r.task])])
            for name, keep in _SUBSETS.items()
            if any(keep(tasks[r.task]) for r in runs)
        },
        turn_success=sum(r.turns_ok for r in runs) / max(1, sum(r.turns for r in runs)),
        breaker_opens=sum(r.breaker_opens for r in runs),
        shadow_opens=sum(r.shadow_opens for r in runs),
        diverted_calls=sum(r.diverted_calls for r in runs),
        refused_calls=sum(r.refused_calls for r in runs),
        unanswered_calls=sum(r.unanswered_calls for r in runs),
    )


# --------------------------------------------------------------------- targets


@dataclasses.dataclass(frozen=True, slots=True)
class TargetResult:
    """One target of the issue, judged on a report."""

    name: str
    status: Literal["met", "missed", "pending", "info"]
    detail: str
    checked: bool = True
    """Counts toward `check_targets` (behaviour counts only, never timings)."""


@dataclasses.dataclass(slots=True, kw_only=True)
class BenchReport:
    """What `run_bench` measured."""

    config: dict[str, Any]
    rows: list[Row]
    runs: list[RunResult]
    targets: list[TargetResult] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)

    def row(self, contender: str, mix: str) -> Row | None:
        """The aggregate of `contender` under `mix`, if it ran."""
        return next((r for r in self.rows if r.contender == contender and r.mix == mix), None)

    def counts(self) -> list[dict[str, Any]]:
        """Every run's behaviour counts (no timings): equal for equal seeds."""
        skip = {"cpu_seconds", "wall_seconds"}
        return [
            {k: v for k, v in dataclasses.asdict(r).items() if k not in skip} for r in self.runs
        ]

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "config": self.config,
            "notes": self.notes,
            "targets": [dataclasses.asdict(t) for t in self.targets],
            "results": [dataclasses.asdict(r) for r in self.rows],
            "runs": [dataclasses.asdict(r) for r in self.runs],
        }


def _judge(
    name: str, ok: bool, detail: str, missing: frozenset[str], *, checked: bool = True
) -> TargetResult:
    if ok:
        return TargetResult(name, "met", detail, checked)
    if missing:
        return TargetResult(
            name, "pending", f"{detail} (needs {', '.join(sorted(missing))}: not landed)", checked
        )
    return TargetResult(name, "missed", detail, checked)


def evaluate_targets(
    report: BenchReport, *, contender: str = "resilient", paths: frozenset[str] = RESILIENT_PATHS
) -> list[TargetResult]:
    """Judge the issue's targets for `contender` (built with `RESILIENT_POLICY`) on
    `report`, from its counts. `paths` are the recovery paths it has."""
    results: list[TargetResult] = []
    mixes = [MIXES[m] for m in report.config.get("mixes", []) if m in MIXES]
    clean = report.row(contender, "clean")
    if clean is not None:
        results.append(
            _judge("clean success 100%", clean.success == 1.0, f"{clean.success:.1%}", frozenset())
        )
    transient = report.row(contender, "transient")
    if transient is not None:
        subsets = (("reads", frozenset[str]()), ("effects", MIXES["transient"].requires))
        for subset, needs in subsets:
            rate = transient.subsets.get(f"ten_{subset}")
            if rate is not None:
                results.append(
                    _judge(
                        f"transient: 10-step {subset} tasks >= {TRANSIENT_BOUND:.1%}",
                        rate >= TRANSIENT_BOUND,
                        f"{rate:.1%}",
                        needs - paths,
                    )
                )
    per_call = RESILIENT_POLICY.max_attempts
    per_key = per_call * RESILIENT_POLICY.loop_threshold
    for mix in mixes:
        row = report.row(contender, mix.name)
        if row is None:
            continue
        missing = mix.requires - paths
        results.append(
            _judge(
                f"{mix.name}: no duplicate side effects",
                row.duplicates == 0,
                f"{row.duplicates} duplicates in {row.runs_with_duplicates} runs",
                mix.dedup_requires - paths,
            )
        )
        runs = [r for r in report.runs if r.contender == contender and r.mix == mix.name]
        over = [r for r in runs if _over_budget(r, per_call, per_key)]
        approved = sum(len(r.human_retries) for r in runs)
        results.append(
            _judge(
                f"{mix.name}: attempt budget ({per_call}/call, {per_key}/identical call)",
                not over,
                f"max {row.max_attempts_per_call} per call, {row.max_attempts_per_key} per "
                f"identical call, {len(over)} runs over"
                + (f" ({approved} more approved by the operator)" if approved else ""),
                frozenset(),
            )
        )
        if mix.detection:
            calls = row.calls_after_removal + row.calls_while_open
            results.append(
                _judge(
                    f"{mix.name}: no calls after detection",
                    calls == 0,
                    f"{row.calls_after_removal} after removal, {row.calls_while_open} while open",
                    (mix.detect_requires or frozenset()) - paths,
                )
            )
            results.append(
                _judge(
                    f"{mix.name}: permanent fault recovered 100%",
                    row.success == 1.0,
                    f"{row.success:.1%}",
                    missing,
                )
            )
        transient_mix = mix.fault_class == "transient" and not mix.detection
        if transient_mix and row.llm_calls_vs_clean is not None:
            results.append(
                _judge(
                    f"{mix.name}: LLM calls <= {LLM_RATIO_TARGET}x {mix.baseline}",
                    row.llm_calls_vs_clean <= LLM_RATIO_TARGET,
                    f"{row.llm_calls_vs_clean:.3f}x",
                    frozenset(),
                )
            )
        results.extend(_extra_targets(report, mix, row, missing))
    overhead = report.config.get("overhead")
    if overhead:
        results.append(
            TargetResult(
                f"clean overhead <= {OVERHEAD_TARGET}x (a) per turn",
                "info",
                f"{overhead['ratio']:.2f}x ({overhead['resilient_ms_per_turn']:.2f} vs "
                f"{overhead['toolnode_ms_per_turn']:.2f} ms/turn, interleaved; a timing, "
                "never checked: benchmarks/overhead.py measures it properly)",
                checked=False,
            )
        )
    return results


def _extra_targets(
    report: BenchReport, mix: Mix, row: Row, missing: frozenset[str]
) -> list[TargetResult]:
    """The targets `mix` adds (`Mix.checks`, from `EXTRA_TARGETS`), judged on `row`, the
    row of (d); those about the other contenders only when they ran."""
    out: list[TargetResult] = []
    others = [r for r in report.rows if r.mix == mix.name and r.contender not in _OURS and r.runs]
    plain = report.row("toolnode", mix.name)
    if "hazard" in mix.checks and plain is not None:
        if mix.detection:
            hazard, seen = (
                plain.calls_while_open + plain.calls_after_removal,
                "calls after detection",
            )
        else:
            hazard, seen = plain.duplicates, "duplicate side effects"
        out.append(
            _judge(
                f"{mix.name}: the hazard is real, (a) makes {seen}",
                hazard > 0,
                f"(a): {hazard} {seen}",
                frozenset(),
            )
        )
    if "breaker_opens" in mix.checks:
        out.append(
            _judge(
                f"{mix.name}: (d)'s breaker opens",
                row.breaker_opens > 0,
                f"{row.breaker_opens} opens in {row.runs} runs",
                frozenset({"breaker"}) - RESILIENT_PATHS,
            )
        )
    if "answered" in mix.checks:
        out.append(
            _judge(
                f"{mix.name}: every tool call answered",
                row.unanswered_calls == 0,
                f"{row.unanswered_calls} calls without a ToolMessage",
                frozenset(),
            )
        )
    twin = report.row(row.contender, mix.twin) if mix.twin else None
    if "same_as_twin" in mix.checks and twin is not None:
        out.append(
            _judge(
                f"{mix.name}: ids do not matter (same as {mix.twin})",
                (row.success, row.duplicates) == (twin.success, twin.duplicates),
                f"success {row.success:.1%} vs {twin.success:.1%}, duplicates "
                f"{row.duplicates} vs {twin.duplicates}",
                missing,
            )
        )
    if "all_succeed" in mix.checks:
        out.append(
            _judge(
                f"{mix.name}: every task on one thread succeeds",
                row.success == 1.0 and row.turn_success == 1.0,
                f"{row.success:.1%} of runs, {row.turn_success:.1%} of turns",
                missing,
            )
        )
    if "not_diverted" in mix.checks:
        out.append(
            _judge(
                f"{mix.name}: no call refused or diverted (loop guard, budgets per task)",
                row.diverted_calls == 0,
                f"{row.diverted_calls} calls did not run on their tool ({row.refused_calls} "
                "refused)",
                frozenset(),
            )
        )
    if "breakers_closed" in mix.checks:
        out.append(
            _judge(
                f"{mix.name}: breakers never open under background faults",
                row.breaker_opens == 0 and row.calls_while_open == 0,
                f"{row.breaker_opens} opens of (d)'s breakers, {row.calls_while_open} calls "
                f"while one should be open ((a): "
                f"{plain.shadow_opens if plain is not None else '-'} shadow opens)",
                frozenset({"breaker"}) - RESILIENT_PATHS,
            )
        )
    if "best_success" in mix.checks and others:
        best = max(others, key=lambda r: (r.success, r.turn_success))
        best_turns = max(r.turn_success for r in others)
        out.append(
            _judge(
                f"{mix.name}: success >= the best other contender",
                row.success >= best.success and row.turn_success >= best_turns,
                f"{row.success:.1%} ({row.turn_success:.1%} of turns) vs {best.contender} "
                f"{best.success:.1%} (best turns {best_turns:.1%})",
                missing,
            )
        )
    return out


_OURS = frozenset({"resilient", "resilient_unattended"})


def _over_budget(run: RunResult, per_call: int, per_key: int) -> bool:
    """More attempts than the automatic budget allows, beyond the operator's explicit
    ``retry`` answers (each allows one more run of its call)."""
    approved = Counter(run.human_retries)
    for name, attempts in run.attempts_by_call.items():
        if attempts > per_call + approved[name.split(":", 1)[1]]:
            return True
    if run.max_attempts_per_key > per_key + len(run.human_retries):
        return True
    return run.max_tool_calls_per_task > RESILIENT_POLICY.max_tool_attempts


def check_targets(report: BenchReport) -> list[str]:
    """The behaviour targets (d) misses in `report`, one line each; empty when all are met.

    Counts only, never timings; targets whose recovery path has not landed are
    pending, not failures.
    """
    return [
        f"{t.name}: {t.detail}"
        for t in evaluate_targets(report)
        if t.checked and t.status == "missed"
    ]


# ----------------------------------------------------------------------- runner


@dataclasses.dataclass(frozen=True, slots=True)
class _Job:
    """One contender under one mix and seed, over the suite (a picklable unit of work)."""

    contender: str
    mix: str
    seed: int
    tasks: tuple[Scenario, ...]

    @property
    def size(self) -> int:
        """Intended tool calls: how long the job runs, roughly."""
        return sum(t.calls for t in self.tasks)


def _scenarios(
    mix: Mix, suite: Sequence[Task], conversations: Sequence[Conversation], *, quick: bool
) -> tuple[Scenario, ...]:
    """What `mix` runs (`Mix.suite`); a quick run's ``effects`` suite keeps one task with
    side effects per family."""
    if mix.suite == "conversations":
        return tuple(conversations)
    if mix.suite == "effects":
        effects = [t for t in suite if t.side_effects > 0]
        if quick:
            first = {t.family: t for t in reversed(effects)}
            effects = [t for t in effects if first[t.family] is t]
        return tuple(effects)
    return tuple(suite)


def _run_jobs(jobs: Sequence[_Job], workers: int | None) -> list[list[RunResult]]:
    """Each job's runs, in job order, over `workers` processes (default: one per CPU),
    the longest jobs first so the workers finish together."""
    workers = max(1, min(workers if workers is not None else (os.cpu_count() or 1), len(jobs)))
    if workers == 1:
        return [_run_job(job) for job in jobs]
    context = multiprocessing.get_context("spawn")  # no fork of a threaded process
    longest = sorted(range(len(jobs)), key=lambda i: -jobs[i].size)
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        ran = dict(zip(longest, pool.map(_run_job, [jobs[i] for i in longest]), strict=True))
    return [ran[i] for i in range(len(jobs))]


def _run_job(job: _Job) -> list[RunResult]:
    contender, mix = CONTENDERS[job.contender], MIXES[job.mix]
    return [run_task(contender, task, mix, job.seed) for task in job.tasks]


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in (
        "langgraph",
        "langgraph-prebuilt",
        "langchain-core",
        "langchain",
        "langgraph-resilience",
    ):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "not installed"
    return out


def _revision() -> str | None:
    """The package's git commit (``+dirty`` with uncommitted changes), when it is a checkout."""
    root = pathlib.Path(__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return None
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            timeout=5,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}+dirty" if dirty else head


def _available(name: str) -> str | None:
    """Why contender `name` cannot run here, or None."""
    if name == "create_agent":
        try:
            import langchain.agents  # noqa: F401, PLC0415
        except ImportError:
            return "langchain is not installed (pip install langchain)"
    return None


def _unwired_features() -> list[str]:
    """Recovery features the package offers that `build_resilient` does not wire yet."""
    profile_fields = {f.name for f in dataclasses.fields(ToolProfile)}
    parameters = set(inspect.signature(add_resilience).parameters)
    hints = {
        "idempotency": (
            "add_resilience(idempotency=) / ToolProfile(status_check=)",
            "idempotency" in parameters or "status_check" in profile_fields,
        ),
    }
    return [
        f"{what} exists but build_resilient does not wire it yet (path {path!r})"
        for path, (what, present) in hints.items()
        if present and path not in RESILIENT_PATHS
    ]


def measure_overhead(tasks: Sequence[Task], *, rounds: int = 2) -> dict[str, float]:
    """Clean-run wall time per agent turn of (d) against (a), interleaved in one process.

    Runs of different jobs happen at different times (and loads), so their wall times
    do not compare; here each task runs under (a) and (d) back to back, in ABBA order
    to cancel drift, and the per-turn totals are compared. A timing: reported, never
    checked (``benchmarks/overhead.py`` is the controlled measurement).
    """
    clean = MIXES["clean"]
    walls = {"toolnode": 0.0, "resilient": 0.0}
    turns = {"toolnode": 0, "resilient": 0}
    for round_ in range(rounds):
        for i, task in enumerate(tasks):
            order = ["toolnode", "resilient"]
            if (i + round_) % 2:
                order.reverse()
            for name in order:
                run = run_task(CONTENDERS[name], task, clean, 0)
                walls[name] += run.wall_seconds
                turns[name] += run.agent_turns
    per_turn = {name: 1000 * walls[name] / max(1, turns[name]) for name in walls}
    return {
        "toolnode_ms_per_turn": round(per_turn["toolnode"], 3),
        "resilient_ms_per_turn": round(per_turn["resilient"], 3),
        "ratio": round(per_turn["resilient"] / per_turn["toolnode"], 3),
        "rounds": rounds,
    }


def _notes() -> list[str]:
    """What the report says about how it was measured."""
    return [
        "(a) uses handle_tool_errors=True: ToolNode's default handler re-raises every error "
        "except invalid arguments.",
        "(b) and (c) sleep for real between retries; their backoff is set to 0 here, so their "
        "recovery latency counts tool time only. (d) backs off on the fake clock.",
        "(c)'s ModelFallbackMiddleware never triggers: the scripted model does not fail.",
        f"(d) wires: {', '.join(sorted(RESILIENT_PATHS))}. Its escalations are answered by a "
        "scripted operator (chaos_tasks.operator_decision): retry once, then skip; 'human' "
        "counts those answers. (d') is the same graph without escalation.",
        "Parallel tool calls run one at a time (max_concurrency=1) so per-tool fault schedules "
        "are reproducible. Exception: when a parallel call raises in (b), Executor.map cancels "
        "the siblings that have not started, so which siblings ran before RetryPolicy re-runs "
        "the node depends on thread timing; (b)'s duplicates on parallel turns vary run to run.",
        "Mixes with the same schedule (e.g. the p=0.15 ones) fault the same calls for a seed "
        "(common random numbers): their differences come from the fault kind alone.",
        "Breakers count logical calls (one outcome per call when it leaves the tool); so do "
        "the shadow breakers behind 'open' (see chaos.ChaosTool). The outage mixes use a "
        "demo-sized breaker (one failed call opens it), the background mix a 6-call one.",
        "A conversation is one run: its tasks on one thread, one human message each; "
        "'success' needs every turn right, 'turn success' counts turns.",
        *_unwired_features(),
    ]


def run_bench(
    *,
    quick: bool,
    contenders: list[str] | None = None,
    mixes: list[str] | None = None,
    seeds: int | None = None,
    out_dir: pathlib.Path | None = None,
    console: Console | None = None,
    tasks: Sequence[Task] | None = None,
    workers: int | None = None,
    conversations: Sequence[Conversation] | None = None,
) -> BenchReport:
    """Run the task suite under each mix for each contender and seed; print, save, return.

    `quick` runs `QUICK_MIXES` with 2 seeds over `quick_tasks` unless `mixes` /
    `seeds` / `tasks` say otherwise; a mix whose `Mix.suite` is ``effects`` runs the
    suite's tasks with side effects (quick: one per family), one whose suite is
    ``conversations`` runs `conversations` (default `CONVERSATIONS`, quick:
    `QUICK_CONVERSATIONS`). A mix with nothing random runs one seed.
    The clean mix always runs (the other mixes are compared with it), and so does
    each mix's `Mix.baseline`. With
    `out_dir`, ``chaos-bench.json`` and (if matplotlib is installed)
    ``chaos-bench.png`` are written there. `console` gets the table; None prints
    nothing. Runs are spread over `workers` processes (default: one per CPU);
    every run is seeded on its own, so the counts do not depend on it.
    """
    names = list(contenders or DEFAULT_CONTENDERS)
    unknown = [n for n in names if n not in CONTENDERS]
    if unknown:
        raise ConfigurationError(f"unknown contenders {unknown}; choose from {sorted(CONTENDERS)}")
    mix_names = list(mixes or (QUICK_MIXES if quick else MIXES))
    unknown = [m for m in mix_names if m not in MIXES]
    if unknown:
        raise ConfigurationError(f"unknown mixes {unknown}; choose from {sorted(MIXES)}")
    if "clean" not in mix_names:
        mix_names.insert(0, "clean")
    for baseline in dict.fromkeys(MIXES[m].baseline for m in list(mix_names)):
        if baseline not in mix_names:
            mix_names.insert(mix_names.index("clean") + 1, baseline)
    seed_count = seeds if seeds is not None else (QUICK_SEEDS if quick else 5)
    if seed_count < 1:
        raise ConfigurationError(f"seeds must be >= 1, got {seed_count}")
    suite = list(tasks or (quick_tasks() if quick else TASKS))
    dialogues = list(
        conversations
        or ([c for c in CONVERSATIONS if c.id in QUICK_CONVERSATIONS] if quick else CONVERSATIONS)
    )
    scenarios: list[Scenario] = [*suite, *dialogues]
    for scenario in scenarios:
        oracle(scenario)
    notes = _notes()
    skipped = {n: why for n in names if (why := _available(n)) is not None}
    for name, why in skipped.items():
        notes.append(f"contender {name} skipped: {why}")
    started = time.perf_counter()
    revision = _revision()  # before running: others may commit while it runs
    jobs = [
        _Job(
            name,
            mix_name,
            seed,
            _scenarios(MIXES[mix_name], suite, dialogues, quick=quick),
        )
        for name in names
        if name not in skipped
        for mix_name in mix_names
        for seed in (range(seed_count) if MIXES[mix_name].seeded else [0])
    ]
    runs = [r for batch in _run_jobs(jobs, workers) for r in batch]
    rows: list[Row] = []
    task_map: dict[str, Scenario] = {t.id: t for t in scenarios}
    for name in names:
        for mix_name in mix_names:
            mix = MIXES[mix_name]
            mix_runs = [r for r in runs if r.contender == name and r.mix == mix_name]
            base = [r for r in runs if r.contender == name and r.mix == mix.baseline]
            if mix_runs:
                rows.append(_aggregate(mix_runs, mix, base, task_map))
    report = BenchReport(
        config={
            "quick": quick,
            "contenders": [n for n in names if n not in skipped],
            "mixes": mix_names,
            "seeds": seed_count,
            "tasks": len(suite),
            "conversations": len(dialogues),
            "policy": {
                "resilient": {
                    "max_attempts": RESILIENT_POLICY.max_attempts,
                    "base_delay": RESILIENT_POLICY.base_delay_s,
                    "max_repair": RESILIENT_POLICY.max_repair,
                    "loop_threshold": RESILIENT_POLICY.loop_threshold,
                },
                "retry_policy": {"max_attempts": RETRY_POLICY.max_attempts, "backoff": 0},
                "create_agent": {"max_retries": 2, "backoff": 0, "call_limits": CALL_LIMIT},
            },
            "elapsed_s": round(time.perf_counter() - started, 2),
            "when": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "cpus": os.cpu_count(),
            "versions": _versions(),
            "revision": revision,
        },
        rows=rows,
        runs=runs,
        notes=notes,
    )
    pair = {"toolnode", "resilient"} <= set(report.config["contenders"])
    if pair:
        report.config["overhead"] = measure_overhead(suite, rounds=1 if quick else 2)
    report.targets = evaluate_targets(report) if "resilient" in report.config["contenders"] else []
    if console is not None:
        print_report(report, console)
    if out_dir is not None:
        write_report(report, out_dir, console=console)
    return report


# -------------------------------------------------------------------- rendering


def _pct(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.1%}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def print_report(report: BenchReport, console: Console) -> None:
    """The results table, the targets and the notes."""
    config = report.config
    table = Table(
        title=f"Chaos benchmark: {config['tasks']} tasks, {config.get('conversations', 0)} "
        f"conversations x {config['seeds']} seeds "
        f"({'quick' if config['quick'] else 'full'}, {config['elapsed_s']}s)"
    )
    columns = (
        "mix",
        "class",
        "contender",
        "success",
        "pass^k",
        "turns",
        "crash",
        "dup",
        "after-rm/open",
        "opens",
        "repeat",
        "human",
        "tool calls",
        "LLM calls",
        "max att",
        "recov s",
        "cpu ms/call",
    )
    for column in columns:
        table.add_column(
            column, justify="left" if column in ("mix", "class", "contender") else "right"
        )
    order = {m: i for i, m in enumerate(config["mixes"])}
    rank = {c: i for i, c in enumerate(CONTENDERS)}
    last: dict[str, str] = {}
    for row in sorted(report.rows, key=lambda r: rank.get(r.contender, 99)):
        last[row.mix] = row.contender
    for row in sorted(report.rows, key=lambda r: (order.get(r.mix, 99), rank.get(r.contender, 99))):
        label = CONTENDERS[row.contender].label if row.contender in CONTENDERS else row.contender
        table.add_row(
            row.mix,
            row.fault_class,
            label,
            _pct(row.success),
            _pct(row.pass_k),
            _pct(row.turn_success),
            str(row.crashed),
            str(row.duplicates),
            f"{row.calls_after_removal}/{row.calls_while_open}",
            f"{row.breaker_opens}/{row.shadow_opens}",
            str(row.repeated_calls),
            str(row.escalations),
            f"{row.tool_calls} ({_ratio(row.tool_calls_vs_clean)})",
            f"{row.llm_calls} ({_ratio(row.llm_calls_vs_clean)})",
            f"{row.max_attempts_per_call}/{row.max_attempts_per_key}",
            _seconds(row.recovery_mean_s),
            f"{row.cpu_ms_per_tool_call:.2f}",
            end_section=last.get(row.mix) == row.contender,
        )
    console.print(table)
    if report.targets:
        targets = Table(title="Targets for (d) add_resilience")
        for column in ("target", "status", "measured"):
            targets.add_column(column)
        colours = {"met": "green", "missed": "red", "pending": "yellow", "info": "cyan"}
        for t in report.targets:
            targets.add_row(t.name, f"[{colours[t.status]}]{t.status}[/]", t.detail)
        console.print(targets)
    for note in report.notes:
        console.print(f"[dim]- {note}[/dim]")


def write_report(
    report: BenchReport, out_dir: pathlib.Path, *, console: Console | None = None
) -> None:
    """``chaos-bench.json`` and, when matplotlib is importable, ``chaos-bench.png``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "chaos-bench.json"
    path.write_text(json.dumps(report.as_dict(), indent=1, default=str) + "\n")
    written = [str(path)]
    chart = _chart(report, out_dir / "chaos-bench.png")
    if chart is not None:
        written.append(str(chart))
    if console is not None:
        console.print(f"wrote {', '.join(written)}")


def _chart(report: BenchReport, path: pathlib.Path) -> pathlib.Path | None:
    try:
        import matplotlib as mpl  # noqa: PLC0415 - optional dependency

        mpl.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return None
    mixes = list(report.config["mixes"])
    contenders = list(report.config["contenders"])
    width = 0.8 / max(1, len(contenders))
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(max(8, 1.1 * len(mixes)), 8), sharex=True)
    for i, name in enumerate(contenders):
        xs = [m + (i - (len(contenders) - 1) / 2) * width for m in range(len(mixes))]
        success = [(r.success if (r := report.row(name, m)) else 0.0) for m in mixes]
        dups = [(r.duplicates if (r := report.row(name, m)) else 0) for m in mixes]
        label = CONTENDERS[name].label if name in CONTENDERS else name
        top.bar(xs, success, width, label=label)
        bottom.bar(xs, dups, width, label=label)
    top.set_ylabel("task success")
    top.set_ylim(0, 1.0)
    top.legend(
        fontsize="small", ncols=len(contenders), loc="lower center", bbox_to_anchor=(0.5, 1.0)
    )
    bottom.set_ylabel("duplicate side effects")
    most = max((r.duplicates for r in report.rows), default=0)
    bottom.set_ylim(0, max(1, most) * 1.1)
    bottom.set_xticks(range(len(mixes)))
    bottom.set_xticklabels(
        [f"{m}\n({MIXES[m].fault_class})" for m in mixes], rotation=45, ha="right", fontsize="small"
    )
    fig.suptitle(
        f"Chaos benchmark ({report.config['seeds']} seeds x {report.config['tasks']} tasks)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def cmd_bench(args: Any, console: Console) -> int:
    """The ``bench`` subcommand: run, print, save.

    Exit 0 when (d) meets every landed target (or did not run), 1 when it misses
    one (each is printed); a usage mistake raises ConfigurationError.
    """
    report = run_bench(
        quick=bool(args.quick),
        contenders=args.contenders,
        mixes=args.mix,
        seeds=args.seeds,
        out_dir=pathlib.Path(args.out) if args.out else None,
        console=console,
    )
    if "resilient" not in report.config["contenders"]:
        return 0
    failures = check_targets(report)
    for failure in failures:
        console.print(f"[red]target missed[/red] {failure}")
    return 1 if failures else 0
