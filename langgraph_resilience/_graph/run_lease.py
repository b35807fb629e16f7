"""One run at a time on a thread with side effects, on the plain ``invoke`` path.

LangGraph runs whatever it is asked to: two runs on one thread at once (a double
submit, two workers given the same ``thread_id``) fork it, the last writer wins, and
an effect one of them made can go missing from the final thread. So a graph with side
effects takes its thread's lease for each run, at its entry, before the model is first
asked; a second run on a thread whose run is still going is refused with
`ThreadBusyError` before it does anything (its input checkpoint is left behind, older
than the first run's next one, so the thread's latest state stays the first run's).
Where the lease lives follows the ledger: a row with a fencing token beside a Postgres
ledger (`stores.leases`: every ledger write of the run carries the token), this
process otherwise (in-memory and SQLite ledgers; across processes on SQLite, hold
`thread_lock` yourself).

A run is told from another by its runtime's stream writer (``Runtime.stream_writer``):
LangGraph makes one per run and hands it to every task of that run (a timed node
attempt gets a guarding writer of its own: `current_run` finds the run's through
``runtime.control``). The lease is given back when the run routes from the agent to
its end (under `create_agent`, when the model's answer ends the run, or the last call
of a turn that ends after its tools is done), or when one of our steps raises (a
cancel, an interrupt, an error) and the run's other steps under way are done
(`create_agent` runs a turn's calls as parallel tasks: a sibling of a paused call may
still be paying); when it ends another way (a pause for a human in the user's node, an
exception there) when its writer is collected; at the latest it lapses
`DEFAULT_LEASE_TTL` after the run's last step of ours renewed it. A Postgres lease
notes the checkpoint the run took it from, so the human's answer, in any process,
takes over the lease of a run that paused since (`_pauses`). A lease that lapsed
during a long model call is taken again at the next step, unless another run took the
thread meanwhile: then this run stops (`ThreadLockLostError`).

Not taken under LangGraph Server (it runs one run per thread itself:
``runtime.server_info``), nor when the caller holds the thread's lock already
(`thread_lock`, `resume(lock=...)`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import itertools
import queue
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple
from langgraph.config import get_config
from langgraph.runtime import get_runtime

from langgraph_resilience.core.clock import SystemClock
from langgraph_resilience.core.flow import Call, Flow, adrive, drive
from langgraph_resilience.core.lease import DEFAULT_LEASE_TTL, renew_interval
from langgraph_resilience.errors import ThreadBusyError, ThreadLockLostError
from langgraph_resilience.stores.effect_ledger import EffectLedger, run_checkpointer
from langgraph_resilience.stores.held import Fence, current_fence

if TYPE_CHECKING:
    from langgraph_resilience.stores.leases import Lease, LeaseRunner

__all__ = ["RUN_LEASES", "RunLeases", "counted_step", "current_run"]

_REAL = SystemClock()


def current_run() -> Any:
    """The run the running task belongs to: the first stream writer a step of ours saw
    in it, or None outside a run or on LangGraph Server (which runs one run per thread).

    LangGraph makes one writer per run and hands it to every task, except that a timed
    node attempt (`TimeoutPolicy`) gets a guarding writer of its own: so the writer is
    found through the run's ``runtime.control`` (one per run). A fresh run's first
    step of ours is its entry, untimed, whose writer is the run's own; a resumed run's
    is a timed attempt's, which may be collected before the run ends: its lease then
    goes back early and the run's next step takes the thread again."""
    try:
        runtime, config = get_runtime(), get_config()
    except RuntimeError:  # outside a graph run
        return None
    on_server = (config.get("configurable") or {}).get("assistant_id") is not None
    if runtime is None or on_server or getattr(runtime, "server_info", None) is not None:
        return None
    writer = getattr(runtime, "stream_writer", None)
    control = getattr(runtime, "control", None)
    if writer is None or control is None:
        return writer
    with _WRITERS_GUARD:
        return _WRITERS.setdefault(control, writer)


_WRITERS: weakref.WeakValueDictionary[Any, Any] = weakref.WeakValueDictionary()
"""Each running run's ``runtime.control`` -> the first writer seen in it (kept while
that writer lives: a run's own lives as long as the run)."""
_WRITERS_GUARD = threading.Lock()


