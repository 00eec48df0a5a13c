"""Coalesced async calls: AsyncLimiter and the ASGI middleware on Redis, batched against one
``EVALSHA`` per decision, beside the ceiling of each stack, all in one run.

Run: ``.venv/bin/python -m benchmarks.bench_async [--quick] [--only a,b]`` (needs
``redis-server``; part (b) needs ``wrk`` and the ``server`` extra). Every process it uses is
started here on 127.0.0.1 and stopped by PID. Bounded: about two minutes.

- (a) library: 64 asyncio tasks, each making hits one after another on its own keys
  (fixed_window, never rejecting), on one Redis: ``AsyncLimiter`` over ``RedisStore`` as built
  (batching on) and with ``batching=None``, and two ceilings without the limiter: 64 concurrent
  raw ``EVALSHA`` calls through redis-py's asyncio client (the unbatched ceiling), and one
  connection writing 64 pre-encoded ``EVALSHA`` at a time and parsing the replies with hiredis
  (the most a Python process gets from one Redis at 64 in flight). Rounds interleave the
  variants so load on the machine hits them alike; the table gives the median round's
  decisions/s, p50/p99 latency of a decision and CPU per decision (this process, Redis).
- (b) end to end: a uvicorn process serving an empty ASGI handler, bare and behind
  ``RateLimitMiddleware`` (one ``RateCheck`` keyed on an ``X-API-Key`` header) on Redis, batched
  and with ``batching=None``; ``wrk`` (one thread, 64 connections, 10,000 distinct keys)
  drives each in interleaved rounds. The table gives requests/s, wrk's p50/p99, and CPU per
  request of the server process and of Redis.

Figures on a shared 2-vCPU machine are noisy: compare the ratios within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import contextmanager
from typing import Any

import hiredis
import redis
import redis.asyncio

from benchmarks.bench_service import cpu_seconds
from ratekeeper import AsyncLimiter, RedisStore
from ratekeeper.stores.redis.codec import script
from tests.redis_servers import RedisServer

TASKS = 64
RATE = "1000000000/hour"


def wrk_seconds(text: str) -> float:
    """A wrk duration ("850.12us", "1.20ms", "5.00s", "1.00m") in seconds."""
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    assert m is not None, text
    return float(m.group(1)) * {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}[m.group(2)]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


@contextmanager
def redis_server() -> Any:
    server = RedisServer()
    try:
        yield server
    finally:
        server.stop()


# ---------------------------------------------------------------- (a) the library


async def tasks(n: int, call: Callable[[int, int], Awaitable[Any]]) -> list[float]:
    """``TASKS`` tasks making ``n`` calls each, one after another; every call's latency."""
    latencies: list[float] = []

    async def task(t: int) -> None:
        for i in range(n):
            start = time.perf_counter()
            await call(t, i)
            latencies.append(time.perf_counter() - start)

    await asyncio.gather(*(task(t) for t in range(TASKS)))
    return latencies


