"""``ratekeeper serve`` against the ceilings of its own stacks, in one run on 127.0.0.1.

Servers, all started at once and loaded one at a time:

- ``ceiling``: ``benchmarks/empty_service.py``: an empty ``grpc.aio`` ``ShouldRateLimit``
  handler returning a fixed response, and an empty ASGI route returning a fixed JSON
  decision, served with the service's own settings (its HTTP server, gRPC options, uvloop);
- ``ceil inline`` (HTTP only): the same fixed decision answered by the HTTP connection itself,
  as ``ratekeeper serve`` answers its decision routes: the ceiling of that path;
- ``memory``: ``ratekeeper serve`` on the memory store (gRPC on ``grpc.aio``);
- ``memory thr`` (gRPC only): the same with ``--grpc-threads 2`` (handler threads decide);
- ``redis``: ``ratekeeper serve`` on a private ``redis-server``, batched;
- ``redis x2``: ``redis`` with ``--workers 2``.

Load comes from ``h2load`` (Debian: ``apt-get install nghttp2-client``), a C client that
speaks both protocols: ``POST /v1/hit`` over HTTP/1.1 (``--h1``, ``--clients`` keep-alive
connections) and ``ShouldRateLimit`` over HTTP/2 (a framed ``RateLimitRequest``, 4
connections with ``--clients``/4 streams each). One policy, one key, one rate far above
the load: every answer is "allowed".

1. Throughput (closed loop): ``--rounds`` rounds; each runs every server for ``--seconds``
   in turn, so the ratios of one round share the machine's state. Per server: the median
   decisions/s, service CPU µs per decision (all its processes, from ``/proc``), and the
   median of the per-round ratios to the ceiling (and Redis to memory; 2 workers to 1).
   "decisions per core" is decisions per CPU second of the service's processes.
   ``--api gRPC`` (or ``HTTP``) runs one protocol only. ``--base DIR`` runs the
   ``ratekeeper serve`` rows of another checkout too (``base memory``, ...), interleaved in
   the same rounds, and divides each row by its twin: before and after in one run.
2. Latency (open loop) at 25, 50 and 75 % of each row's measured maximum (the ceiling's
   too, for the stack's own latency); p50/p99/p99.9 from h2load's per-request log, the first
   second left out, each the median over ``--rounds`` rounds. h2load's ``--rps`` timer of a
   connection fires every 10 ms at most and sends what is due then, so one connection at
   3,000/s sends bursts of 30, and connections made together fire together: such a run
   measures how long a burst takes to drain, not a steady rate. Here the connections are made
   a few per millisecond (``--rate``, ``--rate-period 1ms``), so their ticks spread over the
   10 ms, and each sends a small share: over gRPC 8 connections (as 8 Envoys), each tick's
   requests sent at once as streams; over HTTP/1.1 the closed loop's ``--clients``
   connections, each tick's requests pipelined. The load arrives about evenly, in groups of
   a few requests per millisecond. ``--one-in-flight`` makes HTTP/1.1 clients that never
   pipeline instead: one request per connection and tick (100/s each), so a higher rate
   takes more connections (230 at 23,000/s), and each request is a socket event of its own.

    python benchmarks/bench_service.py --rounds 3 --seconds 5

The machine's load average (``uptime``) is printed before and after: on a shared machine,
compare the ratios of one run, not the absolute figures of two.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
CONFIG = """
policies:
  bench:
    rate: 1000000000/hour
domains:
  - domain: bench
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: 1000000000}
"""
GRPC_PATH = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
TIMEOUT = "  socket_timeout: 2.0\n"  # a loaded machine must not turn the run into fail-open answers


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (from /proc); 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    """A server process (``ratekeeper serve`` or the empty one) and its worker processes."""

    def __init__(
        self,
        name: str,
        args: list[str],
        workdir: Path,
        apis: tuple[str, ...] = ("gRPC", "HTTP"),
        source: Path | None = None,
    ) -> None:
        """``source``: run the ratekeeper of another checkout (its ``src`` first on the path)."""
        self.name = name
        self.apis = apis
        self.args = args
        env = None if source is None else {**os.environ, "PYTHONPATH": str(source / "src")}
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True, cwd=workdir, env=env)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        m = re.search(r"http://[^:]+:(\d+)(?: and gRPC (?:\([^)]*\) on [^ ]+:)?(\d+))", line)
        if m is None:
            self.stop()
            raise SystemExit(f"{name} did not start: {line!r}")
        self.port, self.grpc_port = int(m.group(1)), int(m.group(2))
        self.pids = [self.proc.pid]
        if "[workers:" in line:
            for _ in range(2):
                line = self.proc.stdout.readline()
            self.pids += [int(p) for p in re.findall(r"\d+", line.split("workers", 1)[1])]

    def cpu(self) -> float:
        return sum(cpu_seconds(pid) for pid in self.pids)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class Redis:
    """A private redis-server on a free port, persistence off."""

    def __init__(self, workdir: Path) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise SystemExit("redis-server is not installed")
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--save", "", "--appendonly", "no",
             "--dir", str(workdir)],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        import redis

        client = redis.Redis(port=self.port)
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(10)


@dataclass
class Load:
    """One h2load run's outcome."""

    rate: float
    done: int
    cpu: float
    latencies_us: list[int] = field(default_factory=list)


