"""Short backoffs retried inside the tools step: no retry node, no extra checkpoints.

A tools step finishes its calls (`finish.finish_step`); a call it scheduled for a
retry whose wait is short (`core.decision.retry_in_step`) is not handed to the retry
node: the step sleeps that wait on its clock and runs again, on the state its own
update leaves, until no short wait is left. Each run is a whole tools step (the
batch planned afresh, so budgets, deadlines, breakers and the exactly-once ledger
apply to every attempt; every attempt emits its ``attempt`` event and counts in the
call's record), and the step writes their updates as one. A long wait stays in the
tally for the retry node, checkpointed and resumable.

The crash rule is `core.decision.retry_in_step`'s: the step's attempts are
checkpointed when it ends; a crash inside it resumes from the checkpoint before it
and repeats the step's executions once, except a side effect, which the
exactly-once ledger reconciles instead of running again.

One `core.flow` flow for `GuardedToolNode` (a batch) and `call_step` (one call under
`create_agent`), driven by `drive` or `adrive`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from langchain_core.messages import AnyMessage
from langgraph.types import Command

from langgraph_resilience._graph.state import Tally, apply_update, compose_deltas
from langgraph_resilience._graph.tool_batch import ToolSettings
from langgraph_resilience.core.decision import retry_in_step
from langgraph_resilience.core.flow import Flow, Sleep
from langgraph_resilience.events import Event, emit, observed_step

__all__ = ["retried_in_step"]

Update = dict[str, Any] | list[Any]
"""A tools step's update: a dict, or (a tool returned a `Command`) Commands and one."""

Once = Callable[[Any], Flow[Update | None]]
"""One tools step on a state: its update (its breaker reports sent), or None when the
state holds no call for it."""


def retried_in_step(cfg: ToolSettings, state: Any, once: Once) -> Flow[Update]:
    """Run `once` on `state`, then again after each short wait it leaves, on the state
    its updates leave; return their updates as one (``{}`` when it had nothing to run).
    A tool's `Command` ends the loop: the graph applies it."""
    with observed_step():
        return (yield from _retried(cfg, state, once))


def _retried(cfg: ToolSettings, state: Any, once: Once) -> Flow[Update]:
    total = yield from once(state)
    if total is None:
        return {}
    update, view, backoffs = total, state, 0
    while isinstance(total, dict) and isinstance(view, Mapping):
        wait = _short_wait(cfg, total)
        if wait is None:
            break
        seconds, ids = wait
        emit(Event("backoff", seconds=round(seconds, 6), calls=ids, in_step=True))
        backoffs += 1
        if seconds > 0:
            yield Sleep(seconds)
        view = apply_update(view, _parts(update)[1], cfg.messages_key)
        again = yield from once(view)
        if again is None:
            break
        update = again
        total = _combined(cfg, total, update)
        if not _tally_of(_parts(update)[1]).get("calls"):
            break  # nothing was due after all (a clock whose sleep moves no time)
    if backoffs:
        total = _combined(cfg, total, {"resilience": {"events": {"backoff": backoffs}}})
    return total


def _short_wait(cfg: ToolSettings, total: Mapping[str, Any]) -> tuple[float, list[str]] | None:
    """The wait until the first retry the step scheduled (in any of its runs so far: the
    latest record of each call), when it is short enough to sleep in the step, with the
    calls then due; else None. A last step (`ToolSettings.last_step`) sleeps any wait,
    and runs a fallback (scheduled, due now) too."""
    calls = (total.get("resilience") or {}).get("calls") or {}
    waiting = [
        (record["due"], record.get("call_id") or slot)
        for slot, record in calls.items()
        if record["status"] == "scheduled" and (record["due"] is not None or cfg.last_step)
    ]
    if not waiting:
        return None
    now = cfg.clock.time()
    first = min(now if due is None else due for due, _ in waiting)  # None: a fallback, due now
    wait = max(0.0, first - now)
    if not (cfg.last_step or retry_in_step(wait, cfg.policy)):
        return None
    return wait, [call_id for due, call_id in waiting if due is None or due - now <= wait]


def _parts(update: Update) -> tuple[list[Command[Any]], dict[str, Any]]:
    if isinstance(update, dict):
        return [], update
    *commands, ours = update
    return commands, ours


def _tally_of(update: Mapping[str, Any]) -> Tally:
    found = update.get("resilience")
    return found if isinstance(found, dict) else {}  # type: ignore[return-value]


def _combined(cfg: ToolSettings, first: Update, then: Update) -> Update:
    """Two updates of one step as one: messages in order, the tally deltas composed."""
    commands_a, a = _parts(first)
    commands_b, b = _parts(then)
    key = cfg.messages_key
    messages: list[AnyMessage] = [*(a.get(key) or []), *(b.get(key) or [])]
    tally = compose_deltas(_tally_of(a), _tally_of(b))
    merged: dict[str, Any] = {**a, **b, key: messages, "resilience": tally}
    commands = [*commands_a, *commands_b]
    return [*commands, merged] if commands else merged
