"""The clock every time-dependent decision reads, injected so tests never sleep.

`monotonic()` measures durations inside one process; `time()` is wall-clock
seconds since the epoch and is what goes into checkpointed state (a retry's
due time, a thread's start), because only it means the same thing after a
resume in another process.
"""

from __future__ import annotations

import asyncio
import time as _time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "SystemClock"]


@runtime_checkable
class Clock(Protocol):
    """What the package needs from time: read it, and wait (sync or async)."""

    def monotonic(self) -> float:
        """Seconds on a monotonic clock, for durations within one process."""
        ...

    def time(self) -> float:
        """Wall-clock seconds since the epoch, for timestamps stored in state."""
        ...

    def sleep(self, seconds: float) -> None:
        """Block the calling thread for `seconds`."""
        ...

    async def asleep(self, seconds: float) -> None:
        """Suspend the calling task for `seconds` without blocking the event loop."""
        ...


class SystemClock:
    """The real clock (`time.monotonic`, `time.time`, `time.sleep`, `asyncio.sleep`)."""

    __slots__ = ()

    def monotonic(self) -> float:
        return _time.monotonic()

    def time(self) -> float:
        return _time.time()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            _time.sleep(seconds)

    async def asleep(self, seconds: float) -> None:
        if seconds > 0:
            await asyncio.sleep(seconds)
