"""A TCP proxy in front of the real PostgreSQL server, for fault-injection tests.

`PgProxy` listens on 127.0.0.1:<free port> and forwards every connection to
127.0.0.1:5432 (loopback only). The test controls it:

- `drop_all()` closes every open client and upstream connection at once, like a
  server restart or a killed backend (the client sees its connection end mid-use);
- `stop()` drops everything and stops listening (new connections are *refused*,
  as while the server restarts); `start()` listens again on the same port;
  `refuse_for(seconds)` is a stop followed by a start `seconds` later (a fast restart);
- `drop_when(pattern, when=...)` arms a one-shot trigger on the bytes a client sends:
  ``"before"`` drops everything before the matching message reaches the server,
  ``"reply"`` forwards it and drops everything when the server's first reply byte
  comes back, so the statement ran (and, in autocommit, committed) but its answer
  is lost. That makes a fault land at an exact protocol point, deterministically.

All I/O runs on one asyncio loop in one thread (named ``pg-proxy``), started by
``__enter__`` / `open` and joined by ``__exit__`` / `close`: no thread outlives it.
Every control method is synchronous and returns once the fault is in place.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import threading
from collections.abc import Coroutine
from typing import Any, Literal

from psycopg.conninfo import make_conninfo

__all__ = ["PgProxy"]

UPSTREAM = ("127.0.0.1", 5432)
_CONTROL_TIMEOUT = 10.0


@dataclasses.dataclass
class _Trigger:
    pattern: bytes
    when: Literal["before", "reply"]
    refuse: float
    fired: threading.Event = dataclasses.field(default_factory=threading.Event)


class _Side(asyncio.Protocol):
    """One end of a proxied connection: what it receives goes to its peer."""

    def __init__(self, pair: _Pair) -> None:
        self.pair = pair
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.pair.proxy._transports.add(transport)

    def pause_writing(self) -> None:  # our peer writes too fast for us: stop reading it
        self.pair.peer_of(self).pause()

    def resume_writing(self) -> None:
        self.pair.peer_of(self).resume()

    def pause(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            self.pair.proxy._transports.discard(self.transport)
        self.pair.lost(self)


class _ClientSide(_Side):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self.pair.proxy._pairs.add(self.pair)
        self.pair.proxy.accepted += 1
        self.pair.connecting = asyncio.ensure_future(self.pair.connect_upstream())

    def data_received(self, data: bytes) -> None:
        self.pair.from_client(data)


class _UpstreamSide(_Side):
    def data_received(self, data: bytes) -> None:
        self.pair.from_server(data)


class _Pair:
    """A client connection and its upstream connection to the server."""

    def __init__(self, proxy: PgProxy) -> None:
        self.proxy = proxy
        self.client = _ClientSide(self)
        self.upstream: _UpstreamSide | None = None
        self.pending: list[bytes] = []
        self.closed = False
        self.connecting: asyncio.Future[None] | None = None
        self.reply_trigger: _Trigger | None = None

    def peer_of(self, side: _Side) -> _Side:
        if side is self.client:
            return self.upstream or _Side(self)
        return self.client

    async def connect_upstream(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, upstream = await loop.create_connection(
                lambda: _UpstreamSide(self), *self.proxy.upstream
            )
        except OSError:
            self.abort()
            return
        self.upstream = upstream
        if self.closed:
            self.abort()
            return
        assert upstream.transport is not None
        for chunk in self.pending:
            upstream.transport.write(chunk)
        self.pending.clear()

    def from_client(self, data: bytes) -> None:
        trigger = self.proxy._match(data)
        if trigger is not None and trigger.when == "before":
            self.proxy._fire(trigger)
            return
        if trigger is not None:
            self.reply_trigger = trigger
        if self.upstream is not None and self.upstream.transport is not None:
            self.upstream.transport.write(data)
        else:
            self.pending.append(data)

    def from_server(self, data: bytes) -> None:
        if self.reply_trigger is not None:
            trigger, self.reply_trigger = self.reply_trigger, None
            self.proxy._fire(trigger)
            return
        if self.client.transport is not None:
            self.client.transport.write(data)

    def abort(self) -> None:
        """Close both ends now, discarding anything buffered (a dead server or backend)."""
        self.closed = True
        for side in (self.client, self.upstream):
            if side is not None and side.transport is not None:
                side.transport.abort()
        self.proxy._pairs.discard(self)

    def lost(self, side: _Side) -> None:
        """One end closed: close the other once what is buffered for it is written."""
        self.closed = True
        other = self.upstream if side is self.client else self.client
        if other is not None and other.transport is not None:
            other.transport.close()
        if side is self.client and self.connecting is not None:
            self.connecting.cancel()
        self.proxy._pairs.discard(self)


class PgProxy:
    """A controllable TCP proxy to the local PostgreSQL server (see the module docs).

    >>> with PgProxy() as proxy:  # doctest: +SKIP
    ...     dsn = proxy.dsn(pg_dsn)
    ...     proxy.drop_all()
    """

    def __init__(self, upstream: tuple[str, int] = UPSTREAM) -> None:
        self.upstream = upstream
        self.port = 0
        self.accepted = 0
        self.drops = 0
        """How many times every connection was dropped (drop_all, stop, a trigger)."""
        self.dropped_connections = 0
        self._pairs: set[_Pair] = set()
        self._server: asyncio.Server | None = None
        self._reopen: asyncio.TimerHandle | None = None
        self._triggers: list[_Trigger] = []
        self._tasks: set[asyncio.Future[Any]] = set()
        self._transports: set[asyncio.Transport] = set()
        """Every transport not closed yet, held so that none is collected open (a
        ResourceWarning, fatal under the tests' filterwarnings) and each is closed here."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._listening = threading.Event()

    # ------------------------------------------------------------ lifecycle

    def __enter__(self) -> PgProxy:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> None:
        """Start the proxy's thread and listen on a free loopback port."""
        if self._thread is not None:
            raise RuntimeError("the proxy is already open")
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            loop.run_forever()

        self._loop = loop
        self._thread = threading.Thread(target=run, name="pg-proxy", daemon=True)
        self._thread.start()
        ready.wait(_CONTROL_TIMEOUT)
        self.start()

    def close(self) -> None:
        """Drop every connection, stop listening, stop the loop and join its thread."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:
            self._call(self._shutdown())
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(_CONTROL_TIMEOUT)
            if thread.is_alive():  # pragma: no cover - a bug in the proxy itself
                raise RuntimeError("the proxy thread did not stop")
            loop.close()
            self._loop, self._thread = None, None

    @property
    def listening(self) -> bool:
        return self._listening.is_set()

    @property
    def active(self) -> int:
        """Open proxied connections right now."""
        return len(self._pairs)

    def dsn(self, dsn: str, **params: Any) -> str:
        """`dsn` pointed at this proxy (same database, user...), plus libpq `params`."""
        if not self.port:
            raise RuntimeError("the proxy is not open")
        return make_conninfo(dsn, host="127.0.0.1", port=str(self.port), **params)

    # ------------------------------------------------------------ faults

    def start(self) -> None:
        """Listen again (on the same port): the server is back."""
        self._call(self._listen())

    def stop(self) -> int:
        """Drop every connection and refuse new ones until `start`. Returns the number
        of connections dropped."""
        return self._call(self._stop(reopen_after=None))

    def refuse_for(self, seconds: float) -> int:
        """A fast restart: drop everything, refuse new connections for `seconds`, then
        listen again (on the proxy's loop; this returns at once)."""
        return self._call(self._stop(reopen_after=seconds))

    def drop_all(self) -> int:
        """Close every open connection at once (the listener stays up). Returns how many."""
        return self._call(self._drop())

    def wait_listening(self, timeout: float = _CONTROL_TIMEOUT) -> None:
        """Block until the proxy accepts connections again (after `refuse_for`)."""
        if not self._listening.wait(timeout):
            raise TimeoutError("the proxy did not listen again in time")

    def drop_when(
        self,
        pattern: bytes,
        *,
        when: Literal["before", "reply"] = "before",
        refuse: float = 0.0,
    ) -> threading.Event:
        """Arm a one-shot trigger: the next client message containing `pattern` drops
        every connection, before it reaches the server or once its reply starts (see the
        module docs); with `refuse` the proxy also refuses connections that long.
        Returns an event set when it fired."""
        trigger = _Trigger(pattern, when, refuse)

        async def arm() -> None:
            self._triggers.append(trigger)

        self._call(arm())
        return trigger.fired

    def disarm(self) -> None:
        """Forget the triggers that have not fired."""

        async def clear() -> None:
            self._triggers.clear()

        self._call(clear())

    # ------------------------------------------------------------ on the loop

    def _call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        if self._loop is None:
            coro.close()
            raise RuntimeError("the proxy is not open")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(_CONTROL_TIMEOUT)

    async def _listen(self) -> None:
        if self._reopen is not None:
            self._reopen.cancel()
            self._reopen = None
        if self._server is not None:
            return
        loop = asyncio.get_running_loop()

        def factory() -> _Side:
            return _Pair(self).client

        self._server = await loop.create_server(
            factory,
            "127.0.0.1",
            self.port,
            family=socket.AF_INET,
            reuse_address=True,
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._listening.set()

    async def _stop(self, *, reopen_after: float | None) -> int:
        if self._reopen is not None:
            self._reopen.cancel()
            self._reopen = None
        self._listening.clear()
        if self._server is not None:
            loop = asyncio.get_running_loop()
            for sock in self._server.sockets:
                loop.remove_reader(sock.fileno())  # accept no more
            # A connection accepted just now attaches to the server in its own task, and
            # CPython 3.11 drops its transport, socket open, if the server closed first: a
            # ResourceWarning in whichever test collects it. Let those tasks run first.
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            self._server.close()  # the listening socket: new connections are refused
            self._server = None
        dropped = await self._drop()
        if reopen_after is not None:
            loop = asyncio.get_running_loop()
            self._reopen = loop.call_later(reopen_after, lambda: self._spawn(self._listen()))
        return dropped

    async def _drop(self) -> int:
        pairs = list(self._pairs)
        for pair in pairs:
            pair.abort()
        self.drops += 1
        self.dropped_connections += len(pairs)
        await asyncio.sleep(0)  # let the transports' connection_lost callbacks run
        await asyncio.sleep(0)
        return len(pairs)

    def _match(self, data: bytes) -> _Trigger | None:
        for trigger in self._triggers:
            if trigger.pattern in data:
                self._triggers.remove(trigger)
                return trigger
        return None

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _fire(self, trigger: _Trigger) -> None:
        trigger.fired.set()
        self._spawn(self._stop(reopen_after=trigger.refuse) if trigger.refuse else self._drop())

    async def _shutdown(self) -> None:
        await self._stop(reopen_after=None)
        for pair in list(self._pairs):
            pair.abort()
        pending = [
            task
            for task in asyncio.all_tasks()
            if task is not asyncio.current_task() and not task.done()
        ]
        for task in pending:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*pending, return_exceptions=True)
        for _ in range(3):  # one accepted as the loop stopped registers a turn later
            for transport in list(self._transports):
                transport.abort()
            await asyncio.sleep(0)  # their connection_lost closes their sockets
