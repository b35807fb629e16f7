"""Exactly-once side effects across SIGKILL, resume by thread_id and concurrent runners."""

from __future__ import annotations

import concurrent.futures
import pathlib
import signal
import uuid

import psycopg
import pytest
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import tool
from langgraph.graph import StateGraph

from langgraph_resilience import (
    ToolProfile,
    add_resilience,
    current_idempotency_key,
    open_postgres,
)
from langgraph_resilience.stores import EffectStatus
from langgraph_resilience.testing import FakeClock, Fault, FaultyTool, ScriptedChatModel, text
from langgraph_resilience.testing import tool_calls as calls
from tests.conftest import State
from tests.postgres.processes import finish, spawn, wait_for_marker

WORKER = pathlib.Path(__file__).with_name("effect_worker.py")

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def _prepare(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE payments (id serial PRIMARY KEY, key text, amount int)")


def _payments(dsn: str) -> list[tuple[str, int]]:
    with psycopg.connect(dsn) as conn:
        return [(k, a) for k, a in conn.execute("SELECT key, amount FROM payments").fetchall()]


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("kill_at", ["before", "after", "completed"])
def test_sigkill_anywhere_leaves_exactly_one_payment(
    pg_dsn: str, tmp_path: pathlib.Path, kill_at: str, mode: str
) -> None:
    """Killed before the effect, after it (before the checkpoint) or after the step:
    resuming by thread_id in a new process ends with one payment and a finished thread."""
    _prepare(pg_dsn)
    thread, marker = uuid.uuid4().hex, tmp_path / "marker"
    common = ["--dsn", pg_dsn, "--thread", thread, "--marker", str(marker), "--mode", mode]
    first = spawn(WORKER, "start", *common, "--kill-at", kill_at, killed=True)
    wait_for_marker(marker, first)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    expected_before = 0 if kill_at == "before" else 1
    assert len(_payments(pg_dsn)) == expected_before

    result = finish(spawn(WORKER, "resume", *common))

    assert result == {"next": [], "last": "paid"}
    [(key, amount)] = _payments(pg_dsn)
    assert amount == 30
    assert key


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("wiring", ["default", "saver"])
def test_the_ledger_follows_a_durable_checkpointer_without_extra_wiring(
    pg_dsn: str, tmp_path: pathlib.Path, wiring: str, mode: str
) -> None:
    """No idempotency= passed, next to open_postgres's checkpointer or LangGraph's own
    PostgresSaver: killed after the payment, resumed in a new process, still one payment
    (the ledger went to the checkpointer's database, not into the dead process)."""
    _prepare(pg_dsn)
    thread, marker = uuid.uuid4().hex, tmp_path / "marker"
    common = ["--dsn", pg_dsn, "--thread", thread, "--marker", str(marker), "--mode", mode]
    common += ["--wiring", wiring]
    first = spawn(WORKER, "start", *common, "--kill-at", "after", killed=True)
    wait_for_marker(marker, first)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)

    result = finish(spawn(WORKER, "resume", *common))

    assert result == {"next": [], "last": "paid"}
    assert len(_payments(pg_dsn)) == 1
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute("SELECT status FROM lgr_idempotency WHERE tool = 'charge'").fetchall()
    assert rows == [("done",)]


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("wiring", ["default", "saver"])
def test_a_payment_waits_for_the_save_of_the_step_that_asked_for_it(
    pg_dsn: str, tmp_path: pathlib.Path, wiring: str, mode: str
) -> None:
    """LangGraph's default durability saves the model's step while the tools step runs;
    with that save late (2 s), the payment waits for it, so a kill right after the
    payment resumes the *same* call (one ledger row), not a model asked again (CI once
    saw the race: a second key, replayed from the first)."""
    _prepare(pg_dsn)
    thread, marker = uuid.uuid4().hex, tmp_path / "marker"
    common = ["--dsn", pg_dsn, "--thread", thread, "--marker", str(marker), "--mode", mode]
    common += ["--wiring", wiring]
    first = spawn(WORKER, "start", *common, "--kill-at", "after", "--late-save", "2", killed=True)
    wait_for_marker(marker, first)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    with psycopg.connect(pg_dsn) as conn:
        [(saved,)] = conn.execute(
            "SELECT count(*) FROM checkpoints WHERE thread_id = %s AND metadata->>'step' = '1'",
            (thread,),
        ).fetchall()
    assert saved == 1  # the model's step was saved before the payment ran

    result = finish(spawn(WORKER, "resume", *common))

    assert result == {"next": [], "last": "paid"}
    assert len(_payments(pg_dsn)) == 1
    with psycopg.connect(pg_dsn) as conn:
        rows = conn.execute("SELECT status FROM lgr_idempotency WHERE tool = 'charge'").fetchall()
    assert rows == [("done",)]