@dataclasses.dataclass(eq=False)
class _Local:
    """A lease this process keeps (in-memory and SQLite ledgers)."""

    thread_id: str
    token: int
    db: str = "local"
    owner: _LocalLeases | None = None
    touched: float = dataclasses.field(default_factory=time.monotonic)

    def check(self) -> None:
        """`ThreadLockLostError` once another run of this process holds the thread."""
        if self.owner is None or self.owner.holder(self.thread_id) is not self:
            raise ThreadLockLostError(self.thread_id, "this process")

    async def acheck(self) -> None:
        """Async `check`."""
        self.check()

    def fresh(self) -> bool:
        """Never assumed: its `check` asks no database."""
        return False

    def renew(self) -> bool:
        """Extend it; False once another run took the thread over."""
        if self.owner is None or self.owner.holder(self.thread_id) is not self:
            return False
        self.touched = time.monotonic()
        return True

    def release(self) -> None:
        if self.owner is not None:
            self.owner.give_back(self)


class _LocalLeases:
    """The threads runs of this process hold on an in-process ledger."""

    def __init__(self) -> None:
        self._held: dict[str, _Local] = {}
        self._guard = threading.Lock()
        self._tokens = itertools.count(1)

    def holder(self, thread_id: str) -> _Local | None:
        with self._guard:
            return self._held.get(thread_id)

    def take(self, thread_id: str) -> _Local:
        with self._guard:
            held = self._held.get(thread_id)
            if held is not None and time.monotonic() - held.touched < DEFAULT_LEASE_TTL:
                left = DEFAULT_LEASE_TTL - (time.monotonic() - held.touched)
                where = f"another run in this process; lapses in {left:.1f}s unless renewed"
                raise ThreadBusyError(thread_id, where)
            lease = _Local(thread_id, next(self._tokens), owner=self)
            self._held[thread_id] = lease
            return lease

    def give_back(self, lease: _Local) -> None:
        with self._guard:
            if self._held.get(lease.thread_id) is lease:
                del self._held[lease.thread_id]


_LOCAL = _LocalLeases()


@dataclasses.dataclass(eq=False)
class _Held:
    """A run's lease of one thread and when it was last renewed."""

    lease: Lease | _Local
    renewed: float


@dataclasses.dataclass(eq=False)
class _Steps:
    """A run's steps of ours on one thread: how many are under way, whether one of them
    ended the run (it raised), and the locks its lease is taken under, one at a time."""

    running: int = 0
    ended: bool = False
    taking: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    _ataking: asyncio.Lock | None = None

    def ataking(self) -> asyncio.Lock:
        """The async steps' lock (made in the run's event loop, on first use)."""
        if self._ataking is None:
            self._ataking = asyncio.Lock()
        return self._ataking


