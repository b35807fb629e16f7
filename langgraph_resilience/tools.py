"""Guarded tool execution: LangGraph's `ToolNode`, with every failure classified.

`GuardedToolNode` composes a real `ToolNode` (so tool-argument injection,
`InjectedState`, `ToolRuntime`, `Command` returns and parallel calls behave
exactly as in LangGraph) and intercepts each call through ToolNode's public
``wrap_tool_call`` hook. Per super-step it runs only the calls of the latest
`AIMessage` that are new or whose retry is due, so a succeeding sibling never
runs twice. Each failure is classified into a `ToolError`; `decide()` picks
retry (the call waits in the ledger, no message yet) or hand-back (an error
`ToolMessage` whose content is the envelope JSON).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import dataclasses
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from langchain_core.messages import AIMessage, AnyMessage, ToolCall, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.errors import GraphBubbleUp, is_invalid_resume
from langgraph.prebuilt import ToolNode
from langgraph.prebuilt.tool_node import ToolCallRequest
from langgraph.types import Command

from langgraph_resilience.canonical import call_key
from langgraph_resilience.classify import DEFAULT_RULES, Rule, classify, unknown_tool_error
from langgraph_resilience.clock import Clock
from langgraph_resilience.errors import ExhaustionReason, FailureClass, ToolError
from langgraph_resilience.events import Event, emit
from langgraph_resilience.policy import ResiliencePolicy
from langgraph_resilience.profile import ToolProfile
from langgraph_resilience.redaction import redact
from langgraph_resilience.router import decide
from langgraph_resilience.state import (
    CallRecord,
    Ledger,
    last_ai_message,
    read_ledger,
    read_messages,
)

__all__ = ["GuardedToolNode", "error_message", "tool_error_of"]

_DUE_TOLERANCE = 1e-3
"""Seconds of clock skew within which a scheduled retry counts as due."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Raised:
    """Carries a tool's exception out of ToolNode's wrapper to the node, never further."""

    error: BaseException


def error_message(error: ToolError, *, exhausted: ExhaustionReason | None = None) -> ToolMessage:
    """The `ToolMessage` the model sees for a failure: content is the envelope JSON."""
    if exhausted is not None:
        error = error.model_copy(update={"context": {**error.context, "exhausted": exhausted}})
    return ToolMessage(
        content=error.model_dump_json(exclude_none=True),
        name=error.tool,
        tool_call_id=error.call_id or "",
        status="error",
        artifact={"tool_error": error.model_dump(mode="json")},
    )


def tool_error_of(message: ToolMessage) -> ToolError | None:
    """The `ToolError` behind an error `ToolMessage` produced by this package, or None."""
    artifact = message.artifact
    if message.status == "error" and isinstance(artifact, dict) and "tool_error" in artifact:
        return ToolError.model_validate(artifact["tool_error"])
    return None


def _call_with_timeout(
    execute: Callable[[ToolCallRequest], Any], request: ToolCallRequest, timeout: float
) -> Any:
    """Run a sync tool with a timeout. The worker thread cannot be killed: it is
    abandoned, which is why a timed-out side effect is UNKNOWN, not TRANSIENT."""
    context = contextvars.copy_context()
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="lgr-tool")
    future = pool.submit(context.run, execute, request)
    try:
        return future.result(timeout=timeout)
    except TimeoutError:
        if future.done():
            raise  # the tool itself raised TimeoutError
        raise TimeoutError(f"tool did not finish within {timeout:g}s") from None
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


@dataclasses.dataclass(slots=True)
class _Batch:
    """One super-step of the tools node: what runs, and what is answered without running."""

    ai_index: int
    ai: AIMessage
    runnable: list[ToolCall]
    preflight: list[tuple[ToolError, ExhaustionReason | None]]
    now: float


