"""`ResiliencePolicy` and `ToolProfile`: frozen, keyword-only, validated at construction."""

import dataclasses
import datetime as dt
from typing import Any

import pytest

from langgraph_resilience import ConfigurationError, ResiliencePolicy, ToolProfile
from langgraph_resilience.core.canonical import DEFAULT_NOISE_FIELDS


def test_policy_defaults_are_as_documented() -> None:
    """The documented budgets are the defaults."""
    policy = ResiliencePolicy()
    assert policy.max_attempts == 3
    assert policy.base_delay == 0.5
    assert policy.max_delay == 30.0
    assert policy.max_repair == 2
    assert policy.loop_threshold == 2
    assert policy.max_tool_attempts == 100
    assert policy.deadline is None
    assert policy.tool_timeout is None
    assert policy.noise_fields == DEFAULT_NOISE_FIELDS


def test_durations_are_floats_even_when_given_as_ints() -> None:
    """Integer seconds are normalized to float seconds."""
    policy = ResiliencePolicy(base_delay=1, max_delay=10, deadline=60, tool_timeout=5)
    for name in ("base_delay", "max_delay", "deadline", "tool_timeout"):
        value = getattr(policy, name)
        assert type(value) is float, name
    assert (policy.base_delay, policy.max_delay, policy.deadline, policy.tool_timeout) == (
        1.0,
        10.0,
        60.0,
        5.0,
    )


def test_timedelta_is_accepted_and_normalized_to_seconds() -> None:
    """Every duration accepts a timedelta and is stored as float seconds."""
    policy = ResiliencePolicy(
        base_delay=dt.timedelta(milliseconds=250),
        max_delay=dt.timedelta(minutes=1),
        deadline=dt.timedelta(hours=1),
        tool_timeout=dt.timedelta(seconds=7.5),
    )
    assert policy.base_delay == 0.25
    assert policy.max_delay == 60.0
    assert policy.deadline == 3600.0
    assert policy.tool_timeout == 7.5
    assert all(
        type(getattr(policy, name)) is float
        for name in ("base_delay", "max_delay", "deadline", "tool_timeout")
    )
    assert (policy.base_delay_s, policy.max_delay_s, policy.deadline_s, policy.tool_timeout_s) == (
        0.25,
        60.0,
        3600.0,
        7.5,
    )


def test_typed_views_of_absent_durations_are_none() -> None:
    """No deadline and no timeout read as None through the typed views."""
    policy = ResiliencePolicy()
    assert policy.deadline_s is None
    assert policy.tool_timeout_s is None


def test_noise_fields_become_a_frozenset() -> None:
    """Any collection of names is accepted and frozen."""
    policy = ResiliencePolicy(noise_fields=["trace", "why"])
    assert policy.noise_fields == frozenset({"trace", "why"})


def test_policy_is_frozen() -> None:
    """A built policy cannot be changed, so budgets cannot drift at run time."""
    policy = ResiliencePolicy()
    with pytest.raises(dataclasses.FrozenInstanceError):
        policy.max_attempts = 10  # type: ignore[misc]


def test_policy_is_keyword_only() -> None:
    """Positional arguments are refused: ResiliencePolicy(3, 0.5) is unreadable."""
    with pytest.raises(TypeError):
        ResiliencePolicy(3)  # type: ignore[misc]


def test_policy_replace_is_validated_too() -> None:
    """dataclasses.replace goes through the same validation."""
    assert dataclasses.replace(ResiliencePolicy(), max_attempts=5).max_attempts == 5
    with pytest.raises(ConfigurationError, match="max_attempts"):
        dataclasses.replace(ResiliencePolicy(), max_attempts=0)


def test_policy_has_no_instance_dict() -> None:
    """The policy is slotted: no stray attributes."""
    assert not hasattr(ResiliencePolicy(), "__dict__")


