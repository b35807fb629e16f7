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
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any, Literal

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolCall, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.errors import GraphBubbleUp
from pydantic import BaseModel

from langgraph_resilience.core.classify import classify
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
from langgraph_resilience.graph.router import Next, next_step
from langgraph_resilience.graph.state import (
    PLAN_CALL_PREFIX,
    CallRecord,
    Ledger,
    TaskLedger,
    current_slots,
    current_task,
    read_ledger,
    read_messages,
    task_view,
)
from langgraph_resilience.graph.tools import error_message

__all__ = ["PLANNER_NAME", "PlanExecutorNode", "PlannerNode", "route_after_executor"]

PLANNER_NAME = "replanner"
"""The `name` of the AIMessages the executor issues, so nobody mistakes them for the agent's."""

BreakerStates = Callable[[], Mapping[str, str]]
"""Returns each tool's breaker state (closed / open / half_open) when breakers are on."""

_GOAL_MESSAGES = 5


def _goal(messages: list[AnyMessage]) -> str:
    asks = [m.text for m in messages if isinstance(m, HumanMessage)][-_GOAL_MESSAGES:]
    return "\n".join(asks) or "(no user message)"


class PlannerNode:
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

    def _context(self, state: Any) -> dict[str, Any]:
        ledger = read_ledger(state)
        calls = ledger.get("calls") or {}
        waiting = {
            slot: calls[slot]
            for slot in current_slots(state, self.messages_key)
            if slot in calls and calls[slot]["status"] == "replan"
        }
        failures = [
            ToolError.model_validate(envelope)
            for record in waiting.values()
            for envelope in [*record.get("tried_errors", []), record["error"]]
            if envelope
        ]
        history = [
            ToolError.model_validate(envelope)
            for record in calls.values()
            for envelope in [*record.get("tried_errors", []), record["error"]]
            if envelope
        ]
        structural = {
            e.tool for e in history if e.tool and e.failure_class is FailureClass.STRUCTURAL
        }
        failed_calls = {
            r["key"] for r in calls.values() if r["status"] != "ok" and r["error"] and r["key"]
        }
        done_effects = {
            r["key"]
            for r in calls.values()
            if r["status"] == "ok" and r["key"] and r["tool"] in self.side_effects
        }
        states = dict(self.breaker_states()) if self.breaker_states else {}
        previous = ledger.get("plan")
        rejected = previous if previous and previous.get("status") == "rejected" else None
        request = format_plan_request(
            goal=_goal(read_messages(state, self.messages_key)),
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
        messages = read_messages(state, self.messages_key)
        return {
            "ledger": ledger,
            "task": task_view(ledger, current_task(messages)),
            "waiting": waiting,
            "failures": failures,
            "structural": structural,
            "failed_calls": failed_calls,
            "done_effects": done_effects,
            "open": {tool for tool, s in states.items() if s == "open"},
            "request": request,
        }

    def _structured(self) -> Any:
        return self.model.with_structured_output(Plan, method="function_calling")

    def run(self, state: Any, config: RunnableConfig) -> dict[str, Any]:
        """Sync body of the node."""
        context = self._context(state)
        if not context["waiting"]:
            return {}
        try:
            reply: Any = self._structured().invoke(context["request"], config)
        except GraphBubbleUp:
            raise
        except Exception as exc:
            reply = exc
        return self._settle(context, reply)

    async def arun(self, state: Any, config: RunnableConfig) -> dict[str, Any]:
        """Async body of the node."""
        context = self._context(state)
        if not context["waiting"]:
            return {}
        try:
            reply: Any = await self._structured().ainvoke(context["request"], config)
        except GraphBubbleUp:
            raise
        except Exception as exc:
            reply = exc
        return self._settle(context, reply)

    def _verdict(self, context: dict[str, Any], reply: Any) -> tuple[Plan | None, PlanVerdict]:
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
            open_breakers=context["open"],
            structurally_failed=context["structural"],
            failed_calls=context["failed_calls"],
            done_effects=context["done_effects"],
            failures=context["failures"],
            max_steps=self.policy.max_plan_steps,
            noise_fields=self.policy.noise_fields,
        )
        return reply, verdict

    def _settle(self, context: dict[str, Any], reply: Any) -> dict[str, Any]:
        ledger: Ledger = context["ledger"]
        task: TaskLedger = context["task"]
        waiting: dict[str, CallRecord] = context["waiting"]
        plan, verdict = self._verdict(context, reply)
        plan_id = int(ledger.get("replans") or 0) + 1  # lifetime: plan ids never repeat
        replans = int(task.get("replans") or 0) + 1
        emit(
            Event(
                "plan_verdict",
                accepted=verdict.accepted,
                reasons=sorted(verdict.codes),
                steps=[s.tool for s in plan.steps] if plan else [],
                replan=replans,
            )
        )
        delta: Ledger = {
            "replans": 1,
            "llm_calls": 1,
            "task": {"id": task.get("id", ""), "replans": 1, "llm_calls": 1},
            "events": {"plan_accepted" if verdict.accepted else "plan_rejected": 1},
        }
        messages: list[AnyMessage] = []
        calls: dict[str, CallRecord] = {}
        if verdict.accepted and plan is not None:
            delta["plan"] = {
                "id": plan_id,
                "status": "running",
                "plan": plan.model_dump(mode="json"),
                "for_calls": [record.get("call_id") or slot for slot, record in waiting.items()],
                "issued": [],
                "done": [],
                "failed": [],
                "outputs": {},
            }
            for call_id, record in waiting.items():
                error = _replanned(ToolError.model_validate(record["error"]), plan)
                calls[call_id] = {**record, "status": "failed"}
                messages.append(error_message(error))
        else:
            delta["plan"] = {
                "id": plan_id,
                "status": "rejected",
                "plan": plan.model_dump(mode="json") if plan else None,
                "verdict": verdict.model_dump(mode="json"),
            }
            spent = int(task.get("llm_calls") or 0) + 1
            budget_left = (
                replans < self.policy.max_replans and spent < self.policy.max_recovery_llm_calls
            )
            for call_id, record in waiting.items():
                if budget_left:
                    calls[call_id] = record  # stays "replan": the planner tries again
                elif self.can_escalate:
                    calls[call_id] = {**record, "status": "escalate"}
                else:
                    calls[call_id] = {**record, "status": "failed"}
                    error = ToolError.model_validate(record["error"])
                    messages.append(error_message(error, exhausted="max_replans"))
        delta["calls"] = calls
        return {self.messages_key: messages, "resilience": delta}


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


