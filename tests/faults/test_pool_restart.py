"""Scenario 4: the pool after a server restart.

A worker opens `open_postgres` through the proxy and runs one call; the server
"restarts" (`drop_all`: every pooled connection and the lock session die while
idle); then 8 calls run in a row. Each must succeed (the pool checks connections
on checkout) and no driver error may reach the caller. Each call pays one amount,
under the thread lock or not (drawn per call), after a random pause.

`test_a_pool_that_had_grown_before_the_restart` is the same restart on a pool
holding 8 idle connections (a worker that served concurrent runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from typing import Any

import pytest

from tests.faults.harness import (
    DONE,
    TRIALS,
    Bank,
    Driver,
    Tally,
    Trial,
    build_app,
    error_name,
    first_line,
    origin,
    outcome_of,
    run_loop,
    user_input,
)
from tests.faults.proxy import PgProxy

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

CALLS_AFTER = 8


async def _call(
    driver: Driver, p: Any, bank: Bank, amount: int, thread: str, *, locked: bool
) -> tuple[float, BaseException | None, Any]:
    app = build_app(p, bank, [amount], mode=driver.mode, rng=random.Random(amount))
    started = time.monotonic()
    out, exc = await outcome_of(
        driver.invoke(app, user_input([amount]), thread, lock=p if locked else None)
    )
    return time.monotonic() - started, exc, out


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_pool_after_restart(pg_dsn: str, proxy: PgProxy, tally: Tally, mode: str) -> None:
    bank = Bank(pg_dsn)
    driver = Driver(mode)
    slowest: list[float] = []

    async def trial(seed: int) -> None:
        rng = random.Random(seed)
        amounts = [seed * 100 + k for k in range(CALLS_AFTER + 1)]
        t = tally.add(Trial(seed, amounts))
        async with contextlib.AsyncExitStack() as stack:
            p = await driver.open(stack, proxy.dsn(pg_dsn))
            first = f"pool-{mode}-{seed}-0"
            took, exc, _ = await _call(driver, p, bank, amounts[0], first, locked=True)
            if exc is not None:
                t.problems.append(f"the call before the restart raised {error_name(exc)}")
            dropped = proxy.drop_all()
            pause = rng.uniform(0.0, 0.2)
            t.log(f"restart: {dropped} connections dropped; pause {pause:.3f}s")
            await asyncio.sleep(pause)  # the time between the restart and the next request
            for k, amount in enumerate(amounts[1:], start=1):
                locked = rng.random() < 0.5
                thread = f"pool-{mode}-{seed}-{k}"
                took, exc, out = await _call(driver, p, bank, amount, thread, locked=locked)
                tally.saw(f"call {'under the lock' if locked else 'no lock'}", exc)
                if k == 1:
                    slowest.append(took)
                if exc is not None:
                    t.problems.append(
                        f"call {k} ({'lock' if locked else 'no lock'}) raised {error_name(exc)} "
                        f"from {origin(exc)} after {took:.2f}s: {first_line(exc)}"
                    )
                elif out["messages"][-1].content != DONE:
                    t.problems.append(f"call {k} did not finish: {out['messages'][-1].content!r}")
        t.settle(bank, f"pool-{mode}-{seed}")

    async def main() -> None:
        for seed in range(TRIALS):
            await trial(seed)

    run_loop(main)
    if slowest:
        tally.info.append(f"first call after the restart took max {max(slowest):.2f}s")
    failures = sum(1 for t in tally.trials for p in t.problems if "raised" in p)
    calls = CALLS_AFTER * len(tally.trials)
    tally.info.append(f"failed calls after the restart: {failures} of {calls}")
    assert len(tally.trials) >= TRIALS
    assert not tally.bad_trials(), tally.failure_report()
    assert tally.duplicates == 0
    assert tally.lost == 0


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_pool_that_had_grown_before_the_restart(
    pg_dsn: str, proxy: PgProxy, tally: Tally, mode: str
) -> None:
    """8 idle pooled connections die in a restart; the next call must still succeed.

    psycopg_pool checks a connection on checkout and, after each failed check, waits
    (0, 1, 2, 4, 8, 16 s: its reconnection backoff) before checking the next one, so
    the k-th stale connection would cost 2**(k-2) s and the 30 s getconn timeout run
    out first; open_postgres's check purges every idle connection at the first one."""
    bank = Bank(pg_dsn)
    driver = Driver(mode)
    t = tally.add(Trial(0, [1, 2]))

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            p = await driver.open(stack, proxy.dsn(pg_dsn), min_size=8)
            _, exc, _ = await _call(driver, p, bank, 1, f"grown-{mode}-0", locked=True)
            assert exc is None
            t.log(f"restart: {proxy.drop_all()} connections dropped")
            took, exc, _ = await _call(driver, p, bank, 2, f"grown-{mode}-1", locked=True)
            tally.saw("call after the restart", exc)
            t.log(f"call: {error_name(exc) if exc else 'ok'} after {took:.1f}s")
            if exc is not None:
                t.problems.append(f"raised {error_name(exc)} from {origin(exc)}: {first_line(exc)}")
                app = build_app(p, bank, [2], mode=mode, rng=random.Random(2))
                t.log(await driver.finish(app, f"grown-{mode}-1", [2], lock=p))

    run_loop(main)
    t.settle(bank, f"grown-{mode}")
    assert not t.problems, t.describe()
    assert t.duplicates == 0
    assert t.lost == 0
