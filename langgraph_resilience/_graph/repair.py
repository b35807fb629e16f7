"""Reflection repair: the model re-issues a SEMANTIC failure's call, seeing the error.

A blind retry replays the same bad arguments; reflection hands the model the
structured `ToolError` (with its ``suggested_action``, e.g. ``fix_arg:currency``)
and binds exactly the failing tool, so the reply is a corrected call. Repair
can loop too, so it is bounded: at most ``policy.max_repair`` repairs per
original call (MAX_REPAIR), and every repair LLM call counts against the
task's ``max_recovery_llm_calls``. Both counters live in the checkpointed
tally, so a resume cannot reset them. A repair that proposes arguments
identical to an already failed attempt is rejected without executing.

The corrected call keeps the original ``tool_call_id``: the tools node runs it
next and its `ToolMessage` answers the call the agent made, with the repair
trail in ``response_metadata["resilience"]`` (and in the artifact when the
tool has none of its own).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
)
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.errors import GraphBubbleUp

from langgraph_resilience._graph.node import ResilienceNode
from langgraph_resilience._graph.state import (
    CallRecord,
    Tally,
    TaskTally,
    current_slots,
    current_task,
    read_messages,
    read_tally,
    task_view,
)
from langgraph_resilience._graph.tools import error_message
from langgraph_resilience.core.canonical import call_key
from langgraph_resilience.core.classification import classify
from langgraph_resilience.core.clock import SystemClock
from langgraph_resilience.core.flow import Call, Flow, adrive, drive
from langgraph_resilience.core.policy import ResiliencePolicy
from langgraph_resilience.core.redaction import mask_args, redact, redact_value, unmask_args
from langgraph_resilience.errors import ExhaustionReason, ToolError
from langgraph_resilience.events import Event, emit

__all__ = ["REPAIR_SYSTEM_PROMPT", "RepairNode", "RepairOutcome", "repair_prompt"]

REPAIR_SYSTEM_PROMPT = (
    "You repair one failed tool call. Call the tool `{tool}` again with corrected "
    "arguments. The error envelope says what was wrong; its suggested_action names the "
    "argument to fix when it is known (fix_arg:<name>). Change only what the error "
    "requires, keep every other argument as it was, and never invent a value the user "
    "did not provide."
)

RepairOutcome = Literal["reissued", "identical", "no_tool_call", "model_error", "no_budget"]

_CONTEXT_MESSAGES = 3


def repair_prompt(
    messages: Sequence[AnyMessage], tool: BaseTool, record: CallRecord, error: ToolError
) -> list[BaseMessage]:
    """The repair request: the user's recent requests, the failed call and its envelope.

    Only human turns are quoted: the pending `AIMessage` has unanswered tool
    calls, which most providers reject as input. Nothing in it carries a secret:
    the arguments are shown through `mask_args` (``"password": "[REDACTED]"``; a
    repair that sends a masked value back keeps the real one, see `unmask_args`),
    the user's words and the envelope are redacted.
    """
    requests = [m for m in messages if isinstance(m, HumanMessage)][-_CONTEXT_MESSAGES:]
    context = "\n".join(f"- {redact(m.text, limit=None)}" for m in requests)
    previous = [
        f"- {_shown_args(entry['args'])} failed: {redact(str(entry['error'].get('message', '')))}"
        for entry in record.get("trail") or []
    ]
    envelope = redact_value(error.model_dump(mode="json", exclude_none=True))
    parts = [
        f"The user asked:\n{context or '- (no user message)'}",
        f"Failed call: {tool.name}({_shown_args(record.get('args', {}))})",
        f"Error envelope: {json.dumps(envelope, ensure_ascii=False, separators=(',', ':'))}",
    ]
    if previous:
        parts.append("Earlier attempts that also failed:\n" + "\n".join(previous))
    return [
        SystemMessage(REPAIR_SYSTEM_PROMPT.format(tool=tool.name)),
        HumanMessage("\n\n".join(parts)),
    ]


_NEVER_WAITS = SystemClock()
"""The drivers' clock: asking for repairs never sleeps."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Request:
    slot: str
    call_id: str
    record: CallRecord
    tool: BaseTool
    error: ToolError
    prompt: list[BaseMessage]


