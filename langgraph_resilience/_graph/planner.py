"""The planner node and the plan executor: replanning as graph steps.

When a call cannot be recovered on its own path (STRUCTURAL, a loop, an
exhausted per-call budget), the planner asks ``planner_model`` for a `Plan`
(via ``with_structured_output``) and `verify`\\s it. An accepted plan answers the
failed call (its `ToolMessage` carries the envelope and the plan's diagnosis
and rationale) and the executor runs the plan's DAG layer by layer: each layer
is one `AIMessage` from the "replanner" whose tool calls go through the same
guarded tools node (classification, retry, repair, idempotency all apply),
independent steps in one super-step, every layer checkpointed. The agent then
sees the whole story in its message history and answers.

A rejected plan goes back to the planner with the verifier's reasons while the
replan budget (``policy.max_replans``) lasts; then the call escalates to a
human (when escalation is on) or returns to the agent with its envelope.

The planner's one model call is a `core.flow` flow, so its sync and async bodies
differ only in ``invoke``/``ainvoke``; the executor does no I/O at all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, Literal

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    HumanMessage,
    ToolCall,
    ToolMessage,
)
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.errors import GraphBubbleUp
from pydantic import BaseModel

from langgraph_resilience._graph import state as tally_state
from langgraph_resilience._graph.answers import tool_error_of
from langgraph_resilience._graph.node import ResilienceNode
from langgraph_resilience._graph.router import Next, next_step
from langgraph_resilience._graph.tools import error_message
from langgraph_resilience.core.canonical import call_key
from langgraph_resilience.core.classification import classify
from langgraph_resilience.core.clock import SystemClock
from langgraph_resilience.core.flow import Call, Flow, adrive, drive
from langgraph_resilience.core.plan import (
    Plan,
    PlanError,
    PlanVerdict,
    RejectionReason,
    effective_outputs,
    format_plan_request,
    plan_status,
    ready_steps,
    resolve_args,
    verify,
)
from langgraph_resilience.core.policy import ResiliencePolicy
from langgraph_resilience.core.redaction import redact
from langgraph_resilience.core.validation import parsed_content
from langgraph_resilience.errors import FailureClass, ToolError
from langgraph_resilience.events import Event, emit

__all__ = ["PLANNER_NAME", "PlanExecutorNode", "PlannerNode", "route_after_executor"]

PLANNER_NAME = "replanner"
"""The `name` of the AIMessages the executor issues, so nobody mistakes them for the agent's."""

BreakerStates = Callable[[], Mapping[str, str]]
"""Returns each tool's breaker state (closed / open / half_open) when breakers are on."""

_GOAL_MESSAGES = 5
_NO_SLEEP = SystemClock()  # the planner's flow never sleeps; the drivers want a clock


def _goal(messages: Sequence[AnyMessage]) -> str:
    asks = [m.text for m in messages if isinstance(m, HumanMessage)][-_GOAL_MESSAGES:]
    return "\n".join(asks) or "(no user message)"


def _envelopes(records: Collection[tally_state.CallRecord]) -> list[ToolError]:
    """Every envelope of `records`: the tools each call tried, then its last error."""
    return [
        ToolError.model_validate(envelope)
        for record in records
        for envelope in [*record.get("tried_errors", []), record["error"]]
        if envelope
    ]


@dataclasses.dataclass(frozen=True, slots=True)
class _TaskAnswers:
    """What the current task's answered calls say (the bounded tally no longer keeps
    their records): the keys of failed calls and of done side effects, the envelopes."""

    failed: frozenset[str]
    done_effects: frozenset[str]
    errors: tuple[ToolError, ...]


def _task_answers(
    messages: Sequence[AnyMessage], side_effects: Collection[str], noise: Collection[str]
) -> _TaskAnswers:
    start = next(
        (i for i in range(len(messages) - 1, -1, -1) if isinstance(messages[i], HumanMessage)),
        0,
    )
    issued: dict[str, tuple[str, dict[str, Any]]] = {}
    failed: set[str] = set()
    done: set[str] = set()
    errors: list[ToolError] = []
    for message in messages[start:]:
        if isinstance(message, AIMessage):
            issued.update({c["id"] or "": (c["name"], c["args"]) for c in message.tool_calls})
        elif isinstance(message, ToolMessage) and message.tool_call_id in issued:
            name, args = issued[message.tool_call_id]
            if message.status == "error":
                failed.add(call_key(name, args, noise_fields=noise))
                envelope = tool_error_of(message)
                if envelope is not None:
                    errors.append(envelope)
            elif name in side_effects:
                done.add(call_key(name, args, noise_fields=noise))
    return _TaskAnswers(frozenset(failed), frozenset(done), tuple(errors))


