"""``OneWrite``: a response's head goes out with its body in one write, and nothing is held
past the end of a response, a close, or a ``100 Continue``. Checked on a recording transport
and, end to end, on the bytes a real ``ratekeeper serve`` sends over one socket."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from ratekeeper.service.connections import OneWrite
from tests.service.proc import ServiceProcess


class Recording:
    """A transport that records what is written and whether it was closed."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str) -> Any:
        return None


def one_write() -> tuple[OneWrite, Recording]:
    inner = Recording()
    return OneWrite(cast(asyncio.Transport, inner)), inner


def test_head_and_body_are_one_write() -> None:
    transport, inner = one_write()
    transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    assert inner.writes == []
    transport.write(b"{}")
    assert inner.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]
    transport.write(b"more")  # not a head: straight through
    assert inner.writes[-1] == b"more"


def test_nothing_is_held_past_a_flush_a_close_or_another_use() -> None:
    transport, inner = one_write()
    transport.write(b"HTTP/1.1 204 No Content\r\n\r\n")
    transport.flush()  # the end of a response without a body write (HEAD, 204)
    assert inner.writes == [b"HTTP/1.1 204 No Content\r\n\r\n"]
    transport.write(b"HTTP/1.1 400 Bad Request\r\n\r\n")
    transport.close()
    assert inner.writes[-1] == b"HTTP/1.1 400 Bad Request\r\n\r\n" and inner.closed
    transport, inner = one_write()
    transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
    transport.get_extra_info("peername")
    assert inner.writes == [b"HTTP/1.1 200 OK\r\n\r\n"]


def test_100_continue_is_sent_at_once() -> None:
    transport, inner = one_write()
    transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    assert inner.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ServiceProcess]:
    config = tmp_path / "svc.yaml"
    config.write_text("store: memory\npolicies:\n  p:\n    rate: 100/minute\n")
    proc = ServiceProcess(config, grpc=False)
    try:
        yield proc
    finally:
        proc.stop()


def test_a_real_server_answers_whole_responses(service: ServiceProcess) -> None:
    """Pipelined requests, a HEAD-less 405 and a 100-continue all get complete answers."""
    with socket.create_connection(("127.0.0.1", service.port), timeout=10) as sock:
        body = b'{"policy":"p","key":"k"}'
        hit = (
            b"POST /v1/hit HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body)
        )
        sock.sendall(hit + hit + b"GET /v1/hit HTTP/1.1\r\nhost: x\r\n\r\n")
        seen = b""
        while seen.count(b"HTTP/1.1 ") < 3 or not seen.endswith(b"}"):
            chunk = sock.recv(65536)
            assert chunk, seen
            seen += chunk
        assert seen.count(b"HTTP/1.1 200 OK") == 2 and b"HTTP/1.1 405" in seen
        sock.sendall(
            b"POST /v1/hit HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"expect: 100-continue\r\ncontent-length: %d\r\n\r\n" % len(body)
        )
        assert sock.recv(65536).startswith(b"HTTP/1.1 100 Continue")
        sock.sendall(body)
        answer = b""
        while not answer.endswith(b"}"):
            chunk = sock.recv(65536)
            assert chunk
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200 OK") and b'"allowed":true' in answer