class Library:
    """The variants of part (a) on one Redis."""

    def __init__(self, server: RedisServer) -> None:
        self.server = server
        self.batched = AsyncLimiter(RedisStore(server.url, socket_timeout=2))
        self.single = AsyncLimiter(RedisStore(server.url, socket_timeout=2, batching=None))
        self.client = redis.asyncio.Redis.from_url(server.url, max_connections=TASKS)
        store = RedisStore(server.url)
        plan = self.batched._core.plan("hit", "raw", RATE, "fixed_window", 1, None, None)
        self.sha = script("fixed_window").sha
        self.command = store.codec.command(plan)
        self.packed = store.codec.packed(plan)
        self.degraded = 0

    async def limiter(self, limiter: AsyncLimiter, t: int, i: int) -> None:
        decision = await limiter.hit(f"k{t}:{i % 100}", RATE)
        self.degraded += decision.degraded

    async def raw_one_each(self, t: int, i: int) -> None:
        await self.client.execute_command(*self.command)  # type: ignore[no-untyped-call]  # untyped in redis-py

    async def raw_pipelined(self, n: int) -> list[float]:
        """One connection: ``TASKS`` commands written at once, their replies read, ``n`` times;
        every decision's latency is its round's."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.server.port)
        parser = hiredis.Reader()
        data = self.packed * TASKS
        latencies: list[float] = []
        for _ in range(n):
            start = time.perf_counter()
            writer.write(data)
            got = 0
            while got < TASKS:
                parser.feed(await reader.read(1 << 16))
                while parser.gets() is not False:
                    got += 1
            latencies += [time.perf_counter() - start] * TASKS
        writer.close()
        await writer.wait_closed()
        return latencies


async def part_a(n: int, rounds: int) -> None:
    with redis_server() as server:
        lib = Library(server)
        await lib.client.script_load(script("fixed_window").source)
        variants: dict[str, Callable[[], Awaitable[list[float]]]] = {
            "AsyncLimiter, batched (default)": lambda: tasks(
                n, lambda t, i: lib.limiter(lib.batched, t, i)
            ),
            "AsyncLimiter, one EVALSHA each (batching=None)": lambda: tasks(
                n, lambda t, i: lib.limiter(lib.single, t, i)
            ),
            "ceiling: raw EVALSHA, 64 concurrent (redis-py)": lambda: tasks(n, lib.raw_one_each),
            "ceiling: raw pipeline, 64 per write (hiredis)": lambda: lib.raw_pipelined(n),
        }
        for run in variants.values():  # warm up: connections, scripts, caches
            await run()
        results: dict[str, list[tuple[float, float, float, float, float]]] = {
            v: [] for v in variants
        }
        for _ in range(rounds):
            for name, run in variants.items():
                cpu0, redis0 = time.process_time(), cpu_seconds(server.pid)
                start = time.perf_counter()
                latencies = await run()
                elapsed = time.perf_counter() - start
                decisions = len(latencies)
                results[name].append(
                    (
                        decisions / elapsed,
                        percentile(latencies, 0.5) * 1000,
                        percentile(latencies, 0.99) * 1000,
                        (time.process_time() - cpu0) / decisions * 1e6,
                        (cpu_seconds(server.pid) - redis0) / decisions * 1e6,
                    )
                )
        await lib.client.aclose()
    rows = []
    for name, samples in results.items():
        median = sorted(samples)[len(samples) // 2]  # the median round by decisions/s
        rows.append((name, *median))
    base = rows[1][1]
    print(
        f"\n(a) {TASKS} asyncio tasks on one Redis, {n} decisions each per round, {rounds} "
        "interleaved rounds (median round)"
    )
    print(f"{'variant':48} {'decisions/s':>11} {'vs 1 EVALSHA':>12} {'p50 ms':>7} {'p99 ms':>7}"
          f" {'client us':>9} {'Redis us':>8}")  # fmt: skip
    for name, rate, p50, p99, cpu, rcpu in rows:
        print(f"{name:48} {rate:11,.0f} {rate / base:11.2f}x {p50:7.2f} {p99:7.2f}"
              f" {cpu:9.1f} {rcpu:8.1f}")  # fmt: skip
    ratio, ceiling = rows[0][1] / base, rows[0][1] / rows[3][1]
    print(
        f"batched / one EVALSHA each: {ratio:.2f}x; batched / raw pipeline ceiling: "
        f"{ceiling:.2f}; degraded decisions: {lib.degraded}"
    )


# ---------------------------------------------------------------- (b) the ASGI middleware


async def empty(scope: Any, receive: Any, send: Any) -> None:
    """The ASGI handler every variant serves: 200, two bytes."""
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def serve(variant: str, redis_url: str, port: int) -> None:
    """Run one variant of part (b) in this process (the parent starts it with ``--serve``)."""
    import uvicorn

    from ratekeeper.middleware import RateCheck, RateLimitMiddleware, keys

    app: Any = empty
    if variant != "bare":
        options: dict[str, Any] = {} if variant == "batched" else {"batching": None}
        store = RedisStore(redis_url, socket_timeout=2, **options)
        check = RateCheck("api", RATE, key=keys.header("x-api-key"))
        app = RateLimitMiddleware(empty, [check], store=store)
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    uvicorn.run(app, host="127.0.0.1", port=port, loop=loop, http="httptools",
                log_level="warning", access_log=False, lifespan="off")  # fmt: skip


WRK_SCRIPT = """
local n = 0
request = function()
  n = n + 1
  return wrk.format("GET", "/", {["x-api-key"] = "user" .. (n % 10000)})
