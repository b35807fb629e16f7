"""Scenario 1: the thread lease of a running runner lapses at a random moment.

Runner A holds ``thread_lock`` and pays a plan of three amounts. At a random moment
of its run (uniform over a calibrated run's length, counted from the moment A holds
the lock), its lease lapses (set expired over a direct connection, as when A misses its
renewals: a paused process, a network cut); a second runner B (another pool, as another
worker would have) then resumes the thread right away, taking it over with a newer
token while A may still be running. A must stop with `ThreadLockLostError` (or have
finished before the lapse), B must finish the thread, and every amount must be paid
exactly once.

The random lapse lands in A's ``pay`` (claimed, request in flight) only rarely; when it
does, B must wait for A's request instead of asking the service too early and paying
again. ``test_an_effect_in_flight_when_the_lock_dies_is_paid_once`` holds A there to
make that window deterministic (A and B in one process, as two workers sharing one).
Two more findings of these trials have their own deterministic tests: a lock taken
with ``wait=`` must be free once its block exits, and a run under such a lock must be
fenced.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from typing import Any

import psycopg
import pytest

from langgraph_resilience import current_idempotency_key
from langgraph_resilience.errors import ThreadLockLostError
from tests.faults.harness import (
    DONE,
    TRIALS,
    Bank,
    Driver,
    Injector,
    Tally,
    Trial,
    build_app,
    calibrate,
    error_name,
    lapse_leases,
    outcome_of,
    plan_for,
    run_loop,
    user_input,
)
from tests.faults.proxy import PgProxy

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

THINK = 0.03
"""The model's latency per turn, at most (seconds): spreads the run's steps in time."""
ATTEMPTS = 200


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_lock_holder_lease_lapses(
    pg_dsn: str,
    proxy: PgProxy,
    direct: psycopg.Connection[Any],
    tally: Tally,
    mode: str,
) -> None:
    """Random lapse points over the whole run, 20 trials: A stops (or had finished), B
    finishes the thread, every amount is paid once."""
    bank = Bank(pg_dsn)
    driver = Driver(mode)

    async def trial(seed: int, pa: Any, pb: Any, span: float) -> None:
        rng = random.Random(seed)
        t = tally.add(Trial(seed, plan_for(seed)))
        thread = f"lock-{mode}-{seed}"
        app_a = build_app(pa, bank, t.plan, mode=mode, rng=rng, think=THINK)
        app_b = build_app(pb, bank, t.plan, mode=mode, rng=rng, think=THINK)
        delay = rng.uniform(0.0, span)
        locked = threading.Event()
        a_run = asyncio.ensure_future(
            outcome_of(driver.invoke(app_a, user_input(t.plan), thread, lock=pa, started=locked))
        )

        def kill() -> tuple[int, int, bool]:
            paid = sum(bank.counts(t.plan).values())
            return lapse_leases(direct), paid, a_run.done()

        injector = Injector(delay, kill, after=locked).start()
        a_run.add_done_callback(lambda _: None if locked.is_set() else injector.cancel())
        fired = await injector.join()
        if fired is None:  # A ended before it took the lock: its outcome is the problem
            _, a_exc = await a_run
            t.problems.append(f"A ended before it locked the thread: {a_exc!r}")
            return
        killed, paid_before, a_done = fired
        t.log(f"A locked; lapse at +{delay:.3f}s: {killed} lease(s), {paid_before} paid")
        if a_done:
            tally.note("A had finished before the lapse")
        b_how, b_exc = await outcome_of(driver.finish(app_b, thread, t.plan, lock=pb, wait=30))
        _, a_exc = await a_run
        t.log(f"A: {error_name(a_exc) if a_exc else 'finished'}")
        t.log(f"B: {error_name(b_exc) if b_exc else b_how}")
        if b_how == "restarted":
            tally.note("A stopped before its first checkpoint: B started the thread anew")
        tally.saw("A", a_exc)
        tally.saw("B (resume)", b_exc)
        if isinstance(a_exc, ThreadLockLostError):
            tally.note("A stopped with ThreadLockLostError")
        elif a_exc is None and not a_done:
            tally.note("A still running at the lapse, finished (its last write was checked before)")
        if a_exc is not None and not isinstance(a_exc, ThreadLockLostError):
            t.problems.append(f"A raised {error_name(a_exc)}: {a_exc}")
        if b_exc is not None:
            t.problems.append(f"B's resume raised {error_name(b_exc)}: {b_exc}")
        final = await driver.state(app_b, thread)
        last = final.values["messages"][-1].content if final.values else None
        if final.next or last != DONE:
            t.problems.append(f"thread not finished: next={final.next} last={last!r}")
        t.settle(bank, thread)

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            pa = await driver.open(stack, proxy.dsn(pg_dsn))
            pb = await driver.open(stack, proxy.dsn(pg_dsn, application_name="runner-b"))
            span = await calibrate(driver, pa, bank, think=THINK)
            tally.info.append(f"lapse point uniform over 0..{span:.3f}s after the lock")
            for seed in range(TRIALS):
                await trial(seed, pa, pb, span)

    run_loop(main)
    assert len(tally.trials) >= TRIALS
    assert not tally.bad_trials(), tally.failure_report()
    assert tally.duplicates == 0
    assert tally.lost == 0


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_effect_in_flight_when_the_lock_dies_is_paid_once(
    pg_dsn: str,
    proxy: PgProxy,
    direct: psycopg.Connection[Any],
    tally: Tally,
    mode: str,
) -> None:
    """The deterministic form of the window the random lapses rarely hit: A is held inside
    its ``pay`` (after the package's fence checks, before the request lands) while its
    lease lapses and B resumes the thread; then A's request lands."""
    bank = Bank(pg_dsn)
    driver = Driver(mode)
    t = tally.add(Trial(0, plan_for(0, size=1)))
    thread = f"in-flight-{mode}"
    entered, release = threading.Event(), threading.Event()

    def held_pay() -> Any:
        def pay(amount: int) -> str:
            entered.set()
            release.wait(30)  # the request is on the wire
            return bank.pay(current_idempotency_key(), amount)

        async def apay(amount: int) -> str:
            entered.set()
            await asyncio.to_thread(release.wait, 30)
            return await bank.apay(current_idempotency_key(), amount)

        return pay, apay

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            pa = await driver.open(stack, proxy.dsn(pg_dsn))
            pb = await driver.open(stack, proxy.dsn(pg_dsn, application_name="runner-b"))
            rng = random.Random(0)
            app_a = build_app(pa, bank, t.plan, mode=mode, rng=rng, pay=held_pay())
            app_b = build_app(pb, bank, t.plan, mode=mode, rng=rng)
            a_run = asyncio.ensure_future(
                outcome_of(driver.invoke(app_a, user_input(t.plan), thread, lock=pa))
            )
            assert await asyncio.to_thread(entered.wait, 30), "A never reached pay()"
            t.log(f"A inside pay(); lapsed {lapse_leases(direct)} lease(s)")
            how, b_exc = await outcome_of(driver.finish(app_b, thread, t.plan, lock=pb, wait=30))
            t.log(f"B: {error_name(b_exc) if b_exc else how}, {bank.counts(t.plan)} paid")
            release.set()
            _, a_exc = await a_run
            t.log(f"A's request landed; A: {error_name(a_exc) if a_exc else 'finished'}")
            tally.saw("A", a_exc)
            tally.saw("B (resume)", b_exc)
            assert b_exc is None, b_exc
            assert a_exc is None or isinstance(a_exc, ThreadLockLostError), a_exc

    try:
        run_loop(main)
    finally:
        release.set()
    t.settle(bank, thread)
    assert t.duplicates == 0, t.describe()
    assert t.lost == 0, t.describe()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_waited_lock_is_free_once_released(pg_dsn: str, proxy: PgProxy, mode: str) -> None:
    """Found by the lock-loss trials (B resumed with wait=30, got ThreadNotFoundError
    because A stopped before its first checkpoint, and could not start the thread)."""
    driver = Driver(mode)
    busy: list[str] = []

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            p = await driver.open(stack, proxy.dsn(pg_dsn))
            for n in range(ATTEMPTS):
                thread = f"waited-{mode}-{n}"
                await driver.hold(p, thread, wait=30)
                _, exc = await outcome_of(driver.hold(p, thread))
                if exc is not None:
                    busy.append(error_name(exc))

    run_loop(main)
    assert busy == [], f"{len(busy)} of {ATTEMPTS} immediate re-locks failed: {sorted(set(busy))}"


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_run_under_a_waited_lock_is_fenced(
    pg_dsn: str,
    proxy: PgProxy,
    direct: psycopg.Connection[Any],
    tally: Tally,
    mode: str,
) -> None:
    """A holds the thread with ``wait=``; between its first payment and its next turn its
    lease lapses and B finishes the thread; A must then stop (fenced)."""
    bank = Bank(pg_dsn)
    driver = Driver(mode)
    t = tally.add(Trial(0, plan_for(0, size=2)))
    thread = f"waited-fence-{mode}"
    paused, release = threading.Event(), threading.Event()

    def before_turn(n: int) -> None:
        if n == 2:  # the first payment answered, the model about to ask for the second
            paused.set()
            release.wait(30)

    async def main() -> tuple[BaseException | None, BaseException | None]:
        async with contextlib.AsyncExitStack() as stack:
            pa = await driver.open(stack, proxy.dsn(pg_dsn))
            pb = await driver.open(stack, proxy.dsn(pg_dsn, application_name="runner-b"))
            rng = random.Random(0)
            app_a = build_app(pa, bank, t.plan, mode=mode, rng=rng, before_turn=before_turn)
            app_b = build_app(pb, bank, t.plan, mode=mode, rng=rng)
            a_run = asyncio.ensure_future(
                outcome_of(driver.invoke(app_a, user_input(t.plan), thread, lock=pa, wait=30))
            )
            assert await asyncio.to_thread(paused.wait, 30), "A never reached its 2nd turn"
            t.log(f"A paused; lapsed {lapse_leases(direct)} lease(s)")
            how, b_exc = await outcome_of(driver.finish(app_b, thread, t.plan, lock=pb, wait=30))
            t.log(f"B: {error_name(b_exc) if b_exc else how}, {bank.counts(t.plan)} paid")
            release.set()
            _, a_exc = await a_run
            t.log(f"A: {error_name(a_exc) if a_exc else 'finished (not fenced)'}")
            tally.saw("A", a_exc)
            tally.saw("B (resume)", b_exc)
            return a_exc, b_exc

    try:
        a_exc, b_exc = run_loop(main)
    finally:
        release.set()
    t.settle(bank, thread)
    assert b_exc is None, b_exc
    assert t.duplicates == 0, t.describe()
    assert t.lost == 0, t.describe()
    assert isinstance(a_exc, ThreadLockLostError), f"A was not stopped: {a_exc!r}"
