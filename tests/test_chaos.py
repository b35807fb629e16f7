"""The chaos harness, the task suite and the benchmark built on them."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import pathlib
from collections import Counter
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool, tool
from pydantic import ValidationError
from rich.console import Console

from langgraph_resilience import ToolProfile, classify
from langgraph_resilience.breaker import BreakerConfig
from langgraph_resilience.chaos import (
    FAULT_KINDS,
    ChaosTool,
    FaultPlan,
    FaultSpec,
    Single,
    burst,
    chaos_stats,
    inject,
    intermittent,
    persistent,
    single,
)
from langgraph_resilience.chaos_bench import (
    CONTENDERS,
    MIXES,
    BenchReport,
    BuildContext,
    Built,
    Contender,
    Mix,
    build_resilient,
    check_targets,
    cmd_bench,
    evaluate_targets,
    quick_tasks,
    run_bench,
    run_task,
)
from langgraph_resilience.chaos_tasks import (
    ABORT_ANSWER,
    TASKS,
    Shop,
    agent_reply,
    operator_decision,
    oracle,
    planner_reply,
    repair_reply,
    scripted_planner,
)
from langgraph_resilience.cli import main
from langgraph_resilience.errors import ConfigurationError, ToolError
from langgraph_resilience.idempotency import EffectStatus, as_partial_result
from langgraph_resilience.replan import Plan, format_plan_request, verify
from langgraph_resilience.testing import FakeClock, FakeHTTPError
from langgraph_resilience.tools import _CURRENT_KEY

ISSUE_KINDS = {
    "http_429",
    "http_429_retry_after",
    "http_500",
    "http_502",
    "http_503",
    "http_504",
    "http_400",
    "http_401",
    "http_403",
    "http_404",
    "timeout",
    "timeout_after_commit",
    "connection_reset",
    "malformed_output",
    "schema_drift",
    "wrong_output",
    "tool_removed",
    "partial_success",
}


@dataclasses.dataclass
class Ledger:
    """What the test tools really did."""

    effects: list[Any] = dataclasses.field(default_factory=list)


def make_tools(ledger: Ledger) -> list[BaseTool]:
    @tool
    def lookup(order_id: int, region: str = "eu") -> dict[str, Any]:
        """Look up an order."""
        ledger.effects.append(("lookup", order_id))
        return {"order_id": order_id, "total": 40.0, "region": region}

    @tool
    def notify(to: list[str], subject: str) -> dict[str, Any]:
        """Notify several people."""
        ledger.effects.extend(("notify", t) for t in to)
        return {"sent": to}

    return [lookup, notify]


def chaos(kind: str, **kwargs: Any) -> tuple[ChaosTool, ChaosTool, Ledger, FakeClock]:
    ledger, clock = Ledger(), FakeClock()
    lookup, notify = inject(
        make_tools(ledger), FaultPlan.of(single(kind, **kwargs)), seed=1, clock=clock
    )
    assert isinstance(lookup, ChaosTool)
    assert isinstance(notify, ChaosTool)
    return lookup, notify, ledger, clock


# ------------------------------------------------------------------ fault kinds


def test_every_fault_kind_of_the_issue_exists() -> None:
    """FAULT_KINDS covers every kind the issue lists."""
    assert set(FAULT_KINDS) >= ISSUE_KINDS


@pytest.mark.parametrize(
    ("kind", "status"),
    [(k, int(k.split("_")[1])) for k in sorted(ISSUE_KINDS) if k.startswith("http_")],
)
def test_status_kinds_raise_before_executing(kind: str, status: int) -> None:
    """An HTTP-status fault raises that status and the tool does not run."""
    lookup, _, ledger, _ = chaos(kind)

    with pytest.raises(FakeHTTPError) as raised:
        lookup.invoke({"order_id": 1})

    assert raised.value.status_code == status
    assert (lookup.calls, lookup.executions, ledger.effects) == (1, 0, [])
    headers = raised.value.response.headers
    assert ("Retry-After" in headers) == (kind == "http_429_retry_after")


@pytest.mark.parametrize("kind", sorted(k for k, v in FAULT_KINDS.items() if v.raises))
def test_raising_kinds_classify_as_labelled(kind: str) -> None:
    """Each raising kind is classified by the package as the class the harness labels it."""
    lookup, _, _, _ = chaos(kind)
    with pytest.raises(Exception) as raised:  # noqa: PT011 - every kind raises its own type
        lookup.invoke({"order_id": 1})
    profile = ToolProfile(side_effect=True) if kind == "timeout_after_commit" else None
    verdict = classify(raised.value, profile=profile)
    if kind == "schema_drift":  # rejected by the schema: ToolNode wraps it as invalid arguments
        assert isinstance(raised.value, ValidationError)
    assert verdict.failure_class is FAULT_KINDS[kind].failure_class


def test_timeout_before_execution_does_not_run_the_tool() -> None:
    """A timeout before execution leaves no effect and charges the timeout to the clock."""
    lookup, _, ledger, clock = chaos("timeout")

    with pytest.raises(TimeoutError):
        lookup.invoke({"order_id": 1})

    assert ledger.effects == []
    assert clock.monotonic() == pytest.approx(5.05)


def test_timeout_after_commit_runs_the_tool_and_loses_the_response() -> None:
    """A timeout after commit raises, yet the effect happened."""
    lookup, _, ledger, _ = chaos("timeout_after_commit")

    with pytest.raises(TimeoutError):
        lookup.invoke({"order_id": 1})

    assert ledger.effects == [("lookup", 1)]
    assert lookup.executions == 1


def test_connection_reset_raises_a_connection_error_without_running() -> None:
    """A connection reset is a ConnectionResetError before the tool runs."""
    lookup, _, ledger, _ = chaos("connection_reset")

    with pytest.raises(ConnectionResetError):
        lookup.invoke({"order_id": 1})

    assert ledger.effects == []


def test_malformed_output_is_truncated_json() -> None:
    """Malformed output: the tool runs, the caller gets half of its JSON."""
    lookup, _, ledger, _ = chaos("malformed_output")

    out = lookup.invoke({"order_id": 1})

    full = json.dumps({"order_id": 1, "total": 40.0, "region": "eu"})
    assert out == full[: len(full) // 2]
    with pytest.raises(json.JSONDecodeError):
        json.loads(out)
    assert ledger.effects == [("lookup", 1)]


def test_wrong_output_negates_every_number() -> None:
    """Semantically wrong output: well-formed, every number v becomes -(|v|+1)."""
    lookup, _, _, _ = chaos("wrong_output")

    assert lookup.invoke({"order_id": 1}) == {"order_id": -2, "total": -41.0, "region": "eu"}
    assert lookup.invoke({"order_id": 1})["total"] == 40.0


def test_schema_drift_renames_a_required_argument_for_good() -> None:
    """After drift the old argument name is rejected on every call; the new name works."""
    ledger, clock = Ledger(), FakeClock()
    [lookup, _] = inject(
        make_tools(ledger), FaultPlan.of(single("schema_drift", tools=("lookup",))), 1, clock=clock
    )
    assert isinstance(lookup, ChaosTool)

    for _ in range(2):
        with pytest.raises(ValidationError, match="order_id_v2"):
            lookup.invoke({"order_id": 1})
    out = lookup.invoke({"order_id_v2": 1, "region": "us"})

    assert out["order_id"] == 1
    assert ledger.effects == [("lookup", 1)]
    assert lookup.renamed == {"order_id_v2": "order_id"}
    assert [e.fault for e in lookup.log] == ["schema_drift", "schema_drift", None]
    assert "order_id_v2" in lookup.tool_call_schema.model_json_schema()["properties"]  # type: ignore[union-attr]


def test_tool_removed_answers_unknown_tool_from_then_on() -> None:
    """A removed tool answers 404 'unknown tool' forever; later calls are counted."""
    ledger, _ = Ledger(), None
    [lookup, _] = inject(
        make_tools(ledger), FaultPlan.of(persistent("tool_removed", start=1, tools=("lookup",))), 1
    )
    assert isinstance(lookup, ChaosTool)

    lookup.invoke({"order_id": 1})
    for _ in range(3):
        with pytest.raises(FakeHTTPError) as raised:
            lookup.invoke({"order_id": 2})
        assert raised.value.status_code == 404
        assert "unknown tool" in raised.value.response.text

    assert lookup.removed
    assert lookup.calls_after_removal == 2
    assert ledger.effects == [("lookup", 1)]


def test_partial_success_executes_half_a_batch_and_reports_the_rest() -> None:
    """Partial success sends the first half and reports the rest as failed, in the
    documented `PartialResult` shape."""
    _, notify, ledger, _ = chaos("partial_success")

    out = notify.invoke({"to": ["a", "b", "c", "d"], "subject": "x"})

    assert ledger.effects == [("notify", "a"), ("notify", "b")]
    partial = as_partial_result(out)
    assert partial is not None
    assert partial.succeeded == ["a", "b"]
    assert [f.item for f in partial.failed] == ["c", "d"]


def test_partial_success_leaves_calls_without_a_batch_alone() -> None:
    """A call with no list argument cannot succeed partially: it behaves."""
    lookup, _, _, _ = chaos("partial_success")

    assert lookup.invoke({"order_id": 1})["total"] == 40.0
    assert lookup.log[0].fault is None


# -------------------------------------------------------------------- schedules


def fired(spec: FaultSpec, calls: int, seed: int = 3) -> list[int]:
    [lookup, _] = inject(make_tools(Ledger()), FaultPlan.of(spec), seed)
    out = []
    for i in range(calls):
        try:
            lookup.invoke({"order_id": i})
            out.append(0)
        except FakeHTTPError:
            out.append(1)
    return out


def test_single_persistent_and_fixed_bursts_fire_where_they_say() -> None:
    """Single(at=2), Persistent(start=3) and Burst(3, start=1) hit exactly those calls."""
    assert fired(single("http_503", at=2), 5) == [0, 0, 1, 0, 0]
    assert fired(persistent("http_503", start=3), 5) == [0, 0, 0, 1, 1]
    assert fired(burst("http_503", length=3, start=1), 6) == [0, 1, 1, 1, 0, 0]


def test_intermittent_is_seeded_and_near_its_rate() -> None:
    """Intermittent(p) repeats exactly for a seed, differs across seeds, and hits ~p."""
    spec = intermittent("http_503", p=0.2)
    first = fired(spec, 400, seed=1)

    assert first == fired(spec, 400, seed=1)
    assert first != fired(spec, 400, seed=2)
    assert 0.15 < sum(first) / 400 < 0.25


def test_random_bursts_come_in_runs_of_their_length() -> None:
    """Burst(length=3, start=None) fails in runs whose lengths are multiples of 3."""
    calls = fired(burst("http_503", length=3, start=None, p=0.1), 300)
    runs = "".join(map(str, calls)).split("0")

    assert sum(calls) > 0
    assert all(len(run) % 3 == 0 for run in runs if run)


def test_a_tools_faults_do_not_depend_on_other_tools() -> None:
    """Calls to one tool do not shift another tool's fault schedule."""
    plan = FaultPlan.of(intermittent("http_503", p=0.5))

    def lookups(extra_notifies: int) -> list[str | None]:
        lookup, notify = inject(make_tools(Ledger()), plan, seed=9)
        for i in range(8):
            for _ in range(extra_notifies):
                with contextlib.suppress(FakeHTTPError):
                    notify.invoke({"to": ["a"], "subject": "s"})
            with contextlib.suppress(FakeHTTPError):
                lookup.invoke({"order_id": i})
        assert isinstance(lookup, ChaosTool)
        return [e.fault for e in lookup.log]

    assert lookups(0) == lookups(3)


