"""Slow, silent and stuck connections against a real ``ratekeeper serve`` with a lowered file
descriptor limit (128, set in the child): every stage of a request is timed (idle, head,
body), a request is refused by its head before its body is awaited, and none of it can keep
normal requests out.

Counts and times are bounded: at most 150 idle connections over loopback, timeouts of 1 s,
and generous deadlines (nothing here measures speed)."""

from __future__ import annotations

import json
import resource
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.service.proc import ServiceProcess

FD_LIMIT = 128
IDLE = 150  # more connections than the service has descriptors
TOKEN = "client-token-0123456789"
HIT = b'{"policy":"p","key":"k"}'


def _low_fd_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


def serve(tmp_path: Path, *extra: str, env: dict[str, str] | None = None) -> ServiceProcess:
    config = tmp_path / "svc.yaml"
    config.write_text("policies:\n  p:\n    rate: 1000/second\n")
    return ServiceProcess(config, extra=extra, preexec_fn=_low_fd_limit, env=env, grpc=False)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ServiceProcess]:
    proc = serve(tmp_path, "--header-timeout", "1", "--idle-timeout", "1", "--body-timeout", "1")
    yield proc
    proc.stop()


def _open_idle(port: int, n: int) -> list[socket.socket]:
    """``n`` connections: half silent, half stuck in the middle of their headers."""
    socks = []
    for i in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        if i % 2:
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # never finished
        socks.append(s)
    return socks


def read_until_closed(sock: socket.socket, deadline: float) -> bytes | None:
    """What the server sent before it closed the connection; None if still open at
    ``deadline``."""
    seen = b""
    while True:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            return seen
        except TimeoutError:
            return None
        if not chunk:
            return seen
        seen += chunk


