"""What the calls of one tools step share while they run, in a context variable.

`GuardedToolNode` intercepts each call through ToolNode's ``wrap_tool_call`` hook,
which hands it only the call's request; the step's batch (slots, spent attempts,
approvals), its ledger and the tools found gone reach the interception here. `in_step`
sets it for the node's own step and for `call_step`'s step of one call.
"""

from __future__ import annotations

import contextvars
import dataclasses
from collections.abc import Callable
from typing import Any

from langgraph.prebuilt.tool_node import ToolCallRequest

from langgraph_resilience.graph.tool_batch import Batch
from langgraph_resilience.stores.effect_ledger import EffectLedger

__all__ = ["STEP", "StepScope", "in_step", "keep"]


@dataclasses.dataclass(frozen=True, slots=True)
class StepScope:
    """What the calls of one tools step share while they run."""

    batch: Batch
    ledger: EffectLedger | None
    """The side-effect ledger of this run (None: no tool has side effects)."""
    gone: set[str] = dataclasses.field(default_factory=set)
    """Tools that answered STRUCTURAL during this step: its calls that have not
    started yet skip them (the ledger remembers them for later steps)."""
    kept: dict[str, tuple[ToolCallRequest, Callable[..., Any]]] | None = None
    """Where the node keeps ToolNode's request and executor of each call it runs (by
    call id), so a retry inside the step runs the call again without a new ToolNode
    run (and its thread pool), as a wrap_tool_call retry does; None: not kept."""


STEP: contextvars.ContextVar[StepScope | None] = contextvars.ContextVar(
    "langgraph_resilience_step", default=None
)
"""The step the running call belongs to (None: outside a tools step)."""


class in_step:  # noqa: N801 - a context manager, used like a function
    """Run calls as part of `step`, as the node's own step does (what `call_step` does
    for a step of one call); put the previous step back after (set, not reset: a
    BaseException may unwind in another context)."""

    def __init__(
        self,
        batch: Batch,
        ledger: EffectLedger | None,
        kept: dict[str, tuple[ToolCallRequest, Callable[..., Any]]] | None = None,
    ) -> None:
        self.step, self.previous = StepScope(batch, ledger, kept=kept), STEP.get()

    def __enter__(self) -> None:
        STEP.set(self.step)

    def __exit__(self, *exc: object) -> None:
        STEP.set(self.previous)


def keep(request: ToolCallRequest, execute: Callable[..., Any]) -> None:
    """Keep a call's ToolNode request and executor for a retry inside the step."""
    step = STEP.get()
    if step is not None and step.kept is not None:
        step.kept[request.tool_call["id"] or ""] = (request, execute)
