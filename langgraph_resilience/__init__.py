"""langgraph-resilience: classification-driven recovery for LangGraph tool-calling agents.

Add it to an existing graph::

    class State(MessagesState, ResilienceState): ...

    builder = StateGraph(State)
    builder.add_node("agent", call_model)
    builder.add_edge(START, "agent")
    add_resilience(builder, agent="agent", tools=[search], policy=ResiliencePolicy())
    app = builder.compile(checkpointer=checkpointer)
"""

from langgraph_resilience.canonical import DEFAULT_NOISE_FIELDS, call_key, canonical_args
from langgraph_resilience.classify import (
    DEFAULT_RULES,
    Rule,
    Verdict,
    classify,
    http_status,
    retriable,
    retry_after_ms,
)
from langgraph_resilience.clock import Clock, SystemClock
from langgraph_resilience.errors import (
    CircuitOpenError,
    ConfigurationError,
    FailureClass,
    LoopDetectedError,
    ResilienceError,
    RetryExhaustedError,
    ToolError,
    ToolFailure,
)
from langgraph_resilience.events import EVENT_KEY, Event
from langgraph_resilience.policy import ResiliencePolicy
from langgraph_resilience.profile import ToolProfile
from langgraph_resilience.redaction import redact
from langgraph_resilience.retry import backoff_delay
from langgraph_resilience.router import Decision, decide, next_step, route_after_agent
from langgraph_resilience.state import Ledger, ResilienceLedger, ResilienceState, merge_ledger
from langgraph_resilience.tools import GuardedToolNode, tool_error_of
from langgraph_resilience.wiring import add_resilience

__all__ = [
    "DEFAULT_NOISE_FIELDS",
    "DEFAULT_RULES",
    "EVENT_KEY",
    "CircuitOpenError",
    "Clock",
    "ConfigurationError",
    "Decision",
    "Event",
    "FailureClass",
    "GuardedToolNode",
    "Ledger",
    "LoopDetectedError",
    "ResilienceError",
    "ResilienceLedger",
    "ResiliencePolicy",
    "ResilienceState",
    "RetryExhaustedError",
    "Rule",
    "SystemClock",
    "ToolError",
    "ToolFailure",
    "ToolProfile",
    "Verdict",
    "add_resilience",
    "backoff_delay",
    "call_key",
    "canonical_args",
    "classify",
    "decide",
    "http_status",
    "merge_ledger",
    "redact",
    "retriable",
    "retry_after_ms",
    "next_step",
    "route_after_agent",
    "tool_error_of",
]