@dataclasses.dataclass(frozen=True, slots=True)
class _Replan:
    """What the planner read from the tally: the calls waiting for a plan, the task's
    spending so far, what a plan must avoid, and the request for the model."""

    waiting: dict[str, tally_state.CallRecord]
    task_id: str
    replans: int
    llm_calls: int
    plan_id: int
    """The next plan's id: lifetime, so plan ids never repeat."""
    failures: list[ToolError]
    structural: set[str]
    failed_calls: set[str]
    done_effects: set[str]
    open: set[str]
    request: list[BaseMessage]


class PlannerNode(ResilienceNode):
    """Asks ``model`` for a verified `Plan` around the calls waiting for a replan."""

    def __init__(
        self,
        *,
        model: BaseChatModel,
        tools_by_name: Mapping[str, BaseTool],
        policy: ResiliencePolicy,
        can_escalate: bool,
        breaker_states: BreakerStates | None = None,
        side_effects: Collection[str] = (),
        messages_key: str = "messages",
    ) -> None:
        self.model = model
        self.side_effects = frozenset(side_effects)
        self.tools_by_name = dict(tools_by_name)
        self.policy = policy
        self.can_escalate = can_escalate
        self.breaker_states = breaker_states
        self.messages_key = messages_key

    def _read(self, state: Any) -> _Replan | None:
        """The replan to ask for, or None when no call of the turn waits for one."""
        tally = tally_state.read_tally(state)
        calls = tally.get("calls") or {}
        waiting = {
            slot: calls[slot]
            for slot in tally_state.current_slots(state, self.messages_key)
            if slot in calls and calls[slot]["status"] == "replan"
        }
        if not waiting:
            return None
        messages = tally_state.read_messages(state, self.messages_key)
        task = tally_state.task_view(tally, tally_state.current_task(messages))
        failures = _envelopes(waiting.values())
        answered = _task_answers(messages, self.side_effects, self.policy.noise_fields)
        structural = {
            e.tool
            for e in [*_envelopes(calls.values()), *answered.errors]
            if e.tool and e.failure_class is FailureClass.STRUCTURAL
        }
        states = dict(self.breaker_states()) if self.breaker_states else {}
        previous = tally.get("plan")
        rejected = previous if previous and previous.get("status") == "rejected" else None
        request = format_plan_request(
            goal=_goal(messages),
            failures=failures,
            tools=list(self.tools_by_name.values()),
            breaker_states=states,
            structurally_failed=structural,
            rejected=PlanVerdict.model_validate(rejected["verdict"]) if rejected else None,
            rejected_plan=Plan.model_validate(rejected["plan"])
            if rejected and rejected.get("plan")
            else None,
            max_steps=self.policy.max_plan_steps,
            arguments={
                record.get("call_id") or slot: record.get("origin_args") or record.get("args") or {}
                for slot, record in waiting.items()
            },
        )
        return _Replan(
            waiting=waiting,
            task_id=task.get("id", ""),
            replans=int(task.get("replans") or 0),
            llm_calls=int(task.get("llm_calls") or 0),
            plan_id=int(tally.get("replans") or 0) + 1,
            failures=failures,
            structural=structural,
            failed_calls={
                r["key"] for r in calls.values() if r["status"] != "ok" and r["error"] and r["key"]
            }
            | answered.failed,
            done_effects={
                r["key"]
                for r in calls.values()
                if r["status"] == "ok" and r["key"] and r["tool"] in self.side_effects
            }
            | answered.done_effects,
            open={tool for tool, s in states.items() if s == "open"},
            request=request,
        )

    def _flow(self, state: Any, config: RunnableConfig) -> Flow[dict[str, Any]]:
        """Read the tally, ask the model once (an error is a rejected plan), finish."""
        replan = self._read(state)
        if replan is None:
            return {}
        structured = self.model.with_structured_output(Plan, method="function_calling")
        try:
            reply: Any = yield Call(
                structured.invoke, structured.ainvoke, args=(replan.request, config)
            )
        except GraphBubbleUp:
            raise
        except Exception as exc:
            reply = exc
        return self._finish(replan, reply)

    def run(self, state: Any, config: RunnableConfig) -> dict[str, Any]:
        """Sync body of the node."""
        return drive(self._flow(state, config), _NO_SLEEP)

    async def arun(self, state: Any, config: RunnableConfig) -> dict[str, Any]:
        """Async body of the node."""
        return await adrive(self._flow(state, config), _NO_SLEEP)

    def _verdict(self, replan: _Replan, reply: Any) -> tuple[Plan | None, PlanVerdict]:
        if not isinstance(reply, Plan):
            detail = (
                classify(reply).message
                if isinstance(reply, BaseException)
                else redact(repr(reply), limit=500)
            )
            reason = RejectionReason(
                code="empty_plan", message=f"the planner returned no valid Plan: {detail}"
            )
            return None, PlanVerdict(reasons=(reason,))
        verdict = verify(
            reply,
            known_tools={name: _schema(tool) for name, tool in self.tools_by_name.items()},
            open_breakers=replan.open,
            structurally_failed=replan.structural,
            failed_calls=replan.failed_calls,
            done_effects=replan.done_effects,
            failures=replan.failures,
            max_steps=self.policy.max_plan_steps,
            noise_fields=self.policy.noise_fields,
        )
        return reply, verdict

    def _finish(self, replan: _Replan, reply: Any) -> dict[str, Any]:
        """The tally delta and the messages of one planner answer."""
        plan, verdict = self._verdict(replan, reply)
        emit(
            Event(
                "plan_verdict",
                accepted=verdict.accepted,
                reasons=sorted(verdict.codes),
                steps=[s.tool for s in plan.steps] if plan else [],
                replan=replan.replans + 1,
            )
        )
        if verdict.accepted and plan is not None:
            record, calls, messages = _accept(replan, plan)
        else:
            record, calls, messages = self._reject(replan, plan, verdict)
        delta: tally_state.Tally = {
            "replans": 1,
            "llm_calls": 1,
            "task": {"id": replan.task_id, "replans": 1, "llm_calls": 1},
            "events": {"plan_accepted" if verdict.accepted else "plan_rejected": 1},
            "plan": record,
            "calls": calls,
        }
        return {self.messages_key: messages, "resilience": delta}

    def _reject(
        self, replan: _Replan, plan: Plan | None, verdict: PlanVerdict
    ) -> tuple[dict[str, Any], dict[str, tally_state.CallRecord], list[AnyMessage]]:
        """A rejected plan: the calls wait for another try while the budgets last, then
        escalate (when a human may decide) or go back to the agent with their envelopes."""
        record = {
            "id": replan.plan_id,
            "status": "rejected",
            "plan": plan.model_dump(mode="json") if plan else None,
            "verdict": verdict.model_dump(mode="json"),
        }
        budget_left = (
            replan.replans + 1 < self.policy.max_replans
            and replan.llm_calls + 1 < self.policy.max_recovery_llm_calls
        )
        calls: dict[str, tally_state.CallRecord] = {}
        messages: list[AnyMessage] = []
        for call_id, waiting in replan.waiting.items():
            if budget_left:
                calls[call_id] = waiting  # stays "replan": the planner tries again
            elif self.can_escalate:
                calls[call_id] = {**waiting, "status": "escalate"}
            else:
                calls[call_id] = {**waiting, "status": "failed"}
                error = ToolError.model_validate(waiting["error"])
                messages.append(error_message(error, exhausted="max_replans"))
        return record, calls, messages


