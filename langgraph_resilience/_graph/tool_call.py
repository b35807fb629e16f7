"""One tool call's interception: what ToolNode's ``wrap_tool_call`` hook runs.

`CallInterceptor` stands between ToolNode and a tool, once per call: breaker
admission, bulkhead and timeout (`_graph.tool_guards`), lossless coercion of rejected
arguments, the exactly-once flow of a side effect (`_graph.exactly_once`), the output
contract, and one classification of a failure (`_Verdict`), which then travels to the
step as `answers.Raised`, in the step's `scope.CallOutcome`. The interception is one
`core.flow` flow, driven sync by ``wrap_tool_call`` and async by ``awrap_tool_call``.
Which calls run is `_graph.tool_batch`'s choice; what becomes of them,
`_graph.finish`'s.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, cast

from langchain_core.messages import ToolCall, ToolMessage
from langchain_core.tools import BaseTool
from langgraph.errors import GraphBubbleUp, is_invalid_resume
from langgraph.prebuilt.tool_node import ToolCallRequest, ToolInvocationError
from langgraph.types import Command

from langgraph_resilience._graph.answers import (
    BreakerReport,
    Raised,
    error_message,
    tool_error_of,
)
from langgraph_resilience._graph.bulkhead import BulkheadFullError
from langgraph_resilience._graph.call_effect import (
    EffectReading,
    ascoped,
    effect_of,
    messages_of,
    scoped,
)
from langgraph_resilience._graph.exactly_once import (
    Effect,
    EffectNotDone,
    OutcomeUnknownError,
    Run,
    calling,
    exactly_once,
)
from langgraph_resilience._graph.mcp import (
    ToldOnce,
    already_told,
    async_only,
    is_error_of,
    skipped_message,
)
from langgraph_resilience._graph.scope import STEP, StepScope, keep
from langgraph_resilience._graph.tool_guards import Admitted, ToolGuards
from langgraph_resilience.core.classification import Rule, classify
from langgraph_resilience.core.clock import Clock
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
    ToolError,
    ToolGoneError,
)
from langgraph_resilience.events import Event, emit, observed_attempt

__all__ = ["Answer", "CallInterceptor"]

Answer = ToolMessage | Command[Any]

_NOT_THE_TOOLS = (
    ConfigurationError,
    LedgerUnavailableError,
    StepNotSavedError,
    ThreadLockLostError,
)
"""Our own misconfiguration, ledger or lock: never the tool's failure, always raised."""

_NOT_EXECUTED = (BulkheadFullError, OutcomeUnknownError, EffectNotDone)
"""Refusals raised before the tool ran: they spend no attempt."""