def test_configuration_error_is_a_value_error() -> None:
    """Misconfiguration can be caught as the ValueError it is."""
    assert issubclass(ConfigurationError, ValueError)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        pytest.param({"max_attempts": 0}, "max_attempts", id="max_attempts-zero"),
        pytest.param({"max_attempts": -1}, "max_attempts", id="max_attempts-negative"),
        pytest.param({"max_attempts": True}, "max_attempts", id="max_attempts-bool"),
        pytest.param({"max_attempts": 2.0}, "max_attempts", id="max_attempts-float"),
        pytest.param({"max_attempts": "3"}, "max_attempts", id="max_attempts-str"),
        pytest.param({"max_repair": -1}, "max_repair", id="max_repair-negative"),
        pytest.param({"loop_threshold": 0}, "loop_threshold", id="loop_threshold-zero"),
        pytest.param({"max_tool_attempts": 0}, "max_tool_attempts", id="max_tool_attempts"),
        pytest.param({"base_delay": -1}, "base_delay", id="base_delay-negative"),
        pytest.param({"max_delay": -1}, "max_delay", id="max_delay-negative"),
        pytest.param({"base_delay": 10, "max_delay": 5}, "base_delay", id="base-over-max"),
        pytest.param({"base_delay": "1"}, "base_delay", id="base_delay-str"),
        pytest.param({"base_delay": True}, "base_delay", id="base_delay-bool"),
        pytest.param({"base_delay": None}, "base_delay", id="base_delay-none"),
        pytest.param({"base_delay": float("nan")}, "base_delay", id="base_delay-nan"),
        pytest.param({"max_delay": float("nan")}, "max_delay", id="max_delay-nan"),
        pytest.param({"max_delay": float("inf")}, "max_delay", id="max_delay-inf"),
        pytest.param({"deadline": 0}, "deadline", id="deadline-zero"),
        pytest.param({"deadline": -5}, "deadline", id="deadline-negative"),
        pytest.param({"deadline": dt.timedelta(0)}, "deadline", id="deadline-zero-timedelta"),
        pytest.param({"deadline": float("nan")}, "deadline", id="deadline-nan"),
        pytest.param({"tool_timeout": -1}, "tool_timeout", id="tool_timeout-negative"),
        pytest.param({"tool_timeout": 0}, "tool_timeout", id="tool_timeout-zero"),
        pytest.param({"tool_timeout": float("inf")}, "tool_timeout", id="tool_timeout-inf"),
        pytest.param(
            {"max_attempts": 5, "max_tool_attempts": 4}, "max_tool_attempts", id="call-over-thread"
        ),
        pytest.param({"noise_fields": "nonce"}, "noise_fields", id="noise_fields-str"),
        pytest.param({"noise_fields": 3}, "noise_fields", id="noise_fields-int"),
    ],
)
def test_invalid_policy_is_rejected_naming_the_field(kwargs: dict[str, Any], field: str) -> None:
    """A wrong value fails at construction with a message naming what to fix."""
    with pytest.raises(ConfigurationError, match=field):
        ResiliencePolicy(**kwargs)


def test_base_delay_over_max_delay_says_how_to_fix_it() -> None:
    """The message names both fields and the remedy."""
    with pytest.raises(ConfigurationError, match=r"base_delay.*max_delay.*raise max_delay"):
        ResiliencePolicy(base_delay=10, max_delay=5)


def test_boundary_values_are_accepted() -> None:
    """The smallest legal budgets are fine."""
    policy = ResiliencePolicy(
        max_attempts=1,
        max_repair=0,
        loop_threshold=1,
        max_tool_attempts=1,
        base_delay=0,
        max_delay=0,
        deadline=0.001,
        tool_timeout=0.001,
    )
    assert (policy.max_attempts, policy.base_delay, policy.max_delay) == (1, 0.0, 0.0)


def test_base_delay_equal_to_max_delay_is_accepted() -> None:
    """A flat backoff curve is legal."""
    assert ResiliencePolicy(base_delay=5, max_delay=5).max_delay == 5.0


# ------------------------------------------------------------------------ ToolProfile


def test_profile_defaults_describe_a_read_only_tool() -> None:
    """No profile options means a read-only tool that follows the policy."""
    profile = ToolProfile()
    assert profile.side_effect is False
    assert profile.max_attempts is None
    assert profile.timeout is None
    assert profile.timeout_s is None


def test_profile_timeout_accepts_timedelta() -> None:
    """A profile timeout is normalized to float seconds like the policy's."""
    assert ToolProfile(timeout=dt.timedelta(seconds=3)).timeout == 3.0
    assert ToolProfile(timeout=2).timeout_s == 2.0
    assert type(ToolProfile(timeout=2).timeout) is float


def test_profile_is_frozen_and_keyword_only() -> None:
    """A profile is as immutable and explicit as the policy."""
    profile = ToolProfile(side_effect=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        profile.side_effect = False  # type: ignore[misc]
    with pytest.raises(TypeError):
        ToolProfile(True)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        pytest.param({"max_attempts": 0}, "max_attempts", id="max_attempts-zero"),
        pytest.param({"max_attempts": True}, "max_attempts", id="max_attempts-bool"),
        pytest.param({"max_attempts": 1.5}, "max_attempts", id="max_attempts-float"),
        pytest.param({"timeout": 0}, "timeout", id="timeout-zero"),
        pytest.param({"timeout": -1}, "timeout", id="timeout-negative"),
        pytest.param({"timeout": dt.timedelta(0)}, "timeout", id="timeout-zero-timedelta"),
        pytest.param({"timeout": "5"}, "timeout", id="timeout-str"),
        pytest.param({"timeout": float("nan")}, "timeout", id="timeout-nan"),
    ],
)
def test_invalid_profile_is_rejected_naming_the_field(kwargs: dict[str, Any], field: str) -> None:
    """A wrong profile fails at construction with the field in the message."""
    with pytest.raises(ConfigurationError, match=field):
        ToolProfile(**kwargs)


def test_profile_max_attempts_of_one_is_accepted() -> None:
    """One attempt (never retry) is a legal override."""
    assert ToolProfile(max_attempts=1).max_attempts == 1
