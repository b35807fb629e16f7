"""Retry-budget stores: the token buckets of `langgraph_resilience.core.budget`, per key,
in this process or shared through PostgreSQL (each step atomic)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from langgraph_resilience.core.budget import (
    FULL,
    RetryBudget,
    RetryBudgetState,
    budget_deposit,
    budget_withdraw,
    refilled,
)
from langgraph_resilience.stores.memory import DEFAULT_MAX_ENTRIES, check_max_entries, evict_lru

if TYPE_CHECKING:
    import psycopg
    from psycopg_pool import ConnectionPool

__all__ = ["InMemoryRetryBudgetStore", "PostgresRetryBudgetStore"]

T = TypeVar("T")


class InMemoryRetryBudgetStore:
    """Retry budgets of one process, thread-safe; each method is one pure step under a lock.

    Integration: `deposit` on every first execution of a tool call, and
    `try_withdraw` before scheduling a TRANSIENT retry; False means "do not
    retry" (report the budget as exhausted).

    It holds at most `max_entries` keys (`DEFAULT_MAX_ENTRIES`; None: no bound).
    When a new key exceeds it, buckets are forgotten down to a tenth below it: the
    least recently used ones that have refilled to full first (a full bucket is
    what an unknown key gets: nothing is lost), then the least recently used ones
    (each starts full again: at most `max_tokens` more retries for that key).

    >>> budgets = InMemoryRetryBudgetStore()
    >>> budgets.try_withdraw("search", RetryBudget(), now=0.0)
    True
    """

    def __init__(self, *, max_entries: int | None = DEFAULT_MAX_ENTRIES) -> None:
        self._states: OrderedDict[str, tuple[RetryBudgetState, RetryBudget]] = OrderedDict()
        """Each key's bucket and the budget it was last used with, least recently used first."""
        self._lock = threading.Lock()
        self.max_entries = check_max_entries(max_entries)

    def __len__(self) -> int:
        """The buckets held."""
        with self._lock:
            return len(self._states)

    def _get(self, key: str) -> RetryBudgetState:
        held = self._states.get(key)
        return FULL if held is None else held[0]

    def _store(self, key: str, state: RetryBudgetState, cfg: RetryBudget, now: float) -> None:
        states = self._states
        new = key not in states
        states[key] = (state, cfg)
        states.move_to_end(key)
        limit = self.max_entries
        if new and limit is not None and len(states) > limit:
            rules = (
                lambda held: refilled(held[0], held[1], now) >= held[1].max_tokens,
                lambda _: True,
            )
            evict_lru(states, limit, key, rules)

    def deposit(self, key: str, cfg: RetryBudget, now: float) -> None:
        """A first attempt was made."""
        with self._lock:
            self._store(key, budget_deposit(self._get(key), cfg, now), cfg, now)

    def try_withdraw(self, key: str, cfg: RetryBudget, now: float) -> bool:
        """May one retry be made now? Takes the token when it may."""
        with self._lock:
            granted, state = budget_withdraw(self._get(key), cfg, now)
            self._store(key, state, cfg, now)
        return granted

    def snapshot(self, key: str) -> RetryBudgetState:
        """The stored state (a full bucket for an unknown key)."""
        with self._lock:
            return self._get(key)

    async def adeposit(self, key: str, cfg: RetryBudget, now: float) -> None:
        """Async `deposit`."""
        self.deposit(key, cfg, now)

    async def atry_withdraw(self, key: str, cfg: RetryBudget, now: float) -> bool:
        """Async `try_withdraw`."""
        return self.try_withdraw(key, cfg, now)


class PostgresRetryBudgetStore:
    """Retry budgets shared by every process using one PostgreSQL table.

    Same connection rules and `setup()` as `PostgresBreakerStore`; every
    `deposit` and `try_withdraw` is one locked transaction (two round trips),
    so concurrent workers never spend a token twice. The async methods run the
    statements in a worker thread.

    >>> budgets = PostgresRetryBudgetStore(pool)  # doctest: +SKIP
    >>> budgets.setup()  # doctest: +SKIP
    """

    def __init__(
        self,
        conn: psycopg.Connection[Any] | ConnectionPool[Any],
        *,
        table: str = "lgr_retry_budgets",
    ) -> None:
        # Imported here: a graph with in-memory budgets never loads psycopg.
        from langgraph_resilience.stores.postgres import JsonTable, Postgres  # noqa: PLC0415

        pg = Postgres(
            conn,
            owner=type(self).__name__,
            is_async=False,
            twin="a sync pool all the same (its async methods run in a worker thread)",
        )
        self._table = JsonTable(pg, table, FULL.to_json())
        self.table = table

    def setup(self) -> None:
        """Create the table if it does not exist. Run once, at deployment or start-up."""
        self._table.setup()

    @staticmethod
    def _apply(
        change: Callable[[RetryBudgetState], tuple[T, RetryBudgetState]],
    ) -> Callable[[Any], tuple[T, dict[str, Any] | None]]:
        def apply(raw: Any) -> tuple[T, dict[str, Any] | None]:
            result, new = change(RetryBudgetState.from_json(raw))
            return result, new.to_json()

        return apply

    def deposit(self, key: str, cfg: RetryBudget, now: float) -> None:
        """A first attempt was made."""
        self._table.change(key, self._apply(lambda state: (None, budget_deposit(state, cfg, now))))

    def try_withdraw(self, key: str, cfg: RetryBudget, now: float) -> bool:
        """May one retry be made now? Takes the token when it may."""
        return self._table.change(key, self._apply(lambda state: budget_withdraw(state, cfg, now)))

    def snapshot(self, key: str) -> RetryBudgetState:
        """The stored state (a full bucket for an unknown key)."""
        return RetryBudgetState.from_json(self._table.read(key))

    async def adeposit(self, key: str, cfg: RetryBudget, now: float) -> None:
        """Async `deposit` (in a worker thread)."""
        change = self._apply(lambda state: (None, budget_deposit(state, cfg, now)))
        await self._table.achange(key, change)

    async def atry_withdraw(self, key: str, cfg: RetryBudget, now: float) -> bool:
        """Async `try_withdraw` (in a worker thread)."""
        return await self._table.achange(key, self._apply(lambda s: budget_withdraw(s, cfg, now)))