def test_shadow_breaker_counts_calls_a_breaker_would_refuse() -> None:
    """With a 5-call, 50% BreakerConfig, calls after the 5th failure count."""
    five = BreakerConfig(minimum_calls=5, window_size=20)
    [lookup, _] = inject(
        make_tools(Ledger()), FaultPlan.of(persistent("http_503")), 1, breaker=five
    )
    assert isinstance(lookup, ChaosTool)
    for _ in range(7):
        with pytest.raises(FakeHTTPError):
            lookup.invoke({"order_id": 1})

    assert lookup.calls_while_open == 2


def test_shadow_breaker_ignores_failures_that_say_nothing_about_the_upstream() -> None:
    """400s (semantic) never open the shadow breaker; without a config nothing is counted."""
    spec = persistent("http_400")
    [counted, _] = inject(make_tools(Ledger()), FaultPlan.of(spec), 1, breaker=BreakerConfig())
    [uncounted, _] = inject(make_tools(Ledger()), FaultPlan.of(persistent("http_503")), 1)
    for tool_ in (counted, uncounted):
        for _ in range(8):
            with pytest.raises(FakeHTTPError):
                tool_.invoke({"order_id": 1})

    assert isinstance(counted, ChaosTool)
    assert isinstance(uncounted, ChaosTool)
    assert (counted.calls_while_open, uncounted.calls_while_open) == (0, 0)


