"""The pure core of replanning: the Plan DAG, its references, its verifier, its scheduling."""

from __future__ import annotations

import json
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import BaseModel, ValidationError

from langgraph_resilience.core.canonical import call_key
from langgraph_resilience.core.plan import (
    FILLER_WORDS,
    MIN_CONTENT_WORDS,
    Diagnosis,
    Plan,
    PlanCycleError,
    PlanError,
    PlanReferenceError,
    PlanStep,
    PlanVerdict,
    RejectionCode,
    content_words,
    effective_outputs,
    execution_layers,
    format_plan_request,
    plan_status,
    ready_steps,
    references,
    resolve_args,
    verify,
)
from langgraph_resilience.errors import ConfigurationError, FailureClass, ToolError

# ------------------------------------------------------------------------ the world
# get_weather was removed mid-task (STRUCTURAL); geocode -> weather_v2 is the new path.


class GeocodeArgs(BaseModel):
    city: str


class WeatherV2Args(BaseModel):
    lat: float
    lon: float
    units: Literal["c", "f"] = "c"


KNOWN: dict[str, Any] = {"geocode": GeocodeArgs, "weather_v2": WeatherV2Args, "search": None}

REMOVED = ToolError(
    type="ToolNotFound",
    failure_class=FailureClass.STRUCTURAL,
    message="get_weather: 404 Not Found",
    suggested_action="use_tool:weather_v2",
    retriable=False,
    tool="get_weather",
    call_id="call_1",
    attempt=1,
)
FAILED_KEY = call_key("get_weather", {"city": "Paris"})

DIAGNOSIS = Diagnosis(
    failed_tool="get_weather",
    failure_class=FailureClass.STRUCTURAL,
    cause="get_weather returned 404 Not Found: the endpoint was removed",
)
RATIONALE = "geocode turns Paris into coordinates, which weather_v2 accepts instead of a city"


def step(
    id: str,
    tool: str = "search",
    args: dict[str, Any] | None = None,
    depends_on: list[str] | None = None,
    fallback: str | None = None,
) -> PlanStep:
    return PlanStep(
        id=id, tool=tool, args=args or {}, depends_on=depends_on or [], fallback=fallback
    )


GEO = step("geo", "geocode", {"city": "Paris"})
WX = step(
    "wx",
    "weather_v2",
    {"lat": "$steps.geo.output.lat", "lon": "$steps.geo.output.lon"},
    depends_on=["geo"],
)


def plan(*steps: PlanStep, diagnosis: Diagnosis = DIAGNOSIS, rationale: str = RATIONALE) -> Plan:
    return Plan(diagnosis=diagnosis, rationale=rationale, steps=list(steps) if steps else [GEO, WX])


def check(p: Plan, **overrides: Any) -> PlanVerdict:
    kwargs: dict[str, Any] = {
        "known_tools": KNOWN,
        "failures": [REMOVED],
        "failed_calls": [FAILED_KEY],
    }
    kwargs.update(overrides)
    return verify(p, **kwargs)


def only(*steps: PlanStep, rationale: str = RATIONALE) -> Plan:
    """A plan of exactly these steps (no default geocode -> weather_v2)."""
    return Plan(diagnosis=DIAGNOSIS, rationale=rationale, steps=list(steps))


# ------------------------------------------------------------------- acceptance


def test_geocode_then_weather_v2_is_accepted() -> None:
    """The issue's plan, geocode -> weather_v2 after get_weather vanished, verifies."""
    verdict = check(plan())
    assert verdict.accepted, verdict.reasons
    assert verdict.reasons == ()
    assert execution_layers(plan()) == [["geo"], ["wx"]]


def test_verdict_is_json_ready() -> None:
    """A verdict goes into events and the ledger, so it round-trips through JSON."""
    verdict = check(plan(diagnosis=DIAGNOSIS.model_copy(update={"cause": ""})))
    data = json.loads(verdict.model_dump_json())
    assert data["reasons"][0]["code"] == "empty_diagnosis"
    assert PlanVerdict.model_validate(data) == verdict


# --------------------------------------------------------------- rejection rules


@dataclass
class Case:
    """A plan that breaks exactly the rules in `codes` (and no other)."""

    codes: set[str]
    plan: Callable[[], Plan]
    kwargs: dict[str, Any] = field(default_factory=dict)


