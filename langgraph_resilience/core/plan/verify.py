"""The plan verifier: every rule a plan must keep before anything runs.

`verify` turns each broken rule into a `RejectionReason` (a stable code and a
message the planner can act on), so a blind swap ("tool A failed, try B") or a
disguised retry is rejected with reasons, and the planner tries again.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, ValidationError

from langgraph_resilience.core.canonical import DEFAULT_NOISE_FIELDS, call_key
from langgraph_resilience.core.plan.dag import find_cycle, order_edges
from langgraph_resilience.core.plan.model import DEFAULT_MAX_STEPS, Plan, PlanStep
from langgraph_resilience.core.plan.refs import (
    STEP_ID,
    holds_reference,
    is_malformed,
    references,
    strings,
)
from langgraph_resilience.errors import ConfigurationError, FailureClass, ToolError

__all__ = [
    "FILLER_WORDS",
    "MIN_CONTENT_WORDS",
    "ArgsSchema",
    "PlanVerdict",
    "RejectionCode",
    "RejectionReason",
    "content_words",
    "verify",
]

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
    events and the tally can carry it.

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


# ------------------------------------------------------------------ vague words

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


# ------------------------------------------------------------------ argument schemas

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


def _model_problems(
    args: Mapping[str, Any], schema: type[BaseModel], skipped: Collection[str]
) -> list[str]:
    problems: list[str] = []
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


def _args_problems(args: Mapping[str, Any], schema: ArgsSchema) -> list[str]:
    """Why `args` break `schema`, ignoring top-level fields that hold a reference."""
    skipped = {key for key, value in args.items() if holds_reference(value)}
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        return _model_problems(args, schema, skipped)
    properties = schema.get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    problems = [
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


# ------------------------------------------------------------------ the rules


def _reason(code: RejectionCode, message: str, step: str | None = None) -> RejectionReason:
    return RejectionReason(code=code, message=message, step=step)


def _check_ids(steps: Sequence[PlanStep], max_steps: int) -> Iterator[RejectionReason]:
    """At least one step, at most `max_steps`, each id valid and used once."""
    if not steps:
        yield _reason("empty_plan", "The plan has no steps; give at least one tool call.")
    if len(steps) > max_steps:
        yield _reason(
            "too_many_steps", f"The plan has {len(steps)} steps; the limit is {max_steps}."
        )
    declared: set[str] = set()
    for step in steps:
        if not STEP_ID.fullmatch(step.id):
            yield _reason(
                "invalid_step_id",
                f"Step id {step.id!r} must be 1-64 letters, digits, '_' or '-'.",
                step.id,
            )
        if step.id in declared:
            yield _reason("duplicate_step_id", f"Step id {step.id!r} is used twice.", step.id)
        declared.add(step.id)


def _fallback_owners(steps: Sequence[PlanStep], declared: Collection[str]) -> dict[str, int]:
    """Each declared fallback's owner: the index of the first step that names it."""
    owners: dict[str, int] = {}
    for index, step in enumerate(steps):
        if step.fallback is not None and step.fallback in declared:
            owners.setdefault(step.fallback, index)
    return owners


def _check_links(steps: Sequence[PlanStep]) -> Iterator[RejectionReason]:
    """Dependencies and fallbacks name steps of the plan; a fallback serves one step."""
    declared = {step.id for step in steps}
    owners = _fallback_owners(steps, declared)
    for index, step in enumerate(steps):
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
        elif owners[step.fallback] != index:
            yield _reason(
                "shared_fallback",
                f"Step {step.fallback!r} is the fallback of both "
                f"{steps[owners[step.fallback]].id!r} and {step.id!r}; give each step its own "
                "fallback.",
                step.id,
            )


def _check_order(plan: Plan) -> Iterator[RejectionReason]:
    """No step depends on a fallback (only its owner); no cycle."""
    steps = plan.steps
    owners = _fallback_owners(steps, {step.id for step in steps})
    primaries = {fallback: steps[index].id for fallback, index in owners.items()}
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
    cycle = find_cycle(order_edges(plan))
    if cycle is not None:
        note = ""
        if any(step.fallback is not None for step in steps if step.id in cycle):
            note = " (a fallback runs after its step, and the step's dependents wait for it)"
        yield _reason("cycle", "Steps wait on each other: " + " -> ".join(cycle) + note, cycle[0])


@dataclasses.dataclass(frozen=True, slots=True)
class _Thread:
    """What the thread knows that a plan's calls are checked against."""

    known_tools: Mapping[str, ArgsSchema | None]
    open_breakers: Collection[str]
    structural: Collection[str]
    failed_keys: Collection[str]
    done_effects: Collection[str]
    noise: frozenset[str]


