"""`ToolProfile`: what the package needs to know about one tool beyond its schema.

A profile is optional; a tool without one is treated as a read-only call with
the graph's policy. Recovery paths read the fields that concern them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any, Literal

from pydantic import BaseModel

from langgraph_resilience.core.policy import seconds
from langgraph_resilience.errors import ConfigurationError

__all__ = ["ToolProfile"]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ToolProfile:
    """Per-tool behaviour that overrides or extends the graph's `ResiliencePolicy`.

    >>> ToolProfile(side_effect=True).side_effect
    True
    """

    side_effect: bool = False
    """The tool changes the world (payment, email, order). A side-effecting call is
    never retried blindly: a failure that may hide a done effect (a read timeout, a
    connection dropped after the request left) is UNKNOWN rather than TRANSIENT,
    while one that proves the request was not processed (429, 503, a refused
    connection) is retried under the same idempotency key."""

    safe_repeat: Literal["by_key", "idempotent"] | None = None
    """Why repeating this side effect is safe, when it is. ``"by_key"``: the service
    deduplicates by the idempotency key the tool passes on (`current_idempotency_key`,
    e.g. Stripe's ``Idempotency-Key``, an AWS client token, an MCP server reading
    ``_meta``), so an effect of unknown outcome is sent again under the same key, and
    a model's re-issue is sent under the earlier call's key. ``"idempotent"``: doing
    it twice is doing it once (set an address, cancel an order), so it is retried like
    a read. None: a lost answer is never repeated blindly (reconciled through
    `status_check`, the agent, or a human)."""

    max_attempts: int | None = None
    """Overrides `ResiliencePolicy.max_attempts` for this tool."""

    timeout: float | dt.timedelta | None = None
    """Overrides `ResiliencePolicy.tool_timeout` for this tool."""

    output_schema: type[BaseModel] | None = None
    """A pydantic model the tool's result (parsed from JSON when it is text) must
    satisfy; a result that does not is a SEMANTIC failure, never a success."""

    validate_output: Callable[[Any], str | None] | None = None
    """A check of the result returning a problem description, or None when fine."""

    loop_threshold: int | None = None
    """Overrides `ResiliencePolicy.loop_threshold`: raise it for polling tools whose
    identical repeated calls are legitimate."""

    fallback: str | Sequence[str] | None = None
    """Tool name(s) that serve this tool's calls, in order, when its breaker is open,
    it fails STRUCTURALLY or its retries are exhausted. Never loops back."""

    fallback_args: Callable[[str, dict[str, Any]], dict[str, Any]] | None = None
    """``(fallback_name, args) -> args``: adapts the agent's arguments for a fallback
    whose signature differs (default: the same arguments)."""

    breaker_key: str | None = None
    """The circuit breaker this tool reports to (default: the tool name); tools on one
    upstream host can share a key and so a breaker."""

    server: str | None = None
    """The MCP server serving the tool (tools loaded by `aload_mcp_tools` are tagged
    with theirs): its breaker is then the server's, ``mcp:<server>``, unless
    `breaker_key` says otherwise, and a refusal names the server's other tools."""

    critical: bool = True
    """False: the task can do without this tool. While its server is down (its breaker
    open) a call is answered "skipped: server X unavailable", a result the model can
    plan around, instead of a failure. A `fallback` is tried first."""

    max_concurrent: int | None = None
    """Bulkhead: at most this many calls of the tool in flight at once."""

    max_wait: float | dt.timedelta = 0.0
    """Bulkhead: how long an excess call waits for a slot before failing TRANSIENT."""

    status_check: Callable[..., Any] | None = None
    """For side effects: ``status_check(idempotency_key)`` or
    ``status_check(idempotency_key, args)`` asks the service whether the effect
    happened (the second form serves a service that cannot look up by key: it gets
    the call's arguments). Return an `EffectStatus`, or the effect's result when done
    and None when not; may be async under ``ainvoke``. Raising leaves the outcome
    unknown. Without it an effect of unknown outcome is never re-run: a human (or the
    agent) is asked."""

    compensate: Callable[[str, Any], Any] | None = None
    """For side effects: ``compensate(idempotency_key, recorded_result)`` undoes the
    effect when the task is abandoned (run newest first, exactly once)."""

    batch_arg: str | None = None
    """For batch tools: the list argument that holds the items. When the tool returns a
    `PartialResult` (some items failed), only the failed items are run again, within
    `max_attempts` (PARTIAL). A side-effecting batch tool reads each item's own
    idempotency key with `current_item_keys()`: a redone item keeps its first key."""

    merge_batches: Callable[[list[Any], Any], Any] | None = None
    """For batch tools: ``merge_batches(succeeded_earlier, last_result)`` builds the
    call's answer, in the tool's own shape, once a redo finished it (e.g. adding the
    earlier items to a ``sent`` list). Default:
    ``{"succeeded_earlier": [...], "result": last_result}``."""

    @property
    def fallbacks(self) -> tuple[str, ...]:
        """`fallback` as a tuple of tool names."""
        if self.fallback is None:
            return ()
        return (self.fallback,) if isinstance(self.fallback, str) else tuple(self.fallback)

    def __post_init__(self) -> None:
        if self.server is not None and not (isinstance(self.server, str) and self.server):
            raise ConfigurationError(
                f"ToolProfile.server must name an MCP server, got {self.server!r}"
            )
        object.__setattr__(self, "max_wait", seconds(self.max_wait, field="max_wait"))
        if float(self.max_wait) < 0:  # type: ignore[arg-type]
            raise ConfigurationError("ToolProfile.max_wait must be >= 0 seconds")
        if self.max_concurrent is not None and (
            isinstance(self.max_concurrent, bool)
            or not isinstance(self.max_concurrent, int)
            or self.max_concurrent < 1
        ):
            raise ConfigurationError(
                f"ToolProfile.max_concurrent must be an integer >= 1 or None, "
                f"got {self.max_concurrent!r}"
            )
        if self.fallback is not None and (
            not all(isinstance(name, str) and name for name in self.fallbacks)
        ):
            raise ConfigurationError("ToolProfile.fallback must be a tool name or a list of names")
        if (
            self.status_check is not None
            or self.compensate is not None
            or self.safe_repeat is not None
        ) and not self.side_effect:
            raise ConfigurationError(
                "status_check, compensate and safe_repeat only apply to side effects: "
                "pass side_effect=True as well"
            )
        if self.safe_repeat not in (None, "by_key", "idempotent"):
            raise ConfigurationError(
                f"ToolProfile.safe_repeat must be 'by_key' (the service deduplicates by the "
                f"idempotency key), 'idempotent' (twice is once) or None, "
                f"got {self.safe_repeat!r}"
            )
        if self.timeout is not None:
            object.__setattr__(self, "timeout", seconds(self.timeout, field="timeout"))
            if float(self.timeout) <= 0:  # type: ignore[arg-type]
                raise ConfigurationError("ToolProfile.timeout must be > 0 seconds or None")
        if self.loop_threshold is not None and (
            isinstance(self.loop_threshold, bool)
            or not isinstance(self.loop_threshold, int)
            or self.loop_threshold < 1
        ):
            raise ConfigurationError(
                f"ToolProfile.loop_threshold must be an integer >= 1 or None, "
                f"got {self.loop_threshold!r}"
            )
        if self.merge_batches is not None and self.batch_arg is None:
            raise ConfigurationError(
                "merge_batches only applies to batch tools: pass batch_arg too"
            )
        if self.batch_arg is not None and not (isinstance(self.batch_arg, str) and self.batch_arg):
            raise ConfigurationError(
                f"ToolProfile.batch_arg must name the tool's list argument, got {self.batch_arg!r}"
            )
        if self.output_schema is not None and not (
            isinstance(self.output_schema, type) and issubclass(self.output_schema, BaseModel)
        ):
            raise ConfigurationError("ToolProfile.output_schema must be a pydantic model class")
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
