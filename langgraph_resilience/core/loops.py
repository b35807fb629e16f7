"""Loop guard: the strongest signal of a stuck agent is the same call, again.

A call is "the same" when its `call_key` (tool + canonical arguments) is. Only
calls the agent (or a repair) *issues* count; the retry node re-executing one
call does not. Counts are per task (the turns since the latest human message):
the same request in a later turn is not a loop. A call whose failure was handed
back to the agent leaves `seen` for `failed`, so re-issuing it is not a loop;
failing ``threshold`` times is. Two patterns are loops:

- repeat: the call would be the ``threshold + 1``-th identical answered one in the
  task, or follows ``threshold`` failures of it handed back to the agent;
- alternating: the agent's last calls were A, B, A and this one is B (A != B),
  unless B's failure was handed back and A never failed: re-issuing a write whose
  answer was lost after reading the world (read, write, read, write) is an agent at
  work, not a stuck one, and B's own failure count still bounds it; two failing
  calls taking turns are a loop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

__all__ = ["RECENT_WINDOW", "LoopKind", "detect_loop"]

LoopKind = Literal["repeat", "alternating"]

RECENT_WINDOW = 8
"""How many recent issued call keys the ledger keeps for pattern detection."""


def detect_loop(
    key: str,
    *,
    count: int,
    recent: Sequence[str],
    threshold: int,
    failures: int = 0,
    failed: Mapping[str, int] | None = None,
) -> LoopKind | None:
    """Return the loop this call would close, or None.

    `count` is how many calls with this key the task issued (less those handed back
    as failed), `failures` how many of its calls' failures the agent was handed,
    `recent` the last issued keys in order (oldest first; only the last three count),
    `failed` the task's handed-back failures by key (read only when the calls
    alternate). Scalars first: the tools step asks this for every call it plans.

    >>> detect_loop("a", count=2, recent=[], threshold=2)
    'repeat'
    >>> detect_loop("b", count=1, recent=["a", "b", "a"], threshold=2)
    'alternating'
    >>> detect_loop("b", count=0, recent=["a", "b", "a"], threshold=2, failed={"b": 1})
    >>> detect_loop("b", count=0, recent=["a", "b", "a"], threshold=2, failed={"a": 2, "b": 1})
    'alternating'
    >>> detect_loop("c", count=0, recent=["a", "b", "a"], threshold=2)
    """
    if count >= threshold or failures >= threshold:
        return "repeat"
    if len(recent) >= 3:
        a, b, a2 = recent[-3:]
        if a == a2 and a != b and key == b:
            checked = failed is not None and failed.get(key, 0) > 0 and not failed.get(a, 0)
            return None if checked else "alternating"
    return None
