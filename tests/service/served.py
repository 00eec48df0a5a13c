"""``HttpApi`` served in a thread of this process, three ways, for tests that compare answers:

- ``inline``: the service's HTTP server, decision routes answered by the connection itself
  (as ``ratekeeper serve`` runs);
- ``asgi``: the same server with every route handed to the ASGI app (a front whose
  ``inline_paths`` is empty: the head checks stay the connection's);
- ``uvicorn``: uvicorn's httptools server running ``HttpApi`` as a plain ASGI app, the
  reference an ASGI app is expected to behave the same under.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import uvicorn

from ratekeeper import AsyncLimiter, ManualClock, MemoryStore, RedisStore
from ratekeeper.errors import BadRequest
from ratekeeper.service.config import loader as config
from ratekeeper.service.engine import Engine
from ratekeeper.service.http.api import HttpApi, Soon
from ratekeeper.service.http.guard import Head
from ratekeeper.service.http.render import Response
from ratekeeper.service.http.server import HttpServer, HttpSettings
from ratekeeper.service.metrics import InstrumentedLocalStore, Metrics
from ratekeeper.service.server import _listen

KINDS = ("inline", "asgi", "uvicorn")


class AsgiFront:
    """``HttpApi``'s head checks and refusals, none of its routes answered inline."""

    inline_paths: frozenset[str] = frozenset()

    def __init__(self, api: HttpApi) -> None:
        self.api = api

    def check_head(self, method: str, path: str, head: Head) -> Response | None:
        return self.api.check_head(method, path, head)

    def refuse(self, exc: BadRequest) -> Response:
        return self.api.refuse(exc)

    def decide_now(self, *args: Any) -> Any:
        raise AssertionError("no route is answered inline")


class Served:
    """``HttpApi`` on a fresh store (memory, or Redis under its own prefix), served one of
    ``KINDS`` of way in a thread of its own, on ``clock``."""

    def __init__(
        self,
        clock: ManualClock,
        kind: str,
        text: str,
        redis_url: str | None = None,
        settings: HttpSettings | None = None,
    ) -> None:
        metrics = Metrics()
        store: Any = InstrumentedLocalStore(MemoryStore(), metrics)
        if redis_url is not None:
            store = RedisStore(redis_url, prefix=f"served-{kind}", socket_timeout=5)
        limiter = AsyncLimiter(store, clock=clock)
        self.kind = kind
        self.engine = Engine(config.parse_text(text), limiter, metrics, clock)
        self.api = HttpApi(self.engine, self._reload, self._health)
        self.inline = 0
        """Decisions the connection asked for itself."""
        self.soon = 0
        """Of those, the ones answered when the store's batch came back (``Soon``)."""
        decide_now = self.api.decide_now

        def counted(
            path: str, headers: Any, body: bytes, block: bool = False, soon: bool = False
        ) -> Any:
            answer = decide_now(path, headers, body, block, soon)
            if block:  # the connection's ask (the ASGI app asks without)
                self.inline += 1
                self.soon += isinstance(answer, Soon)
            return answer

        self.api.decide_now = counted  # type: ignore[method-assign]
        self.sock = _listen("127.0.0.1", 0)
        self.port = self.sock.getsockname()[1]
        self.settings = settings or HttpSettings()
        self.loop = asyncio.new_event_loop()
        self.started = threading.Event()
        self.uvicorn: uvicorn.Server | None = None
        self.http: HttpServer | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.started.wait(10), "the server did not start"

    async def _reload(self) -> str | None:
        return None

    async def _health(self) -> dict[str, Any]:
        return {"store": "ok"}

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        if self.kind == "uvicorn":
            self.uvicorn = uvicorn.Server(
                uvicorn.Config(
                    self.api,
                    http="httptools",
                    loop="none",
                    lifespan="off",
                    access_log=False,
                    log_level="warning",
                )
            )
            task = asyncio.ensure_future(self.uvicorn.serve(sockets=[self.sock]))
            while not self.uvicorn.started:
                await asyncio.sleep(0.01)
            self.started.set()
            await task
            return
        front: Any = self.api if self.kind == "inline" else AsgiFront(self.api)
        self.http = HttpServer(self.api, self.settings, front)
        await self.http.start(self.sock)
        self.stopping = asyncio.Event()
        self.started.set()
        await self.stopping.wait()
        await self.http.shutdown(2.0)

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=10)

    def stop(self) -> None:
        if self.uvicorn is not None:
            self.uvicorn.should_exit = True
        else:
            self.loop.call_soon_threadsafe(self.stopping.set)
        self.thread.join(10)
        self.loop.close()


def read_response(sock: socket.socket, buffer: bytearray) -> bytes:
    """One response off ``sock`` (``buffer`` keeps what came after it), its ``date`` and
    ``server`` headers dropped; b"" if the connection closed before one came."""
    while b"\r\n\r\n" not in buffer:
        chunk = sock.recv(65536)
        if not chunk:
            assert not buffer, bytes(buffer)
            return b""
        buffer += chunk
    end = buffer.index(b"\r\n\r\n") + 4
    head = bytes(buffer[:end])
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    while len(buffer) < end + length:
        chunk = sock.recv(65536)
        assert chunk, bytes(buffer)
        buffer += chunk
    response = bytes(buffer[: end + length])
    del buffer[: end + length]
    return normalized(response)


def normalized(response: bytes) -> bytes:
    """``response`` without the headers that differ by server or second."""
    lines = response.split(b"\r\n")
    return b"\r\n".join(x for x in lines if not x.lower().startswith((b"date: ", b"server: ")))


def wait_until(check: Any, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)
