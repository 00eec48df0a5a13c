"""The decision routes answered inside the HTTP protocol (``http_inline``) send, byte for byte,
what uvicorn sends for the same app through ASGI: two real servers in this process, one with
the protocol's answers and one without, get the same random traffic (hits, peeks, refunds,
rejections, client mistakes, wrong tokens, other routes, pipelined requests, ``Connection:
close``) on one manual clock, and their responses must be equal but for the ``date`` header.
On the memory store and on a real Redis, where the protocol's answers are made when the
store's batch returns (``Soon``) and the ASGI app's by the general coroutine.
Then what the protocol must leave to uvicorn: bodies over the limit, chunked and trickled
bodies, HTTP/1.0 and ``Expect: 100-continue``."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from ratekeeper import AsyncLimiter, ManualClock, MemoryStore, RedisStore
from ratekeeper.service import config, http_inline
from ratekeeper.service.engine import Engine
from ratekeeper.service.http import MAX_BODY, HttpApi, Soon
from ratekeeper.service.metrics import InstrumentedLocalStore, Metrics
from ratekeeper.service.server import ServeOptions, _listen, uvicorn_config
from tests.service import test_http_hit

pytestmark = pytest.mark.skipif(not http_inline.SUPPORTED, reason="this uvicorn has no hook")

CONFIG = (
    "auth:\n  token: client-secret-0123456789\n  admin_token: admin-secret-0123456789\n"
    + test_http_hit.CONFIG
)
CLIENT = b"authorization: Bearer client-secret-0123456789\r\n"
ADMIN = b"authorization: Bearer admin-secret-0123456789\r\n"


class Served:
    """``HttpApi`` on a fresh store (memory, or Redis under its own prefix), served by uvicorn
    in a thread of its own."""

    def __init__(
        self, clock: ManualClock, inline: bool, text: str = CONFIG, redis_url: str | None = None
    ) -> None:
        metrics = Metrics()
        store: Any = InstrumentedLocalStore(MemoryStore(), metrics)
        if redis_url is not None:
            store = RedisStore(redis_url, prefix=f"inline{inline}", socket_timeout=5)
        limiter = AsyncLimiter(store, clock=clock)
        self.engine = Engine(config.parse_text(text), limiter, metrics, clock)
        self.api = HttpApi(self.engine, self._reload, self._health)
        self.in_protocol = 0
        """Decisions the protocol asked for (the ASGI app passes no headers)."""
        self.soon = 0
        """Of those, the ones answered when the store's batch came back (``Soon``)."""
        decide_now = self.api.decide_now

        def counted(
            path: str, headers: Any, body: bytes, block: bool = False, soon: bool = False
        ) -> Any:
            self.in_protocol += headers is not None
            answer = decide_now(path, headers, body, block, soon)
            self.soon += isinstance(answer, Soon)
            return answer

        self.api.decide_now = counted  # type: ignore[method-assign]
        app: Any = self.api
        if not inline:  # the same app without ``decide_now``: uvicorn's ASGI way only
            api = self.api

            async def app(scope: Any, receive: Any, send: Any) -> None:
                await api(scope, receive, send)

        self.sock = _listen("127.0.0.1", 0)
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn_config(app, ServeOptions((), port=self.port)))
        self.protocol = self.server.config.http
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.01)

    async def _reload(self) -> str | None:
        return None

    async def _health(self) -> dict[str, Any]:
        return {"store": "ok"}

    def _run(self) -> None:
        asyncio.run(self.server.serve(sockets=[self.sock]))

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(params=["memory", "redis"])
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[ManualClock, Served, Served]]:
    """Two servers on one clock and one kind of store: one answers in the protocol, one not."""
    clock = ManualClock(1_800_000_000.0)
    url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    inline, plain = Served(clock, True, redis_url=url), Served(clock, False, redis_url=url)
    assert inline.protocol is not plain.protocol  # the protocols differ, the apps do not
    try:
        yield clock, inline, plain
    finally:
        inline.stop()
        plain.stop()


def read_response(sock: socket.socket, buffer: bytearray) -> bytes:
    """One response off ``sock`` (``buffer`` keeps what came after it), its ``date`` dropped."""
    while b"\r\n\r\n" not in buffer:
        chunk = sock.recv(65536)
        assert chunk, bytes(buffer)
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
    return b"\r\n".join(x for x in response.split(b"\r\n") if not x.startswith(b"date: "))


def request(rng: random.Random) -> bytes:
    """A random request: mostly decisions, some of them mistakes, some other routes."""
    roll = rng.random()
    if roll < 0.05:
        return b"GET /v1/policies HTTP/1.1\r\nhost: t\r\n" + CLIENT + b"\r\n"
    if roll < 0.08:
        return b"GET /healthz HTTP/1.1\r\nhost: t\r\n\r\n"
    path = rng.choice([b"/v1/hit"] * 6 + [b"/v1/peek", b"/v1/refund", b"/v1/reset"])
    auth = ADMIN if path == b"/v1/reset" or rng.random() < 0.1 else CLIENT
    if rng.random() < 0.04:
        auth = rng.choice([b"", b"authorization: Bearer wrong\r\n"])
    body: Any = {
        "policy": rng.choice(test_http_hit.NAMES),
        "key": rng.choice(["a", "b", "user:42"]),
    }
    if path != b"/v1/reset" and rng.random() < 0.3:
        body["cost"] = rng.choice([1, 2, 3, 0, -1, 2.0, "x", 2**40])
    if path == b"/v1/hit" and rng.random() < 0.2:
        body["over_limit_status"] = rng.choice([200, 429, 500])
    if rng.random() < 0.03:
        body["policy"] = "nope"
    if rng.random() < 0.03:
        body["extra"] = 1
    raw = json.dumps(body).encode()
    if rng.random() < 0.03:
        raw = rng.choice([b"", b"{", b"[1]", b'{"policy": NaN}', b"\xff\xfe"])
    close = b"connection: close\r\n" if rng.random() < 0.05 else b""
    return (
        b"POST %s HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n%s%s"
        b"content-length: %d\r\n\r\n%s" % (path, auth, close, len(raw), raw)
    )


