"""What every fault scenario shares: the payment service, the payment agent, a driver
that runs the user's API sync or async, fault timers, and the per-trial tally.

The agent is asked to pay a *plan* of amounts (unique in the test's database), one
``pay(amount)`` call per turn, and re-issues a payment whose answer was an error
envelope (a real agent retries what it was not told happened). ``pay`` is a side
effect with ``status_check``: the service is the ``payments`` table, reached over a
direct connection (never through the proxy: it is someone else's system, not our
infrastructure), so its rows are the real effects a trial counts.

The user's side (the checkpointer, the ledger, the thread lock) goes through the
`PgProxy`. Only the public API is used: ``langgraph_resilience`` and
``langgraph_resilience.testing``; a lapsed lease is made by SQL on the lease table.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import random
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import psycopg
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import StructuredTool
from langgraph.graph import MessagesState, StateGraph

from langgraph_resilience import (
    ResiliencePolicy,
    ResilienceState,
    ToolProfile,
    add_resilience,
    aopen_postgres,
    aresume,
    current_idempotency_key,
    open_postgres,
    resume,
)
from langgraph_resilience.core import SystemClock
from langgraph_resilience.errors import ThreadNotFoundError
from langgraph_resilience.stores import EffectStatus, Persistence
from langgraph_resilience.testing import ScriptedChatModel, text, tool_calls

DONE = "all paid"
PLAN_SIZE = 3
TRIALS = 20


class State(MessagesState, ResilienceState):
    """The user's state: messages plus the resilience ledger."""


# ------------------------------------------------------------------ the payment service


class Bank:
    """The payment service: rows of ``payments`` (key, amount), over direct connections."""

    DDL = (
        "CREATE TABLE IF NOT EXISTS payments (id serial PRIMARY KEY, key text, "
        "amount int NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())"
    )

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(self.DDL)

    def pay(self, key: str | None, amount: int) -> str:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO payments (key, amount) VALUES (%s, %s)", (key, amount))
        return f"paid {amount}"

    async def apay(self, key: str | None, amount: int) -> str:
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            await conn.execute("INSERT INTO payments (key, amount) VALUES (%s, %s)", (key, amount))
        return f"paid {amount}"

    def status(self, key: str) -> EffectStatus:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            row = conn.execute("SELECT amount FROM payments WHERE key = %s", (key,)).fetchone()
        return EffectStatus(done=row is not None, result=f"paid {row[0]}" if row else None)

    async def astatus(self, key: str) -> EffectStatus:
        async with await psycopg.AsyncConnection.connect(self.dsn, autocommit=True) as conn:
            cur = await conn.execute("SELECT amount FROM payments WHERE key = %s", (key,))
            row = await cur.fetchone()
        return EffectStatus(done=row is not None, result=f"paid {row[0]}" if row else None)

    def counts(self, amounts: Sequence[int]) -> dict[int, int]:
        """Real payments per amount of the plan (0 for none)."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT amount, count(*) FROM payments WHERE amount = ANY(%s) GROUP BY amount",
                (list(amounts),),
            ).fetchall()
        found = {int(a): int(n) for a, n in rows}
        return {a: found.get(a, 0) for a in amounts}

    def evidence(self, thread: str, amounts: Sequence[int]) -> list[str]:
        """The payments of `amounts` and the thread's ledger records, for a failure report."""
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            paid = conn.execute(
                "SELECT amount, key, at FROM payments WHERE amount = ANY(%s) ORDER BY at",
                (list(amounts),),
            ).fetchall()
            ledger = conn.execute(
                "SELECT key, tool, status, created_at, updated_at FROM lgr_idempotency "
                "WHERE thread_id = %s ORDER BY created_at",
                (thread,),
            ).fetchall()
        lines = [f"payment {a} key={k[:12]} at={at:%H:%M:%S.%f}" for a, k, at in paid]
        lines += [
            f"ledger key={k[:12]} {tool} {status} created={c:%H:%M:%S.%f} updated={u:%H:%M:%S.%f}"
            for k, tool, status, c, u in ledger
        ]
        return lines


