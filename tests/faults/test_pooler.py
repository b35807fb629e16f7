"""Exactly-once through a transaction pooler: the same scenarios straight to PostgreSQL
and through Debian's PgBouncer in ``pool_mode=transaction`` (a pool of 2 backends
shared by every client, no prepared statements), effects counted as rows of the
bank's ``payments`` table (reached straight: it is the payment service).

- two concurrent resumers of one stopped thread, x20;
- a runner SIGKILLed at a random moment of its run, then the thread resumed, x20;
- four processes starting at once on a fresh database (every ``setup()``), x3.

Each asserts 0 duplicate payments, 0 lost, 0 threads left unresumable, 0 hangs (every
run and process is bounded by a timeout). With session advisory locks, through
PgBouncer: two processes both held one thread in 20 of 20 trials, 28 of 80 payments ran
twice with two resumers, 11 of 20 threads were left unresumable after a SIGKILL, and 1
of 4 processes starting together hung forever (issue 38).
"""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import random
import shutil
import signal
import subprocess
import time
import uuid
from typing import Any

import psycopg
import pytest

from langgraph_resilience import ThreadBusyError
from tests.conftest import ADMIN_DSN
from tests.faults.harness import (
    DONE,
    PLAN_SIZE,
    TRIALS,
    Bank,
    Driver,
    Tally,
    Trial,
    build_app,
    calibrate,
    error_name,
    outcome_of,
    plan_for,
    run_loop,
    user_input,
)
from tests.postgres.processes import spawn, wait_for_marker

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

WORKER = pathlib.Path(__file__).with_name("pay_worker.py")
THINK = 0.03
"""The model's latency per turn, at most (seconds): spreads the run's steps in time."""
TTL = 2.0
"""The lease TTL of the SIGKILL scenario: how long a killed runner keeps its thread."""
AHEAD = 2
"""Workers started ahead of their trial: their imports overlap the trials before."""
RUN_TIMEOUT = 90.0
"""No run, resume or process may take longer: past it, it counts as a hang."""


class Crash(Exception):
    """The first run of a thread stops here (its process would have died)."""


def other(dsn: str, name: str) -> str:
    """`dsn` as another worker reaches it (its own pool and connections)."""
    return psycopg.conninfo.make_conninfo(dsn, application_name=name)


async def bounded(awaitable: Any, tally: Tally, t: Trial, what: str) -> Any:
    """(result, error) of `awaitable` within `RUN_TIMEOUT`; a timeout is a hang."""
    try:
        return await asyncio.wait_for(outcome_of(awaitable), RUN_TIMEOUT)
    except TimeoutError:
        tally.note("hangs")
        t.problems.append(f"{what} hung")
        return None, TimeoutError(what)


async def settled(driver: Driver, app: Any, thread: str, t: Trial, tally: Tally) -> None:
    """The thread must be finished; else one more resume must finish it, or it is
    left unresumable."""
    final = await driver.state(app, thread)
    last = final.values["messages"][-1].content if final.values else None
    if final.next or last != DONE:
        tally.note("needed another resume")
        t.problems.append(f"not finished by its runners: next={final.next} last={last!r}")


def verdict(tally: Tally) -> None:
    assert len(tally.trials) >= 1
    assert tally.notes["hangs"] == 0, tally.failure_report()
    assert tally.notes["unresumable"] == 0, tally.failure_report()
    assert not tally.bad_trials(), tally.failure_report()
    assert tally.duplicates == 0
    assert tally.lost == 0


