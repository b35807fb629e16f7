"""State shared across processes and threads: breaker, retry-budget and side-effect
stores, the saga log, and thread maintenance (locks, stale intents, compensation).

The modules inside are internal; import from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from langgraph_resilience._lazy import lazy_exports as _lazy_exports

if TYPE_CHECKING:
    from langgraph_resilience.core.breaker import (
        BreakerStore,
    )
    from langgraph_resilience.core.budget import (
        RetryBudget,
    )
    from langgraph_resilience.core.compensation import (
        acompensate_thread,
        compensate_thread,
    )
    from langgraph_resilience.core.effects import (
        EffectStatus,
        IdempotencyStore,
        SagaLog,
        idempotency_key,
    )
    from langgraph_resilience.stores.breakers import (
        InMemoryBreakerStore,
    )
    from langgraph_resilience.stores.budgets import (
        InMemoryRetryBudgetStore,
        PostgresRetryBudgetStore,
    )
    from langgraph_resilience.stores.locks import (
        athread_lock,
        thread_lock,
    )
    from langgraph_resilience.stores.memory import (
        InMemoryIdempotencyStore,
    )
    from langgraph_resilience.stores.persistence import (
        Persistence,
    )
    from langgraph_resilience.stores.postgres_breakers import (
        AsyncPostgresBreakerStore,
        PostgresBreakerStore,
    )
    from langgraph_resilience.stores.postgres_ledger import (
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
    from langgraph_resilience.stores.threads import (
        ThreadStatus,
        athread_status,
    )

_HOMES: dict[str, str] = {
    "BreakerStore": "langgraph_resilience.core.breaker",
    "RetryBudget": "langgraph_resilience.core.budget",
    "acompensate_thread": "langgraph_resilience.core.compensation",
    "compensate_thread": "langgraph_resilience.core.compensation",
    "EffectStatus": "langgraph_resilience.core.effects",
    "IdempotencyStore": "langgraph_resilience.core.effects",
    "SagaLog": "langgraph_resilience.core.effects",
    "idempotency_key": "langgraph_resilience.core.effects",
    "InMemoryBreakerStore": "langgraph_resilience.stores.breakers",
    "InMemoryRetryBudgetStore": "langgraph_resilience.stores.budgets",
    "PostgresRetryBudgetStore": "langgraph_resilience.stores.budgets",
    "athread_lock": "langgraph_resilience.stores.locks",
    "thread_lock": "langgraph_resilience.stores.locks",
    "InMemoryIdempotencyStore": "langgraph_resilience.stores.memory",
    "Persistence": "langgraph_resilience.stores.persistence",
    "AsyncPostgresBreakerStore": "langgraph_resilience.stores.postgres_breakers",
    "PostgresBreakerStore": "langgraph_resilience.stores.postgres_breakers",
    "AsyncPostgresIdempotencyStore": "langgraph_resilience.stores.postgres_ledger",
    "AsyncPostgresSagaLog": "langgraph_resilience.stores.postgres_ledger",
    "PostgresIdempotencyStore": "langgraph_resilience.stores.postgres_ledger",
    "PostgresSagaLog": "langgraph_resilience.stores.postgres_ledger",
    "InMemorySagaLog": "langgraph_resilience.stores.saga",
    "SharedStores": "langgraph_resilience.stores.shared",
    "ashared_postgres": "langgraph_resilience.stores.shared",
    "shared_postgres": "langgraph_resilience.stores.shared",
    "SqliteIdempotencyStore": "langgraph_resilience.stores.sqlite",
    "SqliteSagaLog": "langgraph_resilience.stores.sqlite",
    "SettledIntent": "langgraph_resilience.stores.stale",
    "asettle_stale": "langgraph_resilience.stores.stale",
    "settle_stale": "langgraph_resilience.stores.stale",
    "ThreadStatus": "langgraph_resilience.stores.threads",
    "athread_status": "langgraph_resilience.stores.threads",
}
"""Where each public name lives: imported from there on first use."""

__all__ = [
    "AsyncPostgresBreakerStore",
    "AsyncPostgresIdempotencyStore",
    "AsyncPostgresSagaLog",
    "BreakerStore",
    "EffectStatus",
    "IdempotencyStore",
    "InMemoryBreakerStore",
    "InMemoryIdempotencyStore",
    "InMemoryRetryBudgetStore",
    "InMemorySagaLog",
    "Persistence",
    "PostgresBreakerStore",
    "PostgresIdempotencyStore",
    "PostgresRetryBudgetStore",
    "PostgresSagaLog",
    "RetryBudget",
    "SagaLog",
    "SettledIntent",
    "SharedStores",
    "SqliteIdempotencyStore",
    "SqliteSagaLog",
    "ThreadStatus",
    "acompensate_thread",
    "asettle_stale",
    "ashared_postgres",
    "athread_lock",
    "athread_status",
    "compensate_thread",
    "idempotency_key",
    "settle_stale",
    "shared_postgres",
    "thread_lock",
]

__getattr__, __dir__ = _lazy_exports(__name__, _HOMES)
