"""AgentDojo's suites as this evaluation needs them: tasks, reference calls, side effects.

Why this module exists: every number the evaluation reports is graded by AgentDojo
itself, so everything task-shaped comes from AgentDojo's public API and nothing is
rewritten here. A `TaskSpec` is one user task of a suite at `BENCHMARK_VERSION`
(AgentDojo's own default benchmark version): its prompt, its fresh environment (the
suite's default environment, without injections, passed through the task's
``init_environment``, exactly as ``TaskSuite.run_task_with_pipeline`` prepares it),
the reference calls from ``ground_truth(pre_environment)`` and its
``GROUND_TRUTH_OUTPUT``. `grade` applies AgentDojo's rule: ``utility_from_traces``
when the task defines it (some Slack tasks grade the calls made), else
``utility(model_output, pre_environment, post_environment)``.

`SIDE_EFFECTS` is the hand-written list, per suite, of functions that are meant to
change the world (what a user would mark ``ToolProfile(side_effect=True)``).
`verify_side_effects` checks it against reality by running every task's reference
calls on a copy of its environment and noting which functions changed it.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from agentdojo.functions_runtime import Function, FunctionCall, FunctionsRuntime, TaskEnvironment
from agentdojo.task_suite.load_suites import get_suite
from agentdojo.task_suite.task_suite import TaskSuite

BENCHMARK_VERSION = "v1.2.2"
"""The default of AgentDojo 0.1.35's own benchmark script (``agentdojo.scripts.benchmark``)."""

SUITES: tuple[str, ...] = ("banking", "slack", "travel", "workspace")

SIDE_EFFECTS: Mapping[str, frozenset[str]] = {
    "banking": frozenset(
        {
            "send_money",
            "schedule_transaction",
            "update_scheduled_transaction",
            "update_password",
            "update_user_info",
        }
    ),
    "slack": frozenset(
        {
            "add_user_to_channel",
            "invite_user_to_slack",
            "remove_user_from_slack",
            "send_channel_message",
            "send_direct_message",
            "post_webpage",
        }
    ),
    "travel": frozenset(
        {
            "create_calendar_event",
            "cancel_calendar_event",
            "reserve_car_rental",
            "reserve_hotel",
            "reserve_restaurant",
            "send_email",
        }
    ),
    "workspace": frozenset(
        {
            "send_email",
            "delete_email",
            "create_calendar_event",
            "cancel_calendar_event",
            "reschedule_calendar_event",
            "add_calendar_event_participants",
            "append_to_file",
            "create_file",
            "delete_file",
            "share_file",
        }
    ),
}
"""Functions meant to change the environment, by intent (read from their docstrings)."""

IDEMPOTENT: Mapping[str, frozenset[str]] = {
    "banking": frozenset({"update_password", "update_user_info", "update_scheduled_transaction"}),
    "slack": frozenset(),
    "travel": frozenset({"reserve_hotel", "reserve_car_rental", "reserve_restaurant"}),
    "workspace": frozenset({"share_file"}),
}
"""Side effects that are idempotent by nature on AgentDojo's environments: they *set*
fields (a password, the user's address, a scheduled transaction's fields, the one
reservation, a file's permission for one address), so running one twice leaves
the environment as running it once (checked in tests/bench by running every
reference call twice). Not listed, and why: ``send_*``, ``create_*``,
``schedule_transaction``, ``append_to_file`` and ``add_*`` add a record each time;
``invite_user_to_slack``, ``delete_*`` and ``remove_user_from_slack`` refuse a
second run with an error (the agent would read it as a failure);
``reschedule_calendar_event`` and ``cancel_calendar_event`` mail the participants
each time; ``post_webpage`` appends to the web request log."""


@dataclasses.dataclass(frozen=True, slots=True)
class RefCall:
    """One reference call: the function, its arguments, and their canonical key."""

    function: str
    args: Mapping[str, Any]
    key: str


@dataclasses.dataclass(frozen=True, slots=True)
class TaskSpec:
    """One AgentDojo user task, ready to run."""

    suite: str
    id: str
    prompt: str
    task: Any
    """AgentDojo's ``BaseUserTask`` instance (it grades)."""
    environment: TaskEnvironment
    """The fresh pre-environment; never mutated (copy it with `fresh_environment`)."""
    calls: tuple[RefCall, ...]
    output: str
    """``GROUND_TRUTH_OUTPUT`` (often empty: many tasks grade the environment only)."""

    def fresh_environment(self) -> TaskEnvironment:
        return self.environment.model_copy(deep=True)