CASES: dict[str, Case] = {
    "empty plan": Case({"empty_plan", "rationale_names_no_plan_tool"}, only),
    "too many steps": Case({"too_many_steps"}, plan, {"max_steps": 1}),
    "dotted step id": Case(
        {"invalid_step_id"}, lambda: only(step("geo.1", "geocode", {"city": "Paris"}))
    ),
    "blank step id": Case({"invalid_step_id"}, lambda: only(step("", "geocode", {"city": "P"}))),
    "duplicate step id": Case(
        {"duplicate_step_id"},
        lambda: only(GEO, step("geo", "geocode", {"city": "Lyon"})),
    ),
    "unknown tool": Case(
        {"unknown_tool"},
        lambda: plan(GEO, WX, step("tp", "teleport")),
    ),
    "breaker open": Case({"breaker_open"}, plan, {"open_breakers": {"weather_v2"}}),
    "structural failure in the envelopes": Case(
        {"structurally_failed_tool"},
        lambda: plan(step("w", "get_weather", {"city": "Paris", "units": "c"}), GEO),
        {"known_tools": {**KNOWN, "get_weather": None}},
    ),
    "structural failure passed by name": Case(
        {"structurally_failed_tool"},
        lambda: plan(GEO, WX, step("s", "search", {"q": "paris"})),
        {"structurally_failed": {"search"}},
    ),
    "repeated failed call": Case(
        {"repeated_failed_call"},
        # same canonical args as the failed call: keys reordered, noise, 5.0 == 5
        lambda: plan(
            GEO,
            WX,
            step("s", "search", {"reasoning": "again!", "limit": 5.0, "q": "paris weather"}),
        ),
        {"failed_calls": [FAILED_KEY, call_key("search", {"q": "paris weather", "limit": 5})]},
    ),
    "side effect already done": Case(
        {"repeated_side_effect"},
        plan,
        {"done_effects": [call_key("geocode", {"city": "Paris"})]},
    ),
    "fallback retrying its own step": Case(
        {"duplicate_call"},
        lambda: plan(
            step("geo", "geocode", {"city": "Paris"}, fallback="geo2"),
            step("geo2", "geocode", {"nonce": 7, "city": "Paris"}),
            WX,
        ),
    ),
    "unknown dependency": Case(
        {"unknown_dependency"},
        lambda: plan(GEO, WX, step("s", "search", {"q": "x"}, depends_on=["ghost"])),
    ),
    "unknown fallback": Case(
        {"unknown_fallback"},
        lambda: plan(step("geo", "geocode", {"city": "Paris"}, fallback="ghost"), WX),
    ),
    "shared fallback": Case(
        {"shared_fallback"},
        lambda: plan(
            step("geo", "geocode", {"city": "Paris"}, fallback="s"),
            step("wx", "weather_v2", {"lat": 1, "lon": 2}, fallback="s"),
            step("s", "search", {"q": "paris weather"}),
        ),
    ),
    "depending on a fallback": Case(
        {"depends_on_fallback"},
        lambda: plan(
            step("geo", "geocode", {"city": "Paris"}, fallback="geo_b"),
            step("geo_b", "search", {"q": "paris coordinates"}),
            step("wx", "weather_v2", {"lat": 1, "lon": 2}, depends_on=["geo_b"]),
        ),
    ),
    "malformed reference": Case(
        {"malformed_reference"},
        lambda: plan(GEO, step("wx", "weather_v2", {"lat": "$steps.geo.lat", "lon": 2})),
    ),
    "unknown reference": Case(
        {"unknown_reference"},
        lambda: plan(GEO, step("wx", "weather_v2", {"lat": "$steps.ghost.output", "lon": 2})),
    ),
    "reference not in depends_on": Case(
        {"undeclared_reference"},
        lambda: plan(GEO, step("wx", "weather_v2", {"lat": "$steps.geo.output.lat", "lon": 2})),
    ),
    "cycle through depends_on": Case(
        {"cycle"},
        lambda: plan(
            step("geo", "geocode", {"city": "Paris"}, depends_on=["wx"]),
            WX,
        ),
    ),
    "cycle through fallbacks": Case(
        {"cycle"},
        lambda: plan(
            GEO,
            WX,
            step("s1", "search", {"q": "paris"}, fallback="s2"),
            step("s2", "search", {"q": "paris france"}, fallback="s1"),
        ),
    ),
    "fallback that needs its failed step": Case(
        {"cycle"},
        lambda: plan(
            step("geo", "geocode", {"city": "Paris"}, fallback="s"),
            step("s", "search", {"q": "{$steps.geo.output.lat}"}, depends_on=["geo"]),
            WX,
        ),
    ),
    "args missing a required field": Case(
        {"invalid_args"}, lambda: plan(GEO, step("wx", "weather_v2", {"lat": 1.0}))
    ),
    "args of the wrong type": Case(
        {"invalid_args"},
        lambda: plan(
            step("geo", "geocode", {"city": ["Paris"]}),
            step("wx", "weather_v2", {"lat": 1, "lon": 2, "units": "kelvin"}),
        ),
    ),
    "empty diagnosis": Case(
        {"empty_diagnosis"},
        lambda: plan(diagnosis=DIAGNOSIS.model_copy(update={"cause": "  "})),
    ),
    "diagnosis without a tool": Case(
        {"empty_diagnosis"},
        lambda: plan(diagnosis=DIAGNOSIS.model_copy(update={"failed_tool": ""})),
    ),
    "vague diagnosis": Case(
        {"vague_diagnosis"},
        lambda: plan(
            diagnosis=DIAGNOSIS.model_copy(update={"cause": "Something went wrong, try again."})
        ),
    ),
    "diagnosis names a tool that did not fail": Case(
        {"diagnosis_wrong_tool"},
        lambda: plan(diagnosis=DIAGNOSIS.model_copy(update={"failed_tool": "geocode"})),
    ),
    "diagnosis with the wrong class": Case(
        {"diagnosis_wrong_class"},
        lambda: plan(
            diagnosis=DIAGNOSIS.model_copy(update={"failure_class": FailureClass.TRANSIENT})
        ),
    ),
    "empty rationale": Case({"empty_rationale"}, lambda: plan(rationale="")),
    "vague rationale": Case({"vague_rationale"}, lambda: plan(rationale="Use weather_v2 instead.")),
    "rationale naming no tool of the plan": Case(
        {"rationale_names_no_plan_tool"},
        lambda: plan(rationale="get_weather is gone, so the forecast comes from coordinates"),
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_each_rule_rejects_on_its_own(name: str) -> None:
    """Each broken rule yields its own code, and nothing else is reported."""
    case = CASES[name]
    verdict = check(case.plan(), **case.kwargs)
    assert not verdict.accepted
    assert verdict.codes == case.codes, verdict.reasons
    assert all(reason.message for reason in verdict.reasons)


def test_every_rejection_code_has_a_case() -> None:
    """The table above exercises every code the verifier can emit."""
    covered = set().union(*(case.codes for case in CASES.values()))
    assert covered == set(typing.get_args(RejectionCode))


def test_repeating_the_failed_call_with_reordered_keys_and_noise_is_rejected() -> None:
    """The failed (tool, canonical args) is recognized despite key order, noise and 5.0 vs 5."""
    failed = call_key("get_weather", {"city": "Paris", "units": "c", "days": 3})
    again = step(
        "w",
        "get_weather",
        {"days": 3.0, "units": "c", "request_id": "r-9", "city": "Paris", "thought": "hmm"},
    )
    verdict = check(
        plan(again, GEO),
        known_tools={**KNOWN, "get_weather": None},
        failures=[],
        failed_calls=[failed],
    )
    assert "repeated_failed_call" in verdict.codes
    different = step("w", "get_weather", {"city": "Paris", "units": "c", "days": 4})
    verdict = check(
        plan(different, GEO),
        known_tools={**KNOWN, "get_weather": None},
        failures=[],
        failed_calls=[failed],
    )
    assert "repeated_failed_call" not in verdict.codes


def test_a_side_effect_already_done_in_the_thread_is_not_planned_again() -> None:
    """A plan step is a new call id, so a new idempotency key: re-running an effect the
    thread already did would do it twice. Other arguments are another effect."""
    done = call_key("geocode", {"city": "Paris", "reasoning": "first"})

    verdict = check(plan(), done_effects=[done])

    assert verdict.codes == {"repeated_side_effect"}
    assert verdict.reasons[0].step == "geo"
    assert check(plan(), done_effects=[call_key("geocode", {"city": "Lyon"})]).accepted


def test_failed_calls_are_compared_before_resolving_references() -> None:
    """A step is compared as written: its unresolved reference is not the failed value."""
    failed = call_key("geocode", {"city": "Paris"})
    p = plan(
        step("s", "search", {"q": "capital of France"}),
        step("geo", "geocode", {"city": "$steps.s.output"}, depends_on=["s"]),
    )
    assert "repeated_failed_call" not in check(p, failed_calls=[failed]).codes


def test_custom_noise_fields_decide_sameness() -> None:
    """The policy's noise fields are honoured when comparing with failed calls."""
    failed = call_key("search", {"q": "x"}, noise_fields={"trace"})
    p = plan(GEO, WX, step("s", "search", {"q": "x", "trace": "abc"}))
    assert "repeated_failed_call" not in check(p, failed_calls=[failed]).codes
    verdict = check(p, failed_calls=[failed], noise_fields={"trace"})
    assert "repeated_failed_call" in verdict.codes


def test_a_self_dependency_and_a_self_fallback_are_cycles() -> None:
    """A step waiting on itself, or falling back to itself, is a cycle."""
    own_dep = plan(GEO, step("wx", "weather_v2", {"lat": 1, "lon": 2}, depends_on=["wx"]))
    own_fallback = plan(step("geo", "geocode", {"city": "Paris"}, fallback="geo"), WX)
    assert check(own_dep).codes == {"cycle"}
    assert check(own_fallback).codes == {"cycle"}


def test_cycle_reason_names_the_cycle() -> None:
    """The cycle message shows the steps, so the planner can break it."""
    verdict = check(CASES["cycle through depends_on"].plan())
    (reason,) = verdict.reasons
    assert "geo -> wx -> geo" in reason.message or "wx -> geo -> wx" in reason.message


@pytest.mark.parametrize(
    "value",
    [
        "$steps.geo.lat",
        "$steps.geo.outputs",
        " $steps.geo.output",
        "$steps.geo.output.",
        "$steps.geo.output.a b",
        "{$steps.geo.output",
        "at {$steps.geo.output.lat} and $steps.geo.output.lon",
        "$steps..output",
    ],
)
def test_malformed_references_are_rejected(value: str) -> None:
    """Anything that mentions $steps. outside a well-formed reference is rejected."""
    p = plan(GEO, step("s", "search", {"q": value}, depends_on=["geo"]))
    assert "malformed_reference" in check(p).codes
    with pytest.raises(PlanReferenceError) as info:
        resolve_args({"q": value}, {"geo": {"lat": 1, "lon": 2}})
    assert info.value.problem == "malformed"


def test_schema_check_skips_fields_holding_references() -> None:
    """A float field holding a $steps reference is checked after resolution, not before."""
    assert check(plan()).accepted
    nested = step(
        "wx",
        "weather_v2",
        {"lat": {"deg": "$steps.geo.output.lat"}, "lon": "x{$steps.geo.output.lon}"},
        depends_on=["geo"],
    )
    assert check(plan(GEO, nested)).accepted
    missing = step("wx", "weather_v2", {"lat": "$steps.geo.output.lat"}, depends_on=["geo"])
    verdict = check(plan(GEO, missing))
    assert verdict.codes == {"invalid_args"}
    assert "lon" in verdict.reasons[0].message


def test_json_schema_dicts_are_checked_too() -> None:
    """A JSON-schema tool (e.g. MCP) gets required, extra-field and type checks."""
    schema = {
        "type": "object",
        "properties": {"q": {"type": "string"}, "limit": {"type": "integer"}},
        "required": ["q"],
        "additionalProperties": False,
    }
    known = {**KNOWN, "search": schema}

    def codes(args: dict[str, Any]) -> set[str]:
        return set(check(plan(GEO, WX, step("s", "search", args)), known_tools=known).codes)

    assert codes({"q": "paris", "limit": 3}) == set()
    assert codes({"limit": 3}) == {"invalid_args"}
    assert codes({"q": "paris", "page": 2}) == {"invalid_args"}
    assert codes({"q": 7}) == {"invalid_args"}
    assert codes({"q": "paris", "limit": True}) == {"invalid_args"}
    assert codes({"q": "paris", "limit": 2.5}) == {"invalid_args"}


def test_json_schema_reference_fields_are_skipped() -> None:
    """Under a JSON schema too, a field holding a reference is left to resolution."""
    schema = {"properties": {"limit": {"type": "integer"}}, "required": ["limit"]}
    p = plan(GEO, WX, step("s", "search", {"limit": "$steps.geo.output.n"}, depends_on=["geo"]))
    assert check(p, known_tools={**KNOWN, "search": schema}).accepted


@pytest.mark.parametrize(
    "cause",
    [
        "something went wrong",
        "The tool failed, try again.",
        "error",
        "It didn't work.",
        "get_weather failed",
        "get_weather returned",
    ],
)
def test_non_specific_causes_are_vague(cause: str) -> None:
    """Fewer than MIN_CONTENT_WORDS content words is a vague cause."""
    assert len(content_words(cause)) < MIN_CONTENT_WORDS
    p = plan(diagnosis=DIAGNOSIS.model_copy(update={"cause": cause}))
    assert check(p).codes == {"vague_diagnosis"}


def test_three_content_words_are_specific_enough() -> None:
    """The threshold is exact: three content words pass."""
    p = plan(diagnosis=DIAGNOSIS.model_copy(update={"cause": "get_weather returned 404"}))
    assert content_words("get_weather returned 404") == ["get_weather", "returned", "404"]
    assert check(p).accepted


def test_filler_words_are_lowercase_single_words() -> None:
    """The filler list is matched against lowercased tokens, so it must be lowercase."""
    assert all(w == w.lower() and " " not in w for w in FILLER_WORDS)
    assert content_words("It\u2019s BROKEN, didn\u2019t WORK") == []


def test_rationale_must_name_a_plan_tool_as_a_whole_word() -> None:
    """'geocoder' does not name geocode; case does not matter."""
    base = "Coordinates from {} feed the forecast endpoint directly, avoiding get_weather"
    assert "rationale_names_no_plan_tool" in check(plan(rationale=base.format("geocoder"))).codes
    assert check(plan(rationale=base.format("GEOCODE"))).accepted


def test_diagnosis_checks_against_failures_only_when_known() -> None:
    """With no failure information, any tool and class may be diagnosed."""
    p = plan(
        diagnosis=DIAGNOSIS.model_copy(
            update={"failed_tool": "other", "failure_class": FailureClass.POLICY}
        )
    )
    assert verify(p, known_tools=KNOWN).accepted


def test_failed_call_keys_name_failed_tools() -> None:
    """A failed call key alone makes its tool a valid diagnosis, of any class."""
    p = plan(diagnosis=DIAGNOSIS.model_copy(update={"failure_class": FailureClass.TRANSIENT}))
    assert verify(p, known_tools=KNOWN, failed_calls=[FAILED_KEY]).accepted
    assert verify(p, known_tools=KNOWN, failures=[REMOVED]).codes == {"diagnosis_wrong_class"}


def test_a_tool_that_failed_twice_may_be_diagnosed_with_either_class() -> None:
    """Any class the tool actually failed with is a correct diagnosis."""
    timeout = REMOVED.model_copy(update={"failure_class": FailureClass.TRANSIENT})
    p = plan(diagnosis=DIAGNOSIS.model_copy(update={"failure_class": FailureClass.TRANSIENT}))
    assert check(p, failures=[REMOVED, timeout]).accepted


def test_uppercase_failure_class_is_accepted() -> None:
    """Models often shout enum values; the diagnosis accepts them."""
    diagnosis = Diagnosis.model_validate(
        {"failed_tool": "x", "failure_class": " STRUCTURAL ", "cause": "c"}
    )
    assert diagnosis.failure_class is FailureClass.STRUCTURAL


@pytest.mark.parametrize("max_steps", [0, -1, True, 2.5])
def test_invalid_max_steps_is_a_configuration_error(max_steps: Any) -> None:
    """A step limit below 1 (or not an integer) is misconfiguration."""
    with pytest.raises(ConfigurationError, match="max_steps"):
        check(plan(), max_steps=max_steps)


def test_all_reasons_are_reported_at_once() -> None:
    """The planner gets every broken rule in one round, not one per replan."""
    p = Plan(
        diagnosis=Diagnosis(failed_tool="", failure_class="unknown", cause=""),
        rationale="try again",
        steps=[step("a", "teleport", depends_on=["b"]), step("b", "teleport", depends_on=["a"])],
    )
    codes = check(p).codes
    assert {"cycle", "unknown_tool", "empty_diagnosis", "vague_rationale"} <= codes


# -------------------------------------------------------------------- references


OUTPUTS: dict[str, Any] = {
    "geo": {"lat": 48.85, "lon": 2.35, "tags": ["city", "capital"], "meta": {"src": "osm"}},
    "rows": [{"id": "a1", "n": 1}, {"id": "b2", "n": 2}],
    "text": "Paris",
    "mapping": {"0": "zero", "__class__": "just data"},
}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("$steps.geo.output", OUTPUTS["geo"]),
        ("$steps.geo.output.lat", 48.85),
        ("$steps.geo.output.tags.1", "capital"),
        ("$steps.geo.output.meta.src", "osm"),
        ("$steps.rows.output.1.id", "b2"),
        ("$steps.mapping.output.0", "zero"),
        ("$steps.mapping.output.__class__", "just data"),
        ("at {$steps.geo.output.lat},{$steps.geo.output.lon}", "at 48.85,2.35"),
        ("tags={$steps.geo.output.tags}", 'tags=["city","capital"]'),
        ("in {$steps.text.output}!", "in Paris!"),
        ("{__import__('os').system('id')}", "{__import__('os').system('id')}"),
        ("price is $5 and {braces}", "price is $5 and {braces}"),
    ],
)
def test_references_resolve_to_data(value: str, expected: Any) -> None:
    """Whole references keep the value's type; interpolations become text; the rest is data."""
    assert resolve_args({"v": value}, OUTPUTS) == {"v": expected}


