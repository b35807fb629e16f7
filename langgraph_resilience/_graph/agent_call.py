"""One tool call as a whole tools step: how `create_agent` runs each call.

`create_agent` sends each tool call of a model turn to its tools node as a task of
its own, so `ResilienceMiddleware.wrap_tool_call` makes each one a tools step of
its own: `GuardedToolNode`'s planning (`plan_batch`, cut to this call by
`Batch.only`), its interception (breakers, exactly-once, one classification) with
the agent's handler as the executor, and `finish_step`; a short backoff is retried
inside the step (`inline_retry`), as in the node. The update carries the call's
answer, or none while it waits for a recovery (its tally record says which). A turn
`create_agent` ends after its tools (every call ``return_direct``, or a structured
response) is a last step (`ToolSettings.last_step`): nothing waits for a later one.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from langchain_core.messages import ToolMessage
from langchain_core.tools import BaseTool
from langgraph.prebuilt.tool_node import ToolCallRequest, ToolInvocationError
from langgraph.types import Command
from pydantic import BaseModel, ValidationError

from langgraph_resilience._graph.finish import finish_step
from langgraph_resilience._graph.inline_retry import retried_in_step
from langgraph_resilience._graph.run_lease import counted_step
from langgraph_resilience._graph.scope import in_step, step_ledger
from langgraph_resilience._graph.state import last_ai_message, read_messages
from langgraph_resilience._graph.tool_batch import Batch, ToolSettings, plan_batch
from langgraph_resilience._graph.tools import GuardedToolNode
from langgraph_resilience.core.flow import Call, Flow, adrive, drive

__all__ = ["acall_step", "call_step"]

Answer = ToolMessage | Command[Any]


def call_step(
    node: GuardedToolNode, request: ToolCallRequest, execute: Callable[..., Any]
) -> Command[Any]:
    """One tool call as a whole tools step (how `create_agent` runs each call, as its own
    task): the same planning, interception and finish as the node, for this call
    only. The update carries the call's answer, or none while it waits for a recovery."""
    last = _last_step(node, request)
    with counted_step(request.runtime.config, leases=node.has_side_effects, ends_run=last):
        return drive(_step(node, request, execute, last), node.clock)


async def acall_step(
    node: GuardedToolNode, request: ToolCallRequest, execute: Callable[..., Awaitable[Any]]
) -> Command[Any]:
    """Async `call_step`."""
    last = _last_step(node, request)
    with counted_step(request.runtime.config, leases=node.has_side_effects, ends_run=last):
        return await adrive(_step(node, request, execute, last), node.clock)


def _last_step(node: GuardedToolNode, request: ToolCallRequest) -> bool:
    """Meet the call's tool; whether the run ends after this turn's tools (its lease of
    the thread then goes back once the turn's last call is done)."""
    if request.tool is not None:
        node.learn([request.tool])
    return _ends_after_tools(node, request)


def _step(
    node: GuardedToolNode, request: ToolCallRequest, execute: Callable[..., Any], last: bool
) -> Flow[Command[Any]]:
    """The step as one `core.flow` flow; `execute` is the handler of the driver's kind. A
    short backoff is retried inside it (`inline_retry`): the call is answered in this
    task, without a round through ``before_model``."""
    settings = node.settings
    if last:
        settings = dataclasses.replace(
            settings, can_repair=False, can_replan=False, can_escalate=False, last_step=True
        )
    once = functools.partial(_once, node, settings, request, execute)
    return _as_command((yield from retried_in_step(settings, request.state, once)))


def _ends_after_tools(node: GuardedToolNode, request: ToolCallRequest) -> bool:
    """Whether `create_agent` ends the run after this turn's tools, so ``before_model``
    never comes back for a call left waiting (its own two rules): every call of the
    turn names a tool of the agent's that returns directly (``return_direct``), or the
    turn holds a structured response (a call naming none of its tools, answered, before
    any tool ran, by the model step: ``response_format=ToolStrategy(...)``)."""
    messages = read_messages(request.state, node.messages_key)
    found = last_ai_message(messages)
    if found is None:
        return False
    index, ai = found
    tools = {call["name"]: _agent_tool(node, request, call["name"]) for call in ai.tool_calls}
    known = [tool for tool in tools.values() if tool is not None]
    if known and all(tool.return_direct for tool in known):
        return True
    return any(
        isinstance(message, ToolMessage)
        and message.status != "error"
        and message.name in tools
        and tools[message.name] is None
        for message in messages[index + 1 :]
    )


