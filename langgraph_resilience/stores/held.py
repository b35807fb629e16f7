"""Which thread leases the current context holds: what every write of a runner carries.

`thread_lock` puts the lease it took here (a context variable, like LangGraph's
config) for the block it guards; `current_fence` finds it again before a checkpoint
write or a side effect, and `fences_json` is what the ledger's writes send along, so
the database refuses them once a newer holder exists (``lgr_fenced`` in
`langgraph_resilience.stores.lease_sql`).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from langgraph_resilience.errors import ThreadLockLostError
from langgraph_resilience.events import Event, emit

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

__all__ = [
    "Fence",
    "acheck_fence",
    "check_fence",
    "current_fence",
    "fences_json",
    "holding",
    "thread_of",
]


@runtime_checkable
class Fence(Protocol):
    """A held lease, as a writer sees it: its token, and a one-statement check."""

    @property
    def thread_id(self) -> str:
        """The thread it holds."""
        ...

    @property
    def token(self) -> int:
        """Its fencing token: greater than every earlier holder's of the thread."""
        ...

    @property
    def db(self) -> str:
        """The database it is held in (``current_database()``)."""
        ...

    def check(self) -> None:
        """Raise `ThreadLockLostError` unless the token is still the thread's current one
        (one statement)."""
        ...

    def fresh(self) -> bool:
        """Whether this process knows, without a statement, that the lease has more than
        a third of its TTL left (a takeover is only ruled out by a fenced write)."""
        ...

    async def acheck(self) -> None:
        """Async `check`."""
        ...


_HELD: contextvars.ContextVar[Mapping[str, Fence] | None] = contextvars.ContextVar(
    "langgraph_resilience_fences", default=None
)


@contextlib.contextmanager
def holding(fence: Fence) -> Iterator[None]:
    """Make `fence` the current context's fence for its thread while the block runs."""
    previous = _HELD.get()
    _HELD.set({**(previous or {}), fence.thread_id: fence})
    try:
        yield
    finally:  # set, not reset: an async lock enters and exits in different contexts
        _HELD.set(previous)


def current_fence(thread_id: str) -> Fence | None:
    """The lease this context holds on `thread_id`, if any."""
    return (_HELD.get() or {}).get(thread_id)


def fences_json() -> str:
    """The leases this context holds, as the ledger's writes carry them:
    ``{thread_id: {"token": n, "db": name}}`` (``{}`` when it holds none)."""
    held = _HELD.get()
    if not held:
        return "{}"
    return json.dumps({t: {"token": f.token, "db": f.db} for t, f in held.items()})


def thread_of(config: RunnableConfig | Mapping[str, Any] | str) -> str:
    if isinstance(config, str):
        return config
    return str((config.get("configurable") or {}).get("thread_id", ""))


def check_fence(config: RunnableConfig | Mapping[str, Any] | str, *, claimed: bool = False) -> None:
    """Stop (`ThreadLockLostError`) if this context holds the thread's lease and lost it
    (one statement; nothing when it holds none). A stop is a ``fenced`` event.

    `claimed`: a fenced write of this context just committed (a side effect's claim),
    so no newer holder existed then; if the lease is also `Fence.fresh`, no statement is
    needed: it cannot lapse before the effect and its outcome are written. A holder
    wrongly judged dead could still take over in between, as it could after a check;
    the claimed intent then stops its run from doing the effect again."""
    fence = current_fence(thread_of(config))
    if fence is not None and not (claimed and fence.fresh()):
        try:
            fence.check()
        except ThreadLockLostError:
            emit(Event("fenced", thread_id=fence.thread_id, fence=fence.token))
            raise


async def acheck_fence(
    config: RunnableConfig | Mapping[str, Any] | str, *, claimed: bool = False
) -> None:
    """Async `check_fence`."""
    fence = current_fence(thread_of(config))
    if fence is not None and not (claimed and fence.fresh()):
        try:
            await fence.acheck()
        except ThreadLockLostError:
            emit(Event("fenced", thread_id=fence.thread_id, fence=fence.token))
            raise
