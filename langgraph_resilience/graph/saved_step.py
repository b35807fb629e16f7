"""A side effect runs only once the step that asked for it is saved.

Under LangGraph's default ``durability="async"`` the checkpoint holding the model's
``AIMessage`` is written while the tools step already runs. If an effect lands before
that write and the process dies, the resumed thread asks the model again; the model
never saw the call and may plan it anew (other arguments, so its fingerprint does not
match): the effect runs twice, or runs without a trace in the thread. So a
side-effecting call that is about to run for the first time first waits until the
checkpoint its step runs from is saved: it wakes as soon as this process's save of it
returns (`seen_saves`), and, for a save made elsewhere or not seen, reads the
checkpointer back on a short, bounded backoff. On LangGraph's Postgres savers a read is
one indexed ``SELECT 1`` on the checkpoint's key (`_PostgresProbe`), not ``get_tuple``,
which loads and deserializes every channel and so costs more the longer the thread.

- ``durability="sync"`` (what `resume` uses): the save came before the step; no read.
- ``durability="exit"``: nothing is saved until the run ends, so no wait can help; a
  side effect there is refused at once (`ConfigurationError`), before anything runs.
- A checkpointer that keeps its checkpoints in this process only (a plain
  `InMemorySaver`, or none): a crash loses them with the effect's context; no read.

A save that does not come within `SAVE_WAIT` seconds stops the run with
`StepNotSavedError`, the effect not run and its claim released.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver, PersistentDict
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

from langgraph_resilience.core.clock import SystemClock
from langgraph_resilience.core.flow import Call, Flow, adrive, drive
from langgraph_resilience.errors import ConfigurationError, StepNotSavedError
from langgraph_resilience.graph.seen_saves import (
    SaveKey,
    created_ticks,
    key_of,
    now_ticks,
    seen,
    watch,
)

__all__ = ["SAVE_WAIT", "SavedStep", "await_saved", "step_to_save", "wait_saved"]

SAVE_WAIT = 10.0
"""Seconds a side effect waits for its step's checkpoint before the run stops."""

_FIRST_POLL, _MAX_POLL = 0.001, 0.05
_BACKSTOP = 1.0
"""The first wait (doubling) before a backstop read of a checkpoint whose save, or
load, this process will note (`_noted_here`)."""

# LangGraph's own keys in a task's ``configurable`` (langgraph._internal._constants).
_CHECKPOINTER, _DURABILITY = "__pregel_checkpointer", "__pregel_durability"
_NS_SEP = "|"


@dataclasses.dataclass(frozen=True, slots=True)
class SavedStep:
    """The checkpoint a side-effecting call's step runs from, and where to read it."""

    checkpointer: BaseCheckpointSaver[Any]
    config: RunnableConfig

    @property
    def key(self) -> SaveKey:
        """The checkpoint's key among the saves this process has seen."""
        conf = self.config["configurable"]
        return key_of(conf, conf["checkpoint_id"])


def step_to_save(config: Mapping[str, Any], tool: str) -> SavedStep | None:
    """The checkpoint `tool`'s effect must wait for (None: nothing to wait for).

    Raises `ConfigurationError` under ``durability="exit"`` with a checkpointer that
    outlives the process: an effect there cannot be made safe across a crash."""
    conf = config.get("configurable") or {}
    checkpointer = conf.get(_CHECKPOINTER)
    durability = conf.get(_DURABILITY, "async")
    if durability == "sync" or not isinstance(checkpointer, BaseCheckpointSaver):
        return None
    if not _outlives_process(checkpointer):
        return None
    if durability == "exit":
        raise ConfigurationError(
            f"{tool!r} has side effects and the graph runs with durability='exit' on "
            f"{type(checkpointer).__name__}: nothing is saved until the run ends, so after "
            "a crash the model is asked again and may plan the effect anew; run it with "
            "durability='sync' (or 'async')"
        )
    ns = str(conf.get("checkpoint_ns", "")).rpartition(_NS_SEP)[0]  # the graph's, not the task's
    checkpoint_id = (conf.get("checkpoint_map") or {}).get(ns)
    if not checkpoint_id:
        return None
    saved: RunnableConfig = {
        "configurable": {
            "thread_id": conf.get("thread_id"),
            "checkpoint_ns": ns,
            "checkpoint_id": checkpoint_id,
        }
    }
    return SavedStep(checkpointer, saved)


def wait_saved(step: SavedStep, tool: str) -> None:
    """Return once `step`'s checkpoint can be read back (sync runs)."""
    drive(_until_saved(step, tool), _REAL_TIME)


