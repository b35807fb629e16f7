"""Shared fixtures: a sync/async runner, a user-style graph builder, real Postgres databases."""

from __future__ import annotations

import asyncio
import os
import random
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import BaseTool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph

from langgraph_resilience import ResiliencePolicy, ResilienceState, ToolProfile, add_resilience
from langgraph_resilience.testing import FakeClock, ScriptedChatModel
from tests.pgbouncer import PgBouncer, pgbouncer_binary

ADMIN_DSN = os.environ.get(
    "LANGGRAPH_RESILIENCE_TEST_DSN", "postgresql://postgres@127.0.0.1:5432/postgres"
)
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


class State(MessagesState, ResilienceState):
    """The user's state: messages plus the resilience ledger."""


@dataclass
class Runner:
    """Runs a compiled graph through the sync or the async API, chosen by the fixture."""

    mode: str

    def invoke(self, app: CompiledStateGraph[Any, Any, Any, Any], inp: Any, config: Any) -> Any:
        if self.mode == "sync":
            return app.invoke(inp, config)
        return asyncio.run(app.ainvoke(inp, config))

    def stream(
        self, app: CompiledStateGraph[Any, Any, Any, Any], inp: Any, config: Any, **kwargs: Any
    ) -> list[Any]:
        if self.mode == "sync":
            return list(app.stream(inp, config, **kwargs))

        async def collect() -> list[Any]:
            return [chunk async for chunk in app.astream(inp, config, **kwargs)]

        return asyncio.run(collect())


@pytest.fixture(params=["sync", "async"])
def runner(request: pytest.FixtureRequest) -> Runner:
    """Every graph test runs once through invoke() and once through ainvoke()."""
    return Runner(request.param)


@dataclass
class Harness:
    """A user graph (agent -> resilient tools) with its doubles exposed for assertions."""

    app: CompiledStateGraph[Any, Any, Any, Any]
    model: ScriptedChatModel
    clock: FakeClock

    def config(self, thread_id: str | None = None) -> dict[str, Any]:
        return {"configurable": {"thread_id": thread_id or uuid.uuid4().hex}}


def build_graph(
    tools: Sequence[BaseTool],
    responses: Sequence[Any],
    *,
    policy: ResiliencePolicy | None = None,
    profiles: dict[str, ToolProfile] | None = None,
    clock: FakeClock | None = None,
    checkpointer: BaseCheckpointSaver[Any] | None = None,
    seed: int = 7,
    repair_model: ScriptedChatModel | None = None,
    planner_model: ScriptedChatModel | None = None,
    escalate: bool = False,
    options: dict[str, Any] | None = None,
    **compile_kwargs: Any,
) -> Harness:
    """Build the graph exactly as the README tells a user to."""
    model = ScriptedChatModel(responses=list(responses))
    clock = clock or FakeClock()

    def call_model(state: State) -> dict[str, list[BaseMessage]]:
        return {"messages": [model.invoke(state["messages"])]}

    async def acall_model(state: State) -> dict[str, list[BaseMessage]]:
        reply: AIMessage = await model.ainvoke(state["messages"])
        return {"messages": [reply]}

    builder = StateGraph(State)
    builder.add_node("agent", RunnableLambda(call_model, afunc=acall_model))
    add_resilience(
        builder,
        agent="agent",
        tools=tools,
        policy=policy or ResiliencePolicy(),
        profiles=profiles,
        clock=clock,
        rng=random.Random(seed),
        repair_model=repair_model,
        planner_model=planner_model,
        escalate=escalate,
        **(options or {}),
    )
    app = builder.compile(checkpointer=checkpointer or InMemorySaver(), **compile_kwargs)
    return Harness(app=app, model=model, clock=clock)


# ------------------------------------------------------------------ Postgres


def _admin_connect() -> psycopg.Connection[Any]:
    return psycopg.connect(ADMIN_DSN, autocommit=True, connect_timeout=3)


@pytest.fixture
def pg_dsn() -> Iterator[str]:
    """A fresh database on the real server, dropped afterwards.

    Under CI an unreachable server fails the test; elsewhere it skips with the reason.
    """
    try:
        admin = _admin_connect()
    except psycopg.OperationalError as exc:
        if IN_CI:
            pytest.fail(f"PostgreSQL is required under CI but unreachable at {ADMIN_DSN}: {exc}")
        pytest.skip(f"PostgreSQL not reachable at {ADMIN_DSN} (set LANGGRAPH_RESILIENCE_TEST_DSN)")
    name = f"lgr_test_{uuid.uuid4().hex[:12]}"
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    base, _, _ = ADMIN_DSN.rpartition("/")
    try:
        yield f"{base}/{name}"
    finally:
        with _admin_connect() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def seeded_delays(seed: int, count: int, *, base: float = 0.5, cap: float = 30.0) -> list[float]:
    """The full-jitter delays a `random.Random(seed)` produces for attempts 0..count-1."""
    rng = random.Random(seed)
    return [rng.uniform(0.0, min(cap, base * 2**n)) for n in range(count)]


# ------------------------------------------------------------------ PgBouncer


@pytest.fixture
def pgbouncer() -> Iterator[PgBouncer]:
    """Debian's PgBouncer in transaction mode on a free loopback port, stopped after.

    Under CI a missing binary is installed (``tests/system_packages.py``), and fails
    the test when it cannot be; elsewhere it skips with the reason.
    """
    binary = pgbouncer_binary()
    if binary is None:
        if IN_CI:
            pytest.fail("pgbouncer is required under CI: apt-get install -y pgbouncer")
        pytest.skip("pgbouncer is not installed (apt-get install pgbouncer) for pooler tests")
    with PgBouncer(binary) as running:
        yield running


@pytest.fixture(params=["straight", "pgbouncer"])
def pg_route(request: pytest.FixtureRequest, pg_dsn: str) -> str:
    """The test database's DSN, straight to PostgreSQL or through PgBouncer in
    ``pool_mode=transaction``: every pooler-sensitive test runs both ways."""
    if request.param == "straight":
        return pg_dsn
    bouncer: PgBouncer = request.getfixturevalue("pgbouncer")
    return bouncer.dsn(pg_dsn)