def h2load(
    server: Server,
    api: str,
    data: Path,
    seconds: float,
    clients: int,
    rps: float | None = None,
    one_in_flight: bool = False,
) -> Load:
    """Run h2load against ``server`` (closed loop, or ``rps`` decisions/s in all: open loop;
    ``one_in_flight``: over HTTP/1.1, as many connections as that takes at 100/s each)."""
    exe = shutil.which("h2load")
    assert exe is not None
    if api == "HTTP":
        url = f"http://127.0.0.1:{server.port}/v1/hit"
        conns, streams = clients, 1
        args = ["--h1", "-H", "content-type:application/json"]
    else:
        url = f"http://127.0.0.1:{server.grpc_port}{GRPC_PATH}"
        conns, streams = 4, max(1, clients // 4)
        args = ["-H", "content-type:application/grpc", "-H", "te:trailers"]
    log = None
    if rps:  # connections spread over a tick (see the module docstring)
        if api == "HTTP" and one_in_flight:  # at most one request per connection and tick
            conns = max(1, math.ceil(rps / OPEN_LOOP_PER_CONNECTION))
            streams = 2  # room for a late answer without holding the next request back
        else:  # each tick's requests sent at once: HTTP/2 streams, HTTP/1.1 pipelined
            conns = OPEN_LOOP_GRPC if api == "gRPC" else clients
            streams = 2 + math.ceil(rps / conns / OPEN_LOOP_PER_CONNECTION)
        count = round(rps * (seconds + 1))  # the first second is left out
        args += ["-n", str(count), "-r", str(math.ceil(conns / 10)), "--rate-period", "1ms"]
        args += [f"--rps={rps / conns:.3f}"]
        log = data.with_suffix(".log")
        args += ["--log-file", str(log)]
    else:
        args += ["-D", str(max(1, round(seconds)))]
    args += ["-d", str(data), "-c", str(conns), "-m", str(streams), "-t", "1"]
    cpu0 = server.cpu()
    out = subprocess.run([exe, *args, url], capture_output=True, text=True, timeout=120).stdout
    cpu = server.cpu() - cpu0
    m = re.search(r"requests: \d+ total, \d+ started, \d+ done, (\d+) succeeded", out)
    codes = re.search(r"status codes: \d+ 2xx, \d+ 3xx, (\d+) 4xx, (\d+) 5xx", out)
    rate = re.search(r"finished in [\d.]+s, ([\d.]+) req/s", out)
    if m is None or codes is None or rate is None:
        raise SystemExit(f"h2load failed against {server.name} ({api}):\n{out}")
    done = int(m.group(1))
    if int(codes.group(1)) or int(codes.group(2)):
        raise SystemExit(f"{server.name} ({api}): non-2xx answers:\n{out}")
    load = Load(float(rate.group(1)), done, cpu)
    if log is not None:  # start (us since the epoch), status, duration (us)
        rows = [line.split("\t") for line in log.read_text().split("\n") if line]
        start = min(int(row[0]) for row in rows) + 1_000_000 if rows else 0
        load.latencies_us = sorted(int(row[2]) for row in rows if int(row[0]) >= start)
        log.unlink()
    return load


def pct(values: list[int], p: float) -> float:
    """The ``p`` quantile of sorted microseconds, in milliseconds."""
    return values[min(len(values) - 1, int(len(values) * p))] / 1000 if values else float("nan")


def check_answers(server: Server) -> None:
    """One real call per protocol: the answers are decisions, allowed (h2load sees only 200s)."""
    import grpc
    import httpx
    from envoy.service.ratelimit.v3 import rls_pb2 as pb
    from envoy.service.ratelimit.v3 import rls_pb2_grpc as pb_grpc

    body = httpx.post(f"http://127.0.0.1:{server.port}/v1/hit", json=HIT, timeout=10).json()
    assert body["allowed"] is True, body
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        stub = pb_grpc.RateLimitServiceStub(channel)
        answer = stub.ShouldRateLimit(pb.RateLimitRequest.FromString(grpc_request()), timeout=10)
        assert answer.overall_code == pb.RateLimitResponse.OK, answer


HIT = {"policy": "bench", "key": "user:42"}
OPEN_LOOP_PER_CONNECTION = 100
"""Most decisions/s of one connection in an open-loop run: h2load's rate timer fires every
10 ms at most, so at 100/s a connection sends one request per tick (the module docstring)."""
OPEN_LOOP_GRPC = 8
"""Connections of an open-loop gRPC run (each Envoy keeps one to the service): made one per
millisecond, their ticks fall on 8 of the 10 ms, each sending its share at once as streams."""
BASES = {
    "memory": ("ceiling", "ceil inline"),
    "memory thr": ("ceiling", "memory"),
    "redis": ("ceiling", "memory"),
    "redis x2": ("ceiling", "redis"),
}
"""What each row is divided by (per round, then the median; a base not run on an API is
left out)."""


def grpc_request() -> bytes:
    from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2 as common_pb
    from envoy.service.ratelimit.v3 import rls_pb2 as pb

    entry = common_pb.RateLimitDescriptor.Entry(key="user", value="42")
    request = pb.RateLimitRequest(
        domain="bench", descriptors=[common_pb.RateLimitDescriptor(entries=[entry])]
    )
    return request.SerializeToString()  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="per h2load run")
    parser.add_argument("--clients", type=int, default=32, help="closed-loop concurrency")
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument(
        "--one-in-flight",
        action="store_true",
        help="open-loop HTTP/1.1 with one request in flight per connection, 100/s each (many "
        "connections) instead of --clients connections, each tick's requests pipelined",
    )
    parser.add_argument("--api", choices=("gRPC", "HTTP"), help="one protocol only")
    parser.add_argument(
        "--base",
        type=Path,
        metavar="DIR",
        help="a checkout of another version: its serve rows run too, each row divided by its twin",
    )
    args = parser.parse_args()
    if shutil.which("h2load") is None:
        raise SystemExit("h2load is not installed (Debian: apt-get install nghttp2-client)")
    work = Path(tempfile.mkdtemp(prefix="rk-bench-"))
    data = {"HTTP": work / "hit.json", "gRPC": work / "grpc.bin"}
    data["HTTP"].write_text('{"policy":"bench","key":"user:42"}')
    raw = grpc_request()
    data["gRPC"].write_bytes(b"\0" + struct.pack(">I", len(raw)) + raw)
    print(f"# uptime before: {os.popen('uptime').read().strip()}", flush=True)
    print(f"# {os.cpu_count()} CPUs; h2load, {args.clients} concurrent requests closed-loop, "
          f"{args.rounds} rounds x {args.seconds:.0f} s per server", flush=True)  # fmt: skip
    redis = Redis(work)
    serve = [sys.executable, "-m", "ratekeeper.cli", "serve", "--port", "0", "--grpc-port", "0"]
    configs = {
        "memory": "store: memory\n",
        "redis": f"store:\n  url: {redis.url}\n  batch: true\n{TIMEOUT}",
    }
    for name, store in configs.items():
        (work / f"{name}.yaml").write_text(store + CONFIG)
    servers: list[Server] = []
    try:
        empty = [sys.executable, str(HERE / "empty_service.py")]
        threads = ["--grpc-threads", "2"]
        servers.append(Server("ceiling", empty, work))
        servers.append(Server("ceil inline", [*empty, "--inline"], work, ("HTTP",)))
        servers.append(Server("memory", [*serve, "--config", "memory.yaml"], work))
        servers.append(
            Server("memory thr", [*serve, "--config", "memory.yaml", *threads], work, ("gRPC",))
        )
        servers.append(Server("redis", [*serve, "--config", "redis.yaml"], work))
        servers.append(
            Server("redis x2", [*serve, "--config", "redis.yaml", "--workers", "2"], work)
        )
        if args.base is not None:  # each row's twin right after it, in every round
            rows = [server.name for server in servers]
            for server in list(servers):
                command = list(server.args)
                if server.name.startswith("ceil"):  # the other checkout's empty server
                    command[1] = str(args.base / "benchmarks" / "empty_service.py")
                twin = f"base {server.name}"
                servers.append(Server(twin, command, work, server.apis, args.base))
                BASES[server.name] = (*BASES.get(server.name, ()), twin)
            servers.sort(key=lambda s: (rows.index(s.name.removeprefix("base ")), s.name))
        for server in servers:
            if not server.name.startswith("ceil"):
                check_answers(server)
        maxima = throughput(servers, data, args)
        if not args.skip_latency:
            latency(servers, data, args, maxima)
    finally:
        for server in servers:
            server.stop()
        redis.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"# uptime after: {os.popen('uptime').read().strip()}", flush=True)


