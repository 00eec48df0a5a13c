"""Exactness under contention: 4 processes x 4 threads hammer one key on every Redis store.

With the clock held still nothing refills or ends, so a limit of 1000 must admit exactly 1000
of the 1280 attempts per key: one more would be a lost update, one fewer a double charge. Each
thread hits one key per algorithm in turn (fixed_window, token_bucket, sliding_log), so one set
of processes checks all three.
"""

from __future__ import annotations

import multiprocessing
import threading
from typing import Any

import pytest

from ratekeeper import Limiter, ManualClock, RedisClusterStore, RedisStore, Shard, ShardedRedisStore

PROCESSES, THREADS, ATTEMPTS, LIMIT = 4, 4, 80, 1000


TIMEOUT = 5.0  # 16 threads on a shared 2-vCPU machine: this test is about counts, not latency


def build(kind: str, urls: list[str]) -> Any:
    if kind == "redis":
        return RedisStore(urls[0], socket_timeout=TIMEOUT)
    if kind == "sharded":
        return ShardedRedisStore([Shard(u) for u in urls], socket_timeout=TIMEOUT)
    return RedisClusterStore(urls[0], socket_timeout=TIMEOUT)


ALGORITHMS = ("fixed_window", "token_bucket", "sliding_log")


def hammer(kind: str, urls: list[str], start: Any, results: Any) -> None:
    """One process: wait for the others, then four threads hit one key per algorithm."""
    limiter = Limiter(build(kind, urls), clock=ManualClock(), fail_open=False)
    rate = f"{LIMIT}/hour"
    for algorithm in ALGORITHMS:  # connect and load the scripts first
        limiter.peek(f"hot-{algorithm}", rate, algorithm=algorithm)
    counts = [[0] * len(ALGORITHMS) for _ in range(THREADS)]
    go = threading.Barrier(THREADS)

    def run(mine: list[int]) -> None:
        go.wait()
        for _ in range(ATTEMPTS):
            for i, algorithm in enumerate(ALGORITHMS):
                mine[i] += limiter.hit(f"hot-{algorithm}", rate, algorithm=algorithm).allowed

    threads = [threading.Thread(target=run, args=(mine,)) for mine in counts]
    start.wait()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results.put([sum(column) for column in zip(*counts, strict=True)])


@pytest.mark.parametrize("kind", ["redis", "sharded", "cluster"])
def test_limit_1000_admits_exactly_1000(request: pytest.FixtureRequest, kind: str) -> None:
    if kind == "redis":
        urls = [request.getfixturevalue("redis_url")]
    elif kind == "sharded":
        urls = request.getfixturevalue("shard_urls")
    else:
        urls = [request.getfixturevalue("cluster_url")]
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(PROCESSES)
    results = ctx.Queue()
    procs = [
        ctx.Process(target=hammer, args=(kind, urls, start, results)) for _ in range(PROCESSES)
    ]
    for p in procs:
        p.start()
    admitted = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    totals = dict(zip(ALGORITHMS, map(sum, zip(*admitted, strict=True)), strict=True))
    assert totals == dict.fromkeys(ALGORITHMS, LIMIT)
    assert PROCESSES * THREADS * ATTEMPTS > LIMIT
    assert all(0 < n < LIMIT for row in admitted for n in row)  # every process took part