def test_attempts_are_counted_per_tool_call_id() -> None:
    """Tool calls carrying an id are counted per id and per identical call."""
    [lookup, _] = inject(make_tools(Ledger()), FaultPlan.of(single("http_503")), 1)
    call = {"name": "lookup", "args": {"order_id": 1}, "id": "c1", "type": "tool_call"}
    with pytest.raises(FakeHTTPError):
        lookup.invoke(call)
    lookup.invoke(call)
    lookup.invoke({**call, "id": "c2"})

    stats = chaos_stats([lookup])
    assert (stats.max_attempts_per_call, stats.max_attempts_per_key) == (2, 3)
    assert stats.faults == {"http_503": 1}


def test_recovery_latency_is_measured_on_the_fake_clock() -> None:
    """A timeout then a success of the same call: latency = timeout + two call latencies."""
    lookup, _, _, _ = chaos("timeout")
    with pytest.raises(TimeoutError):
        lookup.invoke({"order_id": 1})
    lookup.invoke({"order_id": 1})

    assert lookup.recovery_latencies == [pytest.approx(5.0 + 2 * 0.05)]


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: FaultSpec(kind="http_999", schedule=Single()), "unknown fault kind"),
        (lambda: intermittent("timeout", p=1.5), "probability"),
        (lambda: burst("timeout", length=0), "Burst.length"),
        (lambda: single("timeout", at=-1), "Single.at"),
        (
            lambda: FaultSpec(kind="timeout", schedule=Single(), tools="lookup"),  # type: ignore[arg-type]
            "tuple of tool names",
        ),
    ],
)
def test_bad_plans_are_rejected_with_a_fix(build: Any, message: str) -> None:
    """Unknown kinds, bad probabilities, lengths and tool lists fail at construction."""
    with pytest.raises(ConfigurationError, match=message):
        build()