def test_references_resolve_at_any_depth() -> None:
    """References inside nested dicts and lists are resolved, other values kept."""
    args = {"where": {"lat": "$steps.geo.output.lat", "ids": ["$steps.rows.output.0.id", 3]}}
    assert resolve_args(args, OUTPUTS) == {"where": {"lat": 48.85, "ids": ["a1", 3]}}
    assert references(args) == {"geo", "rows"}


def test_interpolation_renders_json_scalars() -> None:
    """Non-string values interpolate as compact JSON."""
    outputs = {"s": {"ok": True, "none": None, "n": 2}}
    args = {"q": "{$steps.s.output.ok}/{$steps.s.output.none}/{$steps.s.output.n}"}
    assert resolve_args(args, outputs) == {"q": "true/null/2"}


@pytest.mark.parametrize(
    ("value", "problem", "step_id"),
    [
        ("$steps.nope.output", "missing_step", "nope"),
        ("$steps.geo.output.alt", "missing_key", "geo"),
        ("$steps.geo.output.tags.5", "missing_index", "geo"),
        ("$steps.rows.output.first", "missing_index", "rows"),
        ("$steps.geo.output.lat.deg", "not_traversable", "geo"),
        ("$steps.text.output.__class__", "not_traversable", "text"),
        ("$steps.geo.output.__class__", "missing_key", "geo"),
        ("x{$steps.nope.output}", "missing_step", "nope"),
    ],
)
def test_unresolvable_references_raise_a_typed_error(
    value: str, problem: str, step_id: str
) -> None:
    """A missing step, key or index raises PlanReferenceError, never an attribute lookup."""
    with pytest.raises(PlanReferenceError) as info:
        resolve_args({"v": value}, OUTPUTS)
    assert info.value.problem == problem
    assert info.value.step_id == step_id
    assert isinstance(info.value, PlanError)


