"""`ToolProfile`: what the package needs to know about one tool beyond its schema.

A profile is optional; a tool without one is treated as a read-only call with
the graph's policy. Recovery paths read the fields that concern them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

from langgraph_resilience.errors import ConfigurationError
from langgraph_resilience.policy import seconds

__all__ = ["ToolProfile"]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ToolProfile:
    """Per-tool behaviour that overrides or extends the graph's `ResiliencePolicy`.

    >>> ToolProfile(side_effect=True).side_effect
    True
    """

    side_effect: bool = False
    """The tool changes the world (payment, email, order). A side-effecting call is
    never retried blindly, and a timeout on it is UNKNOWN rather than TRANSIENT."""

    max_attempts: int | None = None
    """Overrides `ResiliencePolicy.max_attempts` for this tool."""

    timeout: float | dt.timedelta | None = None
    """Overrides `ResiliencePolicy.tool_timeout` for this tool."""

    def __post_init__(self) -> None:
        if self.timeout is not None:
            object.__setattr__(self, "timeout", seconds(self.timeout, field="timeout"))
            if float(self.timeout) <= 0:  # type: ignore[arg-type]
                raise ConfigurationError("ToolProfile.timeout must be > 0 seconds or None")
        if self.max_attempts is not None and (
            isinstance(self.max_attempts, bool)
            or not isinstance(self.max_attempts, int)
            or self.max_attempts < 1
        ):
            raise ConfigurationError(
                f"ToolProfile.max_attempts must be an integer >= 1 or None, "
                f"got {self.max_attempts!r}"
            )

    @property
    def timeout_s(self) -> float | None:
        """`timeout` in seconds, or None."""
        return None if self.timeout is None else float(self.timeout)  # type: ignore[arg-type]
