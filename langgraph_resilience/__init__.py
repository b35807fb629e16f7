"""langgraph-resilience: classification-driven recovery for LangGraph tool-calling agents.

Add it to an existing graph::

    class State(MessagesState, ResilienceState): ...

    builder = StateGraph(State)
    builder.add_node("agent", call_model)
    add_resilience(builder, agent="agent", tools=[search], policy=ResiliencePolicy())
    app = builder.compile(checkpointer=checkpointer)

The public modules: this one (what an agent needs), `errors` (every exception),
`events` (what happened, as it happens), `stores` (state shared across processes),
`mcp` (MCP tools and servers), `planning` (verified DAG replanning), `core` (the pure
functions behind each decision), `telemetry` (OpenTelemetry) and `testing` (doubles).
Everything else is internal and may change without notice. Names are imported on
first use, so ``import langgraph_resilience`` loads no LangGraph, psycopg or stores.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from langgraph_resilience._lazy import lazy_exports as _lazy_exports

if TYPE_CHECKING:
    from langgraph_resilience._graph.escalate import (
        EscalateNode,
    )
    from langgraph_resilience._graph.middleware import (
        ResilienceMiddleware,
    )
    from langgraph_resilience._graph.model import (
        resilient_model,
    )
    from langgraph_resilience._graph.pending import (
        AnswerPendingNode,
    )
    from langgraph_resilience._graph.repair import (
        RepairNode,
    )
    from langgraph_resilience._graph.retry import (
        RetryNode,
    )
    from langgraph_resilience._graph.router import (
        next_step,
        route_after_agent,
    )
    from langgraph_resilience._graph.state import (
        ResilienceState,
    )
    from langgraph_resilience._graph.status_checks import (
        status_from,
    )
    from langgraph_resilience._graph.tools import (
        GuardedToolNode,
        current_idempotency_key,
        current_item_keys,
        tool_error_of,
    )
    from langgraph_resilience._graph.wiring import (
        add_resilience,
    )
    from langgraph_resilience.core.breaker import (
        BreakerConfig,
    )
    from langgraph_resilience.core.classification import (
        Rule,
    )
    from langgraph_resilience.core.partial import (
        PartialResult,
    )
    from langgraph_resilience.core.policy import (
        ResiliencePolicy,
    )
    from langgraph_resilience.core.profile import (
        ToolProfile,
    )
    from langgraph_resilience.errors import (
        ConfigurationError,
        FailureClass,
        ResilienceError,
        ResilienceWarning,
        ThreadBusyError,
        ToolError,
    )
    from langgraph_resilience.events import (
        EVENT_KEY,
    )
    from langgraph_resilience.stores.persistence import (
        aopen_postgres,
        open_postgres,
        open_sqlite,
    )
    from langgraph_resilience.stores.threads import (
        aresume,
        list_threads,
        resume,
        thread_status,
    )

_HOMES: dict[str, str] = {
    "BreakerConfig": "langgraph_resilience.core.breaker",
    "Rule": "langgraph_resilience.core.classification",
    "PartialResult": "langgraph_resilience.core.partial",
    "ResiliencePolicy": "langgraph_resilience.core.policy",
    "ToolProfile": "langgraph_resilience.core.profile",
    "ConfigurationError": "langgraph_resilience.errors",
    "FailureClass": "langgraph_resilience.errors",
    "ResilienceError": "langgraph_resilience.errors",
    "ResilienceWarning": "langgraph_resilience.errors",
    "ThreadBusyError": "langgraph_resilience.errors",
    "ToolError": "langgraph_resilience.errors",
    "EVENT_KEY": "langgraph_resilience.events",
    "EscalateNode": "langgraph_resilience._graph.escalate",
    "ResilienceMiddleware": "langgraph_resilience._graph.middleware",
    "resilient_model": "langgraph_resilience._graph.model",
    "AnswerPendingNode": "langgraph_resilience._graph.pending",
    "RepairNode": "langgraph_resilience._graph.repair",
    "RetryNode": "langgraph_resilience._graph.retry",
    "next_step": "langgraph_resilience._graph.router",
    "route_after_agent": "langgraph_resilience._graph.router",
    "ResilienceState": "langgraph_resilience._graph.state",
    "status_from": "langgraph_resilience._graph.status_checks",
    "GuardedToolNode": "langgraph_resilience._graph.tools",
    "current_idempotency_key": "langgraph_resilience._graph.tools",
    "current_item_keys": "langgraph_resilience._graph.tools",
    "tool_error_of": "langgraph_resilience._graph.tools",
    "add_resilience": "langgraph_resilience._graph.wiring",
    "aopen_postgres": "langgraph_resilience.stores.persistence",
    "open_postgres": "langgraph_resilience.stores.persistence",
    "open_sqlite": "langgraph_resilience.stores.persistence",
    "aresume": "langgraph_resilience.stores.threads",
    "list_threads": "langgraph_resilience.stores.threads",
    "resume": "langgraph_resilience.stores.threads",
    "thread_status": "langgraph_resilience.stores.threads",
}
"""Where each public name lives: imported from there on first use."""

__all__ = [
    "EVENT_KEY",
    "AnswerPendingNode",
    "BreakerConfig",
    "ConfigurationError",
    "EscalateNode",
    "FailureClass",
    "GuardedToolNode",
    "PartialResult",
    "RepairNode",
    "ResilienceError",
    "ResilienceMiddleware",
    "ResiliencePolicy",
    "ResilienceState",
    "ResilienceWarning",
    "RetryNode",
    "Rule",
    "ThreadBusyError",
    "ToolError",
    "ToolProfile",
    "add_resilience",
    "aopen_postgres",
    "aresume",
    "current_idempotency_key",
    "current_item_keys",
    "list_threads",
    "next_step",
    "open_postgres",
    "open_sqlite",
    "resilient_model",
    "resume",
    "route_after_agent",
    "status_from",
    "thread_status",
    "tool_error_of",
]

__getattr__, __dir__ = _lazy_exports(__name__, _HOMES)
