"""Verified replanning around broken tools, and human escalation through interrupt()."""

from __future__ import annotations

import json
from typing import Any

import pytest
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.types import Command

from langgraph_resilience import EVENT_KEY, ResiliencePolicy, ToolProfile
from langgraph_resilience.testing import Fault, FaultyTool, ScriptedChatModel, text, tool_calls
from tests.conftest import Runner, build_graph


@tool
def get_weather(city: str) -> str:
    """Weather for a city (the old endpoint)."""
    return f"sunny in {city}"


@tool
def geocode(city: str) -> dict[str, float]:
    """Coordinates of a city."""
    return {"lat": 59.91, "lon": 10.75}


@tool
def weather_v2(lat: float, lon: float) -> str:
    """Weather at coordinates."""
    return f"12C at {lat},{lon}"


@tool
def air_quality(lat: float, lon: float) -> str:
    """Air quality at coordinates."""
    return f"AQI 21 at {lat},{lon}"


@tool
def refund(order_id: int, amount: float) -> str:
    """Refund an order."""
    return f"refunded {amount} on {order_id}"


GOOD_PLAN: dict[str, Any] = {
    "diagnosis": {
        "failed_tool": "get_weather",
        "failure_class": "structural",
        "cause": "get_weather answered 410 Gone: the endpoint was removed",
    },
    "rationale": "geocode resolves Oslo to coordinates, then weather_v2 serves the forecast",
    "steps": [
        {"id": "geo", "tool": "geocode", "args": {"city": "Oslo"}},
        {
            "id": "wx",
            "tool": "weather_v2",
            "args": {"lat": "$steps.geo.output.lat", "lon": "$steps.geo.output.lon"},
            "depends_on": ["geo"],
        },
    ],
}


def planner(*plans: dict[str, Any]) -> ScriptedChatModel:
    return ScriptedChatModel(responses=[tool_calls(("Plan", p)) for p in plans])


def tool_messages(state: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in state["messages"] if isinstance(m, ToolMessage)]


def test_removed_tool_is_replanned_around(runner: Runner) -> None:
    """get_weather gone (410): geocode -> weather_v2 runs in order; get_weather never again."""
    gone = FaultyTool(get_weather, then=Fault.status(410))
    geo, wx = FaultyTool(geocode), FaultyTool(weather_v2)
    plans = planner(GOOD_PLAN)
    h = build_graph(
        [gone, geo, wx],
        [tool_calls(("get_weather", {"city": "Oslo"})), text("12C in Oslo")],
        planner_model=plans,
    )

    out = runner.invoke(h.app, {"messages": [("user", "weather in Oslo?")]}, h.config())

    assert (gone.calls, geo.executions, wx.executions) == (1, 1, 1)
    contents = [m.content for m in tool_messages(out)]
    assert contents[-1] == "12C at 59.91,10.75"
    replaced = json.loads(str(tool_messages(out)[0].content))
    assert replaced["failure_class"] == "structural"
    assert replaced["context"]["replanned"]["steps"] == ["geo: geocode", "wx: weather_v2"]
    assert out["messages"][-1].content == "12C in Oslo"
    assert out["resilience"]["plan"]["status"] == "completed"
    assert plans.calls == 1
    assert "get_weather" in plans.received[0][-1].text


def test_independent_plan_steps_share_one_super_step(runner: Runner) -> None:
    """Two steps depending only on geocode are issued together and run in one tools step."""
    plan = {
        **GOOD_PLAN,
        "rationale": "geocode resolves Oslo, then weather_v2 and air_quality use the coordinates",
        "steps": [
            *GOOD_PLAN["steps"],
            {
                "id": "aq",
                "tool": "air_quality",
                "args": {"lat": "$steps.geo.output.lat", "lon": "$steps.geo.output.lon"},
                "depends_on": ["geo"],
            },
        ],
    }
    h = build_graph(
        [FaultyTool(get_weather, then=Fault.status(410)), geocode, weather_v2, air_quality],
        [tool_calls(("get_weather", {"city": "Oslo"})), text("done")],
        planner_model=planner(plan),
    )

    chunks = runner.stream(h.app, {"messages": [("user", "x")]}, h.config(), stream_mode="updates")

    tool_steps = [
        sorted(m.name for m in c["tools"]["messages"])
        for c in chunks
        if "tools" in c and c["tools"]["messages"]
    ]
    assert ["air_quality", "weather_v2"] in tool_steps


