"""A side effect's wait wakes as this process's save of its step returns: a watched
saver notes each save it makes, waiters of that key wake at once (sync and async),
a save that raised is not noted, memory stays bounded, and a saver whose methods
cannot be replaced is left as it is (its saves are found by reading)."""

from __future__ import annotations

import asyncio
import copy
import threading
import time
import uuid
from typing import Any

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import Checkpoint, empty_checkpoint
from langgraph.checkpoint.memory import InMemorySaver

from langgraph_resilience.graph import seen_saves
from langgraph_resilience.graph.seen_saves import key_of, seen, watch

LONG = 30.0
"""A wait this long is never reached when the note wakes it (the test would hang)."""


def _save() -> tuple[RunnableConfig, Checkpoint]:
    config: RunnableConfig = {"configurable": {"thread_id": uuid.uuid4().hex, "checkpoint_ns": ""}}
    return config, empty_checkpoint()


def _key(config: RunnableConfig, checkpoint: Checkpoint) -> Any:
    return key_of(config["configurable"], checkpoint["id"])


def test_a_sync_waiter_wakes_when_the_watched_save_returns() -> None:
    saver = InMemorySaver()
    watch(saver)
    config, checkpoint = _save()
    record = seen(_key(config, checkpoint))
    assert record.wait(0) is False
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(record.wait(LONG)))
    waiter.start()
    while record._event is None:  # the waiter is registered before the save
        time.sleep(0)

    saver.put(config, checkpoint, {"source": "loop", "step": 1}, {})
    waiter.join(LONG)

    assert woke == [True]  # woken: a wait that ran out would say False
    assert seen(_key(config, checkpoint)).wait(0) is True  # a later call: no wait


@pytest.mark.parametrize("where", ["on the loop", "in another thread"])
async def test_an_async_waiter_wakes_when_the_watched_save_returns(where: str) -> None:
    saver = InMemorySaver()
    watch(saver)
    config, checkpoint = _save()
    record = seen(_key(config, checkpoint))
    waiter = asyncio.ensure_future(record.await_(LONG))
    await asyncio.sleep(0)  # yield once: the waiter registers before the save
    assert record._futures

    metadata: Any = {"source": "loop", "step": 1}
    if where == "on the loop":
        await saver.aput(config, checkpoint, metadata, {})
    else:
        await asyncio.to_thread(saver.put, config, checkpoint, metadata, {})

    assert await waiter is True


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_checkpoint_read_back_is_noted(mode: str) -> None:
    """A checkpoint the watched saver reads back is saved: noted (a re-queued run's
    loop loads the checkpoint another worker saved)."""
    saver = InMemorySaver()
    watch(saver)
    config, checkpoint = _save()
    InMemorySaver.put(saver, config, checkpoint, {"source": "loop", "step": 1}, {})
    assert seen(_key(config, checkpoint)).wait(0) is False  # saved behind the watch

    found = saver.get_tuple(config) if mode == "sync" else asyncio.run(saver.aget_tuple(config))

    assert found is not None
    assert found.checkpoint["id"] == checkpoint["id"]
    assert seen(_key(config, checkpoint)).wait(0) is True
    assert saver.get_tuple({"configurable": {"thread_id": "none", "checkpoint_ns": ""}}) is None


def test_a_save_that_raises_is_not_noted() -> None:
    class Failing(InMemorySaver):
        def put(self, *args: Any, **kwargs: Any) -> RunnableConfig:
            raise OSError("disk full")

    saver = Failing()
    watch(saver)
    config, checkpoint = _save()
    with pytest.raises(OSError, match="disk full"):
        saver.put(config, checkpoint, {"source": "loop", "step": 1}, {})
    assert seen(_key(config, checkpoint)).wait(0) is False


def test_watching_twice_wraps_once_and_unwatched_saves_are_not_noted() -> None:
    saver = InMemorySaver()
    config, checkpoint = _save()
    saver.put(config, checkpoint, {"source": "loop", "step": 1}, {})
    assert seen(_key(config, checkpoint)).wait(0) is False  # before the watch: read instead

    watch(saver)
    wrapped = saver.put
    watch(saver)
    assert saver.put is wrapped


def test_a_saver_with_slots_is_left_as_it_is() -> None:
    class Slotted:
        __slots__ = ()

        def put(self, *args: Any) -> None:
            raise AssertionError("not called")

        async def aput(self, *args: Any) -> None:
            raise AssertionError("not called")

        def get_tuple(self, *args: Any) -> None:
            raise AssertionError("not called")

        async def aget_tuple(self, *args: Any) -> None:
            raise AssertionError("not called")

    saver: Any = Slotted()
    watch(saver)
    assert saver.put.__func__ is Slotted.put


def test_only_the_newest_keys_are_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(seen_saves, "KEEP", 8)
    monkeypatch.setattr(seen_saves, "_SEEN", type(seen_saves._SEEN)())
    saver = InMemorySaver()
    watch(saver)
    keys = []
    for _ in range(50):
        config, checkpoint = _save()
        saver.put(config, checkpoint, {"source": "loop", "step": 1}, {})
        keys.append(_key(config, checkpoint))

    assert len(seen_saves._SEEN) == 8
    assert list(seen_saves._SEEN) == keys[-8:]


def test_a_copy_of_a_watched_saver_saves_with_its_own_methods() -> None:
    """LangGraph's `with_allowlist` clones a saver (`copy.copy`) to give it another
    serde: the clone must write with its own, not through the watched original."""
    saver = InMemorySaver()
    watch(saver)
    clone = copy.copy(saver)
    assert clone.put.__self__ is clone  # type: ignore[attr-defined]
    assert clone.get_tuple.__self__ is clone  # type: ignore[attr-defined]
    assert not hasattr(clone, seen_saves._WATCHED)

    config, checkpoint = _save()
    clone.put(config, checkpoint, {"source": "loop", "step": 1}, {})
    assert seen(_key(config, checkpoint)).wait(0) is False  # not watched until used

    watch(clone)
    config, checkpoint = _save()
    clone.put(config, checkpoint, {"source": "loop", "step": 1}, {})
    assert seen(_key(config, checkpoint)).wait(0) is True
