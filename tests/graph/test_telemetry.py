"""OpenTelemetry: one retry, one reconciliation and one breaker opening produce the spans,
span events and metric points `langgraph_resilience.telemetry` names, read back with the
SDK's in-memory exporters; without `instrument()` nothing is made."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the otel extra and the SDK are not installed")

from langchain_core.messages import ToolMessage
from langchain_core.tools import tool
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from langgraph_resilience import ToolProfile
from langgraph_resilience.core.breaker import BreakerConfig
from langgraph_resilience.stores.breakers import InMemoryBreakerStore
from langgraph_resilience.telemetry import instrument, uninstrument
from langgraph_resilience.testing import FakeClock, Fault, FaultyTool, text, tool_calls
from tests.conftest import Runner, build_graph


@tool
def search(query: str) -> str:
    """Search the catalogue."""
    return f"results for {query}"


@tool
def refund(order_id: int) -> str:
    """Refund an order."""
    return f"refunded {order_id}"


class Otel:
    """The SDK's in-memory span exporter and metric reader, instrumented."""

    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        meter_provider = MeterProvider(metric_readers=[self.reader])
        instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)

    def attempts(self) -> list[ReadableSpan]:
        return [s for s in self.spans.get_finished_spans() if s.name == "resilience.attempt"]

    def points(self, name: str) -> list[tuple[dict[str, Any], int]]:
        """(attributes, value) of each point of the counter `name`."""
        data = self.reader.get_metrics_data()
        found: list[tuple[dict[str, Any], int]] = []
        for resource in data.resource_metrics if data else []:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        found += [
                            (dict(p.attributes or {}), int(p.value))
                            for p in metric.data.data_points
                        ]  # type: ignore[union-attr]
        return found


@pytest.fixture
def otel() -> Iterator[Otel]:
    exporters = Otel()
    yield exporters
    uninstrument()


def test_a_retry_is_two_attempt_spans_and_a_retry_point(runner: Runner, otel: Otel) -> None:
    flaky = FaultyTool(search, [Fault.status(503)])
    h = build_graph([flaky], [tool_calls(("search", {"query": "lamps"})), text("ok")])
    runner.invoke(h.app, {"messages": [("user", "lamps")]}, h.config())

    spans = otel.attempts()
    assert [s.attributes["resilience.outcome"] for s in spans] == ["transient", "ok"]  # type: ignore[index]
    assert {s.attributes["gen_ai.tool.name"] for s in spans} == {"search"}  # type: ignore[index]
    assert spans[0].attributes["error.type"] == "FakeHTTPError"  # type: ignore[index]
    steps = [s for s in otel.spans.get_finished_spans() if s.name == "resilience.step"]
    assert len(steps) == 1  # the retry ran inside the step (a short backoff)
    assert {s.parent.span_id for s in spans if s.parent} == {steps[0].context.span_id}
    assert "resilience.retry_scheduled" in [e.name for e in steps[0].events]
    assert otel.points("resilience.tool.retries") == [
        ({"gen_ai.tool.name": "search", "resilience.failure_class": "transient"}, 1)
    ]
    attempts = {a["resilience.outcome"]: v for a, v in otel.points("resilience.tool.attempts")}
    assert attempts == {"transient": 1, "ok": 1}


def test_a_reconciled_effect_is_named_so(runner: Runner, otel: Otel) -> None:
    """The answer was lost after the refund; its status check finds it done: the span
    event and the metric say "reconciled", not "a second attempt"."""
    lost = FaultyTool(refund, [Fault.timeout(after_effect=True)])

    def refunded(key: str) -> Any:
        return {"done": lost.executions > 0, "result": "refunded 7"}

    profiles = {"refund": ToolProfile(side_effect=True, status_check=refunded)}
    h = build_graph(
        [lost], [tool_calls(("refund", {"order_id": 7})), text("ok")], profiles=profiles
    )
    out = runner.invoke(h.app, {"messages": [("user", "refund 7")]}, h.config())

    answers = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    assert [m.status for m in answers] == ["success"]
    assert lost.executions == 1
    events = [e for s in otel.spans.get_finished_spans() for e in s.events]
    reconciled = [e for e in events if e.name == "resilience.effect_reconciled"]
    assert len(reconciled) == 1
    assert len(str(reconciled[0].attributes["resilience.idempotency_key.sha256"])) == 16  # type: ignore[index]
    assert otel.points("resilience.effect.reconciliations") == [({"gen_ai.tool.name": "refund"}, 1)]


