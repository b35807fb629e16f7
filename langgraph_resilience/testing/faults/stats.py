"""What the injected tools saw, summed: `chaos_stats`."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from langchain_core.tools import BaseTool

from langgraph_resilience.testing.faults.tool import ChaosTool

__all__ = ["ChaosStats", "chaos_stats"]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ChaosStats:
    """What the injected tools saw, summed over tools."""

    calls: int
    """Calls that reached a tool (attempts), faulty or not."""
    executions: int
    """Times a wrapped tool really ran."""
    faults: dict[str, int]
    """Faults fired, by kind."""
    calls_after_removal: int
    calls_while_open: int
    max_attempts_per_call: int
    """The most calls one logical call (a tool-call id in its epoch) made to its tool
    (retries of that call)."""
    max_attempts_per_key: int
    """The most calls of one identical (tool, canonical args) in the run."""
    attempts_by_call: dict[str, int]
    """Calls per ``tool:call_id``, for the ids that reached a tool more than once (an id
    reused in several epochs: its most-retried logical call)."""
    shadow_opens: int = 0
    """Times a shadow breaker opened."""
    recovery_latencies: tuple[float, ...]
    by_tool: dict[str, dict[str, int]]

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return dataclasses.asdict(self)


def chaos_stats(tools: Iterable[BaseTool]) -> ChaosStats:
    """Sum the counters of the `ChaosTool`s among `tools` (others are ignored)."""
    faults: Counter[str] = Counter()
    per_call: Counter[tuple[str, str, int | None]] = Counter()
    per_key: Counter[str] = Counter()
    by_tool: dict[str, dict[str, int]] = {}
    calls = executions = after_removal = while_open = opens = 0
    latencies: list[float] = []
    for t in tools:
        if not isinstance(t, ChaosTool):
            continue
        log = t.log
        calls += t.calls
        executions += t.executions
        after_removal += t.calls_after_removal
        while_open += t.calls_while_open
        opens += t.shadow_opens
        latencies.extend(t.recovery_latencies)
        for entry in log:
            if entry.fault is not None:
                faults[entry.fault] += 1
            if entry.call_id:
                per_call[(t.name, entry.call_id, entry.epoch)] += 1
            per_key[entry.key] += 1
        by_tool[t.name] = {
            "calls": t.calls,
            "executions": t.executions,
            "faults": sum(1 for e in log if e.fault is not None),
        }
    return ChaosStats(
        calls=calls,
        executions=executions,
        faults=dict(sorted(faults.items())),
        calls_after_removal=after_removal,
        calls_while_open=while_open,
        max_attempts_per_call=max(per_call.values(), default=0),
        max_attempts_per_key=max(per_key.values(), default=0),
        attempts_by_call=_most_per_id(per_call),
        recovery_latencies=tuple(latencies),
        by_tool=by_tool,
        shadow_opens=opens,
    )


def _most_per_id(per_call: Mapping[tuple[str, str, int | None], int]) -> dict[str, int]:
    most: dict[str, int] = {}
    for (tool, call_id, _epoch), n in per_call.items():
        name = f"{tool}:{call_id}"
        if n > 1 and n > most.get(name, 0):
            most[name] = n
    return dict(sorted(most.items()))
