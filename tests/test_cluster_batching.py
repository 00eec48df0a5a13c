"""A batching RedisClusterStore on a real 3-primary cluster: per-node batches, the same
decisions as the unbatched cluster store, MOVED after a reshard, NOSCRIPT, a node that is gone."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ratekeeper import AsyncLimiter, ManualClock, RedisClusterStore
from ratekeeper.errors import ConfigError
from ratekeeper.stores.redis.batching import Batching
from ratekeeper.stores.redis.cluster_batching import ClusterBatcher, node_url
from ratekeeper.stores.redis.keys import redis_key
from ratekeeper.stores.redis.pipeline import RedisPipeline
from tests import redis_servers as rs
from tests.test_cluster_store import begin_migration, errors, finish_migration, owner_of

TIMEOUT = 5.0  # behaviour on a shared machine, not latency

Answer = tuple[str, bool, int, float, float]


def pipelines(batcher: ClusterBatcher) -> list[RedisPipeline]:
    return batcher.pipelines()


def batching(url: str, prefix: str, timeout: float = TIMEOUT) -> tuple[Any, ClusterBatcher]:
    """A batching cluster store and its batcher."""
    store = RedisClusterStore(url, prefix=prefix, socket_timeout=timeout)
    assert store.batcher is not None
    return store, store.batcher


async def traffic(store: Any, algorithm: str) -> list[list[Answer]]:
    clock = ManualClock(1_800_000_000.0)
    limiter = AsyncLimiter(store, clock=clock, fail_open=False)
    out = []
    for step in range(4):
        keys = [f"user:{i % 24}" for i in range(96)]
        ds = await asyncio.gather(*(limiter.hit(k, "3/minute", algorithm=algorithm) for k in keys))
        # concurrent hits on one key may be answered in any order: compare them as a set
        out.append(
            sorted(
                (k, d.allowed, d.remaining, d.reset_at, d.retry_after)
                for k, d in zip(keys, ds, strict=True)
            )
        )
        clock.advance(13 + step)
    return out


@pytest.mark.parametrize("algorithm", ["fixed_window", "gcra", "sliding_window"])
def test_batched_decisions_match_the_cluster_store(cluster_url: str, algorithm: str) -> None:
    async def both() -> tuple[list[list[Answer]], list[list[Answer]], ClusterBatcher]:
        # load the scripts on every node first: a NOSCRIPT reply costs one EVAL per plan
        plain = RedisClusterStore(
            cluster_url, prefix=f"cw{algorithm}", socket_timeout=TIMEOUT, batching=None
        )
        await traffic(plain, algorithm)
        store, batcher = batching(cluster_url, f"cb{algorithm}")
        # and connect: the first calls wait one by one for the slot map and the connections
        warm = AsyncLimiter(store, clock=ManualClock())
        await asyncio.gather(*(warm.hit(f"warm:{i}", "3/minute") for i in range(24)))
        for p in pipelines(batcher):
            p.round_trips = 0
        batched = await traffic(store, algorithm)
        plain = RedisClusterStore(
            cluster_url, prefix=f"cu{algorithm}", socket_timeout=TIMEOUT, batching=None
        )
        single = await traffic(plain, algorithm)
        await store.aclose()
        return batched, single, batcher

    batched, single, batcher = asyncio.run(both())
    assert batched == single
    assert len(batcher.batchers) == 3  # 24 keys spread over the three primaries
    plans = 4 * 96
    trips = sum(p.round_trips for p in pipelines(batcher))
    assert trips <= 4 * 3, f"{trips} round trips for {plans} plans"  # one per node per step
    assert batcher.resent == 0


def test_moved_after_a_reshard_is_followed_and_the_state_kept(
    cluster_url: str, redis_cluster: rs.RedisCluster
) -> None:
    key = redis_key("mv", "mover", "f:1m")
    src = owner_of(redis_cluster, key)
    dst = next(n for n in redis_cluster.nodes if n is not src)
    slot = src.client().cluster("keyslot", key)

    async def go() -> tuple[list[int], ClusterBatcher]:
        store, batcher = batching(cluster_url, "mv")
        limiter = AsyncLimiter(store, clock=ManualClock(), fail_open=False)
        seen = [(await limiter.hit("mover", "10/minute")).remaining]
        begin_migration(src, dst, slot)
        finish_migration(redis_cluster, dst, slot)
        src.client().config_resetstat()
        seen.append((await limiter.hit("mover", "10/minute")).remaining)  # MOVED: re-sent
        seen.append((await limiter.hit("mover", "10/minute")).remaining)  # the new owner's batch
        await store.aclose()
        return seen, batcher

    seen, batcher = asyncio.run(go())
    assert seen == [9, 8, 7]
    assert batcher.resent == 1  # only the plan that met MOVED went through the cluster client
    assert errors(src, "MOVED") >= 1
    assert dst.client().exists(key) == 1


def test_noscript_on_every_node_falls_back_to_eval(
    cluster_url: str, redis_cluster: rs.RedisCluster
) -> None:
    async def go() -> list[bool]:
        store, _ = batching(cluster_url, "ns")
        limiter = AsyncLimiter(store, clock=ManualClock(), fail_open=False)
        await asyncio.gather(*(limiter.hit(f"n{i}", "2/minute") for i in range(30)))
        for node in redis_cluster.nodes:
            node.client().script_flush()
        second = await asyncio.gather(*(limiter.hit(f"n{i}", "2/minute") for i in range(30)))
        await store.aclose()
        return [d.remaining == 0 and d.allowed and not d.degraded for d in second]

    assert all(asyncio.run(go()))


def test_a_node_that_is_gone_fails_open_for_its_keys_only(
    fresh_cluster: rs.RedisCluster,
) -> None:
    victim = fresh_cluster.nodes[0]

    async def go() -> tuple[list[bool], list[bool]]:
        store, _ = batching(fresh_cluster.url, "gone", 2.0)
        limiter = AsyncLimiter(store, clock=ManualClock())
        keys = [f"g{i}" for i in range(30)]
        await asyncio.gather(*(limiter.hit(k, "5/minute") for k in keys))
        on_victim = [owner_of(fresh_cluster, redis_key("gone", k, "f:1m")) is victim for k in keys]
        victim.kill()
        ds = await asyncio.gather(*(limiter.hit(k, "5/minute") for k in keys))
        await store.aclose()
        return on_victim, [d.degraded for d in ds]

    on_victim, degraded = asyncio.run(go())
    assert any(on_victim) and not all(on_victim)
    for lost, was_degraded in zip(on_victim, degraded, strict=True):
        if lost:
            assert was_degraded  # fail-open, not an error, not a hang
    # (keys on the live nodes may be degraded too: the cluster has one circuit breaker)


def test_node_urls_keep_scheme_credentials_and_options() -> None:
    assert node_url("redis://10.0.0.1:7000", "10.0.0.2", 7001) == "redis://10.0.0.2:7001"
    assert (
        node_url("rediss://u:p%40ss@a.example:7000/0?ssl_cert_reqs=none", "10.0.0.5", 7002)
        == "rediss://u:p%40ss@10.0.0.5:7002?ssl_cert_reqs=none"
    )
    assert node_url("redis://h:1", "::1", 7003) == "redis://[::1]:7003"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"max_size": 0}, "max_size=0"), ({"max_wait": 1.0}, "max_wait=1.0")],
)
def test_bad_settings_name_the_value(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        RedisClusterStore("redis://127.0.0.1:1", socket_timeout=0.1, batching=Batching(**kwargs))
