"""Scenario 2: the database server restarts during runs (through the proxy).

At a random moment of a run the proxy drops every connection (an immediate
restart) or drops them and refuses new ones for 0.2-1.5 s (a fast restart). A run
either completes, or raises; the types that reach the user are recorded. A run that
raised is resumed once (``resume(app, thread, lock=p)``) when the server is back and
must complete; every amount is paid exactly once. Half the trials hold the thread
lock (its session dies in the restart too), half do not.

Each trial opens its own `open_postgres` (a worker's lifetime); a long-lived pool
that grew to k idle connections before the restart is scenario 4's own test.

Then the same restart is landed at each statement a run sends (a proxy trigger),
deterministically; and a restart during a checkpoint write must reach the user as a
typed `PersistenceError` (the fenced savers' translation), never a raw driver error.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from typing import Any

import pytest

from langgraph_resilience import ResilienceError
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
    first_line,
    is_raw_driver_error,
    origin,
    outcome_of,
    plan_for,
    run_loop,
    user_input,
)
from tests.faults.proxy import PgProxy

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

THINK = 0.03


def restart_trials(pg_dsn: str, proxy: PgProxy, tally: Tally, mode: str) -> None:
    """Run the scenario's random trials, filling `tally`."""
    bank = Bank(pg_dsn)
    driver = Driver(mode)

    async def trial(seed: int, span: float) -> None:
        async with contextlib.AsyncExitStack() as stack:
            p = await driver.open(stack, proxy.dsn(pg_dsn))
            await one(seed, p, span)

    async def one(seed: int, p: Any, span: float) -> None:
        rng = random.Random(seed)
        t = tally.add(Trial(seed, plan_for(seed)))
        thread = f"restart-{mode}-{seed}"
        app = build_app(p, bank, t.plan, mode=mode, rng=rng, think=THINK)
        kind = rng.choice(["immediate", "fast"])
        refuse = rng.uniform(0.2, 1.5)
        delay = rng.uniform(0.0, span)
        locked = rng.random() < 0.5
        started = threading.Event()
        run = asyncio.ensure_future(
            outcome_of(
                driver.invoke(
                    app, user_input(t.plan), thread, lock=p if locked else None, started=started
                )
            )
        )

        def restart() -> tuple[int, int]:
            paid = sum(bank.counts(t.plan).values())
            dropped = proxy.drop_all() if kind == "immediate" else proxy.refuse_for(refuse)
            return dropped, paid

        dropped, paid = await Injector(delay, restart, after=started).start().join()
        what = "immediate" if kind == "immediate" else f"fast, refused {refuse:.2f}s"
        lock_text = "under the lock" if locked else "no lock"
        t.log(f"run {lock_text}; restart ({what}) at +{delay:.3f}s: {dropped} conns, {paid} paid")
        _, exc = await run
        await asyncio.to_thread(proxy.wait_listening)
        tally.saw("run", exc)
        t.log(f"run: {error_name(exc) if exc else 'completed'}")
        if exc is not None:
            tally.note(f"run raised {error_name(exc)} ({lock_text})")
            if is_raw_driver_error(exc) or not isinstance(exc, ResilienceError):
                t.log(f"raw error from {origin(exc)}: {first_line(exc)}")
                tally.note(f"raw {error_name(exc)} raised from {origin(exc)}")
            how, again = await outcome_of(driver.finish(app, thread, t.plan, lock=p))
            tally.saw("resume", again)
            t.log(f"then: {error_name(again) if again else how}")
            if again is not None:
                t.problems.append(f"the resume raised {error_name(again)}: {again}")
        else:
            tally.note(f"run completed ({lock_text})")
        final = await driver.state(app, thread)
        last = final.values["messages"][-1].content if final.values else None
        if final.next or last != DONE:
            t.problems.append(f"thread not finished: next={final.next} last={last!r}")
        t.settle(bank, thread)

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            p = await driver.open(stack, proxy.dsn(pg_dsn))
            span = await calibrate(driver, p, bank, think=THINK)
        tally.info.append(f"restart moment uniform over 0..{span:.3f}s of the run")
        for seed in range(TRIALS):
            await trial(seed, span)

    run_loop(main)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_server_restart(pg_dsn: str, proxy: PgProxy, tally: Tally, mode: str) -> None:
    """Random restarts, 20 trials: nothing doubled, nothing lost, every failed run
    resumed to the end. (The exception types are reported; that a checkpoint write's
    failure is typed is asserted below, where it is deterministic.)"""
    restart_trials(pg_dsn, proxy, tally, mode)
    assert len(tally.trials) >= TRIALS
    assert not tally.bad_trials(), tally.failure_report()
    assert tally.duplicates == 0
    assert tally.lost == 0


# ------------------------------------------------------------------ at exact protocol points

POINTS = [
    ("thread lock", b"lgr_acquire("),
    ("checkpoint blobs", b"INSERT INTO checkpoint_blobs"),
    ("checkpoint", b"INSERT INTO checkpoints"),
    ("checkpoint writes", b"INSERT INTO checkpoint_writes"),
    ("ledger claim", b"lgr_claim("),
    ("ledger outcome", b"lgr_outcome("),
]
"""Statements a run sends. A trigger fires at the first one sent after it is armed (no
statement is prepared: each carries its text). The fence's check is left out: it runs
on the same pool as the thread lock's statements, whose loss is the thread-lock
point's."""


