"""Load generator for ``ratekeeper serve`` on 127.0.0.1 (bounded count and time).

For each store (memory; Redis with batching; Redis with one EVALSHA per decision) it starts the
service as a real process and a private ``redis-server``, then drives:

- engine: the decisions in-process without HTTP (what the store path alone costs), first,
  while this process runs nothing else;
- HTTP: ``--clients`` keep-alive connections each sending ``POST /v1/hit`` in a loop, from
  ``wrk`` (one thread, a Lua script for the bodies and the count bound) when it is installed
  (Debian: ``apt-get install wrk``), else from this script's asyncio client
  (``--client python`` forces it); the header line says which;
- gRPC: ``--clients`` concurrent ``ShouldRateLimit`` calls over one ``grpc.aio`` channel.

Per row it prints decisions/s, p50/p99 latency, Redis calls per decision (commands from Redis'
``INFO commandstats``, round trips from the service's own metrics) and CPU per process (from
``/proc/PID/stat``: the service, redis-server and the client, in cores and in µs per
decision), then the batched/unbatched ratio for HTTP, gRPC and the engine.

    python benchmarks/bench_service.py --clients 64 --requests 60000 --seconds 10

One run on a shared 2-vCPU VM (client, service and Redis share both vCPUs with other work:
figures move by 20 % or more between runs; compare rows of one run, not runs), wrk 4.1:

    engine  memory     56,274/s  p50  0.02 ms  p99  0.05 ms   CPU 18 µs/decision
    engine  batched    27,965/s  p50  2.36 ms  p99  3.52 ms   CPU 24 + Redis 12
    engine  1 EVALSHA   4,065/s  p50 15.5 ms   p99 24.6 ms    CPU 207 + Redis 46
    HTTP    memory      4,323/s  p50 14.3 ms   p99 36.8 ms    service 193, wrk 54
    HTTP    batched     4,884/s  p50 12.1 ms   p99 40.8 ms    service 182, Redis 20, wrk 43
    HTTP    1 EVALSHA   2,566/s  p50 23.4 ms   p99 79.9 ms    service 362, Redis 34, wrk 54
    gRPC    memory      1,639/s  p50 35.4 ms   p99 83.2 ms    service 593, client 412
    gRPC    batched     1,219/s  p50 48.0 ms   p99 91.5 ms    service 745, Redis 69, client 415
    gRPC    1 EVALSHA   1,067/s  p50 53.4 ms   p99 110 ms     service 810, Redis 77, client 447

Redis commands per decision: 1.00 on every Redis row; round trips per decision: 0.057 (HTTP
batched), 0.899 (gRPC batched: calls arrive one per loop wake-up), 1.0 unbatched. Batched /
unbatched: engine 6.9x, HTTP 1.9x, gRPC 1.1x (over eight runs: engine 4.2x to 7.0x, HTTP 1.5x
to 2.2x with wrk and 2.0x to 3.2x with the Python client, gRPC 0.8x to 1.2x). The service is
one event loop: HTTP handling costs it about 170 µs per request and gRPC about 600 µs, against
about 20 µs (batched) or 200 µs (one EVALSHA) for the store path, which caps the HTTP ratio
near 2x and its throughput near 5,000/s here; docs/service.md ("Fast under load") has the
breakdown and why the 5x and p99 < 5 ms targets are met in-process only.
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
from dataclasses import dataclass, field
from pathlib import Path

POLICY = "policies:\n  bench:\n    rate: 1000000000/hour\n    algorithm: {algorithm}\n"
ENVOY = (
    "domains:\n  - domain: bench\n    descriptors:\n      - key: user\n"
    "        rate_limit: {unit: hour, requests_per_unit: 1000000000}\n"
)


TIMEOUT = "  socket_timeout: 2.0\n"  # a loaded machine must not turn the run into fail-open answers


WRK_SCRIPT = """
local n, done, limit = 0, 0, tonumber(os.getenv("RK_BENCH_REQUESTS"))
request = function()
  n = n + 1
  local body = '{"policy":"bench","key":"user' .. (n % 10000) .. '"}'
  return wrk.format("POST", "/v1/hit", {["content-type"] = "application/json"}, body)
end
response = function(status, headers, body)
  done = done + 1
  if done >= limit then wrk.thread:stop() end
