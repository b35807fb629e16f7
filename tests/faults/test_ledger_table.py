"""Scenario 3: the ledger's table disappears for a while (``lgr_idempotency`` renamed).

At a random moment of a run, ``ALTER TABLE lgr_idempotency RENAME TO
lgr_idempotency_away`` (over a direct connection); it is renamed back either after
a random 0.1-2.5 s ("short": the ledger's ~3 s of retries may ride it out) or only
once the run has ended ("long"). A run that raises must raise
`LedgerUnavailableError` before the effect: what was paid at that moment is exactly
what the agent had been told was paid. Then a resume (the table back) pays the rest
exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from typing import Any

import psycopg
import pytest

from langgraph_resilience.errors import LedgerUnavailableError
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
    confirmed,
    error_name,
    first_line,
    outcome_of,
    plan_for,
    run_loop,
    user_input,
)
from tests.faults.proxy import PgProxy

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

THINK = 0.03


class Ledger:
    """Renames the ledger's table away and back, over a direct connection."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn
        self.guard = threading.Lock()
        self.away = False

    def hide(self) -> None:
        with self.guard:
            self.conn.execute("SET lock_timeout = '5s'")
            self.conn.execute("ALTER TABLE lgr_idempotency RENAME TO lgr_idempotency_away")
            self.away = True

    def restore(self) -> None:
        with self.guard:
            if self.away:
                self.conn.execute("ALTER TABLE lgr_idempotency_away RENAME TO lgr_idempotency")
                self.away = False


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_ledger_table_unavailable(
    pg_dsn: str,
    proxy: PgProxy,
    direct: psycopg.Connection[Any],
    tally: Tally,
    mode: str,
) -> None:
    bank = Bank(pg_dsn)
    driver = Driver(mode)
    ledger = Ledger(direct)

    async def trial(seed: int, p: Any, span: float) -> None:
        rng = random.Random(seed)
        t = tally.add(Trial(seed, plan_for(seed)))
        thread = f"ledger-{mode}-{seed}"
        app = build_app(p, bank, t.plan, mode=mode, rng=rng, think=THINK)
        delay = rng.uniform(0.0, span)
        long = rng.random() < 0.5
        away = rng.uniform(0.1, 2.5)
        started, ended = threading.Event(), threading.Event()

        async def run() -> Any:
            try:
                return await driver.invoke(app, user_input(t.plan), thread, lock=p, started=started)
            finally:
                ended.set()

        running = asyncio.ensure_future(outcome_of(run()))

        def fault() -> int:
            paid = sum(bank.counts(t.plan).values())
            ledger.hide()
            if long:
                ended.wait(60)
            else:
                ended.wait(away)
            ledger.restore()
            return paid

        injector = Injector(delay, fault, after=started).start()
        _, exc = await running
        paid = await injector.join()
        how = "until the run ended" if long else f"{away:.2f}s"
        t.log(f"table away at +{delay:.3f}s for {how} ({paid} paid)")
        tally.saw("run", exc)
        if exc is None:
            t.log("run: completed")
            tally.note("run completed (retried through it, or the table was not touched)")
        else:
            op = getattr(exc, "operation", "?")
            t.log(f"run: {error_name(exc)} ({op}): {first_line(exc)}")
            tally.note(f"run raised {error_name(exc)} at {op}")
            if not isinstance(exc, LedgerUnavailableError):
                t.problems.append(f"the run raised {error_name(exc)}, not LedgerUnavailableError")
            state = await driver.state(app, thread)
            told = confirmed(state.values.get("messages", [])) if state.values else set()
            paid_now = {a for a, n in bank.counts(t.plan).items() if n}
            if paid_now != told:
                t.problems.append(f"at the failure paid={sorted(paid_now)} told={sorted(told)}")
            how_done, again = await outcome_of(driver.finish(app, thread, t.plan, lock=p))
            tally.saw("resume", again)
            t.log(f"then: {error_name(again) if again else how_done}")
            if again is not None:
                t.problems.append(f"the resume raised {error_name(again)}: {again}")
        final = await driver.state(app, thread)
        last = final.values["messages"][-1].content if final.values else None
        if final.next or last != DONE:
            t.problems.append(f"thread not finished: next={final.next} last={last!r}")
        t.settle(bank, thread)

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            p = await driver.open(stack, proxy.dsn(pg_dsn))
            span = await calibrate(driver, p, bank, think=THINK)
            tally.info.append(f"fault moment uniform over 0..{span:.3f}s of the run")
            for seed in range(TRIALS):
                await trial(seed, p, span)

    try:
        run_loop(main)
    finally:
        ledger.restore()
    assert len(tally.trials) >= TRIALS
    assert not tally.bad_trials(), tally.failure_report()
    assert tally.duplicates == 0
    assert tally.lost == 0
