"""Runs the conversations: many AgentDojo tasks on one thread, every contender in turn.

Why this module exists: a real agent meets a tool failure in the middle of a long
thread, not in a fresh graph, so a *conversation* here is a suite's user tasks
asked one after another as successive ``HumanMessage``s on ONE ``thread_id``. A
`Unit` is one (suite, seed, mix, id style); its contenders are interleaved task by
task (task 1 on every contender, then task 2, ...), each on its own graph,
checkpointer, replay model and `Sandbox`. Before each task the sandbox gets the
task's fresh environment; after it, AgentDojo grades the task with its own
pre/post environments (`suites.grade`) and `measure` counts, from the sandbox's
attempt log:

- repeats: runs of a side-effecting function, with given arguments, that
  completed (commit-timeout runs included) beyond the number of times the
  reference calls make that call; duplicate effects: those repeats that changed
  the environment again (an idempotent write run twice is a repeat only);
- missed calls: reference calls never done: for a side-effecting function, no run
  completed (a commit-timeout run counts: its effect is in); for a read, no
  result reached the agent;
- LLM calls (replay model invocations) and tool executions (every attempt that
  reached the wrapped function, faulty or not).

A run that raises is recorded as failed (with the exception) and the conversation
continues on the same thread: LangGraph accepts new input on a thread whose last
run raised (the pending tools task is dropped; the unanswered tool call stays in
the history). Failing to build a contender fails all its tasks the same way.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from agentdojo.functions_runtime import FunctionCall
from langgraph_resilience.testing import FakeClock

from .checks import CHECKS
from .contenders import CONTENDERS, OURS
from .faults import MIXES
from .replay import Behaviour, IdStyle, ReplayChatModel, text_of
from .suites import Suite, TaskSpec, grade, load_suite
from .tools import Attempt, Sandbox, make_tools


@dataclasses.dataclass(frozen=True, slots=True)
class Unit:
    """One conversation per contender: a suite's tasks under one seed, mix and id style."""

    suite: str
    seed: int
    mix: str
    ids: IdStyle
    contenders: tuple[str, ...]
    limit: int | None = None
    """Run only the suite's first `limit` tasks."""
    llm_seconds: float = 0.0
    """Virtual seconds each model call takes (see `ReplayChatModel.seconds_per_call`)."""
    behaviour: Behaviour = "blind"
    """How the replay model meets a failed call (see `replay.plan`)."""
    transport: str = "http"
    """``http``: tools call the functions in process, faults raised as httpx errors;
    ``http_keyed``: the same services honouring an ``Idempotency-Key`` header
    (`tools.Sandbox`); ``mcp``: the functions served over a real MCP session
    (`mcp_transport`)."""


@dataclasses.dataclass(frozen=True, slots=True)
class TaskResult:
    suite: str
    seed: int
    mix: str
    ids: str
    contender: str
    task: str
    behaviour: str
    success: bool
    duplicates: int
    """Repeated runs of a side effect that changed the environment again."""
    repeats: int
    """Runs of a side effect beyond the reference's count (changing or not)."""
    missed: int
    llm_calls: int
    tool_executions: int
    raised: str | None
    """The exception the run raised (the task then counts as failed)."""
    grade_error: str | None
    """An exception AgentDojo's utility check raised (the task counts as failed)."""
    faults: dict[str, int]
    """Injected faults by kind, over all attempts of the task."""
    agent_errors: dict[str, int]
    """Error ToolMessages the agent saw, by exception type (for diagnosis)."""
    output: str


@dataclasses.dataclass(slots=True)
class _Conversation:
    contender: str
    sandbox: Sandbox
    model: ReplayChatModel
    app: Any
    config: dict[str, Any]
    build_error: str | None = None
    host: Any = None
    """The conversation's `mcp_transport.McpHost` (``--transport mcp``)."""


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:300]


@functools.cache
def cached_suite(name: str) -> Suite:
    return load_suite(name)


def measure(
    spec: TaskSpec, attempts: Sequence[Attempt], side_effects: frozenset[str]
) -> tuple[int, int, int]:
    """(duplicate effects, repeats, missed reference calls) of one task; see the module.

    Runs of one side-effecting call (function + arguments) are taken in order: the
    first as many as the reference makes are intended, the rest are *repeats*; a
    repeat that changed the environment is a *duplicate effect* (an idempotent
    write run again changes nothing: a repeat, not a duplicate)."""
    reference = Counter((c.function, c.key) for c in spec.calls)
    done = Counter(
        (a.function, a.key)
        for a in attempts
        if a.delivered or (a.ran and a.function in side_effects)
    )
    seen: Counter[tuple[str, str]] = Counter()
    duplicates = repeats = 0
    for a in attempts:
        if not a.ran or a.function not in side_effects:
            continue
        seen[a.function, a.key] += 1
        if seen[a.function, a.key] > reference[a.function, a.key]:
            repeats += 1
            duplicates += a.changed
    missed = sum(max(0, n - done[k]) for k, n in reference.items())
    return duplicates, repeats, missed


def error_type(message: ToolMessage) -> str:
    """The exception type an error ToolMessage reports, whatever the framework's format:
    our JSON envelope's ``type``, ToolNode's ``Error: Type(...)``, or ToolRetryMiddleware's
    ``... failed after N attempts with Type: ...``."""
    content = text_of(message)
    try:
        envelope = json.loads(content)
    except ValueError:
        envelope = None
    if isinstance(envelope, dict) and isinstance(envelope.get("type"), str):
        return envelope["type"]
    match = re.search(r"^Error: (\w+)|attempts? with (\w+):", content)
    return next((g for g in match.groups() if g), "other") if match else "other"


