"""Replanning that can be verified: the `Plan` DAG, its references, its verifier.

When a tool is gone, a loop was detected or the budgets are spent, a planner
model proposes a new path as a `Plan`: a small DAG of tool calls, a
`Diagnosis` of why the old path failed and a rationale for why the new one
avoids it. `verify` checks the plan before anything runs, so a blind swap
("tool A failed, try B") or a disguised retry is rejected with reasons the
planner can act on. Everything in this module is pure: no I/O, no clock.

Reference syntax
----------------
A step's ``args`` may use the outputs of the steps it depends on. Nothing is
ever evaluated: a reference is a path of dict keys and list indices, looked up
with ``[]`` only (never ``getattr``), and substituted once (a substituted value
is data, so a tool output containing ``$steps...`` is never resolved again).

- **Whole value**: a string that is *exactly* ``$steps.<id>.output`` or
  ``$steps.<id>.output.<seg>.<seg>...`` is replaced by that value, of any JSON
  type. A segment is ``[A-Za-z0-9_-]+``; on a list, an all-digit segment is an
  index; on a dict, every segment is a key.
- **Interpolation**: inside a longer string, ``{$steps.<id>.output.<seg>...}``
  is replaced by the value's text: a string as is, anything else as compact
  JSON (``true``, ``null``, ``[1,2]``).
- Step ids are ``[A-Za-z0-9_-]{1,64}``. Any other occurrence of ``$steps.`` in a
  string is a malformed reference: `verify` rejects it and `resolve_args`
  raises. Keys that contain other characters (dots, spaces) are not addressable.
- A step must list in ``depends_on`` every step it references. When a step
  failed and its fallback succeeded, `effective_outputs` lets the fallback's
  output stand in for it.

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

from __future__ import annotations

import copy
import json
import re
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal, TypeAlias

from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from langgraph_resilience.core.canonical import DEFAULT_NOISE_FIELDS, call_key
from langgraph_resilience.core.redaction import mask_args, redact, redact_value
from langgraph_resilience.errors import (
    ConfigurationError,
    FailureClass,
    ResilienceError,
    ToolError,
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

DEFAULT_MAX_STEPS = 8
"""Steps a plan may have by default: replanning finds a path, not a program."""


# ------------------------------------------------------------------ the plan model
# The docstrings and field descriptions below are sent to the planner model as the
# schema of its answer (`with_structured_output(Plan)`), so they address it.


class PlanStep(BaseModel):
    """One tool call of the plan."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(description="Unique step id: letters, digits, '_' or '-' (e.g. 'geo').")
    tool: str = Field(description="Name of one of the available tools.")
    args: dict[str, Any] = Field(
        default_factory=dict,
        description="The tool's arguments as a JSON object. A value that is exactly "
        "'$steps.<id>.output' or '$steps.<id>.output.<key>.<index>' is replaced by that "
        "step's output (or part of it); '{$steps.<id>.output.<key>}' inside a longer "
        "string is replaced by its text.",
    )
    depends_on: list[str] = Field(
        default_factory=list,
        description="Ids of the steps that must succeed before this one; must include "
        "every step whose output the args reference.",
    )
    fallback: str | None = Field(
        default=None,
        description="Id of another step that runs only if this one fails; its output "
        "then stands in for this step's output.",
    )


class Diagnosis(BaseModel):
    """Why the old path failed: the failed tool, its failure class and the evidence."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    failed_tool: str = Field(description="Name of the tool that failed.")
    failure_class: FailureClass = Field(
        description="The failure class reported in that tool's error."
    )
    cause: str = Field(
        description="The concrete cause, from the error: status, message, missing "
        "field, removed endpoint. Not 'something went wrong'."
    )

    @field_validator("failure_class", mode="before")
    @classmethod
    def _lowercase_class(cls, value: Any) -> Any:
        # Models often answer "STRUCTURAL"; the enum values are lowercase.
        return value.strip().lower() if isinstance(value, str) else value


class Plan(BaseModel):
    """A new path to the user's goal that avoids the failure: a small DAG of tool calls."""

    # Diagnosis and rationale come before the steps so a model writing the fields
    # in order reasons about the failure before choosing the calls.
    model_config = ConfigDict(frozen=True, extra="forbid")

    diagnosis: Diagnosis
    rationale: str = Field(
        description="Why the new steps avoid the failure, naming the tools they use."
    )
    steps: list[PlanStep] = Field(description="The tool calls, each with a unique id.")


