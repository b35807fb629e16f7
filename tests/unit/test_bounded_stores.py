"""The in-process breaker and retry-budget stores stay bounded, whatever the number of keys.

A fresh breaker is not stored at all; over `max_entries` the store forgets closed
breakers with an empty window first, then other closed ones, least recently used
first, and never an open or half-open one. Time is the `now` the callers pass
(`FakeClock.time()`): nothing sleeps.
"""

from __future__ import annotations

import pytest

from langgraph_resilience.core.breaker import BreakerConfig
from langgraph_resilience.core.budget import RetryBudget
from langgraph_resilience.errors import ConfigurationError, FailureClass
from langgraph_resilience.stores.breakers import InMemoryBreakerStore
from langgraph_resilience.stores.budgets import InMemoryRetryBudgetStore
from langgraph_resilience.stores.memory import DEFAULT_MAX_ENTRIES
from langgraph_resilience.testing import FakeClock

FAIL = FailureClass.TRANSIENT
TRIP = BreakerConfig(window_size=2, minimum_calls=2, open_duration=60.0)
TIMED = BreakerConfig(window="time", window_size=10.0, minimum_calls=2, open_duration=60.0)


def _open(store: InMemoryBreakerStore, key: str, now: float, cfg: BreakerConfig = TRIP) -> None:
    store.record(key, cfg, now, FAIL)
    store.record(key, cfg, now, FAIL)
    assert store.snapshot(key).status == "open"


def test_a_breaker_per_key_no_longer_grows_without_bound() -> None:
    """10 x the bound in distinct keys, each with a success: the store holds at most the bound."""
    clock = FakeClock()
    store = InMemoryBreakerStore(max_entries=100)
    for n in range(1000):
        store.record(f"host-{n}", TRIP, clock.time(), None)
        assert len(store) <= 100
    assert DEFAULT_MAX_ENTRIES == 10_000
    assert InMemoryBreakerStore().max_entries == DEFAULT_MAX_ENTRIES


def test_a_fresh_breaker_is_not_stored() -> None:
    """Admissions of closed breakers write nothing; a breaker closed again is forgotten."""
    clock = FakeClock()
    store = InMemoryBreakerStore(max_entries=10)
    cfg = BreakerConfig(window_size=2, minimum_calls=2, open_duration=1.0, half_open_max_calls=1)
    for n in range(50):
        assert store.acquire(f"k{n}", cfg, clock.time()).allowed
    assert len(store) == 0
    _open(store, "k", clock.time(), cfg)
    clock.advance(1.0)
    admission = store.acquire("k", cfg, clock.time())
    assert admission.probe
    transition = store.record("k", cfg, clock.time(), None, probe=True)
    assert transition is not None
    assert transition.name == "half_open->closed"
    assert len(store) == 0
    assert store.snapshot("k").status == "closed"


def test_open_and_half_open_breakers_are_never_evicted() -> None:
    """Closed breakers go to make room; open and half-open ones stay, even past the bound."""
    clock = FakeClock()
    store = InMemoryBreakerStore(max_entries=3)
    _open(store, "open", clock.time())
    cfg = BreakerConfig(window_size=2, minimum_calls=2, open_duration=1.0)
    _open(store, "half", clock.time(), cfg)
    clock.advance(1.0)
    assert store.acquire("half", cfg, clock.time()).probe  # half-open, its probe in flight
    for n in range(20):
        store.record(f"closed-{n}", TRIP, clock.time(), None)
    _open(store, "open-2", clock.time())
    _open(store, "open-3", clock.time())

    assert store.snapshot("open").status == "open"
    assert store.snapshot("half").status == "half_open"
    assert store.snapshot("open-2").status == "open"
    assert store.snapshot("open-3").status == "open"
    assert len(store) == 4  # every one is open or half-open: over the bound, none forgotten
    refused = store.acquire("open", TRIP, clock.time())
    assert not refused.allowed


