"""How a tools step finishes its calls: the per-call state machine over the tally.

After ToolNode ran the batch, each call's outcome becomes its next state in the
tally: answered (ok or failed), scheduled for a retry, sent to repair, replan or
escalation, or handed to a fallback; partial batches keep what succeeded. The
step's tally delta and messages are the node's update; the failures that left
their tool are the breaker reports the node sends once (a breaker counts logical
calls). Pure over (state, batch, ToolNode's output, `ToolSettings`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from langchain_core.messages import AnyMessage, ToolCall, ToolMessage
from langgraph.prebuilt.tool_node import ToolInvocationError

from langgraph_resilience._graph.answers import (
    BreakerReport,
    Raised,
    error_message,
    split_output,
    with_done_items,
    with_exhausted,
    with_trail,
)
from langgraph_resilience._graph.mcp import skipped_message
from langgraph_resilience._graph.scope import CallOutcome
from langgraph_resilience._graph.state import (
    PLAN_CALL_PREFIX,
    CallRecord,
    Tally,
    TaskTally,
    current_calls,
    is_clean,
    message_slot,
    read_tally,
)
from langgraph_resilience._graph.status_checks import check_with
from langgraph_resilience._graph.tool_batch import Batch, Preflight, ToolSettings, tool_attempts
from langgraph_resilience.core.canonical import call_key
from langgraph_resilience.core.classification import classify
from langgraph_resilience.core.decision import Decision, Paths, decide, decide_repair, unrecovered
from langgraph_resilience.core.partial import PartialResult, as_partial_result, failed_items
from langgraph_resilience.core.redaction import redact
from langgraph_resilience.errors import CircuitOpenError, FailureClass, ToolError, ToolGoneError
from langgraph_resilience.events import Event, emit, listening

__all__ = ["Step", "finish_step"]


@dataclasses.dataclass(slots=True)
class Step:
    """What one tools step accumulates while finishing its calls."""

    tally: Tally
    task: TaskTally
    task_attempts: int
    elapsed: float
    calls: dict[str, CallRecord] = dataclasses.field(default_factory=dict)
    messages: list[AnyMessage] = dataclasses.field(default_factory=list)
    events: dict[str, int] = dataclasses.field(default_factory=dict)
    gone: dict[str, float] = dataclasses.field(default_factory=dict)
    seen: dict[str, int] = dataclasses.field(default_factory=dict)
    """Loop-guard corrections: a failure handed back leaves `seen` for `failed`."""
    failed: dict[str, int] = dataclasses.field(default_factory=dict)
    unreported: dict[str, BreakerReport] = dataclasses.field(default_factory=dict)
    """Per call id: this step's failed attempt, not yet told to its breaker."""
    reports: list[BreakerReport] = dataclasses.field(default_factory=list)
    """Failures of calls that left their tool in this step: one per logical call."""
    informed: dict[str, str] = dataclasses.field(default_factory=dict)
    """Effects of unknown outcome the agent was told of in this step, by key -> task."""
    held: dict[str, int] = dataclasses.field(default_factory=dict)
    """Side effects this step answered as done, by call key (the tally's ``held``)."""
    done: int = 0
    """Clean first tries finished without a record (`_finish_clean`)."""

    def count(self, kind: str) -> None:
        self.events[kind] = self.events.get(kind, 0) + 1


def finish_step(
    cfg: ToolSettings,
    state: Any,
    batch: Batch,
    output: Any,
    outcomes: Mapping[str, CallOutcome] | None = None,
) -> tuple[Any, list[BreakerReport]]:
    """The node's update for one step (messages and tally delta), and its breaker
    reports, from ToolNode's output and what the interception learned of each call."""
    tally = read_tally(state)
    results, commands = split_output(output, cfg.messages_key)
    outcomes = outcomes or {}
    raised = {call_id: o.raised for call_id, o in outcomes.items() if o.raised is not None}
    refused = {call_id for call_id, r in raised.items() if not r.executed and call_id in results}
    executed = len(batch.runnable) - len(refused)
    started_at = batch.task.get("started_at")
    step = Step(
        tally=tally,
        task=batch.task,
        task_attempts=int(batch.task.get("tool_attempts") or 0) + executed,
        elapsed=batch.now - (started_at or batch.now),
    )
    for issued in batch.runnable:
        call_id = issued["id"] or ""
        message, outcome = results.get(call_id), outcomes.get(call_id) or CallOutcome()
        _finish_call(cfg, step, batch, issued, message, outcome=outcome, refused=refused)
    calls = tally.get("calls") or {}
    for item in batch.preflight:
        _finish_preflight(cfg, step, item, calls)
    _end_waits_past_budget(cfg, step, state, batch)
    update: dict[str, Any] = {
        cfg.messages_key: step.messages,
        "resilience": _delta(batch, step, executed),
    }
    return ([*commands, update] if commands else update), step.reports


