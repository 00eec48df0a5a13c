"""Exactness under contention: N processes x M threads hit one key per algorithm, every store.

Every process holds its ``ManualClock`` at the same instant, so nothing refills or ends during
the run: the admitted total must equal what one caller admits alone on a fresh memory store
(the limit, or the burst for token_bucket and gcra). One more is a lost update, one fewer a
double charge. The memory store is shared by threads of one process (it is in-process by
design); the Redis stores by every thread of every process.
"""

from __future__ import annotations

import multiprocessing
import threading
from typing import Any

from ratekeeper import (
    Limiter,
    ManualClock,
    MemoryStore,
    RedisClusterStore,
    RedisStore,
    Shard,
    ShardedRedisStore,
)
from ratekeeper.algorithms import ALGORITHMS
from tests import redis_servers as rs
from tests.reliability.report import Row

NAMES = tuple(sorted(ALGORITHMS))
LIMIT = 500
RATE = f"{LIMIT}/hour"


def _build(kind: str, urls: list[str]) -> Any:
    if kind == "redis":
        return RedisStore(urls[0], socket_timeout=5.0)
    if kind == "sharded":
        return ShardedRedisStore([Shard(u) for u in urls], socket_timeout=5.0)
    return RedisClusterStore(urls[0], socket_timeout=5.0)


def _hammer(limiter: Limiter, threads: int, attempts: int) -> list[int]:
    counts = [[0] * len(NAMES) for _ in range(threads)]
    go = threading.Barrier(threads)

    def run(mine: list[int]) -> None:
        go.wait()
        for _ in range(attempts):
            for i, algorithm in enumerate(NAMES):
                mine[i] += limiter.hit(f"hot-{algorithm}", RATE, algorithm=algorithm).allowed

    workers = [threading.Thread(target=run, args=(mine,)) for mine in counts]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    return [sum(column) for column in zip(*counts, strict=True)]


def _process(kind: str, urls: list[str], threads: int, attempts: int, start: Any, out: Any) -> None:
    limiter = Limiter(_build(kind, urls), clock=ManualClock(), fail_open=False)
    for algorithm in NAMES:
        limiter.peek(f"hot-{algorithm}", RATE, algorithm=algorithm)  # connect, load scripts
    start.wait()
    out.put(_hammer(limiter, threads, attempts))


def reference() -> dict[str, int]:
    """What one caller alone admits at one instant on a fresh memory store."""
    limiter = Limiter(MemoryStore(), clock=ManualClock())
    out = {}
    for algorithm in NAMES:
        n = 0
        while limiter.hit("k", RATE, algorithm=algorithm).allowed:
            n += 1
        out[algorithm] = n
    return out


def contention(processes: int, threads: int) -> list[Row]:
    """One row per algorithm: admitted on each store vs the single-caller reference."""
    expected = reference()
    attempts = (2 * LIMIT) // (processes * threads) + 1  # twice the limit in all
    totals: dict[str, dict[str, int]] = {}
    memory = Limiter(MemoryStore(), clock=ManualClock())
    totals["memory"] = dict(zip(NAMES, _hammer(memory, threads * processes, attempts), strict=True))
    single = rs.RedisServer()
    shards = [rs.RedisServer(), rs.RedisServer()]
    cluster = rs.RedisCluster()
    try:
        setups = {
            "redis": [single.url],
            "sharded": [s.url for s in shards],
            "cluster": [cluster.url],
        }
        ctx = multiprocessing.get_context("spawn")
        for kind, urls in setups.items():
            start, out = ctx.Barrier(processes), ctx.Queue()
            procs = [
                ctx.Process(target=_process, args=(kind, urls, threads, attempts, start, out))
                for _ in range(processes)
            ]
            for p in procs:
                p.start()
            rows = [out.get(timeout=300) for _ in procs]
            for p in procs:
                p.join(timeout=30)
            totals[kind] = dict(zip(NAMES, map(sum, zip(*rows, strict=True)), strict=True))
    finally:
        cluster.stop()
        for s in [single, *shards]:
            s.stop()
    result = []
    for algorithm in NAMES:
        seen = {kind: totals[kind][algorithm] for kind in totals}
        figure = ", ".join(f"{kind} {n}" for kind, n in seen.items())
        result.append(
            Row(
                f"{processes} processes x {threads} threads, one key, {algorithm} "
                f"(memory: {processes * threads} threads)",
                f"admitted == {expected[algorithm]} (one caller alone) of "
                f"{attempts * processes * threads} attempts, on every store",
                figure,
                all(n == expected[algorithm] for n in seen.values()),
            )
        )
    return result