def _check_tool(step: PlanStep, thread: _Thread) -> Iterator[RejectionReason]:
    """The step's tool is available: known, breaker closed, not structurally failed."""
    sid, tool = step.id, step.tool
    if tool not in thread.known_tools:
        yield _reason(
            "unknown_tool", f"Step {sid!r} uses {tool!r}, which is not an available tool.", sid
        )
    if tool in thread.open_breakers:
        yield _reason(
            "breaker_open", f"Step {sid!r} uses {tool!r}, whose circuit breaker is open.", sid
        )
    if tool in thread.structural:
        yield _reason(
            "structurally_failed_tool",
            f"Step {sid!r} uses {tool!r}, which failed structurally in this thread "
            "(missing, removed or contract changed).",
            sid,
        )


def _check_repeats(
    step: PlanStep, key: str, thread: _Thread, seen_calls: Mapping[str, str]
) -> Iterator[RejectionReason]:
    """The call (tool and canonical args, `key`) is new: not failed, done or planned before."""
    sid, tool = step.id, step.tool
    if key in thread.failed_keys:
        yield _reason(
            "repeated_failed_call",
            f"Step {sid!r} repeats a call to {tool!r} that already failed with the same "
            "arguments; change the tool or the arguments.",
            sid,
        )
    if key in thread.done_effects:
        yield _reason(
            "repeated_side_effect",
            f"Step {sid!r} repeats a side effect of {tool!r} that already succeeded in "
            "this thread with the same arguments; it would happen twice. Use its result "
            "instead.",
            sid,
        )
    if key in seen_calls:
        yield _reason(
            "duplicate_call", f"Step {sid!r} makes the same call as step {seen_calls[key]!r}.", sid
        )


def _check_references(step: PlanStep, declared: Collection[str]) -> Iterator[RejectionReason]:
    """Every reference is well-formed and names a step listed in ``depends_on``."""
    sid = step.id
    for text in sorted({text for text in strings(step.args) if is_malformed(text)}):
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


def _check_calls(plan: Plan, thread: _Thread) -> Iterator[RejectionReason]:
    """Tools, repeated calls, references and arguments, step by step."""
    declared = {step.id for step in plan.steps}
    seen_calls: dict[str, str] = {}
    for step in plan.steps:
        yield from _check_tool(step, thread)
        key = call_key(step.tool, step.args, noise_fields=thread.noise)
        yield from _check_repeats(step, key, thread, seen_calls)
        seen_calls.setdefault(key, step.id)
        yield from _check_references(step, declared)
        schema = thread.known_tools.get(step.tool)
        for problem in _args_problems(step.args, schema) if schema is not None else ():
            yield _reason(
                "invalid_args",
                f"Step {step.id!r}: arguments of {step.tool!r} are invalid: {problem}.",
                step.id,
            )


def _check_diagnosis(
    plan: Plan, failed_tools: Mapping[str, Collection[FailureClass]]
) -> Iterator[RejectionReason]:
    """The diagnosis names a tool that failed, with its class and the evidence."""
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
    if not named or not failed_tools:
        return
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


def _check_rationale(plan: Plan) -> Iterator[RejectionReason]:
    """The rationale is specific and names the tools the plan uses."""
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


def _tool_of_key(key: str) -> str:
    # `call_key` is "<tool>:<digest>"; the digest never contains ":".
    return key.rpartition(":")[0]


def _failed_tools(
    failures: Sequence[ToolError], structural: Collection[str], failed_keys: Collection[str]
) -> dict[str, set[FailureClass]]:
    """Each tool that failed in the thread, with the classes it failed with."""
    failed_tools: dict[str, set[FailureClass]] = {}
    for error in failures:
        if error.tool:
            failed_tools.setdefault(error.tool, set()).add(error.failure_class)
    for tool in structural:
        failed_tools.setdefault(tool, set()).add(FailureClass.STRUCTURAL)
    for key in failed_keys:
        if _tool_of_key(key):
            failed_tools.setdefault(_tool_of_key(key), set())
    return failed_tools


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

    >>> from langgraph_resilience.core.plan import Diagnosis
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
    thread = _Thread(
        known_tools=known_tools,
        open_breakers=open_breakers,
        structural=structural,
        failed_keys=frozenset(failed_calls),
        done_effects=frozenset(done_effects),
        noise=frozenset(noise_fields),
    )
    reasons = [
        *_check_ids(plan.steps, max_steps),
        *_check_links(plan.steps),
        *_check_order(plan),
        *_check_calls(plan, thread),
        *_check_diagnosis(plan, _failed_tools(failures, structural, thread.failed_keys)),
        *_check_rationale(plan),
    ]
    return PlanVerdict(reasons=tuple(reasons))