def test_inject_rejects_a_plan_naming_unknown_tools() -> None:
    """A plan targeting a tool that is not there is a configuration error."""
    with pytest.raises(ConfigurationError, match="unknown tools"):
        inject(make_tools(Ledger()), FaultPlan.of(single("timeout", tools=("nope",))), 1)


# -------------------------------------------------------------------- the suite


def test_suite_has_forty_multi_step_tasks_with_side_effects() -> None:
    """At least 40 tasks of 3-15 calls, many with side effects, each with distinct ids."""
    assert len(TASKS) >= 40
    assert len({t.id for t in TASKS}) == len(TASKS)
    assert all(3 <= t.calls <= 15 for t in TASKS)
    assert sum(t.side_effects > 0 for t in TASKS) >= 20
    assert sum(t.calls == 10 for t in TASKS) >= 8


def test_oracles_change_the_shop_exactly_when_a_task_has_effects() -> None:
    """A side-effecting task's oracle differs from the initial shop; a read-only one does not."""
    initial = Shop().snapshot()
    for task in TASKS:
        truth = oracle(task)
        assert (truth.state != initial) == (task.side_effects > 0), task.id
        assert truth.duplicate_effects == 0


def test_shop_counts_duplicate_effects_per_identity() -> None:
    """The same email twice is one duplicate; two different emails are none."""
    shop = Shop()
    shop.send_email("a@x", "s", "b")
    shop.send_email("b@x", "s", "b")
    assert shop.duplicate_effects == 0
    shop.send_email("a@x", "s", "b")
    assert shop.duplicate_effects == 1


