"""Scheduling a plan: its "must finish before" edges, cycles, layers and ready steps.

A dependency runs before its dependent; a step before its fallback; and every
fallback that may stand in for a step before that step's dependents. An
executor runs the steps `ready_steps` returns, records which succeeded and which
failed, and asks again until `plan_status` is no longer ``running``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any, Literal, TypeAlias

from langgraph_resilience.core.plan.model import Plan, PlanError, PlanStep

__all__ = [
    "PlanCycleError",
    "PlanStatus",
    "effective_outputs",
    "execution_layers",
    "find_cycle",
    "order_edges",
    "plan_status",
    "ready_steps",
]

PlanStatus: TypeAlias = Literal["running", "completed", "failed"]
"""``running`` while a step is ready; ``completed`` when every step that is not a
fallback succeeded (itself or through its fallback); ``failed`` otherwise."""


class PlanCycleError(PlanError):
    """The plan's steps wait on each other; `cycle` lists one cycle, first id repeated."""

    def __init__(self, cycle: list[str]) -> None:
        super().__init__("plan steps form a cycle: " + " -> ".join(cycle))
        self.cycle = cycle


def _fallback_chain(start: str, fallbacks: Mapping[str, str]) -> list[str]:
    """The fallbacks that may stand in for `start`, in order (stops at a repeat)."""
    chain: list[str] = []
    seen = {start}
    current = fallbacks.get(start)
    while current is not None and current not in seen:
        chain.append(current)
        seen.add(current)
        current = fallbacks.get(current)
    return chain


def order_edges(plan: Plan) -> dict[str, list[str]]:
    """Edges "must finish before" between declared steps (first occurrence of an id).

    >>> from langgraph_resilience.core.plan import Diagnosis
    >>> p = Plan(diagnosis=Diagnosis(failed_tool="a", failure_class="structural", cause="x"),
    ...          rationale="r", steps=[PlanStep(id="a", tool="t", fallback="b"),
    ...          PlanStep(id="b", tool="u"), PlanStep(id="c", tool="v", depends_on=["a"])])
    >>> order_edges(p)
    {'a': ['b', 'c'], 'b': ['c'], 'c': []}
    """
    declared: dict[str, PlanStep] = {}
    for step in plan.steps:
        declared.setdefault(step.id, step)
    edges: dict[str, list[str]] = {sid: [] for sid in declared}
    fallbacks = {
        sid: step.fallback
        for sid, step in declared.items()
        if step.fallback is not None and step.fallback in declared
    }
    for sid, step in declared.items():
        for dep in step.depends_on:
            if dep in declared:
                edges[dep].append(sid)
                for stand_in in _fallback_chain(dep, fallbacks):
                    edges[stand_in].append(sid)
        if sid in fallbacks:
            edges[sid].append(fallbacks[sid])
    return edges


