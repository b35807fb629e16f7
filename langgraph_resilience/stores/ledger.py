"""Transition shim: the ledger moved (issue 17). Import from the new homes:

- keys, records, claims, the `IdempotencyStore` / `SagaLog` protocols:
  `langgraph_resilience.core.effects`;
- partial results: `langgraph_resilience.core.partial`;
- saga compensation: `langgraph_resilience.core.compensation`;
- the stores: `langgraph_resilience.stores.memory`, `langgraph_resilience.stores.postgres`,
  `langgraph_resilience.stores.sqlite` (their shared SQL logic: `langgraph_resilience.stores.sql`).

Every name this module had is re-exported here until the callers have moved; then
this file is deleted.
"""

from langgraph_resilience.core.compensation import (
    CompensationReport,
    CompensationStep,
    acompensate_thread,
    compensate_thread,
)
from langgraph_resilience.core.effects import (
    DEFAULT_RETENTION,
    Claim,
    ClaimAction,
    ClaimState,
    EffectStatus,
    IdempotencyRecord,
    IdempotencyStore,
    SagaEntry,
    SagaLog,
    claim_action,
    compensation_key,
    effect_fingerprint,
    idempotency_key,
    item_idempotency_key,
    summarize_records,
)
from langgraph_resilience.core.partial import (
    FailedItem,
    PartialResult,
    RedoItem,
    as_partial_result,
    failed_items,
)
from langgraph_resilience.stores.memory import InMemoryIdempotencyStore
from langgraph_resilience.stores.postgres import (
    AsyncPostgresIdempotencyStore,
    AsyncPostgresSagaLog,
    PostgresIdempotencyStore,
    PostgresSagaLog,
)
from langgraph_resilience.stores.saga import InMemorySagaLog
from langgraph_resilience.stores.sqlite import SqliteIdempotencyStore, SqliteSagaLog

__all__ = [
    "DEFAULT_RETENTION",
    "AsyncPostgresIdempotencyStore",
    "AsyncPostgresSagaLog",
    "Claim",
    "ClaimAction",
    "ClaimState",
    "CompensationReport",
    "CompensationStep",
    "EffectStatus",
    "FailedItem",
    "IdempotencyRecord",
    "IdempotencyStore",
    "InMemoryIdempotencyStore",
    "InMemorySagaLog",
    "PartialResult",
    "PostgresIdempotencyStore",
    "PostgresSagaLog",
    "RedoItem",
    "SagaEntry",
    "SagaLog",
    "SqliteIdempotencyStore",
    "SqliteSagaLog",
    "acompensate_thread",
    "as_partial_result",
    "claim_action",
    "compensate_thread",
    "compensation_key",
    "effect_fingerprint",
    "failed_items",
    "idempotency_key",
    "item_idempotency_key",
    "summarize_records",
]
