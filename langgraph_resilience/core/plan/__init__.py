"""Replanning that can be verified: the `Plan` DAG, its references, its verifier.

When a tool is gone, a loop was detected or the budgets are spent, a planner
model proposes a new path as a `Plan`: a small DAG of tool calls, a
`Diagnosis` of why the old path failed and a rationale for why the new one
avoids it. `verify` checks the plan before anything runs, so a blind swap
("tool A failed, try B") or a disguised retry is rejected with reasons the
planner can act on. Everything here is pure: no I/O, no clock.

The rooms: `model` (the plan the planner answers with), `refs` (the ``$steps``
reference syntax and its resolution), `dag` (edges, cycles, layers, ready
steps, status), `verify` (the rules) and `request` (the planner's prompt).

>>> plan = Plan(
...     diagnosis=Diagnosis(failed_tool="get_weather", failure_class="structural",
...                         cause="get_weather returned 404: the endpoint was removed"),
...     rationale="geocode gives coordinates that weather_v2 accepts instead of a city",
...     steps=[PlanStep(id="geo", tool="geocode", args={"city": "Paris"}),
...            PlanStep(id="wx", tool="weather_v2", depends_on=["geo"],
...                     args={"lat": "$steps.geo.output.lat", "lon": "$steps.geo.output.lon"})],
... )
>>> verify(plan, known_tools={"geocode": None, "weather_v2": None},
...        structurally_failed=["get_weather"]).accepted
True
>>> execution_layers(plan)
[['geo'], ['wx']]
>>> resolve_args(plan.steps[1].args, {"geo": {"lat": 48.85, "lon": 2.35}})
{'lat': 48.85, 'lon': 2.35}
"""

from langgraph_resilience.core.plan.dag import (
    PlanCycleError,
    PlanStatus,
    effective_outputs,
    execution_layers,
    plan_status,
    ready_steps,
)
from langgraph_resilience.core.plan.model import (
    DEFAULT_MAX_STEPS,
    Diagnosis,
    Plan,
    PlanError,
    PlanStep,
)
from langgraph_resilience.core.plan.refs import (
    PlanReferenceError,
    ReferenceProblem,
    references,
    resolve_args,
)
from langgraph_resilience.core.plan.request import format_plan_request
from langgraph_resilience.core.plan.verify import (
    FILLER_WORDS,
    MIN_CONTENT_WORDS,
    ArgsSchema,
    PlanVerdict,
    RejectionCode,
    RejectionReason,
    content_words,
    verify,
)

__all__ = [
    "DEFAULT_MAX_STEPS",
    "FILLER_WORDS",
    "MIN_CONTENT_WORDS",
    "ArgsSchema",
    "Diagnosis",
    "Plan",
    "PlanCycleError",
    "PlanError",
    "PlanReferenceError",
    "PlanStatus",
    "PlanStep",
    "PlanVerdict",
    "ReferenceProblem",
    "RejectionCode",
    "RejectionReason",
    "content_words",
    "effective_outputs",
    "execution_layers",
    "format_plan_request",
    "plan_status",
    "ready_steps",
    "references",
    "resolve_args",
    "verify",
]