@pytest.mark.parametrize("seed", range(4))
def test_answers_equal_uvicorns_asgi_way(
    pair: tuple[ManualClock, Served, Served], seed: int
) -> None:
    clock, inline, plain = pair
    rng = random.Random(seed)
    socks: dict[int, socket.socket] = {}
    buffers = {inline.port: bytearray(), plain.port: bytearray()}

    def connection(port: int) -> socket.socket:
        if port not in socks:
            socks[port] = socket.create_connection(("127.0.0.1", port), timeout=10)
            buffers[port].clear()
        return socks[port]

    try:
        sent = 0
        while sent < 300:
            clock.advance(rng.choice([0.0, 0.0, 0.05, 0.3, 1.1]))
            batch = [request(rng) for _ in range(rng.choice([1, 1, 1, 2, 3]))]
            while any(b"connection: close" in r for r in batch[:-1]):  # close ends a batch
                batch.pop(0)
            answers = []
            for served in (inline, plain):
                sock = connection(served.port)
                sock.sendall(b"".join(batch))  # several at once: pipelined
                answers.append([read_response(sock, buffers[served.port]) for _ in batch])
                if b"connection: close" in batch[-1]:
                    assert sock.recv(1) == b""  # the server closed it
                    sock.close()
                    del socks[served.port]
            assert answers[0] == answers[1], batch
            sent += len(batch)
    finally:
        for sock in socks.values():
            sock.close()
    assert inline.api.in_flight == 0 and plain.api.in_flight == 0
    assert inline.in_protocol > 200 and plain.in_protocol == 0
    if isinstance(inline.engine.limiter.store, RedisStore):  # answered by the batch's callback
        assert inline.soon > 100 and plain.soon == 0


def exchange(port: int, data: list[bytes], pause: float = 0.0, shut: bool = True) -> bytes:
    """Send ``data`` in pieces (``pause`` between them) and read until the server closes.
    ``shut``: end the sending side (uvicorn then closes the connection at once, before an
    answer that waits for a store: such a request asks for ``Connection: close`` instead)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        for piece in data:
            sock.sendall(piece)
            time.sleep(pause)
        if shut:
            sock.shutdown(socket.SHUT_WR)
        seen = b""
        while chunk := sock.recv(65536):
            seen += chunk
        return seen


BODY = b'{"policy":"fixed","key":"k"}'
HEAD = b"POST /v1/hit HTTP/1.1\r\nhost: t\r\n" + CLIENT


def test_what_the_protocol_leaves_to_uvicorn(pair: tuple[ManualClock, Served, Served]) -> None:
    _, inline, _ = pair
    port = inline.port
    # a body over the limit: refused the ASGI way, not buffered whole
    big = b'{"policy":"fixed","key":"' + b"k" * (MAX_BODY + 10) + b'"}'
    seen = exchange(port, [HEAD + b"content-length: %d\r\n\r\n" % len(big), big[:70_000]])
    assert seen.startswith(b"HTTP/1.1 413 "), seen[:200]
    # chunked, and trickled a few bytes at a time
    head = HEAD + b"connection: close\r\n"
    chunked = head + b"transfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)
    assert exchange(port, [chunked], shut=False).startswith(b"HTTP/1.1 200 OK")
    whole = head + b"content-length: %d\r\n\r\n%s" % (len(BODY), BODY)
    pieces = [whole[i : i + 7] for i in range(0, len(whole), 7)]
    assert exchange(port, pieces, pause=0.002, shut=False).startswith(b"HTTP/1.1 200 OK")
    # HTTP/1.0: answered, then closed (exchange reads until the close)
    old = (HEAD + b"content-length: %d\r\n\r\n%s" % (len(BODY), BODY)).replace(
        b"HTTP/1.1", b"HTTP/1.0", 1
    )
    seen = exchange(port, [old], shut=False)
    assert seen.startswith(b"HTTP/1.1 200 OK") and b"connection: close\r\n" in seen
    # Expect: 100-continue: the client waits for it before sending the body
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(HEAD + b"expect: 100-continue\r\ncontent-length: %d\r\n\r\n" % len(BODY))
        assert sock.recv(65536).startswith(b"HTTP/1.1 100 Continue")
        sock.sendall(BODY)
        buffer = bytearray()
        assert read_response(sock, buffer).startswith(b"HTTP/1.1 200 OK")
    # a client gone before its body came: nothing held, nothing charged
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(HEAD + b"content-length: %d\r\n\r\n" % len(BODY) + BODY[:5])
    time.sleep(0.2)
    assert inline.api.in_flight == 0
    assert inline.in_protocol == 3  # chunked, trickled, HTTP/1.0; the 413 and 100-continue: ASGI