def _finish_call(
    cfg: ToolSettings,
    step: Step,
    batch: Batch,
    issued: ToolCall,
    message: ToolMessage | None,
    *,
    outcome: CallOutcome,
    refused: set[str],
) -> None:
    """One executed (or refused) call: its new record, then success, failure or partial."""
    call_id = issued["id"] or ""
    slot = batch.slots[call_id]
    previous = (step.tally.get("calls") or {}).get(slot)
    ran = call_id not in refused
    fixed, raised = (outcome.coercion, outcome.raised) if message is not None else (None, None)
    first_try = previous is None and ran and fixed is None and raised is None
    if first_try and _clean_first_try(cfg, batch, issued, message):
        _finish_clean(cfg, step, batch, issued, message)  # type: ignore[arg-type]
        return
    call = issued if fixed is None else {**issued, "args": fixed.args}
    record = _record(
        call,
        batch.keys[call_id],
        attempts=(previous["attempts"] if previous else 0) + ran,
        previous=previous,
        coercions=list(fixed.changes) if fixed is not None else None,
    )
    if call_id in batch.loop_keys:
        record["loop_key"] = batch.loop_keys[call_id]
    if call_id in batch.rerouted:
        _note_reroute(step, record, batch.rerouted[call_id])
    if ran:
        record.pop("approved", None)  # a human's retry buys one more execution
        step.count("attempt")
        if tool_attempts(record) == 1:  # a first try of this tool
            cfg.deposit(call["name"], batch.now)
    if raised is not None:
        if raised.unreported is not None:
            step.unreported[call_id] = raised.unreported
        if raised.effect_key is not None:
            record["effect_key"] = raised.effect_key
        _finish_failure(cfg, step, slot, call, record, raised=raised, now=batch.now)
        return
    partial = _partial(cfg, call, message)
    if partial is not None and message is not None:
        _finish_partial(
            cfg, step, slot, call, record, partial=partial, keys=outcome.item_keys, now=batch.now
        )
        return
    attempt = tool_attempts(record)
    emit(Event("attempt", tool=call["name"], call_id=call_id, attempt=attempt, ok=True))
    record["status"] = "ok"
    step.calls[slot] = record
    _hold(cfg, step, call, batch.keys[call_id], message)
    if message is not None:
        merged = with_done_items(message, record, cfg.profiles.get(call["name"]))
        step.messages.append(with_trail(merged, record))


def _clean_first_try(
    cfg: ToolSettings, batch: Batch, call: ToolCall, message: ToolMessage | None
) -> bool:
    """A new call that succeeded at its first execution, as issued (`is_clean`)."""
    return (
        message is not None
        and (call["id"] or "") not in batch.rerouted
        and _partial(cfg, call, message) is None
    )


def _finish_clean(
    cfg: ToolSettings, step: Step, batch: Batch, call: ToolCall, message: ToolMessage
) -> None:
    """A clean first try: counted in the tally's ``done``, answered by its ToolMessage
    alone (no record is built: there is nothing in it to keep)."""
    step.count("attempt")
    cfg.deposit(call["name"], batch.now)
    if listening():
        emit(Event("attempt", tool=call["name"], call_id=call["id"] or "", attempt=1, ok=True))
    step.done += 1
    _hold(cfg, step, call, batch.keys[call["id"] or ""], message)
    step.messages.append(message)


def _hold(
    cfg: ToolSettings, step: Step, call: ToolCall, key: str, message: ToolMessage | None
) -> None:
    """A side effect answered as done: the thread now holds it once more."""
    profile = cfg.profiles.get(call["name"])
    if profile is None or not profile.side_effect or message is None:
        return
    if isinstance(message.artifact, dict) and "mcp_unavailable" in message.artifact:
        return  # skipped, not done
    step.held[key] = step.held.get(key, 0) + 1


