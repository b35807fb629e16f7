"""The chaos harness, the task suite and the benchmark built on them."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import io
import json
import pathlib
import sys
from collections import Counter
from typing import Any

import httpx
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import BaseTool, tool
from pydantic import ValidationError
from rich.console import Console

from benchmarks.chaos.bench import Job, cmd_bench, default_out_dir, run_bench, run_jobs
from benchmarks.chaos.contenders import (
    CONTENDERS,
    DEMO_BREAKER,
    RESILIENT_POLICY,
    BuildContext,
    Built,
    Contender,
    build_resilient,
)
from benchmarks.chaos.mixes import MIXES, QUICK_CONVERSATIONS, QUICK_MIXES, Mix, quick_tasks
from benchmarks.chaos.report import print_report
from benchmarks.chaos.runs import run_task
from benchmarks.chaos.targets import BenchReport, check_targets, evaluate_targets
from benchmarks.chaos.tasks import (
    ABORT_ANSWER,
    CONVERSATIONS,
    TASKS,
    AgentStyle,
    Shop,
    agent_reply,
    extra_effects,
    judge,
    operator_decision,
    oracle,
    planner_reply,
    repair_reply,
    scripted_planner,
)
from langgraph_resilience import ToolProfile
from langgraph_resilience._graph.exactly_once import effect_context
from langgraph_resilience.cli import main
from langgraph_resilience.core import classify
from langgraph_resilience.core.breaker import BreakerConfig
from langgraph_resilience.core.effects import EffectStatus
from langgraph_resilience.core.partial import as_partial_result
from langgraph_resilience.core.plan import Plan, format_plan_request, verify
from langgraph_resilience.core.policy import ResiliencePolicy
from langgraph_resilience.errors import ConfigurationError, FailureClass, ToolError
from langgraph_resilience.testing import FakeClock, FakeHTTPError
from langgraph_resilience.testing.faults import (
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
    "connect_timeout",
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


def test_connect_timeout_is_httpx_s_and_raised_before_the_tool_runs() -> None:
    """connect_timeout raises httpx.ConnectTimeout without running the tool; the package
    reads it as a request that never left, so even a side effect may be retried."""
    lookup, _, ledger, clock = chaos("connect_timeout")

    with pytest.raises(httpx.ConnectTimeout) as raised:
        lookup.invoke({"order_id": 1})

    assert ledger.effects == []
    assert clock.monotonic() == pytest.approx(5.05)
    verdict = classify(raised.value, profile=ToolProfile(side_effect=True))
    assert verdict.failure_class is FailureClass.TRANSIENT
    assert verdict.context["sent"] is False


ONE_CALL = BreakerConfig(window_size=1, minimum_calls=1)
"""A breaker that opens on one failed (logical) call."""


def tool_call(call_id: str, order_id: int = 1) -> dict[str, Any]:
    return {"name": "lookup", "args": {"order_id": order_id}, "id": call_id, "type": "tool_call"}


def test_shadow_breaker_counts_a_retried_call_once() -> None:
    """Two failed attempts and a success of one call are one successful call for the
    shadow, as for the package's breakers: a one-call breaker stays closed. Counted per
    attempt it would have refused the retry."""
    [lookup, _] = inject(
        make_tools(Ledger()), FaultPlan.of(burst("http_503", length=2)), 1, breaker=ONE_CALL
    )
    assert isinstance(lookup, ChaosTool)
    for _ in range(2):
        with pytest.raises(FakeHTTPError):
            lookup.invoke(tool_call("c1"))
    lookup.invoke(tool_call("c1"))
    lookup.invoke(tool_call("c2"))

    assert (lookup.calls_while_open, lookup.shadow_opens) == (0, 0)


def test_shadow_breaker_counts_a_failed_call_once_it_left_the_tool() -> None:
    """A call whose three attempts failed counts one failure from the caller's next turn
    (epoch) on: the new call of that turn is one the breaker would refuse."""
    epoch = [1]
    [lookup, _] = inject(
        make_tools(Ledger()),
        FaultPlan.of(persistent("http_503")),
        1,
        breaker=ONE_CALL,
        epoch=lambda: epoch[0],
    )
    assert isinstance(lookup, ChaosTool)
    for _ in range(3):
        with pytest.raises(FakeHTTPError):
            lookup.invoke(tool_call("c1"))
    assert lookup.calls_while_open == 0
    epoch[0] = 2
    with pytest.raises(FakeHTTPError):
        lookup.invoke(tool_call("c2"))

    assert (lookup.calls_while_open, lookup.shadow_opens) == (1, 1)


def test_shadow_breaker_sees_a_call_leave_for_its_fallback() -> None:
    """The same call id reaching another tool (a fallback) shows the call left: a later
    call of the same turn to the failed tool counts as one made while open."""
    [lookup, notify] = inject(
        make_tools(Ledger()),
        FaultPlan.of(persistent("http_503", tools=("lookup",))),
        1,
        breaker=ONE_CALL,
        epoch=lambda: 1,
    )
    assert isinstance(lookup, ChaosTool)
    with pytest.raises(FakeHTTPError):
        lookup.invoke(tool_call("c1"))
    notify.invoke({**tool_call("c1"), "name": "notify", "args": {"to": ["a"], "subject": "s"}})
    with pytest.raises(FakeHTTPError):
        lookup.invoke(tool_call("c2", order_id=2))

    assert lookup.calls_while_open == 1


def test_a_reused_call_id_is_a_new_call_in_a_new_epoch() -> None:
    """Per-message ids (call_0 every turn): attempts are grouped per id and epoch, so two
    turns' call_0 are two calls of one attempt each, not one call retried."""
    epoch = [1]
    [lookup, _] = inject(
        make_tools(Ledger()), FaultPlan.of(single("http_503")), 1, epoch=lambda: epoch[0]
    )
    with pytest.raises(FakeHTTPError):
        lookup.invoke(tool_call("call_0"))
    lookup.invoke(tool_call("call_0"))  # a retry of the same call
    epoch[0] = 2
    lookup.invoke(tool_call("call_0"))  # the next turn's call_0

    stats = chaos_stats([lookup])
    assert (stats.max_attempts_per_call, stats.attempts_by_call) == (2, {"lookup:call_0": 2})
    assert [e.epoch for e in stats_log(lookup)] == [1, 1, 2]


