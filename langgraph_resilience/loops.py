"""Loop guard: the strongest signal of a stuck agent is the same call, again.

A call is "the same" when its `call_key` (tool + canonical arguments) is. Only
calls the agent (or a repair) *issues* count; the retry node re-executing one
call id does not. Two patterns are loops:

- repeat: the call would be the ``threshold + 1``-th identical one in the thread;
- alternating: the agent's last calls were A, B, A and this one is B (A != B).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

__all__ = ["RECENT_WINDOW", "LoopKind", "detect_loop"]

LoopKind = Literal["repeat", "alternating"]

RECENT_WINDOW = 8
"""How many recent issued call keys the ledger keeps for pattern detection."""


def detect_loop(
    key: str, *, seen: Mapping[str, int], recent: Sequence[str], threshold: int
) -> LoopKind | None:
    """Return the loop this call would close, or None.

    `seen` counts the thread's issued calls per key, `recent` lists the last
    issued keys in order (oldest first).

    >>> detect_loop("a", seen={"a": 2}, recent=[], threshold=2)
    'repeat'
    >>> detect_loop("b", seen={"a": 2, "b": 1}, recent=["a", "b", "a"], threshold=2)
    'alternating'
    >>> detect_loop("c", seen={"a": 2}, recent=["a", "b", "a"], threshold=2)
    """
    if seen.get(key, 0) >= threshold:
        return "repeat"
    if len(recent) >= 3:
        a, b, a2 = recent[-3:]
        if a == a2 and a != b and key == b:
            return "alternating"
    return None
