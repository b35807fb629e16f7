"""Loop guard: the strongest signal of a stuck agent is the same call, again.

A call is "the same" when its `call_key` (tool + canonical arguments) is. Only
calls the agent (or a repair) *issues* count; the retry node re-executing one
call does not. Counts are per task (the turns since the latest human message):
the same request in a later turn is not a loop. A call whose failure was handed
back to the agent leaves `seen` for `failed`, so re-issuing it is not a loop;
failing ``threshold`` times is. Two patterns are loops:

- repeat: the call would be the ``threshold + 1``-th identical answered one in the
  task, or follows ``threshold`` failures of it handed back to the agent; a read
  issued again after a side effect was issued does not repeat the earlier ones (the
  world it reads may have changed: a check after a write is not a loop);
- alternating: the agent's last calls were A, B, A and this one is B (A != B),
  unless one is a write whose failures were handed back and the other a read that
  never failed: re-issuing a write whose answer was lost after reading the world
  (read, write, read, write, in either order) is an agent at work, not a stuck one,
  and the write's own failure count still bounds it; two failing calls taking turns,
  or two answered ones, are a loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Literal

__all__ = ["RECENT_WINDOW", "LoopKind", "detect_loop"]

LoopKind = Literal["repeat", "alternating"]

RECENT_WINDOW = 8
"""How many recent issued call keys the tally keeps for pattern detection."""


def detect_loop(
    key: str,
    *,
    count: int,
    recent: Sequence[str],
    threshold: int,
    failures: int = 0,
    failed: Mapping[str, int] | None = None,
    changed: bool = False,
    is_write: Callable[[str], bool] | None = None,
) -> LoopKind | None:
    """Return the loop this call would close, or None.

    `count` is how many calls with this key the task issued (less those handed back
    as failed), `failures` how many of its calls' failures the agent was handed,
    `recent` the last issued keys in order (oldest first; only the last three count),
    `failed` the task's handed-back failures by key (read only when the calls
    alternate), `changed` whether this call is a read and a side effect was issued
    since its last identical call, `is_write` which keys are side effects. Scalars
    first: the tools step asks this for every call it plans.

    >>> detect_loop("a", count=2, recent=[], threshold=2)
    'repeat'
    >>> detect_loop("b", count=1, recent=["a", "b", "a"], threshold=2)
    'alternating'
    >>> w = lambda key: key == "w"
    >>> detect_loop("w", count=0, recent=["r", "w", "r"], threshold=2, failed={"w": 1}, is_write=w)
    >>> detect_loop("r", count=0, recent=["w", "r", "w"], threshold=2, failed={"w": 1}, is_write=w)
    >>> detect_loop("w", count=0, recent=["r", "w", "r"], threshold=2, failed={"r": 2, "w": 1})
    'alternating'
    >>> detect_loop("b", count=0, recent=["a", "b", "a"], threshold=2, failed={"a": 1})
    'alternating'
    >>> detect_loop("c", count=0, recent=["a", "b", "a"], threshold=2)
    >>> detect_loop("a", count=2, recent=[], threshold=2, changed=True)
    """
    if failures >= threshold or (count >= threshold and not changed):
        return "repeat"
    if len(recent) >= 3:
        a, b, a2 = recent[-3:]
        if a == a2 and a != b and key == b:
            failed, write = failed or {}, is_write or (lambda _: False)
            checked = any(
                write(w) and not write(r) and failed.get(w, 0) > 0 and not failed.get(r, 0)
                for w, r in ((key, a), (a, key))
            )
            return None if checked else "alternating"
    return None