def test_objects_are_never_traversed_by_attribute() -> None:
    """An output object's attributes are out of reach: only keys and indices resolve."""

    class Secretive:
        password = "hunter2"

    with pytest.raises(PlanReferenceError) as info:
        resolve_args({"v": "$steps.o.output.password"}, {"o": Secretive()})
    assert info.value.problem == "not_traversable"
    with pytest.raises(PlanReferenceError) as info:
        resolve_args({"v": "{$steps.o.output}"}, {"o": Secretive()})
    assert info.value.problem == "not_json"


def test_substituted_values_are_not_resolved_again() -> None:
    """A tool output that looks like a reference is data: no second-order injection."""
    outputs = {"a": "$steps.b.output", "b": "secret"}
    assert resolve_args({"v": "$steps.a.output", "w": "<{$steps.a.output}>"}, outputs) == {
        "v": "$steps.b.output",
        "w": "<$steps.b.output>",
    }


def test_resolution_copies_outputs() -> None:
    """A tool mutating its arguments cannot change a stored output."""
    resolved = resolve_args({"v": "$steps.geo.output.tags"}, OUTPUTS)
    resolved["v"].append("mutated")
    assert OUTPUTS["geo"]["tags"] == ["city", "capital"]


def test_references_ignore_keys_and_plain_text() -> None:
    """Only values are scanned; text without a reference contributes nothing."""
    assert references({"$steps.a.output": 1, "q": "no refs {here}"}) == set()
    assert references({"q": "$steps.a.output.b", "r": "{$steps.c.output} {$steps.a.output}"}) == {
        "a",
        "c",
    }


