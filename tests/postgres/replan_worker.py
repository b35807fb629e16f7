"""A user process for the replanning crash tests, on PostgresSaver.

``start`` runs a thread whose get_weather endpoint is gone; ``resume`` continues
it by thread_id (optionally answering an escalation) and prints JSON. With
``--block-step`` the second plan step announces itself through a marker file
and hangs, so the test can SIGKILL the process between two plan steps.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
from typing import Any

import psycopg
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import tool
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import MessagesState, StateGraph
from langgraph.types import Command
from psycopg.rows import dict_row

from langgraph_resilience import ResilienceState, add_resilience
from langgraph_resilience.testing import (
    FakeClock,
    FakeHTTPError,
    ScriptedChatModel,
    text,
    tool_calls,
)

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
BAD_PLAN: dict[str, Any] = {**GOOD_PLAN, "diagnosis": {**GOOD_PLAN["diagnosis"], "cause": ""}}


class State(MessagesState, ResilienceState):
    pass


def agent_turn(messages: list[BaseMessage]) -> AIMessage:
    """Ask for the weather once; answer once anything came back (same in every process)."""
    if any(isinstance(m, ToolMessage) for m in messages):
        return text("done")
    return tool_calls(("get_weather", {"city": "Oslo"}))


def build(dsn: str, *, planner: list[Any], marker: pathlib.Path | None) -> Any:
    def record(name: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO executions (tool) VALUES (%s)", (name,))

    @tool
    def get_weather(city: str) -> str:
        """Weather for a city (the old endpoint, now gone)."""
        record("get_weather")
        raise FakeHTTPError(410)

    @tool
    def geocode(city: str) -> dict[str, float]:
        """Coordinates of a city."""
        record("geocode")
        return {"lat": 59.91, "lon": 10.75}

    @tool
    def weather_v2(lat: float, lon: float) -> str:
        """Weather at coordinates."""
        if marker is not None:
            marker.write_text("weather_v2 started")
            time.sleep(120)  # killed here by the test; a real process hang, not a clock
        record("weather_v2")
        return f"12C at {lat},{lon}"

    agent_model = ScriptedChatModel(responses=[agent_turn] * 3)
    planner_model = ScriptedChatModel(responses=[tool_calls(("Plan", p)) for p in planner])
    builder = StateGraph(State)
    builder.add_node(
        "agent", RunnableLambda(lambda s: {"messages": [agent_model.invoke(s["messages"])]})
    )
    add_resilience(
        builder,
        agent="agent",
        tools=[get_weather, geocode, weather_v2],
        clock=FakeClock(epoch=time.time()),
        planner_model=planner_model,
        escalate=True,
    )
    return builder


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("phase", choices=["start", "resume"])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--thread", required=True)
    parser.add_argument("--plans", choices=["good", "bad"], default="good")
    parser.add_argument("--block-step", help="marker file: hang in the second plan step")
    parser.add_argument("--answer", help="JSON resume value for a pending escalation")
    args = parser.parse_args()
    planner = [GOOD_PLAN] if args.plans == "good" else [BAD_PLAN] * 3
    marker = pathlib.Path(args.block_step) if args.block_step else None
    builder = build(args.dsn, planner=planner if args.phase == "start" else [], marker=marker)
    config = {"configurable": {"thread_id": args.thread}}
    kwargs: dict[str, Any] = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    with psycopg.Connection.connect(args.dsn, **kwargs) as conn:
        app = builder.compile(checkpointer=PostgresSaver(conn))
        # durability="sync", as the README asks of graphs that must not redo a step:
        # with the default ("async") a step's checkpoint is written while the next step
        # runs, and a SIGKILL under load can land before it does
        if args.phase == "start":
            app.invoke({"messages": [("user", "weather in Oslo?")]}, config, durability="sync")
        elif args.answer:
            app.invoke(Command(resume=json.loads(args.answer)), config, durability="sync")
        else:
            app.invoke(None, config, durability="sync")
        state = app.get_state(config)
    json.dump(
        {
            "next": list(state.next),
            "interrupts": [i.value for i in state.interrupts],
            "last": state.values["messages"][-1].content,
            "plan": (state.values["resilience"].get("plan") or {}).get("status"),
            "replans": state.values["resilience"].get("replans"),
        },
        sys.stdout,
        default=str,
    )


if __name__ == "__main__":
    main()
