"""Guarded tool execution: LangGraph's `ToolNode`, with every failure classified.

`GuardedToolNode` composes a real `ToolNode` (so tool-argument injection,
`InjectedState`, `ToolRuntime`, `Command` returns and parallel calls behave
exactly as in LangGraph) and intercepts each call through ToolNode's public
``wrap_tool_call`` hook (`_graph.tool_call`: breakers, timeout, exactly-once, one
classification). Which calls run is `_graph.tool_batch`'s choice; what becomes of
them, `_graph.finish`'s. The step is one `core.flow` flow (``_step``: a short
backoff is retried inside it, `_graph.inline_retry`), driven by ``run`` and ``arun``.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.prebuilt import ToolNode
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

from langgraph_resilience._graph.answers import error_message, tool_error_of
from langgraph_resilience._graph.exactly_once import (
    OutcomeUnknownError,
    current_idempotency_key,
    current_item_keys,
)
from langgraph_resilience._graph.finish import finish_step
from langgraph_resilience._graph.inline_retry import retried_in_step
from langgraph_resilience._graph.mcp import servers_of
from langgraph_resilience._graph.node import ResilienceNode
from langgraph_resilience._graph.run_lease import RUN_LEASES, current_run
from langgraph_resilience._graph.scope import in_step, step_ledger
from langgraph_resilience._graph.tool_batch import Batch, ToolSettings, plan_batch, step_input
from langgraph_resilience._graph.tool_call import Answer, CallInterceptor
from langgraph_resilience._graph.tool_guards import ToolGuards
from langgraph_resilience.core.breaker import BreakerConfig, BreakerStore
from langgraph_resilience.core.budget import RetryBudget
from langgraph_resilience.core.classification import DEFAULT_RULES, Rule
from langgraph_resilience.core.clock import Clock, SystemClock
from langgraph_resilience.core.compensation import (
    CompensationReport,
    acompensate_thread,
    compensate_thread,
)
from langgraph_resilience.core.effects import IdempotencyStore, SagaLog
from langgraph_resilience.core.flow import Call, Flow, adrive, drive
from langgraph_resilience.core.policy import ResiliencePolicy
from langgraph_resilience.core.profile import ToolProfile
from langgraph_resilience.errors import ConfigurationError
from langgraph_resilience.stores.budgets import InMemoryRetryBudgetStore, PostgresRetryBudgetStore
from langgraph_resilience.stores.effect_ledger import LedgerResolver

__all__ = [
    "DEFAULT_BREAKER",
    "GuardedToolNode",
    "OutcomeUnknownError",
    "current_idempotency_key",
    "current_item_keys",
    "error_message",
    "tool_error_of",
]


DEFAULT_BREAKER = BreakerConfig()
"""The breaker every tool gets unless told otherwise (`add_resilience`'s default too)."""


class GuardedToolNode(ResilienceNode):
    """Executes the latest `AIMessage`'s tool calls with classification and budgets.

    Use it through `add_resilience`, which also wires the router, the retry node and
    the recovery nodes; or wire it by hand like LangGraph's `ToolNode`: the node
    alone classifies, records and answers. It retries a call whose backoff is short
    (``policy.inline_retry_max_wait``) itself, sleeping on its clock inside the step;
    a longer wait is left scheduled for the retry node. Its defaults are
    `add_resilience`'s: `ResiliencePolicy()`, the system clock, `DEFAULT_BREAKER`
    per tool (``breaker=None`` turns breakers off), and a ledger for side effects
    that follows the graph's checkpointer.

    >>> node = GuardedToolNode([search])  # doctest: +SKIP
    >>> builder.add_node("tools", node)  # doctest: +SKIP
    >>> builder.add_conditional_edges("tools", next_step, {...})  # doctest: +SKIP
    """

    def __init__(
        self,
        tools: Sequence[BaseTool | Callable[..., Any]],
        *,
        policy: ResiliencePolicy | None = None,
        clock: Clock | None = None,
        profiles: Mapping[str, ToolProfile] | None = None,
        rules: Sequence[Rule] = (),
        rng: random.Random | None = None,
        messages_key: str = "messages",
        can_repair: bool = False,
        can_replan: bool = False,
        can_escalate: bool = False,
        breaker: BreakerConfig | None = DEFAULT_BREAKER,
        breaker_store: BreakerStore | None = None,
        retry_budget: RetryBudget | None = None,
        retry_budget_store: InMemoryRetryBudgetStore | PostgresRetryBudgetStore | None = None,
        idempotency: IdempotencyStore | None = None,
        saga: SagaLog | None = None,
    ) -> None:
        self.policy = policy or ResiliencePolicy()
        self.clock = clock or SystemClock()
        self.profiles = dict(profiles or {})
        self.rules = (*rules, *DEFAULT_RULES)
        """Your rules, tried before the built-in table (as everywhere in the package)."""
        self.messages_key = messages_key
        self.guards = ToolGuards(
            policy=self.policy,
            clock=self.clock,
            profiles=self.profiles,
            breaker=breaker,
            breaker_store=breaker_store,
            retry_budget=retry_budget,
            retry_budget_store=retry_budget_store,
        )
        """Breakers, bulkheads, retry budget and timeouts of this node's tools."""
        self.idempotency = idempotency
        """The ledger passed to add_resilience, if any (else: see `effect_ledger`)."""
        self.saga = saga
        effects = any(p.side_effect for p in self.profiles.values())
        self.has_side_effects = effects
        self._ledgers = LedgerResolver(idempotency=idempotency, saga=saga, needed=effects)
        self._tool_node = ToolNode(
            list(tools),
            handle_tool_errors=False,
            messages_key=messages_key,
            wrap_tool_call=self.wrap_tool_call,
            awrap_tool_call=self.awrap_tool_call,
        )
        self.guards.servers.update(servers_of(self.tools_by_name.values(), self.profiles))
        _check_batch_args(self.profiles, self.tools_by_name)
        self.settings = self._settings(rng, can_repair, can_replan, can_escalate)
        """What the step's planning and finish read (`tool_batch`, `finish`)."""
        self.calls = CallInterceptor(
            tools=self.tools_by_name,
            profiles=self.profiles,
            guards=self.guards,
            policy=self.policy,
            rules=self.rules,
            clock=self.clock,
            rng=self.settings.rng,
            messages_key=messages_key,
        )
        """Each call's interception (`_graph.tool_call`)."""

    def _settings(
        self, rng: random.Random | None, can_repair: bool, can_replan: bool, can_escalate: bool
    ) -> ToolSettings:
        return ToolSettings(
            policy=self.policy,
            profiles=self.profiles,
            rules=self.rules,
            tools=self.tools_by_name,
            clock=self.clock,
            rng=rng or random.Random(),
            messages_key=self.messages_key,
            can_repair=can_repair,
            can_replan=can_replan,
            can_escalate=can_escalate,
            breaker_open=self.guards.is_open,
            deposit=self.guards.deposit,
            withdraw=self.guards.withdraw,
            server_of=self.guards.servers.get,
        )

    @property
    def leases_thread(self) -> bool:  # type: ignore[override]
        """A run takes its thread's lease only when a tool has side effects."""
        return self.has_side_effects

    @property
    def tools_by_name(self) -> dict[str, BaseTool]:
        """The tools this node executes, by name."""
        return self._tool_node.tools_by_name

    def learn(self, tools: Sequence[BaseTool]) -> None:
        """Know more tools (fallbacks, coercion, the unknown-tool check): the middleware
        meets an agent's tools only as its requests name them."""
        for tool in tools:
            if tool.name not in self.tools_by_name:
                self.tools_by_name[tool.name] = tool
        self.guards.servers.update(servers_of(tools, {}))

    def breaker_states(self) -> dict[str, str]:
        """Each tool's breaker status now (closed / open / half_open), for the planner."""
        return self.guards.breaker_states(list(self.tools_by_name))

    def servers_down(self) -> dict[str, list[str]]:
        """The MCP servers declared down (breaker open) now, with the tools each took
        down: ``{"weather": ["forecast", "lookup"]}``."""
        return self.guards.servers_down()

    @property
    def ledgers(self) -> LedgerResolver:
        """Chooses the side-effect ledger of a run (from its checkpointer)."""
        return self._ledgers

    def wrap_tool_call(
        self, request: ToolCallRequest, execute: Callable[[ToolCallRequest], Answer]
    ) -> Answer:
        """ToolNode's ``wrap_tool_call``: the call's interception (`_graph.tool_call`)."""
        return self.calls.wrap_tool_call(request, execute)

    async def awrap_tool_call(
        self, request: ToolCallRequest, execute: Callable[[ToolCallRequest], Awaitable[Answer]]
    ) -> Answer:
        """Async `wrap_tool_call`."""
        return await self.calls.awrap_tool_call(request, execute)

    # ------------------------------------------------------------ compensation

    def compensate_thread(
        self, thread_id: str, config: RunnableConfig
    ) -> CompensationReport | None:
        """Undo the thread's recorded side effects, newest first, exactly once each."""
        compensators = {n: p.compensate for n, p in self.profiles.items() if p.compensate}
        ledger = self._ledgers.resolve(config) if compensators else None
        if ledger is None:
            return None
        return compensate_thread(
            thread_id, store=ledger.idempotency, saga=ledger.saga, compensators=compensators
        )

    async def acompensate_thread(
        self, thread_id: str, config: RunnableConfig
    ) -> CompensationReport | None:
        """Async `compensate_thread`: the ledger's async methods, async compensators."""
        compensators = {n: p.compensate for n, p in self.profiles.items() if p.compensate}
        ledger = await self._ledgers.aresolve(config) if compensators else None
        if ledger is None:
            return None
        return await acompensate_thread(
            thread_id, store=ledger.idempotency, saga=ledger.saga, compensators=compensators
        )

    # ------------------------------------------------------------ the node

    def run(self, state: Any, config: RunnableConfig) -> Any:
        """Sync body of the node."""
        return drive(self._step(state, config), self.clock)

    async def arun(self, state: Any, config: RunnableConfig) -> Any:
        """Async body of the node."""
        return await adrive(self._step(state, config), self.clock)

    def _step(self, state: Any, config: RunnableConfig) -> Flow[Any]:
        """The step as one `core.flow` flow: a run of the due calls, and another after
        each short backoff it leaves (`inline_retry`)."""
        once = functools.partial(self._once, config, {})
        return (yield from retried_in_step(self.settings, state, once))

    def _once(self, config: RunnableConfig, kept: dict[str, Any], state: Any) -> Flow[Any]:
        """One run: plan the batch, run it through ToolNode, finish it, report it."""
        batch = plan_batch(self.settings, state)
        if batch is None:
            return None
        output: Any = {}
        outcomes = None
        if batch.runnable:
            ledger, fence = yield from step_ledger(self._ledgers, config)
            with in_step(batch, ledger, fence, kept) as scope:
                output = yield from self._execute(state, config, batch, kept)
            outcomes = scope.outcomes
        update, reports = finish_step(self.settings, state, batch, output, outcomes)
        yield from self.guards.reports(reports)
        return update

    def enter_run(self, config: RunnableConfig) -> None:
        """At the graph's entry: take the run's lease of its thread when a tool has side
        effects (`_graph.run_lease`), so a second run on a running thread is refused
        before its model is asked."""
        ledger = self._ledgers.resolve(config)
        if ledger is not None:
            RUN_LEASES.take(ledger, current_run(), config)

    async def aenter_run(self, config: RunnableConfig) -> None:
        """Async `enter_run`."""
        ledger = await self._ledgers.aresolve(config)
        if ledger is not None:
            await RUN_LEASES.atake(ledger, current_run(), config)

    def leave_run(self, config: RunnableConfig) -> None:
        """The run ends: give back its lease of the thread, if it took one."""
        RUN_LEASES.release(current_run(), config)

    async def aleave_run(self, config: RunnableConfig) -> None:
        """Async `leave_run`."""
        await RUN_LEASES.arelease(current_run(), config)

    def _execute(
        self, state: Any, config: RunnableConfig, batch: Batch, kept: dict[str, Any]
    ) -> Flow[Any]:
        """ToolNode's output for the batch. A lone call retried inside the step runs
        again through the executor ToolNode gave it in this step's first run, as
        ToolRetryMiddleware's retries do; any other batch is a ToolNode run."""
        [call, *others] = batch.runnable
        found = None if others else kept.get(call["id"] or "")
        if found is None or found[0].tool_call["name"] != call["name"]:
            tool_node = self._tool_node
            run = (step_input(self.settings, state, batch), config)
            return (yield Call(tool_node.invoke, tool_node.ainvoke, run))
        request, execute = found
        again = request.override(tool_call=call)
        answer = yield Call(
            functools.partial(self.wrap_tool_call, again, execute),
            functools.partial(self.awrap_tool_call, again, execute),
        )
        return [answer] if isinstance(answer, Command) else {self.messages_key: [answer]}


def _check_batch_args(profiles: Mapping[str, ToolProfile], tools: Mapping[str, BaseTool]) -> None:
    """A profile's `batch_arg` must name one of its tool's arguments."""
    for name, profile in profiles.items():
        tool = tools.get(name)
        if (
            profile.batch_arg is not None
            and tool is not None
            and profile.batch_arg not in tool.args
        ):
            raise ConfigurationError(
                f"ToolProfile.batch_arg {profile.batch_arg!r} is not an argument of "
                f"{name!r}; its arguments: {sorted(tool.args)}"
            )
