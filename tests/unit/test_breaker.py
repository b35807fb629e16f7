"""The breaker state machine (pure), its in-memory store, `CircuitBreaker` and the retry budget."""

from __future__ import annotations

import asyncio
import collections
import datetime as dt
import json
import logging
import math
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langgraph.errors import GraphInterrupt

from langgraph_resilience.core.breaker import (
    Admission,
    BreakerConfig,
    BreakerState,
    BreakerStore,
    Transition,
    admit,
    record,
    release,
)
from langgraph_resilience.core.budget import (
    RetryBudget,
    RetryBudgetState,
    budget_deposit,
    budget_withdraw,
)
from langgraph_resilience.core.windows import TIME_BUCKETS, CountWindow, TimeWindow
from langgraph_resilience.errors import CircuitOpenError, ConfigurationError, FailureClass
from langgraph_resilience.stores.breakers import CircuitBreaker, InMemoryBreakerStore
from langgraph_resilience.stores.budgets import InMemoryRetryBudgetStore
from langgraph_resilience.testing import FakeClock, FakeHTTPError

T = FailureClass.TRANSIENT
S = FailureClass.SEMANTIC
ST = FailureClass.STRUCTURAL
P = FailureClass.POLICY
OK = None


def run(
    state: BreakerState, cfg: BreakerConfig, now: float, *outcomes: FailureClass | None
) -> tuple[BreakerState, list[Transition]]:
    """Record closed-state outcomes in order; return the final state and the transitions."""
    transitions = []
    for outcome in outcomes:
        state, transition = record(state, cfg, now, outcome)
        if transition is not None:
            transitions.append(transition)
    return state, transitions


def opened(cfg: BreakerConfig, now: float = 0.0) -> BreakerState:
    """A breaker tripped at `now` by a window full of transient failures."""
    state, transitions = run(BreakerState(), cfg, now, *[T] * cfg.minimum_calls)
    assert [t.name for t in transitions] == ["closed->open"]
    return state


# ------------------------------------------------------------------ configuration


def test_defaults_are_documented_values() -> None:
    """The defaults are the ones the docstring's table compares with resilience4j."""
    cfg = BreakerConfig()
    assert (cfg.window, cfg.window_size, cfg.failure_rate_threshold) == ("count", 50, 0.5)
    assert (cfg.minimum_calls, cfg.open_duration, cfg.half_open_max_calls) == (30, 60.0, 1)
    assert cfg.slow_call_threshold is None
    assert cfg.counted_classes == frozenset({T, ST})


def test_durations_accept_timedelta() -> None:
    """Durations are given as seconds or timedelta and stored as float seconds."""
    cfg = BreakerConfig(
        window="time",
        window_size=dt.timedelta(minutes=1),
        open_duration=dt.timedelta(seconds=90),
        slow_call_threshold=dt.timedelta(milliseconds=1500),
    )
    assert (cfg.window_size, cfg.open_duration_s, cfg.slow_call_threshold_s) == (60.0, 90.0, 1.5)


@pytest.mark.parametrize(
    ("kwargs", "hint"),
    [
        ({"failure_rate_threshold": 0}, "(0, 1]"),
        ({"failure_rate_threshold": 0.0}, "(0, 1]"),
        ({"failure_rate_threshold": 1.01}, "(0, 1]"),
        ({"failure_rate_threshold": -0.5}, "(0, 1]"),
        ({"failure_rate_threshold": math.nan}, "(0, 1]"),
        ({"failure_rate_threshold": True}, "(0, 1]"),
        ({"failure_rate_threshold": "0.5"}, "(0, 1]"),
        ({"slow_call_rate_threshold": 2.0}, "(0, 1]"),
        ({"open_duration": -1}, "> 0 seconds"),
        ({"open_duration": 0}, "> 0 seconds"),
        ({"open_duration": dt.timedelta(seconds=-5)}, "> 0 seconds"),
        ({"open_duration": math.inf}, "finite"),
        ({"half_open_timeout": -0.1}, "> 0 seconds"),
        ({"slow_call_threshold": -2.0}, "> 0 seconds"),
        ({"window": "time", "window_size": -10}, "> 0 seconds"),
        ({"window": "sliding"}, "'count' or 'time'"),
        ({"window_size": 0}, "integer >= 1"),
        ({"window_size": 2.5}, "window='time'"),
        ({"window_size": dt.timedelta(seconds=5)}, "window='time'"),
        ({"minimum_calls": 0}, "integer >= 1"),
        ({"half_open_max_calls": 0}, "integer >= 1"),
        ({"window_size": 10, "minimum_calls": 11}, "lower minimum_calls or raise window_size"),
        ({"counted_classes": "transient"}, "collection of FailureClass"),
        ({"counted_classes": frozenset({"nope"})}, "collection of FailureClass"),
        ({"counted_classes": frozenset()}, "could never open"),
    ],
)
def test_bad_configuration_fails_at_construction(kwargs: dict[str, Any], hint: str) -> None:
    """Invalid values raise ConfigurationError at construction, saying how to fix them."""
    with pytest.raises(ConfigurationError) as info:
        BreakerConfig(**kwargs)
    assert hint in str(info.value)