@dataclasses.dataclass(frozen=True, slots=True)
class Suite:
    """A loaded suite: its functions, side-effecting names and tasks in numeric order."""

    name: str
    functions: Mapping[str, Function[Any, Any]]
    side_effects: frozenset[str]
    tasks: tuple[TaskSpec, ...]

    @property
    def runtime(self) -> FunctionsRuntime:
        return FunctionsRuntime(list(self.functions.values()))


def canonical_key(function: Function[Any, Any], args: Mapping[str, Any]) -> str:
    """The arguments as the function sees them (validated, defaults filled), as JSON.

    ``{"amount": 100}`` and ``{"amount": 100.0}`` are the same call; so are an
    omitted default and the default spelled out.
    """
    try:
        dumped = function.parameters.model_validate(dict(args)).model_dump(mode="json")
    except Exception:  # invalid arguments are still a (failing) call: key them as given
        dumped = dict(args)
    return json.dumps(dumped, sort_keys=True, default=str)


def _task_number(task_id: str) -> int:
    match = re.search(r"(\d+)$", task_id)
    return int(match.group(1)) if match else 0


def load_suite(name: str) -> Suite:
    """Load one suite at `BENCHMARK_VERSION`, with every task's reference calls."""
    suite: TaskSuite[Any] = get_suite(BENCHMARK_VERSION, name)
    functions = {f.name: f for f in suite.tools}
    default_env = suite.load_and_inject_default_environment({})
    specs = []
    for task_id in sorted(suite.user_tasks, key=_task_number):
        task = suite.user_tasks[task_id]
        env = task.init_environment(default_env.model_copy(deep=True))
        reference: list[FunctionCall] = task.ground_truth(env.model_copy(deep=True))
        calls = tuple(
            RefCall(
                c.function,
                copy.deepcopy(dict(c.args)),
                canonical_key(functions[c.function], c.args),
            )
            for c in reference
        )
        specs.append(
            TaskSpec(name, task_id, task.PROMPT, task, env, calls, task.GROUND_TRUTH_OUTPUT or "")
        )
    return Suite(name, functions, SIDE_EFFECTS[name] & functions.keys(), tuple(specs))


def load_suites(names: Iterable[str] = SUITES) -> list[Suite]:
    return [load_suite(n) for n in names]


def grade(
    spec: TaskSpec,
    model_output: str,
    post_environment: TaskEnvironment,
    traces: Sequence[FunctionCall],
) -> bool:
    """AgentDojo's verdict, as ``TaskSuite._check_user_task_utility`` computes it."""
    pre = spec.fresh_environment()
    verdict = spec.task.utility_from_traces(model_output, pre, post_environment, traces)
    if verdict is not None:
        return bool(verdict)
    return bool(spec.task.utility(model_output, pre, post_environment))


@dataclasses.dataclass(frozen=True, slots=True)
class EffectCheck:
    """What running the reference calls showed about `SIDE_EFFECTS` for one suite."""

    suite: str
    changed: frozenset[str]
    """Functions whose reference calls changed the environment at least once."""
    unlisted_changers: frozenset[str]
    """Changed the environment, but are not in the list (reads with a side effect)."""
    listed_unchanged: frozenset[str]
    """Listed and called by some task, but no reference call changed anything."""
    listed_uncalled: frozenset[str]
    """Listed but never in a reference call, so unverified here."""


def verify_side_effects(suite: Suite) -> EffectCheck:
    """Run each task's reference calls on a copy of its environment, one by one,
    and note which functions changed it (the environment dumped before and after)."""
    runtime = suite.runtime
    changed: set[str] = set()
    called: set[str] = set()
    for spec in suite.tasks:
        env = spec.fresh_environment()
        for call in spec.calls:
            called.add(call.function)
            before = env.model_dump()
            runtime.run_function(env, call.function, call.args)
            if env.model_dump() != before:
                changed.add(call.function)
    listed = suite.side_effects
    return EffectCheck(
        suite.name,
        frozenset(changed),
        frozenset(changed - listed),
        frozenset((listed & called) - changed),
        frozenset(listed - called),
    )