def throughput(
    servers: list[Server], data: dict[str, Path], args: argparse.Namespace
) -> dict[tuple[str, str], float]:
    """Closed-loop rounds, interleaved; prints the table and returns the median maxima."""
    maxima: dict[tuple[str, str], float] = {}
    for api in (args.api,) if args.api else ("gRPC", "HTTP"):
        loaded = [s for s in servers if api in s.apis]
        runs: dict[str, list[Load]] = {s.name: [] for s in loaded}
        for _ in range(args.rounds):
            for server in loaded:
                runs[server.name].append(h2load(server, api, data[api], args.seconds, args.clients))
        print(f"\n{api}: decisions/s (median of {args.rounds}) | ratio (median of per-round "
              "ratios) | service CPU us/decision | decisions per core", flush=True)  # fmt: skip
        for server in loaded:
            loads = runs[server.name]
            rate = statistics.median(x.rate for x in loads)
            maxima[(api, server.name)] = rate
            cpu = sum(x.cpu for x in loads)
            done = sum(x.done for x in loads)
            ratios = []
            for base in [b for b in BASES.get(server.name, ()) if b in runs]:
                per = [a.rate / b.rate for a, b in zip(loads, runs[base], strict=True)]
                ratios.append(f"{statistics.median(per):.2f} of {base}")
            print(
                f"  {server.name:<10} {rate:>8,.0f}/s  {', '.join(ratios) or '':<58}"
                f"  CPU {cpu / done * 1e6:6.1f} us  {done / cpu if cpu else 0:8,.0f}/core",
                flush=True,
            )
    return maxima