def test_invalid_plans_exhaust_max_replans_then_escalate(runner: Runner) -> None:
    """A planner proposing only bad plans is asked exactly max_replans times, then a human."""
    blind = {**GOOD_PLAN, "diagnosis": {**GOOD_PLAN["diagnosis"], "cause": ""}}
    repeat = {**GOOD_PLAN, "steps": [{"id": "a", "tool": "get_weather", "args": {"city": "Oslo"}}]}
    plans = planner(blind, repeat, blind)
    h = build_graph(
        [FaultyTool(get_weather, then=Fault.status(410)), geocode, weather_v2],
        [tool_calls(("get_weather", {"city": "Oslo"})), text("skipped it")],
        planner_model=plans,
        escalate=True,
        policy=ResiliencePolicy(max_replans=2),
    )
    config = h.config()

    out = runner.invoke(h.app, {"messages": [("user", "x")]}, config)

    assert plans.calls == 2
    [request] = [i.value for i in out["__interrupt__"]]
    assert request["type"] == "resilience_escalation"
    assert request["tool"] == "get_weather"
    assert "rejected" not in request  # the request is about the call, not the planner
    second_prompt = plans.received[1][-1].text
    assert "empty_diagnosis" in second_prompt or "diagnosis" in second_prompt

    done = runner.invoke(h.app, Command(resume={"action": "skip", "note": "no weather"}), config)

    assert done["messages"][-1].content == "skipped it"
    envelope = json.loads(str(tool_messages(done)[-1].content))
    assert envelope["context"]["human_decision"] == "skip"
    assert envelope["context"]["note"] == "no weather"


def test_policy_failure_interrupts_and_edit_runs_once(runner: Runner) -> None:
    """403 never reaches a retry or the planner: a human edits the args; it runs once more."""
    guarded = FaultyTool(refund, [Fault.status(403)])
    plans = planner()
    h = build_graph(
        [guarded],
        [tool_calls(("refund", {"order_id": 7, "amount": 80.0})), text("refunded 40")],
        planner_model=plans,
        escalate=True,
    )
    config = h.config()

    out = runner.invoke(h.app, {"messages": [("user", "refund 80")]}, config)

    assert guarded.calls == 1
    assert plans.calls == 0
    assert h.clock.sleeps == []
    request = out["__interrupt__"][0].value
    assert request["envelope"]["failure_class"] == "policy"

    done = runner.invoke(
        h.app, Command(resume={"action": "edit", "args": {"order_id": 7, "amount": 40.0}}), config
    )

    assert guarded.calls == 2
    assert guarded.executions == 1
    assert tool_messages(done)[-1].content == "refunded 40.0 on 7"
    assert done["messages"][-1].content == "refunded 40"


@pytest.mark.parametrize(
    ("answer", "problem"),
    [
        ({"action": "edit"}, "needs 'args'"),
        ({"action": "approve"}, "Input should be"),
        ("yes", "invalid answer"),
    ],
)
def test_invalid_resume_value_keeps_the_thread_interrupted(
    runner: Runner, answer: Any, problem: str
) -> None:
    """A bad answer re-interrupts with an error saying why; a good one then still works."""
    h = build_graph(
        [FaultyTool(refund, [Fault.status(403)])],
        [tool_calls(("refund", {"order_id": 7, "amount": 80.0})), text("ok")],
        escalate=True,
    )
    config = h.config()
    runner.invoke(h.app, {"messages": [("user", "x")]}, config)

    again = runner.invoke(h.app, Command(resume=answer), config)

    assert problem in again["__interrupt__"][0].value["error"]
    assert h.app.get_state(config).next == ("escalate",)
    done = runner.invoke(h.app, Command(resume={"action": "retry"}), config)
    assert done["messages"][-1].content == "ok"


def test_abort_ends_the_thread_with_every_call_answered(runner: Runner) -> None:
    """Abort answers the call, marks the ledger aborted and ends without the agent."""
    h = build_graph(
        [FaultyTool(refund, [Fault.status(401)])],
        [tool_calls(("refund", {"order_id": 7, "amount": 80.0})), text("unreachable")],
        escalate=True,
    )
    config = h.config()
    runner.invoke(h.app, {"messages": [("user", "x")]}, config)

    out = runner.invoke(h.app, Command(resume={"action": "abort"}), config)

    assert out["resilience"]["task"]["aborted"] is True
    assert isinstance(out["messages"][-1], ToolMessage)
    assert h.model.calls == 1
    assert h.app.get_state(config).next == ()


