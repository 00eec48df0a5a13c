"""The service's HTTP connection (``http.connection``) against uvicorn as the reference: the
same random traffic (hits, peeks, refunds, rejections, client mistakes, wrong tokens, other
routes, pipelined requests, ``Connection: close``) on one manual clock, sent to ``HttpApi``
served three ways (``served.py``: decisions answered by the connection, everything through
ASGI on the same server, and uvicorn), gets the same bytes but for ``date``/``server``. On
the memory store and on a real Redis, where the connection's answers are made when the
store's batch returns (``Soon``). Then the edges: chunked and trickled bodies, HTTP/1.0,
``Expect: 100-continue``, a client gone, framing the server refuses, a pipeline behind an
ASGI answer, and the order of answers."""

from __future__ import annotations

import json
import random
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from ratekeeper import ManualClock, RedisStore
from ratekeeper.service.http.body import MAX_BODY
from ratekeeper.service.http.routes import ROUTES
from tests.service import test_http_hit
from tests.service.served import KINDS, Served, read_response

CONFIG = (
    "auth:\n  token: client-secret-0123456789\n  admin_token: admin-secret-0123456789\n"
    + test_http_hit.CONFIG
)
CLIENT = b"authorization: Bearer client-secret-0123456789\r\n"
ADMIN = b"authorization: Bearer admin-secret-0123456789\r\n"
BODY = b'{"policy":"fixed","key":"k"}'
HEAD = b"POST /v1/hit HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n" + CLIENT


@pytest.fixture(params=["memory", "redis"])
def trio(request: pytest.FixtureRequest) -> Iterator[tuple[ManualClock, list[Served]]]:
    """``HttpApi`` served the three ways on one clock and one kind of store."""
    clock = ManualClock(1_800_000_000.0)
    url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    servers = [Served(clock, kind, CONFIG, url) for kind in KINDS]
    try:
        yield clock, servers
    finally:
        for served in servers:
            served.stop()


@pytest.fixture
def inline() -> Iterator[Served]:
    served = Served(ManualClock(1_800_000_000.0), "inline", CONFIG)
    yield served
    served.stop()


def request(rng: random.Random) -> bytes:
    """A random request: mostly decisions, some of them mistakes, some other routes."""
    roll = rng.random()
    if roll < 0.05:
        return b"GET /v1/policies HTTP/1.1\r\nhost: localhost\r\n" + CLIENT + b"\r\n"
    if roll < 0.08:
        return b"GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n"
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
        b"POST %s HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n%s%s"
        b"content-length: %d\r\n\r\n%s" % (path, auth, close, len(raw), raw)
    )


@pytest.mark.parametrize("seed", range(4))
def test_answers_equal_uvicorns(trio: tuple[ManualClock, list[Served]], seed: int) -> None:
    clock, servers = trio
    rng = random.Random(seed)
    socks: dict[int, socket.socket] = {}
    buffers = {served.port: bytearray() for served in servers}

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
            for served in servers:
                sock = connection(served.port)
                sock.sendall(b"".join(batch))  # several at once: pipelined
                answers.append([read_response(sock, buffers[served.port]) for _ in batch])
                if b"connection: close" in batch[-1]:
                    assert sock.recv(1) == b""  # the server closed it
                    sock.close()
                    del socks[served.port]
            assert answers[0] == answers[1] == answers[2], batch
            sent += len(batch)
    finally:
        for sock in socks.values():
            sock.close()
    inline, asgi, reference = servers
    assert all(s.api.in_flight == 0 for s in servers)
    assert inline.inline > 200 and asgi.inline == 0 and reference.inline == 0
    if isinstance(inline.engine.limiter.store, RedisStore):  # answered by the batch's callback
        assert inline.soon > 100


def exchange(port: int, data: list[bytes], pause: float = 0.0, shut: bool = True) -> bytes:
    """Send ``data`` in pieces (``pause`` between them) and read until the server closes
    (``shut``: after ending the sending side: a half-close)."""
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