class SlowBank(Bank):
    """A remote-like payment service: a request is committed by a service thread after a
    delay; the caller waits for the commit (its answer). The commit happens whatever
    the caller does meanwhile, as a request that left cannot be recalled."""

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.threads: list[threading.Thread] = []
        self.requests = 0
        self.errors: list[BaseException] = []

    def submit(self, key: str | None, amount: int, delay: float) -> concurrent.futures.Future[str]:
        done: concurrent.futures.Future[str] = concurrent.futures.Future()

        def commit() -> None:
            time.sleep(delay)  # the service's own latency, in real time
            try:
                done.set_result(self.pay(key, amount))
            except BaseException as exc:  # kept for the test, never lost in a thread
                self.errors.append(exc)
                done.set_exception(exc)

        worker = threading.Thread(target=commit, name="slow-bank", daemon=True)
        self.requests += 1
        self.threads.append(worker)
        worker.start()
        return done

    def drain(self, timeout: float = 30.0) -> None:
        """Wait until every request the service received has been committed."""
        deadline = time.monotonic() + timeout
        for worker in self.threads:
            worker.join(max(0.0, deadline - time.monotonic()))
        alive = [w for w in self.threads if w.is_alive()]
        assert not alive, f"{len(alive)} payment requests still running after {timeout}s"
        self.threads.clear()


# ------------------------------------------------------------------ the payment agent


def _asked_amounts(messages: Sequence[BaseMessage]) -> dict[str, int]:
    asked: dict[str, int] = {}
    for message in messages:
        if isinstance(message, AIMessage):
            for call in message.tool_calls:
                if call["name"] == "pay" and call["id"]:
                    asked[call["id"]] = int(call["args"]["amount"])
    return asked


def confirmed(messages: Sequence[BaseMessage]) -> set[int]:
    """The amounts the agent was told were paid (a successful ``pay`` answer)."""
    asked = _asked_amounts(messages)
    return {
        asked[m.tool_call_id]
        for m in messages
        if isinstance(m, ToolMessage) and m.status == "success" and m.tool_call_id in asked
    }


def payment_turn(plan: Sequence[int]) -> Callable[[list[BaseMessage]], AIMessage]:
    """The model: pay the first amount of the plan not confirmed yet; then say DONE."""

    def turn(messages: list[BaseMessage]) -> AIMessage:
        paid = confirmed(messages)
        todo = [amount for amount in plan if amount not in paid]
        if not todo:
            return text(DONE)
        return tool_calls(("pay", {"amount": todo[0]}))

    return turn


PayImpl = tuple[Callable[[int], str], Callable[[int], Awaitable[str]]]


def bank_pay(bank: Bank) -> PayImpl:
    """The plain ``pay`` tool: one INSERT under the call's idempotency key."""

    def pay(amount: int) -> str:
        return bank.pay(current_idempotency_key(), amount)

    async def apay(amount: int) -> str:
        return await bank.apay(current_idempotency_key(), amount)

    return pay, apay


