"""Signals and reloads of a real ``ratekeeper serve`` (and ``--workers``) process: SIGHUP is
ignored until it serves, then reloads (off the event loop, coalesced, its duration logged);
SIGTERM drains and exits 0, also while starting; a worker that stops answering is replaced.
Real processes and real signals, bounded waits."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from ratekeeper.service.config import loader as config_mod
from ratekeeper.service.server import ServeOptions, Service
from tests.service.proc import ServiceProcess
from tests.service.test_workers import Workers, write

JSON = {"content-type": "application/json"}


class Starting:
    """``ratekeeper serve`` started without waiting for it: its output gathered as it comes."""

    def __init__(self, *args: str) -> None:
        command = [sys.executable, "-m", "ratekeeper.cli", "serve", "--port", "0", *args]
        self.proc = subprocess.Popen(  # a process group of its own, as a shell's job
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, process_group=0
        )
        self.out: list[str] = []
        self.err: list[str] = []
        for stream, into in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
            threading.Thread(target=self._gather, args=(stream, into), daemon=True).start()

    @staticmethod
    def _gather(stream: object, into: list[str]) -> None:
        for line in stream:  # type: ignore[attr-defined]
            into.append(line)

    def ignores(self, sig: signal.Signals) -> bool:
        """Whether the process has ``sig`` set to be ignored (its status in /proc)."""
        try:
            status = Path(f"/proc/{self.proc.pid}/status").read_text()
        except FileNotFoundError:
            return False
        mask = next(line for line in status.splitlines() if line.startswith("SigIgn:"))
        return bool(int(mask.split()[1], 16) >> (sig - 1) & 1)

    def serving(self) -> bool:
        return any("serving HTTP" in line for line in self.out)

    def port(self) -> int:
        line = next(line for line in self.out if "serving HTTP" in line)
        return int(line.split("http://127.0.0.1:")[1].split()[0])

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        return self.proc.returncode


def eventually(check: Callable[[], bool], seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


@pytest.fixture
def unreachable(tmp_path: Path) -> Iterator[Path]:
    """A config whose Redis never answers (a port bound, not listening, for the test)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        config = tmp_path / "down.yaml"
        url = f"redis://127.0.0.1:{held.getsockname()[1]}/0"
        config.write_text(f"store:\n  url: {url}\npolicies:\n  p:\n    rate: 5/second\n")
        yield config


def test_sighup_while_starting_is_ignored(unreachable: Path) -> None:
    """SIGHUPs while ``--store-wait`` waits for a store that never answers: the process goes
    on starting, serves degraded, and then reloads on SIGHUP."""
    starting = Starting(  # reloads are logged at INFO
        "--config", str(unreachable), "--no-grpc", "--store-wait", "3", "--start-degraded",
        "--log-level", "info",
    )  # fmt: skip
    try:
        eventually(lambda: starting.ignores(signal.SIGHUP), 20)
        while not starting.serving():
            assert starting.proc.poll() is None, "".join(starting.err)  # not killed by it
            starting.proc.send_signal(signal.SIGHUP)
            time.sleep(0.1)
        starting.proc.send_signal(signal.SIGHUP)  # serving: a reload
        eventually(lambda: any("config reloaded" in line for line in starting.err))
        assert starting.proc.poll() is None
    finally:
        assert starting.stop() == 0


def test_sigterm_exits_0_while_starting_and_while_serving(unreachable: Path) -> None:
    starting = Starting("--config", str(unreachable), "--no-grpc", "--store-wait", "30")
    eventually(lambda: starting.ignores(signal.SIGHUP), 20)  # past the imports, waiting
    started = time.monotonic()
    assert starting.stop() == 0
    assert time.monotonic() - started < 10  # at once, not after --store-wait
    config = unreachable.with_name("memory.yaml")
    config.write_text("policies:\n  p:\n    rate: 5/second\n")
    serving = ServiceProcess(config, grpc=False)
    with socket.create_connection(("127.0.0.1", serving.port), timeout=10) as idle:
        idle.sendall(b"GET /healthz HTTP/1.1\r\nhost: localhost\r\n\r\n")
        assert idle.recv(65536).startswith(b"HTTP/1.1 200 ")  # kept alive, now idle
        started = time.monotonic()
        serving.signal(signal.SIGTERM)
        assert idle.recv(1) == b""  # an idle connection is closed at once
        assert serving.proc.wait(20) == 0  # was 143: uvicorn raised the signal again
        assert time.monotonic() - started < 4  # nothing to drain: no wait


