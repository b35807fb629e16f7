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

from langgraph_resilience.core.redaction import redact_value

__all__ = ["EVENT_KEY", "Event", "emit", "logger"]

logger = logging.getLogger("langgraph_resilience")

EVENT_KEY = "resilience"
"""The key that marks a custom-stream chunk as one of our events."""


class Event(dict[str, Any]):
    """One event: ``{"resilience": kind, **fields}``, a plain JSON-ready dict.

    >>> Event("attempt", tool="search", attempt=1)
    {'resilience': 'attempt', 'tool': 'search', 'attempt': 1}
    """

    def __init__(self, kind: str, /, **fields: Any) -> None:
        super().__init__({EVENT_KEY: kind, **fields})

    @property
    def kind(self) -> str:
        """The event kind, e.g. ``attempt``, ``retry_scheduled``, ``gave_up``."""
        return str(self[EVENT_KEY])


def emit(event: Event) -> None:
    """Send `event` to the custom stream (when inside a graph run) and to the log.

    Its fields are redacted first (`redact_value`: secret-named fields blanked,
    strings scrubbed, lists and dicts walked), whoever built it."""
    try:
        writer = get_stream_writer()
    except (RuntimeError, KeyError):  # outside a LangGraph run: logging only
        writer = None
    logging_on = logger.isEnabledFor(logging.INFO)
    if writer is None and not logging_on:
        return
    fields = redact_value({k: v for k, v in event.items() if k != EVENT_KEY})
    if logging_on:
        logger.info("%s %s", event.kind, fields)
    if writer is not None:
        writer({EVENT_KEY: event.kind, **fields})