def latency(
    servers: list[Server],
    data: dict[str, Path],
    args: argparse.Namespace,
    maxima: dict[tuple[str, str], float],
) -> None:
    """Open-loop runs at fixed fractions of each row's measured maximum, ``--rounds`` rounds
    interleaved as the throughput's; each quantile is the median of the rounds' quantiles."""
    print(f"\nLatency at a fixed rate (open loop): ms p50 / p99 / p99.9, median of "
          f"{args.rounds}", flush=True)  # fmt: skip
    shares = (0.25, 0.5, 0.75)
    for api in (args.api,) if args.api else ("gRPC", "HTTP"):
        rows = [s for s in servers if (api, s.name) in maxima and s.name != "redis x2"]
        quantiles: dict[tuple[str, float], list[tuple[float, float, float]]] = {}
        for _ in range(args.rounds):
            for server in rows:
                for share in shares:
                    rps = maxima[(api, server.name)] * share
                    lat = h2load(
                        server, api, data[api], args.seconds, args.clients, rps,
                        args.one_in_flight,
                    )  # fmt: skip
                    got = (pct(lat.latencies_us, 0.5), pct(lat.latencies_us, 0.99),
                           pct(lat.latencies_us, 0.999))  # fmt: skip
                    quantiles.setdefault((server.name, share), []).append(got)
        for server in rows:
            cells = []
            for share in shares:
                runs = quantiles[(server.name, share)]
                p50, p99, p999 = (statistics.median(q[i] for q in runs) for i in range(3))
                rps = maxima[(api, server.name)] * share
                cells.append(f"{share:.0%} ({rps:,.0f}/s): {p50:.2f} / {p99:.2f} / {p999:.2f}")
            print(f"  {api:<4} {server.name:<11} " + "   ".join(cells), flush=True)


if __name__ == "__main__":
    main()