def answered(reply: AIMessage, *contents: str, status: str = "success") -> list[Any]:
    return [
        reply,
        *(
            ToolMessage(content=c, tool_call_id=call["id"] or "", status=status)
            for call, c in zip(reply.tool_calls, contents, strict=True)
        ),
    ]


def test_agent_reissues_a_failed_call_once_then_gives_up() -> None:
    """on_error='retry': the same call again after an error, then the abort answer."""
    task = next(t for t in TASKS if t.id == "weather-0")
    messages: list[Any] = [HumanMessage(task.prompt)]
    first = agent_reply(task, messages)
    messages += answered(first, "boom", status="error")
    second = agent_reply(task, messages)
    assert [(c["name"], c["args"]) for c in second.tool_calls] == [
        (c["name"], c["args"]) for c in first.tool_calls
    ]
    messages += answered(second, "boom", status="error")

    assert agent_reply(task, messages).content == ABORT_ANSWER


def test_agent_treats_unreadable_or_partial_output_as_a_failure() -> None:
    """Non-JSON output or a batch listing failed items is re-issued like an error."""
    task = next(t for t in TASKS if t.id == "weather-0")
    messages: list[Any] = [HumanMessage(task.prompt)]
    first = agent_reply(task, messages)
    messages += answered(first, '{"customer_id": "c1", "na')
    assert agent_reply(task, messages).tool_calls[0]["name"] == "get_customer"


def test_repairer_renames_a_drifted_argument_from_the_envelope() -> None:
    """The scripted repairer maps order_id to the order_id_v2 the envelope says is missing."""
    envelope = {
        "failure_class": "semantic",
        "context": {"errors": [{"field": "order_id_v2", "problem": "Field required"}]},
    }
    prompt = f"Failed call: get_order({json.dumps({'order_id': 7})})\n\n"
    prompt += f"Error envelope: {json.dumps(envelope)}"
    reply = repair_reply([HumanMessage(prompt)])

    assert reply.tool_calls[0]["args"] == {"order_id_v2": 7}


def test_repairer_picks_the_closest_allowed_choice() -> None:
    """An enum error becomes the closest allowed value."""
    problem = "Input should be 'damaged', 'late', 'wrong_item' or 'other'"
    envelope = {"context": {"errors": [{"field": "reason", "problem": problem}]}}
    prompt = (
        'Failed call: refund_order({"amount": 1, "order_id": 7, "reason": "damage"})\n\n'
        f"Error envelope: {json.dumps(envelope)}"
    )

    assert repair_reply([HumanMessage(prompt)]).tool_calls[0]["args"]["reason"] == "damaged"


