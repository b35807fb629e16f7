"""What the calls of one tools step share while they run, in a context variable.

`GuardedToolNode` intercepts each call through ToolNode's ``wrap_tool_call`` hook,
which hands it only the call's request; the step's batch (slots, spent attempts,
approvals), its ledger and the tools found gone reach the interception here, and
what the interception learns of each call beside its answer (`CallOutcome`: the
classified failure, the coerced arguments, a batch's item keys) goes back to the
step's finish (`finish.finish_step`) here too, by call id. `in_step`
sets it for the node's own step and for `call_step`'s step of one call, after
`step_ledger` found the run's ledger and took the run's lease of its thread.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
from collections.abc import Callable
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.prebuilt.tool_node import ToolCallRequest

from langgraph_resilience._graph.answers import Raised
from langgraph_resilience._graph.run_lease import RUN_LEASES, current_run
from langgraph_resilience._graph.tool_batch import Batch
from langgraph_resilience.core.flow import Call, Flow
from langgraph_resilience.core.validation import Coercion
from langgraph_resilience.stores.effect_ledger import EffectLedger, LedgerResolver
from langgraph_resilience.stores.held import Fence, holding

__all__ = ["STEP", "CallOutcome", "StepScope", "in_step", "keep", "step_ledger"]


@dataclasses.dataclass(slots=True)
class CallOutcome:
    """What the interception learned of one call beside the answer ToolNode returns."""

    raised: Raised | None = None
    """The failure, classified where it was caught (the answer is a placeholder)."""
    coercion: Coercion | None = None
    """The lossless fixes its arguments needed before the tool accepted them."""
    item_keys: tuple[str, ...] | None = None
    """A side-effecting batch call's per-item keys, kept for a redo of failed items."""


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
    outcomes: dict[str, CallOutcome] = dataclasses.field(default_factory=dict)
    """Each call's `CallOutcome`, by call id, for `finish.finish_step`."""

    def outcome(self, call_id: str | None) -> CallOutcome:
        """The outcome of the call `call_id`, to fill in."""
        return self.outcomes.setdefault(call_id or "", CallOutcome())


STEP: contextvars.ContextVar[StepScope | None] = contextvars.ContextVar(
    "langgraph_resilience_step", default=None
)
"""The step the running call belongs to (None: outside a tools step)."""


def step_ledger(
    ledgers: LedgerResolver, config: RunnableConfig
) -> Flow[tuple[EffectLedger | None, Fence | None]]:
    """The run's side-effect ledger and, when there is one, the run's lease of its
    thread (`_graph.run_lease`), whose fence every ledger write of the step carries."""
    ledger = yield Call(ledgers.resolve, ledgers.aresolve, (config,))
    if ledger is None:
        return None, None
    leases, run = RUN_LEASES, current_run()
    return ledger, (yield Call(leases.take, leases.atake, (ledger, run, config)))


class in_step:  # noqa: N801 - a context manager, used like a function
    """Run calls as part of `step`, as the node's own step does (what `call_step` does
    for a step of one call), the ledger's writes carrying `fence`; put the previous
    step back after (set, not reset: a BaseException may unwind in another context).

    The drivers close a flow that a BaseException (a kill, a cancel) ends, so this
    block unwinds in its own run's context. Should a flow still be closed late, by the
    collector, in another run's context, the exit puts the previous step back only where
    this step is still the current one: it never unsets another run's step (whose side
    effects would then run without their ledger)."""

    def __init__(
        self,
        batch: Batch,
        ledger: EffectLedger | None,
        fence: Fence | None = None,
        kept: dict[str, tuple[ToolCallRequest, Callable[..., Any]]] | None = None,
    ) -> None:
        self.step, self.previous = StepScope(batch, ledger, kept=kept), STEP.get()
        self.held = contextlib.nullcontext() if fence is None else holding(fence)

    def __enter__(self) -> StepScope:
        self.held.__enter__()
        STEP.set(self.step)
        return self.step

    def __exit__(self, *exc: Any) -> None:
        if STEP.get() is not self.step:
            return  # closed late, in another run's context: not ours to undo
        STEP.set(self.previous)
        self.held.__exit__(*exc)


def keep(request: ToolCallRequest, execute: Callable[..., Any]) -> None:
    """Keep a call's ToolNode request and executor for a retry inside the step."""
    step = STEP.get()
    if step is not None and step.kept is not None:
        step.kept[request.tool_call["id"] or ""] = (request, execute)
