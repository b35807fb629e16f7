"""What stands between a tool call and its tool: breakers, bulkheads, budget, timeout.

`ToolGuards` holds a node's guard configuration and stores, and answers the
questions the call flow asks of them: may this call run (a breaker admission, as a
`core.flow` `Call`), how did it end (a record), may it retry (the retry budget), and
runs the tool in its bulkhead slot for at most its timeout. It decides nothing about
failures: that is `core.decision`'s, through `_graph.finish`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from langchain_core.messages import ToolCall
from langgraph.prebuilt.tool_node import ToolCallRequest

from langgraph_resilience._graph.answers import BreakerReport
from langgraph_resilience._graph.bulkhead import Bulkhead
from langgraph_resilience._graph.exactly_once import Effect, outcome_of
from langgraph_resilience._graph.in_flight import arun_with_timeout, run_with_timeout
from langgraph_resilience.core.breaker import BreakerConfig, BreakerStore
from langgraph_resilience.core.budget import RetryBudget
from langgraph_resilience.core.clock import Clock
from langgraph_resilience.core.flow import Call, Flow
from langgraph_resilience.core.policy import ResiliencePolicy
from langgraph_resilience.core.profile import ToolProfile
from langgraph_resilience.errors import CircuitOpenError, FailureClass, McpServerDownError
from langgraph_resilience.stores.breakers import InMemoryBreakerStore
from langgraph_resilience.stores.budgets import InMemoryRetryBudgetStore, PostgresRetryBudgetStore

__all__ = ["Admitted", "ToolGuards"]


@dataclasses.dataclass(frozen=True, slots=True)
class Admitted:
    """A call the breaker let through: what to report back once it is done."""

    key: str
    probe: bool
    started: float


class ToolGuards:
    """A tool node's breakers, bulkheads, retry budget and timeouts."""

    def __init__(
        self,
        *,
        policy: ResiliencePolicy,
        clock: Clock,
        profiles: Mapping[str, ToolProfile],
        breaker: BreakerConfig | None,
        breaker_store: BreakerStore | None,
        retry_budget: RetryBudget | None,
        retry_budget_store: InMemoryRetryBudgetStore | PostgresRetryBudgetStore | None,
        servers: Mapping[str, str] | None = None,
    ) -> None:
        self.policy, self.clock, self.profiles = policy, clock, profiles
        self.servers = dict(servers or {})
        """The MCP server of each MCP tool, by tool name (the node adds tools it learns)."""
        self.breaker = breaker
        self.counted = breaker.counted_classes if breaker is not None else frozenset()
        # `is None`, not `or`: a store may define __len__, and an empty one is falsy
        self.breaker_store: BreakerStore = (
            InMemoryBreakerStore() if breaker_store is None else breaker_store
        )
        self.retry_budget = retry_budget
        if retry_budget_store is None and retry_budget is not None:
            retry_budget_store = InMemoryRetryBudgetStore()
        self.retry_budget_store = retry_budget_store
        self.bulkheads = {
            name: Bulkhead(name, max_concurrent=p.max_concurrent, max_wait=p.max_wait)
            for name, p in profiles.items()
            if p.max_concurrent is not None
        }

    # ------------------------------------------------------------ breakers

    def breaker_key(self, tool: str) -> str:
        """The breaker a tool reports to: its profile's `breaker_key`, else its MCP
        server's (``mcp:<server>``: a dead server takes all its tools down at once),
        else its name."""
        profile = self.profiles.get(tool)
        if profile is not None and profile.breaker_key:
            return profile.breaker_key
        server = self.servers.get(tool)
        return f"mcp:{server}" if server else tool

    def server_tools(self, server: str) -> list[str]:
        """The tools an MCP server serves (and so takes down with it), sorted."""
        return sorted(name for name, s in self.servers.items() if s == server)

    def servers_down(self) -> dict[str, list[str]]:
        """The MCP servers whose breaker is open now, each with the tools it took down."""
        if self.breaker is None:
            return {}
        down: dict[str, list[str]] = {}
        for server in sorted(set(self.servers.values())):
            tools = self.server_tools(server)
            if tools and self.is_open(tools[0]):
                down[server] = tools
        return down

    def refusal(self, tool: str, retry_after: float, *, told: bool = False) -> CircuitOpenError:
        """The error of a call its breaker refused: an MCP server's names its tools
        (none once the agent was told of them, `told`)."""
        key, server = self.breaker_key(tool), self.servers.get(tool)
        if server is None:
            return CircuitOpenError(key, retry_after)
        return McpServerDownError(
            server, key, retry_after, [] if told else self.server_tools(server)
        )

    def breaker_states(self, tools: Sequence[str]) -> dict[str, str]:
        """Each tool's breaker status now (closed / open / half_open), for the planner."""
        if self.breaker is None:
            return {}
        now = self.clock.time()
        return {
            name: self.breaker_store.snapshot(self.breaker_key(name)).status_at(self.breaker, now)
            for name in tools
        }

    def is_open(self, tool: str) -> bool:
        """Whether `tool`'s breaker is open now (one store read, only for this tool)."""
        if self.breaker is None:
            return False
        snapshot = self.breaker_store.snapshot(self.breaker_key(tool))
        return snapshot.status_at(self.breaker, self.clock.time()) == "open"

    def admit(self, tool: str) -> Flow[Admitted | float | None]:
        """Ask the tool's breaker: an `Admitted` ticket, the seconds until it may be
        asked again when it refuses, or None when there is no breaker."""
        if self.breaker is None:
            return None
        key, store = self.breaker_key(tool), self.breaker_store
        admission = yield Call(
            store.acquire, store.aacquire, (key, self.breaker, self.clock.time())
        )
        if not admission.allowed:
            return float(admission.retry_after)
        return Admitted(key, admission.probe, self.clock.monotonic())

    def release(self, admitted: Admitted) -> Call:
        """Give back an admission whose call never reached the tool."""
        store, args = self.breaker_store, (admitted.key, self.breaker, self.clock.time())
        return Call(store.release, store.arelease, args, {"probe": admitted.probe})

    def record(self, key: str, outcome: FailureClass | None, probe: bool, duration: float) -> Call:
        """Tell a breaker how a call ended (None: it succeeded)."""
        store, args = self.breaker_store, (key, self.breaker, self.clock.time(), outcome)
        return Call(store.record, store.arecord, args, {"probe": probe, "duration": duration})

    def succeeded(self, admitted: Admitted) -> Call:
        """Report an admitted call that succeeded."""
        return self.record(
            admitted.key, None, admitted.probe, self.clock.monotonic() - admitted.started
        )

    def reports(self, reports: Sequence[BreakerReport]) -> Flow[None]:
        """Tell the breakers about the calls that left their tool failed in this step."""
        if self.breaker is None:
            return
        for report in reports:
            yield self.record(report.key, report.outcome, False, report.duration)

    # ------------------------------------------------------------ retry budget

    def deposit(self, tool: str, now: float) -> None:
        """A first attempt earns its breaker key's retry budget a token."""
        if self.retry_budget is not None and self.retry_budget_store is not None:
            self.retry_budget_store.deposit(self.breaker_key(tool), self.retry_budget, now)

    def withdraw(self, tool: str, now: float) -> bool:
        """Spend a token for a retry; False when the budget is exhausted."""
        if self.retry_budget is None or self.retry_budget_store is None:
            return True
        return self.retry_budget_store.try_withdraw(self.breaker_key(tool), self.retry_budget, now)

    # ------------------------------------------------------------ running the tool

    def timeout_for(self, tool: str) -> float | None:
        """The tool's profile timeout, else the policy's."""
        profile = self.profiles.get(tool)
        if profile is not None and profile.timeout_s is not None:
            return profile.timeout_s
        return self.policy.tool_timeout_s

    def timed(
        self, call: ToolCall, request: ToolCallRequest, execute: Any, effect: Effect | None
    ) -> Any:
        """Run the tool in its bulkhead slot, for at most its timeout."""
        bulkhead, timeout = self.bulkheads.get(call["name"]), self.timeout_for(call["name"])
        with bulkhead.slot() if bulkhead is not None else _NO_SLOT:
            if timeout is None:
                return execute(request)
            late = None if effect is None else _late(effect)
            return run_with_timeout(
                execute, request, timeout, key=effect.key if effect else None, on_late=late
            )

    async def atimed(
        self, call: ToolCall, request: ToolCallRequest, execute: Any, effect: Effect | None
    ) -> Any:
        """Async `timed` (a side effect past its timeout, or whose run is cancelled, is
        left to land, not cancelled, and its outcome recorded)."""
        bulkhead, timeout = self.bulkheads.get(call["name"]), self.timeout_for(call["name"])
        async with bulkhead.aslot() if bulkhead is not None else _NO_SLOT:
            if timeout is None and effect is None:
                return await execute(request)
            late = None if effect is None else _alate(effect)
            return await arun_with_timeout(
                execute, request, timeout, key=effect.key if effect else None, on_late=late
            )


class _NoSlot:
    """A bulkhead slot for tools without a bulkhead (sync and async)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *exc: object) -> None:
        return None


_NO_SLOT = _NoSlot()


def _late(effect: Effect) -> Callable[[Any], Any]:
    """Record an abandoned attempt's result when it lands after all."""
    store, key = effect.ledger.idempotency, effect.key
    return lambda result: store.record_outcome(key, outcome_of(result))


def _alate(effect: Effect) -> Callable[[Any], Awaitable[Any]]:
    """Async `_late`."""
    store, key = effect.ledger.idempotency, effect.key
    return lambda result: store.arecord_outcome(key, outcome_of(result))