def wait_read(server_port: int, client_port: int, timeout: float = 30.0) -> None:
    """Wait until the server has accepted the loopback connection from ``client_port`` and
    read everything sent on it (its receive queue in /proc/net/tcp is empty)."""
    local, remote = f"0100007F:{server_port:04X}", f"0100007F:{client_port:04X}"
    deadline = time.monotonic() + timeout
    while True:
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[1] == local and fields[2] == remote and fields[4].endswith(":00000000"):
                return
        assert time.monotonic() < deadline, "the service never read the request"
        time.sleep(0.01)


def read_response(conn: socket.socket) -> bytes:
    """The response's status line and what came with it (up to 30 s)."""
    conn.settimeout(30)
    got = b""
    while b"\r\n" not in got and (chunk := conn.recv(65536)):
        got += chunk
    return got


def envoy_directory(path: Path, files: int) -> Path:
    """A config directory of ``files`` Envoy-format domains, slow enough to read that a
    reload lasts a while."""
    path.mkdir()
    for i in range(files):
        rows = "".join(
            f"  - key: k{j}\n    value: v{j}\n"
            f"    rate_limit: {{unit: minute, requests_per_unit: {j + 1}}}\n"
            for j in range(20)
        )
        (path / f"d{i}.yaml").write_text(f"domain: d{i}\ndescriptors:\n{rows}")
    (path / "policies.yaml").write_text("policies:\n  p:\n    rate: 1000/second\n")
    return path


def test_a_reload_does_not_stop_the_answers(tmp_path: Path) -> None:
    """While a reload reads a config of many files, ``/healthz`` goes on being answered; the
    reload's duration is logged; SIGTERM during a reload still answers it, then exits 0."""
    directory = envoy_directory(tmp_path / "conf", 150)
    proc = ServiceProcess(  # reloads are logged at INFO
        directory, grpc=False, extra=("--watch-interval", "0", "--log-level", "info")
    )
    try:
        with httpx.Client(base_url=proc.url, timeout=30) as http:
            started = time.monotonic()
            assert http.post("/v1/admin/reload", json={}).json()["reloaded"] is True
            took = time.monotonic() - started
            with ThreadPoolExecutor(1) as pool:
                reload = pool.submit(lambda: http.post("/v1/admin/reload", json={}))
                answered = 0
                while not reload.done():
                    assert http.get("/healthz").status_code == 200
                    answered += 1
                assert reload.result().json()["reloaded"] is True
            assert answered >= 5, (answered, took)
            # stopped during a reload: it is answered. A stopping service gives what it
            # received DRAIN (5) seconds, and 150 files take 1 s to read here, 4.5 s beside
            # three busy loops: 20 files keep the reload well within the drain
            for extra in sorted(directory.glob("d*.yaml"))[20:]:
                extra.unlink()
            started = time.monotonic()
            assert http.post("/v1/admin/reload", json={}).json()["reloaded"] is True
            took = time.monotonic() - started
        # the signal goes once the service has read the request (a loaded machine may take
        # longer than any fixed pause to get there), and a little into the reload
        with socket.create_connection(("127.0.0.1", proc.port), timeout=30) as conn:
            body = b"{}"
            conn.sendall(
                b"POST /v1/admin/reload HTTP/1.1\r\nhost: localhost\r\n"
                b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                % (len(body), body)
            )
            wait_read(proc.port, conn.getsockname()[1])
            time.sleep(min(0.2, took / 4))
            proc.signal(signal.SIGTERM)
            assert read_response(conn).startswith(b"HTTP/1.1 200 ")
        assert proc.proc.wait(20) == 0
    finally:
        logs = proc.stop()
    assert "config reloaded from" in logs and " s\n" in logs  # with its duration