def test_code_looking_values_are_just_data_to_the_verifier() -> None:
    """A value like {__import__('os')} has no reference and passes through unchanged."""
    p = plan(GEO, WX, step("s", "search", {"q": "{__import__('os').system('rm -rf /')}"}))
    assert check(p).accepted
    assert resolve_args(p.steps[2].args, {}) == {"q": "{__import__('os').system('rm -rf /')}"}


# -------------------------------------------------------------------- scheduling


def _fallback_plan() -> Plan:
    """a (falls back to b, which falls back to c) -> d; e is independent."""
    return only(
        step("a", "geocode", {"city": "Paris"}, fallback="b"),
        step("b", "search", {"q": "paris coordinates"}, fallback="c"),
        step("c", "search", {"q": "paris lat lon"}),
        step("d", "weather_v2", {"lat": "$steps.a.output.lat", "lon": 2}, depends_on=["a"]),
        step("e", "search", {"q": "paris events"}),
    )


def test_fallback_plan_is_valid() -> None:
    """Fallback chains are allowed; dependents depend on the primary step."""
    assert check(_fallback_plan()).accepted


def test_independent_steps_share_a_layer() -> None:
    """Steps with no path between them run in the same layer, in plan order."""
    p = only(
        step("x", "search", {"q": "1"}),
        step("y", "search", {"q": "2"}),
        step("z", "search", {"q": "3"}, depends_on=["x", "y"]),
        step("w", "search", {"q": "4"}, depends_on=["x"]),
    )
    assert execution_layers(p) == [["x", "y"], ["z", "w"]]