def build_app(
    p: Persistence,
    bank: Bank,
    plan: Sequence[int],
    *,
    mode: str,
    rng: random.Random,
    think: float = 0.0,
    pay: PayImpl | None = None,
    policy: ResiliencePolicy | None = None,
    turns: int = 60,
    before_turn: Callable[[int], None] | None = None,
) -> Any:
    """The user's graph: an agent node (the scripted model, thinking up to `think`
    seconds a turn; `before_turn(n)` is called first, n = 1, 2, ...) and a resilient
    ``pay`` side effect on `p`'s checkpointer."""
    model = ScriptedChatModel(responses=[payment_turn(plan)] * turns)
    delays = random.Random(rng.random())
    lock = threading.Lock()

    def pause() -> float:
        with lock:
            return delays.uniform(0.0, think) if think else 0.0

    def turn_number(state: State) -> int:
        return 1 + sum(1 for m in state["messages"] if isinstance(m, AIMessage))

    def call_model(state: State) -> dict[str, list[BaseMessage]]:
        if before_turn is not None:
            before_turn(turn_number(state))
        time.sleep(pause())  # the model's latency, in real time
        return {"messages": [model.invoke(state["messages"])]}

    async def acall_model(state: State) -> dict[str, list[BaseMessage]]:
        if before_turn is not None:
            await asyncio.to_thread(before_turn, turn_number(state))
        await asyncio.sleep(pause())
        reply: AIMessage = await model.ainvoke(state["messages"])
        return {"messages": [reply]}

    sync_pay, async_pay = pay or bank_pay(bank)
    tool = StructuredTool.from_function(
        func=sync_pay,
        coroutine=async_pay,
        name="pay",
        description="Charge the customer's card.",
    )
    status = bank.status if mode == "sync" else bank.astatus
    builder = StateGraph(State)
    builder.add_node("agent", RunnableLambda(call_model, afunc=acall_model))
    add_resilience(
        builder,
        agent="agent",
        tools=[tool],
        policy=policy or ResiliencePolicy(),
        profiles={"pay": ToolProfile(side_effect=True, status_check=status)},
        clock=SystemClock(),  # the ledger's retries and the timeouts wait in real time
        rng=random.Random(rng.random()),
    )
    return builder.compile(checkpointer=p.checkpointer, store=p.store)


def user_input(plan: Sequence[int]) -> dict[str, Any]:
    return {"messages": [("user", f"pay {', '.join(map(str, plan))}")]}


def plan_for(seed: int, size: int = PLAN_SIZE) -> list[int]:
    """Amounts unique per trial (the payments table is shared by a test's trials)."""
    return [seed * 10 + k for k in range(1, size + 1)]


# ------------------------------------------------------------------ sync or async driver


