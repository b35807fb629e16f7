"""The planner's prompt: the verifier's rules, the goal, the failures and the tools.

Everything the prompt shows from the thread is redacted again here (envelopes,
arguments through `mask_args`, the rejected plan), whatever the caller did.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from typing import Any, TypeAlias

from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import BaseModel

from langgraph_resilience.core.plan.model import DEFAULT_MAX_STEPS, Plan
from langgraph_resilience.core.plan.verify import MIN_CONTENT_WORDS, PlanVerdict
from langgraph_resilience.core.redaction import mask_args, redact, redact_value
from langgraph_resilience.errors import FailureClass, ToolError

__all__ = ["format_plan_request"]

_PLANNER_SYSTEM = """\
You repair a tool-calling agent's task after a tool failure. Answer with a Plan: a \
small DAG of tool calls that reaches the user's goal by a path that avoids the failure, \
a diagnosis of why the old path failed and a rationale for why the new one avoids it.

A verifier rejects any plan that breaks one of these rules:
1. diagnosis.failed_tool is a tool that failed, diagnosis.failure_class the class its \
error reports, and diagnosis.cause the concrete evidence (status, message, missing \
field, removed endpoint) in at least {min_words} informative words. "Something went \
wrong" or "try again" is not a cause.
2. The rationale says why the new steps avoid the failure, names the tools they use and \
has at least {min_words} informative words.
3. Use only tools listed as available. Never a tool marked unavailable (breaker open or \
failed structurally), never a failed call again with the same arguments.
4. At most {max_steps} steps; unique step ids of letters, digits, '_' or '-'; no cycles; \
no two steps with the same tool and arguments.
5. To pass an earlier step's output, make an argument value exactly \
"$steps.<id>.output", or "$steps.<id>.output.<key>" (keys and list indices separated by \
dots), or write "{{$steps.<id>.output.<key>}}" inside a longer string. List every \
referenced step in depends_on. Nothing else is evaluated.
6. fallback names a step that runs only if this step fails; its output then stands in \
for this step's. A step is the fallback of at most one step, and no step lists a \
fallback step in depends_on (depend on the step it stands in for).
7. Arguments must match the tool's parameters schema.\
"""

AnyTool: TypeAlias = BaseTool | Mapping[str, Any] | type[BaseModel]
"""Anything `convert_to_openai_tool` accepts."""


def _tool_spec(tool: AnyTool) -> dict[str, Any]:
    spec = convert_to_openai_tool(tool)
    function = spec.get("function", spec)
    return {
        "name": function.get("name"),
        "description": function.get("description", ""),
        "parameters": function.get("parameters", {}),
    }


def _json_block(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, indent=2, sort_keys=True, default=str)
    return f"```json\n{text}\n```"


def _listed_tools(
    tools: Sequence[AnyTool], states: Mapping[str, str], structural: Collection[str]
) -> list[dict[str, Any]]:
    """Each tool's spec with its breaker state, and why it is unavailable when it is."""
    listed: list[dict[str, Any]] = []
    for tool in tools:
        spec = _tool_spec(tool)
        name = str(spec["name"])
        spec["breaker"] = states.get(name, "closed")
        unavailable = [
            why
            for why, applies in (
                ("circuit breaker open", spec["breaker"] == "open"),
                ("failed structurally in this thread", name in structural),
            )
            if applies
        ]
        spec["available"] = not unavailable
        if unavailable:
            spec["unavailable_because"] = "; ".join(unavailable)
        listed.append(spec)
    return listed


def _envelopes(
    failures: Sequence[ToolError], arguments: Mapping[str, Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The failures as redacted JSON, each with the masked arguments it failed with."""
    envelopes: list[dict[str, Any]] = []
    for error in failures:
        envelope = redact_value(error.model_dump(mode="json", exclude_none=True))
        args = arguments.get(str(envelope.get("call_id") or ""))
        if args is not None:
            envelope["arguments"] = mask_args(args)
        envelopes.append(envelope)
    return envelopes


def _rejection(rejected: PlanVerdict, rejected_plan: Plan | None) -> str:
    lines = [f"- [{r.code}] {redact(r.message, limit=None)}" for r in rejected.reasons]
    text = "## Your previous plan was rejected\n" + "\n".join(lines)
    if rejected_plan is not None:
        shown = redact_value(rejected_plan.model_dump(mode="json"))  # args as mask_args
        text += "\n\nThe rejected plan:\n" + redact(_json_block(shown), limit=None)
    return text + "\n\nFix every reason above."


def format_plan_request(
    *,
    goal: str,
    failures: Sequence[ToolError],
    tools: Sequence[AnyTool],
    breaker_states: Mapping[str, str] | None = None,
    structurally_failed: Collection[str] = (),
    rejected: PlanVerdict | None = None,
    rejected_plan: Plan | None = None,
    max_steps: int = DEFAULT_MAX_STEPS,
    arguments: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[BaseMessage]:
    """Build the planner's prompt: a `SystemMessage` with the rules, a `HumanMessage` with
    the goal, the failures, the tools and the previous rejection.

    `goal` is the conversation as text (shown redacted), `failures` the (already
    redacted) envelopes, shown as JSON and redacted again. `arguments` maps a failed
    call's id to the arguments it failed with, shown next to its envelope through
    `mask_args` (secret-named fields at any depth ``[REDACTED]``, strings scrubbed), so
    the planner knows what not to repeat and which values a new path needs; the
    rejected plan's arguments and the verifier's reasons are shown the same way.
    `tools` are anything
    `convert_to_openai_tool` accepts; `breaker_states` maps a tool to
    ``closed``/``open``/``half_open``. A tool with an open breaker or a
    structural failure is listed as unavailable. `rejected` (and
    `rejected_plan`) turn the verifier's reasons into feedback for one retry.

    >>> msgs = format_plan_request(goal="weather in Paris", failures=[], tools=[])
    >>> [m.type for m in msgs]
    ['system', 'human']
    """
    structural = set(structurally_failed) | {
        e.tool for e in failures if e.tool and e.failure_class is FailureClass.STRUCTURAL
    }
    listed = _listed_tools(tools, dict(breaker_states or {}), structural)
    envelopes = _envelopes(failures, arguments or {})
    sections = [
        "## Goal\n" + (redact(goal.strip(), limit=None) or "(no conversation given)"),
        "## Failed calls (error envelopes)\n" + redact(_json_block(envelopes), limit=None),
        "## Tools\n" + _json_block(listed),
    ]
    if rejected is not None and rejected.reasons:
        sections.append(_rejection(rejected, rejected_plan))
    sections.append("Answer with a Plan.")
    system = _PLANNER_SYSTEM.format(min_words=MIN_CONTENT_WORDS, max_steps=max_steps)
    return [SystemMessage(content=system), HumanMessage(content="\n\n".join(sections))]
