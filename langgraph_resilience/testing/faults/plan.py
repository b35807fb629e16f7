"""Fault plans: *what* goes wrong (a kind of `FAULT_KINDS`) on which `Schedule`.

A `FaultSpec` pairs kinds with a schedule, optionally for some tools only; a
`FaultPlan` is an ordered list of them, and `single`, `persistent`,
`intermittent` and `burst` build the specs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from langgraph_resilience.errors import ConfigurationError
from langgraph_resilience.testing.faults.kinds import FAULT_KINDS
from langgraph_resilience.testing.faults.schedules import (
    Burst,
    Intermittent,
    Persistent,
    Schedule,
    Single,
    check_schedule,
)

__all__ = ["FaultPlan", "FaultSpec", "burst", "intermittent", "persistent", "single"]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class FaultSpec:
    """One plan entry: fault `kind` (or a tuple of kinds, one picked per firing) on
    `schedule`, for `tools` (None: every tool).

    >>> FaultSpec(kind="http_503", schedule=Single(at=1), tools=("search",)).kinds
    ('http_503',)
    """

    kind: str | tuple[str, ...]
    schedule: Schedule
    tools: tuple[str, ...] | None = None
    rename: Mapping[str, str] | None = None
    """For ``schema_drift``: old argument name -> new name; default: the first
    required argument ``x`` becomes ``x_v2``."""

    def __post_init__(self) -> None:
        unknown = [k for k in self.kinds if k not in FAULT_KINDS]
        if not self.kinds or unknown:
            raise ConfigurationError(
                f"unknown fault kind(s) {unknown or [self.kind]!r}; "
                f"known kinds: {sorted(FAULT_KINDS)}"
            )
        check_schedule(self.schedule)
        if isinstance(self.tools, str):
            raise ConfigurationError(
                f"tools must be a tuple of tool names, got the string {self.tools!r}; "
                f"write tools=({self.tools!r},)"
            )

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds this entry may inject."""
        return (self.kind,) if isinstance(self.kind, str) else tuple(self.kind)

    def applies_to(self, tool: str) -> bool:
        """Whether this entry targets `tool`."""
        return self.tools is None or tool in self.tools

    def describe(self) -> dict[str, Any]:
        """A JSON-ready description."""
        schedule = {"type": type(self.schedule).__name__, **dataclasses.asdict(self.schedule)}
        return {
            "kinds": list(self.kinds),
            "schedule": schedule,
            "tools": list(self.tools) if self.tools is not None else None,
        }


def single(
    kind: str | tuple[str, ...], *, at: int = 0, tools: Iterable[str] | None = None
) -> FaultSpec:
    """The ``at``-th call of each targeted tool fails with `kind`."""
    return FaultSpec(kind=kind, schedule=Single(at=at), tools=_tools(tools))


def persistent(
    kind: str | tuple[str, ...],
    *,
    start: int = 0,
    tools: Iterable[str] | None = None,
    rename: Mapping[str, str] | None = None,
) -> FaultSpec:
    """Every call from the ``start``-th on fails with `kind`."""
    return FaultSpec(
        kind=kind, schedule=Persistent(start=start), tools=_tools(tools), rename=rename
    )


def intermittent(
    kind: str | tuple[str, ...], *, p: float, tools: Iterable[str] | None = None
) -> FaultSpec:
    """Each call fails with `kind` with probability `p`, independently."""
    return FaultSpec(kind=kind, schedule=Intermittent(p=p), tools=_tools(tools))


def burst(
    kind: str | tuple[str, ...],
    *,
    length: int,
    start: int | None = 0,
    p: float = 0.1,
    tools: Iterable[str] | None = None,
) -> FaultSpec:
    """`length` consecutive calls fail: from ``start``, or at random onsets (``start=None``)."""
    return FaultSpec(
        kind=kind, schedule=Burst(length=length, start=start, p=p), tools=_tools(tools)
    )


def _tools(tools: Iterable[str] | None) -> tuple[str, ...] | None:
    if tools is None:
        return None
    if isinstance(tools, str):
        return (tools,)
    return tuple(tools)


@dataclasses.dataclass(frozen=True, slots=True)
class FaultPlan:
    """An ordered list of `FaultSpec`s; per call, the first entry that fires wins.

    >>> FaultPlan.of(single("http_503"), name="one-503").name
    'one-503'
    """

    specs: tuple[FaultSpec, ...] = ()
    name: str = "custom"

    @classmethod
    def of(cls, *specs: FaultSpec, name: str = "custom") -> FaultPlan:
        """A plan from its entries."""
        return cls(tuple(specs), name)

    @property
    def kinds(self) -> tuple[str, ...]:
        """Every kind the plan may inject, in order of first mention."""
        return tuple(dict.fromkeys(k for spec in self.specs for k in spec.kinds))

    def describe(self) -> dict[str, Any]:
        """A JSON-ready description."""
        return {"name": self.name, "specs": [spec.describe() for spec in self.specs]}