def test_config_is_frozen_keyword_only_and_slotted() -> None:
    """A config cannot be mutated, takes keywords only and has no __dict__."""
    cfg = BreakerConfig()
    with pytest.raises(AttributeError):
        cfg.minimum_calls = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        BreakerConfig("count")  # type: ignore[call-arg]
    assert not hasattr(cfg, "__dict__")


def test_counted_classes_accept_strings_and_only_slow_calls() -> None:
    """counted_classes may be given as strings; empty is fine when slow calls count."""
    strings = frozenset({"transient"})
    assert BreakerConfig(counted_classes=strings).counted_classes == {T}  # type: ignore[arg-type]
    cfg = BreakerConfig(counted_classes=frozenset(), slow_call_threshold=1.0)
    assert cfg.counted_classes == frozenset()


# ------------------------------------------------------------------ closed -> open


def test_below_minimum_calls_never_opens() -> None:
    """Even 100% failures keep the breaker closed until minimum_calls are in the window."""
    cfg = BreakerConfig(window_size=10, minimum_calls=5)
    state, transitions = run(BreakerState(), cfg, 0.0, T, T, T, T)
    assert state.status == "closed"
    assert transitions == []
    state, transitions = run(state, cfg, 0.0, T)
    assert state.status == "open"


@pytest.mark.parametrize(
    ("threshold", "failures", "successes", "opens"),
    [
        (0.5, 5, 5, True),  # exactly at the threshold: opens (>=, as resilience4j)
        (0.5, 4, 6, False),  # just below
        (0.3, 3, 7, True),  # 3/10 == 0.3 in floating point too
        (0.3, 2, 8, False),
        (1.0, 10, 0, True),
        (1.0, 9, 1, False),
        (0.1, 1, 9, True),
    ],
)
def test_failure_rate_threshold_boundary(
    threshold: float, failures: int, successes: int, opens: bool
) -> None:
    """The breaker opens when failures/calls reaches the threshold, not below it."""
    cfg = BreakerConfig(window_size=10, minimum_calls=10, failure_rate_threshold=threshold)
    state, transitions = run(BreakerState(), cfg, 0.0, *[OK] * successes, *[T] * failures)
    assert (state.status == "open") is opens
    if opens:
        assert [(t.name, t.reason) for t in transitions] == [("closed->open", "failure_rate")]


@pytest.mark.parametrize("ignored", [S, P, FailureClass.UNKNOWN, FailureClass.PARTIAL])
def test_uncounted_failures_are_ignored(ignored: FailureClass) -> None:
    """SEMANTIC, POLICY and other uncounted failures neither fail nor succeed."""
    cfg = BreakerConfig(window_size=10, minimum_calls=2)
    state, transitions = run(BreakerState(), cfg, 0.0, *[ignored] * 50)
    assert state == BreakerState()
    assert transitions == []
    state, _ = run(state, cfg, 0.0, T, ignored, T)
    assert state.status == "open"


def test_structural_failures_count_by_default() -> None:
    """STRUCTURAL failures (404/410, missing endpoint) count against the breaker."""
    state, _ = run(BreakerState(), BreakerConfig(minimum_calls=2), 0.0, ST, ST)
    assert state.status == "open"


def test_custom_counted_classes() -> None:
    """Only the configured classes count."""
    cfg = BreakerConfig(minimum_calls=2, counted_classes=frozenset({P}))
    state, _ = run(BreakerState(), cfg, 0.0, T, T, T)
    assert state.status == "closed"
    state, _ = run(state, cfg, 0.0, P, P, P)
    assert state.status == "open"


def test_count_window_evicts_oldest_outcomes() -> None:
    """Failures older than window_size calls leave the window."""
    cfg = BreakerConfig(window_size=10, minimum_calls=10, failure_rate_threshold=0.5)
    state, _ = run(BreakerState(), cfg, 0.0, *[T] * 4, *[OK] * 6)
    assert isinstance(state.window, CountWindow)
    assert (state.window.calls, state.window.failures) == (10, 4)
    state, _ = run(state, cfg, 0.0, *[OK] * 4)
    assert isinstance(state.window, CountWindow)
    assert (state.window.calls, state.window.failures) == (10, 0)
    # Five fresh failures now make exactly 50% of the last ten calls.
    state, transitions = run(state, cfg, 0.0, T, T, T, T)
    assert state.status == "closed"
    state, transitions = run(state, cfg, 0.0, T)
    assert [t.name for t in transitions] == ["closed->open"]