def _accept(
    replan: _Replan, plan: Plan
) -> tuple[dict[str, Any], dict[str, tally_state.CallRecord], list[AnyMessage]]:
    """An accepted plan: it starts running, and answers every call it replaces."""
    record = {
        "id": replan.plan_id,
        "status": "running",
        "plan": plan.model_dump(mode="json"),
        "for_calls": [waiting.get("call_id") or slot for slot, waiting in replan.waiting.items()],
        "issued": [],
        "done": [],
        "failed": [],
        "outputs": {},
    }
    calls: dict[str, tally_state.CallRecord] = {}
    messages: list[AnyMessage] = []
    for call_id, waiting in replan.waiting.items():
        error = _replanned(ToolError.model_validate(waiting["error"]), plan)
        calls[call_id] = {**waiting, "status": "failed"}
        messages.append(error_message(error))
    return record, calls, messages


def _schema(tool: BaseTool) -> Any:
    """The schema the verifier checks a step's args against (pydantic v2 or JSON)."""
    schema = tool.tool_call_schema
    if isinstance(schema, dict) or (isinstance(schema, type) and issubclass(schema, BaseModel)):
        return schema
    return None


def _replanned(error: ToolError, plan: Plan) -> ToolError:
    """The failed call's envelope, telling the agent which verified plan replaces it."""
    summary = {
        "diagnosis": plan.diagnosis.model_dump(mode="json"),
        "rationale": plan.rationale,
        "steps": [f"{s.id}: {s.tool}" for s in plan.steps],
    }
    return error.model_copy(update={"context": {**error.context, "replanned": summary}})


