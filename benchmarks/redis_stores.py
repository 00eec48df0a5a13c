"""Decisions per second of one thread on each Redis store, side by side in one run.

Run: ``python -m benchmarks.redis_stores [--hits N] [--rounds R]`` (starts its own
redis-servers on 127.0.0.1: one standalone, two shard primaries, a 3-primary cluster). Run it
again under ``taskset -c 0`` to pin the client and every redis-server (they inherit the
affinity) to one CPU, which approximates CPU cost per decision. Prints the best of R rounds of
N ``Limiter.hit`` calls per store (fixed_window, 1000 keys), its ratio to ``RedisStore`` and
the client's CPU time per decision (the store's Python overhead; steadier than wall time on a
shared machine). Figures on a shared 2-vCPU machine are noisy.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from ratekeeper import Limiter, ManualClock, RedisClusterStore, RedisStore, Shard, ShardedRedisStore
from tests import redis_servers as rs


def rate(store: Any, hits: int) -> tuple[float, float]:
    """Decisions per second of ``hits`` sync hits over 1000 keys, and client CPU µs per hit."""
    limiter = Limiter(store, clock=ManualClock(), fail_open=False)
    keys = [f"user:{i}" for i in range(1000)]
    for key in keys:  # connect, load the script, warm the caches
        limiter.hit(key, "1000000/hour")
    start, cpu = time.perf_counter(), time.process_time()
    for i in range(hits):
        limiter.hit(keys[i % 1000], "1000000/hour")
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return hits / wall, cpu / hits * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hits", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    servers: list[Any] = []  # everything started is stopped, even if a later start fails
    timeout = 1.0  # a loaded machine must not turn into fail-closed errors here
    try:
        for _ in range(3):
            servers.append(rs.RedisServer())
        single, a, b = servers
        servers.append(rs.RedisCluster())
        stores: dict[str, Any] = {
            "RedisStore": RedisStore(single.url, socket_timeout=timeout),
            "ShardedRedisStore, 1 shard": ShardedRedisStore(
                [Shard(single.url)], socket_timeout=timeout
            ),
            "ShardedRedisStore, 2 shards": ShardedRedisStore(
                [Shard(a.url), Shard(b.url)], socket_timeout=timeout
            ),
            "RedisClusterStore, 3 nodes": RedisClusterStore(servers[3].url, socket_timeout=timeout),
        }
        best = dict.fromkeys(stores, 0.0)
        cpu = dict.fromkeys(stores, float("inf"))
        for _ in range(args.rounds):
            for name, store in stores.items():
                per_s, cpu_us = rate(store, args.hits)
                best[name] = max(best[name], per_s)
                cpu[name] = min(cpu[name], cpu_us)
        base = best["RedisStore"]
        print(f"{'store':<30} {'decisions/s':>12} {'vs RedisStore':>14} {'client CPU µs':>14}")
        for name, value in best.items():
            print(f"{name:<30} {value:>12,.0f} {value / base:>13.2f}x {cpu[name]:>14.1f}")
    finally:
        for server in servers:
            server.stop()


if __name__ == "__main__":
    main()