def test_a_success_that_changes_nothing_returns_the_same_state() -> None:
    """A clean success on a full ring of clean outcomes, or any result while open, is
    the same state object (what lets the Postgres store skip writing it); a success
    that fills, shifts a failure or a slow call, or arrives half-open changes it."""
    cfg = BreakerConfig(window_size=3, minimum_calls=3, slow_call_threshold=1.0)
    full, _ = run(BreakerState(), cfg, 0.0, OK, OK, OK)
    assert record(full, cfg, 1.0, None, duration=0.1)[0] is full
    assert full.window is not None
    assert full.window.add(1.0, False, False) is full.window
    filling, _ = run(BreakerState(), cfg, 0.0, OK, OK)
    assert record(filling, cfg, 1.0, None)[0] is not filling
    failed, _ = run(full, cfg, 0.0, T)
    after, _ = record(failed, cfg, 1.0, None)
    assert after is not failed
    assert after.window is not None
    assert after.window.failures == 1  # the failure is still one of the last three
    assert record(full, cfg, 1.0, None, duration=2.0)[0] is not full  # slow
    other_size = BreakerConfig(window_size=4, minimum_calls=3)
    assert record(full, other_size, 1.0, None)[0] is not full  # a fresh window
    opened, _ = run(BreakerState(), cfg, 0.0, T, T, T)
    assert opened.status == "open"
    assert record(opened, cfg, 1.0, None)[0] is opened


def test_time_window_evicts_by_age() -> None:
    """Outcomes older than the window's span stop counting."""
    cfg = BreakerConfig(window="time", window_size=10.0, minimum_calls=4)
    state, _ = run(BreakerState(), cfg, 0.0, T, T, T)
    state, _ = run(state, cfg, 5.0, OK)  # 3/4 would trip, if the failures were still there
    assert state.status == "open"
    state, _ = run(BreakerState(), cfg, 0.0, T, T, T)
    state, _ = run(state, cfg, 10.0, OK)  # the failures' bucket ended: 1 call in the window
    assert state.status == "closed"
    assert isinstance(state.window, TimeWindow)
    assert (state.window.calls, state.window.failures) == (1, 0)


def test_time_window_bucket_granularity() -> None:
    """A bucket leaves whole: an outcome counts for between 9/10 and all of the span."""
    cfg = BreakerConfig(window="time", window_size=10.0, minimum_calls=1, failure_rate_threshold=1)
    window = TimeWindow(10.0).add(0.5, True, False)  # bucket [0, 1)
    assert window.evict(9.99).calls == 1
    assert window.evict(10.0).calls == 0
    assert len(TimeWindow(10.0).add(0.0, False, False).add(9.0, False, False).buckets) == 2
    assert cfg.window_seconds / TIME_BUCKETS == 1.0


def test_slow_calls_open_the_breaker() -> None:
    """Successful but slow calls trip the breaker by the slow-call rate."""
    cfg = BreakerConfig(
        minimum_calls=4, window_size=4, slow_call_threshold=2.0, slow_call_rate_threshold=0.75
    )
    below = BreakerState()
    for duration in (2.0, 5.0, 1.99, 1.99):  # 1.99 s is not slow: 2/4 slow
        below, transition = record(below, cfg, 0.0, OK, duration=duration)
    assert (below.status, transition) == ("closed", None)
    state = BreakerState()
    for duration in (2.0, 5.0, 1.99):
        state, transition = record(state, cfg, 0.0, OK, duration=duration)
    state, transition = record(state, cfg, 0.0, OK, duration=2.0)  # 3/4 slow: at the threshold
    assert transition is not None
    assert (transition.name, transition.reason) == ("closed->open", "slow_call_rate")


def test_slow_calls_do_not_count_without_a_threshold() -> None:
    """Without slow_call_threshold a duration changes nothing."""
    cfg = BreakerConfig(minimum_calls=2, window_size=2)
    state, _ = record(BreakerState(), cfg, 0.0, OK, duration=1e9)
    state, _ = record(state, cfg, 0.0, OK, duration=1e9)
    assert state.status == "closed"


def test_changed_window_config_starts_a_fresh_window() -> None:
    """A stored window built for another window size is replaced, not misread."""
    state, _ = run(BreakerState(), BreakerConfig(window_size=10, minimum_calls=5), 0.0, T, T, T, T)
    state, _ = record(state, BreakerConfig(window_size=20, minimum_calls=5), 0.0, T)
    assert isinstance(state.window, CountWindow)
    assert (state.window.size, state.window.calls) == (20, 1)
    state, _ = record(state, BreakerConfig(window="time", window_size=20, minimum_calls=5), 0.0, T)
    assert isinstance(state.window, TimeWindow)


# --------------------------------------------------------------------- open state