# ------------------------------------------------------------------ the executor


def _record_answers(record: dict[str, Any], messages: Sequence[AnyMessage]) -> None:
    """Move each issued step whose `ToolMessage` arrived into ``done`` (with its output)
    or ``failed``."""
    answers = {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}
    steps = [step["id"] for step in record["plan"]["steps"]]
    done, failed, outputs = record["done"], record["failed"], record["outputs"]
    for call_id in record["issued"]:
        step_id = _step_of(call_id, record["id"], steps)
        message = answers.get(call_id)
        if message is None or step_id in done or step_id in failed:
            continue
        if message.status == "error":
            failed.append(step_id)
        else:
            done.append(step_id)
            outputs[step_id] = parsed_content(message.content)


def plan_call_id(plan_id: int, position: int) -> str:
    """The tool-call id of a plan's step, by its position: never the planner model's
    own step id, which may be long or hold any character, while providers accept
    ``[a-zA-Z0-9_-]`` and at most 40 characters (OpenAI, Anthropic).

    >>> plan_call_id(3, 12)
    'replan-3-12'
    """
    return f"{tally_state.PLAN_CALL_PREFIX}{plan_id}-{position}"


def _step_of(call_id: str, plan_id: int, steps: Sequence[str]) -> str:
    """The step a plan call id names (an id issued before ids were positions is the
    step's own id)."""
    tail = call_id.removeprefix(f"{tally_state.PLAN_CALL_PREFIX}{plan_id}-")
    return steps[int(tail)] if tail.isdigit() and int(tail) < len(steps) else tail


def _next_layer(record: dict[str, Any], plan: Plan) -> list[ToolCall]:
    """The calls of the steps ready now; a step whose references do not resolve fails."""
    done, failed = record["done"], record["failed"]
    known = effective_outputs(plan, record["outputs"], failed)
    issue: list[ToolCall] = []
    positions = {step.id: index for index, step in enumerate(plan.steps)}
    for step in ready_steps(plan, done, failed):
        try:
            args = resolve_args(step.args, known)
        except PlanError:
            failed.append(step.id)
            continue
        call_id = plan_call_id(record["id"], positions[step.id])
        issue.append(ToolCall(name=step.tool, args=args, id=call_id, type="tool_call"))
    return issue


def advance_plan(state: Any, messages_key: str = "messages") -> dict[str, Any]:
    """Advance the running plan by one layer: record the last layer's results, issue
    the next (pure over the state; the tools node executes the steps)."""
    current = tally_state.read_tally(state).get("plan")
    if not current or current.get("status") != "running":
        return {}
    record = {
        **current,
        "done": list(current["done"]),
        "failed": list(current["failed"]),
        "outputs": dict(current["outputs"]),
    }
    plan = Plan.model_validate(record["plan"])
    _record_answers(record, tally_state.read_messages(state, messages_key))
    issue: list[ToolCall] = []
    status = plan_status(plan, record["done"], record["failed"])
    if status == "running":
        issue = _next_layer(record, plan)
        if not issue:
            status = plan_status(plan, record["done"], record["failed"])
    record.update(status=status, issued=[*record["issued"], *(c["id"] for c in issue if c["id"])])
    emit(Event("plan_step", plan=record["id"], status=status, issue=[c["name"] for c in issue]))
    messages: list[AnyMessage] = []
    if issue:
        metadata = {"resilience": {"plan": record["id"]}}
        messages.append(
            AIMessage(content="", name=PLANNER_NAME, tool_calls=issue, response_metadata=metadata)
        )
    return {messages_key: messages, "resilience": {"plan": record}}


class PlanExecutorNode(ResilienceNode):
    """Runs the accepted plan: records the last layer's results, issues the next layer."""

    def __init__(self, *, messages_key: str = "messages") -> None:
        self.messages_key = messages_key

    def run(self, state: Any, config: RunnableConfig) -> dict[str, Any]:
        """Sync body: `advance_plan` (no I/O of its own)."""
        return advance_plan(state, self.messages_key)

    async def arun(self, state: Any, config: RunnableConfig) -> dict[str, Any]:
        """Async body: the same pure step."""
        return self.run(state, config)


def route_after_executor(state: Any, messages_key: str = "messages") -> Literal["tools"] | Next:
    """``tools`` when the executor issued a layer, else the common `next_step`."""
    messages = tally_state.read_messages(state, messages_key)
    last = messages[-1] if messages else None
    if isinstance(last, AIMessage) and last.name == PLANNER_NAME and last.tool_calls:
        return "tools"
    return next_step(state, messages_key)
