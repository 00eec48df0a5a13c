"""Random interleavings through real sockets: a decision route answered by the connection
itself and the same route handed to the ASGI app give the same answers, in the same order.

Each scenario (a seed) plays the same scripts on two servers at once (``served.py``:
``inline`` and ``asgi``): a few connections, each sending pipelined requests of both kinds
(hits, peeks, refunds, resets, other routes, client mistakes, wrong tokens), its byte stream
cut at random points and sent with random pauses (partial and slow bodies, heads split
anywhere), some reading their answers only once everything is sent (a slow reader, with
enough answers to fill the send buffer), some ending with a half-close. Each connection has
keys of its own and the clock stands still during a scenario, so a connection's answers are
set by its own requests whatever order the connections are served in; the transcripts of the
two servers must be equal, and hold one answer per request."""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from ratekeeper import ManualClock
from tests.service import test_http_hit
from tests.service.served import Served, read_response
from tests.service.test_http_connection import ADMIN, CLIENT, CONFIG

SCENARIOS = 16


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[ManualClock, Served, Served]]:
    clock = ManualClock(1_800_000_000.0)
    inline, asgi = Served(clock, "inline", CONFIG), Served(clock, "asgi", CONFIG)
    try:
        yield clock, inline, asgi
    finally:
        inline.stop()
        asgi.stop()


def a_request(rng: random.Random, conn: int) -> bytes:
    """One request of connection ``conn``: its own keys, both kinds of routes."""
    roll = rng.random()
    if roll < 0.06:
        return b"GET /v1/policies HTTP/1.1\r\nhost: localhost\r\n" + CLIENT + b"\r\n"
    if roll < 0.10:
        return b"GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n"
    if roll < 0.12:
        wrong = [b"GET /v1/hit", b"GET /v1/nope", b"GET /healthz"]  # 405, 404, a foreign Host
        host = b"evil.example" if rng.random() < 0.3 else b"localhost"
        return rng.choice(wrong) + b" HTTP/1.1\r\nhost: %s\r\n%s\r\n" % (host, CLIENT)
    path = rng.choice([b"/v1/hit"] * 6 + [b"/v1/peek", b"/v1/refund", b"/v1/reset"])
    auth = ADMIN if path == b"/v1/reset" or rng.random() < 0.1 else CLIENT
    if rng.random() < 0.06:
        auth = rng.choice([b"", b"authorization: Bearer wrong-token-0123456789\r\n"])
    body: dict[str, Any] = {
        "policy": rng.choice(test_http_hit.NAMES),
        "key": f"c{conn}-{rng.choice('ab')}",
    }
    if path != b"/v1/reset" and rng.random() < 0.2:
        body["cost"] = rng.choice([1, 2, 0, "x"])
    raw = json.dumps(body).encode()
    if rng.random() < 0.03:
        raw = rng.choice([b"", b"{", b"[1]"])
    kind = b"content-type: application/json\r\n" if rng.random() < 0.97 else b""
    if rng.random() < 0.15:  # chunked, in chunks of random sizes
        cuts = sorted(rng.sample(range(1, len(raw)), min(3, len(raw) - 1))) if len(raw) > 1 else []
        parts = [raw[i:j] for i, j in zip([0, *cuts], [*cuts, len(raw)], strict=True)]
        chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts if p) + b"0\r\n\r\n"
        framing = b"transfer-encoding: chunked\r\n\r\n" + chunks
    else:
        framing = b"content-length: %d\r\n\r\n%s" % (len(raw), raw)
    head = b"POST %s HTTP/1.1\r\nhost: localhost\r\n%s%s" % (path, kind, auth)
    return head + framing


@dataclass
class Script:
    """What one connection does: its requests, the stream cut into pieces with pauses,
    whether it reads as it sends, and whether it ends with a half-close."""

    requests: list[bytes]
    pieces: list[tuple[bytes, float]]
    slow_reader: bool
    half_close: bool

    @classmethod
    def random(cls, rng: random.Random, conn: int) -> Script:
        slow_reader = rng.random() < 0.25
        count = rng.randint(150, 300) if slow_reader else rng.randint(1, 40)
        requests = [a_request(rng, conn) for _ in range(count)]
        stream = b"".join(requests)
        pieces: list[tuple[bytes, float]] = []
        at = 0
        while at < len(stream):
            size = rng.choice([1, 7, 40, 200, 1500, 10_000, len(stream)])
            pause = rng.choice([0.0, 0.0, 0.0, 0.001, 0.01, 0.05])
            pieces.append((stream[at : at + size], pause))
            at += size
        return cls(requests, pieces, slow_reader, rng.random() < 0.4)


def play(served: Served, script: Script, transcript: list[bytes]) -> None:
    """Play ``script`` on one connection to ``served``; ``transcript`` gets its answers and,
    after a half-close, b"" once the server closed."""
    with served.connect() as sock:
        sock.settimeout(20)
        buffer = bytearray()
        expected = len(script.requests)

        def read() -> None:
            while len(transcript) < expected:
                answer = read_response(sock, buffer)
                transcript.append(answer)
                if not answer:
                    return

        reader = threading.Thread(target=read)
        if not script.slow_reader:
            reader.start()
        for piece, pause in script.pieces:
            sock.sendall(piece)
            if pause:
                time.sleep(pause)
        if script.half_close:
            sock.shutdown(socket.SHUT_WR)
        if script.slow_reader:
            time.sleep(0.3)  # answers pile up in the server's buffer meanwhile
            reader.start()
        reader.join(30)
        assert not reader.is_alive(), "answers stopped coming"
        if script.half_close:
            transcript.append(sock.recv(1))  # closed once everything is answered


@pytest.mark.parametrize("seed", range(SCENARIOS))
def test_inline_and_asgi_answers_agree(pair: tuple[ManualClock, Served, Served], seed: int) -> None:
    clock, inline, asgi = pair
    clock.advance(60.0)  # a fresh window for every scenario; still during it
    rng = random.Random(seed)
    scripts = [Script.random(rng, seed * 10 + c) for c in range(rng.randint(1, 4))]
    transcripts: dict[tuple[int, int], list[bytes]] = {}
    threads = []
    for i, script in enumerate(scripts):
        for j, served in enumerate((inline, asgi)):
            transcripts[i, j] = []
            threads.append(threading.Thread(target=play, args=(served, script, transcripts[i, j])))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for i, script in enumerate(scripts):
        ours, theirs = transcripts[i, 0], transcripts[i, 1]
        assert len(ours) == len(script.requests) + script.half_close, (i, len(ours))
        assert all(ours[: len(script.requests)]), "every request is answered"
        assert ours == theirs, (seed, i)
        if script.half_close:
            assert ours[-1] == b""
    assert inline.api.in_flight == 0 and asgi.api.in_flight == 0