def test_closed_breakers_with_an_empty_window_go_first() -> None:
    """A closed breaker whose time window aged out loses nothing: it goes before one that
    still counts recent failures, even one used longer ago."""
    clock = FakeClock()
    store = InMemoryBreakerStore(max_entries=3)
    store.record("failing", TRIP, clock.time(), FAIL)  # the least recently used; 1 failure
    clock.advance(1.0)
    store.record("quiet", TIMED, clock.time(), None)
    clock.advance(20.0)  # "quiet"'s 10 s window is empty now
    store.record("busy", TIMED, clock.time(), None)

    store.record("new", TIMED, clock.time(), None)

    assert len(store) == 3
    assert store.snapshot("quiet").window is None  # forgotten: a fresh breaker again
    assert store.snapshot("failing").window is not None
    # The kept failure still counts: one more opens the breaker (window 2, minimum 2).
    store.record("failing", TRIP, clock.time(), FAIL)
    assert store.snapshot("failing").status == "open"


def test_otherwise_the_least_recently_used_closed_breaker_goes() -> None:
    """With no empty window anywhere (count windows), LRU order decides among closed ones."""
    clock = FakeClock()
    store = InMemoryBreakerStore(max_entries=3)
    for key in ("a", "b", "c"):
        store.record(key, TRIP, clock.time(), None)
    store.record("a", TRIP, clock.time(), None)  # a is now the most recently used

    store.record("d", TRIP, clock.time(), None)

    assert store.snapshot("b").window is None  # forgotten
    assert all(store.snapshot(k).window is not None for k in ("a", "c", "d"))


def test_eviction_frees_a_tenth_of_the_bound_at_once() -> None:
    """Past the bound it forgets down to 90% in one scan, not one key per new key."""
    clock = FakeClock()
    store = InMemoryBreakerStore(max_entries=100)
    for n in range(100):
        store.record(f"k{n}", TRIP, clock.time(), None)
    store.record("k100", TRIP, clock.time(), None)
    assert len(store) == 90
    assert store.snapshot("k100").window is not None
    assert store.snapshot("k0").window is None
    assert store.snapshot("k11").window is not None


def test_unbounded_when_asked() -> None:
    store = InMemoryBreakerStore(max_entries=None)
    for n in range(300):
        store.record(f"k{n}", TRIP, 0.0, None)
    assert len(store) == 300


@pytest.mark.parametrize("bad", [0, -1, True, 2.5])
def test_bad_bounds_fail_at_construction(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="max_entries"):
        InMemoryBreakerStore(max_entries=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="max_entries"):
        InMemoryRetryBudgetStore(max_entries=bad)  # type: ignore[arg-type]


# ------------------------------------------------------------------ retry budgets


def test_retry_budgets_stay_bounded() -> None:
    clock = FakeClock()
    budgets = InMemoryRetryBudgetStore(max_entries=50)
    for n in range(500):
        budgets.deposit(f"k{n}", RetryBudget(), clock.time())
        assert len(budgets) <= 50
    assert InMemoryRetryBudgetStore().max_entries == DEFAULT_MAX_ENTRIES


def test_full_buckets_are_forgotten_before_spent_ones() -> None:
    """A bucket refilled to full is what an unknown key gets: it goes first. A spent
    bucket is kept, so eviction never hands a key its retries back early."""
    clock = FakeClock()
    budget = RetryBudget(max_tokens=2.0, min_retries_per_second=0.0)
    budgets = InMemoryRetryBudgetStore(max_entries=3)
    assert budgets.try_withdraw("spent", budget, clock.time())
    assert budgets.try_withdraw("spent", budget, clock.time())
    assert not budgets.try_withdraw("spent", budget, clock.time())
    budgets.deposit("full-1", budget, clock.time())
    budgets.deposit("full-2", budget, clock.time())

    budgets.deposit("new", budget, clock.time())

    assert len(budgets) == 3
    assert budgets.snapshot("full-1").tokens is None  # forgotten (a full bucket)
    assert not budgets.try_withdraw("spent", budget, clock.time())  # still spent


def test_buckets_refilled_by_time_count_as_full() -> None:
    clock = FakeClock()
    budget = RetryBudget(max_tokens=1.0, min_retries_per_second=1.0)
    budgets = InMemoryRetryBudgetStore(max_entries=2)
    assert budgets.try_withdraw("early", budget, clock.time())
    clock.advance(5.0)  # refilled by the floor since
    assert budgets.try_withdraw("recent", budget, clock.time())  # empty now

    budgets.deposit("new", budget, clock.time())

    assert budgets.snapshot("early").tokens is None
    assert budgets.snapshot("recent").tokens == 0.0  # kept: spent
