"""OpenTelemetry for recovery: a span per attempt, a span event per decision, metrics.

Operators chart what they already run, so recovery is shown in OpenTelemetry's terms
rather than our own: `instrument()` once at start-up, and every attempt of a tool call
becomes a ``resilience.attempt`` span (a child of whatever span is current: the tool
run's, when LangSmith or another instrumentation traces LangChain) inside a
``resilience.step`` span for the tools step, every event of the package a span event on
the current span (the decisions after an attempt on the step's), and the counters below
move.

Names follow OpenTelemetry's GenAI semantic conventions where they exist
(``gen_ai.tool.name``, ``gen_ai.tool.call.id``, ``error.type``) and Polly's and
resilience4j's resilience metrics where they do not (attempts and retries by outcome,
breaker transitions by state):

===================================== ===================================================
metric                                what moves it
===================================== ===================================================
``resilience.tool.attempts``          every attempt; ``resilience.outcome``: ``ok`` or the
                                      failure class
``resilience.tool.retries``           a retry scheduled; ``resilience.failure_class``
``resilience.tool.gave_up``           a call answered with its failure
``resilience.breaker.transitions``    a breaker changed state; ``resilience.breaker.state``
``resilience.effect.reconciliations`` a side effect answered by asking its service, or
                                      from another call of the same effect
``resilience.effect.replays``         a side effect answered from the ledger
``resilience.effect.unknown``         a side effect's outcome told to the agent as unknown
``resilience.recovery.llm_calls``     a model call spent on recovery (repair, replan)
===================================== ===================================================

Optional: ``pip install "langgraph-resilience[otel]"`` (the OpenTelemetry API; bring
the SDK and exporter you use). Nothing imports this module unless you do, and
without `instrument()` no span, event or metric is made.

Span and event attributes are the events' fields, redacted as every event is (the
idempotency key as its SHA-256 prefix: a key names a business operation).
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator, Mapping
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.metrics import MeterProvider
from opentelemetry.trace import Status, StatusCode, TracerProvider

from langgraph_resilience.errors import FailureClass, ToolError
from langgraph_resilience.events import Outcome, observe, unobserve

__all__ = ["COUNTERS", "Telemetry", "instrument", "uninstrument"]

_SCOPE = "langgraph_resilience"
_LLM_CALLS = {"repair_requested": "repair", "plan_verdict": "replan"}
"""The events that stand for one model call spent on recovery, and what for."""
_ATTRIBUTE_TYPES = (str, bool, int, float)

COUNTERS: dict[str, tuple[str, str]] = {
    "resilience.tool.attempts": ("{attempt}", "Tool attempts."),
    "resilience.tool.retries": ("{retry}", "Retries scheduled."),
    "resilience.tool.gave_up": ("{call}", "Calls answered with their failure."),
    "resilience.breaker.transitions": ("{transition}", "Breaker state changes."),
    "resilience.effect.reconciliations": ("{effect}", "Side effects found done."),
    "resilience.effect.replays": ("{effect}", "Side effects answered from the ledger."),
    "resilience.effect.unknown": ("{effect}", "Side effects of unknown outcome."),
    "resilience.recovery.llm_calls": ("{call}", "Model calls spent on recovery."),
}
"""The counters `Telemetry` keeps: name -> (unit, description)."""


class Telemetry:
    """The OpenTelemetry observer `instrument` registers (see the module)."""

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        self.tracer = trace.get_tracer(_SCOPE, tracer_provider=tracer_provider)
        meter = metrics.get_meter(_SCOPE, meter_provider=meter_provider)

        self.counters = {
            name: meter.create_counter(name, unit=unit, description=description)
            for name, (unit, description) in COUNTERS.items()
        }
        """Each counter of `COUNTERS`, by name."""

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """A ``resilience.step`` span around one tools step: the parent of its attempts,
        and where the decisions made after them (retry, give up) are recorded."""
        with self.tracer.start_as_current_span("resilience.step", kind=trace.SpanKind.INTERNAL):
            yield

    @contextlib.contextmanager
    def attempt(self, tool: str, call_id: str) -> Iterator[Outcome]:
        """A ``resilience.attempt`` span around one attempt, ended with its outcome."""
        attributes = {"gen_ai.tool.name": tool, "gen_ai.tool.call.id": call_id}
        with self.tracer.start_as_current_span(
            "resilience.attempt", kind=trace.SpanKind.INTERNAL, attributes=attributes
        ) as span:

            def outcome(error: ToolError | None) -> None:
                result = "ok" if error is None else error.failure_class.value
                self.counters["resilience.tool.attempts"].add(
                    1, {"gen_ai.tool.name": tool, "resilience.outcome": result}
                )
                span.set_attribute("resilience.outcome", result)
                if error is not None:
                    span.set_attribute("error.type", error.type)
                    span.set_attribute("resilience.suggested_action", error.suggested_action)
                    span.set_status(Status(StatusCode.ERROR, error.failure_class.value))

            yield outcome

    def event(self, kind: str, fields: Mapping[str, Any]) -> None:
        """A span event on the current span, and the counter points the event makes."""
        span = trace.get_current_span()
        if span.is_recording():
            span.add_event(f"resilience.{kind}", _attributes(fields))
        for name, attributes in _points(kind, fields):
            self.counters[name].add(1, attributes)


def _points(kind: str, fields: Mapping[str, Any]) -> list[tuple[str, dict[str, str]]]:
    """The counter points an event makes: (counter, attributes) each."""
    tool = {"gen_ai.tool.name": str(fields.get("tool", ""))}
    failure = {**tool, "resilience.failure_class": str(fields.get("failure_class", ""))}
    if kind == "retry_scheduled":
        return [("resilience.tool.retries", failure)]
    if kind == "gave_up":
        unknown = fields.get("failure_class") == FailureClass.UNKNOWN.value
        return [("resilience.tool.gave_up", failure)] + (
            [("resilience.effect.unknown", tool)] if unknown else []
        )
    if kind == "breaker":
        breaker = {
            "resilience.breaker": str(fields.get("key", "")),
            "resilience.breaker.state": str(fields.get("to_state", "")),
        }
        return [("resilience.breaker.transitions", breaker)]
    if kind == "effect_reconciled":
        return [("resilience.effect.reconciliations", tool)]
    if kind == "effect_replayed":
        return [("resilience.effect.replays", tool)]
    if kind in _LLM_CALLS:
        return [("resilience.recovery.llm_calls", {"resilience.purpose": _LLM_CALLS[kind]})]
    return []


def _attributes(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The event's fields as span attributes: scalars kept, the key hashed, the rest
    (lists, maps) as their text."""
    attributes: dict[str, Any] = {}
    for name, value in fields.items():
        if value is None:
            continue
        if name == "key":
            digest = hashlib.sha256(str(value).encode()).hexdigest()[:16]
            attributes["resilience.idempotency_key.sha256"] = digest
        elif isinstance(value, _ATTRIBUTE_TYPES):
            attributes[f"resilience.{name}"] = value
        else:
            attributes[f"resilience.{name}"] = str(value)
    return attributes


_INSTALLED: list[Telemetry] = []
"""The observer `instrument` registered in this process (at most one)."""


def instrument(
    *,
    tracer_provider: TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
) -> Telemetry:
    """Send this process's recovery to OpenTelemetry (the global providers unless
    given). Calling it again replaces the earlier one.

    >>> from langgraph_resilience.telemetry import instrument  # doctest: +SKIP
    >>> instrument()  # after your OpenTelemetry SDK set-up  # doctest: +SKIP
    """
    uninstrument()
    telemetry = Telemetry(tracer_provider, meter_provider)
    observe(telemetry)
    _INSTALLED.append(telemetry)
    return telemetry


def uninstrument() -> None:
    """Stop sending anything to OpenTelemetry."""
    while _INSTALLED:
        unobserve(_INSTALLED.pop())