class RunLeases:
    """The thread leases the runs of one graph hold, each as long as its run lives."""

    def __init__(self) -> None:
        self._runs: weakref.WeakKeyDictionary[Any, dict[str, _Held]] = weakref.WeakKeyDictionary()
        self._steps: weakref.WeakKeyDictionary[Any, dict[str, _Steps]] = weakref.WeakKeyDictionary()
        self._guard = threading.Lock()

    def _mine(self, run: Any, key: str) -> _Held | None:
        with self._guard:
            return (self._runs.get(run) or {}).get(key)

    def _keep(self, run: Any, key: str, lease: Lease | _Local) -> _Held:
        held = _Held(lease, time.monotonic())
        with self._guard:
            known = self._runs.get(run)
            if known is None:
                known = self._runs[run] = {}
                _start_releaser()
                weakref.finalize(run, _release_all, known)
            known[key] = held
        return held

    def take(self, ledger: EffectLedger, run: Any, config: RunnableConfig) -> Fence | None:
        """The run's lease of its thread: taken now (`ThreadBusyError` when another run
        holds it), renewed, or taken again after it lapsed unclaimed. The run's steps
        take it one at a time: a resumed turn's calls may all start at once."""
        key = _key(config)
        if key is None or run is None or current_fence(key) is not None:
            return None
        runner = ledger.lease_runner
        with self._steps_of(run, key).taking:
            held = self._mine(run, key)
            if held is None:
                lease = _collected_first(lambda: _take(runner, key, config))
                return self._keep(run, key, lease).lease
            if time.monotonic() - held.renewed >= renew_interval(DEFAULT_LEASE_TTL):
                if not held.lease.renew():
                    return self._retaken(run, key, held, runner, config)
                held.renewed = time.monotonic()
            return held.lease

    async def atake(self, ledger: EffectLedger, run: Any, config: RunnableConfig) -> Fence | None:
        """Async `take`."""
        key = _key(config)
        if key is None or run is None or current_fence(key) is not None:
            return None
        runner = ledger.lease_runner
        async with self._steps_of(run, key).ataking():
            held = self._mine(run, key)
            if held is None:
                try:
                    lease = await _atake(runner, key, config)
                except ThreadBusyError:
                    gc.collect()  # see _collected_first
                    await _areleased_collected()
                    lease = await _atake(runner, key, config)
                return self._keep(run, key, lease).lease
            if time.monotonic() - held.renewed >= renew_interval(DEFAULT_LEASE_TTL):
                lease = held.lease
                renewed = lease.renew() if isinstance(lease, _Local) else await lease.arenew()
                if not renewed:
                    return self._retaken(run, key, held, runner, config)
                held.renewed = time.monotonic()
            return held.lease

    def _retaken(
        self, run: Any, key: str, held: _Held, runner: LeaseRunner | None, config: RunnableConfig
    ) -> Fence:
        """A lease that lapsed: taken again if nobody took the thread meanwhile."""
        try:
            lease = _take(runner, key, config)
        except ThreadBusyError as exc:
            raise ThreadLockLostError(key, "another run took the thread") from exc
        return self._keep(run, key, lease).lease

    def _popped(self, run: Any, config: RunnableConfig) -> Lease | _Local | None:
        key = _key(config)
        if run is None or key is None:
            return None
        with self._guard:
            held = (self._runs.get(run) or {}).pop(key, None)
        return None if held is None else held.lease

    def release(self, run: Any, config: RunnableConfig) -> None:
        """The run ends: give its lease of the thread back."""
        lease = self._popped(run, config)
        if lease is not None:
            _give_back(lease)

    async def arelease(self, run: Any, config: RunnableConfig) -> None:
        """Async `release`."""
        lease = self._popped(run, config)
        if isinstance(lease, _Local):
            lease.release()
        elif lease is not None:
            with contextlib.suppress(Exception):  # it lapses by itself
                await lease.arelease()

    @contextlib.contextmanager
    def step(self, config: RunnableConfig, *, ends_run: bool = False) -> Iterator[None]:
        """A step of the run. Anything a step raises (a cancel, an interrupt, an error)
        ends the run, as does a step that ends it (`ends_run`: `create_agent`'s tools
        step after which the run stops), and its lease of the thread goes back once its
        last step under way is done: `create_agent` runs a turn's calls as tasks of
        their own, and a call that paused for a human may have a sibling still paying,
        whose ledger writes need the lease. An attempt it abandoned may still land: its
        outcome goes to the ledger, never to the thread."""
        run, key = current_run(), _key(config)
        if run is None or key is None:
            yield
            return
        steps = self._steps_of(run, key)
        with self._guard:
            steps.running += 1
        ended = ends_run
        try:
            yield
        except BaseException:
            ended = True
            raise
        finally:
            with self._guard:
                steps.running -= 1
                steps.ended = steps.ended or ended
                last = steps.ended and steps.running == 0
            if last:
                self.release(run, config)

    def _steps_of(self, run: Any, key: str) -> _Steps:
        with self._guard:
            known = self._steps.get(run)
            if known is None:
                known = self._steps[run] = {}
            return known.setdefault(key, _Steps())

    def held(self, run: Any, config: RunnableConfig) -> Fence | None:
        """The lease the run holds on its thread, or None."""
        key = _key(config)
        found = self._mine(run, key) if key is not None and run is not None else None
        return None if found is None else found.lease


RUN_LEASES = RunLeases()
"""Every run's leases: a run is its writer, so one table serves every graph."""


def counted_step(
    config: RunnableConfig, *, leases: bool, ends_run: bool = False
) -> contextlib.AbstractContextManager[None]:
    """`RUN_LEASES.step` for a graph whose runs may hold their thread's lease (a tool
    has side effects); a graph without side effects counts nothing and pays nothing."""
    return RUN_LEASES.step(config, ends_run=ends_run) if leases else _NOT_COUNTED


_NOT_COUNTED: contextlib.AbstractContextManager[None] = contextlib.nullcontext()


