"""Guarded tool execution: LangGraph's `ToolNode`, with every failure classified.

`GuardedToolNode` composes a real `ToolNode` (so tool-argument injection,
`InjectedState`, `ToolRuntime`, `Command` returns and parallel calls behave
exactly as in LangGraph) and intercepts each call through ToolNode's public
``wrap_tool_call`` hook: breaker admission, bulkhead, timeout, lossless coercion,
the exactly-once flow of a side effect (`graph.exactly_once`), the output contract,
and one classification of a failure, which then travels with the call. Which calls
run is `graph.tool_batch`'s choice; what becomes of them, `graph.tool_step`'s. The
interception is one `core.flow` flow, driven sync by ``wrap_tool_call`` and async by
``awrap_tool_call``; so is the step (``_step``: a short backoff is retried inside it,
`graph.step_retry`), driven by ``run`` and ``arun``.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, cast

from langchain_core.messages import ToolCall, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.errors import GraphBubbleUp, is_invalid_resume
from langgraph.prebuilt import ToolNode
from langgraph.prebuilt.tool_node import ToolCallRequest, ToolInvocationError
from langgraph.types import Command

from langgraph_resilience.core.breaker import BreakerConfig, BreakerStore
from langgraph_resilience.core.budget import RetryBudget
from langgraph_resilience.core.classification import DEFAULT_RULES, Rule
from langgraph_resilience.core.clock import Clock, SystemClock
from langgraph_resilience.core.compensation import (
    CompensationReport,
    acompensate_thread,
    compensate_thread,
)
from langgraph_resilience.core.effects import (
    IdempotencyStore,
    SagaLog,
)
from langgraph_resilience.core.flow import Call, Flow, adrive, drive
from langgraph_resilience.core.partial import as_partial_result
from langgraph_resilience.core.policy import ResiliencePolicy
from langgraph_resilience.core.profile import ToolProfile
from langgraph_resilience.core.validation import Coercion, check_output, coerce_args
from langgraph_resilience.errors import (
    ConfigurationError,
    FailureClass,
    LedgerUnavailableError,
    OutputValidationError,
    StepNotSavedError,
    ThreadLockLostError,
    ToolGoneError,
)
from langgraph_resilience.events import Event, emit, observed_attempt
from langgraph_resilience.graph.answers import (
    BreakerReport,
    Raised,
    classified,
    error_message,
    tool_error_of,
    with_coercions,
)
from langgraph_resilience.graph.bulkhead import BulkheadFullError
from langgraph_resilience.graph.call_effect import (
    EffectReading,
    ascoped,
    effect_of,
    messages_of,
    scoped,
)
from langgraph_resilience.graph.exactly_once import (
    Effect,
    EffectNotDone,
    OutcomeUnknownError,
    Run,
    calling,
    current_idempotency_key,
    current_item_keys,
    exactly_once,
)
from langgraph_resilience.graph.mcp import (
    ToldOnce,
    already_told,
    is_error_of,
    servers_of,
    skipped_message,
)
from langgraph_resilience.graph.node import ResilienceNode
from langgraph_resilience.graph.run_lease import RUN_LEASES, current_run, holding_if
from langgraph_resilience.graph.step_retry import retried_in_step
from langgraph_resilience.graph.step_scope import STEP, StepScope, in_step, keep
from langgraph_resilience.graph.tool_batch import Batch, ToolSettings, plan_batch, step_input
from langgraph_resilience.graph.tool_guards import Admitted, ToolGuards
from langgraph_resilience.graph.tool_step import finish_step
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

Answer = ToolMessage | Command[Any]

DEFAULT_BREAKER = BreakerConfig()
"""The breaker every tool gets unless told otherwise (`add_resilience`'s default too)."""

_NOT_THE_TOOLS = (
    ConfigurationError,
    LedgerUnavailableError,
    StepNotSavedError,
    ThreadLockLostError,
)
"""Our own misconfiguration, ledger or lock: never the tool's failure, always raised."""

_NOT_EXECUTED = (BulkheadFullError, OutcomeUnknownError, EffectNotDone)
"""Refusals raised before the tool ran: they spend no attempt."""


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
        self._schemas = {name: t.tool_call_schema for name, t in self.tools_by_name.items()}
        self.guards.servers.update(servers_of(self.tools_by_name.values(), self.profiles))
        self._told = ToldOnce()
        self._unkeyed: set[str] = set()
        """Tools warned of asking for an idempotency key with no side-effect profile."""
        _check_batch_args(self.profiles, self.tools_by_name)
        self.settings = self._settings(rng, can_repair, can_replan, can_escalate)
        """What the step's planning and settling read (`tool_batch`, `tool_step`)."""
        self._reading = EffectReading(
            is_read=self._is_read,
            policy=self.policy,
            rng=self.settings.rng,
            rules=self.rules,
            messages_key=self.messages_key,
        )

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
    def tools_by_name(self) -> dict[str, BaseTool]:
        """The tools this node executes, by name."""
        return self._tool_node.tools_by_name

    def learn(self, tools: Sequence[BaseTool]) -> None:
        """Know more tools (fallbacks, coercion, the unknown-tool check): the middleware
        meets an agent's tools only as its requests name them."""
        for tool in tools:
            if tool.name not in self.tools_by_name:
                self.tools_by_name[tool.name] = tool
                self._schemas[tool.name] = tool.tool_call_schema
        self.guards.servers.update(servers_of(tools, {}))

    def breaker_states(self) -> dict[str, str]:
        """Each tool's breaker status now (closed / open / half_open), for the planner."""
        return self.guards.breaker_states(list(self.tools_by_name))

    def servers_down(self) -> dict[str, list[str]]:
        """The MCP servers declared down (breaker open) now, with the tools each took
        down: ``{"weather": ["forecast", "lookup"]}``."""
        return self.guards.servers_down()

    # ------------------------------------------------------------ one call

    def _coerced(self, call: ToolCall) -> Coercion | None:
        """Lossless fixes for arguments the tool rejected, or None if there are none.
        Only runs after a rejection, so clean calls pay nothing for it."""
        if call["name"] not in self.tools_by_name:
            return None
        fixed = coerce_args(call["args"], self._schemas.get(call["name"]))
        if not fixed.changes:
            return None
        emit(Event("coercion", tool=call["name"], call_id=call["id"], changes=fixed.changes))
        return fixed

    def _classify(self, call: ToolCall, exc: BaseException) -> Any:
        profile = self.profiles.get(call["name"])
        return classified(
            exc,
            tool=call["name"],
            profile=profile,
            rules=self.rules,
            call_id=call["id"],
            now=self.clock.time(),
        )

    def _attempt(
        self, call: ToolCall, request: ToolCallRequest, run: Callable[..., Call]
    ) -> Flow[Answer]:
        """One execution of the tool, and once more with lossless fixes if its arguments
        were rejected before it ran."""
        try:
            return cast("Answer", (yield run(request)))
        except ToolInvocationError:
            fixed = self._coerced(call)
            if fixed is None:
                raise
            result = yield run(request.override(tool_call={**call, "args": fixed.args}))
            return with_coercions(result, fixed)

    def _intercept(
        self,
        request: ToolCallRequest,
        run: Callable[[ToolCallRequest], Call],
        effect_run: Callable[[Effect], Callable[[ToolCallRequest], Call]],
    ) -> Flow[Answer]:
        """One call: breaker admission, then the tool (through the exactly-once flow for a
        side effect), the output contract, and the outcome reported to the breaker."""
        call = request.tool_call
        step = STEP.get()
        if step is not None and call["name"] in step.gone:
            return self._raised(call, ToolGoneError(call["name"], 0.0), executed=False)
        ticket = yield from self.guards.admit(call["name"])
        if isinstance(ticket, float):
            return self._refused(request, ticket, step)
        admitted = ticket
        profile = self.profiles.get(call["name"])
        effect = None
        try:
            if step is not None and profile is not None and profile.side_effect:
                grace = self.guards.timeout_for(call["name"]) or 0.0
                effect = effect_of(call, request, step, profile, self._reading, grace=grace)
            if effect is None:
                result = yield from self._attempt(call, request, run)
            else:
                result = yield from exactly_once(
                    call, effect, self._effect_run(call, request, effect, effect_run)
                )
            result = _checked(self.profiles, self.guards.servers, call, result)
        except (GraphBubbleUp, *_NOT_THE_TOOLS, *_NOT_EXECUTED) as exc:
            if admitted is not None:
                yield self.guards.release(admitted)
            if isinstance(exc, _NOT_EXECUTED):
                return self._raised(call, exc, executed=False, effect=effect)
            raise
        except Exception as exc:
            if is_invalid_resume(exc):
                raise
            return (yield from self._failed(call, exc, admitted, effect, step))
        if admitted is not None:
            yield self.guards.succeeded(admitted)
        return result

    def _refused(
        self, request: ToolCallRequest, retry_after: float, step: StepScope | None
    ) -> Answer:
        """A call its breaker refused. A tool of a down MCP server that the task can do
        without is skipped; the first refusal of a task names the server's tools, the
        later ones do not repeat them (the agent is told once). A refusal a fallback
        will answer names them without counting as told: the agent may never see it."""
        call = request.tool_call
        server = self.guards.servers.get(call["name"])
        profile = self.profiles.get(call["name"])
        rerouted = profile is not None and bool(profile.fallbacks)
        message = step.batch.ai.id if step is not None else None
        told = already_told(
            server,
            rerouted=rerouted,
            messages=messages_of(request, self.messages_key),
            message_id=message,
            once=self._told,
        )
        if server is not None and profile is not None and not profile.critical and not rerouted:
            tools = [] if told else self.guards.server_tools(server)
            return skipped_message(call, server, tools)
        refused = self.guards.refusal(call["name"], retry_after, told=told)
        return self._raised(call, refused, executed=False)

    def _effect_run(
        self,
        call: ToolCall,
        request: ToolCallRequest,
        effect: Effect,
        effect_run: Callable[[Effect], Callable[[ToolCallRequest], Call]],
    ) -> Run:
        """What the exactly-once flow runs: this call's attempt under a given key (its
        own, or an earlier identical call's), judged by this node."""

        def tool(key: str) -> Flow[Answer]:
            under = effect if key == effect.key else dataclasses.replace(effect, key=key)
            answer = yield from self._attempt(call, request, effect_run(under))
            server = self.guards.servers.get(call["name"])
            if isinstance(answer, ToolMessage) and answer.status == "error" and server:
                raise is_error_of(answer, server)  # the service's answer: settled below
            return answer

        return Run(
            tool,
            functools.partial(self._maybe_executed, call),
            functools.partial(_broken_contract, self.profiles, self.guards.servers, call),
        )

    def _is_read(self, tool: str) -> bool:
        profile = self.profiles.get(tool)
        return tool in self.tools_by_name and (profile is None or not profile.side_effect)

    def _failed(
        self,
        call: ToolCall,
        exc: Exception,
        admitted: Admitted | None,
        effect: Effect | None,
        step: StepScope | None,
    ) -> Flow[Answer]:
        """A failed execution, classified once: a STRUCTURAL answer stops the step's calls
        to that tool that have not started; a probe reports at once, any other attempt
        when its call leaves the tool."""
        outcome = self._classify(call, exc).failure_class
        if outcome is FailureClass.STRUCTURAL and step is not None:
            step.gone.add(call["name"])
        if admitted is None:
            return self._raised(call, exc, effect=effect)
        duration = self.clock.monotonic() - admitted.started
        if admitted.probe:  # a probe decides at once
            yield self.guards.record(admitted.key, outcome, True, duration)
            return self._raised(call, exc, effect=effect)
        report = (
            BreakerReport(admitted.key, outcome, duration)
            if outcome in self.guards.counted
            else None
        )
        return self._raised(call, exc, unreported=report, effect=effect)

    def _maybe_executed(self, call: ToolCall, exc: BaseException) -> bool:
        """A lost response (a read timeout, a connection dropped after the request left,
        an unrecognised error from inside the tool) may hide a done effect: the intent
        stays pending. A refusal, or the service's definite answer, releases the key."""
        envelope = self._classify(call, exc)
        return envelope.failure_class is FailureClass.UNKNOWN or bool(
            envelope.context.get("maybe_executed")
        )

    def _raised(
        self,
        call: ToolCall,
        exc: BaseException,
        *,
        executed: bool = True,
        unreported: BreakerReport | None = None,
        effect: Effect | None = None,
    ) -> ToolMessage:
        raised = Raised(
            exc, self._classify(call, exc), executed, unreported, effect.key if effect else None
        )
        return ToolMessage(
            content="",
            name=call["name"],
            tool_call_id=call["id"] or "",
            status="error",
            artifact=raised,
        )

    # ------------------------------------------------------------ the two drivers

    @property
    def ledgers(self) -> LedgerResolver:
        """Chooses the side-effect ledger of a run (from its checkpointer)."""
        return self._ledgers

    def wrap_tool_call(
        self, request: ToolCallRequest, execute: Callable[[ToolCallRequest], Answer]
    ) -> Answer:
        """Sync interception of one call (ToolNode's ``wrap_tool_call``)."""
        call = request.tool_call
        keep(request, execute)

        def run(req: ToolCallRequest) -> Call:
            return Call(self.guards.timed, None, (call, req, execute, None))

        def effect_run(effect: Effect) -> Callable[[ToolCallRequest], Call]:
            run_scoped = scoped(execute, call, effect)
            return lambda req: Call(self.guards.timed, None, (call, req, run_scoped, effect))

        with (
            observed_attempt(call["name"], call["id"] or "") as outcome,
            calling(call["name"], self._unkeyed),
        ):
            answer = drive(self._intercept(request, run, effect_run), self.clock)
            outcome(answer)
            return answer

    async def awrap_tool_call(
        self, request: ToolCallRequest, execute: Callable[[ToolCallRequest], Awaitable[Answer]]
    ) -> Answer:
        """Async interception of one call (ToolNode's ``awrap_tool_call``)."""
        call = request.tool_call
        keep(request, execute)

        def run(req: ToolCallRequest) -> Call:
            return Call(self.guards.timed, self.guards.atimed, (call, req, execute, None))

        def effect_run(effect: Effect) -> Callable[[ToolCallRequest], Call]:
            run_scoped = ascoped(execute, call, effect)
            return lambda req: Call(
                self.guards.timed, self.guards.atimed, (call, req, run_scoped, effect)
            )

        with (
            observed_attempt(call["name"], call["id"] or "") as outcome,
            calling(call["name"], self._unkeyed),
        ):
            answer = await adrive(self._intercept(request, run, effect_run), self.clock)
            outcome(answer)
            return answer

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
        each short backoff it leaves (`step_retry`)."""
        once = functools.partial(self._once, config, {})
        return (yield from retried_in_step(self.settings, state, once))

    def _once(self, config: RunnableConfig, kept: dict[str, Any], state: Any) -> Flow[Any]:
        """One run: plan the batch, run it through ToolNode, settle it, report it."""
        batch = plan_batch(self.settings, state)
        if batch is None:
            return None
        output: Any = {}
        if batch.runnable:
            ledgers = self._ledgers
            ledger = yield Call(ledgers.resolve, ledgers.aresolve, (config,))
            fence = None
            if ledger is not None:  # side effects: this run's lease of its thread
                leases, run = RUN_LEASES, current_run()
                fence = yield Call(leases.take, leases.atake, (ledger, run, config))
            with in_step(batch, ledger, kept), holding_if(fence):
                output = yield from self._execute(state, config, batch, kept)
        update, reports = finish_step(self.settings, state, batch, output)
        yield from self.guards.reports(reports)
        return update

    def enter_run(self, config: RunnableConfig) -> None:
        """At the graph's entry: take the run's lease of its thread when a tool has side
        effects (`graph.run_lease`), so a second run on a running thread is refused
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


def _checked(
    profiles: Mapping[str, ToolProfile], servers: Mapping[str, str], call: ToolCall, result: Any
) -> Answer:
    """Apply the tool's output contract to a result that looks successful; an MCP
    tool's error result (``isError``, flattened by the adapters) is its failure."""
    server = servers.get(call["name"])
    if isinstance(result, ToolMessage) and result.status == "error" and server:
        raise is_error_of(result, server)
    if isinstance(result, ToolMessage) and result.status != "error":
        profile = profiles.get(call["name"])
        if profile is not None and profile.batch_arg and as_partial_result(result.content):
            return result  # a partial batch is judged item by item, not by the contract
        check_output(result.content, profile)
    return cast("Answer", result)


def _broken_contract(
    profiles: Mapping[str, ToolProfile], servers: Mapping[str, str], call: ToolCall, result: Answer
) -> OutputValidationError | None:
    try:
        _checked(profiles, servers, call, result)
    except OutputValidationError as exc:
        return exc
    return None
