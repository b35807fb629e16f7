"""The one sans-I/O protocol: a flow yields typed actions; a driver performs them.

Every piece of logic that both sync and async code run (the exactly-once flow of a
side effect, a compensation run, the resilient model's chain, a ledger's SQL
script) is written once, as a generator of two kinds of action:

- `Call`: call a function (its async twin under an async driver) and send back
  what it returned, or throw what it raised into the flow, which decides;
- `Sleep`: wait, through the injected `Clock`.

`drive` and `adrive` are the only two drivers (tenacity's ``DoAttempt`` /
``DoSleep`` and httpx's ``auth_flow`` are the model). A flow never does I/O and
never reads the time itself, so it is tested by sending it replies.

A BaseException (a cancel, a kill) goes through the driver, not into the flow;
the driver then closes the flow, so its ``with`` blocks unwind at once, in the
run's own context. Left suspended, the flow would unwind whenever the collector
closed it, in whatever context is current then (another run's, maybe), and a
block that sets a context variable (a step's scope, a span) would undo it there.

>>> def greet(name):
...     text = yield Call(str.upper, args=(name,))
...     yield Sleep(0.5)
...     return f"hello {text}"
>>> class NoWait:
...     def sleep(self, seconds): pass
>>> drive(greet("ada"), NoWait())
'hello ADA'
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Awaitable, Callable, Generator, Mapping
from typing import Any, Protocol, TypeAlias, TypeVar

__all__ = ["Action", "Call", "Flow", "Sleep", "adrive", "drive"]

T = TypeVar("T")


@dataclasses.dataclass(frozen=True, slots=True)
class Call:
    """Call `sync` (or, under `adrive`, `async_` when given) with `args` and `kwargs`."""

    sync: Callable[..., Any]
    async_: Callable[..., Awaitable[Any]] | None = None
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class Sleep:
    """Wait `seconds` on the driver's clock."""

    seconds: float


Action: TypeAlias = Call | Sleep
Flow: TypeAlias = Generator[Action, Any, T]


class _Sleeps(Protocol):
    def sleep(self, seconds: float) -> None: ...


class _ASleeps(Protocol):
    async def asleep(self, seconds: float) -> None: ...


def drive(flow: Flow[T], clock: _Sleeps) -> T:
    """Run `flow` synchronously. An awaitable returned by a `Call` is refused: a sync
    run cannot wait for it (give the callable a sync twin, or use `adrive`)."""
    reply: Any = None
    error: BaseException | None = None
    try:
        while True:
            try:
                action = flow.send(reply) if error is None else flow.throw(error)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            reply, error = None, None
            if isinstance(action, Sleep):
                clock.sleep(action.seconds)
                continue
            try:
                reply = action.sync(*action.args, **action.kwargs)
                if inspect.isawaitable(reply):
                    if inspect.iscoroutine(reply):
                        reply.close()
                    raise TypeError(f"{action.sync!r} is async: run it with ainvoke/astream")
            except Exception as exc:  # the flow decides; BaseException propagates
                error = exc
    finally:
        flow.close()  # a flow left by a BaseException unwinds now, in this context


async def adrive(flow: Flow[T], clock: _ASleeps) -> T:
    """Run `flow` on the event loop: a `Call`'s async twin when it has one, else the
    sync callable (awaiting what it returns when that is awaitable)."""
    reply: Any = None
    error: BaseException | None = None
    try:
        while True:
            try:
                action = flow.send(reply) if error is None else flow.throw(error)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            reply, error = None, None
            if isinstance(action, Sleep):
                await clock.asleep(action.seconds)
                continue
            try:
                call = action.async_ or action.sync
                reply = call(*action.args, **action.kwargs)
                if inspect.isawaitable(reply):
                    reply = await reply
            except Exception as exc:  # the flow decides; BaseException propagates
                error = exc
    finally:
        flow.close()  # see `drive`