class RepairNode(ResilienceNode):
    """Asks `model` to re-issue each call of the turn that waits for repair."""

    def __init__(
        self,
        *,
        model: BaseChatModel,
        tools_by_name: Mapping[str, BaseTool],
        policy: ResiliencePolicy | None = None,
        messages_key: str = "messages",
    ) -> None:
        self.model = model
        self.tools_by_name = dict(tools_by_name)
        self.policy = policy or ResiliencePolicy()
        self.messages_key = messages_key

    def _requests(self, state: Any) -> tuple[list[_Request], int]:
        tally = read_tally(state)
        calls = tally.get("calls") or {}
        messages = read_messages(state, self.messages_key)
        requests = []
        for slot in current_slots(state, self.messages_key):
            record = calls.get(slot)
            if record is None or record["status"] != "repair" or record["error"] is None:
                continue
            tool = self.tools_by_name[record["tool"]]
            error = ToolError.model_validate(record["error"])
            prompt = repair_prompt(messages, tool, record, error)
            call_id = record.get("call_id") or error.call_id or ""
            requests.append(_Request(slot, call_id, record, tool, error, prompt))
        spent = int(_task(state, self.messages_key).get("llm_calls") or 0)
        return requests, self.policy.max_recovery_llm_calls - spent

    def _bound(self, tool: BaseTool) -> Any:
        return self.model.bind_tools([tool], tool_choice=tool.name)

    def run(self, state: Any, config: RunnableConfig) -> dict[str, Any]:
        """Sync body of the node."""
        requests, budget = self._requests(state)
        replies = drive(self._ask(requests, budget, config), _NEVER_WAITS)
        return self._finish(state, requests, replies)

    async def arun(self, state: Any, config: RunnableConfig) -> dict[str, Any]:
        """Async body of the node."""
        requests, budget = self._requests(state)
        replies = await adrive(self._ask(requests, budget, config), _NEVER_WAITS)
        return self._finish(state, requests, replies)

    def _ask(
        self, requests: list[_Request], budget: int, config: RunnableConfig
    ) -> Flow[list[AIMessage | BaseException | None]]:
        """Ask the model for each call's repair while the LLM budget lasts (None: no
        budget left); a failed request is its exception, an interrupt propagates."""
        replies: list[AIMessage | BaseException | None] = []
        for request in requests:
            if budget <= 0:
                replies.append(None)
                continue
            budget -= 1
            emit(Event("repair_requested", tool=request.tool.name, call_id=request.call_id))
            bound = self._bound(request.tool)
            try:
                replies.append((yield Call(bound.invoke, bound.ainvoke, (request.prompt, config))))
            except GraphBubbleUp:
                raise
            except Exception as exc:
                replies.append(exc)
        return replies

    def _finish(
        self,
        state: Any,
        requests: list[_Request],
        replies: list[AIMessage | BaseException | None],
    ) -> dict[str, Any]:
        """Turn each reply into the call's next state: run the new arguments, repair
        again, or give up with the envelope."""
        calls: dict[str, CallRecord] = {}
        messages: list[AnyMessage] = []
        seen: dict[str, int] = {}
        events: dict[str, int] = {}
        llm_calls = 0
        for request, reply in zip(requests, replies, strict=True):
            record: CallRecord = dict(request.record)  # type: ignore[assignment]
            if reply is not None:
                llm_calls += 1
            outcome, error, new_args = self._read(request, record, reply, seen)
            events[outcome] = events.get(outcome, 0) + 1
            emit(
                Event(
                    "repair_outcome",
                    tool=request.tool.name,
                    call_id=request.call_id,
                    outcome=outcome,
                    repairs=record.get("repairs", 0),
                )
            )
            if outcome == "reissued" and new_args is not None:
                self._rerun(request, record, new_args, error)
            else:
                exhausted = self._exhausted(record, llm_calls, state)
                if exhausted is None:
                    record["status"] = "repair"
                else:
                    record["status"] = "failed"
                    messages.append(error_message(error, exhausted=exhausted))
            calls[request.slot] = record
        task_id = current_task(read_messages(state, self.messages_key))
        delta: Tally = {
            "calls": calls,
            "llm_calls": llm_calls,
            "task": {"id": task_id, "llm_calls": llm_calls, "seen": seen},
            "events": {f"repair_{k}": v for k, v in events.items()},
        }
        return {self.messages_key: messages, "resilience": delta}

    def _read(
        self,
        request: _Request,
        record: CallRecord,
        reply: AIMessage | BaseException | None,
        seen: dict[str, int],
    ) -> tuple[RepairOutcome, ToolError, dict[str, Any] | None]:
        """What one reply amounts to: its outcome, the envelope to answer with if it
        fails, and the new arguments it proposes (counting the repair it spent)."""
        error = request.error
        if reply is None:
            return "no_budget", error, None
        record["repairs"] = record.get("repairs", 0) + 1
        if isinstance(reply, BaseException):
            context = {**error.context, "repair_error": classify(reply).message}
            return "model_error", error.model_copy(update={"context": context}), None
        if not isinstance(reply, AIMessage) or not reply.tool_calls:
            return "no_tool_call", error, None
        # a masked value sent back ("password": "[REDACTED]") keeps the real one
        new_args = unmask_args(reply.tool_calls[0]["args"], record.get("args", {}))
        return self._judge(request, record, new_args, seen), error, new_args

    def _rerun(
        self, request: _Request, record: CallRecord, new_args: dict[str, Any], error: ToolError
    ) -> None:
        """Schedule the call again at once with the repaired arguments, keeping a trail."""
        record["trail"] = [
            *(record.get("trail") or []),
            {"args": record.get("args", {}), "error": _summary(error)},
        ]
        record["args"] = new_args
        record["key"] = call_key(request.tool.name, new_args, noise_fields=self.policy.noise_fields)
        record["status"] = "scheduled"
        record["due"] = None  # run at once: next_step routes straight to tools

    def _judge(
        self,
        request: _Request,
        record: CallRecord,
        new_args: dict[str, Any],
        seen: dict[str, int],
    ) -> RepairOutcome:
        """Reject a repair that proposes arguments already tried and failed."""
        noise = self.policy.noise_fields
        new_key = call_key(request.tool.name, new_args, noise_fields=noise)
        seen[new_key] = seen.get(new_key, 0) + 1  # a repair is an issued call: loops count it
        failed = {record["key"]} | {
            call_key(request.tool.name, entry["args"], noise_fields=noise)
            for entry in record.get("trail") or []
        }
        return "identical" if new_key in failed else "reissued"

    def _exhausted(self, record: CallRecord, llm_calls: int, state: Any) -> ExhaustionReason | None:
        if record.get("repairs", 0) >= self.policy.max_repair:
            return "max_repair"
        spent = int(_task(state, self.messages_key).get("llm_calls") or 0) + llm_calls
        if spent >= self.policy.max_recovery_llm_calls:
            return "max_recovery_llm_calls"
        return None


def _shown_args(args: Any) -> str:
    """A call's arguments as the repair model sees them: secret-named ones masked."""
    shown = mask_args(args) if isinstance(args, Mapping) else redact_value(args)
    return json.dumps(shown, sort_keys=True, default=str)


def _task(state: Any, messages_key: str) -> TaskTally:
    """The current task's view of the tally."""
    return task_view(read_tally(state), current_task(read_messages(state, messages_key)))


def _summary(error: ToolError) -> dict[str, Any]:
    return {
        "type": error.type,
        "failure_class": error.failure_class.value,
        "message": error.message,
        "suggested_action": error.suggested_action,
    }