end
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """One variant's uvicorn process."""

    def __init__(self, variant: str, redis_url: str) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.bench_async", "--serve", variant,
             "--redis", redis_url, "--port", str(self.port)],
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"the {variant} server did not start") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def wrk(port: int, seconds: int, script_path: str) -> tuple[int, float, float, float, int]:
    """(requests, seconds, p50 ms, p99 ms, errors) of one wrk run on ``port``."""
    out = subprocess.run(
        ["wrk", "-t1", f"-c{TASKS}", f"-d{seconds}s", "--latency", "-s", script_path,
         f"http://127.0.0.1:{port}/"],
        capture_output=True, text=True, check=True, timeout=seconds + 60,
    ).stdout  # fmt: skip
    n = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    elapsed = wrk_seconds(re.search(r"requests in ([\d.]+\w+),", out).group(1))  # type: ignore[union-attr]
    p50 = wrk_seconds(re.search(r"^\s+50%\s+(\S+)", out, re.M).group(1)) * 1000  # type: ignore[union-attr]
    p99 = wrk_seconds(re.search(r"^\s+99%\s+(\S+)", out, re.M).group(1)) * 1000  # type: ignore[union-attr]
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = (int(bad.group(1)) if bad else 0) + sum(
        int(x) for x in re.findall(r"(?:connect|read|write|timeout) (\d+)", out)
    )
    return n, elapsed, p50, p99, errors


def part_b(seconds: int, rounds: int) -> None:
    if shutil.which("wrk") is None:
        print("\n(b) skipped: wrk is not installed (Debian: apt-get install wrk)")
        return
    with redis_server() as server, tempfile.NamedTemporaryFile("w", suffix=".lua") as lua:
        lua.write(WRK_SCRIPT)
        lua.flush()
        names = {
            "bare": "ceiling: empty handler, no middleware",
            "batched": "RateLimitMiddleware on Redis, batched",
            "single": "RateLimitMiddleware on Redis, one EVALSHA each",
        }
        servers = {v: Server(v, server.url) for v in names}
        try:
            for srv in servers.values():  # warm up: connections, scripts
                wrk(srv.port, 1, lua.name)
            samples: dict[str, list[tuple[float, float, float, float, float, int]]] = {
                v: [] for v in names
            }
            for _ in range(rounds):
                for variant, srv in servers.items():
                    cpu0, redis0 = cpu_seconds(srv.proc.pid), cpu_seconds(server.pid)
                    n, elapsed, p50, p99, errors = wrk(srv.port, seconds, lua.name)
                    cpu = (cpu_seconds(srv.proc.pid) - cpu0) / n * 1e6
                    rcpu = (cpu_seconds(server.pid) - redis0) / n * 1e6
                    samples[variant].append((n / elapsed, p50, p99, cpu, rcpu, errors))
        finally:
            for srv in servers.values():
                srv.stop()
        evalsha = server.client().info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0)
    print(
        f"\n(b) uvicorn + empty ASGI handler, wrk -t1 -c{TASKS}, {rounds} interleaved rounds of "
        f"{seconds} s (median round)"
    )
    print(f"{'variant':48} {'requests/s':>10} {'p50 ms':>7} {'p99 ms':>7} {'server us':>9}"
          f" {'Redis us':>8} {'errors':>6}")  # fmt: skip
    medians = {}
    for variant, rows in samples.items():
        rate, p50, p99, cpu, rcpu, errors = sorted(rows)[len(rows) // 2]
        medians[variant] = rate
        print(f"{names[variant]:48} {rate:10,.0f} {p50:7.2f} {p99:7.2f} {cpu:9.1f}"
              f" {rcpu:8.1f} {errors:6}")  # fmt: skip
    print(
        f"batched / one EVALSHA each: {medians['batched'] / medians['single']:.2f}x; batched / "
        f"empty handler: {medians['batched'] / medians['bare']:.2f} ({evalsha:,} EVALSHA in all)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter rounds")
    parser.add_argument("--only", default="a,b", help="comma-separated parts to run")
    parser.add_argument("--serve", help=argparse.SUPPRESS)
    parser.add_argument("--redis", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.redis, args.port)
        return
    version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True)
    print(
        f"redis-server {version.stdout.split()[2]}, {os.cpu_count()} CPUs, load "
        f"{os.getloadavg()[0]:.1f} (shared machine: compare ratios within this run)"
    )
    parts = set(args.only.split(","))
    if "a" in parts:
        asyncio.run(part_a(100 if args.quick else 300, 3 if args.quick else 7))
    if "b" in parts:
        part_b(3 if args.quick else 8, 2 if args.quick else 3)


if __name__ == "__main__":
    main()