def test_planner_sees_no_unanswered_tool_calls(runner: Runner) -> None:
    """Every AIMessage with tool calls is answered before the next one: valid for providers."""
    h = build_graph(
        [FaultyTool(get_weather, then=Fault.status(410)), geocode, weather_v2],
        [tool_calls(("get_weather", {"city": "Oslo"})), text("ok")],
        planner_model=planner(GOOD_PLAN),
    )
    out = runner.invoke(h.app, {"messages": [("user", "x")]}, h.config())

    pending: set[str] = set()
    for message in out["messages"]:
        if isinstance(message, AIMessage):
            assert not pending, f"new AIMessage while {pending} unanswered"
            pending = {c["id"] for c in message.tool_calls if c["id"]}
        elif isinstance(message, ToolMessage):
            pending.discard(message.tool_call_id)
    assert not pending


def test_plan_events_are_streamed(runner: Runner) -> None:
    """The custom stream shows the verdict and each plan layer."""
    h = build_graph(
        [FaultyTool(get_weather, then=Fault.status(410)), geocode, weather_v2],
        [tool_calls(("get_weather", {"city": "Oslo"})), text("ok")],
        planner_model=planner(GOOD_PLAN),
    )
    chunks = runner.stream(h.app, {"messages": [("user", "x")]}, h.config(), stream_mode="custom")
    kinds = [c[EVENT_KEY] for c in chunks]
    assert "replan_needed" in kinds
    verdict = next(c for c in chunks if c[EVENT_KEY] == "plan_verdict")
    assert verdict["accepted"] is True
    assert [c["issue"] for c in chunks if c[EVENT_KEY] == "plan_step"] == [
        ["geocode"],
        ["weather_v2"],
        [],
    ]


def test_a_plan_that_repeats_a_done_side_effect_is_rejected(runner: Runner) -> None:
    """The refund already happened; a plan that refunds again (a new call id, so a new
    idempotency key) is rejected, and the next plan runs: one refund in all."""
    paid = FaultyTool(refund)
    again = {
        **GOOD_PLAN,
        "steps": [
            *GOOD_PLAN["steps"],
            {"id": "r", "tool": "refund", "args": {"order_id": 7, "amount": 5.0}},
        ],
    }
    plans = planner(again, GOOD_PLAN)
    h = build_graph(
        [FaultyTool(get_weather, then=Fault.status(410)), geocode, weather_v2, paid],
        [
            tool_calls(("refund", {"order_id": 7, "amount": 5})),
            tool_calls(("get_weather", {"city": "Oslo"})),
            text("refunded; 12C"),
        ],
        planner_model=plans,
        profiles={"refund": ToolProfile(side_effect=True)},
    )

    out = runner.invoke(h.app, {"messages": [("user", "refund 7, then weather")]}, h.config())

    assert paid.executions == 1
    assert plans.calls == 2
    assert "repeated_side_effect" in plans.received[1][-1].text
    assert out["resilience"]["plan"]["status"] == "completed"


def test_plan_steps_are_not_judged_by_the_agent_loop_guard(runner: Runner) -> None:
    """The agent looked Oslo up twice (the loop guard's limit); the verified plan looks it
    up again, which is the plan's business, not a stuck agent: the plan completes."""
    geo = FaultyTool(geocode)
    h = build_graph(
        [FaultyTool(get_weather, then=Fault.status(410)), geo, weather_v2],
        [
            tool_calls(("geocode", {"city": "Oslo"})),
            tool_calls(("geocode", {"city": "Oslo"})),
            tool_calls(("get_weather", {"city": "Oslo"})),
            text("12C in Oslo"),
        ],
        planner_model=planner(GOOD_PLAN),
    )

    out = runner.invoke(h.app, {"messages": [("user", "weather in Oslo?")]}, h.config())

    assert geo.executions == 3
    assert out["resilience"]["plan"]["status"] == "completed"
    assert out["resilience"]["events"].get("loop_detected", 0) == 0


