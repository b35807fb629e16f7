"""What a tool call is answered with: error envelopes, recovered results, raw outcomes.

The model reads every failure as a `ToolMessage(status="error")` whose content is
the `ToolError` envelope (`error_message`); a call that recovered carries its trail
in ``response_metadata["resilience"]``. A failure is classified once, where it is
caught (`tool_call._Verdict`), and travels to the step as `Raised`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from langchain_core.messages import ToolCall, ToolMessage
from langgraph.types import Command

from langgraph_resilience._graph.state import CallRecord
from langgraph_resilience.core.loops import LoopKind
from langgraph_resilience.core.profile import ToolProfile
from langgraph_resilience.core.redaction import mask_args, redact
from langgraph_resilience.core.validation import parsed_content
from langgraph_resilience.errors import ExhaustionReason, FailureClass, ToolError

__all__ = [
    "BreakerReport",
    "Raised",
    "budget_error",
    "call_id_error",
    "error_message",
    "invalid_call_error",
    "last_error",
    "loop_error",
    "split_output",
    "tool_error_of",
    "with_done_items",
    "with_trail",
]


@dataclasses.dataclass(frozen=True, slots=True)
class BreakerReport:
    """A failed attempt's outcome for its breaker, reported once the call leaves its tool."""

    key: str
    outcome: FailureClass
    duration: float


@dataclasses.dataclass(frozen=True, slots=True)
class Raised:
    """A tool's exception, carried from the interception to the step's finish (in the
    step's `CallOutcome`), never further."""

    error: BaseException
    envelope: ToolError
    """Its classification, made once, where it was caught."""
    executed: bool = True
    """False when the call was refused before reaching the tool (open breaker, full
    bulkhead): it spends no attempt."""
    unreported: BreakerReport | None = None
    """The failure the breaker has not heard of yet: a breaker counts logical calls, so
    an attempt that is retried on the same tool is not reported."""
    effect_key: str | None = None
    """A side effect's idempotency key, to remember once the agent is told its
    outcome is unknown."""


def with_exhausted(error: ToolError, exhausted: ExhaustionReason) -> ToolError:
    """The envelope, saying which budget or guard stopped the call."""
    return error.model_copy(update={"context": {**error.context, "exhausted": exhausted}})


def error_message(error: ToolError, *, exhausted: ExhaustionReason | None = None) -> ToolMessage:
    """The `ToolMessage` the model sees for a failure: content is the envelope JSON."""
    if exhausted is not None:
        error = with_exhausted(error, exhausted)
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


def with_done_items(
    message: ToolMessage, record: CallRecord, profile: ToolProfile | None
) -> ToolMessage:
    """A batch finished by redoing its failed items answers for the whole batch:
    `ToolProfile.merge_batches`, else ``{"succeeded_earlier": [...], "result": last}``."""
    done = record.get("done_items")
    if not done:
        return message
    final = parsed_content(message.content)
    if profile is not None and profile.merge_batches is not None:
        merged = profile.merge_batches(list(done), final)
    else:
        merged = {"succeeded_earlier": done, "result": final}
    content = merged if isinstance(merged, str) else json.dumps(merged, default=str)
    return message.model_copy(update={"content": content})


_TRAIL_KEYS = frozenset({"repairs", "trail", "coercions", "served_by", "tried"})


def with_trail(message: ToolMessage, record: CallRecord) -> ToolMessage:
    """Attach the recovery trail (repairs, coercions) to a successful ToolMessage."""
    if _TRAIL_KEYS.isdisjoint(record):  # a clean success: nothing to attach
        return message
    trail: dict[str, Any] = {
        k: v
        for k in ("repairs", "trail", "coercions", "served_by", "tried")
        if (v := record.get(k))
    }
    if not trail:
        return message
    if "trail" in trail:  # the failed attempts' arguments, shown: secret-named ones masked
        trail["trail"] = [{**entry, "args": mask_args(entry["args"])} for entry in trail["trail"]]
    trail["attempts"] = record["attempts"]
    metadata = {**message.response_metadata, "resilience": trail}
    update: dict[str, Any] = {"response_metadata": metadata}
    if message.artifact is None:
        update["artifact"] = {"resilience": trail}
    return message.model_copy(update=update)


def loop_error(call: ToolCall, key: str, kind: LoopKind, count: int) -> ToolError:
    """The envelope of a call that would close a loop: not executed."""
    what = (
        f"this exact call was already issued {count - 1} times"
        if kind == "repeat"
        else "the calls alternate between the same two requests"
    )
    message = (
        f"Loop detected: {what}; it was not executed. Change the approach "
        "or the arguments, or ask the user."
    )
    context = {"loop": kind, "call_key": key, "count": count}
    return _not_run(call, "LoopDetectedError", message, context, call_id=call["id"])


def last_error(record: CallRecord | None) -> ToolError | None:
    """The last failure a call's record holds, or None."""
    if record is None or record["error"] is None:
        return None
    return ToolError.model_validate(record["error"])


def call_id_error(call: ToolCall, count: int) -> ToolError:
    """The envelope of a call whose id is missing or shared with another call of its
    message: its answer could not be matched to it, so it is not run."""
    what = "has no id" if not call["id"] else f"shares its id with {count - 1} other call(s)"
    message = (
        f"this tool call {what} in the same message, so its answer could not be "
        "told apart; it was not executed. Issue each call with its own id."
    )
    context = {"call_id": call["id"] or None, "duplicates": count if call["id"] else 0}
    return _not_run(call, "InvalidCallId", message, context, call_id=call["id"] or None)


def _not_run(
    call: ToolCall,
    kind: str,
    message: str,
    context: dict[str, Any],
    *,
    call_id: str | None,
    failure_class: FailureClass = FailureClass.STRUCTURAL,
) -> ToolError:
    """The envelope of a call that was refused, not executed (never retried as is)."""
    return ToolError(
        type=kind,
        failure_class=failure_class,
        message=message,
        suggested_action="ask_human",
        retriable=False,
        tool=call["name"],
        call_id=call_id,
        context=context,
    )


def budget_error(call: ToolCall, exhausted: ExhaustionReason) -> ToolError:
    """The envelope of a call refused because a budget is spent."""
    message = f"the thread's {exhausted} budget is spent; the call was not executed"
    return _not_run(
        call,
        "BudgetExhausted",
        message,
        {"exhausted": exhausted},
        call_id=call["id"],
        failure_class=FailureClass.TRANSIENT,
    )


def invalid_call_error(invalid: Mapping[str, Any]) -> ToolError:
    """The envelope of a call whose arguments are not JSON."""
    return ToolError(
        type="InvalidToolCall",
        failure_class=FailureClass.SEMANTIC,
        message=f"the arguments are not valid JSON: {invalid.get('error') or 'unparseable'}",
        suggested_action="fix_args",
        retriable=False,
        tool=invalid.get("name") or "",
        call_id=invalid.get("id"),
        context={"args": redact(str(invalid.get("args") or ""), limit=200), "stage": "arguments"},
    )


def split_output(
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