# ------------------------------------------------------------------ two resumers at once


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_two_resumers_of_one_thread(pg_route: str, pg_dsn: str, tally: Tally, mode: str) -> None:
    """A thread stopped after a random number of payments; two workers resume it at the
    same moment (each waiting for the other, or not, at random): one runs it to the end,
    the other waits and finds it done or is refused; every amount paid once."""
    bank = Bank(pg_dsn)
    driver = Driver(mode)

    async def trial(seed: int, first: Any, pa: Any, pb: Any) -> None:
        rng = random.Random(seed)
        t = tally.add(Trial(seed, plan_for(seed)))
        thread = f"two-{mode}-{seed}"
        stop_at = rng.randint(1, PLAN_SIZE)

        def crash(turn: int) -> None:
            if turn == stop_at:
                raise Crash(f"stopped before turn {turn}")

        app0 = build_app(first, bank, t.plan, mode=mode, rng=rng, before_turn=crash)
        _, exc = await bounded(
            driver.invoke(app0, user_input(t.plan), thread, lock=first), tally, t, "first run"
        )
        t.log(f"first run: {error_name(exc) if exc else 'finished'} at turn {stop_at}")
        apps = [build_app(p, bank, t.plan, mode=mode, rng=rng, think=THINK) for p in (pa, pb)]
        waits = [rng.choice([False, 30.0]) for _ in apps]

        async def resumer(app: Any, p: Any, wait: Any) -> Any:
            await asyncio.sleep(rng.uniform(0.0, 0.01))
            return await bounded(driver.resume(app, thread, lock=p, wait=wait), tally, t, "resume")

        outcomes = await asyncio.gather(
            *(resumer(a, p, w) for a, p, w in zip(apps, (pa, pb), waits, strict=True))
        )
        for (_, err), wait in zip(outcomes, waits, strict=True):
            t.log(f"resumer (wait={wait}): {error_name(err) if err else 'ran'}")
            tally.saw("resumer", err)
            if isinstance(err, ThreadBusyError):
                tally.note("a resumer was refused (the other held the thread)")
            elif err is not None and not isinstance(err, TimeoutError):
                t.problems.append(f"resumer raised {error_name(err)}: {err}")
        await settled(driver, apps[0], thread, t, tally)
        t.settle(bank, thread)

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            first = await driver.open(stack, other(pg_route, "first"))
            pa = await driver.open(stack, other(pg_route, "worker-a"))
            pb = await driver.open(stack, other(pg_route, "worker-b"))
            for seed in range(TRIALS):
                await trial(seed, first, pa, pb)

    run_loop(main)
    assert len(tally.trials) == TRIALS
    verdict(tally)


# ------------------------------------------------------------------ SIGKILL + resume


