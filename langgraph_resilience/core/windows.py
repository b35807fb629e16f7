"""The windows of recent outcomes a circuit breaker judges: by count and by time.

Both are immutable named tuples (cheap to build on the hot path, JSON through
`to_json` / `from_json`), updated in O(1) per outcome.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple, TypeVar

__all__ = ["TIME_BUCKETS", "WINDOW_KINDS", "Bucket", "CountWindow", "TimeWindow", "Window"]

N = TypeVar("N", bound=tuple[Any, ...])

TIME_BUCKETS = 10
"""Buckets of a time-based window: eviction is exact to 1/10 of the window (as Polly)."""


def _new(cls: type[N], values: tuple[Any, ...]) -> N:
    """Build a named tuple without its Python-level ``__new__`` (3x cheaper on the hot path)."""
    return tuple.__new__(cls, values)


class CountWindow(NamedTuple):
    """The outcomes of the last `size` calls, as a ring of bits plus running totals.

    Slot ``i`` of the ring is bit ``i`` of `failure_bits` / `slow_bits`; `head`
    is the slot the next outcome overwrites. Adding is O(1): one slot flips and
    the totals are adjusted by the evicted outcome (resilience4j's ring buffer).
    Like every state record here it is an immutable named tuple, cheap to build
    on the hot path.
    """

    size: int
    calls: int = 0
    """Outcomes held, at most `size`."""
    failures: int = 0
    slow: int = 0
    head: int = 0
    failure_bits: int = 0
    slow_bits: int = 0

    def add(self, now: float, failed: bool, slow: bool) -> CountWindow:
        """The window with one more outcome, the oldest evicted when full. A full ring
        of clean outcomes is returned as it is for another clean one: every rotation of
        it is the same window, so a store has nothing to write."""
        size, calls, failures, slow_count, head, failure_bits, slow_bits = self
        if calls == size and not (failed or slow or failure_bits or slow_bits):
            return self
        bit = 1 << head
        if calls == size:
            failures -= bool(failure_bits & bit)
            slow_count -= bool(slow_bits & bit)
        else:
            calls += 1
        if failed:
            failure_bits |= bit
            failures += 1
        elif failure_bits & bit:
            failure_bits ^= bit
        if slow:
            slow_bits |= bit
            slow_count += 1
        elif slow_bits & bit:
            slow_bits ^= bit
        head += 1
        values = (size, calls, failures, slow_count, 0 if head == size else head)
        return tuple.__new__(CountWindow, (*values, failure_bits, slow_bits))

    def evict(self, now: float) -> CountWindow:
        """Count windows only evict when a new outcome arrives."""
        return self

    def to_json(self) -> dict[str, Any]:
        """Plain JSON; the bit rings are hex strings (JSON numbers lose big integers)."""
        rings = {
            "failure_bits": format(self.failure_bits, "x"),
            "slow_bits": format(self.slow_bits, "x"),
        }
        return {"kind": "count", **self._asdict(), **rings}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CountWindow:
        """The inverse of `to_json`."""
        return cls(
            int(data["size"]),
            int(data["calls"]),
            int(data["failures"]),
            int(data["slow"]),
            int(data["head"]),
            int(data["failure_bits"], 16),
            int(data["slow_bits"], 16),
        )


Bucket = tuple[int, int, int, int]
"""(bucket index = floor(now / width), calls, failures, slow)."""


class TimeWindow(NamedTuple):
    """The outcomes of the last `span` seconds, in `TIME_BUCKETS` buckets plus totals.

    Adding and evicting touch at most `TIME_BUCKETS` buckets: O(1). A bucket
    leaves the window whole, so the window covers between 9/10 and all of
    `span` (Polly's rolling health metrics make the same trade).
    """

    span: float
    calls: int = 0
    failures: int = 0
    slow: int = 0
    buckets: tuple[Bucket, ...] = ()
    """Non-empty buckets, oldest first."""

    def _index(self, now: float) -> int:
        return math.floor(now / (self.span / TIME_BUCKETS))

    def evict(self, now: float) -> TimeWindow:
        """The window without the buckets that ended before ``now - span``."""
        oldest_kept = self._index(now) - TIME_BUCKETS + 1
        buckets = self.buckets
        if not buckets or buckets[0][0] >= oldest_kept:
            return self
        calls, failures, slow = self.calls, self.failures, self.slow
        drop = 0
        for index, b_calls, b_failures, b_slow in buckets:
            if index >= oldest_kept:
                break
            calls -= b_calls
            failures -= b_failures
            slow -= b_slow
            drop += 1
        return _new(TimeWindow, (self.span, calls, failures, slow, buckets[drop:]))

    def add(self, now: float, failed: bool, slow: bool) -> TimeWindow:
        """The window with one more outcome at ``now``, stale buckets evicted."""
        window = self.evict(now)
        index = window._index(now)
        buckets = window.buckets
        if buckets and buckets[-1][0] >= index:  # same bucket (or a clock step back)
            last_index, b_calls, b_failures, b_slow = buckets[-1]
            last = (last_index, b_calls + 1, b_failures + failed, b_slow + slow)
            buckets = (*buckets[:-1], last)
        else:
            buckets = (*buckets, (index, 1, int(failed), int(slow)))
        return _new(
            TimeWindow,
            (self.span, window.calls + 1, window.failures + failed, window.slow + slow, buckets),
        )

    def to_json(self) -> dict[str, Any]:
        """Plain JSON."""
        return {"kind": "time", **self._asdict(), "buckets": [list(b) for b in self.buckets]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TimeWindow:
        """The inverse of `to_json`."""
        buckets = tuple((int(i), int(c), int(f), int(s)) for i, c, f, s in data["buckets"])
        return cls(
            float(data["span"]),
            int(data["calls"]),
            int(data["failures"]),
            int(data["slow"]),
            buckets,
        )


Window = CountWindow | TimeWindow
WINDOW_KINDS: dict[str, type[Window]] = {"count": CountWindow, "time": TimeWindow}
"""The window class of each ``BreakerConfig.window``."""