def test_fallbacks_come_after_their_step_and_before_its_dependents() -> None:
    """A fallback is layered after its step; the step's dependents wait for the chain."""
    assert execution_layers(_fallback_plan()) == [["a", "e"], ["b"], ["c"], ["d"]]


def test_ready_steps_follow_successes() -> None:
    """When the primary succeeds its fallbacks never become ready."""
    p = _fallback_plan()

    def ids(done: list[str], failed: list[str]) -> list[str]:
        return [s.id for s in ready_steps(p, done, failed)]

    assert ids([], []) == ["a", "e"]
    assert ids(["a"], []) == ["d", "e"]
    assert ids(["a", "d", "e"], []) == []
    assert plan_status(p, ["a", "d", "e"], []) == "completed"


def test_ready_steps_follow_fallbacks() -> None:
    """A failed step's fallback becomes ready; its success unblocks the dependents."""
    p = _fallback_plan()

    def ids(done: list[str], failed: list[str]) -> list[str]:
        return [s.id for s in ready_steps(p, done, failed)]

    assert ids(["e"], ["a"]) == ["b"]
    assert ids(["e"], ["a", "b"]) == ["c"]
    assert ids(["e", "c"], ["a", "b"]) == ["d"]
    assert plan_status(p, ["e", "c", "d"], ["a", "b"]) == "completed"


def test_a_failed_chain_blocks_its_dependents() -> None:
    """With every fallback failed, dependents never run and the plan has failed."""
    p = _fallback_plan()
    assert [s.id for s in ready_steps(p, ["e"], ["a", "b", "c"])] == []
    assert plan_status(p, ["e"], ["a", "b", "c"]) == "failed"
    assert plan_status(p, [], ["a", "b", "c"]) == "running"  # e can still run


def test_effective_outputs_let_a_fallback_stand_in() -> None:
    """References to a failed step resolve to the output of the fallback that served it."""
    p = _fallback_plan()
    outputs = {"c": {"lat": 48.85}, "e": ["expo"]}
    effective = effective_outputs(p, outputs, failed=["a", "b"])
    assert effective == {
        "a": {"lat": 48.85},
        "b": {"lat": 48.85},
        "c": {"lat": 48.85},
        "e": ["expo"],
    }
    assert resolve_args(p.steps[3].args, effective) == {"lat": 48.85, "lon": 2}


def test_effective_outputs_omit_unserved_steps() -> None:
    """A step that has not run, or failed for good, has no output to reference."""
    p = _fallback_plan()
    assert effective_outputs(p, {}, failed=["a", "b", "c"]) == {}
    assert effective_outputs(p, {"a": 1}, failed=[]) == {"a": 1}


def test_scheduling_an_unverified_plan_raises() -> None:
    """Layers and readiness refuse cycles, dangling ids and shared fallbacks."""
    with pytest.raises(PlanCycleError) as info:
        execution_layers(CASES["cycle through fallbacks"].plan())
    assert info.value.cycle[0] == info.value.cycle[-1]
    for name in ["unknown dependency", "unknown fallback", "shared fallback", "duplicate step id"]:
        with pytest.raises(PlanError):
            ready_steps(CASES[name].plan(), [], [])


# ----------------------------------------------------------------- random graphs