class PlanExecutorNode:
    """Runs the accepted plan: records the last layer's results, issues the next layer."""

    def __init__(self, *, messages_key: str = "messages") -> None:
        self.messages_key = messages_key

    def run(self, state: Any, config: RunnableConfig) -> dict[str, Any]:
        """Sync body (no I/O of its own: the tools node executes the steps)."""
        return self.step(state)

    async def arun(self, state: Any, config: RunnableConfig) -> dict[str, Any]:
        """Async body."""
        return self.step(state)

    def step(self, state: Any) -> dict[str, Any]:
        """Advance the running plan by one layer (pure over the state)."""
        current = read_ledger(state).get("plan")
        if not current or current.get("status") != "running":
            return {}
        record = dict(current)
        plan = Plan.model_validate(record["plan"])
        done, failed = list(record["done"]), list(record["failed"])
        outputs = dict(record["outputs"])
        answers = {
            m.tool_call_id: m
            for m in read_messages(state, self.messages_key)
            if isinstance(m, ToolMessage)
        }
        prefix = f"{PLAN_CALL_PREFIX}{record['id']}-"
        for call_id in record["issued"]:
            step_id = call_id.removeprefix(prefix)
            message = answers.get(call_id)
            if message is None or step_id in done or step_id in failed:
                continue
            if message.status == "error":
                failed.append(step_id)
            else:
                done.append(step_id)
                outputs[step_id] = parsed_content(message.content)
        issue: list[ToolCall] = []
        status = plan_status(plan, done, failed)
        if status == "running":
            known = effective_outputs(plan, outputs, failed)
            for step in ready_steps(plan, done, failed):
                try:
                    args = resolve_args(step.args, known)
                except PlanError:
                    failed.append(step.id)
                    continue
                issue.append(
                    ToolCall(name=step.tool, args=args, id=prefix + step.id, type="tool_call")
                )
            if not issue:
                status = plan_status(plan, done, failed)
        record.update(
            status=status,
            done=done,
            failed=failed,
            outputs=outputs,
            issued=[*record["issued"], *(c["id"] for c in issue if c["id"])],
        )
        emit(Event("plan_step", plan=record["id"], status=status, issue=[c["name"] for c in issue]))
        messages: list[AnyMessage] = []
        if issue:
            messages.append(
                AIMessage(
                    content="",
                    name=PLANNER_NAME,
                    tool_calls=issue,
                    response_metadata={"resilience": {"plan": record["id"]}},
                )
            )
        return {self.messages_key: messages, "resilience": {"plan": record}}


def route_after_executor(state: Any, messages_key: str = "messages") -> Literal["tools"] | Next:
    """``tools`` when the executor issued a layer, else the common `next_step`."""
    messages = read_messages(state, messages_key)
    last = messages[-1] if messages else None
    if isinstance(last, AIMessage) and last.name == PLANNER_NAME and last.tool_calls:
        return "tools"
    return next_step(state, messages_key)
