"""The side-effect ledger follows the persistence the user already chose (safe by default).

A `ToolProfile(side_effect=True)` is exactly-once only if its intents survive what
the checkpoints survive: an in-process ledger next to a Postgres checkpointer
forgets the intent in a crash while the checkpoint remembers the step, so the
resumed step pays twice. So when ``add_resilience`` gets no ``idempotency=``, the
ledger of a run is chosen from the checkpointer LangGraph runs it with (the one
the graph was compiled with, or the one a server injects):

- one opened by `open_postgres` / `open_sqlite`: the ledger they opened with it;
- LangGraph's `PostgresSaver` / `AsyncPostgresSaver`: our tables in the same
  database, over the saver's own pool, or its single connection under the saver's
  own ``lock`` (as ``from_conn_string`` opens it: never used by both at once);
- LangGraph's `SqliteSaver` / `AsyncSqliteSaver`: our tables in the same file, on a
  connection of ours;
- an `InMemorySaver` that persists to a file (its storage a LangGraph
  ``PersistentDict``, as ``langgraph dev`` keeps threads in ``.langgraph_api/``
  across restarts): our SQLite tables in a file beside it, ``lgr_ledger.sqlite``;
- `InMemorySaver`, or no checkpointer at all: in this process, like the checkpoints
  (beside an `InMemorySaver`, the records of threads it no longer holds are dropped);
- anything else: the first run fails with a `ConfigurationError` saying what to
  pass. Never silently in-process next to a durable checkpointer.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sqlite3
import sys
import threading
import warnings
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver, PersistentDict
from langgraph.constants import CONFIG_KEY_CHECKPOINTER

from langgraph_resilience.core.clock import SystemClock
from langgraph_resilience.core.effects import IdempotencyStore, SagaLog
from langgraph_resilience.core.flow import Call, Flow, adrive, drive
from langgraph_resilience.errors import ConfigurationError, ResilienceWarning
from langgraph_resilience.stores.memory import InMemoryIdempotencyStore
from langgraph_resilience.stores.saga import InMemorySagaLog

if TYPE_CHECKING:
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

    from langgraph_resilience.stores.leases import LeaseRunner

__all__ = [
    "LEDGER_FILE",
    "EffectLedger",
    "LedgerResolver",
    "attach_ledger",
    "run_checkpointer",
]

_NEVER_SLEEPS = SystemClock()
_PG, _PG_AIO = "langgraph.checkpoint.postgres", "langgraph.checkpoint.postgres.aio"
_SQLITE, _SQLITE_AIO = "langgraph.checkpoint.sqlite", "langgraph.checkpoint.sqlite.aio"

LEDGER_FILE = "lgr_ledger.sqlite"
"""The ledger's file beside a file-backed `InMemorySaver`'s (``.langgraph_api/`` under
``langgraph dev``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class EffectLedger:
    """The intent/outcome ledger and the saga log one run uses."""

    idempotency: IdempotencyStore
    saga: SagaLog

    @property
    def lease_runner(self) -> LeaseRunner | None:
        """Where a run's thread lease lives beside this ledger: a Postgres ledger's own
        connection or pool; None: this process (`_graph.run_lease`)."""
        runner: LeaseRunner | None = getattr(self.idempotency, "lease_runner", None)
        return runner


_ATTACHED: weakref.WeakKeyDictionary[Any, EffectLedger] = weakref.WeakKeyDictionary()


def attach_ledger(checkpointer: Any, idempotency: IdempotencyStore, saga: SagaLog) -> None:
    """Declare the ledger that belongs with `checkpointer` (``open_postgres`` and
    ``open_sqlite`` do), so graphs run on it use that ledger without extra wiring."""
    _ATTACHED[checkpointer] = EffectLedger(idempotency, saga)


def run_checkpointer(config: RunnableConfig | Mapping[str, Any]) -> Any:
    """The checkpointer LangGraph runs this step with, or None: under the config key
    `langgraph.constants` exports for it (public; LangGraph Server injects its own
    checkpointer there too). The oldest and the newest LangGraph allowed are tested."""
    return (config.get("configurable") or {}).get(CONFIG_KEY_CHECKPOINTER)


def _is(checkpointer: Any, module: str, saver: str) -> bool:
    """Whether `checkpointer` is a LangGraph `saver` of `module`, without importing
    that backend: a saver of it exists only once its module is imported, so an
    in-memory user never loads psycopg or aiosqlite."""
    found = sys.modules.get(module)
    return found is not None and isinstance(checkpointer, getattr(found, saver))


def _in_saver(saver: InMemorySaver) -> Callable[[str], bool]:
    """Whether a thread is still in `saver` (held weakly: the ledger does not keep the
    saver alive)."""
    ref = weakref.ref(saver)

    def alive(thread_id: str) -> bool:
        found = ref()
        return found is not None and thread_id in found.storage

    return alive


class LedgerResolver:
    """Chooses (once per checkpointer) the ledger of a run; see the module docstring."""

    def __init__(
        self, *, idempotency: IdempotencyStore | None, saga: SagaLog | None, needed: bool
    ) -> None:
        self.explicit_idempotency = idempotency
        self.explicit_saga = saga
        self.needed = needed
        self._local = EffectLedger(  # `is None`: a store may define __len__ (empty: falsy)
            InMemoryIdempotencyStore() if idempotency is None else idempotency,
            InMemorySagaLog() if saga is None else saga,
        )
        self._chosen: weakref.WeakKeyDictionary[Any, EffectLedger] = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        self._warned = False

    def _explicit(self) -> EffectLedger | None:
        if self.explicit_idempotency is not None and self.explicit_saga is not None:
            return self._local
        return None

    def _with_explicit(self, ledger: EffectLedger) -> EffectLedger:
        idempotency, saga = self.explicit_idempotency, self.explicit_saga
        return EffectLedger(
            ledger.idempotency if idempotency is None else idempotency,
            ledger.saga if saga is None else saga,
        )

    def _resolving(self, config: RunnableConfig, *, on_loop: bool) -> Flow[EffectLedger | None]:
        """The run's ledger, its tables set up on first use (``yield Call(part.setup)``,
        awaited under `adrive`): `resolve` and `aresolve` drive this one flow."""
        if not self.needed:
            return None
        explicit = self._explicit()
        if explicit is not None:
            return explicit
        checkpointer = run_checkpointer(config)
        if checkpointer is None:
            self._warn_unsaved()
            return self._local
        found = self._chosen.get(checkpointer)
        if found is None:
            # In a worker thread under `adrive`: opening a SQLite file blocks (and
            # ``langgraph dev`` refuses blocking calls on its event loop).
            found, setup = yield Call(self._choose, self._achoose, (checkpointer,))
            if setup:
                if not on_loop and _is(checkpointer, _PG_AIO, "AsyncPostgresSaver"):
                    raise ConfigurationError(
                        "the graph runs on an AsyncPostgresSaver: run it with "
                        "ainvoke/astream, or pass idempotency= and saga= to add_resilience"
                    )
                parts: tuple[Any, ...] = (found.idempotency, found.saga)  # the built ones
                for part in parts:
                    yield Call(part.setup, getattr(part, "asetup", None))
            found = self._chosen.setdefault(checkpointer, found)
        return found

    def _warn_unsaved(self) -> None:
        """Once per node: side effects in a graph compiled without a checkpointer."""
        if self._warned:
            return
        self._warned = True
        warnings.warn(
            "side-effecting tools run in a graph compiled without a checkpointer: their "
            "ledger lives in this process only, and a thread that stops cannot be resumed "
            "without repeating or losing what it did; compile with a checkpointer "
            "(builder.compile(checkpointer=InMemorySaver()) in tests, PostgresSaver in "
            "production) or pass idempotency= and saga= stores to add_resilience",
            ResilienceWarning,
            stacklevel=2,
        )

    def resolve(self, config: RunnableConfig) -> EffectLedger | None:
        """The ledger for a sync run (None when no tool has side effects)."""
        with self._lock:
            return drive(self._resolving(config, on_loop=False), _NEVER_SLEEPS)

    async def aresolve(self, config: RunnableConfig) -> EffectLedger | None:
        """The ledger for an async run (None when no tool has side effects)."""
        return await adrive(self._resolving(config, on_loop=True), _NEVER_SLEEPS)

    async def _achoose(self, checkpointer: Any) -> tuple[EffectLedger, bool]:
        if _is(checkpointer, _SQLITE_AIO, "AsyncSqliteSaver") and checkpointer not in _ATTACHED:
            path = await _asqlite_file(checkpointer)
            if not path:  # an in-memory database: as durable as this process
                return self._local, False
            return await asyncio.to_thread(self._sqlite_ledger, path, checkpointer)
        return await asyncio.to_thread(self._choose, checkpointer)

    def _choose(self, checkpointer: Any) -> tuple[EffectLedger, bool]:
        """The ledger for `checkpointer`, and whether its tables still need ``setup()``."""
        attached = _ATTACHED.get(checkpointer)
        if attached is not None:
            return self._with_explicit(attached), False
        beside = _persisted_file(checkpointer)
        if beside:
            ledger_file = os.path.join(os.path.dirname(beside), LEDGER_FILE)
            return self._sqlite_ledger(ledger_file, checkpointer)
        if type(checkpointer) is InMemorySaver:
            own = InMemoryIdempotencyStore(thread_alive=_in_saver(checkpointer))
            return self._with_explicit(EffectLedger(own, self._local.saga)), False
        # A saver's single connection (``from_conn_string``) is used under the saver's
        # own lock, as the saver uses it; a pool's connections are never shared.
        if _is(checkpointer, _PG, "PostgresSaver"):
            from langgraph_resilience.stores.postgres_ledger import (  # noqa: PLC0415 (see _is)
                PostgresIdempotencyStore,
                PostgresSagaLog,
            )

            conn, lock = checkpointer.conn, checkpointer.lock
            built = EffectLedger(
                PostgresIdempotencyStore(conn, lock=lock), PostgresSagaLog(conn, lock=lock)
            )
            return self._with_explicit(built), True
        if _is(checkpointer, _PG_AIO, "AsyncPostgresSaver"):
            from langgraph_resilience.stores.postgres_ledger import (  # noqa: PLC0415 (see _is)
                AsyncPostgresIdempotencyStore,
                AsyncPostgresSagaLog,
            )

            aconn, alock = checkpointer.conn, checkpointer.lock
            built = EffectLedger(
                AsyncPostgresIdempotencyStore(aconn, lock=alock),
                AsyncPostgresSagaLog(aconn, lock=alock),
            )
            return self._with_explicit(built), True
        if _is(checkpointer, _SQLITE_AIO, "AsyncSqliteSaver"):
            raise ConfigurationError(
                "the graph runs on an AsyncSqliteSaver: run it with ainvoke/astream, or "
                "pass idempotency= and saga= to add_resilience"
            )
        if _is(checkpointer, _SQLITE, "SqliteSaver"):
            try:
                with checkpointer.lock:  # the saver's connection, as the saver uses it
                    path = _sqlite_file(checkpointer.conn)
            except sqlite3.ProgrammingError as exc:
                raise ConfigurationError(
                    "the SqliteSaver's connection cannot be used from the tools' thread "
                    f"({exc}); open it with check_same_thread=False, use open_sqlite(path), "
                    "or pass idempotency= and saga= to add_resilience"
                ) from exc
            if not path:  # an in-memory database: as durable as this process
                return self._local, False
            return self._sqlite_ledger(path, checkpointer)
        raise ConfigurationError(
            f"a tool has ToolProfile(side_effect=True) and the graph runs on "
            f"{type(checkpointer).__name__}, next to which this package cannot keep a durable "
            "idempotency ledger by itself; pass idempotency= and saga= to add_resilience "
            "(e.g. open_postgres(dsn).idempotency / .saga, or "
            "PostgresIdempotencyStore(pool) / PostgresSagaLog(pool) after .setup())"
        )

    def _sqlite_ledger(self, path: str, owner: Any) -> tuple[EffectLedger, bool]:
        """Our tables in the SQLite file at `path`, on two connections of ours, closed
        when `owner` (the checkpointer) goes: nothing else closes them, and Python 3.13
        warns of a connection collected open."""
        from langgraph_resilience.stores.sqlite import (  # noqa: PLC0415 (see _is)
            SqliteIdempotencyStore,
            SqliteSagaLog,
            sqlite_connect,
        )

        ledger, saga = sqlite_connect(path), sqlite_connect(path)
        for conn in (ledger, saga):
            weakref.finalize(owner, conn.close)
        built = EffectLedger(SqliteIdempotencyStore(ledger), SqliteSagaLog(saga))
        return self._with_explicit(built), True


def _persisted_file(checkpointer: Any) -> str:
    """The file an `InMemorySaver` writes its checkpoints to ("" when it keeps them in
    memory only): ``langgraph dev``'s saver is one, and its threads survive a restart."""
    if isinstance(checkpointer, InMemorySaver) and isinstance(checkpointer.storage, PersistentDict):
        return str(checkpointer.storage.filename)
    return ""


def _sqlite_file(conn: sqlite3.Connection) -> str:
    """The file behind a SQLite connection's main database ("" for an in-memory one)."""
    for _, name, file in conn.execute("PRAGMA database_list").fetchall():
        if name == "main":
            return str(file or "")
    return ""


async def _asqlite_file(saver: AsyncSqliteSaver) -> str:
    """`_sqlite_file` of an `AsyncSqliteSaver`'s connection, under the saver's lock."""
    async with saver.lock, saver.conn.execute("PRAGMA database_list") as cursor:
        rows = await cursor.fetchall()
    return next((str(file or "") for _, name, file in rows if name == "main"), "")
