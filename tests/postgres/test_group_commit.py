"""A step's concurrent claims and outcomes go to PostgreSQL as one statement (group
commit), on the real server, straight and through PgBouncer in transaction mode.

The first writer's statement is held in flight by a row lock another transaction
holds on its key, so the writers that come meanwhile queue deterministically; the
tests count the statements the store sends."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import MessagesState, StateGraph
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from langgraph_resilience import ResilienceState, ToolProfile, add_resilience
from langgraph_resilience.core.effects import Claim
from langgraph_resilience.stores.persistence import POSTGRES_CONNECTION_KWARGS
from langgraph_resilience.stores.postgres_ledger import (
    AsyncPostgresIdempotencyStore,
    PostgresIdempotencyStore,
)
from langgraph_resilience.testing import ScriptedChatModel

pytestmark = [pytest.mark.postgres]

WRITERS = 16


def _until(done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def _counted(store: Any) -> list[str]:
    """The first word of every statement the store sends (its runner wrapped)."""
    sent: list[str] = []
    rows, arows = store._rows, store._arows

    def counted(query: str, params: Any) -> Any:
        sent.append(query.split(maxsplit=1)[0])
        return rows(query, params)

    async def acounted(query: str, params: Any) -> Any:
        sent.append(query.split(maxsplit=1)[0])
        return await arows(query, params)

    store._rows, store._arows = counted, acounted
    return sent


def _queued(store: Any, groups: Any) -> int:
    return sum(len(batch.items) for batch in groups._queued.values())


@pytest.fixture
def pool(pg_route: str) -> Iterator[ConnectionPool[Any]]:
    with ConnectionPool(
        pg_route, min_size=1, max_size=WRITERS + 2, kwargs=POSTGRES_CONNECTION_KWARGS
    ) as pool:
        PostgresIdempotencyStore(pool).setup()
        yield pool


def _holding(dsn: str, key: str) -> psycopg.Connection[Any]:
    """A transaction holding `key`'s row: a claim or an outcome of it waits until it ends."""
    conn = psycopg.connect(dsn)
    conn.execute(
        "INSERT INTO lgr_idempotency (key, thread_id, status) VALUES (%s, 't', 'pending')"
        " ON CONFLICT (key) DO NOTHING",
        (key,),
    )
    conn.execute("SELECT 1 FROM lgr_idempotency WHERE key = %s FOR UPDATE", (key,))
    return conn


def test_a_steps_concurrent_claims_go_as_one_statement(
    pool: ConnectionPool[Any], pg_dsn: str
) -> None:
    store = PostgresIdempotencyStore(pool)
    store.claim("old", tool="pay", args_json='{"a":1}', thread_id="t", fingerprint="F")
    store.claim("was", tool="pay", args_json='{"a":1}', thread_id="t", fingerprint="F")
    store.record_outcome("was", {"paid": 1})
    sent = _counted(store)
    blocker = psycopg.connect(pg_dsn)
    blocker.execute("INSERT INTO lgr_idempotency (key) VALUES ('k0')")  # not committed
    claims: dict[str, Claim] = {}

    def claim(key: str) -> None:
        claims[key] = store.claim(
            key, tool="pay", args_json='{"a":1}', thread_id="t", fingerprint="F"
        )

    first = threading.Thread(target=claim, args=("k0",))
    first.start()
    _until(lambda: len(sent) == 1, "the first claim in flight")
    rest = [threading.Thread(target=claim, args=(f"k{i}",)) for i in range(1, WRITERS)]
    for thread in rest:
        thread.start()
    _until(lambda: _queued(store, store._claims[0]) == WRITERS - 1, "the others queued")
    blocker.rollback()  # the first claim goes on
    blocker.close()
    for thread in (first, *rest):
        thread.join(timeout=30)

    assert sent == ["WITH", "WITH"]  # the first alone, the fifteen others in one statement
    assert {key: c.state for key, c in claims.items()} == {f"k{i}": "new" for i in range(WRITERS)}
    assert [r.key for r in claims["k0"].unresolved or ()] == ["old"]
    for i in range(1, WRITERS):  # what each would have read had it come right after k0
        assert [r.key for r in claims[f"k{i}"].unresolved or ()] == ["old", "k0"]
        assert claims[f"k{i}"].done == ("was",)
        assert claims[f"k{i}"].record.args == {"a": 1}
    assert {r.key for r in store.for_thread("t") if r.status == "pending"} == {
        "old",
        *claims,
    }