def stats_log(tool_: BaseTool) -> list[Any]:
    assert isinstance(tool_, ChaosTool)
    return tool_.log


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
    with effect_context("key-1", None):  # what the tools node does around a side effect
        placed = shop.create_order("c1", "lamp", 2)

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


def test_reissuing_agent_asks_once_more_even_where_the_step_aborts() -> None:
    """buy-3's order step says abort: the plain agent gives up on the first error; the
    re-issuing one sends the same call (tool, arguments) once more under a new id."""
    task = next(t for t in TASKS if t.id == "buy-3")
    style = AgentStyle(reissue=True)
    messages: list[Any] = [HumanMessage(task.prompt)]
    for _ in range(2):  # customer, stock
        messages += answered(agent_reply(task, messages, style), json.dumps({"ok": 1}))
    first = agent_reply(task, messages, style)
    assert first.tool_calls[0]["name"] == "create_order"
    messages += answered(first, "lost", status="error")

    assert agent_reply(task, messages).content == ABORT_ANSWER  # the plain agent
    again = agent_reply(task, messages, style)
    [(call, retry)] = zip(first.tool_calls, again.tool_calls, strict=True)
    assert (retry["name"], retry["args"]) == (call["name"], call["args"])
    assert retry["id"] != call["id"]
    messages += answered(again, "lost", status="error")
    assert agent_reply(task, messages, style).content == ABORT_ANSWER