def test_open_refuses_until_open_duration_elapsed() -> None:
    """Open refuses with the remaining time as retry_after, and half-opens exactly on time."""
    cfg = BreakerConfig(open_duration=30.0)
    state = opened(cfg, now=100.0)
    admission, same, transition = admit(state, cfg, 100.0)
    assert admission == Admission(False, False, 30.0, "open")
    assert same is state
    assert transition is None
    admission, _, _ = admit(state, cfg, 129.999)
    assert not admission.allowed
    assert admission.retry_after == pytest.approx(0.001)
    assert admission.retry_after_ms == 1
    admission, state, transition = admit(state, cfg, 130.0)
    assert admission == Admission(True, True, 0.0, "half_open")
    assert transition == Transition("open", "half_open", "open_duration_elapsed", 130.0)
    assert state.status == "half_open"


def test_results_arriving_while_open_are_ignored() -> None:
    """Late results of calls admitted before the breaker opened change nothing."""
    cfg = BreakerConfig()
    state = opened(cfg)
    for outcome in (OK, T, S):
        new, transition = record(state, cfg, 1.0, outcome)
        assert new is state
        assert transition is None


def test_status_at_reports_half_open_after_open_duration() -> None:
    """status_at tells planners an open breaker past open_duration will admit a probe."""
    cfg = BreakerConfig(open_duration=10.0)
    state = opened(cfg)
    assert state.status_at(cfg, 9.9) == "open"
    assert state.status_at(cfg, 10.0) == "half_open"
    assert BreakerState().status_at(cfg, 0.0) == "closed"


# ---------------------------------------------------------------------- half-open


def half_open(cfg: BreakerConfig) -> tuple[BreakerState, float]:
    """A breaker opened at 0 and the first moment it may half-open."""
    return opened(cfg), cfg.open_duration_s


@pytest.mark.parametrize("permits", [1, 2, 3, 10])
def test_exactly_half_open_max_calls_probes_are_admitted(permits: int) -> None:
    """Half-open lets exactly half_open_max_calls probes through; the rest get retry_after."""
    cfg = BreakerConfig(half_open_max_calls=permits, half_open_timeout=20.0)
    state, now = half_open(cfg)
    admissions = []
    for _ in range(permits + 5):
        admission, state, _ = admit(state, cfg, now)
        admissions.append(admission)
    assert [a.probe for a in admissions] == [True] * permits + [False] * 5
    assert [a.allowed for a in admissions] == [True] * permits + [False] * 5
    assert all(a.retry_after == 20.0 for a in admissions[permits:])
    assert state.permits == permits


def test_failed_probe_reopens() -> None:
    """A counted failure of a probe reopens the breaker for a full open_duration."""
    cfg = BreakerConfig(half_open_max_calls=3, open_duration=60.0)
    state, now = half_open(cfg)
    _, state, _ = admit(state, cfg, now)
    _, state, _ = admit(state, cfg, now)
    state, transition = record(state, cfg, now + 1, OK, probe=True)
    assert transition is None
    state, transition = record(state, cfg, now + 2, T, probe=True)
    assert transition == Transition("half_open", "open", "probe_failed", now + 2)
    assert state == BreakerState("open", None, now + 2)
    refused, _, _ = admit(state, cfg, now + 61)
    assert not refused.allowed
    assert refused.retry_after == pytest.approx(1.0)


def test_slow_probe_reopens() -> None:
    """A successful probe slower than slow_call_threshold reopens the breaker."""
    cfg = BreakerConfig(slow_call_threshold=1.0)
    state, now = half_open(cfg)
    _, state, _ = admit(state, cfg, now)
    state, transition = record(state, cfg, now, OK, probe=True, duration=1.5)
    assert transition is not None
    assert (transition.name, transition.reason) == ("half_open->open", "probe_slow")


def test_successful_probes_close_with_an_empty_window() -> None:
    """half_open_max_calls successful probes close the breaker, forgetting old outcomes."""
    cfg = BreakerConfig(half_open_max_calls=2)
    state, now = half_open(cfg)
    _, state, _ = admit(state, cfg, now)
    _, state, _ = admit(state, cfg, now)
    state, transition = record(state, cfg, now, OK, probe=True)
    assert (state.status, state.successes, transition) == ("half_open", 1, None)
    state, transition = record(state, cfg, now, OK, probe=True)
    assert transition == Transition("half_open", "closed", "probes_succeeded", now)
    assert state == BreakerState()


def test_non_probe_results_in_half_open_are_ignored() -> None:
    """Only probes decide half-open; a late result of an earlier call does not."""
    cfg = BreakerConfig()
    state, now = half_open(cfg)
    _, state, _ = admit(state, cfg, now)
    for outcome in (OK, T):
        new, transition = record(state, cfg, now, outcome, probe=False)
        assert (new, transition) == (state, None)


def test_ignored_probe_and_release_return_the_permit() -> None:
    """A probe ending in an uncounted class, or released, frees its permit for another probe."""
    cfg = BreakerConfig()
    state, now = half_open(cfg)
    _, state, _ = admit(state, cfg, now)
    assert not admit(state, cfg, now)[0].allowed
    state, transition = record(state, cfg, now, S, probe=True)
    assert (state.permits, transition) == (0, None)
    _, state, _ = admit(state, cfg, now)
    state = release(state, cfg, now)
    assert admit(state, cfg, now)[0].probe
    assert release(BreakerState(), cfg, now) == BreakerState()