def test_concurrent_outcomes_go_as_one_statement(pool: ConnectionPool[Any], pg_dsn: str) -> None:
    store = PostgresIdempotencyStore(pool)
    keys = [f"o{i}" for i in range(WRITERS)]
    for key in keys:
        store.claim(key, tool="pay", args_json="{}", thread_id="t", fingerprint=key)
    sent = _counted(store)
    blocker = psycopg.connect(pg_dsn)
    blocker.execute("SELECT 1 FROM lgr_idempotency WHERE key = 'o0' FOR UPDATE")
    threads = [
        threading.Thread(target=store.record_outcome, args=(key, {"n": n}))
        for n, key in enumerate(keys)
    ]
    threads[0].start()
    _until(lambda: len(sent) == 1, "the first outcome in flight")
    for thread in threads[1:]:
        thread.start()
    _until(lambda: _queued(store, store._outcomes[0]) == WRITERS - 1, "the others queued")
    blocker.rollback()
    blocker.close()
    for thread in threads:
        thread.join(timeout=30)

    assert sent == ["UPDATE", "UPDATE"]
    assert [(r.status, r.result) for r in map(store.get, keys)] == [
        ("done", {"n": n}) for n in range(WRITERS)
    ]
    # the first outcome still wins: a second is not written over it
    assert store.record_outcome("o3", {"n": -1}).result == {"n": 3}


def test_the_same_key_twice_is_never_claimed_new_twice(
    pool: ConnectionPool[Any], pg_dsn: str
) -> None:
    store = PostgresIdempotencyStore(pool)
    sent = _counted(store)
    blocker = psycopg.connect(pg_dsn)
    blocker.execute("INSERT INTO lgr_idempotency (key) VALUES ('k0')")
    states: list[str] = []

    def claim(key: str) -> None:
        claimed = store.claim(key, tool="pay", args_json="{}", thread_id="t", fingerprint=key)
        states.append(claimed.state)

    threads = [threading.Thread(target=claim, args=(key,)) for key in ("k0", "dup", "dup")]
    threads[0].start()
    _until(lambda: len(sent) == 1, "the first claim in flight")
    for thread in threads[1:]:
        thread.start()
    _until(lambda: len(states) == 1, "the second 'dup' sent alone")
    blocker.rollback()
    blocker.close()
    for thread in threads:
        thread.join(timeout=30)

    assert sorted(states) == ["new", "new", "pending"]  # k0, and one 'dup' of two


async def test_async_claims_and_outcomes_of_a_step_go_together(pg_route: str) -> None:
    async with AsyncConnectionPool(
        pg_route, min_size=1, max_size=WRITERS + 2, kwargs=POSTGRES_CONNECTION_KWARGS
    ) as pool:
        store = AsyncPostgresIdempotencyStore(pool)
        await store.setup()
        sent = _counted(store)
        claims = await asyncio.gather(
            *(
                store.aclaim(f"a{i}", tool="pay", args_json="{}", thread_id="t", fingerprint="G")
                for i in range(WRITERS)
            )
        )
        assert [c.state for c in claims] == ["new"] * WRITERS
        assert sent == ["WITH", "WITH"]  # the first alone, the others queued behind it
        sent.clear()
        await asyncio.gather(*(store.arecord_outcome(f"a{i}", i) for i in range(WRITERS)))
        assert sent == ["UPDATE", "UPDATE"]
        assert [(await store.aget(f"a{i}")).result for i in range(WRITERS)] == list(  # type: ignore[union-attr]
            range(WRITERS)
        )