def stuck_in_body(port: int, auth: bytes = b"") -> socket.socket:
    """A connection that sent a decision's head announcing 100 bytes, and 1 of them."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(
        b"POST /v1/hit HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
        b"%scontent-length: 100\r\n\r\n{" % auth
    )
    return sock


def test_idle_connections_cannot_stop_normal_requests(service: ServiceProcess) -> None:
    idle = _open_idle(service.port, IDLE)
    try:
        statuses = []
        with httpx.Client(base_url=service.url, timeout=10) as http:
            for _ in range(20):
                statuses.append(http.get("/healthz").status_code)
                hit = http.post("/v1/hit", json={"policy": "p", "key": "k"})
                statuses.append(hit.status_code)
        assert statuses == [200] * 40
    finally:
        for s in idle:
            s.close()


def test_slow_and_silent_connections_are_closed(service: ServiceProcess) -> None:
    idle = _open_idle(service.port, 40)
    try:
        deadline = time.monotonic() + 15  # timeouts of 1 s; room for a loaded machine
        seen = [read_until_closed(s, deadline) for s in idle]
        assert all(x is not None for x in seen), f"{seen.count(None)} of {len(idle)} still open"
        assert all(x == b"" for x in seen[::2])  # silent: closed
        assert all(x.startswith(b"HTTP/1.1 408 ") for x in seen[1::2] if x is not None)
    finally:
        for s in idle:
            s.close()


def test_a_connection_trickling_its_headers_is_closed(service: ServiceProcess) -> None:
    """A byte every 0.3 s keeps resetting an idle timer; the header timeout is not reset."""
    with socket.create_connection(("127.0.0.1", service.port), timeout=10) as s:
        start = time.monotonic()
        try:
            for byte in b"GET /healthz HTTP/1.1\r\nHost: slow-loris\r\nX-A: " + b"a" * 100:
                s.sendall(bytes([byte]))
                time.sleep(0.3)
                if time.monotonic() - start > 15:
                    break
        except (ConnectionResetError, BrokenPipeError):
            pass
        assert read_until_closed(s, time.monotonic() + 5) is not None
        assert time.monotonic() - start < 15


def test_a_connection_stuck_in_its_body_is_closed(service: ServiceProcess) -> None:
    """The head timer stops once the head is complete; the body has a timer of its own."""
    socks = [stuck_in_body(service.port) for _ in range(5)]
    try:
        deadline = time.monotonic() + 15  # body timeout 1 s
        for sock in socks:
            seen = read_until_closed(sock, deadline)
            assert seen is not None and seen.startswith(b"HTTP/1.1 408 "), seen
            assert b'"field":"body"' in seen
    finally:
        for sock in socks:
            sock.close()


def test_connections_stuck_in_their_bodies_cannot_lock_clients_out(tmp_path: Path) -> None:
    """20 connections stuck in a body with ``--max-connections 20``: a new client makes room
    by closing the one that waited longest (long before the body timeout, 10 s)."""
    proc = serve(tmp_path, "--max-connections", "20")
    stuck = [stuck_in_body(proc.port) for _ in range(20)]
    try:
        time.sleep(0.3)
        statuses = []
        for _ in range(5):
            with httpx.Client(base_url=proc.url, timeout=8) as http:
                statuses.append(http.post("/v1/hit", json={"policy": "p", "key": "k"}).status_code)
        assert statuses == [200] * 5
    finally:
        for sock in stuck:
            sock.close()
        proc.stop()


def test_a_head_is_refused_before_its_body_is_awaited(tmp_path: Path) -> None:
    """Without a token, a stuck body is answered 401 at once (the token is checked when the
    head is complete), as is a Content-Length over the limit (413, then closed)."""
    proc = serve(tmp_path, env={"RATEKEEPER_TOKEN": TOKEN})  # body timeout: 10 s
    try:
        sock = stuck_in_body(proc.port)
        sock.settimeout(5)
        assert sock.recv(65536).startswith(b"HTTP/1.1 401 ")
        sock.close()
        with socket.create_connection(("127.0.0.1", proc.port), timeout=5) as big:
            big.sendall(
                b"POST /v1/hit HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
                b"authorization: Bearer %s\r\ncontent-length: 1000000\r\n\r\n" % TOKEN.encode()
            )
            seen = read_until_closed(big, time.monotonic() + 5)
            assert seen is not None and seen.startswith(b"HTTP/1.1 413 "), seen
            assert b"connection: close\r\n" in seen
    finally:
        proc.stop()


def test_a_pipelined_body_slower_than_the_idle_timeout_is_answered(tmp_path: Path) -> None:
    """The first answer does not start a keep-alive timer under the second request, whose
    body's second half comes 6 s after its first (idle timeout 5 s, body timeout 10 s: the
    defaults)."""
    proc = serve(tmp_path)
    head = b"POST /v1/hit HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
    whole = head + b"content-length: %d\r\n\r\n%s" % (len(HIT), HIT)
    try:
        with socket.create_connection(("127.0.0.1", proc.port), timeout=10) as sock:
            sock.sendall(whole + whole[: len(whole) - len(HIT) + 3])
            time.sleep(6)
            sock.sendall(HIT[3:])
            seen = b""
            while seen.count(b"HTTP/1.1 200 OK") < 2:
                chunk = sock.recv(65536)
                assert chunk, seen
                seen += chunk
    finally:
        proc.stop()


def read_answers(sock: socket.socket, count: int) -> list[bytes]:
    """``count`` answers off ``sock`` (fewer if it closes), each head and body."""
    answers: list[bytes] = []
    buffer = b""
    while len(answers) < count:
        end = buffer.find(b"\r\n\r\n")
        if end >= 0:
            length = int(buffer.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
            if len(buffer) >= end + 4 + length:
                answers.append(buffer[: end + 4 + length])
                buffer = buffer[end + 4 + length :]
                continue
        chunk = sock.recv(1 << 20)
        if not chunk:
            break
        buffer += chunk
    return answers


def test_a_pipeline_behind_an_asgi_answer_is_answered_whole(tmp_path: Path) -> None:
    """``GET /healthz`` (an ASGI route) and 2,000 decisions behind it on one connection, with
    the token and then with a wrong one: every one answered, in order (no answer made from
    inside the one before: no recursion, no traceback)."""
    config = tmp_path / "svc.yaml"
    config.write_text("policies:\n  p:\n    rate: 3/hour\n")
    proc = ServiceProcess(config, grpc=False, env={"RATEKEEPER_TOKEN": TOKEN})
    hit = (
        b"POST /v1/hit HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
        b"authorization: Bearer %s\r\ncontent-length: %d\r\n\r\n%s"
        % (TOKEN.encode(), len(HIT), HIT)
    )
    wrong = hit.replace(TOKEN.encode(), b"wrong-token-0123456789")
    try:
        for each, status in ((hit, b"HTTP/1.1 200 "), (wrong, b"HTTP/1.1 401 ")):
            with socket.create_connection(("127.0.0.1", proc.port), timeout=20) as sock:
                sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n" + each * 2000)
                answers = read_answers(sock, 2001)
            assert len(answers) == 2001
            assert answers[0].startswith(b"HTTP/1.1 200 ") and b'"store":"ok"' in answers[0]
            assert all(a.startswith(status) for a in answers[1:])
            if each is hit:  # 3 an hour: the first three admitted, in order
                allowed = [json.loads(a.split(b"\r\n\r\n")[1])["allowed"] for a in answers[1:]]
                assert allowed == [True] * 3 + [False] * 1997
    finally:
        logs = proc.stop()
    assert "Traceback" not in logs and "RecursionError" not in logs


def test_a_client_that_reads_nothing_is_cut_off(tmp_path: Path) -> None:
    """Thousands of pipelined requests and no answer read: the server stops reading once its
    send buffer is full, then cuts the client off after ``--send-timeout``; others are
    served meanwhile."""
    proc = serve(tmp_path, "--send-timeout", "1")
    hit = (
        b"POST /v1/hit HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(HIT), HIT)
    )
    try:
        with socket.create_connection(("127.0.0.1", proc.port), timeout=10) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # takes little
            sock.settimeout(0.5)
            sent = 0
            started = time.monotonic()
            while time.monotonic() - started < 15:
                try:
                    sent += sock.send(hit * 100)
                except TimeoutError:  # the server stopped reading: its buffers are full
                    break
                except (ConnectionResetError, BrokenPipeError):
                    break
            with httpx.Client(base_url=proc.url, timeout=5) as http:  # others: served
                assert http.get("/healthz").status_code == 200
            time.sleep(3)  # past the send timeout, reading nothing
            seen = read_until_closed(sock, time.monotonic() + 15)
            assert seen is not None  # closed
            assert seen.count(b"HTTP/1.1 200 ") < sent // len(hit)  # cut off, not served out
    finally:
        proc.stop()
