"""A request handed to an ASGI app, as a small ASGI server hands it (``AsgiCall``).

The connection (``http.connection``) starts a call once the request's whole body has come
(the service's bodies are small: at most ``max_body`` bytes), so the first ``receive`` returns
it all, and a later one waits for the client to go away (``http.disconnect``). The response
is collected whole (``http.response.start``, then ``http.response.body`` until ``more_body``
is false) and handed to the connection, which writes it in its turn; a ``content-length`` is
added when the app gives none. An app that raises, or returns before its response is
complete, gets a 500 (logged) and the connection closes after it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Protocol

from .render import Answer
from .request import Request

Message = MutableMapping[str, Any]


class Connection(Protocol):
    """What an ``AsgiCall`` uses of its connection (``connection.HttpConnection``)."""

    transport: asyncio.Transport

    def answered(self, request: Request, answer: Answer, close: bool = False) -> None: ...

    def disconnected(self) -> asyncio.Future[None]: ...


App = Callable[[Any, Any, Any], Awaitable[None]]
"""An ASGI application: ``app(scope, receive, send)``."""
log = logging.getLogger("ratekeeper.service")
SERVER_ERROR: Answer = (
    500,
    b"Internal Server Error",
    [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", b"21")],
)
_ASGI = {"version": "3.0", "spec_version": "2.4"}


class AsgiCall:
    """One request's ASGI call: its scope, ``receive`` and ``send``."""

    __slots__ = ("chunks", "conn", "done", "headers", "received", "request", "started", "status")

    def __init__(self, conn: Connection, request: Request) -> None:
        self.conn = conn
        self.request = request
        self.received = False
        self.started = False
        self.done = False
        self.status = 500
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: list[bytes] = []

    def scope(self) -> dict[str, Any]:
        request = self.request
        transport = self.conn.transport
        return {
            "type": "http",
            "asgi": _ASGI,
            "http_version": request.version,
            "server": _address(transport.get_extra_info("sockname")),
            "client": _address(transport.get_extra_info("peername")),
            "scheme": "http",
            "method": request.method,
            "root_path": "",
            "path": request.path,
            "raw_path": request.raw_path,
            "query_string": request.query,
            "headers": request.headers,
        }

    async def run(self, app: App) -> None:
        request = self.request
        try:
            await app(self.scope(), self.receive, self.send)
        except Exception:
            log.exception("unexpected error serving %s %s", request.method, request.path)
            if not self.done:
                self.done = True
                self.conn.answered(request, SERVER_ERROR, close=True)
            return
        if not self.done:
            log.error("the app returned no whole response to %s %s", request.method, request.path)
            self.done = True
            self.conn.answered(request, SERVER_ERROR, close=True)

    async def receive(self) -> Message:
        if not self.received:
            self.received = True
            request = self.request
            body = request.body[0] if len(request.body) == 1 else b"".join(request.body)
            return {"type": "http.request", "body": body, "more_body": False}
        await self.conn.disconnected()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start" and not self.started:
            self.started = True
            self.status = int(message["status"])
            self.headers = [(bytes(k), bytes(v)) for k, v in message.get("headers", ())]
            return
        if kind != "http.response.body" or not self.started or self.done:
            raise RuntimeError(f"unexpected ASGI message {kind!r}")
        self.chunks.append(message.get("body", b""))
        if message.get("more_body", False):
            return
        self.done = True
        payload = self.chunks[0] if len(self.chunks) == 1 else b"".join(self.chunks)
        headers = self.headers
        if not any(name.lower() == b"content-length" for name, _ in headers):
            headers.append((b"content-length", b"%d" % len(payload)))
        self.conn.answered(self.request, (self.status, payload, headers))


def _address(value: Any) -> tuple[str, int] | None:
    """A socket address as ASGI gives it: host and port (None for other families)."""
    if isinstance(value, tuple) and len(value) >= 2:
        return str(value[0]), int(value[1])
    return None