async def test_a_claim_cancelled_while_queued_is_never_written(pg_dsn: str) -> None:
    async with AsyncConnectionPool(
        pg_dsn, min_size=1, max_size=8, kwargs=POSTGRES_CONNECTION_KWARGS
    ) as pool:
        store = AsyncPostgresIdempotencyStore(pool)
        await store.setup()
        blocker = await psycopg.AsyncConnection.connect(pg_dsn)
        await blocker.execute("INSERT INTO lgr_idempotency (key) VALUES ('k0')")

        def claim(key: str) -> asyncio.Task[Claim]:
            return asyncio.ensure_future(
                store.aclaim(key, tool="pay", args_json="{}", thread_id="t", fingerprint=key)
            )

        first = claim("k0")
        while not store._claims[1]._busy:  # the first claim is in flight, held by the blocker
            await asyncio.sleep(0)
        queued = [claim(key) for key in ("q1", "q2", "q3")]
        while _queued(store, store._claims[1]) < 3:
            await asyncio.sleep(0)
        queued[1].cancel()
        await blocker.rollback()
        await blocker.close()
        await first
        kept = await asyncio.gather(queued[0], queued[2])
        with pytest.raises(asyncio.CancelledError):
            await queued[1]

        assert [c.state for c in kept] == ["new", "new"]
        assert await store.aget("q2") is None  # cancelled before it was sent: no intent
        assert (await store.aget("q1")) is not None


# ------------------------------------------------------------------ a real step


def test_a_step_of_many_side_effects_sends_few_statements_and_pays_each_once(
    pg_dsn: str,
) -> None:
    """Sixteen parallel payments in one step, through ``add_resilience`` on
    ``PostgresSaver``: each is paid once and answered once, and the ledger's statements
    grow by far less than two per call."""
    paid: list[str] = []
    lock = threading.Lock()

    @tool
    def pay(order: str) -> str:
        """Pay one order."""
        with lock:
            paid.append(order)
        return f"paid {order}"

    def reply(messages: list[Any]) -> AIMessage:
        if isinstance(messages[-1], HumanMessage):
            calls = [
                {"name": "pay", "args": {"order": f"o{i}"}, "id": f"call_{i}"}
                for i in range(WRITERS)
            ]
            return AIMessage(content="", tool_calls=calls)
        return AIMessage(content="all paid")

    model = ScriptedChatModel(responses=[reply, reply])

    class State(MessagesState, ResilienceState):
        pass

    with ConnectionPool(
        pg_dsn, min_size=1, max_size=WRITERS + 4, kwargs=POSTGRES_CONNECTION_KWARGS
    ) as pool:
        saver = PostgresSaver(pool)  # type: ignore[arg-type]
        saver.setup()
        ledger = PostgresIdempotencyStore(pool)
        ledger.setup()
        sent = _counted(ledger)
        builder = StateGraph(State)
        builder.add_node("agent", lambda s: {"messages": [model.invoke(s["messages"])]})
        add_resilience(
            builder,
            agent="agent",
            tools=[pay],
            profiles={"pay": ToolProfile(side_effect=True, status_check=lambda key: None)},
            idempotency=ledger,
        )
        graph = builder.compile(checkpointer=saver)
        thread = {"configurable": {"thread_id": uuid.uuid4().hex}}
        out = graph.invoke({"messages": [HumanMessage("pay all")]}, thread)

    answers = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert sorted(paid) == sorted(f"o{i}" for i in range(WRITERS))
    assert sorted(m.tool_call_id for m in answers) == sorted(f"call_{i}" for i in range(WRITERS))
    assert all(m.status == "success" for m in answers)
    ledger_writes = [word for word in sent if word in ("WITH", "UPDATE")]
    assert len(ledger_writes) < 2 * WRITERS, sent