@tool
def weather_eu(city: str) -> str:
    """Weather for a European city (a mirror of the old endpoint)."""
    return f"mild in {city}"


def test_the_planner_may_diagnose_the_primary_that_a_fallback_stood_in_for(
    runner: Runner,
) -> None:
    """get_weather and its fallback weather_eu both stay down (503): the plan's diagnosis
    names get_weather, which did fail in this thread, and is accepted at once."""
    down = {
        **GOOD_PLAN,
        "diagnosis": {
            "failed_tool": "get_weather",
            "failure_class": "transient",
            "cause": "get_weather kept answering 503 Service Unavailable, and so did weather_eu",
        },
    }
    plans = planner(down)
    h = build_graph(
        [
            FaultyTool(get_weather, then=Fault.status(503)),
            FaultyTool(weather_eu, then=Fault.status(503)),
            geocode,
            weather_v2,
        ],
        [tool_calls(("get_weather", {"city": "Oslo"})), text("12C in Oslo")],
        planner_model=plans,
        profiles={"get_weather": ToolProfile(fallback="weather_eu")},
        policy=ResiliencePolicy(max_attempts=2),
    )

    out = runner.invoke(h.app, {"messages": [("user", "weather in Oslo?")]}, h.config())

    assert plans.calls == 1
    assert out["resilience"]["plan"]["status"] == "completed"
    request = plans.received[0][-1].text
    assert '"tool": "get_weather"' in request
    assert '"tool": "weather_eu"' in request


def test_each_question_to_a_human_is_announced_once(runner: Runner) -> None:
    """Two refusals in one turn: each escalation event is streamed when its question is
    put, not again when the resumed node re-runs past the answered ones."""
    guarded = FaultyTool(refund, [Fault.status(403), Fault.status(403)])
    h = build_graph(
        [guarded],
        [
            tool_calls(
                ("refund", {"order_id": 7, "amount": 1.0}),
                ("refund", {"order_id": 8, "amount": 2.0}),
            ),
            text("both skipped"),
        ],
        escalate=True,
    )
    config = h.config()
    streamed: list[dict[str, Any]] = []

    def run(inp: Any) -> None:
        streamed.extend(runner.stream(h.app, inp, config, stream_mode="custom"))

    run({"messages": [("user", "refund both")]})
    run(Command(resume={"action": "skip"}))
    run(Command(resume={"action": "skip"}))

    asked = [e["call_id"] for e in streamed if e.get(EVENT_KEY) == "escalation"]
    assert len(asked) == 2
    assert len(set(asked)) == 2
    assert h.app.get_state(config).values["messages"][-1].content == "both skipped"


def test_an_edit_the_tool_would_reject_is_asked_again(runner: Runner) -> None:
    """A human's edit goes through the tool's schema first: a wrong type, or another tool's
    fields, interrupts again with the error; nothing runs until the edit is valid."""
    guarded = FaultyTool(refund, [Fault.status(403)])
    h = build_graph(
        [guarded],
        [tool_calls(("refund", {"order_id": 7, "amount": 80.0})), text("refunded 40")],
        escalate=True,
    )
    config = h.config()
    runner.invoke(h.app, {"messages": [("user", "refund 80")]}, config)

    for bad in ({"order_id": "seven", "amount": 40.0}, {"sku": "LAMP-7"}):
        out = runner.invoke(h.app, Command(resume={"action": "edit", "args": bad}), config)
        [pending] = out["__interrupt__"]
        assert "invalid answer" in pending.value["error"]
        assert guarded.calls == 1

    done = runner.invoke(
        h.app, Command(resume={"action": "edit", "args": {"order_id": 7, "amount": 40.0}}), config
    )
    assert guarded.executions == 1
    assert done["messages"][-1].content == "refunded 40"