def test_lost_probes_expire_after_half_open_timeout() -> None:
    """Permits never reported back are renewed after half_open_timeout, so nothing wedges."""
    cfg = BreakerConfig(half_open_max_calls=2, half_open_timeout=30.0)
    state, now = half_open(cfg)
    _, state, _ = admit(state, cfg, now)
    _, state, _ = admit(state, cfg, now)
    refused, state, _ = admit(state, cfg, now + 29.0)
    assert not refused.allowed
    assert refused.retry_after == pytest.approx(1.0)
    renewed, state, transition = admit(state, cfg, now + 30.0)
    assert (renewed.allowed, renewed.probe, transition) == (True, True, None)
    assert (state.permits, state.half_open_since) == (1, now + 30.0)


# -------------------------------------------------------------------- properties

outcomes = st.sampled_from([OK, T, ST, S, P])
ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("advance"),
            st.one_of(st.floats(0.0, 40.0), st.sampled_from([0.001, 0.1, 0.25, 0.5, 1.0])),
        ),
        st.tuples(st.just("admit"), st.none()),
        st.tuples(st.just("record"), outcomes),
        st.tuples(st.just("record_probe"), outcomes),
        st.tuples(st.just("release"), st.none()),
    ),
    max_size=200,
)
configs = st.builds(
    BreakerConfig,
    window=st.sampled_from(["count", "time"]),
    minimum_calls=st.integers(1, 4),
    failure_rate_threshold=st.sampled_from([0.25, 0.5, 1.0]),
    open_duration=st.one_of(st.sampled_from([0.5, 1.0, 2.5]), st.floats(0.5, 60.0)),
    half_open_max_calls=st.integers(1, 3),
    half_open_timeout=st.floats(min_value=1.0, max_value=60.0),
    slow_call_threshold=st.sampled_from([None, 5.0]),
)


@settings(max_examples=300, deadline=None)
@given(cfg=configs, script=ops, durations=st.lists(st.floats(0.0, 10.0), min_size=1))
def test_never_admits_while_open(
    cfg: BreakerConfig, script: list[tuple[str, Any]], durations: list[float]
) -> None:
    """Under any sequence of outcomes and time steps, no call is admitted while the
    breaker is open and open_duration has not elapsed since it opened; half-open
    never has more than half_open_max_calls probes out."""
    state, now, opened_at = BreakerState(), 0.0, None
    for step, (op, arg) in enumerate(script):
        if op == "advance":
            now += arg
            continue
        if op == "admit":
            admission, state, transition = admit(state, cfg, now)
            if opened_at is not None and now < opened_at + cfg.open_duration_s:
                assert not admission.allowed
                assert admission.retry_after == pytest.approx(opened_at + cfg.open_duration_s - now)
            if admission.allowed:
                assert admission.retry_after == 0
            else:
                assert admission.retry_after > 0
        elif op == "release":
            transition, state = None, release(state, cfg, now)
        else:
            duration = durations[step % len(durations)]
            state, transition = record(
                state, cfg, now, arg, probe=op == "record_probe", duration=duration
            )
        if transition is not None and transition.target == "open":
            opened_at = now
        elif transition is not None:
            opened_at = None
        if opened_at is not None:  # admit is pure: probe it up to the last instant of open
            deadline = opened_at + cfg.open_duration_s
            for probe_at in (now, math.nextafter(deadline, -math.inf)):
                if probe_at < deadline:
                    assert not admit(state, cfg, probe_at)[0].allowed
        assert 0 <= state.permits <= cfg.half_open_max_calls
        assert state.successes < cfg.half_open_max_calls
        assert (state.status == "open") == (opened_at is not None)
        assert BreakerState.from_json(json.loads(json.dumps(state.to_json()))) == state


@settings(max_examples=200, deadline=None)
@given(size=st.integers(1, 70), calls=st.lists(st.tuples(st.booleans(), st.booleans())))
def test_count_window_matches_a_naive_model(size: int, calls: list[tuple[bool, bool]]) -> None:
    """The O(1) ring buffer holds exactly the last `size` outcomes' totals."""
    window, naive = CountWindow(size), collections.deque[tuple[bool, bool]](maxlen=size)
    for failed, slow in calls:
        window = window.add(0.0, failed, slow)
        naive.append((failed, slow))
        assert window.calls == len(naive)
        assert window.failures == sum(f for f, _ in naive)
        assert window.slow == sum(s for _, s in naive)
    assert CountWindow.from_json(json.loads(json.dumps(window.to_json()))) == window