@st.composite
def dag_plans(draw: st.DrawFn, with_fallbacks: bool = False) -> Plan:
    """A random acyclic plan: deps point to earlier nodes; fallbacks sit beside their step."""
    n = draw(st.integers(1, 8))
    deps = [sorted(draw(st.sets(st.integers(0, i - 1), max_size=3))) if i else [] for i in range(n)]
    steps: list[PlanStep] = []
    for i in draw(st.permutations(range(n))):
        chain = draw(st.integers(0, 2)) if with_fallbacks else 0
        names = [f"s{i}", f"f{i}", f"g{i}"][: chain + 1]
        for level, (sid, tool_name) in enumerate(
            zip(names, ["fetch", "mirror", "backup"], strict=False)
        ):
            own = (
                deps[i]
                if level == 0
                else draw(st.sets(st.sampled_from(deps[i])))
                if deps[i]
                else []
            )
            args: dict[str, Any] = {"n": i, "inputs": [f"$steps.s{d}.output" for d in sorted(own)]}
            steps.append(
                PlanStep(
                    id=sid,
                    tool=tool_name,
                    args=args,
                    depends_on=[f"s{d}" for d in sorted(own)],
                    fallback=names[level + 1] if level + 1 < len(names) else None,
                )
            )
    return Plan(
        diagnosis=DIAGNOSIS,
        rationale="fetch reads every shard from the replica cluster since get_weather vanished",
        steps=steps,
    )


RANDOM_TOOLS = {"fetch": None, "mirror": None, "backup": None}


def _assert_layers_respect_order(p: Plan) -> None:
    layer_of = {sid: n for n, layer in enumerate(execution_layers(p)) for sid in layer}
    assert sorted(layer_of) == sorted(s.id for s in p.steps)
    fallback_of = {s.id: s.fallback for s in p.steps}
    for s in p.steps:
        for dep in s.depends_on:
            assert layer_of[dep] < layer_of[s.id]
            chain = fallback_of[dep]
            while chain is not None:  # the step's dependents also wait for its fallbacks
                assert layer_of[chain] < layer_of[s.id]
                chain = fallback_of[chain]
        if s.fallback is not None:
            assert layer_of[s.id] < layer_of[s.fallback]


@settings(max_examples=200, deadline=None)
@given(dag_plans())
def test_random_dags_verify_and_layer_consistently(p: Plan) -> None:
    """Every acyclic plan verifies, and its layers respect every dependency."""
    verdict = verify(p, known_tools=RANDOM_TOOLS, failures=[REMOVED], max_steps=64)
    assert verdict.accepted, verdict.reasons
    _assert_layers_respect_order(p)


@settings(max_examples=200, deadline=None)
@given(dag_plans(with_fallbacks=True))
def test_random_dags_with_fallbacks_verify_and_layer_consistently(p: Plan) -> None:
    """Fallback chains keep an acyclic plan acyclic, and layers honour them."""
    verdict = verify(p, known_tools=RANDOM_TOOLS, failures=[REMOVED], max_steps=64)
    assert verdict.accepted, verdict.reasons
    _assert_layers_respect_order(p)


@settings(max_examples=200, deadline=None)
@given(dag_plans(), st.data())
def test_injected_cycles_are_always_rejected(p: Plan, data: st.DataObject) -> None:
    """Closing any cycle, through depends_on or fallbacks, is rejected and unschedulable."""
    ids = [s.id for s in p.steps]
    cycle = data.draw(st.lists(st.sampled_from(ids), min_size=1, max_size=len(ids), unique=True))
    via_fallback = data.draw(st.booleans())
    nxt = {cycle[k]: cycle[(k + 1) % len(cycle)] for k in range(len(cycle))}
    steps = []
    for s in p.steps:
        if s.id not in nxt:
            steps.append(s)
        elif via_fallback:
            steps.append(s.model_copy(update={"fallback": nxt[s.id]}))
        else:
            target = next(k for k, v in nxt.items() if v == s.id)  # s waits on its predecessor
            steps.append(s.model_copy(update={"depends_on": [*s.depends_on, target]}))
    broken = p.model_copy(update={"steps": steps})
    assert "cycle" in verify(broken, known_tools=RANDOM_TOOLS, max_steps=64).codes
    with pytest.raises(PlanCycleError):
        execution_layers(broken)


@settings(max_examples=200, deadline=None)
@given(dag_plans(with_fallbacks=True), st.data())
def test_executing_ready_steps_never_breaks_a_dependency(p: Plan, data: st.DataObject) -> None:
    """Running ready steps with random outcomes terminates, runs each step at most once and
    only after its dependencies are served."""
    done: list[str] = []
    failed: list[str] = []
    outputs: dict[str, Any] = {}
    for _ in range(len(p.steps) + 1):
        ready = ready_steps(p, done, failed)
        if not ready:
            break
        served = effective_outputs(p, outputs, failed)
        for s in ready:
            assert s.id not in done
            assert s.id not in failed
            assert all(dep in served for dep in s.depends_on)
            resolve_args(s.args, served)  # every reference resolves
        for s in ready:
            if data.draw(st.booleans(), label=f"{s.id} succeeds"):
                done.append(s.id)
                outputs[s.id] = {"from": s.id}
            else:
                failed.append(s.id)
    else:
        pytest.fail("the plan did not terminate")
    assert plan_status(p, done, failed) in {"completed", "failed"}