def test_per_message_ids_restart_at_call_0_and_the_agent_keeps_track() -> None:
    """Ids per message: trip-0's three geocodes are call_0..call_2 and the weather calls
    call_0..call_2 again; a failed one comes back as call_0 of the next message, and the
    answers are paired with the right calls."""
    task = next(t for t in TASKS if t.id == "trip-0")
    style = AgentStyle(ids="per_message")
    shop = Shop()
    messages: list[Any] = [HumanMessage(task.prompt)]
    messages += answered(agent_reply(task, messages, style), json.dumps(shop.get_customer("c1")))
    geos = agent_reply(task, messages, style)
    assert [c["id"] for c in geos.tool_calls] == ["call_0", "call_1", "call_2"]
    cities = [c["args"]["city"] for c in geos.tool_calls]
    messages += [
        geos,
        ToolMessage(json.dumps(shop.geocode(cities[0])), tool_call_id="call_0"),
        ToolMessage("503", tool_call_id="call_1", status="error"),
        ToolMessage(json.dumps(shop.geocode(cities[2])), tool_call_id="call_2"),
    ]
    retry = agent_reply(task, messages, style)
    assert [(c["id"], c["args"]) for c in retry.tool_calls] == [("call_0", {"city": cities[1]})]
    messages += answered(retry, json.dumps(shop.geocode(cities[1])))
    weather = agent_reply(task, messages, style)
    lats = [c["args"]["lat"] for c in weather.tool_calls]
    assert lats == [shop.geocode(city)["lat"] for city in cities]


def test_in_a_conversation_the_agent_works_on_the_latest_request() -> None:
    """After a task's answer, the next human message starts the next task, from scratch:
    the same lookup is issued again."""
    conversation = next(c for c in CONVERSATIONS if c.id == "conv-regular")
    first, second = conversation.turns[0], conversation.turns[1]
    messages: list[Any] = [HumanMessage(first.prompt)]
    call = agent_reply(conversation, messages)
    messages += answered(call, json.dumps(Shop().get_customer("c1")))
    messages += [AIMessage("done"), HumanMessage(second.prompt)]
    again = agent_reply(conversation, messages)

    assert (again.tool_calls[0]["name"], again.tool_calls[0]["args"]) == (
        call.tool_calls[0]["name"],
        call.tool_calls[0]["args"],
    )
    assert again.tool_calls[0]["id"] != call.tool_calls[0]["id"]
    assert again.tool_calls[0]["id"].startswith(f"cust~{second.id}.")


def test_conversations_are_long_and_repeat_themselves() -> None:
    """Each conversation repeats calls of earlier turns; the shift asks for more tool
    calls than one task's budget; their oracles run the tasks in order on one shop, and
    an effect asked for twice is not a duplicate."""
    assert all(c.repeats() > 0 and len(c.turns) >= 9 for c in CONVERSATIONS)
    shift = next(c for c in CONVERSATIONS if c.id == "conv-shift")
    assert shift.calls > RESILIENT_POLICY.max_tool_attempts
    regular = next(c for c in CONVERSATIONS if c.id == "conv-regular")
    truth = oracle(regular)
    assert truth.duplicate_effects == 2  # restock-0 asked twice: desk and kettle again
    shop = Shop()
    for _ in range(2):
        shop.restock("desk", 10)
        shop.restock("kettle", 10)
    assert extra_effects(regular, shop) == 0
    shop.restock("desk", 10)
    assert extra_effects(regular, shop) == 1
    assert not judge(regular, Shop(), list(truth.answers))


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


def task_named(task_id: str) -> Any:
    return next(t for t in [*TASKS, *CONVERSATIONS] if t.id == task_id)