async def await_saved(step: SavedStep, tool: str) -> None:
    """Return once `step`'s checkpoint can be read back (async runs)."""
    await adrive(_until_saved(step, tool), _REAL_TIME)


_REAL_TIME = SystemClock()
"""The wait is for a real write of this process, never the graph's (maybe fake) clock."""


def _until_saved(step: SavedStep, tool: str) -> Flow[None]:
    """Wait for this process's save of the checkpoint, for `SAVE_WAIT` seconds in all.

    After each wait (1 ms, doubling to 50 ms) in which no save of it ran here, read it
    back, as it may have been saved elsewhere. When its save (or its load, for a run
    that resumed from it) is sure to be noted here (`_noted_here`), the note wakes the
    wait, and a read is only a backstop: after 1 s, then doubling. Under load a save
    queues behind others for hundreds of milliseconds, and a read every 50 ms cost the
    CPU the saves need. A failed read counts as not saved yet."""
    noted_here = _noted_here(step, watch(step.checkpointer))
    record, read, waited = seen(step.key), _read(step), 0.0
    delay = min(_BACKSTOP if noted_here else _FIRST_POLL, SAVE_WAIT)  # woken by the save
    ceiling = SAVE_WAIT if noted_here else _MAX_POLL
    last: Exception | None = None
    while True:
        if (yield Call(record.wait, record.await_, (delay,))):
            return
        waited += delay
        if not record.saving:
            try:
                found = yield read
            except Exception as exc:
                found, last = False, exc
            if found:
                return
        if waited >= SAVE_WAIT:
            raise StepNotSavedError(tool, SAVE_WAIT) from last
        delay = min(delay * 2, ceiling, SAVE_WAIT - waited)


def _noted_here(step: SavedStep, watched_since: int | None) -> bool:
    """Whether this process will note the checkpoint's save: LangGraph made it after
    the saver was watched, and less than `SAVE_WAIT` ago. A checkpoint this run's loop
    made is saved by this process, through the watched ``put``; one it loaded (a
    resumed or re-queued run, from another worker's save) was noted by the watched
    ``get_tuple`` as it loaded; anything else is found by the backstop read."""
    created = created_ticks(step.config["configurable"]["checkpoint_id"])
    if watched_since is None or created is None or created <= watched_since:
        return False
    return now_ticks() - created < SAVE_WAIT * _TICKS_PER_SECOND


_TICKS_PER_SECOND = 10_000_000


_EXISTS_SQL = (
    "SELECT 1 FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = %s AND checkpoint_id = %s"
)


class _PostgresProbe:
    """Whether a checkpoint row exists, on the saver's own connection and lock.

    `PostgresSaver.put` writes the channel blobs before the checkpoint row, so the row
    being visible means the whole checkpoint is. `_cursor` is the savers' own (private)
    way to their connection, as `stores.threads` uses it for the thread listing. The face
    the saver lacks (a sync read of `AsyncPostgresSaver`, an async one of
    `PostgresSaver`) falls back to its own ``get_tuple`` / ``aget_tuple``."""

    def __init__(self, step: SavedStep) -> None:
        conf = step.config["configurable"]
        self.step = step
        self.params = (conf["thread_id"], conf["checkpoint_ns"], conf["checkpoint_id"])

    def exists(self) -> bool:
        saver = self.step.checkpointer
        if not isinstance(saver, PostgresSaver):
            return saver.get_tuple(self.step.config) is not None
        with saver._cursor() as cur:
            cur.execute(_EXISTS_SQL, self.params)
            return cur.fetchone() is not None

    async def aexists(self) -> bool:
        saver = self.step.checkpointer
        if not isinstance(saver, AsyncPostgresSaver):
            return await saver.aget_tuple(self.step.config) is not None
        async with saver._cursor() as cur:
            await cur.execute(_EXISTS_SQL, self.params)
            return await cur.fetchone() is not None


def _read(step: SavedStep) -> Call:
    """One read of `step`'s checkpoint: truthy once it is saved."""
    saver = step.checkpointer
    if type(saver) in (PostgresSaver, AsyncPostgresSaver):
        probe = _PostgresProbe(step)
        return Call(probe.exists, probe.aexists)
    return Call(saver.get_tuple, saver.aget_tuple, (step.config,))


def _outlives_process(checkpointer: BaseCheckpointSaver[Any]) -> bool:
    """Whether `checkpointer` keeps checkpoints a crash of this process does not lose."""
    if type(checkpointer) is InMemorySaver:
        return isinstance(checkpointer.storage, PersistentDict)  # `langgraph dev`'s
    return True