def test_repairer_declines_what_the_envelope_cannot_fix() -> None:
    """A 400 with no field to fix gets no tool call from the repairer."""
    prompt = 'Failed call: get_order({"order_id": 7})\n\nError envelope: {"context": {}}'

    assert repair_reply([HumanMessage(prompt)]).tool_calls == []


def test_shop_status_check_answers_by_idempotency_key() -> None:
    """An effect made under an idempotency key is found by that key; others are not."""
    shop = Shop()
    token = _CURRENT_KEY.set("key-1")
    try:
        placed = shop.create_order("c1", "lamp", 2)
    finally:
        _CURRENT_KEY.reset(token)

    assert shop.status_check("key-1") == EffectStatus(done=True, result=placed)
    assert shop.status_check("key-2") == EffectStatus(done=False)


def test_operator_retries_once_then_skips() -> None:
    """The scripted human answers retry to a call's first escalation and skip to the next."""
    asked = Counter[str]()
    ask = {"call_id": "o", "tool": "create_order", "args": {}}

    assert operator_decision(ask, asked) == {"action": "retry"}
    assert operator_decision(ask, asked)["action"] == "skip"
    assert operator_decision({**ask, "call_id": "p"}, asked) == {"action": "retry"}


def plan_request(task_id: str, call: str, tool_name: str) -> list[Any]:
    task = next(t for t in TASKS if t.id == task_id)
    error = ToolError(
        type="FakeHTTPError",
        failure_class="structural",
        message="HTTP 404",
        suggested_action="ask_human",
        retriable=False,
        tool=tool_name,
        call_id=f"{call}~{task_id}.1",
    )
    return format_plan_request(goal=task.prompt, failures=[error], tools=Shop().tools())


def test_planner_goes_through_the_alternative_and_re_derives_arguments() -> None:
    """A failed geocode is planned as get_customer -> geocode_backup, and the plan verifies."""
    reply = planner_reply(
        next(t for t in TASKS if t.id == "weather-0"), plan_request("weather-0", "geo", "geocode")
    )

    plan = Plan.model_validate(reply.tool_calls[0]["args"])
    assert [(s.id, s.tool) for s in plan.steps] == [
        ("cust", "get_customer"),
        ("geo", "geocode_backup"),
    ]
    assert plan.steps[1].args == {"city": "$steps.cust.output.city"}
    tools = {t.name: t.tool_call_schema for t in Shop().tools()}
    assert verify(plan, known_tools=tools, structurally_failed=["geocode"]).accepted


def test_planner_declines_when_arguments_come_from_a_side_effect() -> None:
    """get_order(order_id=<the order just created>) cannot be re-derived without re-ordering."""
    task = next(t for t in TASKS if t.id == "ten-effects-0")

    reply = planner_reply(task, plan_request("ten-effects-0", "v1", "get_order"))

    assert reply.tool_calls == []


def test_agent_uses_a_replanned_result_only_for_a_call_that_failed_before_it() -> None:
    """A later alternative-endpoint result stands in for our failed call, not for a later one."""
    task = next(t for t in TASKS if t.id == "weather-0")
    messages: list[Any] = [HumanMessage(task.prompt)]
    messages += answered(agent_reply(task, messages), json.dumps(Shop().get_customer("c1")))
    failed = agent_reply(task, messages)
    messages += answered(failed, "gone", status="error")
    plan_call = {"name": "geocode_backup", "args": {"city": "Paris"}, "id": "replan-1-geo"}
    messages += answered(
        AIMessage(content="", tool_calls=[plan_call], name="replanner"),
        json.dumps(Shop().geocode("Paris")),
    )

    assert agent_reply(task, messages).tool_calls[0]["name"] == "get_weather"


# ------------------------------------------------------------------- the bench


@pytest.mark.parametrize("contender", sorted(CONTENDERS))
def test_clean_runs_match_the_oracle_for_every_task(contender: str) -> None:
    """Without faults every contender finishes every task in the oracle's state."""
    runs = [run_task(CONTENDERS[contender], task, MIXES["clean"], 0) for task in TASKS]

    failed = [(r.task, r.crashed, r.answer) for r in runs if not r.success]
    assert failed == []
    assert all(r.duplicates == 0 and r.faults == {} for r in runs)


