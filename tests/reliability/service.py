"""The service as a real process under steady load (soak) and floods of distinct keys.

``ratekeeper serve`` is started as a subprocess on loopback (no gRPC); client processes send
``POST /v1/hit`` over keep-alive connections at a steady pace and record per-request latency
and status. The controller samples the service's RSS, threads and open file descriptors from
/proc, and Redis' ``used_memory``, ``connected_clients`` and key count, once per interval.
"""

from __future__ import annotations

import http.client
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ratekeeper import Limiter, ManualClock, MemoryStore
from tests import redis_servers as rs
from tests.reliability.faults import QUICK_TIMEOUT, TIMEOUT
from tests.reliability.load import percentile
from tests.reliability.report import Row


class Service:
    """``ratekeeper serve --config <yaml>`` on a free loopback port, stopped by PID."""

    def __init__(self, config: str) -> None:
        self.dir = tempfile.mkdtemp(prefix="rk-serve-")
        path = Path(self.dir) / "ratekeeper.yaml"
        path.write_text(config)
        self.port = rs.free_port()
        args = [sys.executable, "-m", "ratekeeper.cli", "serve", "--config", str(path),
                "--port", str(self.port), "--no-grpc"]  # fmt: skip
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ratekeeper serve exited: {self.proc.stderr.read()!r}")  # type: ignore[union-attr]
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=1)
                conn.request("GET", "/healthz")
                conn.getresponse().read()
                conn.close()
                return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("ratekeeper serve did not answer /healthz within 30 s")

    def proc_status(self) -> dict[str, int]:
        """RSS (kB), threads and open file descriptors of the service process."""
        status = Path(f"/proc/{self.proc.pid}/status").read_text().splitlines()
        fields = dict(line.split(":", 1) for line in status)
        return {
            "rss_kb": int(fields["VmRSS"].split()[0]),
            "threads": int(fields["Threads"]),
            "fds": len(os.listdir(f"/proc/{self.proc.pid}/fd")),
        }

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _client(port: int, policy: str, keys: int, distinct: bool, rps: float, start: Any,
            duration: float, ident: int, ready: Any, out: Any) -> None:  # fmt: skip
    """One client process: paced POST /v1/hit from ``start`` (set once every client is
    ready) for ``duration`` seconds; returns [(start, latency, status, degraded)]."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    records: list[tuple[float, float, int, bool]] = []
    errors = 0
    gap = 1.0 / rps
    n = 0
    ready.put(ident)
    while not start.value:
        time.sleep(0.005)
    start_at = float(start.value)
    end_at = start_at + duration
    while time.monotonic() < start_at:
        time.sleep(0.005)
    next_at = start_at
    while (now := time.monotonic()) < end_at:
        if now < next_at:
            time.sleep(next_at - now)
            now = time.monotonic()
        next_at = max(next_at + gap, now - 0.1)
        key = f"c{ident}-{n}" if distinct else f"user:{(n * 31 + ident) % keys}"
        n += 1
        body = json.dumps({"policy": policy, "key": key})
        try:
            conn.request("POST", "/v1/hit", body, {"content-type": "application/json"})
            response = conn.getresponse()
            degraded = b'"degraded":true' in response.read()
            records.append((now, time.monotonic() - now, response.status, degraded))
        except (OSError, http.client.HTTPException):
            errors += 1
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.close()
    out.put((records, errors, n))


@dataclass(frozen=True, slots=True)
class Sample:
    at: float
    rss_kb: int
    threads: int
    fds: int
    redis_bytes: int = 0
    redis_clients: int = 0
    redis_keys: int = 0


def _drive(
    service: Service, policy: str, duration: float, interval: float, clients: int, rps: float,
    distinct: bool, redis: rs.RedisServer | None, fault: Callable[[float], None] | None = None,
) -> tuple[list[tuple[float, float, int, bool]], int, int, list[Sample], float]:  # fmt: skip
    ctx = multiprocessing.get_context("spawn")
    out, ready, start = ctx.Queue(), ctx.Queue(), ctx.Value("d", 0.0)
    procs = [
        ctx.Process(
            target=_client,
            args=(service.port, policy, 5000, distinct, rps, start, duration, i, ready, out),
        )
        for i in range(clients)
    ]
    for p in procs:
        p.start()
    for _ in procs:  # the timeline starts once every client has started (seconds when loaded)
        ready.get(timeout=120)
    start_at = time.monotonic() + 0.2
    end_at = start_at + duration
    start.value = start_at
    breaker = None
    if fault is not None:
        breaker = threading.Thread(target=fault, args=(start_at,))
        breaker.start()
    samples = []
    t = start_at
    while t < end_at + 0.01:
        time.sleep(max(0.0, t - time.monotonic()))
        if not service.alive():
            break
        extra: dict[str, int] = {}
        if redis is not None:
            client = redis.client()
            info = client.info()
            extra = {
                "redis_bytes": int(info["used_memory"]),
                "redis_clients": int(info["connected_clients"]) - 1,  # not this one
                "redis_keys": int(client.dbsize()),
            }
            client.close()
        samples.append(Sample(t - start_at, **service.proc_status(), **extra))
        t += interval
    records: list[tuple[float, float, int, bool]] = []
    errors = sent = 0
    for _ in procs:
        r, e, n = out.get(timeout=duration + 120)
        records.extend(r)
        errors += e
        sent += n
    for p in procs:
        p.join(timeout=30)
    if breaker is not None:
        breaker.join()
    records.sort()
    return records, errors, sent, samples, start_at


def _mb(kb: float) -> str:
    return f"{kb / 1024:.1f} MB"


def soak(duration: float, interval: float) -> list[Row]:
    """The service on Redis under steady load: resources flat after warm-up, p99 stable."""
    redis = rs.RedisServer()
    config = (
        f"store:\n  url: {redis.url}\npolicies:\n"
        "  soak:\n    rate: 20/second\n    algorithm: sliding_window\n"
    )
    service = Service(config)
    try:
        records, errors, _sent, samples, start_at = _drive(
            service, "soak", duration, interval, 3, 120.0, False, redis
        )
        alive = service.alive()
    finally:
        service.stop()
        redis.stop()
    warm = samples[max(1, len(samples) // 5)]
    after = [s for s in samples if s.at >= warm.at]
    bad = sum(r[2] not in (200, 429) for r in records)
    p99s = []
    for s in after[:-1]:
        lat = [r[1] for r in records if s.at <= r[0] - start_at < s.at + interval]
        p99s.append(percentile(lat, 0.99))
    rss_growth = max(s.rss_kb for s in after) - warm.rss_kb
    redis_growth = max(s.redis_bytes for s in after) - warm.redis_bytes
    grow_fds = max(s.fds for s in after) - warm.fds
    grow_clients = max(s.redis_clients for s in after) - warm.redis_clients
    grow_threads = max(s.threads for s in after) - warm.threads
    rate = len(records) / duration
    fault = f"soak: ratekeeper serve on Redis, {duration / 60:.1f} min at {rate:.0f} req/s"
    return [
        Row(
            fault,
            "every request answered (200 or 429), service alive",
            f"{len(records)} answered, {bad} other statuses, {errors} connection errors",
            alive and bad == 0 and errors == 0,
        ),
        Row(
            fault,
            f"service RSS and Redis memory flat after warm-up ({warm.at:.0f} s)",
            f"RSS {_mb(warm.rss_kb)} -> max {_mb(warm.rss_kb + rss_growth)}; Redis used_memory "
            f"{_mb(warm.redis_bytes / 1024)} -> max {_mb((warm.redis_bytes + redis_growth) / 1024)}"
            f" ({samples[-1].redis_keys} keys at the end)",
            rss_growth <= 0.1 * warm.rss_kb + 4096
            and redis_growth <= 0.1 * warm.redis_bytes + 2**20,
        ),
        Row(
            fault,
            "open connections, file descriptors and threads bounded: at most 2 more than "
            "after warm-up (a pool may keep a spare connection; a leak adds one per use)",
            f"Redis clients {warm.redis_clients} (+{grow_clients}), service fds {warm.fds} "
            f"(+{grow_fds}), threads {warm.threads} (+{grow_threads})",
            grow_clients <= 2 and grow_fds <= 2 and grow_threads <= 0,
        ),
        Row(
            fault,
            f"p99 stable: per-{interval:.0f} s p99 after warm-up within 3x of the first",
            "p99 ms " + ", ".join(f"{p * 1000:.1f}" for p in p99s) + f" (per {interval:g} s)",
            bool(p99s) and max(p99s) <= 3 * p99s[0] + 0.005,
        ),
    ]


def _rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


def flood_service(duration: float, max_keys: int, rps: float = 400.0) -> list[Row]:
    """Distinct keys at a memory-store service with ``max_keys``: RSS plateaus, no crash."""
    service = Service(f"store:\n  max_keys: {max_keys}\npolicies:\n  flood:\n    rate: 5/minute\n")
    try:
        records, errors, sent, samples, _ = _drive(
            service, "flood", duration, duration / 10, 3, rps, True, None
        )
        alive = service.alive()
    finally:
        service.stop()
    ok = sum(r[2] == 200 for r in records)
    # once max_keys distinct keys have been seen, memory must stop growing
    full_at = max_keys / max(1.0, len(records) / duration)
    plateau = [s for s in samples if s.at >= full_at + duration / 10] or samples[-1:]
    growth = samples[-1].rss_kb - plateau[0].rss_kb
    return [
        Row(
            f"flood: {sent} distinct keys at the service (memory store, max_keys {max_keys})",
            "no crash; every request answered; RSS flat once max_keys is reached",
            f"{ok}/{len(records)} answered 200, {errors} connection errors; RSS "
            f"{_mb(plateau[0].rss_kb)} at {plateau[0].at:.0f} s -> {_mb(samples[-1].rss_kb)} "
            f"at the end",
            alive
            and errors == 0
            and ok == len(records)
            and growth <= 0.1 * plateau[0].rss_kb + 4096,
        )
    ]


def flood_memory(keys: int, max_keys: int, check_speed: bool = False) -> list[Row]:
    """``keys`` distinct keys through a ``Limiter`` on a ``MemoryStore(max_keys)``.

    Reports the time per hit while the store fills and once it evicts on every hit;
    ``check_speed`` (the full run, not the tests) also requires eviction to stay cheap.
    """
    store = MemoryStore(max_keys=max_keys)
    limiter = Limiter(store, clock=ManualClock())
    largest = 0
    base = _rss_kb()
    early = late = 0  # peak RSS (kB) over [2 x max_keys, keys / 2) and over [keys / 2, keys)
    began = time.perf_counter()
    filled = 0.0
    for i in range(keys):
        limiter.hit(f"flood:{i}", "5/minute")
        if i == max_keys - 1:
            filled = time.perf_counter()
        if i % 1000 == 0:
            largest = max(largest, len(store))
            if 2 * max_keys <= i < keys // 2:
                early = max(early, _rss_kb())
            elif i >= keys // 2:
                late = max(late, _rss_kb())
    ended = time.perf_counter()
    largest = max(largest, len(store))
    fill_us = (filled - began) / max_keys * 1e6
    evict_us = (ended - filled) / (keys - max_keys) * 1e6
    return [
        Row(
            f"flood: {keys:,} distinct keys at a MemoryStore(max_keys={max_keys:,})",
            "entries never exceed max_keys; RSS bounded by max_keys (< 1 kB per allowed key "
            "over the starting RSS, whatever the number of keys)"
            + ("; a hit that evicts costs < 3x one that fills" if check_speed else ""),
            f"at most {largest:,} entries; RSS {_mb(base)} at the start, peak {_mb(early)} up to "
            f"{keys // 2:,} keys, {_mb(late)} up to {keys:,} "
            f"({(max(early, late) - base) * 1024 / max_keys:.0f} B per allowed key); "
            f"{fill_us:.1f} µs/hit filling, "
            f"{evict_us:.1f} µs/hit evicting",
            largest <= max_keys
            and max(early, late) - base <= max_keys  # kB: 1 kB per allowed key
            and (not check_speed or evict_us < 3 * fill_us),
        )
    ]


def _health(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", "/healthz")
        return conn.getresponse().status
    finally:
        conn.close()


def service_outage(quick: bool) -> list[Row]:
    """The service on Redis under load while its Redis is SIGKILLed, then restarted empty."""
    down_at, up_at, duration = (1.0, 2.5, 6.0) if quick else (3.0, 6.0, 12.0)
    redis = rs.RedisServer()
    timeout = (
        QUICK_TIMEOUT if quick else TIMEOUT
    )  # faults.py's: the quick subset shares a busy machine
    service = Service(
        f"store:\n  url: {redis.url}\n  socket_timeout: {timeout}\n"
        "policies:\n  p:\n    rate: 1000000/day\n"
    )
    health: dict[str, int] = {}

    def fault(start_at: float) -> None:
        time.sleep(max(0.0, start_at + down_at - time.monotonic()))
        redis.kill()
        time.sleep(0.3)
        health["down"] = _health(service.port)
        time.sleep(max(0.0, start_at + up_at - time.monotonic()))
        redis.start()
        time.sleep(max(0.0, start_at + duration - 0.3 - time.monotonic()))
        health["back"] = _health(service.port)

    try:
        records, errors, _sent, _samples, start_at = _drive(
            service, "p", duration, duration, 3, 150.0, False, None, fault
        )
        alive = service.alive()
    finally:
        service.stop()
        redis.stop()
    t_down, t_up = start_at + down_at, start_at + up_at
    down = [r for r in records if t_down <= r[0] < t_up]
    bad = sum(r[2] != 200 for r in records)
    p99 = percentile([r[1] for r in down], 0.99)
    healthy = percentile([r[1] for r in records if r[0] < t_down - 0.2], 0.99)
    back = next((r[0] for r in records if r[0] >= t_up and not r[3]), None)
    late = [r for r in records if back is not None and r[0] >= back + 0.1]
    fault_name = f"service: its Redis SIGKILLed for {up_at - down_at:.1f} s, restarted empty"
    return [
        Row(
            fault_name,
            "every HTTP request answered 200 (fail-open, degraded), none 5xx; /healthz 503 "
            "while down, 200 after",
            f"{len(records)} answered, {bad} not 200, {errors} connection errors, "
            f"{sum(r[3] for r in records)} degraded; /healthz {health.get('down')} down, "
            f"{health.get('back')} after",
            alive and bad == 0 and errors == 0 and health == {"down": 503, "back": 200},
        ),
        Row(
            fault_name,
            f"latency p99 while down < 2x socket_timeout ({2000 * timeout:.0f} ms); once back, "
            "every decision exact",
            f"p99 {p99 * 1000:.1f} ms while down (healthy p99 {healthy * 1000:.1f} ms); back "
            + ("never" if back is None else f"{back - t_up:.2f} s after restart")
            + f", then {sum(not r[3] for r in late)}/{len(late)} exact",
            bool(down) and p99 < 2 * timeout and bool(late) and not any(r[3] for r in late),
        ),
    ]
