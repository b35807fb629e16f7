"""Structured resilience events, to LangGraph's custom stream and to logging.

Every attempt, retry, outcome and routing decision becomes one `Event`. Inside
a graph it is written to ``stream_mode="custom"`` as a dict with a
``"resilience"`` key naming the event kind, so a user streaming the graph sees
recovery step by step; it is always logged to the ``langgraph_resilience``
logger. In a run with callback handlers (LangSmith's tracer, a user's handler), it is
also a custom event of the run it happens in, named ``resilience.<kind>``, so the
trace shows each attempt and decision. Event payloads are built from redacted
envelopes, and `emit` redacts every field again before it leaves.

An `Observer` (OpenTelemetry's, `langgraph_resilience.telemetry.instrument`) also
sees every event and wraps every attempt of a tool call. With none registered, which
is the default, an event costs what it did and an attempt nothing more.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from langchain_core.callbacks import dispatch_custom_event
from langgraph.config import get_config, get_stream_writer

from langgraph_resilience.core.redaction import REDACTED, is_secret_key, redact, redact_value

if TYPE_CHECKING:
    from langgraph_resilience.errors import ToolError

__all__ = ["EVENT_KEY", "Event", "Observer", "observe", "unobserve"]

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


def _traced() -> bool:
    """Whether the run this code runs in has callback handlers (LangSmith's tracer, a
    user's handler): then each event is also a custom event of that run, which LangSmith
    shows in its trace. A run without any costs one config read."""
    try:
        callbacks = get_config().get("callbacks")
    except RuntimeError:  # outside a runnable: no run to trace into
        return False
    return bool(getattr(callbacks, "handlers", callbacks))


class Observer(Protocol):
    """Sees every event (redacted) and each attempt of a tool call."""

    def event(self, kind: str, fields: Mapping[str, Any]) -> None:
        """One event, as the stream gets it."""
        ...

    def step(self) -> contextlib.AbstractContextManager[None]:
        """A block around one tools step: its attempts, and the decisions after them."""
        ...

    def attempt(self, tool: str, call_id: str) -> contextlib.AbstractContextManager[Outcome]:
        """A block around one attempt; what it yields is told how the attempt ended."""
        ...


Outcome = Callable[["ToolError | None"], None]
"""Told how an attempt ended: None when the tool answered (a result or a `Command`),
else its failure as classified where it was caught."""

_OBSERVERS: list[Observer] = []
"""Process-wide, as OpenTelemetry's providers are: `observe` adds, `unobserve` removes."""


def observe(observer: Observer) -> None:
    """Let `observer` see every event and attempt of this process from now on."""
    if observer not in _OBSERVERS:
        _OBSERVERS.append(observer)


def unobserve(observer: Observer) -> None:
    """Stop `observer` seeing anything."""
    if observer in _OBSERVERS:
        _OBSERVERS.remove(observer)


_UNOBSERVED: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
"""The block around a step or an attempt when nobody observes: one, shared, empty."""


def observed_step() -> contextlib.AbstractContextManager[None]:
    """Around one tools step: each observer's block (e.g. a span); a shared empty block
    when nobody observes (the clean path builds nothing)."""
    return _observed_step() if _OBSERVERS else _UNOBSERVED


@contextlib.contextmanager
def _observed_step() -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for observer in _OBSERVERS:
            stack.enter_context(observer.step())
        yield


def observed_attempt(tool: str, call_id: str) -> contextlib.AbstractContextManager[Outcome | None]:
    """Around one attempt of a tool call: each observer's block (e.g. a span). Yields
    the function to tell them its answer, None when nobody observes (the answer need
    not be worked out)."""
    return _observed_attempt(tool, call_id) if _OBSERVERS else _UNOBSERVED


@contextlib.contextmanager
def _observed_attempt(tool: str, call_id: str) -> Iterator[Outcome]:
    with contextlib.ExitStack() as stack:
        told = [stack.enter_context(o.attempt(tool, call_id)) for o in list(_OBSERVERS)]

        def outcome(answer: Any) -> None:
            for tell in told:
                tell(answer)

        yield outcome


def listening() -> bool:
    """Whether an event emitted now reaches anyone (a ``custom`` stream, the log or an
    observer), so a hot path builds its `Event` only then."""
    if _OBSERVERS or logger.isEnabledFor(logging.INFO) or _traced():
        return True
    return _writer() is not None


def emit(event: Event) -> None:
    """Send `event` to the custom stream (when inside a graph run that streams it), to
    the log and to the observers.

    Its fields are redacted first (`redact_value`: secret-named fields blanked,
    strings scrubbed, lists and dicts walked), whoever built it."""
    writer = _writer()
    logging_on = logger.isEnabledFor(logging.INFO)
    traced = _traced()
    if writer is None and not logging_on and not _OBSERVERS and not traced:
        return
    fields = _redacted(event)
    if logging_on:
        logger.info("%s %s", event.kind, fields)
    if writer is not None:
        writer({EVENT_KEY: event.kind, **fields})
    if traced:
        with contextlib.suppress(RuntimeError):  # a run without a parent run id
            dispatch_custom_event(f"{EVENT_KEY}.{event.kind}", fields)
    for observer in _OBSERVERS:
        observer.event(event.kind, fields)