class CallInterceptor:
    """Runs one tool call between ToolNode and the tool, and answers it: a result, or
    a placeholder error `ToolMessage` while the step's `CallOutcome` carries the
    classified failure (`answers.Raised`) to `finish.finish_step`."""

    def __init__(
        self,
        *,
        tools: dict[str, BaseTool],
        profiles: Mapping[str, ToolProfile],
        guards: ToolGuards,
        policy: ResiliencePolicy,
        rules: Sequence[Rule],
        clock: Clock,
        rng: random.Random,
        messages_key: str,
    ) -> None:
        self.tools_by_name = tools
        """ToolNode's own table (shared: `GuardedToolNode.learn` grows both)."""
        self.profiles, self.guards, self.rules = profiles, guards, rules
        self.clock, self.messages_key = clock, messages_key
        self._told = ToldOnce()
        self._unkeyed: set[str] = set()
        """Tools warned of asking for an idempotency key with no side-effect profile."""
        self._reading = EffectReading(
            is_read=self._is_read, policy=policy, rng=rng, rules=rules, messages_key=messages_key
        )

    def _coerced(self, call: ToolCall, tool: BaseTool | None) -> Coercion | None:
        """Lossless fixes for arguments `tool` (the request's: a middleware's agents may
        share tool names) rejected, or None if there are none. Only runs after a
        rejection, so clean calls pay nothing for it."""
        if tool is None:
            return None
        fixed = coerce_args(call["args"], tool.tool_call_schema)
        if not fixed.changes:
            return None
        emit(Event("coercion", tool=call["name"], call_id=call["id"], changes=fixed.changes))
        return fixed

    def _classify(self, call: ToolCall, exc: BaseException) -> ToolError:
        return classify(
            exc,
            tool=call["name"],
            profile=self.profiles.get(call["name"]),
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
            fixed = self._coerced(call, request.tool)
            if fixed is None:
                raise
            result = yield run(request.override(tool_call={**call, "args": fixed.args}))
            step = STEP.get()
            if step is not None and isinstance(result, ToolMessage):
                step.outcome(call["id"]).coercion = fixed
            return cast("Answer", result)

    def _intercept(
        self,
        request: ToolCallRequest,
        run: Callable[[ToolCallRequest], Call],
        effect_run: Callable[[Effect], Callable[[ToolCallRequest], Call]],
    ) -> Flow[Answer]:
        """One call: breaker admission, then the tool (through the exactly-once flow for a
        side effect), the output contract, and the outcome reported to the breaker."""
        call = request.tool_call
        verdict = _Verdict(functools.partial(self._classify, call))
        step = STEP.get()
        if step is not None and call["name"] in step.gone:
            gone = ToolGoneError(call["name"], 0.0)
            return self._raised(call, gone, verdict, executed=False)
        ticket = yield from self.guards.admit(call["name"])
        if isinstance(ticket, float):
            return self._refused(request, ticket, step, verdict)
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
                    call, effect, self._effect_run(call, request, effect, effect_run, verdict)
                )
            result = _checked(self.profiles, self.guards.servers, call, result)
        except (GraphBubbleUp, *_NOT_THE_TOOLS, *_NOT_EXECUTED) as exc:
            if admitted is not None:
                yield self.guards.release(admitted)
            if isinstance(exc, _NOT_EXECUTED):
                return self._raised(call, exc, verdict, executed=False, effect=effect)
            raise
        except Exception as exc:
            if is_invalid_resume(exc):
                raise
            failed = self._failed(call, exc, verdict, admitted=admitted, effect=effect, step=step)
            return (yield from failed)
        if admitted is not None:
            yield self.guards.succeeded(admitted)
        return result

    def _refused(
        self,
        request: ToolCallRequest,
        retry_after: float,
        step: StepScope | None,
        verdict: _Verdict,
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
        return self._raised(call, refused, verdict, executed=False)

    def _effect_run(
        self,
        call: ToolCall,
        request: ToolCallRequest,
        effect: Effect,
        effect_run: Callable[[Effect], Callable[[ToolCallRequest], Call]],
        verdict: _Verdict,
    ) -> Run:
        """What the exactly-once flow runs: this call's attempt under a given key (its
        own, or an earlier identical call's), judged by this node."""

        def tool(key: str) -> Flow[Answer]:
            under = effect if key == effect.key else dataclasses.replace(effect, key=key)
            answer = yield from self._attempt(call, request, effect_run(under))
            server = self.guards.servers.get(call["name"])
            if isinstance(answer, ToolMessage) and answer.status == "error" and server:
                raise is_error_of(answer, server)  # the service's answer: judged below
            return answer

        return Run(
            tool,
            verdict.maybe_executed,
            functools.partial(_broken_contract, self.profiles, self.guards.servers, call),
        )

    def _is_read(self, tool: str) -> bool:
        profile = self.profiles.get(tool)
        return tool in self.tools_by_name and (profile is None or not profile.side_effect)

    def _failed(
        self,
        call: ToolCall,
        exc: Exception,
        verdict: _Verdict,
        *,
        admitted: Admitted | None,
        effect: Effect | None,
        step: StepScope | None,
    ) -> Flow[Answer]:
        """A failed execution, classified once: a STRUCTURAL answer stops the step's calls
        to that tool that have not started; a probe reports at once, any other attempt
        when its call leaves the tool."""
        outcome = verdict(exc).failure_class
        if outcome is FailureClass.STRUCTURAL and step is not None:
            step.gone.add(call["name"])
        if admitted is None:
            return self._raised(call, exc, verdict, effect=effect)
        duration = self.clock.monotonic() - admitted.started
        if admitted.probe:  # a probe decides at once
            yield self.guards.record(admitted.key, outcome, True, duration)
            return self._raised(call, exc, verdict, effect=effect)
        report = (
            BreakerReport(admitted.key, outcome, duration)
            if outcome in self.guards.counted
            else None
        )
        return self._raised(call, exc, verdict, unreported=report, effect=effect)

    def _raised(
        self,
        call: ToolCall,
        exc: BaseException,
        verdict: _Verdict,
        *,
        executed: bool = True,
        unreported: BreakerReport | None = None,
        effect: Effect | None = None,
    ) -> ToolMessage:
        raised = Raised(exc, verdict(exc), executed, unreported, effect.key if effect else None)
        step = STEP.get()
        if step is None:  # no step to finish it: the envelope is the answer
            return error_message(raised.envelope)
        outcome = step.outcome(call["id"])
        outcome.raised, outcome.coercion = raised, None  # a failure records no fixes
        return ToolMessage(
            content="", name=call["name"], tool_call_id=call["id"] or "", status="error"
        )

    # ------------------------------------------------------------ the two drivers

    def wrap_tool_call(
        self, request: ToolCallRequest, execute: Callable[[ToolCallRequest], Answer]
    ) -> Answer:
        """Sync interception of one call (ToolNode's ``wrap_tool_call``)."""
        call = request.tool_call
        _check_sync(request.tool)
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
            if outcome is not None:
                outcome(_failure(call, answer))
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
            if outcome is not None:
                outcome(_failure(call, answer))
            return answer


class _Verdict:
    """One call's classification of its failures, made once per exception where it is
    caught: the exactly-once flow, the breaker report and the step each read it (the
    same exception passes all three), without a mark left on the exception."""

    __slots__ = ("_classify", "_last")

    def __init__(self, classify: Callable[[BaseException], ToolError]) -> None:
        self._classify = classify
        self._last: tuple[BaseException, ToolError] | None = None

    def __call__(self, exc: BaseException) -> ToolError:
        last = self._last
        if last is None or last[0] is not exc:
            last = self._last = (exc, self._classify(exc))
        return last[1]

    def maybe_executed(self, exc: BaseException) -> bool:
        """A lost response (a read timeout, a connection dropped after the request left,
        an unrecognised error from inside the tool) may hide a done effect: the intent
        stays pending. A refusal, or the service's definite answer, releases the key."""
        envelope = self(exc)
        return envelope.failure_class is FailureClass.UNKNOWN or bool(
            envelope.context.get("maybe_executed")
        )


def _check_sync(tool: BaseTool | None) -> None:
    """An async-only tool run by a sync graph run is the setup's error, never the tool's
    failure (it cannot run: a side effect would be claimed, then told it may have run)."""
    if async_only(tool):
        raise ConfigurationError(
            f"tool {tool.name!r} has only an async body: run the graph with ainvoke or "
            "astream, or give the tool a sync function too"
        )


def _failure(call: ToolCall, answer: Answer) -> ToolError | None:
    """How an attempt ended, for the observers: None when the tool answered, else its
    failure, as classified where it was caught."""
    step = STEP.get()
    found = step.outcomes.get(call["id"] or "") if step is not None else None
    if found is not None and found.raised is not None:
        return found.raised.envelope
    return tool_error_of(answer) if isinstance(answer, ToolMessage) else None


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
