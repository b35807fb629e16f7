"""langgraph-resilience: classification-driven recovery for LangGraph tool-calling agents.

Add it to an existing graph::

    class State(MessagesState, ResilienceState): ...

    builder = StateGraph(State)
    builder.add_node("agent", call_model)
    add_resilience(builder, agent="agent", tools=[search], policy=ResiliencePolicy())
    app = builder.compile(checkpointer=checkpointer)

Names are imported on first use (PEP 562), so ``import langgraph_resilience`` and
``langgraph-resilience --help`` do not pay for LangGraph, psycopg and the stores
until a name that needs them is touched.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from langgraph_resilience.core.backoff import (
        backoff_delay,
    )
    from langgraph_resilience.core.breaker import (
        BreakerConfig,
        BreakerStore,
    )
    from langgraph_resilience.core.budget import (
        RetryBudget,
    )
    from langgraph_resilience.core.canonical import (
        DEFAULT_NOISE_FIELDS,
        call_key,
        canonical_args,
    )
    from langgraph_resilience.core.classify import (
        DEFAULT_RULES,
        Rule,
        Verdict,
        classify,
        http_status,
        retriable,
        retry_after_ms,
    )
    from langgraph_resilience.core.clock import (
        Clock,
        SystemClock,
    )
    from langgraph_resilience.core.compensation import (
        acompensate_thread,
        compensate_thread,
    )
    from langgraph_resilience.core.decide import (
        Decision,
        decide,
    )
    from langgraph_resilience.core.effects import (
        EffectStatus,
        IdempotencyStore,
        SagaLog,
        idempotency_key,
    )
    from langgraph_resilience.core.mcp import (
        Reconnect,
    )
    from langgraph_resilience.core.partial import (
        FailedItem,
        PartialResult,
    )
    from langgraph_resilience.core.plan import (
        Diagnosis,
        Plan,
        PlanStep,
        PlanVerdict,
        verify,
    )
    from langgraph_resilience.core.policy import (
        ResiliencePolicy,
    )
    from langgraph_resilience.core.profile import (
        ToolProfile,
    )
    from langgraph_resilience.core.redaction import (
        add_secret_pattern,
        redact,
    )
    from langgraph_resilience.core.reliability import (
        task_failure,
    )
    from langgraph_resilience.errors import (
        AttemptAbandoned,
        CircuitOpenError,
        ConfigurationError,
        FailureClass,
        LedgerUnavailableError,
        McpServerDownError,
        McpToolError,
        OutputValidationError,
        ResilienceError,
        ResilienceWarning,
        StepNotSavedError,
        ThreadLockLostError,
        ToolError,
        ToolFailure,
        ToolGoneError,
    )
    from langgraph_resilience.events import (
        EVENT_KEY,
        Event,
    )
    from langgraph_resilience.graph.bulkhead import (
        Bulkhead,
        BulkheadFullError,
    )
    from langgraph_resilience.graph.escalate import (
        ESCALATION_TYPE,
        EscalateNode,
        Resolution,
    )
    from langgraph_resilience.graph.mcp import (
        aload_mcp_tools,
        load_mcp_tools,
        mcp_server_tool,
    )
    from langgraph_resilience.graph.mcp_sessions import (
        McpSessions,
    )
    from langgraph_resilience.graph.middleware import (
        ResilienceAgentState,
        ResilienceMiddleware,
    )
    from langgraph_resilience.graph.model import (
        resilient_model,
    )
    from langgraph_resilience.graph.node import (
        ResilienceNode,
    )
    from langgraph_resilience.graph.pending import (
        AnswerPendingNode,
    )
    from langgraph_resilience.graph.planner import (
        PlanExecutorNode,
        PlannerNode,
        route_after_executor,
    )
    from langgraph_resilience.graph.repair import (
        RepairNode,
    )
    from langgraph_resilience.graph.retry import (
        RetryNode,
    )
    from langgraph_resilience.graph.router import (
        next_step,
        route_after_agent,
    )
    from langgraph_resilience.graph.state import (
        Ledger,
        ResilienceLedger,
        ResilienceState,
        merge_ledger,
    )
    from langgraph_resilience.graph.status_checks import (
        status_from,
    )
    from langgraph_resilience.graph.tools import (
        GuardedToolNode,
        OutcomeUnknownError,
        current_idempotency_key,
        current_item_keys,
        tool_error_of,
    )
    from langgraph_resilience.graph.wiring import (
        add_resilience,
    )
    from langgraph_resilience.stores.breakers import (
        AsyncPostgresBreakerStore,
        InMemoryBreakerStore,
        PostgresBreakerStore,
    )
    from langgraph_resilience.stores.budgets import (
        InMemoryRetryBudgetStore,
        PostgresRetryBudgetStore,
    )
    from langgraph_resilience.stores.memory import (
        InMemoryIdempotencyStore,
    )
    from langgraph_resilience.stores.persistence import (
        Persistence,
        PersistenceError,
        ThreadBusyError,
        ThreadNotFoundError,
        ThreadStatus,
        aopen_postgres,
        aresume,
        athread_lock,
        athread_status,
        list_threads,
        open_postgres,
        open_sqlite,
        resume,
        thread_lock,
        thread_status,
    )
    from langgraph_resilience.stores.postgres import (
        AsyncPostgresIdempotencyStore,
        AsyncPostgresSagaLog,
        PostgresIdempotencyStore,
        PostgresSagaLog,
    )
    from langgraph_resilience.stores.saga import (
        InMemorySagaLog,
    )
    from langgraph_resilience.stores.shared import (
        SharedStores,
        ashared_postgres,
        shared_postgres,
    )
    from langgraph_resilience.stores.sqlite import (
        SqliteIdempotencyStore,
        SqliteSagaLog,
    )
    from langgraph_resilience.stores.stale import (
        SettledIntent,
        asettle_stale,
        settle_stale,
    )

_HOMES: dict[str, str] = {
    "McpSessions": "langgraph_resilience.graph.mcp_sessions",
    "Reconnect": "langgraph_resilience.core.mcp",
    "aload_mcp_tools": "langgraph_resilience.graph.mcp",
    "load_mcp_tools": "langgraph_resilience.graph.mcp",
    "mcp_server_tool": "langgraph_resilience.graph.mcp",
    "backoff_delay": "langgraph_resilience.core.backoff",
    "BreakerConfig": "langgraph_resilience.core.breaker",
    "BreakerStore": "langgraph_resilience.core.breaker",
    "RetryBudget": "langgraph_resilience.core.budget",
    "DEFAULT_NOISE_FIELDS": "langgraph_resilience.core.canonical",
    "call_key": "langgraph_resilience.core.canonical",
    "canonical_args": "langgraph_resilience.core.canonical",
    "DEFAULT_RULES": "langgraph_resilience.core.classify",
    "Rule": "langgraph_resilience.core.classify",
    "Verdict": "langgraph_resilience.core.classify",
    "classify": "langgraph_resilience.core.classify",
    "http_status": "langgraph_resilience.core.classify",
    "retriable": "langgraph_resilience.core.classify",
    "retry_after_ms": "langgraph_resilience.core.classify",
    "Clock": "langgraph_resilience.core.clock",
    "SystemClock": "langgraph_resilience.core.clock",
    "acompensate_thread": "langgraph_resilience.core.compensation",
    "compensate_thread": "langgraph_resilience.core.compensation",
    "Decision": "langgraph_resilience.core.decide",
    "decide": "langgraph_resilience.core.decide",
    "EffectStatus": "langgraph_resilience.core.effects",
    "IdempotencyStore": "langgraph_resilience.core.effects",
    "SagaLog": "langgraph_resilience.core.effects",
    "idempotency_key": "langgraph_resilience.core.effects",
    "FailedItem": "langgraph_resilience.core.partial",
    "PartialResult": "langgraph_resilience.core.partial",
    "Diagnosis": "langgraph_resilience.core.plan",
    "Plan": "langgraph_resilience.core.plan",
    "PlanStep": "langgraph_resilience.core.plan",
    "PlanVerdict": "langgraph_resilience.core.plan",
    "verify": "langgraph_resilience.core.plan",
    "ResiliencePolicy": "langgraph_resilience.core.policy",
    "ToolProfile": "langgraph_resilience.core.profile",
    "add_secret_pattern": "langgraph_resilience.core.redaction",
    "redact": "langgraph_resilience.core.redaction",
    "task_failure": "langgraph_resilience.core.reliability",
    "AttemptAbandoned": "langgraph_resilience.errors",
    "CircuitOpenError": "langgraph_resilience.errors",
    "ConfigurationError": "langgraph_resilience.errors",
    "FailureClass": "langgraph_resilience.errors",
    "LedgerUnavailableError": "langgraph_resilience.errors",
    "OutputValidationError": "langgraph_resilience.errors",
    "ResilienceError": "langgraph_resilience.errors",
    "ResilienceWarning": "langgraph_resilience.errors",
    "StepNotSavedError": "langgraph_resilience.errors",
    "ThreadLockLostError": "langgraph_resilience.errors",
    "ToolError": "langgraph_resilience.errors",
    "ToolFailure": "langgraph_resilience.errors",
    "ToolGoneError": "langgraph_resilience.errors",
    "McpServerDownError": "langgraph_resilience.errors",
    "McpToolError": "langgraph_resilience.errors",
    "EVENT_KEY": "langgraph_resilience.events",
    "Event": "langgraph_resilience.events",
    "Bulkhead": "langgraph_resilience.graph.bulkhead",
    "BulkheadFullError": "langgraph_resilience.graph.bulkhead",
    "ESCALATION_TYPE": "langgraph_resilience.graph.escalate",
    "EscalateNode": "langgraph_resilience.graph.escalate",
    "Resolution": "langgraph_resilience.graph.escalate",
    "ResilienceAgentState": "langgraph_resilience.graph.middleware",
    "ResilienceMiddleware": "langgraph_resilience.graph.middleware",
    "resilient_model": "langgraph_resilience.graph.model",
    "ResilienceNode": "langgraph_resilience.graph.node",
    "AnswerPendingNode": "langgraph_resilience.graph.pending",
    "PlanExecutorNode": "langgraph_resilience.graph.planner",
    "PlannerNode": "langgraph_resilience.graph.planner",
    "route_after_executor": "langgraph_resilience.graph.planner",
    "RepairNode": "langgraph_resilience.graph.repair",
    "RetryNode": "langgraph_resilience.graph.retry",
    "status_from": "langgraph_resilience.graph.status_checks",
    "next_step": "langgraph_resilience.graph.router",
    "route_after_agent": "langgraph_resilience.graph.router",
    "Ledger": "langgraph_resilience.graph.state",
    "ResilienceLedger": "langgraph_resilience.graph.state",
    "ResilienceState": "langgraph_resilience.graph.state",
    "merge_ledger": "langgraph_resilience.graph.state",
    "GuardedToolNode": "langgraph_resilience.graph.tools",
    "OutcomeUnknownError": "langgraph_resilience.graph.tools",
    "current_idempotency_key": "langgraph_resilience.graph.tools",
    "current_item_keys": "langgraph_resilience.graph.tools",
    "tool_error_of": "langgraph_resilience.graph.tools",
    "add_resilience": "langgraph_resilience.graph.wiring",
    "AsyncPostgresBreakerStore": "langgraph_resilience.stores.breakers",
    "InMemoryBreakerStore": "langgraph_resilience.stores.breakers",
    "PostgresBreakerStore": "langgraph_resilience.stores.breakers",
    "InMemoryRetryBudgetStore": "langgraph_resilience.stores.budgets",
    "PostgresRetryBudgetStore": "langgraph_resilience.stores.budgets",
    "InMemoryIdempotencyStore": "langgraph_resilience.stores.memory",
    "Persistence": "langgraph_resilience.stores.persistence",
    "PersistenceError": "langgraph_resilience.stores.persistence",
    "ThreadBusyError": "langgraph_resilience.stores.persistence",
    "ThreadNotFoundError": "langgraph_resilience.stores.persistence",
    "ThreadStatus": "langgraph_resilience.stores.persistence",
    "aopen_postgres": "langgraph_resilience.stores.persistence",
    "aresume": "langgraph_resilience.stores.persistence",
    "athread_lock": "langgraph_resilience.stores.persistence",
    "athread_status": "langgraph_resilience.stores.persistence",
    "list_threads": "langgraph_resilience.stores.persistence",
    "open_postgres": "langgraph_resilience.stores.persistence",
    "open_sqlite": "langgraph_resilience.stores.persistence",
    "resume": "langgraph_resilience.stores.persistence",
    "thread_lock": "langgraph_resilience.stores.persistence",
    "thread_status": "langgraph_resilience.stores.persistence",
    "SharedStores": "langgraph_resilience.stores.shared",
    "ashared_postgres": "langgraph_resilience.stores.shared",
    "shared_postgres": "langgraph_resilience.stores.shared",
    "SettledIntent": "langgraph_resilience.stores.stale",
    "asettle_stale": "langgraph_resilience.stores.stale",
    "settle_stale": "langgraph_resilience.stores.stale",
    "AsyncPostgresIdempotencyStore": "langgraph_resilience.stores.postgres",
    "AsyncPostgresSagaLog": "langgraph_resilience.stores.postgres",
    "PostgresIdempotencyStore": "langgraph_resilience.stores.postgres",
    "PostgresSagaLog": "langgraph_resilience.stores.postgres",
    "InMemorySagaLog": "langgraph_resilience.stores.saga",
    "SqliteIdempotencyStore": "langgraph_resilience.stores.sqlite",
    "SqliteSagaLog": "langgraph_resilience.stores.sqlite",
}
"""Where each public name lives: imported from there on first use."""

__all__ = [
    "DEFAULT_NOISE_FIELDS",
    "DEFAULT_RULES",
    "ESCALATION_TYPE",
    "EVENT_KEY",
    "AnswerPendingNode",
    "AsyncPostgresBreakerStore",
    "AsyncPostgresIdempotencyStore",
    "AsyncPostgresSagaLog",
    "AttemptAbandoned",
    "BreakerConfig",
    "BreakerStore",
    "Bulkhead",
    "BulkheadFullError",
    "CircuitOpenError",
    "Clock",
    "ConfigurationError",
    "Decision",
    "Diagnosis",
    "EffectStatus",
    "EscalateNode",
    "Event",
    "FailedItem",
    "FailureClass",
    "GuardedToolNode",
    "IdempotencyStore",
    "InMemoryBreakerStore",
    "InMemoryIdempotencyStore",
    "InMemoryRetryBudgetStore",
    "InMemorySagaLog",
    "Ledger",
    "LedgerUnavailableError",
    "McpServerDownError",
    "McpSessions",
    "McpToolError",
    "OutcomeUnknownError",
    "OutputValidationError",
    "PartialResult",
    "Persistence",
    "PersistenceError",
    "Plan",
    "PlanExecutorNode",
    "PlanStep",
    "PlanVerdict",
    "PlannerNode",
    "PostgresBreakerStore",
    "PostgresIdempotencyStore",
    "PostgresRetryBudgetStore",
    "PostgresSagaLog",
    "Reconnect",
    "RepairNode",
    "ResilienceAgentState",
    "ResilienceError",
    "ResilienceLedger",
    "ResilienceMiddleware",
    "ResilienceNode",
    "ResiliencePolicy",
    "ResilienceState",
    "ResilienceWarning",
    "Resolution",
    "RetryBudget",
    "RetryNode",
    "Rule",
    "SagaLog",
    "SettledIntent",
    "SharedStores",
    "SqliteIdempotencyStore",
    "SqliteSagaLog",
    "StepNotSavedError",
    "SystemClock",
    "ThreadBusyError",
    "ThreadLockLostError",
    "ThreadNotFoundError",
    "ThreadStatus",
    "ToolError",
    "ToolFailure",
    "ToolGoneError",
    "ToolProfile",
    "Verdict",
    "acompensate_thread",
    "add_resilience",
    "add_secret_pattern",
    "aload_mcp_tools",
    "aopen_postgres",
    "aresume",
    "asettle_stale",
    "ashared_postgres",
    "athread_lock",
    "athread_status",
    "backoff_delay",
    "call_key",
    "canonical_args",
    "classify",
    "compensate_thread",
    "current_idempotency_key",
    "current_item_keys",
    "decide",
    "http_status",
    "idempotency_key",
    "list_threads",
    "load_mcp_tools",
    "mcp_server_tool",
    "merge_ledger",
    "next_step",
    "open_postgres",
    "open_sqlite",
    "redact",
    "resilient_model",
    "resume",
    "retriable",
    "retry_after_ms",
    "route_after_agent",
    "route_after_executor",
    "settle_stale",
    "shared_postgres",
    "status_from",
    "task_failure",
    "thread_lock",
    "thread_status",
    "tool_error_of",
    "verify",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # the next access is a plain module attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
