"""Group commit: the concurrent ledger writes of one step sent as one statement.

The calls of a step run in parallel, and each writes its intent before its effect
and its outcome after. Sent one by one, N calls cost N statements and N commits, so
a step's cost grew with its calls. Here the first `LANES` writers of a group (one
step: a thread and its lease) send their own statements at once, so a lone call or a
pair waits for nothing; writers that come while those are in flight queue, and go
together as one statement when one of them returns. Each writer goes on only once the statement that
carried its row has committed, so the crash rules are those of a single writer: no
row is written for a call that is not about to use it.

`GroupCommit` serves threads (a sync graph's tool calls), `AsyncGroupCommit` the
tasks of one event loop. Both take `send(items)`: one statement for the items (a
key's parameters, by key), returning each key's rows.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from typing import Any

__all__ = ["LANES", "AsyncGroupCommit", "GroupCommit", "Items", "Rows"]

LANES = 2
"""A group's statements in flight at once before the next writers queue: two parallel
calls go as they did alone (neither waits for the other), and a wider step's writes
still take a bounded number of statements."""
Items = dict[str, Mapping[str, Any]]
"""The statements of one batch: each key's parameters, in arrival order."""
Rows = dict[str, Sequence[Any]]
"""What the batch's statement returned, by key."""


class _Lanes:
    """Each group's statements in flight, at most `LANES` (the caller holds any lock)."""

    def __init__(self) -> None:
        self._busy: dict[Hashable, int] = {}

    def take(self, group: Hashable) -> bool:
        """Take a free lane of `group`; False when every lane is in flight."""
        busy = self._busy.get(group, 0)
        if busy >= LANES:
            return False
        self._busy[group] = busy + 1
        return True

    def give_back(self, group: Hashable) -> None:
        busy = self._busy.pop(group)
        if busy > 1:
            self._busy[group] = busy - 1


@dataclasses.dataclass(eq=False, slots=True)
class _Batch:
    items: Items
    go: threading.Event = dataclasses.field(default_factory=threading.Event)
    """Its leader may send it (the statement before it returned)."""
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    rows: Rows | None = None
    error: Exception | None = None


class GroupCommit:
    """Group commit for threads (see the module docstring)."""

    def __init__(self, send: Callable[[Items], Rows]) -> None:
        self._send = send
        self._lock = threading.Lock()
        self._lanes = _Lanes()
        self._queued: dict[Hashable, _Batch] = {}

    def rows(self, group: Hashable, key: str, params: Mapping[str, Any]) -> Sequence[Any]:
        """The rows of `key`'s statement, sent alone or with its group's queued ones."""
        batch: _Batch | None
        with self._lock:
            if self._lanes.take(group):
                batch, lead = _Batch({key: params}), True
                batch.go.set()
            else:
                batch = self._queued.setdefault(group, _Batch({}))
                lead = not batch.items  # the first of a batch sends it
                if key in batch.items:  # the same key twice: never one row for two writers
                    batch = None
                else:
                    batch.items[key] = params
        if batch is None:
            return self._send({key: params})[key]
        if lead:
            batch.go.wait()
            try:
                batch.rows = self._send(batch.items)
            except Exception as exc:
                batch.error = exc
            finally:
                self._hand_over(group)
                batch.done.set()
        else:
            batch.done.wait()
        if batch.error is not None:
            raise batch.error
        if batch.rows is None:  # its leader was interrupted before it sent the batch
            return self._send({key: params})[key]
        return batch.rows[key]

    def _hand_over(self, group: Hashable) -> None:
        """The group's queued batch may go now; else the group is idle."""
        with self._lock:
            queued = self._queued.pop(group, None)
            if queued is not None:
                queued.go.set()  # it takes this statement's lane
            else:
                self._lanes.give_back(group)


@dataclasses.dataclass(eq=False, slots=True)
class _AsyncBatch:
    items: Items
    done: asyncio.Future[Rows | None]
    """The rows; None when its sender was stopped before it sent them (each goes alone)."""


class AsyncGroupCommit:
    """Group commit for the tasks of an event loop: a queued batch is sent by a task of
    its own, so a writer cancelled while it waits takes its row out (it is never
    written), and a cancelled first writer leaves the others to go on."""

    def __init__(self, send: Callable[[Items], Awaitable[Rows]]) -> None:
        self._send = send
        self._lanes = _Lanes()
        self._queued: dict[Hashable, _AsyncBatch] = {}
        self._senders: set[asyncio.Task[None]] = set()

    async def rows(self, group: Hashable, key: str, params: Mapping[str, Any]) -> Sequence[Any]:
        """The rows of `key`'s statement, sent alone or with its group's queued ones."""
        loop = asyncio.get_running_loop()
        group = (id(loop), group)
        if self._lanes.take(group):
            try:
                return (await self._send({key: params}))[key]
            finally:
                self._hand_over(group)
        batch = self._queued.get(group)
        if batch is None:
            batch = self._queued[group] = _AsyncBatch({}, loop.create_future())
        elif key in batch.items:  # the same key twice: never one row for two writers
            return (await self._send({key: params}))[key]
        batch.items[key] = params
        try:
            rows = await asyncio.shield(batch.done)
        except asyncio.CancelledError:
            if not batch.done.done() and self._queued.get(group) is batch:
                del batch.items[key]  # not sent yet: this row is never written
            raise
        if rows is None:
            return (await self._send({key: params}))[key]
        return rows[key]

    def _hand_over(self, group: Hashable) -> None:
        queued = self._queued.pop(group, None)
        if queued is None or not queued.items:
            self._lanes.give_back(group)
            if queued is not None:
                queued.done.set_result({})
            return
        task = asyncio.get_running_loop().create_task(self._lead(group, queued))
        self._senders.add(task)
        task.add_done_callback(self._senders.discard)

    async def _lead(self, group: Hashable, batch: _AsyncBatch) -> None:
        try:
            rows = await self._send(batch.items)
        except Exception as exc:
            batch.done.set_exception(exc)
        else:
            batch.done.set_result(rows)
        finally:
            if not batch.done.done():
                batch.done.set_result(None)
            self._hand_over(group)
