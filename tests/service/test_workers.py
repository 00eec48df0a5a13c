"""``ratekeeper serve --workers N``: real supervisor and worker processes on real Redis, real
signals, bounded waits. The memory store is refused; Redis limits stay exact across workers;
SIGHUP reloads every worker; a killed worker is replaced; SIGTERM stops them all."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import httpx
import pytest
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2 as common_pb
from envoy.service.ratelimit.v3 import rls_pb2 as pb
from envoy.service.ratelimit.v3 import rls_pb2_grpc as pb_grpc

from tests.service.proc import ServiceProcess, run_serve

POLICIES = """
policies:
  exact:
    rate: 25/hour
{more}domains:
  - domain: edge
    descriptors:
      - key: user
        rate_limit: {{unit: hour, requests_per_unit: 7}}
"""


def write(path: Path, redis_url: str, more: str = "") -> Path:
    # socket_timeout 5: a loaded machine misses the 50 ms default and fails open (not under test)
    store = f"store:\n  url: {redis_url}\n  socket_timeout: 5\n"
    path.write_text(store + POLICIES.format(more=more))
    return path


class Workers:
    """A supervisor with two workers; learns their PIDs from its third banner line."""

    def __init__(self, config: Path, *extra: str) -> None:
        self.service = ServiceProcess(config, extra=("--workers", "2", *extra))
        assert "[workers: 2]" in self.service.banner
        assert self.service.proc.stdout is not None
        lines = [self.service.proc.stdout.readline() for _ in range(2)]
        m = re.search(r"supervisor (\d+), workers (\d+), (\d+)", lines[1])
        assert m is not None, lines
        self.supervisor = int(m.group(1))
        self.pids = [int(m.group(2)), int(m.group(3))]
        assert self.supervisor == self.service.proc.pid

    def children(self) -> set[int]:
        path = Path(f"/proc/{self.supervisor}/task/{self.supervisor}/children")
        return {int(p) for p in path.read_text().split()}

    def hit(self, body: dict[str, object]) -> dict[str, object]:
        """One decision on a new connection (the kernel spreads connections over workers)."""
        with httpx.Client(base_url=self.service.url, timeout=10) as http:
            answer: dict[str, object] = http.post("/v1/hit", json=body).json()
            return answer

    def metrics(self) -> str:
        return httpx.get(f"{self.service.url}/metrics", timeout=10).text


@pytest.fixture
def workers(tmp_path: Path, redis_url: str) -> Iterator[Workers]:
    w = Workers(write(tmp_path / "rk.yaml", redis_url))
    try:
        yield w
    finally:
        w.service.stop(timeout=20)


def eventually(check: Callable[[], bool], seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.2)


def test_more_than_one_worker_refuses_the_memory_store(tmp_path: Path) -> None:
    config = tmp_path / "memory.yaml"
    config.write_text("store: memory\n" + POLICIES.format(more=""))
    done = run_serve("--workers", "2", "--config", str(config), "--port", "0", "--no-grpc")
    assert done.returncode == 2
    assert "store: memory" in done.stderr and "use Redis" in done.stderr
    assert "Traceback" not in done.stderr
    bad = run_serve("--workers", "0", "--config", str(config))
    assert bad.returncode == 2 and "workers '0' is invalid" in bad.stderr


def test_limits_are_exact_across_workers_and_metrics_name_each(workers: Workers) -> None:
    body = {"policy": "exact", "key": "shared"}
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: workers.hit(body), range(60)))
    assert not any(a["degraded"] for a in answers)
    assert sum(bool(a["allowed"]) for a in answers) == 25
    with grpc.insecure_channel(f"127.0.0.1:{workers.service.grpc_port}") as channel:
        stub = pb_grpc.RateLimitServiceStub(channel)  # type: ignore[no-untyped-call]
        entry = common_pb.RateLimitDescriptor.Entry(key="user", value="u1")
        request = pb.RateLimitRequest(
            domain="edge", descriptors=[common_pb.RateLimitDescriptor(entries=[entry])]
        )
        codes = [stub.ShouldRateLimit(request, timeout=10).overall_code for _ in range(10)]
    assert codes.count(pb.RateLimitResponse.OK) == 7

    def both_counted() -> bool:
        text = workers.metrics()
        return all(
            re.search(rf'ratekeeper_decisions_total\{{.*policy="exact",worker="{i}"\}}', text)
            for i in (0, 1)
        )

    eventually(both_counted)  # each worker served some of the 60 connections


def test_sighup_reloads_every_worker(workers: Workers, tmp_path: Path, redis_url: str) -> None:
    write(tmp_path / "rk.yaml", redis_url, "  fresh:\n    rate: 1000/hour\n")
    os.kill(workers.supervisor, signal.SIGHUP)

    def reloaded_everywhere() -> bool:
        text = workers.metrics()
        return all(
            f'ratekeeper_config_reloads_total{{result="ok",worker="{i}"}} 1.0' in text
            for i in (0, 1)
        )

    eventually(reloaded_everywhere)
    answers = [workers.hit({"policy": "fresh", "key": f"k{i}"}) for i in range(20)]
    assert all(a["allowed"] is True for a in answers), answers  # no worker kept the old config


def test_a_killed_worker_is_replaced(workers: Workers) -> None:
    assert workers.children() == set(workers.pids)
    victim, survivor = workers.pids
    os.kill(victim, signal.SIGKILL)
    eventually(lambda: victim not in workers.children() and len(workers.children()) == 2)
    replacement = (workers.children() - {survivor}).pop()

    def answers() -> bool:
        try:
            return all(
                workers.hit({"policy": "exact", "key": f"after{i}"})["allowed"] for i in range(20)
            )
        except httpx.TransportError:  # the replacement is not listening yet
            return False

    eventually(answers)
    assert replacement in workers.children() and survivor in workers.children()


def test_sigterm_stops_the_supervisor_and_every_worker(tmp_path: Path, redis_url: str) -> None:
    w = Workers(write(tmp_path / "rk.yaml", redis_url))
    try:
        assert w.hit({"policy": "exact", "key": "k"})["allowed"] is True
        w.service.proc.send_signal(signal.SIGTERM)
        assert w.service.proc.wait(20) == 0
        for pid in w.pids:
            assert not Path(f"/proc/{pid}").exists()  # stopped and reaped by the supervisor
    finally:
        w.service.stop()


def test_every_worker_watches_a_config_directory(tmp_path: Path, redis_url: str) -> None:
    directory = tmp_path / "conf"
    directory.mkdir()
    write(directory / "rk.yaml", redis_url)
    w = Workers(directory)
    try:

        def reloaded_everywhere() -> bool:
            # written until seen: a write before a watcher's first look would be its baseline
            write(directory / "rk.yaml", redis_url, "  fresh:\n    rate: 1000/hour\n")
            text = w.metrics()
            return all(
                re.search(
                    rf'ratekeeper_config_reloads_total\{{result="ok",worker="{i}"\}} [1-9]', text
                )
                for i in (0, 1)
            )

        eventually(reloaded_everywhere)
        answers = [w.hit({"policy": "fresh", "key": f"k{i}"}) for i in range(20)]
        assert all(a["allowed"] is True for a in answers), answers
    finally:
        w.service.stop(timeout=20)