# -------------------------------------------------------------------- references

_STEP_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_REF = r"\$steps\.(?P<id>[A-Za-z0-9_-]{1,64})\.output(?P<path>(?:\.[A-Za-z0-9_-]+)*)"
_WHOLE_REF = re.compile(_REF)
_EMBEDDED_REF = re.compile(r"\{" + _REF + r"\}")
_MARKER = "$steps."

ReferenceProblem: TypeAlias = Literal[
    "missing_step", "missing_key", "missing_index", "not_traversable", "not_json", "malformed"
]
"""Why a reference did not resolve (`PlanReferenceError.problem`)."""


class PlanError(ResilienceError):
    """A plan cannot be scheduled or executed as written (verify it first)."""


class PlanReferenceError(PlanError):
    """A ``$steps`` reference cannot be resolved: no such step output, key or index.

    `reference` is the reference text (the whole string when malformed),
    `step_id` the step it names and `problem` the `ReferenceProblem`, so the
    executor can report a precise failure instead of calling a tool with junk.
    """

    def __init__(self, reference: str, step_id: str | None, problem: ReferenceProblem) -> None:
        super().__init__(f"cannot resolve {reference!r}: {problem.replace('_', ' ')}")
        self.reference = reference
        self.step_id = step_id
        self.problem = problem


class PlanCycleError(PlanError):
    """The plan's steps wait on each other; `cycle` lists one cycle, first id repeated."""

    def __init__(self, cycle: list[str]) -> None:
        super().__init__("plan steps form a cycle: " + " -> ".join(cycle))
        self.cycle = cycle