def config_of(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


@dataclasses.dataclass
class Driver:
    """The user's API in one mode: ``sync`` (open_postgres, invoke, resume, thread_lock,
    each call run whole in a worker thread) or ``async`` (aopen_postgres, ainvoke,
    aresume, athread_lock, on this loop). Scenarios are written once, for both."""

    mode: str

    async def open(self, stack: contextlib.AsyncExitStack, dsn: str, **kwargs: Any) -> Persistence:
        if self.mode == "async":
            return await stack.enter_async_context(aopen_postgres(dsn, **kwargs))
        cm = open_postgres(dsn, **kwargs)
        p = await asyncio.to_thread(cm.__enter__)
        stack.push_async_callback(asyncio.to_thread, cm.__exit__, None, None, None)
        return p

    async def invoke(
        self,
        app: Any,
        inp: Any,
        thread: str,
        *,
        lock: Persistence | None = None,
        wait: Any = False,
        started: threading.Event | None = None,
    ) -> Any:
        """``app.invoke(inp, config, durability="sync")``, under ``lock.thread_lock``
        (with `wait`) when given; `started` is set as the run starts (the lock held)."""
        config = config_of(thread)
        if self.mode == "async":
            async with lock.athread_lock(thread, wait=wait) if lock else contextlib.nullcontext():
                if started is not None:
                    started.set()
                return await app.ainvoke(inp, config, durability="sync")

        def work() -> Any:
            with lock.thread_lock(thread, wait=wait) if lock else contextlib.nullcontext():
                if started is not None:
                    started.set()
                return app.invoke(inp, config, durability="sync")

        return await asyncio.to_thread(work)

    async def hold(self, p: Persistence, thread: str, *, wait: Any = False) -> None:
        """Take the thread's lock and release it at once."""
        if self.mode == "async":
            async with p.athread_lock(thread, wait=wait):
                return

        def work() -> None:
            with p.thread_lock(thread, wait=wait):
                return

        await asyncio.to_thread(work)

    async def resume(self, app: Any, thread: str, *, lock: Persistence, wait: Any = False) -> Any:
        if self.mode == "async":
            return await aresume(app, thread, lock=lock, wait=wait)
        return await asyncio.to_thread(lambda: resume(app, thread, lock=lock, wait=wait))

    async def state(self, app: Any, thread: str) -> Any:
        if self.mode == "async":
            return await app.aget_state(config_of(thread))
        return await asyncio.to_thread(app.get_state, config_of(thread))

    async def finish(
        self, app: Any, thread: str, plan: Sequence[int], *, lock: Persistence, wait: Any = False
    ) -> str:
        """After a failed run: resume the thread once, as the README says; a thread that
        has no checkpoint yet (the run stopped before its first write) is started again
        with its input. Returns which of the two it did."""
        try:
            await self.resume(app, thread, lock=lock, wait=wait)
        except ThreadNotFoundError:
            await self.invoke(app, user_input(plan), thread, lock=lock, wait=wait)
            return "restarted"
        return "resumed"


async def calibrate(
    driver: Driver, p: Persistence, bank: Bank, *, think: float, lock: bool = True
) -> float:
    """How long an undisturbed run of a plan takes (the longest of three): the span over
    which a scenario draws its fault's moment."""
    spans = []
    for n in range(3):
        plan = plan_for(900 + n)
        app = build_app(p, bank, plan, mode=driver.mode, rng=random.Random(n), think=think)
        started = time.monotonic()
        thread = f"calibrate-{n}-{random.random()}"
        await driver.invoke(app, user_input(plan), thread, lock=p if lock else None)
        spans.append(time.monotonic() - started)
    return max(spans)


def run_loop(main: Callable[[], Awaitable[Any]]) -> Any:
    """asyncio.run with a default executor wide enough for the scenario's blocking calls."""

    async def wrapped() -> Any:
        asyncio.get_running_loop().set_default_executor(
            concurrent.futures.ThreadPoolExecutor(max_workers=32, thread_name_prefix="faults")
        )
        return await main()

    return asyncio.run(wrapped())


# ------------------------------------------------------------------ faults


def lapse_leases(conn: psycopg.Connection[Any]) -> int:
    """Every thread lease on `conn`'s database lapses now, as when its holder misses its
    renewals (a paused process, a network cut): another runner may take the thread."""
    rows = conn.execute(
        "UPDATE lgr_thread_leases SET expires_at = now() - interval '1 second' "
        "WHERE expires_at > now() RETURNING thread_id"
    ).fetchall()
    return len(rows)


class Injector:
    """Runs a fault `action` on its own thread after `delay` seconds (optionally only
    once `after` is set), so its timing does not depend on the run's event loop.
    Whatever it raises is kept, never lost in the thread; `join` re-raises it."""

    def __init__(
        self,
        delay: float,
        action: Callable[[], Any],
        *,
        after: threading.Event | None = None,
        name: str = "fault",
    ) -> None:
        self.delay, self.action, self.after = delay, action, after
        self.result: Any = None
        self.fired_at: float | None = None
        self.error: BaseException | None = None
        self.cancelled = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"injector-{name}", daemon=True)

    def start(self) -> Injector:
        self.started_at = time.monotonic()
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            if self.after is not None:
                deadline = time.monotonic() + 60
                while not self.after.wait(0.05):
                    if self.cancelled.is_set():
                        return  # the run ended first: its own outcome says why
                    if time.monotonic() > deadline:
                        raise TimeoutError("the run never reached the point the fault waits for")
                self.started_at = time.monotonic()
            if self.cancelled.wait(self.delay):
                return
            self.fired_at = time.monotonic()
            self.result = self.action()
        except BaseException as exc:
            self.error = exc

    def cancel(self) -> None:
        self.cancelled.set()

    async def join(self, timeout: float = 75.0) -> Any:
        await asyncio.to_thread(self._thread.join, timeout)
        if self._thread.is_alive():
            raise TimeoutError("the fault injector did not finish")
        if self.error is not None:
            raise self.error
        return self.result