def test_bodies_versions_and_continue(inline: Served) -> None:
    port = inline.port
    # a body over the limit, announced: refused at once, the connection closed
    big = b'{"policy":"fixed","key":"' + b"k" * (MAX_BODY + 10) + b'"}'
    seen = exchange(port, [HEAD + b"content-length: %d\r\n\r\n" % len(big)], shut=False)
    assert seen.startswith(b"HTTP/1.1 413 ") and b"connection: close\r\n" in seen, seen
    # chunked, over the limit as it comes: the same
    chunks = b"".join(b"%x\r\n%s\r\n" % (4096, b"k" * 4096) for _ in range(20))
    seen = exchange(port, [HEAD + b"transfer-encoding: chunked\r\n\r\n" + chunks], shut=False)
    assert seen.startswith(b"HTTP/1.1 413 ") and b"connection: close\r\n" in seen, seen
    # chunked, and trickled a few bytes at a time
    head = HEAD + b"connection: close\r\n"
    chunked = head + b"transfer-encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)
    assert exchange(port, [chunked], shut=False).startswith(b"HTTP/1.1 200 OK")
    whole = head + b"content-length: %d\r\n\r\n%s" % (len(BODY), BODY)
    pieces = [whole[i : i + 7] for i in range(0, len(whole), 7)]
    assert exchange(port, pieces, pause=0.002, shut=False).startswith(b"HTTP/1.1 200 OK")
    # HTTP/1.0: answered, then closed; with keep-alive, kept
    old = (HEAD + b"content-length: %d\r\n\r\n%s" % (len(BODY), BODY)).replace(
        b"HTTP/1.1", b"HTTP/1.0", 1
    )
    seen = exchange(port, [old], shut=False)
    assert seen.startswith(b"HTTP/1.1 200 OK") and b"connection: close\r\n" in seen
    kept = old.replace(b"host:", b"connection: keep-alive\r\nhost:")
    with inline.connect() as sock:
        sock.sendall(kept + kept)
        buffer = bytearray()
        for _ in range(2):
            assert b"connection: keep-alive\r\n" in read_response(sock, buffer)
    # Expect: 100-continue: the client waits for it before sending the body
    with inline.connect() as sock:
        sock.sendall(HEAD + b"expect: 100-continue\r\ncontent-length: %d\r\n\r\n" % len(BODY))
        assert sock.recv(65536) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(BODY)
        assert read_response(sock, bytearray()).startswith(b"HTTP/1.1 200 OK")
    # refused by its head: no 100 Continue, the refusal, then the connection closes
    anonymous = HEAD.replace(CLIENT, b"")
    seen = exchange(
        port, [anonymous + b"expect: 100-continue\r\ncontent-length: 9\r\n\r\n"], 0, False
    )
    assert seen.startswith(b"HTTP/1.1 401 ") and b"100 Continue" not in seen, seen
    # a client gone before its body came: nothing held, nothing charged
    before = inline.inline
    with inline.connect() as sock:
        sock.sendall(HEAD + b"content-length: %d\r\n\r\n" % len(BODY) + BODY[:5])
    time.sleep(0.2)
    assert inline.api.in_flight == 0 and inline.inline == before


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"POST /v1/hit HTTP/1.1\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n", 400),
        (b"POST /v1/hit HTTP/1.1\r\ncontent-length: 3\r\ncontent-length: 3\r\n\r\nabc", 400),
        (b"POST /v1/hit HTTP/1.1\r\ncontent-length: 3, 3\r\n\r\nabc", 400),
        (b"POST /v1/hit HTTP/1.1\r\ntransfer-encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501),
        (b"POST /v1/hit HTTP/1.0\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\r\nhost: localhost\r\nx: a\r\n b\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\r\nhost : localhost\r\n\r\n", 400),
        (b"GET /healthz HTTP/1.1\nhost: localhost\n\n", 400),
        (b"GET /healthz HTTP/2.0\r\nhost: localhost\r\n\r\n", 505),
        (b"GET /healthz HTTP/1.1\r\nhost: localhost\r\nx: " + b"a" * 20_000 + b"\r\n\r\n", 431),
        (b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\n\r\n", 414),
        (b"GET /healthz HTTP/1.1\r\nhost: localhost\r\nhost: localhost\r\n\r\n", 400),
    ],
)
def test_framing_it_refuses_closes_the_connection(inline: Served, raw: bytes, status: int) -> None:
    """What could smuggle a second request past a proxy is refused, and the connection,
    whose next request cannot be found, closes; the request after it is never read."""
    follow = b"GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n"
    seen = exchange(inline.port, [raw + follow], shut=False)
    assert seen.startswith(b"HTTP/1.1 %d " % status), seen[:200]
    assert seen.count(b"HTTP/1.1 ") == 1, seen  # the one after was dropped with the connection
    assert b"connection: close\r\n" in seen and b'"field":' in seen


def test_each_request_sees_the_effects_of_the_ones_before(inline: Served) -> None:
    """A hit pipelined after a kill switch flipped (an ASGI call) is decided after it."""
    toggle = json.dumps({"enabled": False}).encode()
    off = (
        b"POST /v1/admin/policies/fixed HTTP/1.1\r\nhost: localhost\r\n"
        b"content-type: application/json\r\n" + ADMIN + b"content-length: %d\r\n\r\n%s"
    ) % (len(toggle), toggle)
    hit = HEAD + b"content-length: %d\r\n\r\n%s" % (len(BODY), BODY)
    with inline.connect() as sock:
        sock.sendall(hit * 4 + off + hit)
        buffer = bytearray()
        answers = [read_response(sock, buffer) for _ in range(6)]
    allowed = [json.loads(a.split(b"\r\n\r\n")[1]).get("allowed") for a in answers]
    assert allowed == [True, True, True, False, None, True]  # 3/second; then switched off


def test_an_absolute_form_target_is_its_path(inline: Served) -> None:
    raw = b"GET http://localhost:80/healthz?x=1 HTTP/1.1\r\nhost: localhost\r\n"
    raw += b"connection: close\r\n\r\n"
    assert exchange(inline.port, [raw], shut=False).startswith(b"HTTP/1.1 200 OK")


def test_every_route_checks_its_token_before_the_body(inline: Served) -> None:
    """A head announcing a body that never comes: every route that needs a token answers
    401 at once, without waiting for the body."""
    for route in ROUTES:
        if route.access == "public":
            continue
        path = route.path.replace("{name}", "fixed").encode()
        head = b"%s %s HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n" % (
            route.method.encode(),
            path,
        )
        with inline.connect() as sock:
            sock.settimeout(5)
            sock.sendall(head + b"content-length: 100\r\n\r\n{")
            answer = read_response(sock, bytearray())
        assert answer.startswith(b"HTTP/1.1 401 "), (route, answer)