def test_a_re_issue_after_a_lost_answer_is_a_duplicate_for_toolnode_not_for_the_package() -> None:
    """Lost answers of side effects, an agent that asks again under a new id: ToolNode
    runs the re-issue (a second order, refund, email); the package, told the earlier
    call's outcome is unknown, reconciles it or does not run the re-issue blindly."""
    mix = MIXES["reissue"]
    runs = [(t, s) for t in ("buy-0", "ten-effects-0", "reorder-0") for s in (0, 1)]
    plain = [run_task(CONTENDERS["toolnode"], task_named(t), mix, s) for t, s in runs]
    ours = [run_task(CONTENDERS["resilient_unattended"], task_named(t), mix, s) for t, s in runs]

    assert sum(r.duplicates for r in plain) > 0
    assert sum(r.duplicates for r in ours) == 0
    assert sum(r.refused_calls for r in ours) > 0  # re-issues it would not run blindly
    assert all(r.unanswered_calls == 0 for r in ours)


def test_a_human_retry_of_a_lost_effect_asks_the_status_service_first() -> None:
    """buy-0's confirmation email is sent but its answer is lost; the status service is
    down for the call's three tries (a check is retried like a read), so (d) escalates;
    the operator answers retry. The status service is up again: asked, it says the
    email went out, so it is not sent twice."""
    down = [3]

    def build(ctx: BuildContext) -> Built:
        def status_check(key: str) -> EffectStatus:
            if down[0]:
                down[0] -= 1
                raise FakeHTTPError(503)
            return ctx.shop.status_check(key)

        app = build_resilient(
            ctx.tools,
            ctx.model,
            clock=ctx.clock,
            seed=ctx.seed,
            checkpointer=ctx.checkpointer,
            status_check=status_check,
        )
        return Built(app, [])

    plan = FaultPlan.of(single("timeout_after_commit", tools=("send_email",)))
    mix = Mix("lost-email", "unknown", plan, "", agent=AgentStyle(reissue=True))
    run = run_task(Contender("flaky-status", "flaky", build, True), task_named("buy-0"), mix, 0)

    assert (run.escalations, run.human_retries) == (1, ("mail~buy-0.3",))
    assert (run.duplicates, run.success) == (0, True)


def test_one_approved_retry_runs_a_lost_effect_once_more_not_until_it_answers() -> None:
    """The status service is down all along and the email's answer is lost six times in
    a row: the operator's one 'retry' allows one more send, not six (7 sends today)."""

    def build(ctx: BuildContext) -> Built:
        def status_check(key: str) -> EffectStatus:
            raise FakeHTTPError(503)

        app = build_resilient(
            ctx.tools,
            ctx.model,
            clock=ctx.clock,
            seed=ctx.seed,
            checkpointer=ctx.checkpointer,
            status_check=status_check,
        )
        return Built(app, [])

    plan = FaultPlan.of(burst("timeout_after_commit", length=6, tools=("send_email",)))
    mix = Mix("lost-six-times", "unknown", plan, "")
    run = run_task(Contender("status-down", "down", build, True), task_named("buy-0"), mix, 0)

    assert run.human_retries[:1] == ("mail~buy-0.3",)
    assert run.attempts_by_call.get("send_email:mail~buy-0.3", 1) <= 2
    assert run.duplicates <= 1


def test_per_message_ids_are_all_answered_and_change_nothing() -> None:
    """The same runs with ids numbered per message (call_0 in every assistant message):
    every call answered, and (d) does exactly what it does with unique ids."""
    runs = [(t, s) for t in ("buy-0", "trip-0", "ops-0", "ten-effects-0") for s in (0, 1)]
    for name in ("resilient", "resilient_unattended"):
        unique = [run_task(CONTENDERS[name], task_named(t), MIXES["reissue"], s) for t, s in runs]
        numbered = [
            run_task(CONTENDERS[name], task_named(t), MIXES["per_message_ids"], s) for t, s in runs
        ]
        assert all(r.unanswered_calls == 0 for r in numbered), name

        def outcome(r: Any) -> tuple[Any, ...]:
            return (r.success, r.duplicates, r.escalations, r.tool_calls, r.executions)

        assert [outcome(r) for r in numbered] == [outcome(r) for r in unique], name
        if name == "resilient_unattended":
            assert sum(r.duplicates for r in numbered) == 0