def test_sigkill_at_a_random_point_then_resume(pg_route: str, pg_dsn: str, tally: Tally) -> None:
    """A worker process (sync and async in turn) runs a plan under the thread's lease (TTL
    2 s) and is SIGKILLed at a random moment of its run; the thread is then resumed in
    the same mode (waiting for the dead worker's lease to lapse): it finishes, every
    amount paid once."""
    bank = Bank(pg_dsn)
    drivers = {mode: Driver(mode) for mode in ("sync", "async")}
    tmp = pathlib.Path(f"/tmp/lgr-kill-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()

    def mode_of(seed: int) -> str:
        return "async" if seed % 2 else "sync"

    def prepare(seed: int) -> tuple[subprocess.Popen[str], pathlib.Path, pathlib.Path]:
        """Start trial `seed`'s worker ahead (its imports overlap the trials before); it
        waits for its go file."""
        mode = mode_of(seed)
        thread, plan = f"kill-{mode}-{seed}", plan_for(seed)
        locked, go = tmp / f"locked-{seed}", tmp / f"go-{seed}"
        args = ["--dsn", pg_route, "--bank", pg_dsn, "--thread", thread, "--mode", mode]
        args += ["--plan", ",".join(map(str, plan)), "--seed", str(seed), "--think", str(THINK)]
        args += ["--ttl", str(TTL), "--locked", str(locked), "--go", str(go)]
        return spawn(WORKER, *args, killed=True), locked, go

    async def trial(seed: int, ps: dict[str, Any], span: float, prepared: Any) -> None:
        mode = mode_of(seed)
        driver, p = drivers[mode], ps[mode]
        rng = random.Random(seed)
        t = tally.add(Trial(seed, plan_for(seed)))
        thread = f"kill-{mode}-{seed}"
        worker, locked, go = prepared
        go.write_text("go")
        await asyncio.to_thread(wait_for_marker, locked, worker)
        delay = rng.uniform(0.0, span)
        await asyncio.sleep(delay)
        finished_first = worker.poll() is not None
        worker.send_signal(signal.SIGKILL)
        worker.wait(30)
        t.log(f"SIGKILL at +{delay:.3f}s ({'after it finished' if finished_first else 'mid-run'})")
        if finished_first:
            tally.note("the worker had finished before the kill")
        app = build_app(p, bank, t.plan, mode=mode, rng=rng, think=THINK)
        started = time.monotonic()
        resumed = driver.finish(app, thread, t.plan, lock=p, wait=30)
        how, exc = await bounded(resumed, tally, t, "resume")
        t.log(f"resume: {error_name(exc) if exc else how} after {time.monotonic() - started:.2f}s")
        tally.saw("resume", exc)
        if exc is not None:
            tally.note("unresumable")
            t.problems.append(f"the resume raised {error_name(exc)}: {exc}")
        if how == "restarted":
            tally.note("killed before its first checkpoint: started anew")
        await settled(driver, app, thread, t, tally)
        t.settle(bank, thread)

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            ps = {
                mode: await driver.open(stack, other(pg_route, f"resumer-{mode}"), lease_ttl=TTL)
                for mode, driver in drivers.items()
            }
            span = await calibrate(drivers["sync"], ps["sync"], bank, think=THINK)
            tally.info.append(f"kill point uniform over 0..{span:.3f}s after the lease is held")
            ahead = [prepare(seed) for seed in range(min(AHEAD, TRIALS))]
            try:
                for seed in range(TRIALS):
                    current = ahead.pop(0)
                    if seed + AHEAD < TRIALS:
                        ahead.append(prepare(seed + AHEAD))
                    await trial(seed, ps, span, current)
            finally:  # a trial that failed leaves the next workers waiting: end them
                for worker, _, _ in ahead:
                    worker.kill()
                    worker.wait(30)

    try:
        run_loop(main)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    assert len(tally.trials) == TRIALS
    verdict(tally)


# ------------------------------------------------------------------ four start-ups at once

ROUNDS = 3
STARTERS = 4


@contextlib.contextmanager
def fresh_database() -> Any:
    """A new, empty database (migrations really run), dropped after."""
    name = f"lgr_start_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield ADMIN_DSN.rpartition("/")[0] + f"/{name}"
    finally:
        with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def same_route(pg_route: str, pg_dsn: str, other_db: str) -> str:
    """`other_db` reached the way `pg_route` reaches `pg_dsn` (straight or via PgBouncer)."""
    return pg_route.replace(pg_dsn.rpartition("/")[2], other_db.rpartition("/")[2])


def test_four_processes_starting_at_once(
    pg_route: str, pg_dsn: str, tally: Tally, tmp_path: pathlib.Path
) -> None:
    """Four worker processes (two sync, two async) released at the same instant on an
    empty database: each sets every table up (one at a time, under the setup lease),
    then pays one amount on its own thread. None hangs, each pays once."""
    for round_ in range(ROUNDS):
        with fresh_database() as straight:
            dsn = same_route(pg_route, pg_dsn, straight)
            bank = Bank(straight)
            go = tmp_path / f"go-{round_}"
            workers: list[tuple[Trial, subprocess.Popen[str], pathlib.Path]] = []
            for n in range(STARTERS):
                t = tally.add(Trial(round_ * 10 + n, [1000 + round_ * 10 + n]))
                ready = tmp_path / f"ready-{round_}-{n}"
                args = ["--dsn", dsn, "--bank", straight, "--thread", f"start-{n}"]
                args += ["--plan", str(t.plan[0]), "--mode", "sync" if n % 2 else "async"]
                args += ["--ready", str(ready), "--go", str(go)]
                workers.append((t, spawn(WORKER, *args), ready))
            for _, worker, ready in workers:
                wait_for_marker(ready, worker)
            go.write_text("go")
            for t, worker, _ in workers:
                try:
                    out, err = worker.communicate(timeout=RUN_TIMEOUT)
                except subprocess.TimeoutExpired:
                    worker.kill()
                    worker.communicate()
                    tally.note("hangs")
                    t.problems.append("the process hung")
                    continue
                if worker.returncode != 0:
                    t.problems.append(f"exit {worker.returncode}: {err.strip().splitlines()[-1:]}")
                t.log(out.strip())
                t.settle(bank, "-")
    verdict(tally)
