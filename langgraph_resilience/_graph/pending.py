"""Every assistant tool call is answered before the model is called again.

OpenAI and Anthropic reject a history in which an assistant tool call has no
`ToolMessage` (a 400 on the next request). A run can leave one behind: the user
writes again instead of answering an escalation, a server cancels a run during a
backoff (double-texting), a crash loses the tools step. New input starts the graph
at ``START``, so `add_resilience` puts `AnswerPendingNode` there: it answers each
such call with an envelope saying what happened (``cancelled`` or ``abandoned``),
placed right after its assistant message, and finishes the calls' tally records,
as deepagents' PatchToolCalls middleware does for its agents.

A side effect is answered with what the idempotency ledger knows of it, never with
a guess: a run cancelled while the effect was on the wire (double-texting with
``interrupt``, a cancelled run) left its intent there. Recorded as done, the call is
answered with its result; still pending, with an UNKNOWN envelope (the agent is
told it may have happened, and an identical call it re-issues in the new task is
reconciled, not run); not in the ledger, it never started.

The scan is a pure function (`answer_pending`) over the history and what the
ledger said (`recorded_effects` reads it); on a clean thread it writes nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from langchain_core.messages import AIMessage, AnyMessage, ToolCall, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.types import Overwrite

from langgraph_resilience._graph.exactly_once import replayed
from langgraph_resilience._graph.node import ResilienceNode
from langgraph_resilience._graph.state import (
    CallRecord,
    Tally,
    call_slot,
    current_task,
    read_messages,
    read_tally,
)
from langgraph_resilience._graph.tools import error_message
from langgraph_resilience.core.clock import SystemClock
from langgraph_resilience.core.effects import IdempotencyRecord, idempotency_key
from langgraph_resilience.core.flow import Call, Flow, adrive, drive
from langgraph_resilience.errors import FailureClass, ToolError
from langgraph_resilience.events import Event, emit

if TYPE_CHECKING:
    from langgraph_resilience._graph.tools import GuardedToolNode

__all__ = ["AnswerPendingNode", "answer_pending", "recorded_effects", "route_entry"]

_NEVER_SLEEPS = SystemClock()

_WHY = {
    "escalate": (
        "abandoned",
        "the question to a human about this call was not answered: a new message "
        "arrived instead, so the call did not run",
    ),
    "scheduled": (
        "cancelled",
        "a retry of this call was waiting when the run stopped and a new message "
        "arrived; it was not run again",
    ),
}
_STOPPED = (
    "cancelled",
    "the run stopped before this call was answered and a new message arrived; it was not run",
)


def _envelope(call: Mapping[str, Any], record: CallRecord | None) -> ToolError:
    reason, text = _WHY.get(record["status"], _STOPPED) if record else _STOPPED
    last = ToolError.model_validate(record["error"]) if record and record["error"] else None
    return ToolError(
        type="CallCancelled" if reason == "cancelled" else "EscalationAbandoned",
        failure_class=last.failure_class if last else FailureClass.TRANSIENT,
        message=text + (f" (last error: {last.message})" if last else ""),
        suggested_action="ask_human" if reason == "abandoned" else "retry",
        retriable=False,
        tool=str(call.get("name") or ""),
        call_id=str(call.get("id") or ""),
        attempt=record["attempts"] if record else 0,
        context={reason: True, **({"last_error": last.type} if last else {})},
    )


def _unknown(call: Mapping[str, Any], record: IdempotencyRecord) -> ToolError:
    """The answer for a side effect the run left on the wire: it may have happened."""
    return ToolError(
        type="OutcomeUnknownError",
        failure_class=FailureClass.UNKNOWN,
        message=(
            "the run stopped while this call was running, and a new message arrived: it "
            "may have taken effect, and its outcome is unknown. It was not run again; "
            "check whether it took effect before asking for it again."
        ),
        suggested_action="query_status",
        retriable=False,
        tool=str(call.get("name") or ""),
        call_id=str(call.get("id") or ""),
        context={"cancelled": True, "idempotency_key": record.key},
    )


def _answered_before_next_ai(messages: Sequence[AnyMessage], ai_index: int) -> set[str]:
    """Tool-call ids answered after the assistant message at `ai_index`, up to the next."""
    answered: set[str] = set()
    for index in range(ai_index + 1, len(messages)):  # no slice: it would copy the rest
        message = messages[index]
        if isinstance(message, AIMessage):
            break
        if isinstance(message, ToolMessage):
            answered.add(message.tool_call_id)
    return answered


def unanswered(messages: Sequence[AnyMessage]) -> list[tuple[str, ToolCall]]:
    """Every tool call of the history without its answer, with its slot."""
    found: list[tuple[str, ToolCall]] = []
    for ai_index, message in enumerate(messages):
        if isinstance(message, AIMessage) and message.tool_calls:
            answered = _answered_before_next_ai(messages, ai_index)
            found += [
                (call_slot(message, ai_index, position), call)
                for position, call in enumerate(message.tool_calls)
                if call.get("id") and call["id"] not in answered
            ]
    return found


def recorded_effects(
    tools: GuardedToolNode | None, messages: Sequence[AnyMessage], config: RunnableConfig
) -> Flow[dict[str, IdempotencyRecord]]:
    """What the run's idempotency ledger holds of the unanswered side-effecting calls,
    by slot (the key the tools step claimed them under)."""
    if tools is None:
        return {}
    effects = [
        (slot, call)
        for slot, call in unanswered(messages)
        if (profile := tools.profiles.get(call["name"])) is not None and profile.side_effect
    ]
    if not effects:
        return {}
    resolver = tools.ledgers
    ledger = yield Call(resolver.resolve, resolver.aresolve, (config,))
    if ledger is None:
        return {}
    thread_id = str((config.get("configurable") or {}).get("thread_id", ""))
    store, noise = ledger.idempotency, tools.policy.noise_fields
    found: dict[str, IdempotencyRecord] = {}
    for slot, call in effects:
        key = idempotency_key(
            call["name"], call["args"], thread_id=thread_id, call_identity=slot, noise_fields=noise
        )
        record = yield Call(store.get, store.aget, (key,))
        if record is not None:
            found[slot] = record
    return found


@dataclasses.dataclass
class _Answers:
    """What `answer_pending` builds: the history, the finished records, the told effects."""

    task: str
    patched: list[AnyMessage] = dataclasses.field(default_factory=list)
    finished: dict[str, CallRecord] = dataclasses.field(default_factory=dict)
    informed: dict[str, str] = dataclasses.field(default_factory=dict)

    def answer(
        self, slot: str, call: Mapping[str, Any], record: CallRecord | None,
        effect: IdempotencyRecord | None,
    ) -> None:  # fmt: skip
        """One unanswered call: a side effect from its ledger record (its result, or
        UNKNOWN while it may still run), else the envelope of why it was not run."""
        if effect is not None and effect.status == "done":
            self.patched.append(replayed(call, effect.result, effect.key))  # type: ignore[arg-type]
            if record is not None:
                self.finished[slot] = {**record, "status": "ok", "due": None}
            return
        if effect is not None and effect.status == "pending":
            error = _unknown(call, effect)
            self.informed[effect.key] = self.task
        else:
            error = _envelope(call, record)
        self.patched.append(error_message(error))
        if record is not None:
            self.finished[slot] = {**record, "status": "failed", "due": None}
        reason = next(iter(error.context))
        emit(Event("call_cancelled", tool=error.tool, call_id=error.call_id, reason=reason))


def _pending_of(
    messages: Sequence[AnyMessage], message: AIMessage, ai_index: int
) -> list[tuple[str, Mapping[str, Any]]]:
    """The calls of one assistant message (valid and invalid) still without an answer."""
    answered = _answered_before_next_ai(messages, ai_index)
    pending: list[tuple[str, Mapping[str, Any]]] = [
        (call_slot(message, ai_index, position), call)
        for position, call in enumerate(message.tool_calls)
        if call.get("id") and call["id"] not in answered
    ]
    pending += [
        (call_slot(message, ai_index, position, invalid=True), bad)
        for position, bad in enumerate(message.invalid_tool_calls)
        if bad.get("id") and bad["id"] not in answered
    ]
    return pending


def answer_pending(
    messages: Sequence[AnyMessage],
    tally: Tally,
    recorded: Mapping[str, IdempotencyRecord] | None = None,
) -> tuple[list[AnyMessage], dict[str, CallRecord], dict[str, str]] | None:
    """The history with every unanswered tool call answered, the finished tally
    records and the unknown effects the agent is now told of (key -> the new task);
    None when every call already has its answer. `recorded`: the ledger's records of
    the unanswered side effects, by slot (`recorded_effects`)."""
    calls = tally.get("calls") or {}
    recorded = recorded or {}
    out = _Answers(task=current_task(messages))
    index = 0
    while index < len(messages):
        message = messages[index]
        out.patched.append(message)
        index += 1
        if not isinstance(message, AIMessage):
            continue
        ai_index = index - 1
        while index < len(messages) and isinstance(messages[index], ToolMessage):
            out.patched.append(messages[index])
            index += 1
        for slot, call in _pending_of(messages, message, ai_index):
            out.answer(slot, call, calls.get(slot), recorded.get(slot))
    if len(out.patched) == len(messages):
        return None
    return out.patched, out.finished, out.informed


def route_entry(state: Any, messages_key: str = "messages") -> Literal["pending", "go"]:
    """The graph's entry router: through `AnswerPendingNode` only when a stopped run
    left something to finish (an unanswered call, a running replan). A clean thread
    goes straight on: no extra step, and no checkpoint for it.

    Only the messages since the latest final answer (an assistant message without
    calls) are read, and the assistant message it follows: every call before that was
    answered before the model was asked, and a stopped run, a cancel or an abandoned
    escalation leaves its calls after it. The one exception is a final answer the model
    did not give, written right after calls left unanswered: an ``error_handler``'s
    reply to our failed step, a message put in with ``update_state``."""
    plan = read_tally(state).get("plan")
    if plan is not None and plan.get("status") == "running":
        return "pending"
    messages = read_messages(state, messages_key)
    for index in range(
        len(messages) - 1, -1, -1
    ):  # newest first: the turn's length, not the thread's
        message = messages[index]
        if not isinstance(message, AIMessage):
            continue
        if not (message.tool_calls or message.invalid_tool_calls):
            asked = _calls_before(messages, index)
            if asked is None or not _pending_of(messages, asked[1], asked[0]):
                return "go"  # a final answer given after every call before it
            return "pending"
        if _pending_of(messages, message, index):
            return "pending"
    return "go"


def _calls_before(messages: Sequence[AnyMessage], index: int) -> tuple[int, AIMessage] | None:
    """The assistant message with calls (and its index) that the final answer at `index`
    follows, past their answers and any other final answers; None when a message of
    another kind comes first (the user's: a turn of its own)."""
    for before in range(index - 1, -1, -1):
        message = messages[before]
        if isinstance(message, ToolMessage):
            continue
        if not isinstance(message, AIMessage):
            return None
        if message.tool_calls or message.invalid_tool_calls:
            return before, message
    return None


class AnswerPendingNode(ResilienceNode):
    """Runs at ``START``: answers the calls a stopped run left unanswered (`answer_pending`),
    and ends a replan that was running, so the new input starts from a valid history.
    With the graph's `tools` node, side effects are answered from its ledger."""

    def __init__(
        self, *, messages_key: str = "messages", tools: GuardedToolNode | None = None
    ) -> None:
        self.messages_key = messages_key
        self.tools = tools

    def run(self, state: Any, config: RunnableConfig) -> dict[str, Any]:
        """Sync body."""
        return drive(self._step(state, config), _NEVER_SLEEPS)

    async def arun(self, state: Any, config: RunnableConfig) -> dict[str, Any]:
        """Async body."""
        return await adrive(self._step(state, config), _NEVER_SLEEPS)

    def _step(self, state: Any, config: RunnableConfig) -> Flow[dict[str, Any]]:
        messages = read_messages(state, self.messages_key)
        recorded = yield from recorded_effects(self.tools, messages, config)
        return self.step(state, recorded)

    def step(
        self, state: Any, recorded: Mapping[str, IdempotencyRecord] | None = None
    ) -> dict[str, Any]:
        """The patched history (whole: calls are answered in place) and tally delta."""
        tally = read_tally(state)
        update: dict[str, Any] = {}
        delta: Tally = {}
        plan = tally.get("plan")
        if plan is not None and plan.get("status") == "running":
            delta["plan"] = {**plan, "status": "abandoned"}
        found = answer_pending(read_messages(state, self.messages_key), tally, recorded)
        if found is not None:
            messages, finished, informed = found
            update[self.messages_key] = Overwrite(messages)
            delta["calls"] = finished
            if informed:
                delta["informed"] = informed
            added = len(messages) - len(read_messages(state, self.messages_key))
            delta["events"] = {"call_cancelled": added}
        if delta:
            update["resilience"] = delta
        return update