def test_a_long_conversation_runs_every_task_like_the_first() -> None:
    """conv-shift on one thread: more tool calls than one task's budget, the same lookups
    in up to seven turns; (d) runs every call on its tool and gets every turn right."""
    shift = task_named("conv-shift")
    run = run_task(CONTENDERS["resilient"], shift, MIXES["conversation"], 0)

    assert run.tool_calls > RESILIENT_POLICY.max_tool_attempts
    assert run.max_tool_calls_per_task <= RESILIENT_POLICY.max_tool_attempts
    assert (run.success, run.turns_ok, run.turns) == (True, len(shift.turns), len(shift.turns))
    assert (run.diverted_calls, run.duplicates) == (0, 0)


def test_the_conversation_mix_catches_a_budget_that_spans_the_thread() -> None:
    """The regression the conversation mix guards against: with the per-task tool budget
    as a thread-wide cap, the shift's last requests are refused."""
    thread_wide = dataclasses.replace(
        RESILIENT_POLICY, max_thread_tool_attempts=RESILIENT_POLICY.max_tool_attempts
    )
    assert isinstance(thread_wide, ResiliencePolicy)

    def build(ctx: BuildContext) -> Built:
        app = build_resilient(
            ctx.tools,
            ctx.model,
            clock=ctx.clock,
            seed=ctx.seed,
            checkpointer=ctx.checkpointer,
            status_check=ctx.status_check,
            policy=thread_wide,
        )
        return Built(app, [])

    contender = Contender("thread-budget", "thread budget", build, True)
    run = run_task(contender, task_named("conv-shift"), MIXES["conversation"], 0)

    assert not run.success
    assert run.refused_calls > 0


def test_background_faults_open_no_breaker_and_cost_no_success() -> None:
    """Random 429/503/connect timeouts at p=0.15 per attempt on every tool of a long
    conversation: (d)'s breakers never open and no call is made while one should be,
    though (a)'s calls, one attempt each, trip the same breaker; (d) is the best."""
    report = run_bench(
        quick=True,
        contenders=["toolnode", "create_agent", "resilient"],
        mixes=["background"],
        tasks=[task_named("weather-0")],  # the clean mix's, and the overhead timing's
        workers=1,
    )
    statuses = {t.name: t.status for t in report.targets}
    plain = report.row("toolnode", "background")
    ours = report.row("resilient", "background")
    assert plain is not None
    assert ours is not None

    assert report.config["mixes"] == ["clean", "conversation", "background"]
    assert (ours.breaker_opens, ours.calls_while_open, ours.duplicates) == (0, 0, 0)
    assert plain.shadow_opens > 0
    assert statuses["background: breakers never open under background faults"] == "met"
    assert statuses["background: success >= the best other contender"] == "met"
    assert ours.faults > 0
    assert check_targets(report) == []


def test_an_outage_opens_the_package_breaker_while_others_keep_calling() -> None:
    """get_weather is down (demo-sized breaker): (d)'s breaker opens on the first call
    that gives up, the other calls go to the fallback without touching get_weather; a
    breaker fed with ToolNode's calls would have refused its re-issues."""
    task = task_named("trip-0")
    ours = run_task(CONTENDERS["resilient"], task, MIXES["outage"], 0)
    plain = run_task(CONTENDERS["toolnode"], task, MIXES["outage"], 0)

    assert MIXES["outage"].breaker == DEMO_BREAKER
    assert (ours.success, ours.calls_while_open) == (True, 0)
    assert ours.breaker_opens >= 1
    assert plain.calls_while_open > 0


