"""The step scope's context variable against a step that a kill left suspended."""

from __future__ import annotations

import contextvars
from collections.abc import Iterator

from langchain_core.messages import AIMessage

from langgraph_resilience._graph.scope import STEP, StepScope, in_step
from langgraph_resilience._graph.tool_batch import Batch


def _batch() -> Batch:
    return Batch(0, AIMessage(content=""), 0.0, {})


def _suspended_step() -> Iterator[None]:
    """A tools step's flow, stopped inside its scope (its run died of a BaseException,
    which leaves the flow suspended until the collector closes it)."""
    with in_step(_batch(), None):
        yield


def test_a_step_closed_late_leaves_another_runs_step_alone() -> None:
    """The collector may close a dead run's flow while another run's step is current:
    that step stays current, so its side effects keep their ledger. (Before, the dead
    step's exit put *its* previous step back: None, and the live step's next call ran
    with no scope, hence no idempotency key: seen as a flaky crash test under the
    oldest LangGraph.)"""
    dead = _suspended_step()
    contextvars.copy_context().run(next, dead)  # the dead run's own context

    def another_run() -> tuple[bool, StepScope | None]:
        with in_step(_batch(), None) as live:
            dead.close()  # the collector, now, in this run's context
            still = STEP.get() is live
        return still, STEP.get()

    still, after = contextvars.copy_context().run(another_run)
    assert still
    assert after is None  # the live step put back what it found


def test_a_step_ending_normally_puts_the_previous_step_back() -> None:
    """The ordinary exit, nested: the inner step's exit restores the outer step."""
    with in_step(_batch(), None) as outer:
        with in_step(_batch(), None) as inner:
            assert STEP.get() is inner
        assert STEP.get() is outer
    assert STEP.get() is None