def test_a_breaker_opening_is_a_transition_point(runner: Runner, otel: Otel) -> None:
    down = FaultyTool(search, then=Fault.status(503))
    trippy = BreakerConfig(minimum_calls=1, window_size=1, open_duration=30)
    h = build_graph(
        [down],
        [tool_calls(("search", {"query": "x"})), text("ok")],
        clock=FakeClock(),
        options={"breaker": trippy, "breaker_store": InMemoryBreakerStore()},
    )
    runner.invoke(h.app, {"messages": [("user", "x")]}, h.config())

    transitions = otel.points("resilience.breaker.transitions")
    assert ({"resilience.breaker": "search", "resilience.breaker.state": "open"}, 1) in transitions
    gave_up = otel.points("resilience.tool.gave_up")
    assert gave_up == [({"gen_ai.tool.name": "search", "resilience.failure_class": "transient"}, 1)]


def test_nothing_is_made_or_imported_without_instrument(runner: Runner) -> None:
    """The package never imports its telemetry module itself, and an uninstrumented run
    observes nothing."""
    code = (
        "import sys, langgraph_resilience as l\n"
        "from langgraph_resilience import add_resilience, ResilienceMiddleware\n"
        "assert 'langgraph_resilience.telemetry' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    from langgraph_resilience import events  # noqa: PLC0415

    assert events._OBSERVERS == []


def test_create_agent_with_the_middleware_makes_the_same_spans(runner: Runner, otel: Otel) -> None:
    from langchain.agents import create_agent  # noqa: PLC0415
    from langgraph.checkpoint.memory import InMemorySaver  # noqa: PLC0415

    from langgraph_resilience import ResilienceMiddleware  # noqa: PLC0415
    from langgraph_resilience.testing import ScriptedChatModel  # noqa: PLC0415

    flaky = FaultyTool(search, [Fault.status(503)])
    model = ScriptedChatModel(responses=[tool_calls(("search", {"query": "x"})), text("ok")])
    agent = create_agent(
        model,
        [flaky],
        middleware=[ResilienceMiddleware(clock=FakeClock())],
        checkpointer=InMemorySaver(),
    )
    runner.invoke(agent, {"messages": [("user", "x")]}, {"configurable": {"thread_id": "mw"}})

    assert [s.attributes["resilience.outcome"] for s in otel.attempts()] == ["transient", "ok"]  # type: ignore[index]
    attempts = {a["resilience.outcome"]: v for a, v in otel.points("resilience.tool.attempts")}
    assert attempts == {"transient": 1, "ok": 1}


def test_every_counter_is_moved_by_the_event_that_names_it() -> None:
    """The counters the graph tests do not reach: replays, unknown outcomes, recovery
    LLM calls; and every named counter exists."""
    from langgraph_resilience.telemetry import COUNTERS, _points  # noqa: PLC0415

    gave_up = _points("gave_up", {"tool": "pay", "failure_class": "unknown"})
    assert gave_up == [
        (
            "resilience.tool.gave_up",
            {"gen_ai.tool.name": "pay", "resilience.failure_class": "unknown"},
        ),
        ("resilience.effect.unknown", {"gen_ai.tool.name": "pay"}),
    ]
    assert _points("effect_replayed", {"tool": "pay"}) == [
        ("resilience.effect.replays", {"gen_ai.tool.name": "pay"})
    ]
    assert _points("repair_requested", {"tool": "pay"}) == [
        ("resilience.recovery.llm_calls", {"resilience.purpose": "repair"})
    ]
    assert _points("plan_verdict", {"accepted": True}) == [
        ("resilience.recovery.llm_calls", {"resilience.purpose": "replan"})
    ]
    assert _points("route", {"to": "agent"}) == []
    kinds = ["retry_scheduled", "gave_up", "breaker", "effect_reconciled", "effect_replayed"]
    named = {name for kind in kinds for name, _ in _points(kind, {"failure_class": "unknown"})}
    assert named | {"resilience.tool.attempts", "resilience.recovery.llm_calls"} == set(COUNTERS)
