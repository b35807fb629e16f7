"""Verified replanning: a planner that proposes a DAG of tool calls, the check that
rejects a plan before it runs, and the node that executes it step by step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from langgraph_resilience._lazy import lazy_exports as _lazy_exports

if TYPE_CHECKING:
    from langgraph_resilience._graph.planner import (
        PlanExecutorNode,
        PlannerNode,
        route_after_executor,
    )
    from langgraph_resilience.core.plan import (
        Diagnosis,
        Plan,
        PlanStep,
        PlanVerdict,
        verify,
    )

_HOMES: dict[str, str] = {
    "Diagnosis": "langgraph_resilience.core.plan",
    "Plan": "langgraph_resilience.core.plan",
    "PlanStep": "langgraph_resilience.core.plan",
    "PlanVerdict": "langgraph_resilience.core.plan",
    "verify": "langgraph_resilience.core.plan",
    "PlanExecutorNode": "langgraph_resilience._graph.planner",
    "PlannerNode": "langgraph_resilience._graph.planner",
    "route_after_executor": "langgraph_resilience._graph.planner",
}
"""Where each public name lives: imported from there on first use."""

__all__ = [
    "Diagnosis",
    "Plan",
    "PlanExecutorNode",
    "PlanStep",
    "PlanVerdict",
    "PlannerNode",
    "route_after_executor",
    "verify",
]

__getattr__, __dir__ = _lazy_exports(__name__, _HOMES)
