"""Slow and silent connections against a real ``ratekeeper serve`` with a lowered file
descriptor limit (128, set in the child): they are closed, and cannot stop normal requests.

Counts and times are bounded: 150 idle connections over loopback, a 1 s header timeout, and
generous deadlines (nothing here measures speed)."""

from __future__ import annotations

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


def _low_fd_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ServiceProcess]:
    config = tmp_path / "svc.yaml"
    config.write_text("policies:\n  p:\n    rate: 1000/second\n")
    proc = ServiceProcess(config, extra=("--header-timeout", "1"), preexec_fn=_low_fd_limit)
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


def _closed_by_server(sock: socket.socket, deadline: float) -> bool:
    sock.settimeout(max(0.01, deadline - time.monotonic()))
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


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
        deadline = time.monotonic() + 15  # header timeout 1 s; room for a loaded machine
        closed = [_closed_by_server(s, deadline) for s in idle]
        assert all(closed), f"{closed.count(False)} of {len(idle)} still open"
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
        assert _closed_by_server(s, time.monotonic() + 5)
        assert time.monotonic() - start < 15
