"""The call log of the chaos tools, and the shadow breakers replayed from it.

"Should a breaker be open?" is decided by a shadow breaker per tool: the
package's own pure breaker (`admit` / `record`) with the `BreakerConfig` given to
`inject`, fed with the outcomes the tool really saw, one per *logical call*
(see `langgraph_resilience.testing.faults`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from langgraph_resilience.core.breaker import BreakerConfig, BreakerState, admit, record
from langgraph_resilience.errors import FailureClass

__all__ = ["CallLog", "Shadow", "replay"]


@dataclasses.dataclass(frozen=True, slots=True)
class CallLog:
    """What happened to one call that reached a `ChaosTool` (one attempt)."""

    index: int
    call_id: str | None
    key: str
    fault: str | None
    ok: bool
    executed: bool
    at: float
    """Virtual monotonic time when the attempt ended."""
    seq: int = 0
    """Arrival order among every tool of the same `inject` call."""
    step: int | None = None
    """The LangGraph super-step it ran in (``langgraph_step``), None outside a graph."""
    epoch: int | None = None
    """The caller's epoch when it arrived (`inject`'s `epoch`), None without one."""
    started: float = 0.0
    """Wall-clock time (``clock.time()``) when it arrived: what a breaker is asked at."""
    outcome: FailureClass | None = None
    """What a breaker is told of this attempt: None for a success (degraded output
    included: the upstream answered), else the failure's class."""

    @property
    def logical(self) -> tuple[str | None, int | None, int | None]:
        """The logical call it is an attempt of: its tool-call id within its epoch (an
        attempt without an id is a call of its own)."""
        if self.call_id:
            return self.call_id, self.epoch, None
        return None, None, self.seq


@dataclasses.dataclass(slots=True)
class Shadow:
    """One tool's shadow breaker, as replayed over the attempts it saw."""

    while_open: int = 0
    opens: int = 0


_Logical = tuple[str, str | None, int | None, int | None]


def _report_points(entries: Sequence[tuple[CallLog, str]]) -> dict[int, list[_Logical]]:
    """For each logical call, the first attempt (by index into `entries`) that shows it had
    left its tool by then: after its last attempt there, the same call id on another
    tool (its fallback), or an attempt from a later epoch (the caller's next turn); or,
    without an epoch, an attempt from a later LangGraph step (an attempt outside a
    graph ends its call). A call is reported before that attempt is admitted."""
    last: dict[_Logical, int] = {}
    for i, (entry, tool) in enumerate(entries):
        last[(tool, *entry.logical)] = i
    points: dict[int, list[_Logical]] = {}
    for logical, i in last.items():
        entry, tool = entries[i]
        for j in range(i + 1, len(entries)):
            later, other = entries[j]
            if entry.epoch is not None and later.epoch is not None:
                left = later.epoch > entry.epoch
            else:
                left = entry.step is None or later.step is None or later.step > entry.step
            if left or (
                entry.call_id is not None
                and later.call_id == entry.call_id
                and later.epoch == entry.epoch
                and other != tool
            ):
                points.setdefault(j, []).append(logical)
                break
    return points


def replay(
    logs: Mapping[str, Sequence[CallLog]], configs: Mapping[str, BreakerConfig | None]
) -> dict[str, Shadow]:
    """Feed each tool's shadow breaker one outcome per logical call, as the package's
    breakers are fed: a success when an attempt succeeds, or the last attempt's failure
    once the call has left the tool (`_report_points`); a half-open probe decides at
    once. An attempt the shadow refuses counts in ``while_open`` and tells it nothing.

    `logs` holds each tool's attempts (by tool name), `configs` its breaker (None:
    not counted)."""
    entries = sorted(
        ((entry, name) for name, log in logs.items() for entry in log),
        key=lambda pair: pair[0].seq,
    )
    points = _report_points(entries)
    states: dict[str, BreakerState] = {}
    shadows = {name: Shadow() for name in logs}
    pending: dict[_Logical, FailureClass] = {}
    reported: set[_Logical] = set()

    def tell(name: str, now: float, outcome: FailureClass | None, *, probe: bool) -> None:
        cfg = configs[name]
        if cfg is None:
            return
        states[name], transition = record(
            states.get(name, BreakerState()), cfg, now, outcome, probe=probe
        )
        if transition is not None and transition.target == "open":
            shadows[name].opens += 1

    for j, (entry, tool) in enumerate(entries):
        for logical in points.get(j, ()):
            if logical in pending:
                tell(logical[0], entry.started, pending.pop(logical), probe=False)
                reported.add(logical)
        cfg = configs[tool]
        if cfg is None:
            continue
        admission, states[tool], _ = admit(states.get(tool, BreakerState()), cfg, entry.started)
        if not admission.allowed:
            shadows[tool].while_open += 1
            continue
        logical = (tool, *entry.logical)
        if admission.probe:
            tell(tool, entry.started, entry.outcome, probe=True)
            pending.pop(logical, None)
            reported.add(logical)
        elif logical in reported:
            continue  # its outcome was told already (e.g. a succeeded call run again)
        elif entry.outcome is None:
            tell(tool, entry.started, None, probe=False)
            pending.pop(logical, None)
            reported.add(logical)
        else:
            pending[logical] = entry.outcome
    return shadows
