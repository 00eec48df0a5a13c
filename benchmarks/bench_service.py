"""Load generator for ``ratekeeper serve`` on 127.0.0.1 (bounded count and time).

For each store (memory; Redis with batching; Redis with one EVALSHA per decision) it starts the
service as a real process and a private ``redis-server``, then drives:

- HTTP: ``--clients`` keep-alive connections each sending ``POST /v1/hit`` in a loop;
- gRPC: ``--clients`` concurrent ``ShouldRateLimit`` calls over one channel;
- engine: the same decisions in-process without HTTP (what the store path alone costs).

It prints decisions/s, p50/p99 latency, and Redis calls per decision: commands (from Redis'
``INFO commandstats``) and round trips (store calls, from the service's own metrics).
Figures are noisy on a shared machine; compare rows of one run, not runs.

    python benchmarks/bench_service.py --clients 64 --requests 20000 --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

POLICY = "policies:\n  bench:\n    rate: 1000000000/hour\n    algorithm: {algorithm}\n"
ENVOY = (
    "domains:\n  - domain: bench\n    descriptors:\n      - key: user\n"
    "        rate_limit: {unit: hour, requests_per_unit: 1000000000}\n"
)


TIMEOUT = "  socket_timeout: 2.0\n"  # a loaded machine must not turn the run into fail-open answers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Redis:
    """A private redis-server on a free port, persistence off."""

    def __init__(self) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise SystemExit("redis-server is not installed")
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="rk-bench-")
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--save", "", "--appendonly", "no", "--dir", self.dir],
            stdout=subprocess.DEVNULL,
        )
        import redis

        self.client = redis.Redis(port=self.port)
        for _ in range(100):
            try:
                self.client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def commands(self) -> int:
        stats = self.client.info("commandstats")
        return sum(int(v["calls"]) for k, v in stats.items() if k.startswith("cmdstat_eval"))

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


class Service:
    """``ratekeeper serve`` in its own process."""

    def __init__(self, config: str) -> None:
        self.dir = tempfile.mkdtemp(prefix="rk-bench-")
        path = Path(self.dir) / "bench.yaml"
        path.write_text(config)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ratekeeper.cli", "serve", "--config", str(path),
             "--port", "0", "--grpc-port", "0"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        m = re.search(r":(\d+) and gRPC \(Envoy RLS\) on [^ ]+:(\d+)", line)
        if m is None:
            self.stop()
            raise SystemExit(f"service did not start: {line!r}")
        self.port, self.grpc_port = int(m.group(1)), int(m.group(2))

    def store_calls(self) -> tuple[float, float]:
        """(store calls, degraded decisions) from the service's metrics."""
        import httpx

        text = httpx.get(f"http://127.0.0.1:{self.port}/metrics").text
        calls = _metric(text, "ratekeeper_store_latency_seconds_count")
        degraded = sum(
            float(v)
            for v in re.findall(
                r'^ratekeeper_decisions_total\{outcome="degraded".*\} (\S+)$', text, re.M
            )
        )
        return calls, degraded

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


async def drive(
    worker: Callable[[int], Awaitable[Callable[[int], Awaitable[None]]]],
    clients: int,
    requests: int,
    seconds: float,
) -> tuple[int, float, list[float]]:
    """Run ``clients`` loops until ``requests`` are done or ``seconds`` pass."""
    latencies: list[float] = []
    done = 0
    deadline = time.perf_counter() + seconds

    async def loop(i: int) -> None:
        nonlocal done
        call = await worker(i)
        n = 0
        while done < requests and time.perf_counter() < deadline:
            done += 1
            start = time.perf_counter()
            await call(i * 1_000_003 + n)
            latencies.append(time.perf_counter() - start)
            n += 1

    start = time.perf_counter()
    await asyncio.gather(*(loop(i) for i in range(clients)))
    return len(latencies), time.perf_counter() - start, latencies


def http_worker(port: int) -> Callable[[int], Awaitable[Callable[[int], Awaitable[None]]]]:
    async def make(_: int) -> Callable[[int], Awaitable[None]]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)

        async def call(n: int) -> None:
            body = json.dumps({"policy": "bench", "key": f"user{n % 10_000}"}).encode()
            writer.write(
                b"POST /v1/hit HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
                b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
            )
            head = await reader.readuntil(b"\r\n\r\n")
            m = re.search(rb"content-length: (\d+)", head, re.I)
            assert m is not None and head.startswith(b"HTTP/1.1 200"), head
            await reader.readexactly(int(m.group(1)))

        return call

    return make


def grpc_worker(port: int) -> Callable[[int], Awaitable[Callable[[int], Awaitable[None]]]]:
    import grpc

    from ratekeeper.service.proto import rls_pb2 as pb
    from ratekeeper.service.proto import rls_pb2_grpc as pb_grpc

    stubs: list[pb_grpc.RateLimitServiceStub] = []

    async def make(_: int) -> Callable[[int], Awaitable[None]]:
        if not stubs:  # one channel, made on the loop that uses it
            stubs.append(
                pb_grpc.RateLimitServiceStub(grpc.aio.insecure_channel(f"127.0.0.1:{port}"))
            )
        stub = stubs[0]

        async def call(n: int) -> None:
            entry = pb.RateLimitDescriptor.Entry(key="user", value=str(n % 10_000))
            req = pb.RateLimitRequest(
                domain="bench", descriptors=[pb.RateLimitDescriptor(entries=[entry])]
            )
            response = await stub.ShouldRateLimit(req)
            assert response.overall_code == pb.RateLimitResponse.OK

        return call

    return make


