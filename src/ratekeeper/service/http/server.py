"""The service's HTTP server: a listening socket whose connections are ``HttpConnection``s,
their timers, their number, and a graceful stop.

- **Timers**: every ``SWEEP`` seconds each connection's ``tick`` closes it if its client
  has kept the service waiting past a timeout (``HttpSettings``; ``http.connection`` says
  which timer runs when). One sweep for all connections, not a timer per request. The
  sweep also renews the ``date`` header line, once a second.
- **Connection cap**: past ``max_connections`` open connections, the one that has waited
  longest for a request is closed to make room (a connection with a request being answered is
  never cut); if every connection is busy, the new one is closed at once. The default cap
  stays below the file-descriptor limit (``default_max_connections``), so the process
  keeps descriptors for its store, its listeners and new clients.
- **Stop** (``shutdown``): the listener closes, idle connections close at once, the others
  finish the requests they have received (the last answer says ``connection: close``), for
  up to ``grace`` seconds; what is left is then cut.
"""

from __future__ import annotations

import asyncio
import resource
import socket
import time
from collections.abc import Coroutine
from email.utils import formatdate
from typing import Any

from .asgi import App
from .connection import MAX_HEAD as MAX_HEAD
from .connection import Front, HttpConnection
from .connection import HttpSettings as HttpSettings

FD_RESERVE = 64
"""Descriptors kept free of client connections: listeners, store connections, gRPC, logs."""
SWEEP = 0.25
"""Seconds between two looks at every connection's timers."""


def default_max_connections() -> int:
    """The file-descriptor limit less ``FD_RESERVE`` (at least 16, at most 10,000)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 10_000
    return max(16, min(10_000, soft - FD_RESERVE))


class HttpServer:
    """Serves ``app`` (ASGI) on a listening socket; ``front``: the app's decision routes and
    head checks (``connection.Front``), None for a plain ASGI app."""

    def __init__(self, app: App, settings: HttpSettings, front: Front | None = None) -> None:
        self.app = app
        self.settings = settings
        self.front = front
        self.connections: set[HttpConnection] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        self.date = b""
        self._second = -1
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]  # start
        self._server: asyncio.Server | None = None
        self._timer: asyncio.TimerHandle | None = None

    async def start(self, sock: socket.socket) -> None:
        """Serve connections on ``sock`` (bound and listening)."""
        self.loop = asyncio.get_running_loop()
        self._renew_date()
        self._server = await self.loop.create_server(
            lambda: HttpConnection(self), sock=sock, backlog=2048
        )
        self._timer = self.loop.call_later(SWEEP, self._sweep)

    @property
    def port(self) -> int:
        assert self._server is not None, "not started"
        return int(self._server.sockets[0].getsockname()[1])

    def spawn(self, coroutine: Coroutine[Any, Any, None]) -> None:
        """Run a connection's work as a task the server waits for when it stops."""
        task = self.loop.create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def opened(self, conn: HttpConnection) -> None:
        self.connections.add(conn)
        if len(self.connections) > self.settings.max_connections:
            self._make_room(conn)

    def lost(self, conn: HttpConnection) -> None:
        self.connections.discard(conn)

    def _make_room(self, new: HttpConnection) -> None:
        """Close the connection that has waited longest for a request (maybe ``new``)."""
        oldest: HttpConnection | None = None
        for conn in self.connections:
            if conn is new or not conn.waiting() or conn.transport.is_closing():
                continue
            if oldest is None or conn.since < oldest.since:
                oldest = conn
        (oldest or new).transport.close()

    def _sweep(self) -> None:
        self._renew_date()
        now = self.loop.time()
        for conn in list(self.connections):
            conn.tick(now)
        self._timer = self.loop.call_later(SWEEP, self._sweep)

    def _renew_date(self) -> None:
        second = int(time.time())
        if second != self._second:
            self._second = second
            self.date = b"date: %s\r\n" % formatdate(second, usegmt=True).encode()

    async def shutdown(self, grace: float) -> None:
        """Stop (module docstring): wait up to ``grace`` seconds for requests received."""
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.shutdown()
        deadline = self.loop.time() + grace
        while (self.connections or self.tasks) and self.loop.time() < deadline:
            await asyncio.sleep(0.02)
        for conn in list(self.connections):
            conn.transport.abort()
        for task in list(self.tasks):
            task.cancel()
        if self.tasks:
            await asyncio.wait(list(self.tasks), timeout=1.0)
        if self._timer is not None:
            self._timer.cancel()
        if self._server is not None:
            await self._server.wait_closed()
