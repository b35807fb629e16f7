"""langgraph-resilience: classification-driven recovery for LangGraph tool-calling agents.

Add it to an existing graph::

    class State(MessagesState, ResilienceState): ...

    builder = StateGraph(State)
    builder.add_node("agent", call_model)
    builder.add_edge(START, "agent")
    add_resilience(builder, agent="agent", tools=[search], policy=ResiliencePolicy())
    app = builder.compile(checkpointer=checkpointer)
"""

from langgraph_resilience.core.backoff import backoff_delay
from langgraph_resilience.core.breaker import BreakerConfig, BreakerStore
from langgraph_resilience.core.budget import RetryBudget
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
from langgraph_resilience.core.compensation import acompensate_thread, compensate_thread
from langgraph_resilience.core.decide import Decision, decide
from langgraph_resilience.core.effects import (
    EffectStatus,
    IdempotencyStore,
    SagaLog,
    idempotency_key,
)
from langgraph_resilience.core.partial import FailedItem, PartialResult
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
    LoopDetectedError,
    OutputValidationError,
    ResilienceError,
    ResilienceWarning,
    RetryExhaustedError,
    ThreadLockLostError,
    ToolError,
    ToolFailure,
    ToolGoneError,
)
from langgraph_resilience.events import (
    EVENT_KEY,
    Event,
)
from langgraph_resilience.graph.bulkhead import Bulkhead, BulkheadFullError
from langgraph_resilience.graph.escalate import (
    ESCALATION_TYPE,
    EscalateNode,
    Resolution,
)
from langgraph_resilience.graph.model import (
    resilient_model,
)
from langgraph_resilience.graph.node import ResilienceNode
from langgraph_resilience.graph.pending import AnswerPendingNode
from langgraph_resilience.graph.planner import PlanExecutorNode, PlannerNode, route_after_executor
from langgraph_resilience.graph.repair import RepairNode
from langgraph_resilience.graph.retry import RetryNode
from langgraph_resilience.graph.router import next_step, route_after_agent
from langgraph_resilience.graph.state import (
    Ledger,
    ResilienceLedger,
    ResilienceState,
    merge_ledger,
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
from langgraph_resilience.stores.budgets import InMemoryRetryBudgetStore, PostgresRetryBudgetStore
from langgraph_resilience.stores.memory import InMemoryIdempotencyStore
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
from langgraph_resilience.stores.saga import InMemorySagaLog
from langgraph_resilience.stores.sqlite import SqliteIdempotencyStore, SqliteSagaLog

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
    "LoopDetectedError",
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
    "RepairNode",
    "ResilienceError",
    "ResilienceLedger",
    "ResilienceNode",
    "ResiliencePolicy",
    "ResilienceState",
    "ResilienceWarning",
    "Resolution",
    "RetryBudget",
    "RetryExhaustedError",
    "RetryNode",
    "Rule",
    "SagaLog",
    "SqliteIdempotencyStore",
    "SqliteSagaLog",
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
    "aopen_postgres",
    "aresume",
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
    "task_failure",
    "thread_lock",
    "thread_status",
    "tool_error_of",
    "verify",
]
