"""A step's concurrent claims and outcomes go to PostgreSQL as one statement (group
commit), on the real server, straight and through PgBouncer in transaction mode.

The statements of the first two writers (one per lane) are held in flight by row
locks another transaction holds on their keys, so the writers that come meanwhile
queue deterministically; the tests count the statements the store sends."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from langchain_core.messages import ToolMessage
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from langgraph_resilience import ToolProfile
from langgraph_resilience.core.effects import Claim
from langgraph_resilience.stores.persistence import POSTGRES_CONNECTION_KWARGS
from langgraph_resilience.stores.postgres_ledger import (
    AsyncPostgresIdempotencyStore,
    PostgresIdempotencyStore,
)
from tests.postgres.payments import pay_in_one_step

pytestmark = [pytest.mark.postgres]

WRITERS = 16


def _until(done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def _kind(query: str) -> str:
    """A statement's kind: ``claim`` or ``outcome`` for a call of the ledger's function
    of that name, else its first word."""
    for kind in ("claim", "outcome"):
        if f"lgr_{kind}(" in query:
            return kind
    return query.split(maxsplit=1)[0]


def _counted(store: Any) -> list[str]:
    """The kind of every statement the store sends (its runner wrapped)."""
    sent: list[str] = []
    rows, arows = store._rows, store._arows

    def counted(query: str, params: Any) -> Any:
        sent.append(_kind(query))
        return rows(query, params)

    async def acounted(query: str, params: Any) -> Any:
        sent.append(_kind(query))
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


def _in_flight(sent: list[str], start: Callable[[str], Any]) -> None:
    """Start the writers of the keys held in flight (`HELD`), one by one, each once the
    previous one's statement is sent: they take both lanes."""
    for n, key in enumerate(HELD, start=1):
        start(key)
        _until(lambda n=n: len(sent) == n, f"{key}'s statement in flight")  # type: ignore[misc]


HELD = ("k0", "k1")
"""The keys whose rows another transaction holds: their writers' statements stay in
flight (one per lane) until it ends."""


def _held_intents(dsn: str) -> list[psycopg.Connection[Any]]:
    """An intent of each of `HELD` inserted and not committed, each by a transaction of
    its own: a claim of it waits until that transaction ends."""
    held = []
    for key in HELD:
        conn = psycopg.connect(dsn)
        conn.execute("INSERT INTO lgr_idempotency (key) VALUES (%s)", (key,))
        held.append(conn)
    return held


def _release(held: list[psycopg.Connection[Any]]) -> None:
    for conn in held:
        conn.rollback()
        conn.close()


def _started(target: Callable[..., Any], *args: Any) -> threading.Thread:
    thread = threading.Thread(target=target, args=args)
    thread.start()
    return thread


def test_a_steps_concurrent_claims_go_as_one_statement(
    pool: ConnectionPool[Any], pg_dsn: str
) -> None:
    store = PostgresIdempotencyStore(pool)
    store.claim("old", tool="pay", args_json='{"a":1}', thread_id="t", fingerprint="F")
    store.claim("was", tool="pay", args_json='{"a":1}', thread_id="t", fingerprint="F")
    store.record_outcome("was", {"paid": 1})
    sent = _counted(store)
    blocker = _held_intents(pg_dsn)
    claims: dict[str, Claim] = {}

    def claim(key: str) -> None:
        claims[key] = store.claim(
            key, tool="pay", args_json='{"a":1}', thread_id="t", fingerprint="F"
        )

    threads: list[threading.Thread] = []
    _in_flight(sent, lambda key: threads.append(_started(claim, key)))
    threads += [_started(claim, f"k{i}") for i in range(len(HELD), WRITERS)]
    _until(lambda: _queued(store, store._claims[0]) == WRITERS - len(HELD), "the others queued")
    _release(blocker[:1])  # k0's claim goes on, and the queued ones take its lane
    # answered, not only sent: through PgBouncer a sent statement may wait for a server
    # connection, and start after k1 commits (it would then see k1 too)
    queued = [f"k{i}" for i in range(len(HELD), WRITERS)]
    _until(lambda: all(key in claims for key in queued), "the queued claims answered")
    _release(blocker[1:])
    for thread in threads:
        thread.join(timeout=30)

    assert sent == ["claim"] * (len(HELD) + 1)  # two alone, fourteen in one statement
    assert {key: c.state for key, c in claims.items()} == {f"k{i}": "new" for i in range(WRITERS)}
    assert [r.key for r in claims["k0"].unresolved or ()] == ["old"]
    for i in range(len(HELD), WRITERS):  # as each would have read it, right after k0
        assert [r.key for r in claims[f"k{i}"].unresolved or ()] == ["old", "k0"]
        assert claims[f"k{i}"].done == ("was",)
        assert claims[f"k{i}"].record.args == {"a": 1}
    assert {r.key for r in store.for_thread("t") if r.status == "pending"} == {
        "old",
        *claims,
    }