def test_an_answer_meant_for_another_call_is_refused(runner: Runner) -> None:
    """An answer names the call it is for (``call_id``, as the command's answers do): one
    for another call is asked again with the error, never applied to this call."""
    guarded = FaultyTool(refund, [Fault.status(403)])
    h = build_graph(
        [guarded],
        [tool_calls(("refund", {"order_id": 7, "amount": 80.0})), text("refunded 40")],
        escalate=True,
    )
    config = h.config()
    out = runner.invoke(h.app, {"messages": [("user", "refund 80")]}, config)
    [asked] = out["__interrupt__"]
    edit = {"action": "edit", "args": {"order_id": 7, "amount": 40.0}}

    out = runner.invoke(h.app, Command(resume={**edit, "call_id": "another-call"}), config)
    [pending] = out["__interrupt__"]
    assert "it is for call 'another-call'" in pending.value["error"]
    assert guarded.calls == 1

    done = runner.invoke(h.app, Command(resume={**edit, "call_id": asked.value["call_id"]}), config)
    assert guarded.executions == 1
    assert done["messages"][-1].content == "refunded 40"


def test_a_human_asked_about_a_call_that_never_ran_sees_its_arguments(
    runner: Runner,
) -> None:
    """A call answered before it runs (here the third identical look-up, a loop) and
    handed to a human: the question shows the arguments the agent asked for."""
    ask = tool_calls(("get_weather", {"city": "Oslo"}))
    h = build_graph([get_weather], [ask, ask, ask, text("ok")], escalate=True)
    config = h.config()
    runner.invoke(h.app, {"messages": [("user", "weather in Oslo?")]}, config)

    [pending] = h.app.get_state(config).interrupts
    assert pending.value["reason"] == "loop"
    assert pending.value["args"] == {"city": "Oslo"}


@pytest.mark.parametrize(
    "stop",
    ["max_tool_attempts", "deadline"],
)
def test_a_humans_retry_runs_the_call_once_past_a_spent_task_budget(
    runner: Runner, stop: str
) -> None:
    """The task's budget is spent when the human answers (its one tool attempt went to
    the refused call, or its deadline passed while the human thought): "retry" still
    runs the call once more, as an edit would. It used to be stopped before it ran and
    put to the human again, unchanged, for as long as they kept answering "retry"."""
    guarded = FaultyTool(refund, [Fault.status(403), Fault.status(403)])
    spent = ResiliencePolicy(max_attempts=1, max_tool_attempts=1)
    policy = spent if stop == "max_tool_attempts" else ResiliencePolicy(deadline=60)
    h = build_graph(
        [guarded],
        [tool_calls(("refund", {"order_id": 7, "amount": 80.0})), text("could not refund")],
        policy=policy,
        escalate=True,
    )
    config = h.config()
    runner.invoke(h.app, {"messages": [("user", "refund 80")]}, config)
    for ran in (2, 3):  # each "retry" runs it; it is refused again, and asked again
        [pending] = h.app.get_state(config).interrupts
        assert pending.value["reason"] == "policy"
        h.clock.advance(3600)  # an hour later: past any deadline
        runner.invoke(h.app, Command(resume={"action": "retry"}), config)
        assert guarded.calls == ran

    done = runner.invoke(h.app, Command(resume={"action": "skip"}), config)
    assert done["messages"][-1].content == "could not refund"
    assert len(tool_messages(done)) == 1


def test_past_the_threads_lifetime_cap_a_human_may_only_skip_or_abort(runner: Runner) -> None:
    """The thread's lifetime cap is an operator's ceiling, not the task's budget: a human
    asked about a call it stopped is offered skip and abort only, and a "retry" is
    refused with the reason (the question stays, the call does not run)."""
    guarded = FaultyTool(refund, [Fault.status(403)])
    h = build_graph(
        [guarded],
        [tool_calls(("refund", {"order_id": 7, "amount": 80.0})), text("could not refund")],
        policy=ResiliencePolicy(max_attempts=1, max_thread_tool_attempts=1),
        escalate=True,
    )
    config = h.config()
    runner.invoke(h.app, {"messages": [("user", "refund 80")]}, config)
    runner.invoke(h.app, Command(resume={"action": "retry"}), config)  # the 403: let it run
    [pending] = h.app.get_state(config).interrupts
    assert pending.value["reason"] == "max_thread_tool_attempts"
    assert set(pending.value["options"]) == {"skip", "abort"}

    runner.invoke(h.app, Command(resume={"action": "retry"}), config)
    [pending] = h.app.get_state(config).interrupts
    assert "lifetime cap (max_thread_tool_attempts=1) is spent" in pending.value["error"]
    assert guarded.calls == 1

    done = runner.invoke(h.app, Command(resume={"action": "skip"}), config)
    assert done["messages"][-1].content == "could not refund"
    assert guarded.calls == 1
