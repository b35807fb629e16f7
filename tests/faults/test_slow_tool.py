"""Scenario 5: a remote-like payment service slower than ``tool_timeout``.

``pay`` sends the payment to the service, which commits it on its own thread after
a random 0..2 x ``tool_timeout`` and only then answers; the tool waits for that
answer. So about half the attempts outlive ``ResiliencePolicy(tool_timeout=0.1)``:
the package stops waiting, the payment still lands, and the status check (the
``payments`` table) must not be believed while the attempt is in flight. The agent
re-issues any payment it was not told happened. Every amount must be paid exactly
once: none lost, none doubled.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from typing import Any

import pytest

from langgraph_resilience import ResiliencePolicy, current_idempotency_key
from tests.faults.harness import (
    DONE,
    TRIALS,
    Driver,
    PayImpl,
    SlowBank,
    Tally,
    Trial,
    build_app,
    error_name,
    outcome_of,
    plan_for,
    run_loop,
    user_input,
)
from tests.faults.proxy import PgProxy

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

TOOL_TIMEOUT = 0.1
SPREAD = 2
"""Latencies are uniform over 0..SPREAD x tool_timeout."""


def slow_pay(bank: SlowBank, rng: random.Random, delays: list[float]) -> PayImpl:
    """``pay`` on the slow service; each request's latency is drawn from `rng`."""
    guard = threading.Lock()

    def latency() -> float:
        with guard:
            delay = rng.uniform(0.0, SPREAD * TOOL_TIMEOUT)
            delays.append(delay)
            return delay

    def pay(amount: int) -> str:
        return bank.submit(current_idempotency_key(), amount, latency()).result(timeout=30)

    async def apay(amount: int) -> str:
        return await asyncio.wrap_future(bank.submit(current_idempotency_key(), amount, latency()))

    return pay, apay


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_slow_tool_past_tool_timeout(pg_dsn: str, proxy: PgProxy, tally: Tally, mode: str) -> None:
    bank = SlowBank(pg_dsn)
    driver = Driver(mode)
    policy = ResiliencePolicy(tool_timeout=TOOL_TIMEOUT)

    async def trial(seed: int, p: Any) -> None:
        rng = random.Random(seed)
        t = tally.add(Trial(seed, plan_for(seed)))
        thread = f"slow-{mode}-{seed}"
        delays: list[float] = []
        pay = slow_pay(bank, random.Random(rng.random()), delays)
        app = build_app(p, bank, t.plan, mode=mode, rng=rng, pay=pay, policy=policy)
        before = bank.requests
        out, exc = await outcome_of(driver.invoke(app, user_input(t.plan), thread, lock=p))
        await asyncio.to_thread(bank.drain)  # every request that left has landed
        late = sum(1 for d in delays if d > TOOL_TIMEOUT)
        t.log(f"{bank.requests - before} requests, latencies {[round(d, 3) for d in delays]}")
        tally.note("requests past tool_timeout", late)
        tally.note("requests sent", bank.requests - before)
        tally.saw("run", exc)
        if exc is not None:
            t.problems.append(f"the run raised {error_name(exc)}: {exc}")
        else:
            messages = out["messages"]
            errors = sum(1 for m in messages if getattr(m, "status", None) == "error")
            tally.note("error envelopes the agent saw (then re-issued)", errors)
            if messages[-1].content != DONE:
                t.problems.append(f"the run ended with {messages[-1].content!r}")
        t.settle(bank, thread)

    async def main() -> None:
        async with contextlib.AsyncExitStack() as stack:
            p = await driver.open(stack, proxy.dsn(pg_dsn))
            for seed in range(TRIALS):
                await trial(seed, p)

    run_loop(main)
    assert not bank.errors, bank.errors
    assert len(tally.trials) >= TRIALS
    assert not tally.bad_trials(), tally.failure_report()
    assert tally.duplicates == 0
    assert tally.lost == 0