def _once(
    node: GuardedToolNode,
    settings: ToolSettings,
    request: ToolCallRequest,
    execute: Callable[..., Any],
    state: Any,
) -> Flow[Any]:
    """One run of the call's step on `state`: plan, intercept, finish, report."""
    batch = _one(settings, request, state)
    if batch is None:
        return None
    output: Any = {}
    outcomes = None
    if batch.runnable:
        routed = _routed(node, request, batch)
        ledger, fence = yield from step_ledger(node.ledgers, request.runtime.config)
        with in_step(batch, ledger, fence) as scope:
            answer = yield Call(
                functools.partial(node.wrap_tool_call, routed, _raising(execute)),
                functools.partial(node.awrap_tool_call, routed, _araising(execute)),
            )
        output, outcomes = _as_output(node, answer), scope.outcomes
    update, reports = finish_step(settings, state, batch, output, outcomes)
    yield from node.guards.reports(reports)
    return update


def _raising(execute: Callable[..., Any]) -> Callable[..., Any]:
    """`execute` that raises the `ToolInvocationError` which `create_agent`'s ToolNode
    turns into an error message (its default ``handle_tool_errors``), so rejected
    arguments are coerced and classified as under `GuardedToolNode`."""

    def run(request: ToolCallRequest) -> Any:
        return _rejected(request, execute(request))

    return run


def _araising(execute: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """Async `_raising`."""

    async def run(request: ToolCallRequest) -> Any:
        return _rejected(request, await execute(request))

    return run


def _rejected(request: ToolCallRequest, result: Any) -> Any:
    """Raise for an error answer whose arguments the tool's schema rejects; else pass
    `result` on. Only error answers are checked: a clean call pays nothing."""
    if not (isinstance(result, ToolMessage) and result.status == "error") or result.artifact:
        return result
    schema = getattr(request.tool, "tool_call_schema", None)
    if not (isinstance(schema, type) and issubclass(schema, BaseModel)):
        return result
    call = request.tool_call
    try:
        schema.model_validate(call["args"])
    except ValidationError as exc:
        raise ToolInvocationError(call["name"], exc, call["args"]) from exc
    return result


def _one(settings: ToolSettings, request: ToolCallRequest, state: Any) -> Batch | None:
    call_id = request.tool_call["id"] or ""
    batch = plan_batch(settings, state, upto=call_id or None)
    if batch is None:
        return None
    batch = batch.only(call_id)
    return batch if batch.runnable or batch.preflight else None


def _routed(node: GuardedToolNode, request: ToolCallRequest, batch: Batch) -> ToolCallRequest:
    """The request for the call in force: a retry's repaired or edited arguments, or the
    fallback that now serves it. The tool is always the agent's own (the request's, or
    its ToolNode's for a fallback): one middleware may serve several agents, or an agent
    rebuilt per request with its user's tools, whose tools share names."""
    call = batch.runnable[0]
    if call["name"] == request.tool_call["name"]:
        tool = request.tool
    else:
        tool = _agent_tool(node, request, call["name"])
    if call == request.tool_call and tool is request.tool:
        return request
    return request.override(tool_call=call, tool=tool) if tool is not None else request


def _agent_tool(node: GuardedToolNode, request: ToolCallRequest, name: str) -> BaseTool | None:
    """The agent's tool `name`, or None when it has none."""
    tools = getattr(request.runtime, "tools", None)
    if tools is None:  # no runtime (a call outside a graph): the tools this node knows
        return node.tools_by_name.get(name)
    return next((tool for tool in tools if tool.name == name), None)


def _as_output(node: GuardedToolNode, answer: Answer) -> Any:
    return [answer] if isinstance(answer, Command) else {node.messages_key: [answer]}


def _as_command(update: Any) -> Command[Any]:
    """The step's update as one `Command`; a tool's own `Command` (which answered the
    call itself) keeps its update and goto, with the tally delta added. A `Command` to
    the parent graph (a handoff to another agent) goes there as the tool gave it: the
    parent has no tally to add to, and this graph's turn ends with it."""
    if not isinstance(update, list):
        return Command(update=update)
    *theirs, ours = update
    handoff = next((c for c in theirs if c.graph == Command.PARENT), None)
    if isinstance(handoff, Command):
        return handoff
    merged: dict[str, Any] = {}
    goto: Any = ()
    for command in theirs:
        if isinstance(command.update, Mapping):
            for key, value in command.update.items():
                merged[key] = [*merged.get(key, []), *value] if key in ours else value
        goto = command.goto or goto
    for key, value in ours.items():
        merged[key] = [*merged.get(key, []), *value] if isinstance(value, list) else value
    return Command(update=merged, goto=goto)