def test_resilient_contender_repairs_schema_drift() -> None:
    """(d) finishes a drifted create_order task through the repair node; (a) cannot."""
    task = next(t for t in TASKS if t.id == "buy-0")
    ours = run_task(CONTENDERS["resilient"], task, MIXES["schema_drift"], 0)
    plain = run_task(CONTENDERS["toolnode"], task, MIXES["schema_drift"], 0)

    assert (ours.success, plain.success) == (True, False)
    assert ours.llm_calls == ours.agent_turns + 1  # one repair call
    assert ours.faults == {"schema_drift": 1}


def test_resilient_contender_serves_a_removed_tool_from_its_fallback() -> None:
    """geocode gone after its first call: (d) finishes a trip via geocode_backup; (a) cannot."""
    task = next(t for t in TASKS if t.id == "trip-0")
    ours = run_task(CONTENDERS["resilient"], task, MIXES["tool_removed"], 0)
    plain = run_task(CONTENDERS["toolnode"], task, MIXES["tool_removed"], 0)

    assert (ours.success, plain.success) == (True, False)
    assert ours.faults["tool_removed"] >= 1
    assert ours.escalations == 0


def test_without_fallbacks_the_planner_replans_around_a_removed_tool() -> None:
    """With no fallback profiles, (d) reaches geocode_backup through a verified plan."""

    def build(ctx: BuildContext) -> Built:
        planner = scripted_planner(ctx.task)
        app = build_resilient(
            ctx.tools,
            ctx.model,
            clock=ctx.clock,
            seed=ctx.seed,
            planner_model=planner,
            fallbacks={},
            checkpointer=ctx.checkpointer,
        )
        return Built(app, [planner])

    task = next(t for t in TASKS if t.id == "trip-0")
    run = run_task(Contender("replan", "replan", build, True), task, MIXES["tool_removed"], 0)

    assert run.success
    assert run.llm_calls > run.agent_turns  # the planner was asked


def test_lost_response_is_reconciled_by_status_check_not_repeated() -> None:
    """create_order times out after committing: (d) re-runs the same call under the same
    idempotency key, the status check finds the order, no human is needed; (a) lets the
    agent re-issue it and the order is placed twice."""
    task = next(t for t in TASKS if t.id == "buy-0")
    plan = FaultPlan.of(single("timeout_after_commit", tools=("create_order",)))
    mix = Mix("lost", "unknown", plan, "")
    ours = run_task(CONTENDERS["resilient"], task, mix, 0)
    plain = run_task(CONTENDERS["toolnode"], task, mix, 0)

    assert (ours.success, ours.duplicates, ours.escalations) == (True, 0, 0)
    assert ours.faults == {"timeout_after_commit": 1}
    assert (plain.success, plain.duplicates) == (False, 1)


def test_a_refused_permission_is_escalated_to_the_operator() -> None:
    """A 401 on create_order: (d) interrupts, the operator says retry, the order is placed
    once; without escalation (d') the agent is told and gives up as its script says."""
    task = next(t for t in TASKS if t.id == "buy-3")  # on_error="abort" for the order step
    mix = Mix("denied", "policy", FaultPlan.of(single("http_401", tools=("create_order",))), "")
    ours = run_task(CONTENDERS["resilient"], task, mix, 0)
    unattended = run_task(CONTENDERS["resilient_unattended"], task, mix, 0)

    assert (ours.success, ours.escalations, ours.duplicates) == (True, 1, 0)
    assert (unattended.success, unattended.escalations) == (False, 0)


