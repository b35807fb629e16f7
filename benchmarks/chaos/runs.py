"""One run: a contender on one task (or conversation) under one mix and seed: `run_task`."""

from __future__ import annotations

import dataclasses
import random
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from benchmarks.chaos.contenders import RESILIENT_BREAKER, BuildContext, Contender
from benchmarks.chaos.mixes import STATUS_DOWN, Mix
from benchmarks.chaos.tasks import (
    Scenario,
    Shop,
    Task,
    extra_effects,
    judge,
    operator_decision,
    scripted_agent,
    turn_judged,
    turns_of,
)
from langgraph_resilience import BreakerConfig
from langgraph_resilience.core import call_key
from langgraph_resilience.core.breaker import Outcome, Transition
from langgraph_resilience.stores import InMemoryBreakerStore
from langgraph_resilience.testing import FakeClock, FakeHTTPError
from langgraph_resilience.testing.faults import (
    ChaosTool,
    chaos_stats,
    inject,
)

__all__ = [
    "MAX_ESCALATIONS",
    "RECURSION_LIMIT",
    "RunResult",
    "run_task",
]


RECURSION_LIMIT = 200
MAX_ESCALATIONS = 40
"""Resumes the scripted operator answers per run before the run counts as stuck."""


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
