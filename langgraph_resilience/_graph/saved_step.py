"""A side effect runs only once the step that asked for it is saved.

Under LangGraph's default ``durability="async"`` the checkpoint holding the model's
``AIMessage`` is written while the tools step already runs. If an effect lands before
that write and the process dies, the resumed thread asks the model again; the model
never saw the call and may plan it anew (other arguments, so its fingerprint does not
match): the effect runs twice, or runs without a trace in the thread. So a
side-effecting call that is about to run for the first time first reads the checkpoint
its step runs from back, until it is there, with public means only:

- which checkpoint: the tool call's ``runtime.execution_info`` (its id, and the
  graph's namespace: the task's without its last segment);
- where: the run's checkpointer, under LangGraph's public
  ``langgraph.constants.CONFIG_KEY_CHECKPOINTER`` (`stores.effect_ledger.run_checkpointer`);
- how: ``get_tuple`` / ``aget_tuple``, or, on LangGraph's Postgres savers, one indexed
  ``SELECT 1`` on the checkpoint's key over the saver's public ``conn`` under its
  ``lock`` (``get_tuple`` loads and deserializes every channel: its cost grows with the
  thread).

The first read comes at once (under ``durability="sync"`` the save came before the
step, so it finds it), then after 1 ms, doubling to 50 ms; but a read that misses while
the saver is busy (its ``lock``, which LangGraph's savers hold for each write) reads
again as soon as that write is done, up to `_EARLY_READS` times: the save is most
often the write under way, and a sleep would overshoot it. The calls of a step that
wait at once share one poll, and a checkpoint once found is remembered (`KNOWN`), so
the step's later calls read nothing. A checkpointer that
keeps its checkpoints in this process only (a plain `InMemorySaver`, or none) is not
waited for: a crash loses them with the effect's context.

A save that does not come within `SAVE_WAIT` seconds stops the run with
`StepNotSavedError`, the effect not run and its claim released: under
``durability="exit"`` (nothing is saved until the run ends) this is what a side effect
meets, so run such graphs with ``"sync"`` or ``"async"``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import threading
from typing import Any, Literal

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver, PersistentDict

from langgraph_resilience.core.clock import SystemClock
from langgraph_resilience.core.flow import Call, Flow, Sleep, adrive, drive
from langgraph_resilience.errors import StepNotSavedError

__all__ = ["KNOWN", "SAVE_WAIT", "SavedStep", "await_saved", "step_to_save", "wait_saved"]

SAVE_WAIT = 10.0
"""Seconds a side effect waits for its step's checkpoint before the run stops."""

_FIRST_POLL, _MAX_POLL = 0.001, 0.05
_EARLY_READS = 3
"""Misses that wait for the saver's write under way instead of sleeping: bounded, as a
saver shared by many runs is nearly always busy with some other run's write."""
_NS_SEP = "|"


class _Known:
    """The checkpoints this process found saved (the latest `KEEP`): a step's later
    calls, and its retries, need not read them again."""

    KEEP = 1024

    def __init__(self) -> None:
        self._keys: collections.OrderedDict[tuple[str, str, str], None] = collections.OrderedDict()
        self._lock = threading.Lock()

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._keys

    def add(self, key: tuple[str, str, str]) -> None:
        with self._lock:
            self._keys[key] = None
            while len(self._keys) > self.KEEP:
                self._keys.popitem(last=False)


KNOWN = _Known()
"""Process-wide: a checkpoint saved once stays saved (ids are never reused)."""


@dataclasses.dataclass(frozen=True, slots=True)
class SavedStep:
    """The checkpoint a side-effecting call's step runs from, and where to read it."""

    checkpointer: BaseCheckpointSaver[Any]
    config: RunnableConfig

    @property
    def key(self) -> tuple[str, str, str]:
        conf = self.config["configurable"]
        return (str(conf["thread_id"]), str(conf["checkpoint_ns"]), str(conf["checkpoint_id"]))