def _finish_failure(
    cfg: ToolSettings,
    step: Step,
    slot: str,
    call: ToolCall,
    record: CallRecord,
    *,
    raised: Raised,
    now: float,
) -> None:
    """Carry out `decide()`'s verdict on one failed execution (classified where it was
    caught: `Raised.envelope`)."""
    attempts = tool_attempts(record)
    error = raised.envelope.for_call(tool=call["name"], call_id=call["id"] or "", attempt=attempts)
    exc = raised.error
    if isinstance(exc, ToolInvocationError):  # rejected before running: safe to repair
        error = error.model_copy(update={"context": {**error.context, "stage": "arguments"}})
    elif error.failure_class is FailureClass.STRUCTURAL and not isinstance(
        exc, CircuitOpenError | ToolGoneError
    ):
        step.gone[call["name"]] = now  # the endpoint answered: remember it for the thread
    record["error"] = error.model_dump(mode="json")
    emit(
        Event(
            "attempt",
            tool=call["name"],
            call_id=call["id"],
            attempt=attempts,
            ok=False,
            failure_class=error.failure_class.value,
            error=error.type,
        )
    )
    _decide(cfg, step, slot, call, record, error=error, now=now)


def _decide(
    cfg: ToolSettings,
    step: Step,
    slot: str,
    call: ToolCall,
    record: CallRecord,
    *,
    error: ToolError,
    now: float,
) -> None:
    """Ask `decide()` for a failed execution's final route, and carry it out. A retry
    takes a token of the shared budget; refused one, `decide` is asked again, told so."""
    inputs: dict[str, Any] = {
        "attempts": tool_attempts(record),
        "task_attempts": step.task_attempts,
        "elapsed": step.elapsed,
        "policy": cfg.policy,
        "profile": cfg.profiles.get(call["name"]),
        "rng": cfg.rng,
        "repairs": record.get("repairs", 0),
        "llm_calls": int(step.task.get("llm_calls") or 0),
        "can_repair": cfg.can_repair,
        "idempotent": True,  # every side effect runs under a key (effect_ledger)
    }
    paths = _paths(cfg, step, record, error)
    decision = decide(error, **inputs, paths=paths)
    if decision.route == "retry" and not cfg.withdraw(call["name"], now):
        decision = decide(error, **inputs, paths=dataclasses.replace(paths, retry_budget=False))
    unreported = step.unreported.pop(call["id"] or "", None)
    if unreported is not None and decision.route != "retry":
        step.reports.append(unreported)  # the call leaves this tool: one outcome
    _carry_out(cfg, step, slot, record, error, decision=decision, now=now)


def _paths(cfg: ToolSettings, step: Step, record: CallRecord, error: ToolError) -> Paths:
    """What the graph offers a failed call besides retry and repair: its next fallback
    still worth a call, the planner, a human, a skip when its MCP server is down."""
    tried = [*record.get("tried", []), record["tool"]]
    gone = {**(step.tally.get("gone") or {}), **step.gone}
    fallbacks = cfg.fallbacks(tried[0], tried, gone, cfg.clock.time())
    call_id = record.get("call_id") or error.call_id or ""
    return Paths(
        fallback=fallbacks[0] if fallbacks else "",
        can_replan=cfg.can_replan,
        can_escalate=cfg.can_escalate,
        in_plan=call_id.startswith(PLAN_CALL_PREFIX),
        skip=_skippable(cfg, record["tool"], error),
    )


def _partial(
    cfg: ToolSettings, call: ToolCall, message: ToolMessage | None
) -> PartialResult | None:
    """The `PartialResult` a batch tool answered with, or None."""
    profile = cfg.profiles.get(call["name"])
    if message is None or profile is None or profile.batch_arg is None:
        return None
    return as_partial_result(message.content)