def test_a_reload_reads_in_a_thread_and_asks_meanwhile_share_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "rk.yaml"
    config.write_text("policies:\n  p:\n    rate: 5/second\n")
    service = Service(ServeOptions((str(config),), grpc_port=None))
    load = config_mod.load
    threads: list[int] = []

    def slow_load(*args: object, **kwargs: object) -> object:
        threads.append(threading.get_ident())
        time.sleep(0.5)
        return load(*args, **kwargs)  # type: ignore[arg-type]  # load's own arguments

    monkeypatch.setattr(config_mod, "load", slow_load)

    async def main() -> tuple[list[str | None], float]:
        gaps = [0.0]

        async def ticker() -> None:
            last = time.monotonic()
            while True:
                await asyncio.sleep(0.01)
                now = time.monotonic()
                gaps.append(now - last)
                last = now

        ticking = asyncio.create_task(ticker())
        first = asyncio.create_task(service.reload())
        await asyncio.sleep(0.1)  # the first reload runs; ten more asks share one more
        outcomes = await asyncio.gather(first, *(service.reload() for _ in range(10)))
        ticking.cancel()
        return list(outcomes), max(gaps)

    outcomes, longest = asyncio.run(main())
    assert outcomes == [None] * 11
    assert len(threads) == 2  # the running reload and one for the ten asks made meanwhile
    assert threading.get_ident() not in threads  # read off the event loop's thread
    assert longest < 0.3  # the loop turned while the files were read (0.5 s each)


@pytest.fixture
def slow_to_start(tmp_path: Path, redis_url: str) -> Iterator[Path]:
    yield write(tmp_path / "rk.yaml", redis_url)


def test_sighup_under_workers_reaches_only_workers_that_serve(slow_to_start: Path) -> None:
    """SIGHUPs to the supervisor's process group (a terminal's hangup) and to every worker
    (``pkill -HUP``) while the workers start kill nobody; once they serve, each gets one
    (coalesced) and reloads; a burst later costs each at most two reloads."""
    starting = Starting("--config", str(slow_to_start), "--grpc-port", "0", "--workers", "2")
    try:
        eventually(lambda: starting.ignores(signal.SIGHUP), 20)
        children = Path(f"/proc/{starting.proc.pid}/task/{starting.proc.pid}/children")
        while not any("supervisor " in line for line in starting.out):
            assert starting.proc.poll() is None, "".join(starting.err)
            os.killpg(starting.proc.pid, signal.SIGHUP)
            for child in children.read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(child), signal.SIGHUP)
            time.sleep(0.02)
        url = f"http://127.0.0.1:{starting.port()}"

        def reloads() -> list[int]:
            text = httpx.get(f"{url}/metrics", timeout=10).text
            counts = []
            for i in (0, 1):
                line = f'ratekeeper_config_reloads_total{{result="ok",worker="{i}"}} '
                found = [x for x in text.splitlines() if x.startswith(line)]
                counts.append(int(float(found[0].split()[-1])) if found else 0)
            return counts

        eventually(lambda: min(reloads()) >= 1)  # the SIGHUPs while starting, forwarded
        time.sleep(1.5)  # metrics are published every second
        before = reloads()
        for _ in range(5):
            starting.proc.send_signal(signal.SIGHUP)
        eventually(lambda: all(n > b for n, b in zip(reloads(), before, strict=True)))
        time.sleep(1.5)
        assert all(n <= b + 2 for n, b in zip(reloads(), before, strict=True)), reloads()
        assert starting.proc.poll() is None
    finally:
        assert starting.stop() == 0


def test_a_stopped_worker_is_replaced(tmp_path: Path, redis_url: str) -> None:
    workers = Workers(write(tmp_path / "rk.yaml", redis_url), "--worker-timeout", "2")
    victim = workers.pids[0]
    try:
        os.kill(victim, signal.SIGSTOP)
        eventually(lambda: victim not in workers.children() and len(workers.children()) == 2)

        def all_answered() -> bool:
            try:
                answers = [workers.hit({"policy": "exact", "key": f"after{i}"}) for i in range(20)]
            except httpx.TransportError:  # the replacement is not listening yet
                return False
            return all(a["allowed"] for a in answers)

        eventually(all_answered)
    finally:
        if Path(f"/proc/{victim}").exists():
            os.kill(victim, signal.SIGCONT)
        logs = workers.service.stop(timeout=20)
    assert f"worker 0 (pid {victim}) has not reported" in logs
