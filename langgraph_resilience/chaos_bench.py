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
recovery paths ``resilient`` needs to meet the targets in it. Run it with
`run_bench`; `check_targets` lists the behaviour targets (counts, never
timings) that ``resilient`` misses, leaving out those whose paths have not
landed yet (reported as *pending*).
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
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langchain_core.tools import BaseTool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command, RetryPolicy
from rich.console import Console
from rich.table import Table

from langgraph_resilience.breaker import BreakerConfig
from langgraph_resilience.canonical import call_key
from langgraph_resilience.chaos import (
    FaultPlan,
    burst,
    chaos_stats,
    inject,
    intermittent,
    persistent,
    single,
)
from langgraph_resilience.chaos_tasks import (
    ALTERNATIVES,
    BATCH_ARGS,
    BATCH_MERGES,
    OUTPUT_SCHEMAS,
    SIDE_EFFECT_TOOLS,
    TASKS,
    Shop,
    Task,
    judge,
    operator_decision,
    oracle,
    scripted_agent,
    scripted_planner,
    scripted_repairer,
)
from langgraph_resilience.errors import ConfigurationError
from langgraph_resilience.policy import ResiliencePolicy
from langgraph_resilience.profile import ToolProfile
from langgraph_resilience.state import ResilienceState
from langgraph_resilience.testing import FakeClock, ScriptedChatModel
from langgraph_resilience.wiring import add_resilience

__all__ = [
    "CONTENDERS",
    "DEFAULT_CONTENDERS",
    "MIXES",
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

    task: Task
    tools: Sequence[BaseTool]
    model: ScriptedChatModel
    """The scripted agent."""
    clock: FakeClock
    seed: int
    checkpointer: BaseCheckpointSaver[Any]
    shop: Shop
    """The backend, for what a service offers besides its tools (a status check)."""


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
"""Contender (d)'s breaker (the package default). The chaos harness's shadow breaker
uses the same config, so "calls while the breaker should be open" means calls this
breaker would have refused, for every contender."""

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
            status_check=ctx.shop.status_check,
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

    @property
    def detection(self) -> bool:
        """Whether the permanent-fault targets apply."""
        return self.detect_requires is not None


def _mix(
    name: str,
    fault_class: str,
    description: str,
    *specs: Any,
    requires: Iterable[str] = (),
    dedup_requires: Iterable[str] = (),
    detect_requires: Iterable[str] | None = None,
) -> Mix:
    return Mix(
        name,
        fault_class,
        FaultPlan(tuple(specs), name),
        description,
        frozenset(requires),
        frozenset(dedup_requires),
        None if detect_requires is None else frozenset(detect_requires),
    )


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
            "get_weather answers 503 from its first call on (an outage)",
            persistent("http_503", tools=("get_weather",)),
            requires=("replan",),
            detect_requires=("breaker",),
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
            "geocode answers 404 'unknown tool' from its second call on",
            persistent("tool_removed", start=1, tools=("geocode",)),
            requires=("replan",),
            detect_requires=("breaker",),
        ),
        _mix(
            "partial",
            "partial",
            "send_bulk_email sends only the first half of its recipients, first call",
            single("partial_success", tools=("send_bulk_email",)),
            requires=("partial",),
            dedup_requires=("partial",),
        ),
    )
}
"""Every mix, by name. Add a mix by adding an entry."""

QUICK_MIXES: tuple[str, ...] = ("clean", "transient", "schema_drift", "timeout_after_commit")
"""What ``bench --quick`` runs: the issue's transient target, a repair path and the
lost-response hazard."""

QUICK_SEEDS = 2


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


def _seed_for(seed: int, task: Task) -> int:
    return random.Random(f"{seed}:{task.id}").randrange(2**31)


def _repeated(messages: Sequence[BaseMessage]) -> int:
    seen: Counter[str] = Counter()
    for message in messages:
        if isinstance(message, AIMessage):
            for call in message.tool_calls:
                seen[call_key(call["name"], call["args"])] += 1
    return sum(n - 1 for n in seen.values() if n > 1)