def _finish_partial(
    cfg: ToolSettings,
    step: Step,
    slot: str,
    call: ToolCall,
    record: CallRecord,
    *,
    partial: PartialResult,
    keys: tuple[str, ...] | None,
    now: float,
) -> None:
    """Some items of a batch failed: redo only those (PARTIAL), each keeping its
    first key; what succeeded is kept for the call's final answer."""
    batch_arg = cfg.profiles[call["name"]].batch_arg or ""
    items = call["args"].get(batch_arg)
    try:
        if not isinstance(items, list):
            raise ValueError(f"the batch argument {batch_arg!r} is not a list")
        redo = failed_items(items, partial, call_key="")
    except ValueError as exc:  # the tool's partial result does not match its batch
        profile = cfg.profiles.get(call["name"])
        envelope = classify(exc, tool=call["name"], profile=profile, rules=cfg.rules)
        _finish_failure(cfg, step, slot, call, record, raised=Raised(exc, envelope), now=now)
        return
    done = [*record.get("done_items", []), *partial.succeeded]
    error = ToolError(
        type="PartialResult",
        failure_class=FailureClass.PARTIAL,
        message=redact(
            f"{len(redo)} of {len(items)} items failed: "
            + "; ".join(f.error for f in partial.failed[:3])
        ),
        suggested_action="retry",
        retriable=True,
        tool=call["name"],
        call_id=call["id"],
        attempt=tool_attempts(record),
        context={"failed": [r.item for r in redo], "succeeded": done},
    )
    record["error"] = error.model_dump(mode="json")
    record["done_items"] = done
    record["args"] = {**call["args"], batch_arg: [r.item for r in redo]}
    record["key"] = call_key(call["name"], record["args"], noise_fields=cfg.policy.noise_fields)
    if keys is not None and len(keys) == len(items):
        record["item_keys"] = [keys[r.index] for r in redo]
    step.count("partial")
    emit(
        Event(
            "attempt",
            tool=call["name"],
            call_id=call["id"],
            attempt=tool_attempts(record),
            ok=False,
            failure_class=FailureClass.PARTIAL.value,
            failed=len(redo),
            items=len(items),
        )
    )
    _decide(cfg, step, slot, call, record, error=error, now=now)


def _fall_back(
    cfg: ToolSettings, step: Step, slot: str, record: CallRecord, error: ToolError, *, to: str
) -> None:
    """Hand the call to the fallback tool `to`, from its primary's original arguments;
    the fallback's own attempts start here."""
    tried = [*record.get("tried", []), record["tool"]]
    chain = cfg.profiles[tried[0]]
    origin = record.get("origin_args") or record.get("args", {})
    args = dict(origin)
    if chain.fallback_args is not None:
        args = chain.fallback_args(to, dict(origin))
    record["origin_args"] = origin
    record["tried"] = tried
    record["served_by"] = to
    record["fallback_at"] = record["attempts"]
    record["tried_errors"] = [*record.get("tried_errors", []), error.model_dump(mode="json")]
    record["args"] = args
    record["status"] = "scheduled"
    record["due"] = None
    record["key"] = call_key(to, args, noise_fields=cfg.policy.noise_fields)
    step.calls[slot] = record
    step.count("fallback")
    emit(
        Event(
            "fallback",
            tool=record["tool"],
            to=to,
            call_id=record.get("call_id"),
            failure_class=error.failure_class.value,
        )
    )


def _note_reroute(step: Step, record: CallRecord, rerouted: tuple[str, dict[str, Any]]) -> None:
    """Record a call sent straight to a fallback as served by it, like `_fall_back`."""
    primary, origin = rerouted
    record["served_by"] = record["tool"]
    record["tried"] = [primary]
    record["origin_args"] = origin
    step.count("fallback")
    emit(
        Event(
            "fallback",
            tool=primary,
            to=record["tool"],
            call_id=record.get("call_id"),
            failure_class=FailureClass.STRUCTURAL.value,
            remembered=True,
        )
    )


def _carry_out(
    cfg: ToolSettings,
    step: Step,
    slot: str,
    record: CallRecord,
    error: ToolError,
    *,
    decision: Decision,
    now: float,
) -> None:
    """Apply `decide()`'s route to a call's record: wait, repair, fall back, replan,
    escalate, or answer (with the envelope, or as skipped)."""
    tool = record["tool"]
    call_id = record.get("call_id") or error.call_id or ""
    step.calls[slot] = record
    if decision.route == "fallback":
        _fall_back(cfg, step, slot, record, error, to=decision.to)
    elif decision.route in ("replan", "escalate"):
        step.count(f"{decision.route}_needed")
        failure = error.failure_class.value
        emit(
            Event(
                f"{decision.route}_needed",
                tool=tool,
                call_id=call_id,
                failure_class=failure,
                exhausted=decision.exhausted,
            )
        )
        record["status"] = decision.route
        if decision.exhausted is not None:
            record["error"] = with_exhausted(error, decision.exhausted).model_dump(mode="json")
    elif decision.route == "retry":
        step.count("retry_scheduled")
        attempt, delay = tool_attempts(record), round(decision.delay, 6)
        failure = error.failure_class.value
        emit(
            Event(
                "retry_scheduled",
                tool=tool,
                call_id=call_id,
                attempt=attempt,
                delay=delay,
                failure_class=failure,
            )
        )
        record["status"] = "scheduled"
        record["due"] = now + decision.delay
    elif decision.route == "repair":
        step.count("repair_needed")
        record["status"] = "repair"
    else:
        if error.failure_class is FailureClass.UNKNOWN and "check_with" not in error.context:
            reads = check_with(cfg.tools, cfg.profiles, record["tool"], record.get("args") or {})
            if reads:
                error = error.model_copy(update={"context": {**error.context, "check_with": reads}})
        _give_up(step, record, error, decision)