def test_two_runners_on_one_thread_one_gets_thread_busy(
    pg_dsn: str, tmp_path: pathlib.Path
) -> None:
    """Two processes resume the same thread at once: one runs, the other is refused."""
    _prepare(pg_dsn)
    thread, crash = uuid.uuid4().hex, tmp_path / "crash"
    start = spawn(
        WORKER,
        *["start", "--dsn", pg_dsn, "--thread", thread, "--marker", str(crash)],
        *["--kill-at", "before"],
        killed=True,
    )
    wait_for_marker(crash, start)
    start.send_signal(signal.SIGKILL)
    start.wait(timeout=30)

    running = tmp_path / "running"
    common = ["--dsn", pg_dsn, "--thread", thread, "--marker", str(running)]
    a = spawn(WORKER, "resume", *common, "--slow", "20")  # b may take 10 s to start
    wait_for_marker(running, a)
    b = finish(spawn(WORKER, "resume", *common))

    assert b == {"busy": True}
    assert finish(a) == {"next": [], "last": "paid"}
    assert len(_payments(pg_dsn)) == 1


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_resume_waits_for_an_attempt_still_in_flight_in_another_process(
    pg_dsn: str, tmp_path: pathlib.Path, mode: str
) -> None:
    """A's payment is on the wire (claimed, not landed) when B resumes the thread in
    another process, A's run lease having lapsed (A paused or cut off, so presumed dead):
    B must not hear "not done" from status_check and pay again; it waits out the tool's
    timeout less the intent's age, then replays A's outcome. A's run either ends or is
    stopped by the takeover; its payment counts once."""
    _prepare(pg_dsn)
    thread, running = uuid.uuid4().hex, tmp_path / "running"
    common = ["--dsn", pg_dsn, "--thread", thread, "--marker", str(running), "--mode", mode]
    common += ["--timeout", "20"]
    a = spawn(WORKER, "start", *common, "--kill-at", "none", "--slow", "10")
    wait_for_marker(running, a)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # A's run lease lapses
        lapsed = conn.execute(
            "UPDATE lgr_thread_leases SET expires_at = now() - interval '1 second' "
            "WHERE thread_id = %s",
            (thread,),
        )
        assert lapsed.rowcount == 1  # A's run held the thread
    b = finish(spawn(WORKER, "resume", *common))

    assert b == {"next": [], "last": "paid"}
    assert finish(a) in ({"next": [], "last": "paid"}, {"lost": True})
    assert len(_payments(pg_dsn)) == 1


def test_hundred_threads_on_one_pool_lose_nothing_and_pay_once(pg_dsn: str) -> None:
    """100 concurrent threads, each losing its first response after the effect: every
    thread finishes and every payment happens exactly once."""
    _prepare(pg_dsn)

    def turn(messages: list[BaseMessage]) -> AIMessage:
        if any(isinstance(m, ToolMessage) for m in messages):
            return text("paid")
        return calls(("charge", {"amount": 7}))

    @tool
    def pay(amount: int) -> str:
        """Charge the customer's card."""
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO payments (key, amount) VALUES (%s, %s)",
                (current_idempotency_key(), amount),
            )
        return f"charged {amount}"

    def status(key: str) -> EffectStatus:
        with psycopg.connect(pg_dsn) as conn:
            row = conn.execute("SELECT amount FROM payments WHERE key = %s", (key,)).fetchone()
        return EffectStatus(done=row is not None, result="charged 7" if row else None)

    with open_postgres(pg_dsn, max_size=20) as p:

        def run(i: int) -> str:
            model = ScriptedChatModel(responses=[turn] * 3)
            charge = FaultyTool(pay, [Fault.timeout(after_effect=True)], name="charge")
            builder = StateGraph(State)
            builder.add_node(
                "agent", RunnableLambda(lambda s: {"messages": [model.invoke(s["messages"])]})
            )
            add_resilience(
                builder,
                agent="agent",
                tools=[charge],
                clock=FakeClock(),
                profiles={"charge": ToolProfile(side_effect=True, status_check=status)},
                idempotency=p.idempotency,
            )
            app = builder.compile(checkpointer=p.checkpointer)
            out = app.invoke(
                {"messages": [("user", "pay")]}, {"configurable": {"thread_id": f"t{i}"}}
            )
            return str(out["messages"][-1].content)

        with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
            answers = list(pool.map(run, range(100)))

        assert answers == ["paid"] * 100
        for i in range(100):
            state = p.checkpointer.get_tuple({"configurable": {"thread_id": f"t{i}"}})
            assert state is not None
    payments = _payments(pg_dsn)
    assert len(payments) == 100
    assert len({key for key, _ in payments}) == 100