async def outcome_of(awaitable: Awaitable[Any]) -> tuple[Any, BaseException | None]:
    """(result, None) or (None, the exception the user's call raised)."""
    try:
        return await awaitable, None
    except Exception as exc:
        return None, exc


# ------------------------------------------------------------------ per-trial accounting


def error_name(exc: BaseException) -> str:
    """``module.Type`` for driver errors, the bare name for ours and the rest."""
    kind = type(exc)
    if kind.__module__.startswith("psycopg"):
        return f"{kind.__module__}.{kind.__qualname__}"
    return kind.__qualname__


def first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else ""


def origin(exc: BaseException) -> str:
    """Where an exception came from: the innermost frame in langgraph or in our package
    (``module:function``), the frames the user's call went through last."""
    found = "?"
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        module = str(frame.f_globals.get("__name__", ""))
        if module.startswith(("langgraph", "langgraph_resilience")):
            found = f"{module}:{frame.f_code.co_name}"
        tb = tb.tb_next
    return found


def is_raw_driver_error(exc: BaseException) -> bool:
    return isinstance(exc, psycopg.Error)


@dataclasses.dataclass
class Trial:
    """One trial: its seed, what happened, and the payments it made."""

    seed: int
    plan: list[int]
    events: list[str] = dataclasses.field(default_factory=list)
    counts: dict[int, int] = dataclasses.field(default_factory=dict)
    problems: list[str] = dataclasses.field(default_factory=list)

    def log(self, what: str) -> None:
        self.events.append(what)

    @property
    def duplicates(self) -> int:
        return sum(n - 1 for n in self.counts.values() if n > 1)

    @property
    def lost(self) -> int:
        return sum(1 for n in self.counts.values() if n == 0)

    @property
    def made(self) -> int:
        return sum(self.counts.values())

    evidence: list[str] = dataclasses.field(default_factory=list)

    def settle(self, bank: Bank, thread: str) -> None:
        """Count the real payments of the plan; keep the evidence of a bad trial."""
        self.counts = bank.counts(self.plan)
        if self.duplicates or self.lost or self.problems:
            self.evidence = bank.evidence(thread, self.plan)

    def describe(self) -> str:
        found = "".join(f"\n      {line}" for line in self.evidence)
        return (
            f"seed={self.seed} plan={self.plan} payments={self.counts} "
            f"events={' -> '.join(self.events)} problems={self.problems}{found}"
        )


@dataclasses.dataclass
class Tally:
    """What one scenario (in one mode) saw over its trials: the report's row."""

    scenario: str
    mode: str
    trials: list[Trial] = dataclasses.field(default_factory=list)
    errors: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    """Exception types that reached the user's call, by ``where: type``."""
    notes: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    """Counted observations (``what: n``)."""
    info: list[str] = dataclasses.field(default_factory=list)
    """One-off facts about the scenario's set-up."""
    started: float = dataclasses.field(default_factory=time.monotonic)
    wall: float = 0.0

    def saw(self, where: str, exc: BaseException | None) -> None:
        if exc is not None:
            self.errors[f"{where}: {error_name(exc)}"] += 1

    def note(self, what: str, n: int = 1) -> None:
        self.notes[what] += n

    def add(self, trial: Trial) -> Trial:
        self.trials.append(trial)
        return trial

    @property
    def expected(self) -> int:
        return sum(len(t.plan) for t in self.trials)

    @property
    def made(self) -> int:
        return sum(t.made for t in self.trials)

    @property
    def duplicates(self) -> int:
        return sum(t.duplicates for t in self.trials)

    @property
    def lost(self) -> int:
        return sum(t.lost for t in self.trials)

    def bad_trials(self) -> list[Trial]:
        return [t for t in self.trials if t.duplicates or t.lost or t.problems]

    def failure_report(self) -> str:
        bad = self.bad_trials()
        lines = [f"{self.scenario} [{self.mode}]: {len(bad)} of {len(self.trials)} trials failed"]
        lines += [f"  {t.describe()}" for t in bad[:5]]
        return "\n".join(lines)
