"""`ResiliencePolicy`: the hard budgets every recovery path shares.

A policy is frozen and validated at construction: a wrong combination fails
when the graph is built, not in production at 3 a.m.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from collections.abc import Iterable

from langgraph_resilience.core.canonical import DEFAULT_NOISE_FIELDS
from langgraph_resilience.errors import ConfigurationError

__all__ = ["ResiliencePolicy", "seconds"]


def seconds(value: float | dt.timedelta, *, field: str) -> float:
    """Return `value` in seconds; accepts a number of seconds or a `timedelta`."""
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(
            f"{field} must be a number of seconds or a datetime.timedelta, got {value!r}"
        )
    if isinstance(value, float) and not math.isfinite(value):
        # NaN passes every comparison check below; inf overflows thread timeouts.
        raise ConfigurationError(f"{field} must be a finite number of seconds, got {value!r}")
    return float(value)


def _optional_seconds(value: float | dt.timedelta | None, *, field: str) -> float | None:
    return None if value is None else seconds(value, field=field)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ResiliencePolicy:
    """Budgets and backoff for one graph. Durations accept seconds or `timedelta`.

    >>> ResiliencePolicy(max_attempts=3, base_delay=0.5).max_delay
    30.0
    """

    max_attempts: int = 3
    """Executions of one tool call on TRANSIENT failures, the first one included."""

    base_delay: float | dt.timedelta = 0.5
    """Backoff scale: attempt n waits uniform(0, min(max_delay, base_delay * 2**n))."""

    max_delay: float | dt.timedelta = 30.0
    """Cap on a single jittered backoff wait (a server's Retry-After has its own cap)."""

    max_retry_after: float | dt.timedelta = 120.0
    """The longest server-directed wait (Retry-After) that is honoured by sleeping. A
    longer one is not slept: the call is reported exhausted (``retry_after``) with the
    server's ``retry_after_ms`` in its envelope, as the openai SDK caps such waits."""

    max_repair: int = 2
    """MAX_REPAIR: reflection repairs per original call for SEMANTIC failures."""

    loop_threshold: int = 2
    """Identical (tool, canonical args) calls allowed per task; the next one is a loop."""

    max_tool_attempts: int = 100
    """Tool executions per task, shared by every tool, node and recovery path.

    A task is what one human message asked for: the turns since the latest
    `HumanMessage` (a thread without one is a single task). Every budget below that
    says "per task" starts afresh with the next human message, so an ordinary long
    conversation never runs out; `max_thread_tool_attempts` caps a whole thread."""

    max_thread_tool_attempts: int | None = None
    """Optional lifetime cap on tool executions per thread (None: no cap)."""

    max_recovery_llm_calls: int = 10
    """LLM calls per task spent on recovery (repairs, replans), shared by all paths."""

    max_replans: int = 2
    """Planner attempts per task; a rejected plan counts. Then: escalation."""

    max_plan_steps: int = 8
    """The verifier rejects a replan with more steps than this."""

    deadline: float | dt.timedelta | None = None
    """Wall-clock budget per task from its first tool call; None means no deadline."""

    tool_timeout: float | dt.timedelta | None = None
    """Per-execution timeout of a tool; a timeout is TRANSIENT (UNKNOWN for side effects)."""

    structural_memory: float | dt.timedelta | None = 300.0
    """How long a thread remembers that a tool answered STRUCTURAL (404/410, contract
    gone): meanwhile new calls to it go straight to its fallback, or back as STRUCTURAL,
    without executing it. None remembers for the thread's life; 0 forgets at once."""

    noise_fields: frozenset[str] = DEFAULT_NOISE_FIELDS
    """Argument names ignored when deciding whether two calls are the same."""

    inline_retry_max_wait: float | dt.timedelta | None = 1.0
    """The longest backoff slept *inside* the tools step: a retry whose wait is at most
    this runs again in the same step (no retry node, no extra checkpoints); a longer
    one (a Retry-After, a late attempt's backoff) is scheduled in the tally and slept
    by the retry node, checkpointed and resumable. None sends every retry through the
    retry node. The default, 1 s, covers the default policy's first two backoffs
    (up to 0.5 s and 1 s) while a checkpoint costs milliseconds; what a crash inside
    the step costs is bounded by it (see `core.decision.retry_in_step`)."""

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "base_delay", seconds(self.base_delay, field="base_delay"))
        set_(self, "max_delay", seconds(self.max_delay, field="max_delay"))
        set_(self, "max_retry_after", seconds(self.max_retry_after, field="max_retry_after"))
        set_(self, "deadline", _optional_seconds(self.deadline, field="deadline"))
        set_(self, "tool_timeout", _optional_seconds(self.tool_timeout, field="tool_timeout"))
        set_(
            self,
            "structural_memory",
            _optional_seconds(self.structural_memory, field="structural_memory"),
        )
        set_(
            self,
            "inline_retry_max_wait",
            _optional_seconds(self.inline_retry_max_wait, field="inline_retry_max_wait"),
        )
        if isinstance(self.noise_fields, Iterable) and not isinstance(self.noise_fields, str):
            set_(self, "noise_fields", frozenset(self.noise_fields))
        else:
            raise ConfigurationError("noise_fields must be a collection of argument names")
        self._validate()

    def _validate(self) -> None:
        for name, minimum in (
            ("max_attempts", 1),
            ("max_repair", 0),
            ("loop_threshold", 1),
            ("max_tool_attempts", 1),
            ("max_recovery_llm_calls", 0),
            ("max_replans", 0),
            ("max_plan_steps", 1),
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ConfigurationError(f"{name} must be an integer >= {minimum}, got {value!r}")
        if self.base_delay_s < 0 or self.max_delay_s < 0:
            raise ConfigurationError("base_delay and max_delay must be >= 0 seconds")
        if self.base_delay_s > self.max_delay_s:
            raise ConfigurationError(
                f"base_delay ({self.base_delay_s}s) exceeds max_delay ({self.max_delay_s}s); "
                "raise max_delay or lower base_delay"
            )
        if self.max_retry_after_s < 0:
            raise ConfigurationError("max_retry_after must be >= 0 seconds")
        if self.deadline_s is not None and self.deadline_s <= 0:
            raise ConfigurationError("deadline must be > 0 seconds, or None for no deadline")
        if self.tool_timeout_s is not None and self.tool_timeout_s <= 0:
            raise ConfigurationError("tool_timeout must be > 0 seconds, or None for no timeout")
        if self.structural_memory_s is not None and self.structural_memory_s < 0:
            raise ConfigurationError(
                "structural_memory must be >= 0 seconds, or None to remember for the thread's life"
            )
        inline = self.inline_retry_max_wait_s
        if inline is not None and inline < 0:
            raise ConfigurationError(
                "inline_retry_max_wait must be >= 0 seconds, or None to send every retry "
                "through the retry node"
            )
        lifetime = self.max_thread_tool_attempts
        if lifetime is not None and (
            isinstance(lifetime, bool) or not isinstance(lifetime, int) or lifetime < 1
        ):
            raise ConfigurationError(
                f"max_thread_tool_attempts must be an integer >= 1 or None, got {lifetime!r}"
            )
        if self.max_attempts > self.max_tool_attempts:
            raise ConfigurationError(
                f"max_attempts ({self.max_attempts}) exceeds max_tool_attempts "
                f"({self.max_tool_attempts}), so the task budget would end every call first; "
                "raise max_tool_attempts"
            )

    # Typed views: the fields accept timedelta but are normalized to float seconds.
    @property
    def base_delay_s(self) -> float:
        """`base_delay` in seconds."""
        return float(self.base_delay)  # type: ignore[arg-type]

    @property
    def max_delay_s(self) -> float:
        """`max_delay` in seconds."""
        return float(self.max_delay)  # type: ignore[arg-type]

    @property
    def max_retry_after_s(self) -> float:
        """`max_retry_after` in seconds."""
        return float(self.max_retry_after)  # type: ignore[arg-type]

    @property
    def deadline_s(self) -> float | None:
        """`deadline` in seconds, or None."""
        return None if self.deadline is None else float(self.deadline)  # type: ignore[arg-type]

    @property
    def tool_timeout_s(self) -> float | None:
        """`tool_timeout` in seconds, or None."""
        if self.tool_timeout is None:
            return None
        return float(self.tool_timeout)  # type: ignore[arg-type]

    @property
    def structural_memory_s(self) -> float | None:
        """`structural_memory` in seconds, or None (the thread's life)."""
        memory = self.structural_memory
        return None if memory is None else float(memory)  # type: ignore[arg-type]

    @property
    def inline_retry_max_wait_s(self) -> float | None:
        """`inline_retry_max_wait` in seconds, or None (no retry inside the step)."""
        wait = self.inline_retry_max_wait
        return None if wait is None else float(wait)  # type: ignore[arg-type]