def step_to_save(checkpointer: Any, runtime: Any) -> SavedStep | None:
    """The checkpoint a side effect must wait for (None: nothing to wait for), from
    the run's checkpointer and the tool call's runtime (``ToolRuntime``)."""
    info = getattr(runtime, "execution_info", None)
    if info is None or not info.thread_id or not isinstance(checkpointer, BaseCheckpointSaver):
        return None
    if not _outlives_process(checkpointer):
        return None
    ns = info.checkpoint_ns.rpartition(_NS_SEP)[0]  # the graph's, not the task's
    saved: RunnableConfig = {
        "configurable": {
            "thread_id": info.thread_id,
            "checkpoint_ns": ns,
            "checkpoint_id": info.checkpoint_id,
        }
    }
    step = SavedStep(checkpointer, saved)
    return None if step.key in KNOWN else step


_Ended = Literal["found", "timed out", "stopped"]


@dataclasses.dataclass(eq=False, slots=True)
class _Poll:
    """One poll of a checkpoint, which every call of its step that comes meanwhile
    waits for instead of polling it too: sixteen parallel calls polling one checkpoint
    took the pool its save needs."""

    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    ended: _Ended = "stopped"


_POLLS: dict[tuple[str, str, str], _Poll] = {}
"""Process-wide: the checkpoints being read back now, for a sync step's calls."""
_APOLLS: dict[tuple[int, tuple[str, str, str]], asyncio.Future[_Ended]] = {}
"""The same for the tasks of each event loop."""
_POLLS_LOCK = threading.Lock()


def wait_saved(step: SavedStep, tool: str) -> None:
    """Return once `step`'s checkpoint can be read back (sync runs); the calls of a
    step share one poll."""
    with _POLLS_LOCK:
        poll = _POLLS.get(step.key)
        if poll is None:
            poll = _POLLS[step.key] = _Poll()
            first = True
        else:
            first = False
    if not first:
        poll.done.wait(SAVE_WAIT + _MAX_POLL)
        if not _answered_by(poll.ended, step, tool):
            drive(_until_saved(step, tool), _REAL_TIME)
        return
    try:
        drive(_until_saved(step, tool), _REAL_TIME)
        poll.ended = "found"
    except StepNotSavedError:
        poll.ended = "timed out"
        raise
    finally:
        with _POLLS_LOCK:
            del _POLLS[step.key]
        poll.done.set()


async def await_saved(step: SavedStep, tool: str) -> None:
    """Return once `step`'s checkpoint can be read back (async runs); the calls of a
    step share one poll."""
    loop = asyncio.get_running_loop()
    key = (id(loop), step.key)
    poll = _APOLLS.get(key)
    if poll is not None:
        if not _answered_by(await asyncio.shield(poll), step, tool):
            await adrive(_until_saved(step, tool), _REAL_TIME)
        return
    poll = _APOLLS[key] = loop.create_future()
    outcome: _Ended = "stopped"
    try:
        await adrive(_until_saved(step, tool), _REAL_TIME)
        outcome = "found"
    except StepNotSavedError:
        outcome = "timed out"
        raise
    finally:
        del _APOLLS[key]
        poll.set_result(outcome)


def _answered_by(ended: _Ended, step: SavedStep, tool: str) -> bool:
    """Whether another call's poll answered this call's wait: found, or timed out (this
    call's wait fails too). One stopped otherwise (its call was interrupted) leaves this
    call to poll on its own."""
    if ended == "found" or step.key in KNOWN:
        return True
    if ended == "timed out":
        raise StepNotSavedError(tool, SAVE_WAIT)
    return False


_REAL_TIME = SystemClock()
"""The wait is for a real write, never the graph's (maybe fake) clock."""