def test_only_operator_approved_retries_exceed_the_attempt_budget() -> None:
    """create_order fails 3 times before executing (seed 2): the 4th run is the operator's
    'retry', recorded as such, so the attempt budget target still holds."""
    task = next(t for t in TASKS if t.id == "buy-0")
    report = run_bench(
        quick=True, contenders=["resilient"], mixes=["transient"], seeds=3, tasks=[task], workers=1
    )
    [run] = [r for r in report.runs if r.mix == "transient" and r.seed == 2]

    assert run.attempts_by_call == {"create_order:order~buy-0.2": 4}
    assert run.human_retries == ("order~buy-0.2",)
    assert check_targets(report) == []


def test_same_seed_gives_identical_counts() -> None:
    """Two runs with the same seeds produce the same counts, run by run."""
    tasks = [t for t in TASKS if t.id in {"buy-0", "trip-0", "ten-reads-0", "announce-0"}]

    def once() -> BenchReport:
        return run_bench(
            quick=True,
            contenders=["toolnode", "resilient"],
            mixes=["transient", "schema_drift"],
            seeds=2,
            tasks=tasks,
            workers=1,
        )

    first, second = once(), once()
    assert first.counts() == second.counts()
    assert sum(r.faults.get("schema_drift", 0) for r in first.runs) > 0


@pytest.fixture(scope="module")
def quick_report() -> BenchReport:
    """`bench --quick` for (d) alone, in two processes."""
    return run_bench(quick=True, contenders=["resilient"], workers=2)


def test_quick_run_meets_every_landed_target(quick_report: BenchReport) -> None:
    """check_targets passes on the quick run: what CI runs."""
    assert check_targets(quick_report) == []
    assert {r.mix for r in quick_report.rows} >= {"clean", "transient"}
    assert len({r.task for r in quick_report.runs}) == len(quick_tasks())


def test_quick_run_reports_unlanded_paths_as_pending(quick_report: BenchReport) -> None:
    """Duplicates after a lost response are pending idempotency, not hidden."""
    statuses = {t.name: t.status for t in quick_report.targets}

    assert statuses["clean success 100%"] == "met"
    assert statuses["timeout_after_commit: no duplicate side effects"] in ("pending", "met")


def test_bench_command_writes_json_and_exits_by_targets(tmp_path: pathlib.Path) -> None:
    """cmd_bench (what `langgraph-resilience bench` runs) writes the report and exits 0
    when (d) meets its targets; a bad argument is one line on stderr and exit code 2."""
    args = argparse.Namespace(
        quick=True, contenders=["resilient"], mix=["transient"], seeds=1, out=str(tmp_path)
    )
    console = Console(file=io.StringIO(), width=200)

    assert cmd_bench(args, console) == 0
    saved = json.loads((tmp_path / "chaos-bench.json").read_text())
    assert saved["config"]["mixes"] == ["clean", "transient"]
    assert {t["status"] for t in saved["targets"]} <= {"met", "pending", "info"}
    with pytest.raises(ConfigurationError, match="seeds must be >= 1"):
        cmd_bench(argparse.Namespace(**{**vars(args), "seeds": 0}), console)
    out, err = io.StringIO(), io.StringIO()
    assert main(["bench", "--quick", "--seeds", "0"], stdout=out, stderr=err) == 2
    assert err.getvalue() == "langgraph-resilience: error: seeds must be >= 1, got 0\n"


def test_a_missed_target_is_reported_by_check_targets(quick_report: BenchReport) -> None:
    """A duplicate in a mix that needs no unlanded path makes check_targets fail."""
    clean = quick_report.row("resilient", "clean")
    assert clean is not None
    broken = BenchReport(
        config=quick_report.config,
        rows=[
            dataclasses.replace(r, duplicates=1, runs_with_duplicates=1) if r is clean else r
            for r in quick_report.rows
        ],
        runs=quick_report.runs,
    )

    assert check_targets(broken) == ["clean: no duplicate side effects: 1 duplicates in 1 runs"]
    assert any(t.status == "missed" for t in evaluate_targets(broken))