@settings(max_examples=200, deadline=None)
@given(
    span=st.sampled_from([1.0, 10.0, 60.0]),
    calls=st.lists(st.tuples(st.floats(0.0, 30.0), st.booleans(), st.booleans()), max_size=60),
)
def test_time_window_matches_a_naive_model(
    span: float, calls: list[tuple[float, bool, bool]]
) -> None:
    """The bucketed window holds exactly the outcomes of its last TIME_BUCKETS buckets."""
    width = span / TIME_BUCKETS
    window, now, seen = TimeWindow(span), 0.0, []
    for step, failed, slow in calls:
        now += step
        window = window.add(now, failed, slow)
        seen.append((math.floor(now / width), failed, slow))
        oldest = math.floor(now / width) - TIME_BUCKETS + 1
        kept = [(f, s) for index, f, s in seen if index >= oldest]
        assert (window.calls, window.failures, window.slow) == (
            len(kept),
            sum(f for f, _ in kept),
            sum(s for _, s in kept),
        )
        assert len(window.buckets) <= TIME_BUCKETS
    assert TimeWindow.from_json(json.loads(json.dumps(window.to_json()))) == window


def test_from_json_rejects_foreign_data() -> None:
    """Anything that is not a stored breaker state is a ValueError."""
    for data in ({}, {"v": 2, "status": "closed"}, {"v": 1, "status": "ajar"}, {"v": 1}):
        with pytest.raises(ValueError, match="not a breaker state"):
            BreakerState.from_json(data)


# ----------------------------------------------------------------------- stores


def test_in_memory_store_is_a_breaker_store() -> None:
    """InMemoryBreakerStore implements the BreakerStore protocol."""
    assert isinstance(InMemoryBreakerStore(), BreakerStore)


