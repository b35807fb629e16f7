"""The drivers against a run that ends by a BaseException (a kill, a cancel)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
from collections.abc import Iterator
from typing import Any

import pytest

from langgraph_resilience.core.flow import Call, Flow, adrive, drive

_HELD: contextvars.ContextVar[str | None] = contextvars.ContextVar("held", default=None)


@contextlib.contextmanager
def _holding(name: str) -> Iterator[None]:
    """A block that sets a context variable, as a step's scope or a span does."""
    token = _HELD.set(name)
    try:
        yield
    finally:
        _HELD.reset(token)


def _interrupted() -> None:
    raise KeyboardInterrupt


async def _cancelled() -> None:
    raise asyncio.CancelledError


def _step(unwound: list[str]) -> Flow[Any]:
    with _holding("step"):
        try:
            return (yield Call(_interrupted, _cancelled))
        finally:
            unwound.append(str(_HELD.get()))


class _NoWait:
    def sleep(self, seconds: float) -> None:
        pass

    async def asleep(self, seconds: float) -> None:
        pass


def test_a_killed_flow_unwinds_at_once_in_the_runs_context() -> None:
    """Before, the flow stayed suspended inside its block: the variable stayed set in
    the run's context, and the block unwound later, wherever the collector was."""
    unwound: list[str] = []
    flow = _step(unwound)
    with pytest.raises(KeyboardInterrupt):
        drive(flow, _NoWait())
    assert inspect.getgeneratorstate(flow) == inspect.GEN_CLOSED
    assert unwound == ["step"]  # its finally ran inside its own block
    assert _HELD.get() is None  # and the block undid what it set, here


def test_a_cancelled_flow_unwinds_at_once_in_the_runs_context() -> None:
    unwound: list[str] = []
    flow = _step(unwound)

    async def run() -> str | None:
        with pytest.raises(asyncio.CancelledError):
            await adrive(flow, _NoWait())
        return _HELD.get()

    assert asyncio.run(run()) is None
    assert inspect.getgeneratorstate(flow) == inspect.GEN_CLOSED
    assert unwound == ["step"]


def test_a_flow_still_decides_on_an_ordinary_failure() -> None:
    """An Exception goes into the flow, which may recover: closing is for the rest."""

    def failing() -> None:
        raise ValueError("no")

    def recovering() -> Flow[str]:
        try:
            yield Call(failing)
        except ValueError as exc:
            return f"recovered from {exc}"
        return "unreachable"

    assert drive(recovering(), _NoWait()) == "recovered from no"