end
"""
"""wrk's request script: the same body as the Python client's, and a bound on the count."""


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Row:
    """One measured scenario."""

    n: int
    elapsed: float
    p50_ms: float
    p99_ms: float
    cpu: dict[str, float] = field(default_factory=dict)
    """CPU seconds per process over the run: service, redis-server, client (engine rows:
    ``process``, the engine and its callers in this process)."""
    errors: int = 0


class CpuMeter:
    """CPU seconds used by named processes between ``start`` and ``stop``."""

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.before = {name: cpu_seconds(pid) for name, pid in pids.items()}

    def stop(self) -> dict[str, float]:
        return {name: cpu_seconds(pid) - self.before[name] for name, pid in self.pids.items()}


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
) -> Row:
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
    cpu0 = time.process_time()
    await asyncio.gather(*(loop(i) for i in range(clients)))
    elapsed = time.perf_counter() - start
    client_cpu = time.process_time() - cpu0
    return Row(len(latencies), elapsed, pct(latencies, 0.5), pct(latencies, 0.99),
               {"client": client_cpu})  # fmt: skip


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


async def grpc_drive(port: int, clients: int, requests: int, seconds: float) -> Row:
    """``ShouldRateLimit`` from ``clients`` concurrent calls over one channel (closed after)."""
    import grpc
    from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2 as common_pb
    from envoy.service.ratelimit.v3 import rls_pb2 as pb
    from envoy.service.ratelimit.v3 import rls_pb2_grpc as pb_grpc

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.RateLimitServiceStub(channel)  # type: ignore[no-untyped-call]

        async def make(_: int) -> Callable[[int], Awaitable[None]]:
            async def call(n: int) -> None:
                entry = common_pb.RateLimitDescriptor.Entry(key="user", value=str(n % 10_000))
                req = pb.RateLimitRequest(
                    domain="bench", descriptors=[common_pb.RateLimitDescriptor(entries=[entry])]
                )
                response = await stub.ShouldRateLimit(req)
                assert response.overall_code == pb.RateLimitResponse.OK

            return call

        return await drive(make, clients, requests, seconds)


async def engine_run(
    store_url: str | None, batch: bool, clients: int, requests: int, seconds: float
) -> Row:
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


def wrk_run(port: int, clients: int, requests: int, seconds: float) -> Row:
    """``POST /v1/hit`` from ``wrk`` (one thread, ``clients`` keep-alive connections)."""
    exe = shutil.which("wrk")
    assert exe is not None
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write(WRK_SCRIPT)
    env = {**os.environ, "RK_BENCH_REQUESTS": str(requests)}
    cmd = [exe, "-t1", f"-c{clients}", f"-d{max(1, round(seconds))}s", "--latency", "-s", f.name,
           f"http://127.0.0.1:{port}/"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=env)
    # wrk's CPU is read from /proc while it runs: sample until it exits
    last = 0.0
    while proc.poll() is None:
        try:
            last = cpu_seconds(proc.pid)
        except (FileNotFoundError, ProcessLookupError, IndexError):
            break
        time.sleep(0.05)
    out = proc.communicate()[0]
    os.unlink(f.name)
    n = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    elapsed = _duration_s(re.search(r"requests in ([\d.]+\w+),", out).group(1))  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = int(bad.group(1)) if bad else 0
    errors += sum(int(x) for x in re.findall(r"(?:connect|read|write|timeout) (\d+)", out))
    p50 = _duration_s(re.search(r"^\s+50%\s+(\S+)", out, re.M).group(1)) * 1000  # type: ignore[union-attr]
    p99 = _duration_s(re.search(r"^\s+99%\s+(\S+)", out, re.M).group(1)) * 1000  # type: ignore[union-attr]
    return Row(n, elapsed, p50, p99, {"client": last}, errors)


def _duration_s(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    assert m is not None, text
    return float(m.group(1)) * {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}[m.group(2)]


def report(name: str, row: Row, extra: str = "") -> float:
    rate = row.n / row.elapsed
    cpu = "  ".join(
        f"{who} {row.cpu[who] / row.elapsed:.2f} cores {row.cpu[who] / row.n * 1e6:.0f} us/dec"
        for who in ("service", "process", "redis", "client")
        if who in row.cpu
    )
    print(
        f"{name:<34} {rate:>8,.0f}/s  p50 {row.p50_ms:6.2f} ms  p99 {row.p99_ms:6.2f} ms"
        f"  n={row.n}{extra}\n{'':<36}CPU: {cpu}",
        flush=True,
    )
    if row.errors:
        print(f"{'':<36}{row.errors} errors (non-200 or socket errors)", flush=True)
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--requests", type=int, default=20_000, help="per scenario, at most")
    parser.add_argument("--seconds", type=float, default=10.0, help="per scenario, at most")
    parser.add_argument("--algorithm", default="fixed_window")
    parser.add_argument("--skip-redis", action="store_true")
    parser.add_argument("--skip-grpc", action="store_true")
    parser.add_argument(
        "--client", choices=("auto", "wrk", "python"), default="auto",
        help="HTTP load client: wrk when installed (auto), else this script's asyncio client",
    )  # fmt: skip
    args = parser.parse_args()
    c, r, s = args.clients, args.requests, args.seconds
    use_wrk = args.client == "wrk" or (args.client == "auto" and shutil.which("wrk") is not None)
    if use_wrk and shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (Debian: apt-get install wrk)")
    client = "wrk (1 thread)" if use_wrk else "python asyncio"
    print(f"# {c} clients, <= {r} requests or {s} s per row, 127.0.0.1, "
          f"{os.cpu_count()} CPUs (shared: noisy); HTTP client: {client}; "
          "gRPC client: python grpc.aio")  # fmt: skip
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
        # engine rows first, while this process runs nothing else (no gRPC client threads)
        engines: list[tuple[str, str | None, bool]] = [("memory", None, False)]
        if redis_server is not None:
            engines += [
                ("redis batched", redis_server.url, True),
                ("redis 1 EVALSHA/decision", redis_server.url, False),
            ]
        import ratekeeper.service.server  # noqa: F401  # imported now: not counted in a row's CPU

        for label, url, batch in engines:
            meter = CpuMeter({"redis": redis_server.proc.pid} if url and redis_server else {})
            cpu0 = time.process_time()
            row = _run_loop(engine_run(url, batch, c, r, s))
            row.cpu = {"process": time.process_time() - cpu0, **meter.stop()}
            rates[f"engine {label}"] = report(f"engine {label}", row)
        for label, store, rserver in stores:
            service = Service(store + POLICY.format(algorithm=args.algorithm) + ENVOY)
            try:
                for api in ("HTTP",) if args.skip_grpc else ("HTTP", "gRPC"):
                    before = rserver.commands() if rserver else 0
                    calls0, degraded0 = service.store_calls()
                    pids = {"service": service.proc.pid}
                    if rserver is not None:
                        pids["redis"] = rserver.proc.pid
                    meter = CpuMeter(pids)
                    if api == "gRPC":
                        row = asyncio.run(grpc_drive(service.grpc_port, c, r, s))
                    elif use_wrk:
                        row = wrk_run(service.port, c, r, s)
                    else:
                        row = asyncio.run(drive(http_worker(service.port), c, r, s))
                    row.cpu.update(meter.stop())
                    calls1, degraded1 = service.store_calls()
                    extra = f"  degraded {degraded1 - degraded0:.0f}"
                    if rserver is not None:
                        cmds = (rserver.commands() - before) / max(1, row.n)
                        trips = (calls1 - calls0) / max(1, row.n)
                        extra += (
                            f"  redis cmds/decision {cmds:.2f}  round trips/decision {trips:.3f}"
                        )
                    rates[f"{api} {label}"] = report(f"{api:<5} {label}", row, extra)
            finally:
                service.stop()
    finally:
        if redis_server is not None:
            redis_server.stop()
    for api in ("HTTP", "gRPC", "engine"):
        a, b = rates.get(f"{api} redis batched"), rates.get(f"{api} redis 1 EVALSHA/decision")
        if a and b:
            print(f"{api}: batching gives {a / b:.2f}x the decisions/s of one EVALSHA per decision")


def _run_loop(coro: Awaitable[Row]) -> Row:
    """Run on uvloop when installed, as the service does."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)  # type: ignore[arg-type]
    return uvloop.run(coro)  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