def _strings(value: Any) -> Iterator[str]:
    """Every string value inside `value`, at any depth (dict keys are not values)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)


def _is_malformed(text: str) -> bool:
    """True if `text` mentions ``$steps.`` outside a well-formed reference."""
    if _MARKER not in text or _WHOLE_REF.fullmatch(text):
        return False
    return _MARKER in _EMBEDDED_REF.sub("", text)


def _refs_in(text: str) -> set[str]:
    whole = _WHOLE_REF.fullmatch(text)
    if whole:
        return {whole["id"]}
    return {match["id"] for match in _EMBEDDED_REF.finditer(text)}


def references(args: Mapping[str, Any]) -> set[str]:
    """The step ids that `args` reference, at any depth, whole or interpolated.

    The verifier checks them against the step's ``depends_on``.

    >>> sorted(references({"lat": "$steps.geo.output.lat", "q": "near {$steps.poi.output}"}))
    ['geo', 'poi']
    """
    found: set[str] = set()
    for text in _strings(args):
        if _MARKER in text:
            found |= _refs_in(text)
    return found


def _lookup(match: re.Match[str], outputs: Mapping[str, Any]) -> Any:
    step_id = match["id"]
    if step_id not in outputs:
        raise PlanReferenceError(match[0], step_id, "missing_step")
    value = outputs[step_id]
    for segment in match["path"].split(".")[1:]:
        if isinstance(value, Mapping):
            if segment not in value:
                raise PlanReferenceError(match[0], step_id, "missing_key")
            value = value[segment]
        elif isinstance(value, list | tuple):
            if not segment.isdigit() or int(segment) >= len(value):
                raise PlanReferenceError(match[0], step_id, "missing_index")
            value = value[int(segment)]
        else:
            raise PlanReferenceError(match[0], step_id, "not_traversable")
    return value


def _as_text(value: Any, reference: str, step_id: str) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        raise PlanReferenceError(reference, step_id, "not_json") from None


def _resolve(value: Any, outputs: Mapping[str, Any]) -> Any:
    if isinstance(value, str):
        if _MARKER not in value:
            return value
        whole = _WHOLE_REF.fullmatch(value)
        if whole:
            return copy.deepcopy(_lookup(whole, outputs))
        if _is_malformed(value):
            raise PlanReferenceError(value, None, "malformed")
        return _EMBEDDED_REF.sub(lambda m: _as_text(_lookup(m, outputs), m[0], m["id"]), value)
    if isinstance(value, Mapping):
        return {key: _resolve(item, outputs) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_resolve(item, outputs) for item in value]
    return value


def resolve_args(args: Mapping[str, Any], outputs: Mapping[str, Any]) -> dict[str, Any]:
    """Return `args` with every ``$steps`` reference replaced by the output it names.

    `outputs` maps step ids to outputs (see `effective_outputs` for fallbacks).
    Raises `PlanReferenceError` for a missing step, key or index, or a
    malformed reference; never evaluates anything.

    >>> resolve_args({"id": "$steps.s.output.items.0.id", "q": "id={$steps.s.output.n}"},
    ...              {"s": {"items": [{"id": "a1"}], "n": 2}})
    {'id': 'a1', 'q': 'id=2'}
    """
    return {key: _resolve(value, outputs) for key, value in args.items()}


# -------------------------------------------------------------------- the verifier

RejectionCode: TypeAlias = Literal[
    "empty_plan",
    "too_many_steps",
    "invalid_step_id",
    "duplicate_step_id",
    "unknown_tool",
    "breaker_open",
    "structurally_failed_tool",
    "repeated_failed_call",
    "repeated_side_effect",
    "duplicate_call",
    "unknown_dependency",
    "unknown_fallback",
    "shared_fallback",
    "depends_on_fallback",
    "malformed_reference",
    "unknown_reference",
    "undeclared_reference",
    "cycle",
    "invalid_args",
    "empty_diagnosis",
    "vague_diagnosis",
    "diagnosis_wrong_tool",
    "diagnosis_wrong_class",
    "empty_rationale",
    "vague_rationale",
    "rationale_names_no_plan_tool",
]
"""Why `verify` rejects a plan; one code per rule, stable for events and tests."""

ArgsSchema: TypeAlias = type[BaseModel] | Mapping[str, Any]
"""A tool's argument schema: a pydantic model (``tool.tool_call_schema``, which
leaves out injected arguments) or a JSON schema dict (e.g. an MCP tool's)."""


class RejectionReason(BaseModel):
    """One broken rule: a machine-readable `code` and a message the planner can act on."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    code: RejectionCode
    message: str
    step: str | None = None
    """The step at fault, when there is one."""


class PlanVerdict(BaseModel):
    """The verifier's answer: accepted when there is no reason to reject.

    Named apart from `classify.Verdict`, which judges exceptions. JSON-ready, so
    events and the ledger can carry it.

    >>> PlanVerdict(reasons=()).accepted
    True
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    reasons: tuple[RejectionReason, ...] = ()

    @property
    def accepted(self) -> bool:
        """True if the plan broke no rule."""
        return not self.reasons

    @property
    def codes(self) -> frozenset[str]:
        """The codes of every broken rule."""
        return frozenset(reason.code for reason in self.reasons)


MIN_CONTENT_WORDS = 3
"""Content words a diagnosis cause and a rationale need to count as specific."""

_FUNCTION_WORDS = """
    a an the this that these those it its it's i we you they he she me us our my your
    is are was were be been being am do does did done has have had will would should
    could can may might must shall to of in on at for with by from into about as and
    or but so then than there here some any very also just not no now again because
    due maybe probably likely seems seem seemed let let's
"""
_FAILING_WITHOUT_EVIDENCE = """
    tool tools call calls called calling fail fails failed failing failure failures
    error errors errored issue issues problem problems something went wrong try tried
    trying retry retried retrying work works worked working didn't doesn't don't isn't
    wasn't can't cannot won't unknown unexpected occurred happened bad broken
"""
_REPLANNING_WITHOUT_SAYING_HOW = """
    use using used plan step steps new path instead different another other approach
    alternative way better option
"""
FILLER_WORDS: frozenset[str] = frozenset(
    (_FUNCTION_WORDS + _FAILING_WITHOUT_EVIDENCE + _REPLANNING_WITHOUT_SAYING_HOW).split()
)
"""Words that carry no evidence. A text's *content words* are its other words."""

_APOSTROPHES = "'\u2019"
_WORD = re.compile(r"\w+(?:[" + _APOSTROPHES + r"]\w+)*")


def content_words(text: str) -> list[str]:
    """The words of `text` that carry information: lowercase, minus `FILLER_WORDS`.

    A diagnosis cause or rationale is *vague* when it has fewer than
    `MIN_CONTENT_WORDS` of them.

    >>> content_words("Something went wrong, try again")
    []
    >>> content_words("get_weather returned 404: endpoint removed")
    ['get_weather', 'returned', '404', 'endpoint', 'removed']
    """
    words = (w.replace("\u2019", "'") for w in _WORD.findall(text.lower()))
    return [w for w in words if w not in FILLER_WORDS]


def _names(text: str, tool: str) -> bool:
    """True if `tool` appears in `text` as a whole name (case-insensitive)."""
    pattern = r"(?<![\w-])" + re.escape(tool) + r"(?![\w-])"
    return re.search(pattern, text, re.IGNORECASE) is not None


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


def _order_edges(plan: Plan) -> dict[str, list[str]]:
    """Edges "must finish before" between declared steps (first occurrence of an id).

    A dependency runs before its dependent; a step before its fallback; and every
    fallback that may stand in for a step before that step's dependents.
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


def _find_cycle(edges: Mapping[str, Sequence[str]]) -> list[str] | None:
    """One cycle of the graph as ``[a, b, ..., a]``, or None (deterministic)."""
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


_JSON_TYPES: Mapping[str, type | tuple[type, ...]] = {
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "array": (list, tuple),
    "object": Mapping,
    "null": type(None),
}


def _json_type_ok(value: Any, expected: Any) -> bool:
    names = expected if isinstance(expected, list) else [expected]
    for name in names:
        kind = _JSON_TYPES.get(name) if isinstance(name, str) else None
        if kind is None:
            return True  # a type we do not know: do not judge
        if isinstance(value, bool) and name in {"integer", "number"}:
            continue
        if isinstance(value, kind):
            return True
    return False


def _args_problems(args: Mapping[str, Any], schema: ArgsSchema) -> list[str]:
    """Why `args` break `schema`, ignoring top-level fields that hold a reference."""
    skipped = {key for key, value in args.items() if any(_MARKER in t for t in _strings(value))}
    problems: list[str] = []
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        try:
            schema.model_validate(dict(args))
        except ValidationError as exc:
            for error in exc.errors(include_url=False, include_input=False):
                loc = error["loc"]
                if (loc and loc[0] in skipped) or (not loc and skipped):
                    continue
                where = ".".join(str(part) for part in loc) or "args"
                problems.append(f"{where}: {error['msg']}")
        return problems
    properties = schema.get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    problems += [
        f"{name}: Field required" for name in schema.get("required") or () if name not in args
    ]
    if schema.get("additionalProperties") is False:
        problems += [
            f"{name}: Extra inputs are not permitted"
            for name in args
            if name not in properties and name not in skipped
        ]
    for name, value in args.items():
        spec = properties.get(name)
        if name in skipped or not isinstance(spec, Mapping) or "type" not in spec:
            continue
        if not _json_type_ok(value, spec["type"]):
            problems.append(f"{name}: Input should be of type {spec['type']}")
    return problems


def _tool_of_key(key: str) -> str:
    # `call_key` is "<tool>:<digest>"; the digest never contains ":".
    return key.rpartition(":")[0]


def _reason(code: RejectionCode, message: str, step: str | None = None) -> RejectionReason:
    return RejectionReason(code=code, message=message, step=step)


def _check_structure(plan: Plan, max_steps: int) -> Iterator[RejectionReason]:
    """Steps, ids, dependencies, fallbacks and cycles."""
    steps = plan.steps
    if not steps:
        yield _reason("empty_plan", "The plan has no steps; give at least one tool call.")
    if len(steps) > max_steps:
        yield _reason(
            "too_many_steps", f"The plan has {len(steps)} steps; the limit is {max_steps}."
        )
    declared: set[str] = set()
    for step in steps:
        if not _STEP_ID.fullmatch(step.id):
            yield _reason(
                "invalid_step_id",
                f"Step id {step.id!r} must be 1-64 letters, digits, '_' or '-'.",
                step.id,
            )
        if step.id in declared:
            yield _reason("duplicate_step_id", f"Step id {step.id!r} is used twice.", step.id)
        declared.add(step.id)
    primaries: dict[str, str] = {}
    for step in steps:
        for dep in step.depends_on:
            if dep not in declared:
                yield _reason(
                    "unknown_dependency",
                    f"Step {step.id!r} depends on {dep!r}, which is not a step of the plan.",
                    step.id,
                )
        if step.fallback is None:
            continue
        if step.fallback not in declared:
            yield _reason(
                "unknown_fallback",
                f"Step {step.id!r} falls back to {step.fallback!r}, "
                "which is not a step of the plan.",
                step.id,
            )
        elif step.fallback in primaries:
            yield _reason(
                "shared_fallback",
                f"Step {step.fallback!r} is the fallback of both {primaries[step.fallback]!r} "
                f"and {step.id!r}; give each step its own fallback.",
                step.id,
            )
        else:
            primaries[step.fallback] = step.id
    for step in steps:
        for dep in step.depends_on:
            if dep in primaries and primaries[dep] not in {step.id, dep}:  # self: a cycle
                yield _reason(
                    "depends_on_fallback",
                    f"Step {step.id!r} depends on {dep!r}, which only runs if "
                    f"{primaries[dep]!r} fails; depend on {primaries[dep]!r} instead "
                    "(its fallback's output stands in for it).",
                    step.id,
                )
    cycle = _find_cycle(_order_edges(plan))
    if cycle is not None:
        note = ""
        if any(step.fallback is not None for step in steps if step.id in cycle):
            note = " (a fallback runs after its step, and the step's dependents wait for it)"
        yield _reason("cycle", "Steps wait on each other: " + " -> ".join(cycle) + note, cycle[0])


def _check_calls(
    plan: Plan,
    *,
    known_tools: Mapping[str, ArgsSchema | None],
    open_breakers: Collection[str],
    structural: Collection[str],
    failed_keys: Collection[str],
    done_effects: Collection[str],
    noise: frozenset[str],
) -> Iterator[RejectionReason]:
    """Tools, repeated calls, references and arguments, step by step."""
    declared = {step.id for step in plan.steps}
    seen_calls: dict[str, str] = {}
    for step in plan.steps:
        sid, tool = step.id, step.tool
        if tool not in known_tools:
            yield _reason(
                "unknown_tool", f"Step {sid!r} uses {tool!r}, which is not an available tool.", sid
            )
        if tool in open_breakers:
            yield _reason(
                "breaker_open", f"Step {sid!r} uses {tool!r}, whose circuit breaker is open.", sid
            )
        if tool in structural:
            yield _reason(
                "structurally_failed_tool",
                f"Step {sid!r} uses {tool!r}, which failed structurally in this thread "
                "(missing, removed or contract changed).",
                sid,
            )
        key = call_key(tool, step.args, noise_fields=noise)
        if key in failed_keys:
            yield _reason(
                "repeated_failed_call",
                f"Step {sid!r} repeats a call to {tool!r} that already failed with the same "
                "arguments; change the tool or the arguments.",
                sid,
            )
        if key in done_effects:
            yield _reason(
                "repeated_side_effect",
                f"Step {sid!r} repeats a side effect of {tool!r} that already succeeded in "
                "this thread with the same arguments; it would happen twice. Use its result "
                "instead.",
                sid,
            )
        if key in seen_calls:
            yield _reason(
                "duplicate_call",
                f"Step {sid!r} makes the same call as step {seen_calls[key]!r}.",
                sid,
            )
        seen_calls.setdefault(key, sid)
        for text in sorted({text for text in _strings(step.args) if _is_malformed(text)}):
            yield _reason(
                "malformed_reference",
                f"Step {sid!r} has a malformed reference in {text!r}; write "
                "'$steps.<id>.output[.<key>...]' as the whole value or "
                "'{$steps.<id>.output[.<key>...]}' inside a string.",
                sid,
            )
        for ref in sorted(references(step.args)):
            if ref not in declared:
                yield _reason(
                    "unknown_reference",
                    f"Step {sid!r} references step {ref!r}, which is not in the plan.",
                    sid,
                )
            elif ref not in step.depends_on:
                yield _reason(
                    "undeclared_reference",
                    f"Step {sid!r} references step {ref!r} without listing it in depends_on.",
                    sid,
                )
        schema = known_tools.get(tool)
        if schema is not None:
            for problem in _args_problems(step.args, schema):
                yield _reason(
                    "invalid_args",
                    f"Step {sid!r}: arguments of {tool!r} are invalid: {problem}.",
                    sid,
                )


def _check_explanation(
    plan: Plan, failed_tools: Mapping[str, Collection[FailureClass]]
) -> Iterator[RejectionReason]:
    """The diagnosis names a real failure with evidence; the rationale names the new tools."""
    diagnosis = plan.diagnosis
    named = diagnosis.failed_tool.strip()
    if not named or not diagnosis.cause.strip():
        yield _reason(
            "empty_diagnosis", "The diagnosis must name the tool that failed and state the cause."
        )
    elif len(content_words(diagnosis.cause)) < MIN_CONTENT_WORDS:
        yield _reason(
            "vague_diagnosis",
            f"The diagnosis cause {diagnosis.cause!r} is not specific: give the evidence "
            f"(status, message, missing field) in at least {MIN_CONTENT_WORDS} "
            "informative words.",
        )
    if named and failed_tools:
        if named not in failed_tools:
            yield _reason(
                "diagnosis_wrong_tool",
                f"The diagnosis names {named!r}, but the failed tools are {sorted(failed_tools)}.",
            )
        elif failed_tools[named] and diagnosis.failure_class not in failed_tools[named]:
            classes = sorted(c.value for c in failed_tools[named])
            yield _reason(
                "diagnosis_wrong_class",
                f"The diagnosis says {named!r} failed as {str(diagnosis.failure_class)!r}, "
                f"but it failed as {classes}.",
            )
    rationale = plan.rationale
    if not rationale.strip():
        yield _reason(
            "empty_rationale", "The rationale must say why the new steps avoid the failure."
        )
        return
    if len(content_words(rationale)) < MIN_CONTENT_WORDS:
        yield _reason(
            "vague_rationale",
            f"The rationale {rationale!r} is not specific: say how the new steps avoid the "
            f"failure in at least {MIN_CONTENT_WORDS} informative words.",
        )
    plan_tools = sorted({step.tool for step in plan.steps if step.tool})
    if not any(_names(rationale, tool) for tool in plan_tools):
        yield _reason(
            "rationale_names_no_plan_tool",
            f"The rationale must name the tools the plan uses ({plan_tools}).",
        )


def verify(
    plan: Plan,
    *,
    known_tools: Mapping[str, ArgsSchema | None],
    open_breakers: Collection[str] = (),
    structurally_failed: Collection[str] = (),
    failed_calls: Collection[str] = (),
    failures: Sequence[ToolError] = (),
    max_steps: int = DEFAULT_MAX_STEPS,
    noise_fields: Iterable[str] = DEFAULT_NOISE_FIELDS,
    done_effects: Collection[str] = (),
) -> PlanVerdict:
    """Check a plan before anything runs; every broken rule becomes one reason.

    `known_tools` maps each available tool to its args schema (or None to skip
    the check). `failed_calls` are `call_key`\\s of calls that failed in this
    thread, compared with each step's key *before* references are resolved
    (pass the policy's `noise_fields`); `done_effects` are `call_key`\\s of side
    effects that already succeeded in this thread. `failures` are the thread's envelopes:
    a STRUCTURAL one counts as `structurally_failed`, and they say which
    (tool, class) the diagnosis must name.

    The rules, by code:

    - structure: ``empty_plan``, ``too_many_steps`` (> `max_steps`),
      ``invalid_step_id``, ``duplicate_step_id``, ``unknown_dependency``,
      ``unknown_fallback``, ``shared_fallback`` (a step is the fallback of two),
      ``depends_on_fallback`` (depend on the step it stands in for instead),
      ``cycle`` (through ``depends_on`` and fallback edges);
    - tools and calls: ``unknown_tool``, ``breaker_open``,
      ``structurally_failed_tool``, ``repeated_failed_call``,
      ``repeated_side_effect`` (a side effect this thread already did: a plan step
      has a new call id, so a new idempotency key, and would do it again), ``duplicate_call``
      (two steps with the same tool and canonical args, e.g. a fallback that
      retries its step), ``invalid_args`` (against the schema, skipping
      top-level fields that contain a reference);
    - references: ``malformed_reference``, ``unknown_reference``,
      ``undeclared_reference`` (not listed in ``depends_on``);
    - explanation: ``empty_diagnosis`` (blank tool or cause), ``vague_diagnosis``
      (cause with fewer than `MIN_CONTENT_WORDS` `content_words`),
      ``diagnosis_wrong_tool`` / ``diagnosis_wrong_class`` (not a tool that
      failed in this thread, or not a class it failed with; checked when the
      failures are known), ``empty_rationale``, ``vague_rationale`` (fewer than
      `MIN_CONTENT_WORDS` content words), ``rationale_names_no_plan_tool``.

    >>> bad = Plan(diagnosis=Diagnosis(failed_tool="", failure_class="unknown", cause=""),
    ...            rationale="try again", steps=[])
    >>> sorted(verify(bad, known_tools={}).codes)
    ['empty_diagnosis', 'empty_plan', 'rationale_names_no_plan_tool', 'vague_rationale']
    """
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise ConfigurationError(f"max_steps must be an integer >= 1, got {max_steps!r}")
    structural = set(structurally_failed) | {
        e.tool for e in failures if e.tool and e.failure_class is FailureClass.STRUCTURAL
    }
    failed_keys = frozenset(failed_calls)
    failed_tools: dict[str, set[FailureClass]] = {}
    for error in failures:
        if error.tool:
            failed_tools.setdefault(error.tool, set()).add(error.failure_class)
    for tool in structural:
        failed_tools.setdefault(tool, set()).add(FailureClass.STRUCTURAL)
    for key in failed_keys:
        if _tool_of_key(key):
            failed_tools.setdefault(_tool_of_key(key), set())
    reasons = [
        *_check_structure(plan, max_steps),
        *_check_calls(
            plan,
            known_tools=known_tools,
            open_breakers=open_breakers,
            structural=structural,
            failed_keys=failed_keys,
            done_effects=frozenset(done_effects),
            noise=frozenset(noise_fields),
        ),
        *_check_explanation(plan, failed_tools),
    ]
    return PlanVerdict(reasons=tuple(reasons))


# -------------------------------------------------------------------- scheduling

PlanStatus: TypeAlias = Literal["running", "completed", "failed"]
"""``running`` while a step is ready; ``completed`` when every step that is not a
fallback succeeded (itself or through its fallback); ``failed`` otherwise."""


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
    cycle = _find_cycle(_order_edges(plan))
    if cycle is not None:
        raise PlanCycleError(cycle)
    return by_id, primaries


def execution_layers(plan: Plan) -> list[list[str]]:
    """Group step ids into layers; a layer's steps are independent of each other.

    Layer n holds the steps whose predecessors all sit in earlier layers, in
    plan order, so an executor may run one layer per super-step. A fallback sits
    after its step and runs only if that step failed (`ready_steps` decides).
    Raises `PlanCycleError` for a cyclic plan.

    >>> p = Plan(diagnosis=Diagnosis(failed_tool="a", failure_class="structural", cause="x"),
    ...          rationale="r", steps=[PlanStep(id="a", tool="t"), PlanStep(id="b", tool="u"),
    ...          PlanStep(id="c", tool="v", depends_on=["a", "b"])])
    >>> execution_layers(p)
    [['a', 'b'], ['c']]
    """
    _checked(plan)
    edges = _order_edges(plan)
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


# ----------------------------------------------------------------- planner request

_PLANNER_SYSTEM = """\
You repair a tool-calling agent's task after a tool failure. Answer with a Plan: a \
small DAG of tool calls that reaches the user's goal by a path that avoids the failure, \
a diagnosis of why the old path failed and a rationale for why the new one avoids it.

A verifier rejects any plan that breaks one of these rules:
1. diagnosis.failed_tool is a tool that failed, diagnosis.failure_class the class its \
error reports, and diagnosis.cause the concrete evidence (status, message, missing \
field, removed endpoint) in at least {min_words} informative words. "Something went \
wrong" or "try again" is not a cause.
2. The rationale says why the new steps avoid the failure, names the tools they use and \
has at least {min_words} informative words.
3. Use only tools listed as available. Never a tool marked unavailable (breaker open or \
failed structurally), never a failed call again with the same arguments.
4. At most {max_steps} steps; unique step ids of letters, digits, '_' or '-'; no cycles; \
no two steps with the same tool and arguments.
5. To pass an earlier step's output, make an argument value exactly \
"$steps.<id>.output", or "$steps.<id>.output.<key>" (keys and list indices separated by \
dots), or write "{{$steps.<id>.output.<key>}}" inside a longer string. List every \
referenced step in depends_on. Nothing else is evaluated.
6. fallback names a step that runs only if this step fails; its output then stands in \
for this step's. A step is the fallback of at most one step, and no step lists a \
fallback step in depends_on (depend on the step it stands in for).
7. Arguments must match the tool's parameters schema.\
"""


def _tool_spec(tool: BaseTool | Mapping[str, Any] | type[BaseModel]) -> dict[str, Any]:
    spec = convert_to_openai_tool(tool)
    function = spec.get("function", spec)
    return {
        "name": function.get("name"),
        "description": function.get("description", ""),
        "parameters": function.get("parameters", {}),
    }


def _json_block(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, indent=2, sort_keys=True, default=str)
    return f"```json\n{text}\n```"


def format_plan_request(
    *,
    goal: str,
    failures: Sequence[ToolError],
    tools: Sequence[BaseTool | Mapping[str, Any] | type[BaseModel]],
    breaker_states: Mapping[str, str] | None = None,
    structurally_failed: Collection[str] = (),
    rejected: PlanVerdict | None = None,
    rejected_plan: Plan | None = None,
    max_steps: int = DEFAULT_MAX_STEPS,
    arguments: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[BaseMessage]:
    """Build the planner's prompt: a `SystemMessage` with the rules, a `HumanMessage` with
    the goal, the failures, the tools and the previous rejection.

    `goal` is the conversation as text (shown redacted), `failures` the (already
    redacted) envelopes, shown as JSON and redacted again. `arguments` maps a failed
    call's id to the arguments it failed with, shown next to its envelope through
    `mask_args` (secret-named fields at any depth ``[REDACTED]``, strings scrubbed), so
    the planner knows what not to repeat and which values a new path needs; the
    rejected plan's arguments and the verifier's reasons are shown the same way.
    `tools` are anything
    `convert_to_openai_tool` accepts; `breaker_states` maps a tool to
    ``closed``/``open``/``half_open``. A tool with an open breaker or a
    structural failure is listed as unavailable. `rejected` (and
    `rejected_plan`) turn the verifier's reasons into feedback for one retry.

    >>> msgs = format_plan_request(goal="weather in Paris", failures=[], tools=[])
    >>> [m.type for m in msgs]
    ['system', 'human']
    """
    states = dict(breaker_states or {})
    structural = set(structurally_failed) | {
        e.tool for e in failures if e.tool and e.failure_class is FailureClass.STRUCTURAL
    }
    listed: list[dict[str, Any]] = []
    for tool in tools:
        spec = _tool_spec(tool)
        name = str(spec["name"])
        spec["breaker"] = states.get(name, "closed")
        unavailable = [
            why
            for why, applies in (
                ("circuit breaker open", spec["breaker"] == "open"),
                ("failed structurally in this thread", name in structural),
            )
            if applies
        ]
        spec["available"] = not unavailable
        if unavailable:
            spec["unavailable_because"] = "; ".join(unavailable)
        listed.append(spec)
    envelopes: list[dict[str, Any]] = []
    for error in failures:
        envelope = redact_value(error.model_dump(mode="json", exclude_none=True))
        args = (arguments or {}).get(str(envelope.get("call_id") or ""))
        if args is not None:
            envelope["arguments"] = mask_args(args)
        envelopes.append(envelope)
    sections = [
        "## Goal\n" + (redact(goal.strip(), limit=None) or "(no conversation given)"),
        "## Failed calls (error envelopes)\n" + redact(_json_block(envelopes), limit=None),
        "## Tools\n" + _json_block(listed),
    ]
    if rejected is not None and rejected.reasons:
        lines = [f"- [{r.code}] {redact(r.message, limit=None)}" for r in rejected.reasons]
        text = "## Your previous plan was rejected\n" + "\n".join(lines)
        if rejected_plan is not None:
            shown = redact_value(rejected_plan.model_dump(mode="json"))  # args as mask_args
            text += "\n\nThe rejected plan:\n" + redact(_json_block(shown), limit=None)
        sections.append(text + "\n\nFix every reason above.")
    sections.append("Answer with a Plan.")
    system = _PLANNER_SYSTEM.format(min_words=MIN_CONTENT_WORDS, max_steps=max_steps)
    return [SystemMessage(content=system), HumanMessage(content="\n\n".join(sections))]
