"""Redis failing for real (SIGKILL, SIGSTOP, restart): fail-open, the breaker, recovery.

Every test breaks a real redis-server process; time is a ManualClock, so the breaker's
cool-downs pass by ``advance`` and nothing sleeps. "The store was not called" is read from the
limiter's counters: a call to a dead Redis always fails and counts a ``store_errors``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from ratekeeper import (
    AsyncLimiter,
    Limiter,
    ManualClock,
    RedisClusterStore,
    RedisStore,
    Shard,
    ShardedRedisStore,
    StoreUnavailable,
)
from tests import redis_servers as rs

TIMEOUT = 0.25  # short, so a stopped Redis costs little, but not flaky on a loaded machine
KINDS: dict[str, Callable[[str], Any]] = {
    "redis": lambda url: RedisStore(url, socket_timeout=TIMEOUT),
    "sharded": lambda url: ShardedRedisStore([Shard(url)], socket_timeout=TIMEOUT),
}


@pytest.fixture(params=sorted(KINDS))
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_killed_primary_fails_open_breaks_and_recovers(
    fresh_redis: rs.RedisServer, kind: str
) -> None:
    clock = ManualClock()
    limiter = Limiter(KINDS[kind](fresh_redis.url), clock=clock, monotonic=clock)
    assert not limiter.hit("k", "10/minute").degraded
    fresh_redis.kill()

    failing = [limiter.hit("k", "10/minute") for _ in range(3)]
    assert all(d.allowed and d.degraded for d in failing)
    assert limiter.stats()["store_errors"] == 3 and limiter.stats()["breaker"] == "open"

    skipped = [limiter.hit("k", "10/minute") for _ in range(20)]
    assert all(d.allowed and d.degraded for d in skipped)
    stats = limiter.stats()
    assert stats["store_errors"] == 3  # the store was not called during the cool-down
    assert stats["breaker_skips"] == 20 and stats["degraded"] == 23

    clock.advance(0.5)  # cool-down over: one trial, Redis still dead -> 1 s cool-down
    assert limiter.hit("k", "10/minute").degraded
    assert limiter.stats()["store_errors"] == 4

    fresh_redis.start()  # Redis is back (empty)
    clock.advance(0.9)
    assert limiter.hit("k", "10/minute").degraded  # still cooling down: not called yet
    assert limiter.stats()["store_errors"] == 4
    clock.advance(0.1)
    back = [limiter.hit("k", "10/minute") for _ in range(3)]  # same limiter, same store
    assert [(d.degraded, d.remaining) for d in back] == [(False, 9), (False, 8), (False, 7)]
    assert limiter.stats()["breaker"] == "closed"


def test_fail_closed_raises_store_unavailable(fresh_redis: rs.RedisServer, kind: str) -> None:
    clock = ManualClock()
    limiter = Limiter(KINDS[kind](fresh_redis.url), clock=clock, fail_open=False, monotonic=clock)
    limiter.hit("k", "10/minute")
    fresh_redis.kill()
    for _ in range(3):
        with pytest.raises(StoreUnavailable) as info:
            limiter.hit("k", "10/minute")
        assert info.value.__cause__ is not None  # the driver's error is kept
    with pytest.raises(StoreUnavailable, match="circuit breaker open"):
        limiter.peek("k", "10/minute")
    with pytest.raises(StoreUnavailable):
        limiter.refund("k", "10/minute")
    fresh_redis.start()
    clock.advance(0.5)
    assert limiter.hit("k", "10/minute").remaining == 9


def test_stopped_redis_times_out_and_fails_open(fresh_redis: rs.RedisServer, kind: str) -> None:
    clock = ManualClock()
    limiter = Limiter(KINDS[kind](fresh_redis.url), clock=clock, monotonic=clock)
    assert limiter.hit("k", "10/minute").remaining == 9
    fresh_redis.pause()  # holds its port, answers nothing: every call runs into socket_timeout
    try:
        decisions = [limiter.hit("k", "10/minute") for _ in range(6)]
        assert all(d.allowed and d.degraded for d in decisions)
        stats = limiter.stats()
        assert (stats["store_errors"], stats["breaker_skips"]) == (3, 3)
    finally:
        fresh_redis.resume()
    clock.advance(0.5)
    after = limiter.hit("k", "10/minute")
    # Redis runs what was queued on its sockets once resumed: each timed-out hit (sent once,
    # never retried) may have counted.
    assert not after.degraded and 5 <= after.remaining <= 8


def test_restart_between_calls_reloads_the_script(fresh_redis: rs.RedisServer, kind: str) -> None:
    limiter = Limiter(KINDS[kind](fresh_redis.url), clock=ManualClock(), fail_open=False)
    assert limiter.hit("k", "5/minute").remaining == 4
    fresh_redis.restart()  # empty, no scripts: NOSCRIPT, answered by EVAL in the same call
    assert [limiter.hit("k", "5/minute").remaining for _ in range(2)] == [4, 3]
    assert limiter.peek("k", "5/minute").remaining == 3
    assert limiter.stats()["store_errors"] == 0


def test_async_limiter_fails_open_and_recovers(fresh_redis: rs.RedisServer, kind: str) -> None:
    clock = ManualClock()

    async def run() -> list[tuple[bool, int]]:
        limiter = AsyncLimiter(KINDS[kind](fresh_redis.url), clock=clock, monotonic=clock)
        out = [(d.degraded, d.remaining) for d in [await limiter.hit("k", "10/minute")]]
        fresh_redis.kill()
        for _ in range(5):
            d = await limiter.hit("k", "10/minute")
            out.append((d.degraded, d.remaining))
        assert limiter.stats()["store_errors"] == 3
        fresh_redis.start()
        clock.advance(0.5)
        d = await limiter.hit("k", "10/minute")
        out.append((d.degraded, d.remaining))
        return out

    assert asyncio.run(run()) == [(False, 9), *[(True, 10)] * 5, (False, 9)]


def wait_cluster_ok(cluster: rs.RedisCluster, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if all(n.client().cluster("info").get("cluster_state") == "ok" for n in cluster.nodes):
                return
        except Exception:  # a node still starting
            pass
        time.sleep(0.1)
    raise AssertionError("cluster did not recover")


def test_cluster_node_killed_fails_open_and_recovers(fresh_cluster: rs.RedisCluster) -> None:
    clock = ManualClock()
    limiter = Limiter(
        RedisClusterStore(fresh_cluster.url, socket_timeout=TIMEOUT), clock=clock, monotonic=clock
    )
    keys = [f"user:{i}" for i in range(9)]  # on all three nodes
    assert all(not limiter.hit(k, "10/minute").degraded for k in keys)
    victim = fresh_cluster.nodes[1]
    victim.kill()
    decisions = [limiter.hit(k, "10/minute") for k in keys]
    assert all(d.allowed for d in decisions)
    assert any(d.degraded for d in decisions)
    assert limiter.stats()["store_errors"] >= 1
    victim.start()  # same port and nodes.conf: it rejoins with its slots (data lost)
    wait_cluster_ok(fresh_cluster)
    clock.advance(31)  # past any cool-down
    after = [limiter.hit(k, "10/minute") for k in keys]
    assert not any(d.degraded for d in after)
    assert limiter.stats()["breaker"] == "closed"


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "one-call-each"])
def test_async_calls_in_flight_on_a_stopped_redis_time_out_and_fail_open(
    fresh_redis: rs.RedisServer, batched: bool
) -> None:
    """Coalesced or not, 16 hits in flight on a stopped Redis each fail open after one
    socket_timeout (nothing hangs, nothing raises), the breaker then skips the store, and the
    limiter recovers once Redis is back."""
    clock = ManualClock()
    options: dict[str, Any] = {} if batched else {"batching": None}
    store = RedisStore(fresh_redis.url, socket_timeout=TIMEOUT, **options)
    assert (store.batcher is not None) is batched

    async def run() -> tuple[list[bool], dict[str, Any], float, bool]:
        limiter = AsyncLimiter(store, clock=clock, monotonic=clock)
        await limiter.hit("warm", "10/minute")
        fresh_redis.pause()
        try:
            began = time.monotonic()
            ds = await asyncio.gather(*(limiter.hit(f"k{i}", "10/minute") for i in range(16)))
            took = time.monotonic() - began
            skipped = await limiter.hit("k0", "10/minute")
        finally:
            fresh_redis.resume()
        stats = limiter.stats()
        clock.advance(0.5)
        after = await limiter.hit("fresh", "10/minute")
        return (
            [d.allowed and d.degraded for d in ds],
            stats,
            took,
            skipped.degraded and not after.degraded,
        )

    degraded, stats, took, recovered = asyncio.run(run())
    assert all(degraded)
    assert stats["store_errors"] == 16 and stats["breaker"] == "open"
    assert stats["breaker_skips"] == 1
    assert took < 20 * TIMEOUT  # bounded by the timeout, not by a hang (generous: shared machine)
    assert recovered