def _key(config: RunnableConfig) -> str | None:
    """What a run leases: its thread (and graph, for a subgraph run: parallel subgraph
    runs on one thread are not each other's competitors)."""
    conf = config.get("configurable") or {}
    thread_id = conf.get("thread_id")
    if not thread_id:
        return None
    ns = str(conf.get("checkpoint_ns") or "").rpartition("|")[0]  # the graph's
    return str(thread_id) if not ns else f"{thread_id}|{ns}"


def _take(runner: LeaseRunner | None, key: str, config: RunnableConfig) -> Lease | _Local:
    if runner is None:
        return _LOCAL.take(key)
    return drive(_acquire(runner, key, config), _REAL)


async def _atake(runner: LeaseRunner | None, key: str, config: RunnableConfig) -> Lease | _Local:
    if runner is None:
        return _LOCAL.take(key)
    return await adrive(_acquire(runner, key, config), _REAL)


def _collected_first(take: Callable[[], Lease | _Local]) -> Lease | _Local:
    """Take a lease; refused, once more after a garbage collection: a run of this
    process that died of an exception keeps its writer (and so its lease) in the
    exception's frames, which only the collector frees."""
    try:
        return take()
    except ThreadBusyError:
        gc.collect()
        _released_collected()
        return take()


def _acquire(runner: LeaseRunner, key: str, config: RunnableConfig) -> Flow[Lease]:
    """Take the thread's lease in the ledger's database. On a thread whose checkpoint
    write just failed the lease is given up here at once: the run taking it is the one
    that failed (its step ran beside the write), and the resume that follows takes the
    thread without waiting for the row to lapse."""
    # Only a Postgres ledger has a lease runner: an in-memory run never imports psycopg.
    from langgraph_resilience.stores.leases import acquire, failed_write  # noqa: PLC0415

    since, ended = _pauses(config)
    lease = yield from acquire(
        runner,
        key,
        ttl=DEFAULT_LEASE_TTL,
        wait=False,
        clock=_REAL,
        where="this run",
        since=since,
        ended=ended,
    )
    if failed_write(key):
        lease.give_up()
    return lease


def _pauses(config: RunnableConfig) -> tuple[str | None, Callable[[str], Call] | None]:
    """The checkpoint this step runs from (a run's lease notes it), and how to tell
    that the run holding the thread has paused since the checkpoint its lease notes.

    A run that pauses for a human in a node of the user's (LangChain's
    `HumanInTheLoopMiddleware` asks in its ``after_model``) does not tell the package
    it ended, and its process may keep it (its writer) uncollected: its lease would
    refuse the human's answer, sent to another worker, until it lapsed. A pause
    leaves ``__interrupt__`` writes on the checkpoint its step ran from, and a paused
    run runs no more: one newer than the holder's noted checkpoint proves it ended.
    (A run resuming that pause notes that checkpoint or a later one, so a second
    answer sent meanwhile still finds the thread busy.)"""
    try:
        info = get_runtime().execution_info
    except RuntimeError:
        return None, None
    since = getattr(info, "checkpoint_id", None) or None
    saver, conf = run_checkpointer(config), config.get("configurable") or {}
    if since is None or not isinstance(saver, BaseCheckpointSaver):
        return since, None
    ns = str(conf.get("checkpoint_ns") or "").rpartition("|")[0]  # the graph's
    thread: RunnableConfig = {"configurable": {"thread_id": conf["thread_id"], "checkpoint_ns": ns}}
    return since, lambda noted: Call(_paused_since, _apaused_since, (saver, thread, noted))


_INTERRUPT = "__interrupt__"
"""The channel of a pause in a checkpoint's pending writes: stored by every saver, so
as fixed as the data already written."""
_LOOKBACK = 6
"""Checkpoints read back, newest first, for a pause: the pause is the last checkpoint
the paused run wrote, and its answer's run writes one or two before its first step of
ours. Each is read whole (its state too), so few."""


def _paused_since(saver: BaseCheckpointSaver[Any], thread: RunnableConfig, noted: str) -> bool:
    """Whether the thread paused after checkpoint `noted` (ids sort by time); if the
    saver cannot tell, no: the lease then lapses by itself."""
    try:
        for found in saver.list(thread, limit=_LOOKBACK):
            if (paused := _pause_at(found, noted)) is not None:
                return paused
    except Exception:  # a saver that cannot list: as before, wait for the lapse
        return False
    return False