def test_in_memory_store_runs_every_transition_and_emits_events(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The store applies the pure transitions per key and emits one event per transition."""
    cfg = BreakerConfig(minimum_calls=2, window_size=2, open_duration=10.0)
    store = InMemoryBreakerStore()
    with caplog.at_level(logging.INFO, logger="langgraph_resilience"):
        assert store.record("a", cfg, 0.0, T) is None
        transition = store.record("a", cfg, 0.0, T)
        assert transition is not None
        assert transition.name == "closed->open"
        assert store.acquire("b", cfg, 0.0).allowed  # keys are independent
        refused = store.acquire("a", cfg, 4.0)
        assert (refused.allowed, refused.retry_after, refused.status) == (False, 6.0, "open")
        probe = store.acquire("a", cfg, 10.0)
        assert probe.probe
        assert store.record("a", cfg, 10.5, OK, probe=True) is not None
    assert store.snapshot("a") == BreakerState()
    events = [r.args for r in caplog.records if r.args and r.args[0] == "breaker"]  # type: ignore[index]
    assert [(e[1]["key"], e[1]["transition"]) for e in events] == [  # type: ignore[index]
        ("a", "closed->open"),
        ("a", "open->half_open"),
        ("a", "half_open->closed"),
    ]


def test_in_memory_store_release_and_reset() -> None:
    """release frees a probe permit; reset forgets a breaker."""
    cfg = BreakerConfig(minimum_calls=1, window_size=1, open_duration=1.0)
    store = InMemoryBreakerStore()
    store.record("a", cfg, 0.0, T)
    assert store.acquire("a", cfg, 1.0).probe
    assert not store.acquire("a", cfg, 1.0).allowed
    store.release("a", cfg, 1.0, probe=False)  # not a probe: nothing to give back
    assert not store.acquire("a", cfg, 1.0).allowed
    store.release("a", cfg, 1.0, probe=True)
    assert store.acquire("a", cfg, 1.0).probe
    store.reset("a")
    assert store.snapshot("a") == BreakerState()
    store.record("b", cfg, 0.0, T)
    store.reset()
    assert store.snapshot("b") == BreakerState()


def test_in_memory_store_async_methods() -> None:
    """The async methods apply the same transitions."""
    cfg = BreakerConfig(minimum_calls=1, window_size=1, open_duration=1.0)
    store = InMemoryBreakerStore()

    async def scenario() -> list[Any]:
        await store.arecord("a", cfg, 0.0, T)
        refused = await store.aacquire("a", cfg, 0.5)
        probe = await store.aacquire("a", cfg, 1.0)
        await store.arelease("a", cfg, 1.0, probe=True)
        again = await store.aacquire("a", cfg, 1.0)
        await store.arecord("a", cfg, 1.0, OK, probe=True)
        return [refused.allowed, probe.probe, again.probe, (await store.asnapshot("a")).status]

    assert asyncio.run(scenario()) == [False, True, True, "closed"]


def test_concurrent_half_open_acquires_grant_exactly_the_permits() -> None:
    """32 threads racing for half-open permits get exactly half_open_max_calls probes."""
    cfg = BreakerConfig(minimum_calls=1, window_size=1, half_open_max_calls=3)
    store = InMemoryBreakerStore()
    store.record("k", cfg, 0.0, T)
    start = threading.Barrier(32)
    probes: list[bool] = []

    def worker() -> None:
        start.wait(timeout=10)
        for _ in range(50):
            admission = store.acquire("k", cfg, 60.0)
            if admission.allowed:
                probes.append(admission.probe)

    threads = [threading.Thread(target=worker) for _ in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert probes == [True, True, True]
    assert store.snapshot("k").permits == 3


# --------------------------------------------------------------- CircuitBreaker


def test_no_lock_is_held_across_the_call() -> None:
    """Two threads are inside the protected call at the same time (a lock held across
    the call would serialize them and break the barrier)."""
    inside = threading.Barrier(2, timeout=10)
    breaker = CircuitBreaker("slow", BreakerConfig(), clock=FakeClock())
    results: list[int] = []

    def protected(n: int) -> int:
        inside.wait()  # returns only once both threads are in here
        return n

    def call(n: int) -> None:
        results.append(breaker.call(protected, n))

    threads = [threading.Thread(target=call, args=(n,)) for n in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [1, 2]
    assert not inside.broken


def test_no_lock_is_held_across_the_async_call() -> None:
    """Two tasks are inside the protected call at once on the async path."""
    breaker = CircuitBreaker("slow", BreakerConfig(), clock=FakeClock())

    async def scenario() -> list[str]:
        inside = asyncio.Barrier(2)

        async def call(name: str) -> str:
            await asyncio.wait_for(inside.wait(), 10)
            return name

        return list(await asyncio.gather(breaker.acall(call, "a"), breaker.acall(call, "b")))

    assert asyncio.run(scenario()) == ["a", "b"]


def test_circuit_breaker_classifies_opens_and_fails_fast() -> None:
    """Classified TRANSIENT failures trip it; then calls fail fast with retry_after."""
    clock = FakeClock()
    cfg = BreakerConfig(minimum_calls=2, window_size=2, open_duration=30.0)
    breaker = CircuitBreaker("api", cfg, clock=clock)
    executed = 0

    def dead() -> None:
        nonlocal executed
        executed += 1
        raise FakeHTTPError(503)

    for _ in range(2):
        with pytest.raises(FakeHTTPError):
            breaker.call(dead)
    clock.advance(10.0)
    with pytest.raises(CircuitOpenError) as info:
        breaker.call(dead)
    assert (info.value.key, info.value.retry_after) == ("api", 20.0)
    assert executed == 2
    clock.advance(20.0)
    assert breaker.call(lambda: "back") == "back"
    assert breaker.store.snapshot("api").status == "closed"


def test_circuit_breaker_ignores_uncounted_failures() -> None:
    """A 400 (SEMANTIC) or 401 (POLICY) never trips the breaker."""
    breaker = CircuitBreaker("api", BreakerConfig(minimum_calls=1, window_size=1))
    for status in (400, 401, 403, 422):
        with pytest.raises(FakeHTTPError):
            breaker.call(_raise, FakeHTTPError(status))
    assert breaker.store.snapshot("api") == BreakerState()


def _raise(error: BaseException) -> None:
    raise error


def test_interrupt_and_cancellation_release_the_probe() -> None:
    """A probe interrupted (GraphInterrupt) or cancelled gives its permit back."""
    clock = FakeClock()
    cfg = BreakerConfig(minimum_calls=1, window_size=1, open_duration=1.0)
    breaker = CircuitBreaker("api", cfg, clock=clock)
    with pytest.raises(FakeHTTPError):
        breaker.call(_raise, FakeHTTPError(503))
    clock.advance(1.0)
    with pytest.raises(GraphInterrupt):
        breaker.call(_raise, GraphInterrupt(()))
    assert breaker.store.snapshot("api").permits == 0

    async def cancelled() -> None:
        raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(breaker.acall(cancelled))
    assert breaker.store.snapshot("api").permits == 0

    async def interrupted() -> None:
        raise GraphInterrupt(())

    with pytest.raises(GraphInterrupt):
        asyncio.run(breaker.acall(interrupted))
    assert breaker.store.snapshot("api").permits == 0

    async def fine() -> str:
        return "ok"

    assert asyncio.run(breaker.acall(fine)) == "ok"
    assert breaker.store.snapshot("api").status == "closed"


def test_circuit_breaker_async_failure_is_recorded() -> None:
    """acall classifies and records failures like call."""
    breaker = CircuitBreaker("api", BreakerConfig(minimum_calls=1, window_size=1))

    async def boom() -> None:
        raise TimeoutError("slow upstream")

    with pytest.raises(TimeoutError):
        asyncio.run(breaker.acall(boom))
    with pytest.raises(CircuitOpenError):
        asyncio.run(breaker.acall(boom))


def test_circuit_breaker_records_slow_calls_with_the_injected_clock() -> None:
    """Durations come from the injected clock's monotonic time."""
    clock = FakeClock()
    cfg = BreakerConfig(minimum_calls=1, window_size=1, slow_call_threshold=2.0)
    breaker = CircuitBreaker("api", cfg, clock=clock)
    breaker.call(clock.sleep, 2.5)
    assert breaker.store.snapshot("api").status == "open"


# ----------------------------------------------------------------- retry budget


@pytest.mark.parametrize(
    "kwargs",
    [
        {"ratio": 0},
        {"ratio": -0.1},
        {"ratio": math.inf},
        {"max_tokens": 0.5},
        {"min_retries_per_second": -1},
        {"ratio": True},
    ],
)
def test_bad_retry_budget_fails_at_construction(kwargs: dict[str, Any]) -> None:
    """Invalid budgets raise ConfigurationError naming the field and the valid range."""
    with pytest.raises(ConfigurationError, match=r"RetryBudget\.\w+ must be a number"):
        RetryBudget(**kwargs)


def test_retry_budget_arithmetic() -> None:
    """Full bucket to start; first attempts deposit ratio; retries take one token; time refills."""
    cfg = RetryBudget(ratio=0.5, max_tokens=2.0, min_retries_per_second=0.1)
    state = RetryBudgetState()
    granted = []
    for _ in range(3):
        ok, state = budget_withdraw(state, cfg, 0.0)
        granted.append(ok)
    assert granted == [True, True, False]
    state = budget_deposit(state, cfg, 0.0)
    assert not budget_withdraw(state, cfg, 0.0)[0]  # 0.5 tokens
    state = budget_deposit(state, cfg, 0.0)
    ok, state = budget_withdraw(state, cfg, 0.0)
    assert ok
    assert state.tokens == pytest.approx(0.0)
    ok, state = budget_withdraw(state, cfg, 9.0)  # 0.9 tokens from the floor
    assert not ok
    ok, state = budget_withdraw(state, cfg, 10.0)
    assert ok
    assert budget_deposit(RetryBudgetState(5.0, 0.0), cfg, 100.0).tokens == 2.0  # capped


@settings(max_examples=200, deadline=None)
@given(
    ratio=st.sampled_from([0.05, 0.2, 1.0]),
    floor=st.sampled_from([0.0, 0.1, 2.0]),
    script=st.lists(st.tuples(st.booleans(), st.floats(0.0, 5.0)), max_size=300),
)
def test_retries_stay_within_the_budget(
    ratio: float, floor: float, script: list[tuple[bool, float]]
) -> None:
    """Granted retries never exceed ratio x first attempts + max_tokens + floor x elapsed."""
    cfg = RetryBudget(ratio=ratio, max_tokens=5.0, min_retries_per_second=floor)
    state, now, firsts, retries = RetryBudgetState(), 0.0, 0, 0
    for first, step in script:
        now += step
        if first:
            firsts += 1
            state = budget_deposit(state, cfg, now)
        else:
            ok, state = budget_withdraw(state, cfg, now)
            retries += ok
        assert retries <= ratio * firsts + cfg.max_tokens + floor * now + 1e-9


def test_retry_budget_bounds_retries_of_50_threads_in_an_outage() -> None:
    """50 threads in a 60 s simulated outage: retries stay within the ratio of first attempts."""
    cfg = RetryBudget(ratio=0.2, max_tokens=10.0, min_retries_per_second=0.1)
    budgets = InMemoryRetryBudgetStore()
    clock = FakeClock()
    # All 50 threads call within each simulated second; the barrier's action ticks the clock.
    second = threading.Barrier(50, action=lambda: clock.advance(1.0), timeout=10)
    counts = {"first": 0, "retry": 0, "denied": 0}
    lock = threading.Lock()

    def caller() -> None:
        for _ in range(60):  # one call a simulated second, each failing, up to 2 retries
            second.wait()
            budgets.deposit("dead-tool", cfg, clock.time())
            granted = [budgets.try_withdraw("dead-tool", cfg, clock.time()) for _ in range(2)]
            with lock:
                counts["first"] += 1
                counts["retry"] += sum(granted)
                counts["denied"] += granted.count(False)

    threads = [threading.Thread(target=caller) for _ in range(50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert clock.monotonic() == 60.0
    assert counts["first"] == 3000
    assert counts["retry"] <= 0.2 * counts["first"] + 10 + 0.1 * 60 + 1e-6
    assert counts["retry"] >= 0.2 * counts["first"]  # the budget is spent, not hoarded
    assert counts["denied"] == 2 * 3000 - counts["retry"]


def test_retry_budget_store_async_and_snapshot() -> None:
    """The async twins share the same buckets; unknown keys start full."""
    cfg = RetryBudget(max_tokens=1.0, min_retries_per_second=0.0)
    budgets = InMemoryRetryBudgetStore()
    assert budgets.snapshot("x") == RetryBudgetState()

    async def scenario() -> list[bool]:
        first = await budgets.atry_withdraw("x", cfg, 0.0)
        second = await budgets.atry_withdraw("x", cfg, 0.0)
        for _ in range(5):
            await budgets.adeposit("x", cfg, 0.0)
        third = await budgets.atry_withdraw("x", cfg, 0.0)
        return [first, second, third]

    assert asyncio.run(scenario()) == [True, False, True]