def _until_saved(step: SavedStep, tool: str) -> Flow[None]:
    """Read the checkpoint back until it is there, for `SAVE_WAIT` seconds in all: at
    once, then after 1 ms, doubling to 50 ms. A failed read counts as not saved yet."""
    waited, delay, early = 0.0, _FIRST_POLL, _EARLY_READS
    last: Exception | None = None
    lock = _write_lock(step.checkpointer)
    while True:
        try:
            found = yield _read(step)
        except Exception as exc:
            found, last = False, exc
        if found:
            KNOWN.add(step.key)
            return
        if waited >= SAVE_WAIT:
            raise StepNotSavedError(tool, SAVE_WAIT) from last
        if lock is not None and early:
            early -= 1
            try:
                behind: float = yield Call(_after_write, _aafter_write, (lock, _MAX_POLL))
            except Exception:  # a lock this loop cannot wait on (another loop's): poll
                behind, lock = 0.0, None
            if behind:
                waited += behind
                continue
        delay = min(delay, SAVE_WAIT - waited)
        yield Sleep(delay)
        waited += delay
        delay = min(delay * 2, _MAX_POLL)


_THREAD_LOCK = type(threading.Lock())


def _write_lock(saver: BaseCheckpointSaver[Any]) -> Any:
    """The lock `saver` holds while it writes (LangGraph's Postgres and SQLite savers
    have one, ``lock``), when it is a plain lock this module can wait on; else None."""
    lock = getattr(saver, "lock", None)
    return lock if isinstance(lock, (_THREAD_LOCK, asyncio.Lock)) else None


def _after_write(lock: Any, most: float) -> float:
    """Wait for the write under way on `lock`, at most `most` seconds: the seconds
    waited, 0.0 when none was under way (or the lock is an event loop's)."""
    if not isinstance(lock, _THREAD_LOCK) or not lock.locked():
        return 0.0
    start = _REAL_TIME.monotonic()
    if lock.acquire(timeout=most):
        lock.release()
    return max(_REAL_TIME.monotonic() - start, 1e-6)


async def _aafter_write(lock: Any, most: float) -> float:
    """Async `_after_write` (a sync saver's lock waited on in a worker thread)."""
    if not lock.locked():
        return 0.0
    if not isinstance(lock, asyncio.Lock):
        return await asyncio.to_thread(_after_write, lock, most)
    start = _REAL_TIME.monotonic()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(lock.acquire(), most)
        lock.release()
    return max(_REAL_TIME.monotonic() - start, 1e-6)


_EXISTS_SQL = (
    "SELECT 1 AS found FROM checkpoints WHERE thread_id = %(thread_id)s "
    "AND checkpoint_ns = %(checkpoint_ns)s AND checkpoint_id = %(checkpoint_id)s"
)

_POSTGRES_SAVERS = {
    ("langgraph.checkpoint.postgres", "PostgresSaver"),
    ("langgraph.checkpoint.postgres.aio", "AsyncPostgresSaver"),
}
"""LangGraph's Postgres savers, exactly (a subclass may write differently): their
checkpoint row is read with one indexed statement."""


def _read(step: SavedStep) -> Call:
    """One read of `step`'s checkpoint: truthy once it is saved. `PostgresSaver.put`
    writes the channel blobs before the checkpoint row, so the row being visible means
    the whole checkpoint is."""
    saver = step.checkpointer
    kind = (type(saver).__module__, type(saver).__qualname__)
    if kind in _POSTGRES_SAVERS:  # by name: an in-memory user never imports psycopg
        from langgraph_resilience.stores.postgres import Postgres  # noqa: PLC0415

        pg = Postgres(
            saver.conn,  # type: ignore[attr-defined]
            owner=type(saver).__name__,
            is_async=kind[1] == "AsyncPostgresSaver",
            lock=saver.lock,  # type: ignore[attr-defined]
        )
        return Call(pg.rows, pg.arows, (_EXISTS_SQL, step.config["configurable"]))
    return Call(saver.get_tuple, saver.aget_tuple, (step.config,))


def _outlives_process(checkpointer: BaseCheckpointSaver[Any]) -> bool:
    """Whether `checkpointer` keeps checkpoints a crash of this process does not lose."""
    if type(checkpointer) is InMemorySaver:
        return isinstance(checkpointer.storage, PersistentDict)  # `langgraph dev`'s
    return True
