"""The checkpoint saves this process has seen finish, so that a side effect's wait for
its step's save (`saved_step`) wakes as the save lands instead of on its next poll.

LangGraph gives a task no handle on the save of the step it runs from: the loop keeps
that future to itself. So the first time a checkpointer serves a side effect's wait,
`watch` wraps that saver instance's own ``put`` and ``aput``: each save that returns is
noted here under its checkpoint's key and wakes whoever waits for that key. Its
``get_tuple`` and ``aget_tuple`` are wrapped too: a checkpoint read back is saved, so
the one a resumed or re-queued run loads is noted as it loads. Nothing else of the
saver changes; a save raises as before and is not noted; a copy of the saver
(LangGraph clones one for a graph's serde allowlist) gets the saver's own methods back.

A save this process did not see (made by another worker, or before the wrap, or by a
saver whose methods cannot be replaced) is never noted: the wait still finds it by
reading the checkpointer. The newest `KEEP` keys are kept, so memory stays bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, Checkpoint, CheckpointTuple
from langgraph.checkpoint.base.id import UUID

__all__ = ["KEEP", "SaveKey", "Seen", "created_ticks", "key_of", "now_ticks", "seen", "watch"]

KEEP = 4096
"""Keys of finished saves (and of waits not yet answered) kept by this process."""

SaveKey = tuple[str, str, str]
"""A checkpoint's ``(thread_id, checkpoint_ns, checkpoint_id)``."""

_WATCHED = "_langgraph_resilience_watched"


def key_of(configurable: Mapping[str, Any], checkpoint_id: str) -> SaveKey:
    """The key of the checkpoint `checkpoint_id` of `configurable`'s thread and namespace."""
    thread, ns = configurable.get("thread_id"), configurable.get("checkpoint_ns", "")
    return (str(thread), str(ns), str(checkpoint_id))


class Seen:
    """One key's record: whether its save is running here or has been seen to finish,
    and who waits for it."""

    __slots__ = ("_event", "_futures", "done", "saving")

    def __init__(self) -> None:
        self.done = False
        self.saving = 0
        """Saves of this key running in this process now (no read can find it sooner)."""
        self._event: threading.Event | None = None
        self._futures: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def wait(self, timeout: float) -> bool:
        """Block up to `timeout` seconds for the save; whether it has been seen."""
        with _LOCK:
            if self.done:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)

    async def await_(self, timeout: float) -> bool:
        """Wait on the event loop up to `timeout` seconds for the save."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with _LOCK:
            if self.done:
                return True
            self._futures.append((loop, future))
        try:
            await asyncio.wait((future,), timeout=timeout)
        finally:
            with _LOCK:
                if (loop, future) in self._futures:
                    self._futures.remove((loop, future))
        return self.done

    def _finish(self) -> None:
        """Mark done and wake every waiter (called under `_LOCK`)."""
        self.done = True
        if self._event is not None:
            self._event.set()
        for loop, future in self._futures:
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits there
                loop.call_soon_threadsafe(_resolve, future)
        self._futures.clear()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


_LOCK = threading.Lock()
_SEEN: OrderedDict[SaveKey, Seen] = OrderedDict()


def seen(key: SaveKey) -> Seen:
    """The record of `key` (made, and kept among the newest, if it has none)."""
    with _LOCK:
        record = _SEEN.get(key)
        if record is None:
            record = _SEEN[key] = Seen()
            _trim()
        return record


@contextlib.contextmanager
def _saving(key: SaveKey) -> Iterator[None]:
    """Mark `key`'s save as running while the body runs; noted done if it returns."""
    record = seen(key)
    with _LOCK:
        record.saving += 1
    try:
        yield
    except BaseException:
        with _LOCK:
            record.saving -= 1
        raise
    with _LOCK:
        record.saving -= 1
        record._finish()


