"""Load from several client processes against a Redis-backed limiter, with per-request records.

Every worker process builds its own store and ``Limiter`` (real clock: the breaker's cool-downs
must pass in real time while a real Redis is down) and runs ``threads`` threads that hit keys
round-robin until the shared deadline. Each request is recorded as (start, latency, allowed,
degraded, key index); an exception reaching the caller is counted, never swallowed silently.
``time.monotonic`` is system-wide on Linux, so the controller schedules faults on the same
timeline as the workers' records.

The timeline starts only once every worker has imported and connected (each says so on a
queue), so a slow machine delays the run instead of leaving its first seconds without load.

A worker can be repointed mid-run (failover): when ``repoint`` is set it rebuilds its store from
``LoadSpec.failover`` once, like an app server whose config was reloaded.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ratekeeper import Limiter, RedisStore, SentinelStore, Shard, ShardedRedisStore


@dataclass(frozen=True, slots=True)
class StoreSpec:
    """How a worker builds its store: ``redis`` (first URL), ``sharded`` (one shard per URL)
    or ``sentinel`` (the URLs are the Sentinels', the first name the monitored service)."""

    kind: str
    urls: tuple[str, ...]
    names: tuple[str, ...] = ()
    socket_timeout: float = 0.05

    def build(self) -> Any:
        if self.kind == "redis":
            return RedisStore(self.urls[0], socket_timeout=self.socket_timeout)
        if self.kind == "sentinel":
            return SentinelStore(self.names[0], self.urls, socket_timeout=self.socket_timeout)
        names = self.names or tuple("" for _ in self.urls)
        shards = [
            Shard(u, name=n) if n else Shard(u) for u, n in zip(self.urls, names, strict=True)
        ]
        return ShardedRedisStore(shards, socket_timeout=self.socket_timeout)


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """What every worker does: hit ``keys`` in turn with ``rate`` for ``duration`` seconds."""

    store: StoreSpec
    keys: tuple[str, ...]
    rate: str = "1000000/day"
    algorithm: str = "fixed_window"
    processes: int = 3
    threads: int = 2
    duration: float = 6.0
    failover: StoreSpec | None = None
    rps_per_thread: float = 250.0
    """Steady offered load: each thread paces its requests (it never makes up more than 0.1 s)."""


@dataclass(slots=True)
class Result:
    """All workers' records, merged. Times are ``time.monotonic`` seconds."""

    records: list[tuple[float, float, bool, bool, int]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    store_errors: int = 0

    def between(self, start: float, end: float) -> list[tuple[float, float, bool, bool, int]]:
        return [r for r in self.records if start <= r[0] < end]


def percentile(values: list[float], q: float) -> float:
    """The ``q``-quantile (0..1) by nearest rank; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _worker(spec: LoadSpec, start: Any, ready: Any, repoint: Any, out: Any) -> None:
    box = [Limiter(spec.store.build())]
    limiters = [box[0]]
    lock = threading.Lock()
    moved = [False]
    per_thread: list[list[tuple[float, float, bool, bool, int]]] = []
    errors: list[str] = []
    for key in spec.keys[:1]:
        box[0].peek(key, spec.rate, algorithm=spec.algorithm)  # connect, load the script
    ready.put(True)
    while not start.value:  # the controller sets the start once every worker is ready
        time.sleep(0.001)
    start_at = float(start.value)
    end_at = start_at + spec.duration

    def run(offset: int, mine: list[tuple[float, float, bool, bool, int]]) -> None:
        i = offset
        while time.monotonic() < start_at:
            time.sleep(0.001)
        gap = 1.0 / spec.rps_per_thread
        next_at = start_at + (offset % 97) * gap / 97
        while (now := time.monotonic()) < end_at:
            if now < next_at:
                time.sleep(next_at - now)
                now = time.monotonic()
            next_at = max(next_at + gap, now - 0.1)
            if spec.failover is not None and not moved[0] and repoint.is_set():
                with lock:
                    if not moved[0]:
                        box[0] = Limiter(spec.failover.build())
                        limiters.append(box[0])
                        moved[0] = True
            k = i % len(spec.keys)
            i += 1
            try:
                d = box[0].hit(spec.keys[k], spec.rate, algorithm=spec.algorithm)
            except Exception as exc:  # what reached the app: counted and reported
                errors.append(f"{type(exc).__name__}: {exc}")
                continue
            mine.append((now, time.monotonic() - now, d.allowed, d.degraded, k))

    threads = []
    for t in range(spec.threads):
        mine: list[tuple[float, float, bool, bool, int]] = []
        per_thread.append(mine)
        threads.append(threading.Thread(target=run, args=(t * 7919, mine)))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    store_errors = sum(int(limiter.stats()["store_errors"]) for limiter in limiters)
    out.put(([r for mine in per_thread for r in mine], errors[:20], store_errors))


class Load:
    """Start the workers (``start``), break things meanwhile, then ``join`` for the result."""

    def __init__(self, spec: LoadSpec, lead: float = 0.2) -> None:
        self.spec = spec
        ctx = multiprocessing.get_context("spawn")
        self.repoint = ctx.Event()
        self.out = ctx.Queue()
        start = ctx.Value("d", 0.0)
        ready = ctx.Queue()
        self.procs = [
            ctx.Process(target=_worker, args=(spec, start, ready, self.repoint, self.out))
            for _ in range(spec.processes)
        ]
        for p in self.procs:
            p.start()
        for _ in self.procs:  # imported and connected (a loaded machine takes seconds)
            ready.get(timeout=120)
        self.start_at = time.monotonic() + lead
        start.value = self.start_at

    def at(self, seconds: float) -> None:
        """Sleep until ``seconds`` after the load began."""
        time.sleep(max(0.0, self.start_at + seconds - time.monotonic()))

    def join(self) -> Result:
        result = Result()
        for _ in self.procs:
            records, errors, store_errors = self.out.get(timeout=self.spec.duration + 120)
            result.records.extend(records)
            result.errors.extend(errors)
            result.store_errors += store_errors
        for p in self.procs:
            p.join(timeout=30)
            if p.exitcode != 0:
                result.errors.append(f"worker exited with {p.exitcode}")
        result.records.sort()
        return result
