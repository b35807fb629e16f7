"""Our own ledger failing is an infrastructure failure, never the tool's: retried, then
loud before the effect, and never reported as failed after it."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import ToolMessage
from langchain_core.tools import tool

from langgraph_resilience import ToolProfile, current_idempotency_key
from langgraph_resilience.core.backoff import LEDGER_RETRY_DELAYS
from langgraph_resilience.core.breaker import BreakerConfig
from langgraph_resilience.errors import LedgerUnavailableError
from langgraph_resilience.stores import InMemoryIdempotencyStore
from langgraph_resilience.stores.breakers import InMemoryBreakerStore
from langgraph_resilience.stores.saga import InMemorySagaLog
from langgraph_resilience.testing import text, tool_calls
from tests.conftest import Runner, build_graph


class DatabaseDown(Exception):
    """What a driver raises when the server is gone (psycopg.OperationalError-like)."""


class FlakyLedger(InMemoryIdempotencyStore):
    """An in-process ledger whose named operations fail the next `failures` times."""

    def __init__(self) -> None:
        super().__init__()
        self.failing: dict[str, int] = {}

    def _maybe_fail(self, name: str) -> None:
        left = self.failing.get(name, 0)
        if left:
            self.failing[name] = left - 1
            raise DatabaseDown(f"{name}: terminating connection due to administrator command")

    def claim(self, key: str, **kwargs: Any) -> Any:
        self._maybe_fail("claim")
        return super().claim(key, **kwargs)

    def record_outcome(self, key: str, result: Any, **kwargs: Any) -> Any:
        self._maybe_fail("record_outcome")
        return super().record_outcome(key, result, **kwargs)


def _graph(ledger: FlakyLedger, paid: list[str], **options: Any) -> Any:
    @tool
    def pay(amount: int) -> str:
        """Pay."""
        paid.append(str(current_idempotency_key()))
        return f"paid {amount}"

    return build_graph(
        [pay],
        [tool_calls(("pay", {"amount": 5})), text("done"), text("done")],
        profiles={"pay": ToolProfile(side_effect=True)},
        options={"idempotency": ledger, "saga": InMemorySagaLog(), **options},
    )


def test_a_blip_of_the_ledger_is_retried_with_backoff(runner: Runner) -> None:
    """Two failed claims (a fast restart): retried on the clock, then the payment runs once."""
    ledger, paid = FlakyLedger(), []
    ledger.failing["claim"] = 2
    h = _graph(ledger, paid)

    out = runner.invoke(h.app, {"messages": [("user", "pay")]}, h.config())

    assert len(paid) == 1
    assert h.clock.sleeps == list(LEDGER_RETRY_DELAYS[:2])
    [answer] = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert (answer.status, answer.content) == ("success", "paid 5")


def test_a_ledger_that_stays_down_stops_the_run_before_the_effect(runner: Runner) -> None:
    """No claim, no payment: the run fails loudly with our typed error (cause chained),
    the tool's breaker hears nothing, and a resume once the ledger is back pays once."""
    ledger, paid = FlakyLedger(), []
    ledger.failing["claim"] = len(LEDGER_RETRY_DELAYS) + 1
    store = InMemoryBreakerStore()
    trippy = BreakerConfig(window_size=1, minimum_calls=1)
    h = _graph(ledger, paid, breaker=trippy, breaker_store=store)
    config = h.config()

    with pytest.raises(LedgerUnavailableError) as raised:
        runner.invoke(h.app, {"messages": [("user", "pay")]}, config)

    assert isinstance(raised.value.__cause__, DatabaseDown)
    assert paid == []
    assert store.snapshot("pay").status_at(trippy, h.clock.time()) == "closed"
    out = runner.invoke(h.app, None, config)
    assert len(paid) == 1
    assert out["messages"][-1].content == "done"


def test_an_outcome_that_cannot_be_recorded_is_not_reported_as_a_failure(
    runner: Runner,
) -> None:
    """The payment happened; the outcome write fails: the agent hears 'paid' (never a
    failure it might retry), and the intent stays pending for reconciliation."""
    ledger, paid = FlakyLedger(), []
    ledger.failing["record_outcome"] = len(LEDGER_RETRY_DELAYS) + 1
    h = _graph(ledger, paid)
    config = h.config()

    out = runner.invoke(h.app, {"messages": [("user", "pay")]}, config)

    [answer] = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert (answer.status, answer.content) == ("success", "paid 5")
    assert len(paid) == 1
    [record] = ledger.for_thread(config["configurable"]["thread_id"])
    assert record.status == "pending"