def _after_prompt(messages: Sequence[BaseMessage], prompt: str) -> list[BaseMessage]:
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, HumanMessage) and text_of(message) == prompt:
            return list(messages[index + 1 :])
    return []


def _start(unit: Unit, suite: Suite, contender: str) -> _Conversation:
    sandbox = Sandbox(suite, MIXES[unit.mix], unit.seed, keyed=unit.transport == "http_keyed")
    clock = FakeClock()
    model = ReplayChatModel(
        tasks={t.prompt: t for t in suite.tasks},
        id_style=unit.ids,
        behaviour=unit.behaviour,
        checks=CHECKS[unit.suite],
        clock=clock,
        seconds_per_call=unit.llm_seconds,
    )
    thread = f"{unit.suite}-{unit.seed}-{unit.mix}-{unit.ids}-{unit.behaviour}-{contender}"
    config: dict[str, Any] = {"configurable": {"thread_id": thread}}
    host = None
    try:
        if unit.transport == "mcp":
            from .mcp_transport import McpHost, load_tools  # noqa: PLC0415 - MCP only

            host = McpHost(sandbox)
            tools = load_tools(host, ours=contender in OURS)
        else:
            tools = make_tools(sandbox)
        app = CONTENDERS[contender](
            model, tools, suite.side_effects, clock, transport=unit.transport
        )
    except Exception as exc:
        return _Conversation(contender, sandbox, model, None, config, _describe(exc), host)
    return _Conversation(contender, sandbox, model, app, config, None, host)


def run_task(conv: _Conversation, unit: Unit, spec: TaskSpec) -> TaskResult:
    """Ask `spec`'s prompt on the conversation's thread, then grade and measure it."""
    conv.sandbox.start_task(spec.id, spec.fresh_environment())
    llm_before = conv.model.calls
    raised = conv.build_error
    messages: Sequence[BaseMessage] = []
    if conv.app is not None:
        config = {**conv.config, "recursion_limit": 60 + 12 * len(spec.calls)}
        request = {"messages": [HumanMessage(spec.prompt)]}
        try:
            if conv.host is not None:  # MCP tools are async: run the graph async
                messages = asyncio.run(conv.app.ainvoke(request, config))["messages"]
            else:
                messages = conv.app.invoke(request, config)["messages"]
        except Exception as exc:
            raised = _describe(exc)
            try:
                messages = conv.app.get_state(conv.config).values.get("messages", [])
            except Exception:
                messages = []
    after = _after_prompt(messages, spec.prompt)
    last = after[-1] if after else None
    output = text_of(last) if isinstance(last, AIMessage) and not last.tool_calls else ""
    traces = [
        FunctionCall(function=c["name"], args=c["args"], id=c["id"])
        for m in after
        if isinstance(m, AIMessage)
        for c in m.tool_calls
    ]
    grade_error = None
    success = False
    if raised is None and conv.sandbox.env is not None:
        try:
            success = grade(spec, output, conv.sandbox.env, traces)
        except Exception as exc:
            grade_error = _describe(exc)
    attempts = list(conv.sandbox.attempts)
    duplicates, repeats, missed = measure(spec, attempts, conv.sandbox.suite.side_effects)
    return TaskResult(
        suite=unit.suite,
        seed=unit.seed,
        mix=unit.mix,
        ids=unit.ids,
        contender=conv.contender,
        task=spec.id,
        behaviour=unit.behaviour,
        success=success,
        duplicates=duplicates,
        repeats=repeats,
        missed=missed,
        llm_calls=conv.model.calls - llm_before,
        tool_executions=len(attempts),
        raised=raised,
        grade_error=grade_error,
        faults=dict(Counter(a.fault for a in attempts if a.fault)),
        agent_errors=dict(
            Counter(
                error_type(m) for m in after if isinstance(m, ToolMessage) and m.status == "error"
            )
        ),
        output=output[:200],
    )


def run_unit(unit: Unit) -> list[TaskResult]:
    """Every contender's conversation for `unit`, interleaved task by task."""
    suite = cached_suite(unit.suite)
    tasks = suite.tasks if unit.limit is None else suite.tasks[: unit.limit]
    conversations = [_start(unit, suite, c) for c in unit.contenders]
    try:
        return [run_task(conv, unit, spec) for spec in tasks for conv in conversations]
    finally:
        for conv in conversations:
            if conv.host is not None:
                conv.host.close()


def failed_unit(unit: Unit, exc: BaseException) -> list[TaskResult]:
    """Every task of `unit` as failed by `exc` (the unit could not run at all)."""
    suite = cached_suite(unit.suite)
    tasks = suite.tasks if unit.limit is None else suite.tasks[: unit.limit]
    return [
        TaskResult(
            suite=unit.suite,
            seed=unit.seed,
            mix=unit.mix,
            ids=unit.ids,
            contender=contender,
            task=spec.id,
            behaviour=unit.behaviour,
            success=False,
            duplicates=0,
            repeats=0,
            missed=len(spec.calls),
            llm_calls=0,
            tool_executions=0,
            raised=f"unit failed: {_describe(exc)}",
            grade_error=None,
            faults={},
            agent_errors={},
            output="",
        )
        for spec in tasks
        for contender in unit.contenders
    ]