def find_cycle(edges: Mapping[str, Sequence[str]]) -> list[str] | None:
    """One cycle of the graph as ``[a, b, ..., a]``, or None (deterministic).

    >>> find_cycle({"a": ["b"], "b": ["a"]}), find_cycle({"a": ["b"], "b": []})
    (['a', 'b', 'a'], None)
    """
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    for root in edges:
        if root in state:
            continue
        path: list[str] = [root]
        cursors: list[Iterator[str]] = [iter(edges[root])]
        state[root] = 1
        while cursors:
            nxt = next(cursors[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                cursors.pop()
            elif state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                cursors.append(iter(edges[nxt]))
    return None


def _checked(plan: Plan) -> tuple[dict[str, PlanStep], dict[str, str]]:
    """The steps by id and each fallback's primary; raises if the plan cannot be scheduled."""
    by_id: dict[str, PlanStep] = {}
    for step in plan.steps:
        if step.id in by_id:
            raise PlanError(f"step id {step.id!r} is used twice; verify the plan first")
        by_id[step.id] = step
    primaries: dict[str, str] = {}
    for step in plan.steps:
        for ref in [*step.depends_on, *([step.fallback] if step.fallback else [])]:
            if ref not in by_id:
                raise PlanError(f"step {step.id!r} names unknown step {ref!r}; verify first")
        if step.fallback is not None:
            if step.fallback in primaries:
                raise PlanError(f"step {step.fallback!r} is a shared fallback; verify first")
            primaries[step.fallback] = step.id
    cycle = find_cycle(order_edges(plan))
    if cycle is not None:
        raise PlanCycleError(cycle)
    return by_id, primaries


def execution_layers(plan: Plan) -> list[list[str]]:
    """Group step ids into layers; a layer's steps are independent of each other.

    Layer n holds the steps whose predecessors all sit in earlier layers, in
    plan order, so an executor may run one layer per super-step. A fallback sits
    after its step and runs only if that step failed (`ready_steps` decides).
    Raises `PlanCycleError` for a cyclic plan.

    >>> from langgraph_resilience.core.plan import Diagnosis
    >>> p = Plan(diagnosis=Diagnosis(failed_tool="a", failure_class="structural", cause="x"),
    ...          rationale="r", steps=[PlanStep(id="a", tool="t"), PlanStep(id="b", tool="u"),
    ...          PlanStep(id="c", tool="v", depends_on=["a", "b"])])
    >>> execution_layers(p)
    [['a', 'b'], ['c']]
    """
    _checked(plan)
    edges = order_edges(plan)
    level: dict[str, int] = {}
    pending = dict.fromkeys(edges, 0)
    for targets in edges.values():
        for target in targets:
            pending[target] += 1
    frontier = [sid for sid, count in pending.items() if count == 0]
    for sid in frontier:
        level[sid] = 0
    while frontier:
        following: list[str] = []
        for sid in frontier:
            for target in edges[sid]:
                level[target] = max(level.get(target, 0), level[sid] + 1)
                pending[target] -= 1
                if pending[target] == 0:
                    following.append(target)
        frontier = following
    layers: list[list[str]] = [[] for _ in range(max(level.values(), default=-1) + 1)]
    for step in plan.steps:
        layers[level[step.id]].append(step.id)
    return layers


def _satisfied(
    step_id: str, by_id: Mapping[str, PlanStep], done: Collection[str], failed: Collection[str]
) -> bool:
    """True if the step succeeded, or failed and a fallback in its chain succeeded."""
    current: str | None = step_id
    while current is not None:
        if current in done:
            return True
        if current not in failed:
            return False
        current = by_id[current].fallback
    return False


def ready_steps(plan: Plan, done: Collection[str], failed: Collection[str]) -> list[PlanStep]:
    """The steps that may run now, in plan order.

    A step is ready when it has not run, each dependency succeeded (itself or
    through its fallback) and, for a fallback, the step it stands in for
    failed. A dependent of a failed step without a successful fallback never
    becomes ready.

    >>> from langgraph_resilience.core.plan import Diagnosis
    >>> p = Plan(diagnosis=Diagnosis(failed_tool="a", failure_class="structural", cause="x"),
    ...          rationale="r", steps=[PlanStep(id="a", tool="t", fallback="b"),
    ...          PlanStep(id="b", tool="u"), PlanStep(id="c", tool="v", depends_on=["a"])])
    >>> [s.id for s in ready_steps(p, done=[], failed=["a"])]
    ['b']
    >>> [s.id for s in ready_steps(p, done=["b"], failed=["a"])]
    ['c']
    """
    by_id, primaries = _checked(plan)
    ready: list[PlanStep] = []
    for step in plan.steps:
        if step.id in done or step.id in failed:
            continue
        if step.id in primaries and primaries[step.id] not in failed:
            continue
        if all(_satisfied(dep, by_id, done, failed) for dep in step.depends_on):
            ready.append(step)
    return ready


def effective_outputs(
    plan: Plan, outputs: Mapping[str, Any], failed: Collection[str]
) -> dict[str, Any]:
    """Each satisfied step's output, a failed step's taken from the fallback that succeeded.

    `outputs` holds the outputs of the steps that succeeded. Pass the result to
    `resolve_args`, so ``$steps.<id>.output`` works whichever path served `<id>`.

    >>> from langgraph_resilience.core.plan import Diagnosis
    >>> p = Plan(diagnosis=Diagnosis(failed_tool="a", failure_class="structural", cause="x"),
    ...          rationale="r", steps=[PlanStep(id="a", tool="t", fallback="b"),
    ...          PlanStep(id="b", tool="u")])
    >>> effective_outputs(p, {"b": 42}, failed=["a"])
    {'a': 42, 'b': 42}
    """
    by_id, _ = _checked(plan)
    result: dict[str, Any] = {}
    for step in plan.steps:
        current: str | None = step.id
        while current is not None and current not in outputs and current in failed:
            current = by_id[current].fallback
        if current is not None and current in outputs:
            result[step.id] = outputs[current]
    return result


def plan_status(plan: Plan, done: Collection[str], failed: Collection[str]) -> PlanStatus:
    """Whether the plan is still running, completed or failed (see `PlanStatus`).

    >>> from langgraph_resilience.core.plan import Diagnosis
    >>> p = Plan(diagnosis=Diagnosis(failed_tool="a", failure_class="structural", cause="x"),
    ...          rationale="r", steps=[PlanStep(id="a", tool="t")])
    >>> plan_status(p, [], []), plan_status(p, ["a"], []), plan_status(p, [], ["a"])
    ('running', 'completed', 'failed')
    """
    by_id, primaries = _checked(plan)
    if ready_steps(plan, done, failed):
        return "running"
    primary_ids = [sid for sid in by_id if sid not in primaries]
    if all(_satisfied(sid, by_id, done, failed) for sid in primary_ids):
        return "completed"
    return "failed"
