"""The idempotency key of the side-effecting call running now, for the tool to pass on.

Why this module exists: a tool reads its key the way LangGraph's ``get_config()`` is
read, from context, never from its arguments (the model must not see or forge it).
The exactly-once flow sets it (`effect_context`) around the one run it allows.
"""

from __future__ import annotations

import contextlib
import contextvars
import warnings
from collections.abc import Iterator

from langgraph_resilience.errors import ResilienceWarning

__all__ = [
    "calling",
    "current_idempotency_key",
    "current_item_keys",
    "effect_context",
    "key_in_effect",
]

_CURRENT_KEY: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "langgraph_resilience_idempotency_key", default=None
)
_CURRENT_ITEM_KEYS: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar(
    "langgraph_resilience_item_keys", default=None
)


_CALLING: contextvars.ContextVar[tuple[str, set[str]] | None] = contextvars.ContextVar(
    "langgraph_resilience_calling", default=None
)
"""The tool whose call our node is running now, and the tools that node has already
warned of asking for a key they cannot have (`calling`); None outside a call."""


@contextlib.contextmanager
def calling(tool: str, told: set[str]) -> Iterator[None]:
    """While a node runs a call of `tool`: a key asked for by a tool with no side-effect
    profile is warned of, once per tool of the node (`told`)."""
    token = _CALLING.set((tool, told))
    try:
        yield
    finally:
        _CALLING.reset(token)


def current_idempotency_key() -> str | None:
    """The idempotency key of the side-effecting call running now, read inside the tool
    (like LangGraph's ``get_config()``) so it can pass it on, e.g. as an
    ``Idempotency-Key`` header. None outside a side-effecting call; a tool that asks
    while it has no ``ToolProfile(side_effect=True)`` is warned of once
    (`ResilienceWarning`): it would send no key.

    The key is not an argument: LangGraph's ToolNode strips caller-supplied values of
    injected arguments, and the model must never see or forge it.
    """
    key = _CURRENT_KEY.get()
    calling_now = _CALLING.get() if key is None else None
    if calling_now is not None and calling_now[0] not in calling_now[1]:
        tool, told = calling_now
        told.add(tool)
        warnings.warn(
            f"tool {tool!r} asked for current_idempotency_key() but has no "
            f"side-effect profile, so it gets None and sends no key; mark it "
            f"(profiles={{{tool!r}: ToolProfile(side_effect=True)}}) if it changes "
            "anything",
            ResilienceWarning,
            stacklevel=2,
        )
    return key


def key_in_effect() -> str | None:
    """The key `current_idempotency_key` returns, read by the package's own transports
    (an MCP request's ``_meta``), which ask for every tool and warn nobody."""
    return _CURRENT_KEY.get()


def current_item_keys() -> tuple[str, ...] | None:
    """Inside a side-effecting batch tool (`ToolProfile(batch_arg=...)`): one
    idempotency key per item of the batch argument, in order, to send to the service
    per item. A redo of failed items gets the keys those items had on the first run,
    so an item that did go through is deduplicated. None elsewhere."""
    return _CURRENT_ITEM_KEYS.get()


@contextlib.contextmanager
def effect_context(key: str, item_keys: tuple[str, ...] | None) -> Iterator[None]:
    """While the tool runs: its idempotency key (and per-item keys) for the tool."""
    previous = (_CURRENT_KEY.get(), _CURRENT_ITEM_KEYS.get())
    _CURRENT_KEY.set(key)
    _CURRENT_ITEM_KEYS.set(item_keys)
    try:
        yield
    finally:  # set, not reset: a BaseException may unwind in another context
        _CURRENT_KEY.set(previous[0])
        _CURRENT_ITEM_KEYS.set(previous[1])
