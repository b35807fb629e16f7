"""`Verdict` and `Rule`: what a classification rule returns, in a module of their own so
rule tables beyond `core.classification` (e.g. `core.mcp`) can build verdicts without a cycle."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from langgraph_resilience.core.profile import ToolProfile
from langgraph_resilience.errors import FailureClass

__all__ = ["Rule", "Verdict"]


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """What a rule decided about one exception."""

    failure_class: FailureClass
    suggested_action: str
    retriable: bool = False
    retry_after_ms: int | None = None
    context: Mapping[str, Any] = dataclasses.field(default_factory=dict)


Rule = Callable[[BaseException, ToolProfile | None], Verdict | None]
"""An ordered classification rule: return a `Verdict`, or None to pass."""
