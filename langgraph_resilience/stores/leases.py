"""Thread leases: one runner per thread on PostgreSQL, with no session state.

A `Lease` is a row of ``lgr_thread_leases`` (`langgraph_resilience.stores.lease_sql`)
with a fencing token: `acquire` takes it in one statement (waiting, when asked, by
asking again with a backoff slept on the injected clock), its holder renews it in the
background every third of its TTL (a daemon thread for a sync holder, a task for an
async one) and releases it in one statement. A holder that crashes stops renewing:
its lease lapses `ttl` seconds later (30 by default) and the next `acquire` takes the
thread over with a greater token. Nothing here lives in a database session, so a
lease holds the same straight to PostgreSQL and through a transaction pooler.

A held lease is the thread's fence (`langgraph_resilience.stores.held.Fence`): its
`token` travels with every ledger write of the run, which the database refuses once a
newer holder exists, and `Lease.check` (one statement) stops a run before a checkpoint
write or a side effect once its lease is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import psycopg

from langgraph_resilience.core.backoff import ledger_retry_delay
from langgraph_resilience.core.clock import Clock, SystemClock
from langgraph_resilience.core.flow import Call, Flow, Sleep, adrive, drive
from langgraph_resilience.core.lease import (
    check_margin,
    poll_delay,
    renew_interval,
    renew_retry,
    wait_seconds,
)
from langgraph_resilience.errors import (
    ConfigurationError,
    PersistenceError,
    SetupTimeoutError,
    ThreadBusyError,
    ThreadLockLostError,
)
from langgraph_resilience.events import logger
from langgraph_resilience.stores import lease_sql
from langgraph_resilience.stores.postgres import first_line

__all__ = ["Lease", "LeaseRunner", "abandon", "acquire", "ensure_schema", "holder_prefix"]

_REAL = SystemClock()
"""Renewals run on real time: the lease lapses on the database's clock."""


def _since_boot() -> float | None:
    """Seconds on a clock that keeps counting while the machine sleeps (Linux's
    ``CLOCK_BOOTTIME``), or None where there is none: a lease's local freshness must
    not survive a suspend that the database's clock saw pass."""
    boot = getattr(time, "CLOCK_BOOTTIME", None)
    return None if boot is None else time.clock_gettime(boot)


_LIVE: dict[str, str] = {}
"""This process's holders still in use (holder -> thread), from before their
acquisition until they are given back or given up: a holder of this process missing
here is dead, and its lease is taken over at once (`acquire`)."""
_LIVE_GUARD = threading.Lock()


def _live(holder: str, thread_id: str | None) -> None:
    with _LIVE_GUARD:
        if thread_id is None:
            _LIVE.pop(holder, None)
        else:
            _LIVE[holder] = thread_id


_FAILED_WRITES: set[str] = set()
"""Threads whose last checkpoint write in this process failed (`abandon`), until one
succeeds (`written`): the run that wrote it is over, whatever it still does."""


def abandon(thread_id: str) -> None:
    """This process's runs on `thread_id` are over though their leases may still stand
    (a checkpoint write failed with the database gone, so no release can reach it):
    the next runner of this process takes the thread over at once. That includes a
    lease the failed run takes after the write failed (LangGraph surfaces the failure
    once the step running beside the write ends): see `failed_write`."""
    with _LIVE_GUARD:
        _FAILED_WRITES.add(thread_id)
        for holder in [h for h, t in _LIVE.items() if t == thread_id]:
            del _LIVE[holder]


def written(thread_id: str) -> None:
    """A checkpoint of `thread_id` was written: a run on it is going again."""
    if thread_id in _FAILED_WRITES:
        with _LIVE_GUARD:
            _FAILED_WRITES.discard(thread_id)


def failed_write(thread_id: str) -> bool:
    """Whether the last checkpoint write of `thread_id` in this process failed: a run
    lease taken now belongs to a run that is over (or to a new one that has not written
    yet, which loses nothing by it: the database still fences by token)."""
    return thread_id in _FAILED_WRITES


