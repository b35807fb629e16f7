"""Structured resilience events, to LangGraph's custom stream and to logging.

Every attempt, retry, outcome and routing decision becomes one `Event`. Inside
a graph it is written to ``stream_mode="custom"`` as a dict with a
``"resilience"`` key naming the event kind, so a user streaming the graph sees
recovery step by step; it is always logged to the ``langgraph_resilience``
logger. Event payloads are built from redacted envelopes, and `emit` redacts every
field again before it leaves.
"""

from __future__ import annotations

import logging
from typing import Any

from langgraph.config import get_stream_writer

from langgraph_resilience.core.redaction import REDACTED, is_secret_key, redact, redact_value

__all__ = ["EVENT_KEY", "Event", "emit", "listening", "logger"]

logger = logging.getLogger("langgraph_resilience")

EVENT_KEY = "resilience"
"""The key that marks a custom-stream chunk as one of our events."""


class Event(dict[str, Any]):
    """One event: ``{"resilience": kind, **fields}``, a plain JSON-ready dict.

    >>> Event("attempt", tool="search", attempt=1)
    {'resilience': 'attempt', 'tool': 'search', 'attempt': 1}
    """

    def __init__(self, kind: str, /, **fields: Any) -> None:
        super().__init__()
        self[EVENT_KEY] = kind
        self.update(fields)

    @property
    def kind(self) -> str:
        """The event kind, e.g. ``attempt``, ``retry_scheduled``, ``gave_up``."""
        return str(self[EVENT_KEY])


_SCALARS = (int, float, bool, type(None))


def _redacted(event: Event) -> dict[str, Any]:
    """The event's fields, redacted. Most events are flat (names, ids, counts): those
    are scrubbed field by field, without `redact_value`'s walk."""
    fields: dict[str, Any] = {}
    for key, value in event.items():
        if key == EVENT_KEY:
            continue
        if is_secret_key(key):
            fields[key] = REDACTED
        elif type(value) is str:
            fields[key] = redact(value)
        elif type(value) in _SCALARS:
            fields[key] = value
        else:
            fields[key] = redact_value(value)
    return fields


def _does_nothing(_: Any) -> None:
    pass  # no docstring: it would be the first constant, and the code compared differs


_NOTHING = _does_nothing.__code__.co_code
"""The bytecode of a function that only returns (its first constant): LangGraph's stream
writer when nobody streams ``custom``, which an event would reach for nothing."""


def _writer() -> Any:
    """The run's custom-stream writer, or None: outside a run, or when the run's writer
    does nothing (LangGraph gives one whose body is empty unless ``custom`` is
    streamed, and an event redacted for it would be thrown away)."""
    try:
        writer = get_stream_writer()
    except (RuntimeError, KeyError):  # a runnable outside a LangGraph run
        return None
    code = getattr(writer, "__code__", None)
    if code is not None and code.co_code == _NOTHING:
        return None
    return writer


def listening() -> bool:
    """Whether an event emitted now reaches anyone (a ``custom`` stream or the log), so
    a hot path builds its `Event` only then."""
    return logger.isEnabledFor(logging.INFO) or _writer() is not None


def emit(event: Event) -> None:
    """Send `event` to the custom stream (when inside a graph run that streams it) and
    to the log.

    Its fields are redacted first (`redact_value`: secret-named fields blanked,
    strings scrubbed, lists and dicts walked), whoever built it."""
    writer = _writer()
    logging_on = logger.isEnabledFor(logging.INFO)
    if writer is None and not logging_on:
        return
    fields = _redacted(event)
    if logging_on:
        logger.info("%s %s", event.kind, fields)
    if writer is not None:
        writer({EVENT_KEY: event.kind, **fields})