def _skippable(cfg: ToolSettings, tool: str, error: ToolError) -> str:
    """The MCP server a non-critical tool's failure shows unreachable (its connection or
    session lost, its breaker open), so the call may be answered as skipped; else ""."""
    server, profile = cfg.server_of(tool), cfg.profiles.get(tool)
    if server is None or profile is None or profile.critical:
        return ""
    context = error.context
    lost = context.get("connection") or context.get("session") or context.get("breaker")
    reconnecting = context.get("mcp") in ("session_closed", "reconnecting")
    return server if lost or reconnecting else ""


def _give_up(step: Step, record: CallRecord, error: ToolError, decision: Decision) -> None:
    """Answer the call with its envelope (the agent decides what to do next), or as
    skipped when its route is ``skip`` (a non-critical tool of an unreachable MCP
    server, `decision.to`)."""
    step.count("gave_up")
    emit(
        Event(
            "gave_up",
            tool=record["tool"],
            call_id=record.get("call_id") or error.call_id,
            attempt=tool_attempts(record),
            failure_class=error.failure_class.value,
            exhausted=decision.exhausted,
        )
    )
    record["status"] = "failed"
    record["due"] = None
    loop_key = record.get("loop_key")
    if loop_key:  # the agent may re-issue a call whose failure it was handed
        step.seen[loop_key] = step.seen.get(loop_key, 0) - 1
        step.failed[loop_key] = step.failed.get(loop_key, 0) + 1
    unknown = error.context.get("idempotency_key") or record.get("effect_key")
    pending = error.failure_class is FailureClass.UNKNOWN or error.context.get("maybe_executed")
    if pending and unknown:  # its intent stays open: the agent was told it may have run
        step.informed[str(unknown)] = str(step.task.get("id", ""))
    if decision.route == "skip":
        call = ToolCall(name=record["tool"], args={}, id=error.call_id, type="tool_call")
        step.messages.append(skipped_message(call, decision.to, []))
        return
    step.messages.append(error_message(error, exhausted=decision.exhausted))


def _end_waits_past_budget(cfg: ToolSettings, step: Step, state: Any, batch: Batch) -> None:
    """Once the task budget is spent, calls still waiting for a retry would only
    wait to be refused: finish them now instead of sleeping first."""
    if step.task_attempts < cfg.policy.max_tool_attempts:
        return
    calls = step.tally.get("calls") or {}
    for entry in current_calls(state, cfg.messages_key):
        if batch.owns is not None and entry.slot not in batch.owns:
            continue  # a sibling's own step finishes it
        record = step.calls.get(entry.slot) or calls.get(entry.slot)
        if record is None or record["status"] != "scheduled" or record["error"] is None:
            continue
        error = ToolError.model_validate(record["error"])
        spent = Decision("agent", exhausted="max_tool_attempts")
        decision = unrecovered(error, spent, _paths(cfg, step, record, error))
        _carry_out(cfg, step, entry.slot, dict(record), error, decision=decision, now=batch.now)  # type: ignore[arg-type]