def test_same_seed_gives_identical_counts() -> None:
    """Two runs with the same seeds produce the same counts, run by run."""
    tasks = [t for t in TASKS if t.id in {"buy-0", "trip-0", "ten-reads-0", "announce-0"}]

    def once() -> BenchReport:
        return run_bench(
            quick=True,
            contenders=["toolnode", "resilient"],
            mixes=["transient", "schema_drift", "per_message_ids"],
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
    """check_targets passes on the quick run (what CI runs)."""
    assert check_targets(quick_report) == []
    assert {r.mix for r in quick_report.rows} == set(QUICK_MIXES)
    quick_ids = {t.id for t in quick_tasks()} | set(QUICK_CONVERSATIONS)
    assert {r.task for r in quick_report.runs} == quick_ids
    names = {t.name for t in quick_report.targets}
    assert {
        "reissue: no duplicate side effects",
        "per_message_ids: every tool call answered",
        "conversation: every task on one thread succeeds",
        "conversation: no call refused or diverted (loop guard, budgets per task)",
        "background: breakers never open under background faults",
    } <= names


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

    assert check_targets(broken) == [
        f"clean: no duplicate side effects: 1 duplicates over {clean.runs} runs (1 runs with any)",
        *check_targets(quick_report),
    ]
    assert any(t.status == "missed" for t in evaluate_targets(broken))


_BOX = "│┃┏┓┗┛┡┩┣┫━─┳┻╇╈╋┼┬┴├┤└┘┌┐═║╭╮╯╰"


def _rendered(report: BenchReport, width: int) -> str:
    out = io.StringIO()
    print_report(report, Console(file=out, width=width, color_system=None))
    return out.getvalue()


@pytest.mark.parametrize("width", [60, 80, 120])
def test_the_report_fits_the_terminal_without_splitting_a_word(
    quick_report: BenchReport, width: int
) -> None:
    """At `width` columns every line fits and every word is a word of the unwrapped
    report (no cell cut to ``…``, no word split): a compact table when the full one
    does not fit, with a line saying where the rest is."""
    wide = set(_rendered(quick_report, 1000).translate({ord(c): " " for c in _BOX}).split())
    wide |= {row.contender for row in quick_report.rows}  # the compact table's short names
    text = _rendered(quick_report, width)
    assert [line for line in text.splitlines() if len(line) > width] == []
    body = "\n".join(line for line in text.splitlines() if "JSON report" not in line)
    words = body.translate({ord(c): " " for c in _BOX}).split()
    assert "…" not in text
    assert [w for w in words if w not in wide and not w.isdigit()] == []
    assert "resilient" in text or "add_resilience" in text


def test_without_out_the_report_goes_to_a_dated_folder_it_names(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`bench` without --out writes into ./chaos-bench-<date-time> and says so; with no
    matplotlib it says in one line why there is no chart."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` fails
    args = argparse.Namespace(
        quick=True, contenders=["resilient"], mix=["transient"], seeds=1, out=None
    )
    text = io.StringIO()
    assert cmd_bench(args, Console(file=text, width=200)) == 0
    [folder] = tmp_path.glob("chaos-bench-*")
    assert (folder / "chaos-bench.json").is_file()
    assert not (folder / "chaos-bench.png").exists()
    assert f"wrote {folder / 'chaos-bench.json'}" in text.getvalue()
    assert "no chart: matplotlib is not installed" in text.getvalue()
    when = dt.datetime(2026, 12, 1, 9, 5, 7, tzinfo=dt.UTC)
    assert default_out_dir(when).name == "chaos-bench-20261201-090507"


@pytest.mark.parametrize("workers", [1, 2])
def test_the_progress_hears_of_every_job_once(workers: int) -> None:
    """The live progress display advances once per finished job, by its task count,
    whichever process ran it; the results still come back in job order."""
    tasks = tuple(quick_tasks()[:2])
    jobs = [Job("resilient", "clean", seed, tasks) for seed in range(3)]
    heard: list[tuple[int, int]] = []

    def done(job: Job) -> None:
        heard.append((job.seed, len(job.tasks)))

    ran = run_jobs(jobs, workers, done)
    assert sorted(heard) == [(0, 2), (1, 2), (2, 2)]
    assert [[r.task for r in batch] for batch in ran] == [[t.id for t in tasks]] * 3