async def engine_run(
    store_url: str | None, batch: bool, clients: int, requests: int, seconds: float
) -> tuple[int, float, list[float]]:
    """Decisions in-process through the engine (no HTTP), to isolate the store path."""
    from ratekeeper.service.server import ServeOptions, Service

    store = (
        "store: memory\n"
        if store_url is None
        else f"store:\n  url: {store_url}\n  batch: {str(batch).lower()}\n{TIMEOUT}"
    )
    path = Path(tempfile.mkdtemp(prefix="rk-bench-")) / "engine.yaml"
    path.write_text(store + POLICY.format(algorithm="fixed_window"))
    service = Service(ServeOptions((str(path),)))
    spec = service.engine.spec("bench")
    degraded0 = service.engine.limiter.stats()["degraded"]

    async def make(_: int) -> Callable[[int], Awaitable[None]]:
        async def call(n: int) -> None:
            await service.engine.hit(spec, f"user{n % 10_000}", 1)

        return call

    result = await drive(make, clients, requests, seconds)
    degraded = service.engine.limiter.stats()["degraded"] - degraded0
    if degraded:
        print(f"  ({degraded} degraded decisions: the store timed out)", flush=True)
    return result


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(len(s) * p))] * 1000 if s else float("nan")


def report(name: str, result: tuple[int, float, list[float]], extra: str = "") -> float:
    n, elapsed, lat = result
    rate = n / elapsed
    print(
        f"{name:<34} {rate:>10,.0f}/s  p50 {pct(lat, 0.5):6.2f} ms  p99 {pct(lat, 0.99):6.2f} ms"
        f"  n={n}{extra}",
        flush=True,
    )
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests", type=int, default=20_000, help="per scenario, at most")
    parser.add_argument("--seconds", type=float, default=10.0, help="per scenario, at most")
    parser.add_argument("--algorithm", default="fixed_window")
    parser.add_argument("--skip-redis", action="store_true")
    args = parser.parse_args()
    c, r, s = args.clients, args.requests, args.seconds
    print(f"# {c} clients, <= {r} requests or {s} s per row, 127.0.0.1, "
          f"{os.cpu_count()} CPUs (shared: noisy)")  # fmt: skip
    redis_server = None if args.skip_redis else Redis()
    stores: list[tuple[str, str, Redis | None]] = [("memory", "store: memory\n", None)]
    if redis_server is not None:
        url = redis_server.url
        stores += [
            ("redis batched", f"store:\n  url: {url}\n  batch: true\n{TIMEOUT}", redis_server),
            (
                "redis 1 EVALSHA/decision",
                f"store:\n  url: {url}\n  batch: false\n{TIMEOUT}",
                redis_server,
            ),
        ]
    rates: dict[str, float] = {}
    try:
        for label, store, rserver in stores:
            service = Service(store + POLICY.format(algorithm=args.algorithm) + ENVOY)
            try:
                for api, worker in (("HTTP", http_worker(service.port)),
                                    ("gRPC", grpc_worker(service.grpc_port))):  # fmt: skip
                    before = rserver.commands() if rserver else 0
                    calls0, degraded0 = service.store_calls()
                    result = asyncio.run(drive(worker, c, r, s))
                    calls1, degraded1 = service.store_calls()
                    extra = f"  degraded {degraded1 - degraded0:.0f}"
                    if rserver is not None:
                        cmds = (rserver.commands() - before) / max(1, result[0])
                        trips = (calls1 - calls0) / max(1, result[0])
                        extra += (
                            f"  redis cmds/decision {cmds:.2f}  round trips/decision {trips:.3f}"
                        )
                    rates[f"{api} {label}"] = report(f"{api:<5} {label}", result, extra)
            finally:
                service.stop()
        engines: list[tuple[str, str | None, bool]] = [("memory", None, False)]
        if redis_server is not None:
            engines += [
                ("redis batched", redis_server.url, True),
                ("redis 1 EVALSHA/decision", redis_server.url, False),
            ]
        for label, url, batch in engines:
            result = asyncio.run(engine_run(url, batch, c, r, s))
            rates[f"engine {label}"] = report(f"engine {label}", result)
    finally:
        if redis_server is not None:
            redis_server.stop()
    for api in ("HTTP", "gRPC", "engine"):
        a, b = rates.get(f"{api} redis batched"), rates.get(f"{api} redis 1 EVALSHA/decision")
        if a and b:
            print(f"{api}: batching gives {a / b:.2f}x the decisions/s of one EVALSHA per decision")


if __name__ == "__main__":
    main()