def test_concurrent_outcomes_go_as_one_statement(pool: ConnectionPool[Any], pg_dsn: str) -> None:
    store = PostgresIdempotencyStore(pool)
    keys = [f"k{i}" for i in range(WRITERS)]
    for key in keys:
        store.claim(key, tool="pay", args_json="{}", thread_id="t", fingerprint=key)
    sent = _counted(store)
    blocker = psycopg.connect(pg_dsn)
    blocker.execute("SELECT 1 FROM lgr_idempotency WHERE key = ANY(%s) FOR UPDATE", (list(HELD),))
    threads: list[threading.Thread] = []
    record = store.record_outcome
    _in_flight(sent, lambda key: threads.append(_started(record, key, key)))
    threads += [_started(record, key, key) for key in keys[len(HELD) :]]
    _until(lambda: _queued(store, store._outcomes[0]) == WRITERS - len(HELD), "the others queued")
    blocker.rollback()
    blocker.close()
    for thread in threads:
        thread.join(timeout=30)

    assert sent == ["outcome"] * (len(HELD) + 1)
    assert [(r.status, r.result) for r in map(store.get, keys)] == [("done", k) for k in keys]
    # the first outcome still wins: a second is not written over it
    assert store.record_outcome("k3", "again").result == "k3"


def test_the_same_key_twice_is_never_claimed_new_twice(pg_dsn: str) -> None:
    """(Straight to the server: the duplicate goes alone, so it needs a third server
    connection while two are held, more than the pooler tests' PgBouncer has.)"""
    with ConnectionPool(pg_dsn, min_size=1, max_size=4, kwargs=POSTGRES_CONNECTION_KWARGS) as pool:
        store = PostgresIdempotencyStore(pool)
        store.setup()
        states = _claimed_twice(store, pg_dsn)
    assert sorted(states) == ["new", "new", "new", "pending"]  # k0, k1, and one 'dup' of two


def _claimed_twice(store: PostgresIdempotencyStore, pg_dsn: str) -> list[str]:
    sent = _counted(store)
    blocker = _held_intents(pg_dsn)
    states: list[str] = []

    def claim(key: str) -> None:
        claimed = store.claim(key, tool="pay", args_json="{}", thread_id="t", fingerprint=key)
        states.append(claimed.state)

    threads: list[threading.Thread] = []
    _in_flight(sent, lambda key: threads.append(_started(claim, key)))
    threads += [_started(claim, "dup"), _started(claim, "dup")]
    _until(lambda: len(states) == 1, "the second 'dup' sent alone")
    _release(blocker)
    for thread in threads:
        thread.join(timeout=30)
    return states


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
        assert sent == ["claim"] * 3  # two alone, the others queued behind them
        sent.clear()
        await asyncio.gather(*(store.arecord_outcome(f"a{i}", i) for i in range(WRITERS)))
        assert sent == ["outcome"] * 3
        results = [await store.aget(f"a{i}") for i in range(WRITERS)]
        assert [r.result if r else None for r in results] == list(range(WRITERS))


async def test_a_claim_cancelled_while_queued_is_never_written(pg_dsn: str) -> None:
    async with AsyncConnectionPool(
        pg_dsn, min_size=1, max_size=8, kwargs=POSTGRES_CONNECTION_KWARGS
    ) as pool:
        store = AsyncPostgresIdempotencyStore(pool)
        await store.setup()
        blocker = await psycopg.AsyncConnection.connect(pg_dsn)
        for key in HELD:  # one transaction holds both: the claims of both wait
            await blocker.execute("INSERT INTO lgr_idempotency (key) VALUES (%s)", (key,))

        def claim(key: str) -> asyncio.Task[Claim]:
            return asyncio.ensure_future(
                store.aclaim(key, tool="pay", args_json="{}", thread_id="t", fingerprint=key)
            )

        first = [claim(key) for key in HELD]
        while sum(store._claims[1]._lanes._busy.values()) < len(HELD):  # both lanes held
            await asyncio.sleep(0)
        queued = [claim(key) for key in ("q1", "q2", "q3")]
        while _queued(store, store._claims[1]) < 3:
            await asyncio.sleep(0)
        queued[1].cancel()
        await blocker.rollback()
        await blocker.close()
        await asyncio.gather(*first)
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
    with ConnectionPool(
        pg_dsn, min_size=1, max_size=WRITERS + 4, kwargs=POSTGRES_CONNECTION_KWARGS
    ) as pool:
        ledger = PostgresIdempotencyStore(pool)
        ledger.setup()
        sent = _counted(ledger)
        calls = [(f"call_{i}", f"o{i}") for i in range(WRITERS)]
        profile = ToolProfile(side_effect=True, status_check=lambda key: None)
        out, paid, _ = pay_in_one_step(pool, ledger, calls, profile)

    answers = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert sorted(paid) == sorted(f"o{i}" for i in range(WRITERS))
    assert sorted(m.tool_call_id for m in answers) == sorted(f"call_{i}" for i in range(WRITERS))
    assert all(m.status == "success" for m in answers)
    ledger_writes = [word for word in sent if word in ("claim", "outcome")]
    assert len(ledger_writes) < 2 * WRITERS, sent
