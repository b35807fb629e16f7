"""Fault schedules: *when* a plan entry fires, per call of a tool.

`Single` (the n-th call), `Persistent` (every call from the n-th), `Intermittent`
(each call with probability p) and `Burst` (k consecutive calls, from a given call
or at random onsets). A `Cursor` is one plan entry's view of one tool.
"""

from __future__ import annotations

import dataclasses
import random

from langgraph_resilience.errors import ConfigurationError

__all__ = ["Burst", "Cursor", "Intermittent", "Persistent", "Schedule", "Single", "check_schedule"]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Single:
    """Exactly the ``at``-th call of the tool (0-based)."""

    at: int = 0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Persistent:
    """Every call from the ``start``-th on."""

    start: int = 0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Intermittent:
    """Each call independently, with probability ``p``."""

    p: float


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Burst:
    """``length`` consecutive calls: from the ``start``-th call, or, with ``start=None``,
    a burst begins at each call outside a burst with probability ``p``."""

    length: int
    start: int | None = 0
    p: float = 0.1


Schedule = Single | Persistent | Intermittent | Burst


def _check_probability(p: float, what: str) -> None:
    if isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 <= p <= 1.0:
        raise ConfigurationError(f"{what} must be a probability in [0, 1], got {p!r}")


def _check_index(value: int, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigurationError(f"{what} must be an integer >= 0, got {value!r}")


def check_schedule(schedule: Schedule) -> None:
    match schedule:
        case Single(at=at):
            _check_index(at, "Single.at")
        case Persistent(start=start):
            _check_index(start, "Persistent.start")
        case Intermittent(p=p):
            _check_probability(p, "Intermittent.p")
        case Burst(length=length, start=start, p=p):
            if isinstance(length, bool) or not isinstance(length, int) or length < 1:
                raise ConfigurationError(f"Burst.length must be an integer >= 1, got {length!r}")
            if start is not None:
                _check_index(start, "Burst.start")
            _check_probability(p, "Burst.p")
        case _:
            raise ConfigurationError(
                f"schedule must be Single, Persistent, Intermittent or Burst, got {schedule!r}"
            )


@dataclasses.dataclass(slots=True)
class Cursor:
    """One plan entry's view of one tool: its random stream and burst state."""

    rng: random.Random
    burst_left: int = 0

    def fires(self, schedule: Schedule, index: int) -> bool:
        """Whether call number `index` is faulty. Draws exactly one number per call for
        the random schedules, so the stream stays aligned with the call index."""
        match schedule:
            case Single(at=at):
                return index == at
            case Persistent(start=start):
                return index >= start
            case Intermittent(p=p):
                return self.rng.random() < p
            case Burst(length=length, start=None, p=p):
                draw = self.rng.random()
                if self.burst_left > 0:
                    self.burst_left -= 1
                    return True
                if draw < p:
                    self.burst_left = length - 1
                    return True
                return False
            case Burst(length=length, start=int() as start):
                return start <= index < start + length
        return False  # pragma: no cover - check_schedule rejects anything else