def _loaded(found: CheckpointTuple | None) -> CheckpointTuple | None:
    """Note the checkpoint a read found (it is saved); `found` as it is."""
    if found is not None:
        configurable = found.config.get("configurable") or {}
        if checkpoint_id := configurable.get("checkpoint_id"):
            record = seen(key_of(configurable, checkpoint_id))
            with _LOCK:
                record._finish()
    return found


def _trim() -> None:
    while len(_SEEN) > KEEP:
        _SEEN.popitem(last=False)  # a waiter still holds its own record


def watch(saver: BaseCheckpointSaver[Any]) -> int | None:
    """Note every save `saver` makes from now on; the time since which it has (in
    checkpoint-id ticks, `now_ticks`), or None for a saver whose methods cannot be
    replaced: it is left as it is, and its saves are found by reading."""
    since: int | None = getattr(saver, _WATCHED, None)
    if since is not None:
        return since
    with _LOCK:
        already: int | None = getattr(saver, _WATCHED, None)
        if already is not None:
            return already
        put, aput = saver.put, saver.aput
        get_tuple, aget_tuple = saver.get_tuple, saver.aget_tuple

        @functools.wraps(put)
        def noted_put(
            config: RunnableConfig, checkpoint: Checkpoint, *args: Any, **kwargs: Any
        ) -> RunnableConfig:
            with _saving(key_of(config.get("configurable") or {}, checkpoint["id"])):
                return put(config, checkpoint, *args, **kwargs)

        @functools.wraps(aput)
        async def noted_aput(
            config: RunnableConfig, checkpoint: Checkpoint, *args: Any, **kwargs: Any
        ) -> RunnableConfig:
            with _saving(key_of(config.get("configurable") or {}, checkpoint["id"])):
                return await aput(config, checkpoint, *args, **kwargs)

        @functools.wraps(get_tuple)
        def noted_get_tuple(config: RunnableConfig) -> CheckpointTuple | None:
            return _loaded(get_tuple(config))

        @functools.wraps(aget_tuple)
        async def noted_aget_tuple(config: RunnableConfig) -> CheckpointTuple | None:
            return _loaded(await aget_tuple(config))

        def getstate() -> Any:
            """A copy (LangGraph's `with_allowlist` clones the saver) or a pickle
            holds the saver's own methods, bound to itself, not these."""
            state = type(saver).__getstate__(saver)
            if isinstance(state, tuple):  # (dict, slots)
                return (_without_ours(state[0]), *state[1:])
            return _without_ours(state)

        try:
            saver.put = noted_put  # type: ignore[method-assign]
            saver.aput = noted_aput  # type: ignore[method-assign]
            saver.get_tuple = noted_get_tuple  # type: ignore[method-assign]
            saver.aget_tuple = noted_aget_tuple  # type: ignore[method-assign]
            saver.__getstate__ = getstate  # type: ignore[method-assign]
            since = now_ticks()
            setattr(saver, _WATCHED, since)
        except (AttributeError, TypeError):  # slots, or frozen: its saves are read instead
            for name in _OURS:
                getattr(saver, "__dict__", {}).pop(name, None)
            return None
        return since


def now_ticks() -> int:
    """Now, in the unit of a checkpoint id's time (100 ns since 1582, as `uuid6`)."""
    return time.time_ns() // 100 + _UUID_EPOCH


def created_ticks(checkpoint_id: str) -> int | None:
    """When LangGraph made checkpoint `checkpoint_id` (its ids are `uuid6`), or None."""
    try:
        created = UUID(checkpoint_id)
    except ValueError:
        return None
    return created.time if created.version == 6 else None


_UUID_EPOCH = 0x01B21DD213814000


_OURS = ("put", "aput", "get_tuple", "aget_tuple", "__getstate__", _WATCHED)


def _without_ours(state: Any) -> Any:
    if not isinstance(state, dict):
        return state
    return {name: value for name, value in state.items() if name not in _OURS}