class LeaseRunner(Protocol):
    """Where lease statements run: each one its own transaction, its rows as dicts."""

    def rows(self, query: str, params: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
        """Run one statement (committed); its rows."""
        ...

    async def arows(self, query: str, params: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
        """Async `rows`."""
        ...

    def transaction(self, statements: tuple[str, ...]) -> None:
        """Run `statements` (no parameters) in one transaction."""
        ...

    async def atransaction(self, statements: tuple[str, ...]) -> None:
        """Async `transaction`."""
        ...


def holder_prefix() -> str:
    """``host:pid``: whose leases are this process's (read each time: a fork is another)."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclasses.dataclass(eq=False, slots=True)
class Lease:
    """A held thread lease: the thread's fence while its run goes on.

    `token` is greater than every earlier holder's token of the thread; `check` asks the
    database, in one statement, whether it is still the current one with more than a
    third of its TTL left; `lost` is set once a check or a renewal found it gone.
    """

    thread_id: str
    token: int
    db: str
    """The database it is held in: a write to another database is not fenced by it."""
    holder: str
    ttl: float
    runner: LeaseRunner = dataclasses.field(repr=False)
    where: str = ""
    lost: bool = False
    confirmed: float | None = None
    """When (`_since_boot`) the statement that last set its expiry to a full TTL was
    sent: its expiry is at least that plus `ttl`, whatever the database's clock says."""
    _ended: bool = False
    _stop: threading.Event | None = dataclasses.field(default=None, repr=False)
    _task: asyncio.Task[None] | None = dataclasses.field(default=None, repr=False)

    def _params(self, **extra: Any) -> dict[str, Any]:
        return {"thread_id": self.thread_id, "token": self.token, **extra}

    def _lost(self) -> ThreadLockLostError:
        """The error of a lease found gone. It is dead for this process from now on
        (`give_up`): the run that held it stops, and the next runner of this process
        (the resume) takes the thread over at once, with a greater token, instead of
        waiting for a row no one renews to lapse."""
        self.give_up()
        self.lost = True
        return ThreadLockLostError(self.thread_id, self.where)

    def _statement(self, query: str, **extra: Any) -> Call:
        return Call(self.runner.rows, self.runner.arows, (query, self._params(**extra)))

    def _checked(self) -> Flow[None]:
        """The fence check: one statement, sent again once on a broken connection; a
        database that still does not answer counts as lost (the run stops, resumes later).
        A lease still held but near its end (a step slowed by load outlasted the
        renewals) is renewed on the spot: only one taken over or lapsed is lost."""
        if self.lost:
            raise self._lost()
        for attempt in (1, 2):
            try:
                rows = yield self._statement(lease_sql.CHECK, margin=check_margin(self.ttl))
                if not rows:
                    sent = _since_boot()
                    rows = yield self._statement(lease_sql.RENEW, ttl=self.ttl)
                    if rows:
                        self._confirm(sent)
            except psycopg.OperationalError:
                if attempt == 2:
                    raise self._lost() from None
                continue
            except psycopg.Error:
                raise self._lost() from None
            if not rows:
                raise self._lost()
            return

    def fresh(self) -> bool:
        """Whether this process knows, without asking, that the lease has more than a
        third of its TTL left: renewed recently enough, and not lost, given up or back. It
        says nothing of a takeover: only a fenced write or `check` does."""
        now, confirmed = _since_boot(), self.confirmed
        if now is None or confirmed is None or self.lost or self._ended:
            return False
        return now - confirmed < self.ttl - check_margin(self.ttl)

    def _confirm(self, sent: float | None) -> None:
        if sent is not None and (self.confirmed is None or sent > self.confirmed):
            self.confirmed = sent

    def check(self) -> None:
        """Raise `ThreadLockLostError` unless the lease is still the thread's current one
        with more than a third of its TTL left (one statement)."""
        drive(self._checked(), _REAL)

    async def acheck(self) -> None:
        """Async `check`."""
        await adrive(self._checked(), _REAL)

    def _renewed(self) -> Flow[bool]:
        sent = _since_boot()
        if not (yield self._statement(lease_sql.RENEW, ttl=self.ttl)):
            self._lost()
        else:
            self._confirm(sent)
        return not self.lost

    def renew(self) -> bool:
        """Extend the lease by its TTL; False (and `lost`) once it is gone."""
        return drive(self._renewed(), _REAL)

    async def arenew(self) -> bool:
        """Async `renew`."""
        return await adrive(self._renewed(), _REAL)

    # ----------------------------------------------------------- in the background

    def start_renewal(self) -> None:
        """Renew on a daemon thread until `release`."""
        self._stop = threading.Event()
        threading.Thread(
            target=self._renewing, args=(self._stop,), name="lgr-lease", daemon=True
        ).start()

    def _renewing(self, stop: threading.Event) -> None:
        delay, answered = renew_interval(self.ttl), _REAL.monotonic()
        while not stop.wait(delay):  # woken at once by release
            try:
                if not self.renew():
                    return
                delay, answered = renew_interval(self.ttl), _REAL.monotonic()
            except Exception as exc:  # the database did not answer: try again soon
                if self._lapsed(answered, exc):
                    return
                delay = renew_retry(self.ttl)

    def _lapsed(self, answered: float, exc: Exception) -> bool:
        """Whether renewals have failed for a whole TTL since one last answered: the lease
        has lapsed in the database, where a renewal can no longer succeed, so the renewer
        stops and the lease is lost (said once) rather than asked about forever, as it was
        through a pool or connection closed under it."""
        if _REAL.monotonic() - answered < self.ttl:
            return False
        self._lost()
        logger.warning(
            "lease of thread %r lost: no renewal answered for %gs (%s); the run holding it "
            "stops at its next fence check",
            self.thread_id,
            self.ttl,
            first_line(exc),
        )
        return True

    def astart_renewal(self) -> None:
        """Renew in a task on the running loop until `arelease`."""
        self._task = asyncio.get_running_loop().create_task(self._arenewing())

    async def _arenewing(self) -> None:
        delay, answered = renew_interval(self.ttl), _REAL.monotonic()
        while True:
            await _REAL.asleep(delay)
            try:
                if not await self.arenew():
                    return
                delay, answered = renew_interval(self.ttl), _REAL.monotonic()
            except Exception as exc:
                if self._lapsed(answered, exc):
                    return
                delay = renew_retry(self.ttl)

    def _released(self) -> Flow[None]:
        """Give the lease back: sent again once on a broken connection; a failure leaves
        it to lapse."""
        for _ in (1, 2):
            try:
                yield self._statement(lease_sql.RELEASE)
                return
            except Exception:  # once more, then let it lapse
                continue

    def give_up(self) -> None:
        """Stop renewing and count the lease dead in this process, without a statement:
        it lapses in the database, and this process takes the thread over at once."""
        self._ended = True
        if self._stop is not None:
            self._stop.set()
        _live(self.holder, None)

    def release(self) -> None:
        """Stop renewing and give the lease back (given up here even if the statement
        cannot reach the database)."""
        self._ended = True
        if self._stop is not None:
            self._stop.set()
        _live(self.holder, None)
        drive(self._released(), _REAL)

    async def arelease(self) -> None:
        """Async `release`."""
        self._ended = True
        task, self._task = self._task, None
        _live(self.holder, None)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await adrive(self._released(), _REAL)


def ensure_schema(runner: LeaseRunner, where: str = "") -> Flow[None]:
    """Create the lease table and its functions (one bounded transaction)."""
    statements = lease_sql.setup_transaction(lease_sql.LEASE_DDL)
    try:
        yield Call(runner.transaction, runner.atransaction, (statements,))
    except psycopg.errors.LockNotAvailable as exc:
        raise SetupTimeoutError.waiting(lease_sql.LEASE_TABLE) from exc
    except psycopg.Error as exc:
        raise PersistenceError(
            f"cannot create {lease_sql.LEASE_TABLE} at {where}: {first_line(exc)}; run "
            "open_postgres(dsn) once as a role that may create tables"
        ) from None


def _schema_missing(exc: BaseException) -> bool:
    """The lease table is missing, or predates a function of ours (a database set up by
    an older version, refused by the runner as `ConfigurationError`): `ensure_schema`
    adds what is missing."""
    cause = exc.__cause__ if isinstance(exc, ConfigurationError) else exc
    return isinstance(cause, (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedFunction))


def _busy(thread_id: str, where: str, row: Mapping[str, Any] | None) -> ThreadBusyError:
    """Who holds the thread, as precisely as the refusal said."""
    if row is None or row.get("holder") is None:
        return ThreadBusyError(thread_id, where)
    holder, left = str(row["holder"]).partition("@")[0], row.get("expires_in")
    mine = " (another run in this process)" if holder.rsplit(":", 1)[0] == holder_prefix() else ""
    lapses = "" if left is None else f", lapses in {float(left):.1f}s unless renewed"
    return ThreadBusyError(thread_id, f"{where}; held by {holder}{mine}{lapses}")


def acquire(
    runner: LeaseRunner,
    thread_id: str,
    *,
    ttl: float,
    wait: bool | float,
    clock: Clock,
    where: str = "",
    since: str | None = None,
    ended: Callable[[str], Call] | None = None,
) -> Flow[Lease]:
    """Take the thread's lease: at once, or asking again until `wait` runs out
    (`ThreadBusyError`). A database without the lease table gets it created first.

    A run's lease notes the checkpoint its step ran from (`since`, kept in ``holder``
    after an ``@``); `ended` asks whether the thread shows that the run holding it
    has ended since the checkpoint its own lease notes (it paused for a human): such
    a lease is taken over at once, like a dead process's."""
    bound = wait_seconds(wait)
    holder = f"{holder_prefix()}:{uuid.uuid4().hex[:12]}" + (f"@{since}" if since else "")
    params = {"thread_id": thread_id, "holder": holder, "ttl": ttl, "dead": None}
    _live(holder, thread_id)  # before the statement: it may take the lease unanswered
    try:
        return (
            yield from _acquiring(
                runner, params, bound=bound, clock=clock, where=where, ended=ended
            )
        )
    except BaseException:
        _live(holder, None)
        raise


def _acquiring(
    runner: LeaseRunner,
    params: dict[str, Any],
    *,
    bound: float | None,
    clock: Clock,
    where: str,
    ended: Callable[[str], Call] | None = None,
) -> Flow[Lease]:
    """`acquire`'s loop: ask, and ask again, until taken, refused for good, or failed."""
    thread_id, holder, ttl = str(params["thread_id"]), str(params["holder"]), params["ttl"]
    started: float = yield Call(clock.monotonic)
    attempt, failures, created = 0, 0, False
    judged: set[str] = set()
    while True:
        sent = _since_boot()
        try:
            rows = yield Call(runner.rows, runner.arows, (lease_sql.ACQUIRE, params))
        except (
            psycopg.errors.UndefinedTable,
            psycopg.errors.UndefinedFunction,
            ConfigurationError,
        ) as exc:
            if created or not _schema_missing(exc):
                raise
            yield from ensure_schema(runner, where)
            created = True
            continue
        except psycopg.OperationalError as exc:  # it may have been taken: ask again, as us
            failures += 1
            delay = ledger_retry_delay(failures)
            if delay is None:
                yield from _forget(runner, thread_id, holder)
                raise PersistenceError(
                    f"cannot take the lease of thread {thread_id!r} at {where}: "
                    f"{first_line(exc)}; nothing ran: try again once PostgreSQL answers"
                ) from None
            yield Sleep(delay)
            continue
        row = rows[0] if rows else None
        if row is not None and row["token"] is not None:
            token, db = int(row["token"]), str(row["db"])
            return Lease(thread_id, token, db, holder, ttl, runner, where, confirmed=sent)
        if row is not None and row["holder"] != params["dead"] and _gone(row["holder"]):
            params["dead"] = row["holder"]  # take it over now, not when it lapses
            continue
        refused_by = None if row is None else str(row["holder"])
        if ended is not None and refused_by is not None and refused_by not in judged:
            judged.add(refused_by)  # asked once per holder, however long we wait
            noted = _noted(refused_by)
            if noted is not None and (yield ended(noted)):
                params["dead"] = refused_by  # its run paused: take it over now
                continue
        now: float = yield Call(clock.monotonic)
        left = None if bound is None else bound - (now - started)
        if left is not None and left <= 0:
            raise _busy(thread_id, where, row)
        attempt += 1
        expires_in = None if row is None or row["expires_in"] is None else row["expires_in"]
        yield Sleep(poll_delay(attempt, expires_in=expires_in, left=left))


def _noted(holder: str | None) -> str | None:
    """The checkpoint a run's lease notes (see `acquire`), or None."""
    return (holder or "").partition("@")[2] or None


def _gone(holder: str | None) -> bool:
    """Whether `holder` is known dead: one of this process's that was given back or
    given up (`abandon`), or a process of this host that no longer runs (a crashed
    run): its lease need not lapse first. Safe if wrong: the takeover's greater token
    fences whatever a holder still alive would write."""
    host, _, rest = (holder or "").partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    if int(pid) == os.getpid():
        with _LIVE_GUARD:
            return holder not in _LIVE
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:  # someone else's process: alive
        return False
    try:  # a killed child its parent has not reaped yet is a zombie: dead too
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rpartition(")")[2].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def _forget(runner: LeaseRunner, thread_id: str, holder: str) -> Flow[None]:
    """Give back a lease that an unanswered statement may have taken for `holder` (best
    effort: a lease nobody renews lapses anyway)."""
    params = {"thread_id": thread_id, "holder": holder}
    with contextlib.suppress(psycopg.Error):
        yield Call(runner.rows, runner.arows, (lease_sql.FORGET, params))


def held_by(runner: LeaseRunner, thread_id: str) -> Flow[bool]:
    """Whether anyone holds the thread's lease now (reads only; no table: nobody)."""
    try:
        rows = yield Call(
            runner.rows, runner.arows, (lease_sql.HOLDER_OF, {"thread_id": thread_id})
        )
    except psycopg.errors.UndefinedTable:
        return False
    return bool(rows)
