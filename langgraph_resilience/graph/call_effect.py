"""A side-effecting call's effect: its identity and claim, and its run with the keys.

The idempotency key is bound to the call's slot in the thread (its assistant message
and position, `graph.tool_batch`), never to the provider's tool-call id, which
providers reuse; the tool runs with the key (and a batch call's per-item keys) in
context, so it can hand them to the service it calls.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from langchain_core.messages import ToolCall, ToolMessage
from langgraph.prebuilt.tool_node import ToolCallRequest

from langgraph_resilience.core.effects import effect_identity, item_idempotency_key
from langgraph_resilience.core.policy import ResiliencePolicy
from langgraph_resilience.core.profile import ToolProfile
from langgraph_resilience.graph.exactly_once import Effect, effect_context
from langgraph_resilience.graph.in_flight import executing
from langgraph_resilience.graph.saved_step import step_to_save
from langgraph_resilience.graph.step_scope import STEP, StepScope

__all__ = ["ascoped", "effect_of", "scoped"]


def effect_of(
    call: ToolCall,
    request: ToolCallRequest,
    step: StepScope,
    profile: ToolProfile,
    *,
    policy: ResiliencePolicy,
    grace: float,
) -> Effect | None:
    """The idempotency key and claim arguments of a side-effecting call (None when the
    run has no ledger). The key is bound to the call's slot (its assistant message and
    position), not to the provider's id, which providers reuse."""
    if step.ledger is None:
        return None
    config = getattr(getattr(request, "runtime", None), "config", None) or {}
    thread_id = str((config.get("configurable") or {}).get("thread_id", ""))
    call_id, batch, noise = call["id"] or "", step.batch, policy.noise_fields
    args = call["args"]
    slot = batch.slots.get(call_id, call_id)
    key, fingerprint, args_json = effect_identity(
        call["name"], args, thread_id=thread_id, call_identity=slot, noise_fields=noise
    )
    return Effect(
        step.ledger,
        key,
        thread_id,
        args_json,
        profile,
        dict(args),
        fingerprint,
        may_execute=call_id not in batch.spent,
        approved=call_id in batch.approved,
        told_before=batch.told_before(),
        told_now=batch.told_now(),
        grace=grace,
        saved_step=step_to_save(config, call["name"]),
    )


def _item_keys(call: ToolCall, effect: Effect) -> tuple[str, ...] | None:
    """Per-item keys of a side-effecting batch call: the first run's, on a redo."""
    step = STEP.get()
    if effect.profile.batch_arg is None or step is None:
        return None
    kept = step.batch.item_keys.get(call["id"] or "")
    if kept is not None:
        return tuple(kept)
    items = call["args"].get(effect.profile.batch_arg)
    count = len(items) if isinstance(items, list) else 0
    return tuple(item_idempotency_key(effect.key, index) for index in range(count))


def scoped(execute: Callable[..., Any], call: ToolCall, effect: Effect) -> Callable[..., Any]:
    """`execute` with the effect's keys in context (`current_idempotency_key`)."""
    items = _item_keys(call, effect)

    def run(request: ToolCallRequest) -> Any:
        with effect_context(effect.key, items), executing(effect.key):
            return _note_item_keys(execute(request), items)

    return run


def ascoped(
    execute: Callable[..., Awaitable[Any]], call: ToolCall, effect: Effect
) -> Callable[..., Awaitable[Any]]:
    """Async `scoped`."""
    items = _item_keys(call, effect)

    async def run(request: ToolCallRequest) -> Any:
        with effect_context(effect.key, items), executing(effect.key):
            return _note_item_keys(await execute(request), items)

    return run


def _note_item_keys(result: Any, item_keys: tuple[str, ...] | None) -> Any:
    """Hand a batch call's item keys to the step (which pops them) for a redo."""
    if item_keys is not None and isinstance(result, ToolMessage):
        result.response_metadata["resilience_item_keys"] = list(item_keys)
    return result
