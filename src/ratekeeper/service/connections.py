"""Connection limits of the HTTP server: slow or silent connections cannot starve the service.

uvicorn closes a keep-alive connection idle after a response (``timeout_keep_alive``), but not
one that never sends a whole request: a connection left silent, or sending its headers a byte
at a time, stays open, and a few hundred of them use up the process's file descriptors until
normal requests are refused. ``guarded_protocol`` adds to uvicorn's httptools protocol:

- a **header timeout**: a connection must complete a request's headers within
  ``header_timeout`` seconds of opening, or of its previous response; else it is closed.
  Trickling bytes does not reset the timer (uvicorn's keep-alive timer is reset by any byte);
- a **connection cap**: past ``max_connections`` open connections, the one that has waited
  longest for its headers is closed to make room (a connection whose request is being
  handled is never cut); if every connection is busy, the new one is closed at once. The
  default cap stays below the file-descriptor limit (``default_max_connections``), so the
  process never runs out of descriptors for its store, its listeners and new clients.

The protocol keeps uvicorn's own behaviour otherwise; ``tests/service/test_connections.py``
checks both limits against a real ``ratekeeper serve`` with a lowered descriptor limit.
"""

from __future__ import annotations

import asyncio
import resource
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

FD_RESERVE = 64
"""Descriptors kept free of client connections: listeners, store connections, gRPC, logs."""


def default_max_connections() -> int:
    """The file-descriptor limit less ``FD_RESERVE`` (at least 16, at most 10,000)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 10_000
    return max(16, min(10_000, soft - FD_RESERVE))


def guarded_protocol(header_timeout: float, max_connections: int) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with a header timeout and a connection cap (module
    docstring); pass it as ``uvicorn.Config(http=...)``."""

    class GuardedProtocol(HttpToolsProtocol):
        waiting_since: float | None = None
        """Loop time since when the connection waits for a request's headers; None: busy."""
        header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # uvicorn narrows the type the same way
            super().connection_made(OneWrite(transport))  # type: ignore[arg-type]  # a proxy
            self._wait()
            if len(self.connections) > max_connections:
                self._make_room()

        def on_headers_complete(self) -> None:
            self.waiting_since = None
            self._stop_timer()
            super().on_headers_complete()

        def on_response_complete(self) -> None:
            self.transport.flush()  # type: ignore[attr-defined]  # a OneWrite
            super().on_response_complete()
            if not self.transport.is_closing() and not self.pipeline:
                self._wait()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_timer()
            super().connection_lost(exc)

        def _wait(self) -> None:
            self.waiting_since = self.loop.time()
            self._stop_timer()
            self.header_timer = self.loop.call_later(header_timeout, self._timed_out)

        def _stop_timer(self) -> None:
            if self.header_timer is not None:
                self.header_timer.cancel()
                self.header_timer = None

        def _timed_out(self) -> None:
            self.header_timer = None
            if self.waiting_since is not None and not self.transport.is_closing():
                self.transport.close()

        def _make_room(self) -> None:
            """Close the connection that has waited longest for headers (maybe this one)."""
            oldest: GuardedProtocol | None = None
            oldest_since = 0.0
            for other in self.connections:
                if (
                    other is self
                    or not isinstance(other, GuardedProtocol)
                    or other.waiting_since is None
                    or other.transport.is_closing()
                ):
                    continue
                if oldest is None or other.waiting_since < oldest_since:
                    oldest, oldest_since = other, other.waiting_since
            (oldest or self).transport.close()

    return GuardedProtocol


class OneWrite:
    """A transport that sends a response's head with its body in one ``write`` (one system
    call instead of two: uvicorn writes the status line and headers as soon as the app starts
    the response). The head is held until the next write, the end of the response
    (``flush``), or any other use of the transport; ``100 Continue`` is never held."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._head: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        head = self._head
        if head is not None:
            self._head = None
            self._transport.write(head + data)
        elif data[:9] == b"HTTP/1.1 " and data[9:12] != b"100":
            self._head = bytes(data)
        else:
            self._transport.write(data)

    def flush(self) -> None:
        if self._head is not None:
            head, self._head = self._head, None
            self._transport.write(head)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name: str) -> Any:
        self.flush()  # anything else (pause_reading, get_extra_info, abort, ...) sees it all
        return getattr(self._transport, name)