async def restart_at(
    driver: Driver,
    pg_dsn: str,
    proxy: PgProxy,
    bank: Bank,
    t: Trial,
    tally: Tally,
    *,
    point: str,
    locked: bool = True,
) -> BaseException | None:
    """One run of `t.plan` on a fresh pool, the restart triggered by the first statement
    containing `point`'s pattern (before it reaches the server, or once it ran and its
    reply is lost); then the resume. Returns what the run raised."""
    name, when = point.rsplit(" ", 1)
    pattern = dict(POINTS)[name]
    thread = f"point-{driver.mode}-{t.seed}"
    async with contextlib.AsyncExitStack() as stack:
        p = await driver.open(stack, proxy.dsn(pg_dsn))
        app = build_app(p, bank, t.plan, mode=driver.mode, rng=random.Random(t.seed))
        fired = proxy.drop_when(pattern, when="before" if when == "before" else "reply")
        lock = p if locked else None
        _, exc = await outcome_of(driver.invoke(app, user_input(t.plan), thread, lock=lock))
        proxy.disarm()
        await asyncio.to_thread(proxy.wait_listening)
        t.log(f"restart at {point}: {'fired' if fired.is_set() else 'never reached'}")
        t.log(f"run ({'lock' if locked else 'no lock'}): {error_name(exc) if exc else 'completed'}")
        tally.saw("run", exc)
        lock_text = "lock" if locked else "no lock"
        tally.note(f"at {point} ({lock_text}): {error_name(exc) if exc else 'completed'}")
        if exc is not None:
            if not isinstance(exc, ResilienceError):
                t.log(f"raw error from {origin(exc)}: {first_line(exc)}")
            how, again = await outcome_of(driver.finish(app, thread, t.plan, lock=p))
            tally.saw("resume", again)
            t.log(f"then: {error_name(again) if again else how}")
            if again is not None:
                t.problems.append(f"the resume raised {error_name(again)}: {again}")
        final = await driver.state(app, thread)
        last = final.values["messages"][-1].content if final.values else None
        if final.next or last != DONE:
            t.problems.append(f"thread not finished: next={final.next} last={last!r}")
        if not fired.is_set():
            t.problems.append(f"the run never sent {pattern!r}")
    t.settle(bank, thread)
    return exc


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_server_restart_at_each_statement(
    pg_dsn: str, proxy: PgProxy, tally: Tally, mode: str
) -> None:
    """The same restart, landed deterministically at each statement a run sends, before
    it reaches the server and after it ran (its reply lost): paid exactly once."""
    bank = Bank(pg_dsn)
    driver = Driver(mode)
    points = [
        (f"{name} {when}", locked)
        for name, _ in POINTS
        for when in ("before", "reply")
        for locked in (True, False)
        if locked or name != "thread lock"
    ]

    async def main() -> None:
        for seed, (point, locked) in enumerate(points):
            t = tally.add(Trial(seed, plan_for(seed, size=2)))
            await restart_at(driver, pg_dsn, proxy, bank, t, tally, point=point, locked=locked)

    run_loop(main)
    assert len(tally.trials) == len(points)
    assert not tally.bad_trials(), tally.failure_report()
    assert tally.duplicates == 0
    assert tally.lost == 0


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_restart_during_a_checkpoint_write_reaches_the_user_as_a_typed_error(
    pg_dsn: str, proxy: PgProxy, tally: Tally, mode: str
) -> None:
    bank = Bank(pg_dsn)
    driver = Driver(mode)
    t = tally.add(Trial(0, plan_for(0, size=1)))

    async def main() -> BaseException | None:
        return await restart_at(driver, pg_dsn, proxy, bank, t, tally, point="checkpoint before")

    exc = run_loop(main)
    assert not t.problems, t.describe()
    assert t.duplicates == 0
    assert t.lost == 0
    assert exc is not None, "the restart did not reach the run"
    assert isinstance(exc, ResilienceError), (
        f"{error_name(exc)} from {origin(exc)} reached the user: {first_line(exc)}"
    )


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_run_whose_checkpoint_write_failed_is_resumed_at_once(
    pg_dsn: str, proxy: PgProxy, tally: Tally, mode: str
) -> None:
    """The restart lands on the run's first checkpoint write, with no lock held: the
    run's first step still runs beside the failed write and takes the thread's run
    lease, then the run raises. The resume that follows at once (no wait) must take the
    thread; it was refused (ThreadBusyError, the lease 30 s from lapsing) in 1 to 7 of
    32 such trials."""
    bank = Bank(pg_dsn)
    driver = Driver(mode)
    points = ["checkpoint blobs before", "checkpoint before"]

    async def main() -> None:
        for n in range(32):  # a thread and a plan per trial
            t = tally.add(Trial(n, plan_for(n, size=2)))
            point = points[n % 2]
            await restart_at(driver, pg_dsn, proxy, bank, t, tally, point=point, locked=False)

    run_loop(main)
    assert not tally.bad_trials(), tally.failure_report()
    assert tally.duplicates == 0
    assert tally.lost == 0