# ------------------------------------------------------------ schema and prompt


def test_plan_schema_converts_to_an_openai_tool() -> None:
    """with_structured_output(Plan) works: the schema converts, inlined, JSON-clean."""
    spec = convert_to_openai_tool(Plan)
    params = spec["function"]["parameters"]
    assert spec["function"]["name"] == "Plan"
    assert params["required"] == ["diagnosis", "rationale", "steps"]
    step_schema = params["properties"]["steps"]["items"]
    assert step_schema["properties"]["args"]["type"] == "object"
    assert set(step_schema["required"]) == {"id", "tool"}
    text = json.dumps(spec)
    assert "$ref" not in text
    assert "structural" in text  # the failure classes are an enum the model can see
    assert Plan.model_json_schema()["additionalProperties"] is False


def test_plan_round_trips_through_json() -> None:
    """A plan is stored in the checkpoint as JSON and comes back equal."""
    p = _fallback_plan()
    assert Plan.model_validate_json(p.model_dump_json()) == p


def test_misspelled_plan_fields_are_rejected_at_parse_time() -> None:
    """A 'dependencies' typo must not silently drop the ordering."""
    with pytest.raises(ValidationError):
        PlanStep.model_validate({"id": "a", "tool": "t", "dependencies": ["b"]})


@tool
def weather_v2(lat: float, lon: float) -> str:
    """Current weather at coordinates."""
    return f"{lat},{lon}"


@tool
def geocode(city: str) -> dict[str, float]:
    """Coordinates of a city."""
    return {"lat": 0.0, "lon": 0.0}


def test_plan_request_carries_goal_failures_tools_and_rules() -> None:
    """The planner sees the goal, the envelopes, each tool's schema and state, and the rules."""
    messages = format_plan_request(
        goal="user: what's the weather in Paris?",
        failures=[REMOVED],
        tools=[
            geocode,
            weather_v2,
            {
                "name": "search",
                "description": "Web search",
                "parameters": {"type": "object", "properties": {}},
            },
        ],
        breaker_states={"search": "open", "weather_v2": "half_open"},
        max_steps=5,
    )
    assert [type(m) for m in messages] == [SystemMessage, HumanMessage]
    system, human = (str(m.content) for m in messages)
    assert "At most 5 steps" in system
    assert "$steps.<id>.output" in system
    assert "weather in Paris" in human
    assert '"failure_class": "structural"' in human
    assert '"tool": "get_weather"' in human
    tools_json = human.split("## Tools\n```json\n")[1].split("\n```")[0]
    listed = {t["name"]: t for t in json.loads(tools_json)}
    assert listed["geocode"]["parameters"]["properties"]["city"]["type"] == "string"
    assert listed["geocode"]["available"] is True
    assert listed["weather_v2"]["breaker"] == "half_open"
    assert listed["weather_v2"]["available"] is True
    assert listed["search"]["available"] is False
    assert "breaker open" in listed["search"]["unavailable_because"]
    assert "rejected" not in human


def test_plan_request_marks_structurally_failed_tools_unavailable() -> None:
    """A tool still registered but structurally failed is shown, marked unavailable."""
    failed_geo = REMOVED.model_copy(update={"tool": "geocode"})
    (_, human) = format_plan_request(goal="g", failures=[failed_geo], tools=[geocode])
    assert '"available": false' in str(human.content)
    assert "failed structurally" in str(human.content)


def test_plan_request_feeds_back_the_rejection() -> None:
    """After a rejection the planner sees every reason's code and the rejected plan."""
    bad = CASES["cycle through depends_on"].plan()
    verdict = check(bad)
    (_, human) = format_plan_request(
        goal="g", failures=[REMOVED], tools=[geocode], rejected=verdict, rejected_plan=bad
    )
    content = str(human.content)
    assert "[cycle]" in content
    assert '"depends_on": [\n' in content  # the rejected plan, as JSON
    assert "Fix every reason above." in content


def test_plan_request_never_leaks_secrets() -> None:
    """Envelope text is redacted again; nothing but the envelope describes a failure."""
    leaky = REMOVED.model_copy(
        update={
            "message": "401 with Authorization: Bearer abcdef0123456789",
            "context": {"detail": "api_key=sk-live-0123456789abcdef"},
        }
    )
    (_, human) = format_plan_request(goal="g", failures=[leaky], tools=[])
    content = str(human.content)
    assert "abcdef0123456789" not in content
    assert "sk-live" not in content
    assert "[REDACTED]" in content


def test_plan_request_shows_the_failed_arguments_redacted() -> None:
    """The planner sees what the failed call was asked (so it can reuse the values and
    avoid the repeat), never a secret-named field's value."""
    (_, human) = format_plan_request(
        goal="g",
        failures=[REMOVED],
        tools=[],
        arguments={"call_1": {"city": "Paris", "api_token": "tok-0123456789abcdef"}},
    )
    content = str(human.content)
    assert '"arguments": {' in content
    assert '"city": "Paris"' in content
    assert "tok-0123456789abcdef" not in content
    (_, other) = format_plan_request(
        goal="g", failures=[REMOVED], tools=[], arguments={"call_9": {"city": "Rome"}}
    )
    assert "Rome" not in str(other.content)  # only the arguments of the failed calls
