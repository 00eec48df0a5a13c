"""What a broken Redis costs per decision: healthy, killed, stopped, and while the breaker is open.

Run: ``python -m benchmarks.redis_failure [--calls N]`` (starts its own redis-server on
127.0.0.1, needs redis-server on PATH). Prints the median and worst wall time of ``Limiter.hit``
on a ``RedisStore``, a ``ShardedRedisStore`` and a ``RedisClusterStore`` (breaking the node
that owns the key) in each phase. Figures on a shared 2-vCPU
machine are noisy; the point is the order of magnitude: a killed Redis costs a refused
connect, a stopped one ``socket_timeout``, and with the breaker open no call reaches the socket.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from ratekeeper import (
    Limiter,
    ManualClock,
    RedisClusterStore,
    RedisStore,
    Shard,
    ShardedRedisStore,
)
from ratekeeper.stores.redis.keys import redis_key
from tests import redis_servers as rs


def timed(limiter: Limiter, n: int) -> tuple[float, float, int]:
    """Median and worst µs per hit over ``n`` hits, and how many were degraded."""
    samples = []
    degraded = 0
    for _ in range(n):
        start = time.perf_counter()
        decision = limiter.hit("bench", "1000000/minute")
        samples.append((time.perf_counter() - start) * 1e6)
        degraded += decision.degraded
    return statistics.median(samples), max(samples), degraded


def phases(make: Callable[[str], Any], calls: int) -> list[tuple[str, float, float, int]]:
    server = rs.RedisServer()
    clock = ManualClock()
    # a threshold above `calls` keeps the breaker closed while we time the failing calls
    limiter = Limiter(make(server.url), clock=clock, breaker_threshold=calls + 1)
    out = [("healthy", *timed(limiter, calls))]
    server.kill()
    out.append(("killed, breaker closed", *timed(limiter, calls)))
    server.start()
    timed(limiter, 1)
    server.pause()
    out.append(("SIGSTOP, breaker closed", *timed(limiter, min(calls, 20))))
    open_limiter = Limiter(make(server.url), clock=clock)
    timed(open_limiter, 3)  # three timeouts open the breaker
    out.append(("SIGSTOP, breaker open", *timed(open_limiter, calls)))
    server.resume()
    clock.advance(0.5)
    out.append(("resumed, after cool-down", *timed(open_limiter, calls)))
    server.stop()
    return out


def owner(cluster: rs.RedisCluster, key: str) -> rs.RedisServer:
    """The node serving ``key``'s slot."""
    client = cluster.nodes[0].client()
    slot = client.cluster("keyslot", key)
    for start, end, primary, *_ in client.execute_command("CLUSTER", "SLOTS"):  # type: ignore[no-untyped-call]  # untyped in redis-py
        if start <= slot <= end:
            return next(n for n in cluster.nodes if n.port == int(primary[1]))
    raise RuntimeError(f"slot {slot} is not served")


def cluster_phases(calls: int) -> list[tuple[str, float, float, int]]:
    """The same phases on a 3-primary cluster, breaking the node that owns the benchmark key."""
    cluster = rs.RedisCluster()
    try:
        clock = ManualClock()
        limiter = Limiter(RedisClusterStore(cluster.url), clock=clock, breaker_threshold=calls + 1)
        out = [("healthy", *timed(limiter, calls))]
        victim = owner(cluster, redis_key("rk", "bench", "f:1m"))
        victim.pause()
        out.append(("SIGSTOP, breaker closed", *timed(limiter, min(calls, 20))))
        open_limiter = Limiter(RedisClusterStore(cluster.url), clock=clock)
        timed(open_limiter, 3)
        out.append(("SIGSTOP, breaker open", *timed(open_limiter, calls)))
        victim.resume()
        victim.kill()
        out.append(("killed, breaker closed", *timed(limiter, min(calls, 50))))
        return out
    finally:
        cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    stores: dict[str, Callable[[str], Any]] = {
        "RedisStore": RedisStore,
        "ShardedRedisStore": lambda url: ShardedRedisStore([Shard(url)]),
    }
    print(f"{'store':<18} {'phase':<26} {'median µs':>10} {'worst µs':>10} {'degraded':>9}")
    results = [(name, row) for name, make in stores.items() for row in phases(make, args.calls)]
    results += [("RedisClusterStore", row) for row in cluster_phases(args.calls)]
    for name, (phase, median, worst, degraded) in results:
        print(f"{name:<18} {phase:<26} {median:>10.1f} {worst:>10.1f} {degraded:>9}")


if __name__ == "__main__":
    main()