class GuardedToolNode:
    """Executes the latest `AIMessage`'s tool calls with classification and budgets.

    Use it through `add_resilience`, which also wires the router and the retry
    node; the node alone only classifies and records, it never waits.
    """

    def __init__(
        self,
        tools: Sequence[BaseTool | Callable[..., Any]],
        *,
        policy: ResiliencePolicy,
        clock: Clock,
        profiles: Mapping[str, ToolProfile] | None = None,
        rules: Sequence[Rule] = DEFAULT_RULES,
        rng: random.Random | None = None,
        messages_key: str = "messages",
    ) -> None:
        self.policy = policy
        self.clock = clock
        self.profiles = dict(profiles or {})
        self.rules = tuple(rules)
        self.rng = rng or random.Random()
        self.messages_key = messages_key
        self._tool_node = ToolNode(
            list(tools),
            handle_tool_errors=False,
            messages_key=messages_key,
            wrap_tool_call=self._wrap,
            awrap_tool_call=self._awrap,
        )

    @property
    def tools_by_name(self) -> dict[str, BaseTool]:
        """The tools this node executes, by name."""
        return self._tool_node.tools_by_name

    # ------------------------------------------------------------ interception

    def _timeout_for(self, tool: str) -> float | None:
        profile = self.profiles.get(tool)
        if profile is not None and profile.timeout_s is not None:
            return profile.timeout_s
        return self.policy.tool_timeout_s

    def _wrap(
        self,
        request: ToolCallRequest,
        execute: Callable[[ToolCallRequest], ToolMessage | Command[Any]],
    ) -> ToolMessage | Command[Any]:
        call = request.tool_call
        timeout = self._timeout_for(call["name"])
        try:
            if timeout is None:
                return execute(request)
            return cast("ToolMessage | Command[Any]", _call_with_timeout(execute, request, timeout))
        except GraphBubbleUp:
            raise
        except Exception as exc:
            if is_invalid_resume(exc):
                raise
            return self._raised(call, exc)

    async def _awrap(
        self,
        request: ToolCallRequest,
        execute: Callable[[ToolCallRequest], Any],
    ) -> ToolMessage | Command[Any]:
        call = request.tool_call
        timeout = self._timeout_for(call["name"])
        try:
            if timeout is None:
                return cast("ToolMessage | Command[Any]", await execute(request))
            try:
                result = await asyncio.wait_for(execute(request), timeout)
            except TimeoutError as exc:
                raise TimeoutError(f"tool did not finish within {timeout:g}s") from exc
            return cast("ToolMessage | Command[Any]", result)
        except GraphBubbleUp:
            raise
        except Exception as exc:
            if is_invalid_resume(exc):
                raise
            return self._raised(call, exc)

    @staticmethod
    def _raised(call: ToolCall, exc: BaseException) -> ToolMessage:
        return ToolMessage(
            content="",
            name=call["name"],
            tool_call_id=call["id"] or "",
            status="error",
            artifact=_Raised(exc),
        )

    # -------------------------------------------------------------- the step

    def _plan(self, state: Any) -> _Batch | None:
        messages = read_messages(state, self.messages_key)
        found = last_ai_message(messages)
        if found is None:
            return None
        ai_index, ai = found
        ledger = read_ledger(state)
        calls = ledger.get("calls") or {}
        now = self.clock.time()
        answered = {m.tool_call_id for m in messages[ai_index + 1 :] if isinstance(m, ToolMessage)}
        batch = _Batch(ai_index=ai_index, ai=ai, runnable=[], preflight=[], now=now)
        for invalid in ai.invalid_tool_calls:
            if invalid.get("id") and invalid["id"] not in answered:
                batch.preflight.append((_invalid_call_error(invalid), None))
        budget_left = self.policy.max_tool_attempts - int(ledger.get("tool_attempts") or 0)
        started_at = ledger.get("started_at")
        deadline_passed = (
            self.policy.deadline_s is not None
            and started_at is not None
            and now - started_at >= self.policy.deadline_s
        )
        for call in ai.tool_calls:
            call_id = call["id"] or ""
            if call_id in answered:
                continue
            record = calls.get(call_id)
            if record is not None and (
                record["status"] != "scheduled" or (record["due"] or 0.0) > now + _DUE_TOLERANCE
            ):
                continue
            if call["name"] not in self.tools_by_name:
                batch.preflight.append(
                    (
                        unknown_tool_error(call["name"], list(self.tools_by_name), call_id=call_id),
                        None,
                    )
                )
                continue
            exhausted: ExhaustionReason | None = None
            if deadline_passed:
                exhausted = "deadline"
            elif budget_left <= 0:
                exhausted = "max_tool_attempts"
            if exhausted is not None:
                last = _last_error(record) or _budget_error(call, exhausted)
                batch.preflight.append((last, exhausted))
                continue
            budget_left -= 1
            batch.runnable.append(call)
        return batch

    def _input(self, state: Any, batch: _Batch) -> dict[str, Any]:
        messages = read_messages(state, self.messages_key)[: batch.ai_index]
        only_due = batch.ai.model_copy(update={"tool_calls": batch.runnable})
        base = dict(state) if isinstance(state, Mapping) else {}
        return {**base, self.messages_key: [*messages, only_due]}

    def _finish(self, state: Any, batch: _Batch, output: Any) -> Any:
        ledger = read_ledger(state)
        calls = ledger.get("calls") or {}
        thread_attempts = int(ledger.get("tool_attempts") or 0) + len(batch.runnable)
        started_at = ledger.get("started_at") or batch.now
        elapsed = batch.now - started_at
        by_id = {call["id"]: call for call in batch.runnable}
        results, commands = _split_output(output, self.messages_key)
        delta_calls: dict[str, CallRecord] = {}
        messages: list[AnyMessage] = []
        events: dict[str, int] = {}

        def count(kind: str) -> None:
            events[kind] = events.get(kind, 0) + 1

        for call_id, call in by_id.items():
            previous = calls.get(call_id or "")
            attempts = (previous["attempts"] if previous else 0) + 1
            key = call_key(call["name"], call["args"], noise_fields=self.policy.noise_fields)
            message = results.get(call_id or "")
            raised = message.artifact if message is not None else None
            count("attempt")
            if not isinstance(raised, _Raised):
                emit(
                    Event("attempt", tool=call["name"], call_id=call_id, attempt=attempts, ok=True)
                )
                # An ok record keeps the last failure it recovered from, for audit.
                delta_calls[call_id or ""] = _record(
                    call, key, attempts=attempts, status="ok", due=None, error=_last_error(previous)
                )
                if message is not None:
                    messages.append(message)
                continue
            profile = self.profiles.get(call["name"])
            error = classify(
                raised.error,
                tool=call["name"],
                profile=profile,
                call_id=call_id,
                attempt=attempts,
                rules=self.rules,
                now=batch.now,
            )
            emit(
                Event(
                    "attempt",
                    tool=call["name"],
                    call_id=call_id,
                    attempt=attempts,
                    ok=False,
                    failure_class=error.failure_class.value,
                    error=error.type,
                )
            )
            decision = decide(
                error,
                attempts=attempts,
                thread_attempts=thread_attempts,
                elapsed=elapsed,
                policy=self.policy,
                profile=profile,
                rng=self.rng,
            )
            if decision.route == "retry":
                count("retry_scheduled")
                emit(
                    Event(
                        "retry_scheduled",
                        tool=call["name"],
                        call_id=call_id,
                        attempt=attempts,
                        delay=round(decision.delay, 6),
                    )
                )
                delta_calls[call_id or ""] = _record(
                    call,
                    key,
                    attempts=attempts,
                    status="scheduled",
                    due=batch.now + decision.delay,
                    error=error,
                )
                continue
            count("gave_up")
            emit(
                Event(
                    "gave_up",
                    tool=call["name"],
                    call_id=call_id,
                    attempt=attempts,
                    failure_class=error.failure_class.value,
                    exhausted=decision.exhausted,
                )
            )
            delta_calls[call_id or ""] = _record(
                call, key, attempts=attempts, status="failed", due=None, error=error
            )
            messages.append(error_message(error, exhausted=decision.exhausted))

        for error, exhausted in batch.preflight:
            count("gave_up")
            emit(
                Event(
                    "gave_up",
                    tool=error.tool,
                    call_id=error.call_id,
                    attempt=error.attempt,
                    failure_class=error.failure_class.value,
                    exhausted=exhausted,
                )
            )
            if error.call_id:
                previous = calls.get(error.call_id)
                delta_calls[error.call_id] = {
                    "tool": error.tool or "",
                    "key": previous["key"] if previous else "",
                    "attempts": previous["attempts"] if previous else 0,
                    "status": "failed",
                    "due": None,
                    "error": error.model_dump(mode="json"),
                }
            messages.append(error_message(error, exhausted=exhausted))

        waiting = any(r["status"] == "scheduled" for r in delta_calls.values())
        emit(Event("route", to="retry" if waiting else "agent"))
        delta: Ledger = {
            "calls": delta_calls,
            "tool_attempts": len(batch.runnable),
            "events": events,
        }
        if ledger.get("started_at") is None and batch.runnable:
            delta["started_at"] = batch.now
        update: dict[str, Any] = {self.messages_key: messages, "resilience": delta}
        if commands:
            return [*commands, update]
        return update

    def run(self, state: Any, config: RunnableConfig) -> Any:
        """Sync body of the node."""
        batch = self._plan(state)
        if batch is None:
            return {}
        output = self._tool_node.invoke(self._input(state, batch), config) if batch.runnable else {}
        return self._finish(state, batch, output)

    async def arun(self, state: Any, config: RunnableConfig) -> Any:
        """Async body of the node."""
        batch = self._plan(state)
        if batch is None:
            return {}
        output = (
            await self._tool_node.ainvoke(self._input(state, batch), config)
            if batch.runnable
            else {}
        )
        return self._finish(state, batch, output)