async def _apaused_since(
    saver: BaseCheckpointSaver[Any], thread: RunnableConfig, noted: str
) -> bool:
    """Async `_paused_since`; a sync-only saver is read in a worker thread."""
    try:
        async for found in saver.alist(thread, limit=_LOOKBACK):
            if (paused := _pause_at(found, noted)) is not None:
                return paused
    except NotImplementedError:  # BaseCheckpointSaver.alist of a sync-only saver
        return await asyncio.to_thread(_paused_since, saver, thread, noted)
    except Exception:
        return False
    return False


def _pause_at(found: CheckpointTuple, noted: str) -> bool | None:
    """One checkpoint, newest first: a pause after `noted` (True), back at `noted` with
    none found (False), or read on (None)."""
    if found.checkpoint["id"] <= noted:
        return False
    return True if any(write[1] == _INTERRUPT for write in found.pending_writes or ()) else None


def _give_back(lease: Lease | _Local) -> None:
    """Release, best effort, never blocking an event loop nor waiting on a stopped one
    (a finalizer runs wherever the collector does): a lease whose release cannot go
    out is given up in this process (`Lease.give_up`) and lapses in the database."""
    if isinstance(lease, _Local):
        lease.release()
        return
    runner = lease.runner
    home = getattr(runner, "loop", None) if getattr(runner, "is_async", False) else None
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    with contextlib.suppress(Exception):  # it lapses by itself
        if home is None and getattr(runner, "is_async", False):
            lease.give_up()  # an async runner that never ran: nothing to reach it with
        elif home is None and running is None:
            lease.release()
        elif home is None and running is not None:
            running.run_in_executor(None, lease.release)
        elif home is running and running is not None:
            task = running.create_task(lease.arelease())
            _PENDING.add(task)
            task.add_done_callback(_PENDING.discard)
        elif home is not None and home.is_running():
            asyncio.run_coroutine_threadsafe(lease.arelease(), home)
        else:
            lease.give_up()


_PENDING: set[asyncio.Task[None]] = set()

_RELEASE_WAIT = 5.0
"""How long a take refused by a collected run waits for that run's lease to go back."""

_RELEASES: queue.SimpleQueue[Lease | _Local | threading.Event] = queue.SimpleQueue()
"""Leases of runs whose writer was collected, for the releaser thread to give back."""

_RELEASER: list[threading.Thread] = []
_RELEASER_GUARD = threading.Lock()


def _release_all(held: dict[str, _Held]) -> None:
    """A run's writer was collected: the run is over, however it ended.

    A finalizer runs wherever the collector does: inside a lock this very thread holds
    (``ThreadPoolExecutor.submit``'s, a lease table's), where giving a lease back would
    wait for itself forever. So it only hands each lease over, through calls that take
    no lock: to this thread's event loop, as a callback of its next turn, or to the
    releaser thread (``SimpleQueue.put`` is reentrant)."""
    leases = [item.lease for item in list(held.values())]
    held.clear()
    try:
        loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    for lease in leases:
        try:
            if loop is not None:
                loop.call_soon_threadsafe(_give_back, lease)
                continue
        except RuntimeError:  # the loop is closing: the releaser thread takes it
            pass
        _RELEASES.put(lease)


def _start_releaser() -> None:
    """Start the thread that gives back the leases `_release_all` hands over (once, from
    ordinary code: starting a thread takes locks a finalizer must not)."""
    with _RELEASER_GUARD:
        if not _RELEASER:
            thread = threading.Thread(target=_releaser, name="lgr-lease-release", daemon=True)
            thread.start()
            _RELEASER.append(thread)


def _releaser() -> None:
    while True:
        item = _RELEASES.get()
        if isinstance(item, threading.Event):
            item.set()  # a barrier: every lease handed over before it is back
        else:
            _give_back(item)


def _released_collected() -> None:
    """Wait until the leases collected runs handed over so far are given back (at most
    `_RELEASE_WAIT`): they go in order, so a barrier after them says when."""
    _start_releaser()
    done = threading.Event()
    _RELEASES.put(done)
    done.wait(_RELEASE_WAIT)


async def _areleased_collected() -> None:
    """Async `_released_collected`: this loop's own hand-overs first (its next turn),
    their async releases, then the releaser thread's."""
    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    mine = [task for task in _PENDING if task.get_loop() is loop]
    if mine:
        await asyncio.wait(mine, timeout=_RELEASE_WAIT)
    await loop.run_in_executor(None, _released_collected)