def _finish_preflight(
    cfg: ToolSettings, step: Step, item: Preflight, calls: Mapping[str, CallRecord]
) -> None:
    """Answer a call that was not run (unknown tool, loop, spent budget, bad JSON),
    or send unparseable arguments to reflection repair."""
    error, slot = item.error, item.slot
    if item.repairable and error.call_id:
        decision = decide_repair(
            error,
            repairs=0,
            llm_calls=int(step.task.get("llm_calls") or 0),
            policy=cfg.policy,
            profile=cfg.profiles.get(error.tool or ""),
            can_repair=cfg.can_repair,
        )
        if decision.route == "repair":
            step.count("repair_needed")
            step.calls[slot] = {
                "tool": error.tool or "",
                "key": "",
                "attempts": 0,
                "status": "repair",
                "due": None,
                "error": error.model_dump(mode="json"),
                "call_id": error.call_id,
                "args": {},
            }
            return
        item.exhausted = decision.exhausted
    paths = Paths(
        can_replan=cfg.can_replan,
        can_escalate=cfg.can_escalate,
        in_plan=(error.call_id or "").startswith(PLAN_CALL_PREFIX),
    )
    onward = unrecovered(error, Decision("agent", exhausted=item.exhausted), paths)
    if item.exhausted == "loop":
        step.count("loop_detected")
        count = error.context.get("count")
        emit(
            Event(
                "loop_detected",
                tool=error.tool,
                call_id=error.call_id,
                call_key=item.key,
                count=count,
            )
        )
    _answer_preflight(step, item, calls, onward)


def _answer_preflight(
    step: Step, item: Preflight, calls: Mapping[str, CallRecord], onward: Decision
) -> None:
    """A call answered without running: to a replan or a human, else its envelope."""
    error, slot = item.error, item.slot
    previous = calls.get(slot)
    answered: CallRecord = {
        **({"args": dict(item.args)} if item.args is not None else {}),  # type: ignore[typeddict-item]
        **(previous or {}),  # type: ignore[typeddict-item]
        "tool": error.tool or "",
        "key": item.key or (previous["key"] if previous else ""),
        "attempts": previous["attempts"] if previous else 0,
        "status": "failed",
        "due": None,
        "error": error.model_dump(mode="json"),
        "call_id": error.call_id or "",
    }
    if onward.route in ("replan", "escalate") and error.call_id:
        step.count(f"{onward.route}_needed")
        if item.exhausted is not None:  # why it never ran, as `_carry_out` records it
            answered["error"] = with_exhausted(error, item.exhausted).model_dump(mode="json")
        step.calls[slot] = {**answered, "status": onward.route}
        return
    step.count("gave_up")
    emit(
        Event(
            "gave_up",
            tool=error.tool,
            call_id=error.call_id,
            attempt=error.attempt,
            failure_class=error.failure_class.value,
            exhausted=item.exhausted,
        )
    )
    if error.call_id:
        step.calls[slot] = answered
    step.messages.append(error_message(error, exhausted=item.exhausted))


def _delta(batch: Batch, step: Step, executed: int) -> Tally:
    """The tally delta of one tools step."""
    seen = dict(batch.seen)
    for name, count in step.seen.items():
        seen[name] = seen.get(name, 0) + count
    task_delta: TaskTally = {
        "id": batch.task.get("id", ""),
        "tool_attempts": executed,
        "seen": seen,
        "failed": step.failed,
        "recent": batch.recent,
    }
    if batch.task.get("started_at") is None and executed:
        task_delta["started_at"] = batch.now
    known = step.tally.get("calls") or {}
    calls: dict[str, CallRecord] = {}
    done = step.done
    for slot, record in step.calls.items():
        if slot not in known and is_clean(record):
            done += 1  # the reducer would drop it: the ToolMessage is its answer
        else:
            calls[slot] = record
    delta: Tally = {
        "calls": calls,
        "task": task_delta,
        "tool_attempts": executed,
        "events": step.events,
    }
    if done:
        delta["done"] = {"ok": done}
        delta["message"] = message_slot(batch.ai, batch.ai_index)
    if step.gone:
        delta["gone"] = step.gone
    if step.informed:
        delta["informed"] = step.informed
    if step.held:
        delta["held"] = step.held
    return delta


def _record(
    call: ToolCall,
    key: str,
    *,
    attempts: int,
    previous: CallRecord | None,
    coercions: list[str] | None,
) -> CallRecord:
    """The call's record after one more execution; status and error are set by the caller.
    An ok record keeps the last failure it recovered from, for audit."""
    record: CallRecord = {
        **(previous or {}),  # type: ignore[typeddict-item]
        "tool": call["name"],
        "key": key,
        "attempts": attempts,
        "status": "scheduled",
        "due": None,
        "error": previous["error"] if previous else None,
        "call_id": call["id"] or "",
        "args": dict(call["args"]),
    }
    if coercions:
        record["coercions"] = [*(record.get("coercions") or []), *coercions]
    return record