def _record(
    call: ToolCall,
    key: str,
    *,
    attempts: int,
    status: Any,
    due: float | None,
    error: ToolError | None,
) -> CallRecord:
    return {
        "tool": call["name"],
        "key": key,
        "attempts": attempts,
        "status": status,
        "due": due,
        "error": None if error is None else error.model_dump(mode="json"),
    }


def _last_error(record: CallRecord | None) -> ToolError | None:
    if record is None or record["error"] is None:
        return None
    return ToolError.model_validate(record["error"])


def _budget_error(call: ToolCall, exhausted: ExhaustionReason) -> ToolError:
    return ToolError(
        type="BudgetExhausted",
        failure_class=FailureClass.TRANSIENT,
        message=f"the thread's {exhausted} budget is spent; the call was not executed",
        suggested_action="ask_human",
        retriable=False,
        tool=call["name"],
        call_id=call["id"],
        context={"exhausted": exhausted},
    )


def _invalid_call_error(invalid: Mapping[str, Any]) -> ToolError:
    return ToolError(
        type="InvalidToolCall",
        failure_class=FailureClass.SEMANTIC,
        message=f"the arguments are not valid JSON: {invalid.get('error') or 'unparseable'}",
        suggested_action="fix_args",
        retriable=False,
        tool=invalid.get("name") or "",
        call_id=invalid.get("id"),
        context={"args": redact(str(invalid.get("args") or "")[:200])},
    )


def _split_output(
    output: Any, messages_key: str
) -> tuple[dict[str, ToolMessage], list[Command[Any]]]:
    """ToolNode returns ``{messages: [...]}`` or, when a tool returned a `Command`,
    a list mixing Commands and such dicts."""
    results: dict[str, ToolMessage] = {}
    commands: list[Command[Any]] = []
    items = output if isinstance(output, list) else [output]
    for item in items:
        if isinstance(item, Command):
            commands.append(item)
        elif isinstance(item, Mapping):
            for message in item.get(messages_key) or []:
                if isinstance(message, ToolMessage):
                    results[message.tool_call_id] = message
    return results, commands
