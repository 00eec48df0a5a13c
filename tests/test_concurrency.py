"""ConcurrencyLimiter on the memory store and a real Redis: capacity, expiry, exactness, failure."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio

from ratekeeper import (
    AsyncConcurrencyLimiter,
    ConcurrencyLimiter,
    ManualClock,
    MemoryStore,
    RedisClusterStore,
    RedisStore,
    Shard,
    ShardedRedisStore,
)
from ratekeeper.errors import ConfigError, StoreUnavailable
from ratekeeper.stores.leases import LeaseStore
from ratekeeper.stores.redis.keys import redis_key
from ratekeeper.stores.redis.leases import AsyncRedisLeases, RedisLeases
from tests import redis_servers as rs


@pytest.fixture(params=["memory", "redis", "redis_store", "sharded", "cluster"])
def store(request: pytest.FixtureRequest) -> Iterator[LeaseStore]:
    if request.param == "memory":
        yield MemoryStore()
        return
    if request.param in ("sharded", "cluster"):
        made: ShardedRedisStore | RedisClusterStore
        if request.param == "sharded":
            urls = request.getfixturevalue("shard_urls")
            made = ShardedRedisStore([Shard(u) for u in urls], socket_timeout=5)
        else:
            made = RedisClusterStore(request.getfixturevalue("cluster_url"), socket_timeout=5)
        yield made
        made.close()
        return
    url = request.getfixturevalue("redis_url")
    if request.param == "redis_store":
        redis_store = RedisStore(url, socket_timeout=2.0)
        yield redis_store
        redis_store.close()
        return
    client = redis.Redis.from_url(url)
    yield RedisLeases(client)
    client.close()


def test_capacity_release_and_expiry(store: LeaseStore) -> None:
    clock = ManualClock()
    limiter = ConcurrencyLimiter(store, capacity=2, lease_ttl=60, clock=clock)
    first = limiter.acquire("a")
    clock.advance(1)
    second = limiter.acquire("a")
    assert first is not None and second is not None and first.id != second.id
    assert first.expires_at == pytest.approx(clock() - 1 + 60)
    assert limiter.acquire("a") is None
    assert limiter.acquire("b") is not None  # keys are independent
    assert limiter.in_use("a") == 2
    assert limiter.release(first) is True
    assert limiter.release(first) is False  # already given back
    assert limiter.in_use("a") == 1
    clock.advance(10)
    third = limiter.acquire("a")
    assert third is not None
    assert limiter.acquire("a") is None
    # second was never released (a crashed worker): it expires after the TTL, by the clock
    clock.advance(50)  # t=61: second (taken at t=1) expired, third (t=11) is live
    assert limiter.acquire("a") is not None
    assert limiter.acquire("a") is None
    assert limiter.stats()["rejected"] == 3


def test_slot_releases_on_exception(store: LeaseStore) -> None:
    limiter = ConcurrencyLimiter(store, capacity=1, clock=ManualClock())
    with pytest.raises(RuntimeError), limiter.slot("k") as lease:
        assert lease is not None
        raise RuntimeError("boom")
    with limiter.slot("k") as lease:
        assert lease is not None
        with limiter.slot("k") as inner:
            assert inner is None
    assert limiter.in_use("k") == 0


def test_exact_under_threads(store: LeaseStore) -> None:
    """Capacity 20, 50 threads at once: exactly 20 get a lease; churn never exceeds 20."""
    limiter = ConcurrencyLimiter(store, capacity=20, clock=ManualClock())
    barrier = threading.Barrier(50)
    got: list[object] = []
    lock = threading.Lock()
    live = 0
    peak = 0

    def burst() -> None:
        barrier.wait()
        lease = limiter.acquire("shared")
        with lock:
            got.append(lease)
        barrier.wait()  # nobody releases before everybody has tried
        limiter.release(lease)

    def churn() -> None:
        nonlocal live, peak
        for _ in range(20):
            lease = limiter.acquire("churn")
            if lease is None:
                continue
            with lock:
                live += 1
                peak = max(peak, live)
            with lock:
                live -= 1
            limiter.release(lease)

    for target in (burst, churn):
        threads = [threading.Thread(target=target) for _ in range(50)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert sum(1 for g in got if g is not None) == 20
    assert 1 <= peak <= 20
    assert limiter.in_use("shared") == 0 and limiter.in_use("churn") == 0


def test_async_limiter_matches(redis_url: str) -> None:
    async def main() -> None:
        client = redis.asyncio.Redis.from_url(redis_url)
        redis_store = RedisStore(redis_url, socket_timeout=2.0)
        for store in (MemoryStore(), AsyncRedisLeases(client), redis_store):
            limiter = AsyncConcurrencyLimiter(store, capacity=3, clock=ManualClock())
            leases = await asyncio.gather(*(limiter.acquire("k") for _ in range(10)))
            assert sum(1 for lease in leases if lease is not None) == 3
            async with limiter.slot("k") as lease:
                assert lease is None
            for lease in leases:
                await limiter.release(lease)
            async with limiter.slot("k") as lease:
                assert lease is not None
                assert await limiter.in_use("k") == 1
            assert await limiter.in_use("k") == 0
        await client.aclose()
        await redis_store.aclose()

    asyncio.run(main())


def test_redis_layout_shares_the_hash_tag_and_ttl_is_relative(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    clock = ManualClock(start=1_000.0)  # far in the past: the key TTL must not use it
    limiter = ConcurrencyLimiter(RedisLeases(client, prefix="t"), capacity=5, clock=clock)
    lease = limiter.acquire("user{1}")
    assert lease is not None
    key = redis_key("t", "user{1}", "c")
    assert client.zscore(key, lease.id) == 1_060_000
    assert 60_000 < client.pttl(key) <= 61_000


def test_cluster_store(redis_cluster: rs.RedisCluster) -> None:
    client = redis.RedisCluster.from_url(redis_cluster.url)
    limiter = ConcurrencyLimiter(RedisLeases(client), capacity=2, clock=ManualClock())
    leases = [limiter.acquire(f"user:{i % 3}") for i in range(9)]
    assert sum(1 for lease in leases if lease is not None) == 6
    client.close()


def test_fail_open_and_closed_with_redis_killed(fresh_redis: rs.RedisServer) -> None:
    client = redis.Redis.from_url(fresh_redis.url, socket_timeout=0.5)
    store = RedisLeases(client)
    fresh_redis.kill()
    limiter = ConcurrencyLimiter(store, capacity=1, clock=ManualClock())
    leases = [limiter.acquire("k") for _ in range(3)]
    assert all(lease is not None and lease.degraded for lease in leases)
    limiter.release(leases[0])  # a no-op, not an error
    assert limiter.stats()["degraded"] == 3
    closed = ConcurrencyLimiter(store, capacity=1, fail_open=False)
    with pytest.raises(StoreUnavailable):
        closed.acquire("k")


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"capacity": 0}, "capacity=0"),
        ({"capacity": "5"}, "capacity='5'"),
        ({"capacity": 1, "lease_ttl": 0}, "lease_ttl=0"),
    ],
)
def test_bad_config_names_the_value(kwargs: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        ConcurrencyLimiter(MemoryStore(), **kwargs)  # type: ignore[arg-type]  # bad on purpose


def test_store_without_leases_is_refused() -> None:
    with pytest.raises(ConfigError, match="LeaseStore"):
        ConcurrencyLimiter(object(), 1)  # type: ignore[arg-type]  # bad on purpose


def test_memory_sweep_drops_leases_never_released() -> None:
    store = MemoryStore()
    clock = ManualClock()
    limiter = ConcurrencyLimiter(store, capacity=5, lease_ttl=10, clock=clock)
    for i in range(3):
        assert limiter.acquire(f"crashed-{i}") is not None
    kept = limiter.acquire("busy")
    clock.advance(5)
    assert store.sweep(clock()) == 0
    clock.advance(5)
    assert store.sweep(clock()) == 4
    assert kept is not None and limiter.in_use("busy") == 0


def test_breaker_stops_calling_a_hung_store(fresh_redis: rs.RedisServer) -> None:
    client = redis.Redis.from_url(fresh_redis.url, socket_timeout=0.2)
    clock = ManualClock()
    limiter = ConcurrencyLimiter(RedisLeases(client), capacity=5, clock=clock, monotonic=clock)
    held = limiter.acquire("k")
    assert held is not None and not held.degraded
    fresh_redis.pause()
    try:
        leases = [limiter.acquire("k") for _ in range(10)]
        limiter.release(held)  # the breaker is open: not even tried
        stats = limiter.stats()
        assert all(lease is not None and lease.degraded for lease in leases)
        assert stats["errors"] == 3 and stats["breaker_skips"] == 8
    finally:
        fresh_redis.resume()
    clock.advance(0.5)  # the cool-down is over: the next call is a trial, and it works
    trial = limiter.acquire("k")
    assert trial is not None and not trial.degraded
    # the unreleased lease stays until its TTL, and so may an acquire that timed out on our
    # side but ran when the server woke up: both expire after lease_ttl
    assert 2 <= limiter.in_use("k") <= 5
    clock.advance(60)
    assert limiter.in_use("k") == 0
    client.close()


def test_sharded_leases_live_on_the_owning_shard(shard_urls: list[str]) -> None:
    store = ShardedRedisStore([Shard(u) for u in shard_urls], socket_timeout=5)
    limiter = ConcurrencyLimiter(store, capacity=3, clock=ManualClock())
    clients = {Shard(u).name: redis.Redis.from_url(u) for u in shard_urls}
    owners = set()
    for i in range(20):
        key = f"user:{i}"
        lease = limiter.acquire(key)
        assert lease is not None and not lease.degraded
        owner = store.shard_of(key).name
        owners.add(owner)
        for name, client in clients.items():
            present = client.zscore(redis_key("rk", key, "c"), lease.id) is not None
            assert present == (name == owner)
    assert len(owners) == 2  # 20 keys do spread over both shards
    for client in clients.values():
        client.close()
    store.close()


def test_a_dead_shard_opens_only_its_own_lease_breaker(
    shard_urls: list[str], fresh_redis: rs.RedisServer
) -> None:
    store = ShardedRedisStore([Shard(shard_urls[0]), Shard(fresh_redis.url)], socket_timeout=0.5)
    clock = ManualClock()
    limiter = ConcurrencyLimiter(store, capacity=100, clock=clock)
    dead_name = Shard(fresh_redis.url).name
    keys = [f"k{i}" for i in range(40)]
    dead_keys = [k for k in keys if store.shard_of(k).name == dead_name][:4]
    alive_keys = [k for k in keys if store.shard_of(k).name != dead_name][:4]
    assert dead_keys and alive_keys
    fresh_redis.kill()
    for _ in range(2):
        for key in dead_keys:
            lease = limiter.acquire(key)
            assert lease is not None and lease.degraded
        for key in alive_keys:
            lease = limiter.acquire(key)
            assert lease is not None and not lease.degraded
    stats = limiter.stats()
    assert stats["breakers_open"] == 1 and stats["breaker_opened"] == 1
    assert stats["errors"] == 3 and stats["breaker_skips"] == 2 * len(dead_keys) - 3
    closed = ConcurrencyLimiter(store, capacity=1, fail_open=False)
    with pytest.raises(StoreUnavailable, match=f"shard {dead_name}"):
        closed.acquire(dead_keys[0])
    store.close()


def test_async_sharded_and_cluster_leases(shard_urls: list[str], cluster_url: str) -> None:
    async def main() -> None:
        sharded = ShardedRedisStore([Shard(u) for u in shard_urls], socket_timeout=5)
        cluster = RedisClusterStore(cluster_url, socket_timeout=5)
        for store in (sharded, cluster):
            limiter = AsyncConcurrencyLimiter(store, capacity=4, clock=ManualClock())
            for key in ("a", "b", "c"):
                leases = await asyncio.gather(*(limiter.acquire(key) for _ in range(9)))
                assert sum(1 for lease in leases if lease is not None) == 4
                assert await limiter.in_use(key) == 4
                for lease in leases:
                    await limiter.release(lease)
                assert await limiter.in_use(key) == 0
            await store.aclose()
        sharded.close()
        cluster.close()

    asyncio.run(main())


def test_concurrent_failures_do_not_jump_the_cool_down(fresh_redis: rs.RedisServer) -> None:
    """Ten acquires in flight when Redis hangs all fail; the breaker opens once for 0.5 s."""
    client = redis.Redis.from_url(fresh_redis.url, socket_timeout=0.3)
    clock = ManualClock()
    limiter = ConcurrencyLimiter(RedisLeases(client), capacity=50, clock=clock, monotonic=clock)
    assert limiter.acquire("warm") is not None  # connections are made before the pause
    barrier = threading.Barrier(10)

    def one() -> None:
        barrier.wait()
        limiter.acquire("k")

    fresh_redis.pause()
    try:
        threads = [threading.Thread(target=one) for _ in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        fresh_redis.resume()
    stats = limiter.stats()
    assert stats["errors"] + stats["breaker_skips"] == 10
    assert stats["errors"] > 3  # failures arrived after the breaker had opened
    assert stats["breaker_opened"] == 1 and stats["breaker"] == "open"
    clock.advance(0.4)
    skipped = limiter.acquire("k")
    assert skipped is not None and skipped.degraded
    clock.advance(0.1)  # the first cool-down (0.5 s) is over, not a doubled one
    trial = limiter.acquire("k")
    assert trial is not None and not trial.degraded
    assert limiter.stats()["breaker"] == "closed"
    client.close()


def test_acquire_counted_and_a_per_lease_ttl(store: LeaseStore) -> None:
    clock = ManualClock()
    limiter = ConcurrencyLimiter(store, capacity=2, lease_ttl=60, clock=clock)
    first, count = limiter.acquire_counted("a", lease_ttl=5)
    assert first is not None and count == 1
    assert first.expires_at == pytest.approx(clock() + 5)
    second, count = limiter.acquire_counted("a")
    assert second is not None and count == 2
    assert limiter.acquire_counted("a") == (None, 2)
    clock.advance(5)  # the 5 s lease expired, the 60 s one did not
    third, count = limiter.acquire_counted("a")
    assert third is not None and count == 2
    with pytest.raises(ConfigError, match="lease_ttl=-1"):
        limiter.acquire("a", lease_ttl=-1)


def test_releasing_after_the_lease_ttl_answers_false(store: LeaseStore) -> None:
    """A lease past its TTL had stopped counting (its slot may be someone else's): releasing
    it removes it and answers False, on every store, sync and async alike."""
    clock = ManualClock()
    limiter = ConcurrencyLimiter(store, capacity=1, lease_ttl=10, clock=clock)
    late = limiter.acquire("late")
    on_time = limiter.acquire("on-time")
    assert late is not None and on_time is not None
    clock.advance(9.999)
    assert limiter.release(on_time) is True
    clock.advance(0.001)  # t=10: the lease expired at its TTL
    assert limiter.release(late) is False
    assert limiter.in_use("late") == 0


def test_async_release_after_the_lease_ttl_answers_false(redis_url: str) -> None:
    async def main() -> tuple[bool, bool]:
        for store in (MemoryStore(), RedisStore(redis_url, socket_timeout=2.0)):
            clock = ManualClock()
            limiter = AsyncConcurrencyLimiter(store, capacity=1, lease_ttl=5, clock=clock)
            lease = await limiter.acquire("k")
            clock.advance(5)
            released = await limiter.release(lease)
            if isinstance(store, RedisStore):
                await store.aclose()
            yield_ = (released, await limiter.in_use("k") == 0)
            assert yield_ == (False, True), type(store).__name__
        return yield_

    assert asyncio.run(main()) == (False, True)


def test_memory_leases_never_released_are_reclaimed_without_a_sweep_call() -> None:
    """Crashed callers leave leases on keys nobody touches again: they are dropped as new keys
    arrive, and ``max_keys`` bounds the keys holding leases too."""
    store = MemoryStore(max_keys=1000)
    clock = ManualClock()
    limiter = ConcurrencyLimiter(store, capacity=1, lease_ttl=60, clock=clock)
    for i in range(20_000):  # distinct keys, never released
        assert limiter.acquire(f"crashed-{i}") is not None
    assert len(store.leases) <= 1000  # the bound holds while they are live
    clock.advance(3600)  # an hour later every one of them has expired
    for i in range(5_000):
        lease = limiter.acquire(f"later-{i}")
        limiter.release(lease)
    assert len(store.leases) < 100  # the expired ones were swept as keys came and went
    assert store.sweep(clock()) <= 100