def run_task(contender: Contender, task: Task, mix: Mix, seed: int) -> RunResult:
    """Run `task` once: a fresh shop, the mix's faults from `seed`, the contender's graph.

    When the graph interrupts for a human (escalation), `operator_decision` answers
    with ``Command(resume=...)``, as an operator on call would.
    """
    run_seed = _seed_for(seed, task)
    shop = Shop()
    clock = FakeClock()
    tools = inject(shop.tools(), mix.plan, run_seed, clock=clock, breaker=RESILIENT_BREAKER)
    model = scripted_agent(task)
    built = contender.build(
        BuildContext(task, tools, model, clock, run_seed, InMemorySaver(), shop)
    )
    config: RunnableConfig = {
        "recursion_limit": RECURSION_LIMIT,
        "max_concurrency": 1,
        "configurable": {"thread_id": f"{task.id}:{seed}"},
    }
    values: dict[str, Any] = {}
    crashed: str | None = None
    escalations = 0
    asked: Counter[str] = Counter()
    approved: list[str] = []
    request: Any = {"messages": [HumanMessage(task.prompt)]}
    cpu0, wall0 = time.process_time(), time.perf_counter()
    try:
        while True:
            for chunk in built.app.stream(request, config, stream_mode="values"):
                if isinstance(chunk, dict) and "messages" in chunk:
                    values = chunk
            waiting = built.app.get_state(config).interrupts
            if not waiting:
                break
            if escalations >= MAX_ESCALATIONS:
                crashed = "TooManyEscalations"
                break
            escalations += 1
            decision = operator_decision(waiting[0].value, asked)
            if decision["action"] == "retry":
                approved.append(str(waiting[0].value.get("call_id")))
            request = Command(resume=decision)
    except Exception as exc:  # a framework that gives up raises: the task failed
        crashed = type(exc).__name__
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    messages: list[BaseMessage] = list(values.get("messages") or [])
    final = messages[-1] if messages else None
    answer = (
        final.text
        if isinstance(final, AIMessage) and not final.tool_calls and crashed is None
        else None
    )
    stats = chaos_stats(tools)
    return RunResult(
        contender=contender.name,
        mix=mix.name,
        seed=seed,
        task=task.id,
        success=crashed is None and judge(task, shop, answer),
        crashed=crashed,
        answer=answer,
        duplicates=shop.duplicate_effects,
        tool_calls=stats.calls,
        executions=stats.executions,
        llm_calls=model.calls + sum(m.calls for m in built.models),
        agent_turns=model.calls,
        escalations=escalations,
        repeated_calls=_repeated(messages),
        calls_after_removal=stats.calls_after_removal,
        calls_while_open=stats.calls_while_open,
        max_attempts_per_call=stats.max_attempts_per_call,
        max_attempts_per_key=stats.max_attempts_per_key,
        attempts_by_call=stats.attempts_by_call,
        human_retries=tuple(approved),
        faults=stats.faults,
        recovery_latencies=stats.recovery_latencies,
        virtual_seconds=clock.monotonic(),
        cpu_seconds=cpu,
        wall_seconds=wall,
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


def _rate(values: Sequence[bool]) -> float:
    return sum(values) / len(values) if values else math.nan


_SUBSETS: Mapping[str, Callable[[Task], bool]] = {
    "ten_reads": lambda t: t.calls == 10 and t.side_effects == 0,
    "ten_effects": lambda t: t.calls == 10 and t.side_effects > 0,
    "with_effects": lambda t: t.side_effects > 0,
    "read_only": lambda t: t.side_effects == 0,
}


def _aggregate(
    runs: Sequence[RunResult],
    mix: Mix,
    clean: Sequence[RunResult] | None,
    tasks: Mapping[str, Task],
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
                    f"{mix.name}: LLM calls <= {LLM_RATIO_TARGET}x clean",
                    row.llm_calls_vs_clean <= LLM_RATIO_TARGET,
                    f"{row.llm_calls_vs_clean:.3f}x",
                    frozenset(),
                )
            )
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


def _over_budget(run: RunResult, per_call: int, per_key: int) -> bool:
    """More attempts than the automatic budget allows, beyond the operator's explicit
    ``retry`` answers (each allows one more run of its call)."""
    approved = Counter(run.human_retries)
    for name, attempts in run.attempts_by_call.items():
        if attempts > per_call + approved[name.split(":", 1)[1]]:
            return True
    if run.max_attempts_per_key > per_key + len(run.human_retries):
        return True
    return run.tool_calls > RESILIENT_POLICY.max_tool_attempts


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
    tasks: tuple[Task, ...]


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
) -> BenchReport:
    """Run the task suite under each mix for each contender and seed; print, save, return.

    `quick` runs `QUICK_MIXES` with 2 seeds over `quick_tasks` unless `mixes` /
    `seeds` / `tasks` say otherwise.
    The clean mix always runs (the other mixes are compared with it). With
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
    seed_count = seeds if seeds is not None else (QUICK_SEEDS if quick else 5)
    if seed_count < 1:
        raise ConfigurationError(f"seeds must be >= 1, got {seed_count}")
    suite = list(tasks or (quick_tasks() if quick else TASKS))
    for task in suite:
        oracle(task)
    notes = [
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
        *_unwired_features(),
    ]
    skipped = {n: why for n in names if (why := _available(n)) is not None}
    for name, why in skipped.items():
        notes.append(f"contender {name} skipped: {why}")
    started = time.perf_counter()
    revision = _revision()  # before running: others may commit while it runs
    jobs = [
        _Job(name, mix_name, seed, tuple(suite))
        for name in names
        if name not in skipped
        for mix_name in mix_names
        for seed in ([0] if mix_name == "clean" else range(seed_count))
    ]
    workers = max(1, min(workers if workers is not None else (os.cpu_count() or 1), len(jobs)))
    if workers == 1:
        done = [_run_job(job) for job in jobs]
    else:
        context = multiprocessing.get_context("spawn")  # no fork of a threaded process
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
            done = list(pool.map(_run_job, jobs))
    runs = [r for batch in done for r in batch]
    rows: list[Row] = []
    task_map = {t.id: t for t in suite}
    for name in names:
        clean_runs = [r for r in runs if r.contender == name and r.mix == "clean"]
        for mix_name in mix_names:
            mix_runs = [r for r in runs if r.contender == name and r.mix == mix_name]
            if mix_runs:
                rows.append(_aggregate(mix_runs, MIXES[mix_name], clean_runs, task_map))
    report = BenchReport(
        config={
            "quick": quick,
            "contenders": [n for n in names if n not in skipped],
            "mixes": mix_names,
            "seeds": seed_count,
            "tasks": len(suite),
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
        title=f"Chaos benchmark: {config['tasks']} tasks x {config['seeds']} seeds "
        f"({'quick' if config['quick'] else 'full'}, {config['elapsed_s']}s)"
    )
    columns = (
        "mix",
        "class",
        "contender",
        "success",
        "pass^k",
        "crash",
        "dup",
        "after-rm/open",
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
            str(row.crashed),
            str(row.duplicates),
            f"{row.calls_after_removal}/{row.calls_while_open}",
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
