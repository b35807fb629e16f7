"""Structural-failure benchmark: does verified replanning avoid blind trial and error?

Each scenario is a task whose tool (``get_weather``) is gone (410). A scripted
planner proposes a seeded mix of bad plans before (maybe) a good one: blind
swaps back to the broken tool with other arguments, exact repeats of the failed
call, cycles, unknown tools and empty diagnoses. The graph is built with
``add_resilience(..., planner_model=..., escalate=True, policy=ResiliencePolicy(max_replans=2))``.

Reported: tasks completed by a verified plan, escalations to a human, plans
rejected by the verifier and why, and executions of the broken tool after its
first failure (target: 0).

    python benchmarks/replanning.py [--scenarios 60] [--seed 3]
"""

from __future__ import annotations

import argparse
import collections
import json
import random
import uuid
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import MessagesState, StateGraph

from langgraph_resilience import EVENT_KEY, ResiliencePolicy, ResilienceState, add_resilience
from langgraph_resilience.testing import (
    FakeClock,
    Fault,
    FaultyTool,
    ScriptedChatModel,
    text,
    tool_calls,
)


class State(MessagesState, ResilienceState):
    pass


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


CITIES = ["Oslo", "Lima", "Kyoto", "Porto", "Quito"]


def good(city: str) -> dict[str, Any]:
    return {
        "diagnosis": {
            "failed_tool": "get_weather",
            "failure_class": "structural",
            "cause": "get_weather answered 410 Gone: the endpoint was removed",
        },
        "rationale": f"geocode resolves {city} to coordinates, then weather_v2 serves the forecast",
        "steps": [
            {"id": "geo", "tool": "geocode", "args": {"city": city}},
            {
                "id": "wx",
                "tool": "weather_v2",
                "args": {"lat": "$steps.geo.output.lat", "lon": "$steps.geo.output.lon"},
                "depends_on": ["geo"],
            },
        ],
    }


def bad(kind: str, city: str) -> dict[str, Any]:
    plan = good(city)
    if kind == "blind_swap":
        plan["rationale"] = "get_weather again with the city in lower case may work"
        plan["steps"] = [{"id": "a", "tool": "get_weather", "args": {"city": city.lower()}}]
    elif kind == "repeat":
        plan["rationale"] = "get_weather again for the same city may work this time"
        plan["steps"] = [{"id": "a", "tool": "get_weather", "args": {"city": city}}]
    elif kind == "cycle":
        plan["steps"][0]["depends_on"] = ["wx"]
    elif kind == "unknown_tool":
        plan["steps"][1]["tool"] = "weather_v3"
    elif kind == "empty_diagnosis":
        plan["diagnosis"]["cause"] = ""
    return plan


BAD_KINDS = ("blind_swap", "repeat", "cycle", "unknown_tool", "empty_diagnosis")


def agent_turn(city: str) -> Any:
    def turn(messages: list[BaseMessage]) -> AIMessage:
        if any(isinstance(m, ToolMessage) for m in messages):
            return text("answered")
        return tool_calls(("get_weather", {"city": city}))

    return turn


def run_one(rng: random.Random) -> dict[str, Any]:
    city = rng.choice(CITIES)
    bad_first = rng.choice([0, 0, 1, 1, 2, 3])
    plans = [bad(rng.choice(BAD_KINDS), city) for _ in range(bad_first)] + [good(city)]
    planner = ScriptedChatModel(responses=[tool_calls(("Plan", p)) for p in plans])
    broken = FaultyTool(get_weather, then=Fault.status(410))
    agent_model = ScriptedChatModel(responses=[agent_turn(city)] * 3)
    builder = StateGraph(State)
    builder.add_node(
        "agent", RunnableLambda(lambda s: {"messages": [agent_model.invoke(s["messages"])]})
    )
    add_resilience(
        builder,
        agent="agent",
        tools=[broken, geocode, weather_v2],
        policy=ResiliencePolicy(max_replans=2),
        clock=FakeClock(),
        planner_model=planner,
        escalate=True,
    )
    app = builder.compile(checkpointer=InMemorySaver())
    verdicts: list[dict[str, Any]] = []
    escalated = False
    for mode, chunk in app.stream(
        {"messages": [("user", f"weather in {city}?")]},
        {"configurable": {"thread_id": uuid.uuid4().hex}},
        stream_mode=["custom", "updates"],
    ):
        if mode == "custom" and chunk.get(EVENT_KEY) == "plan_verdict":
            verdicts.append(chunk)
        if mode == "updates" and "__interrupt__" in chunk:
            escalated = True
    return {
        "completed": not escalated and any(v["accepted"] for v in verdicts),
        "escalated": escalated,
        "rejected_plans": sum(not v["accepted"] for v in verdicts),
        "rejections": [code for v in verdicts if not v["accepted"] for code in v["reasons"]],
        "planner_calls": planner.calls,
        "broken_after_first": broken.calls - 1,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", type=int, default=60)
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    results = [run_one(rng) for _ in range(args.scenarios)]
    reasons = collections.Counter(code for r in results for code in r["rejections"])
    summary = {
        "scenarios": len(results),
        "completed": sum(r["completed"] for r in results),
        "escalated": sum(r["escalated"] for r in results),
        "plans_proposed": sum(r["planner_calls"] for r in results),
        "plans_rejected": sum(r["rejected_plans"] for r in results),
        "rejection_reasons": dict(reasons.most_common()),
        "broken_tool_calls_after_first_failure": sum(r["broken_after_first"] for r in results),
    }
    print(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
