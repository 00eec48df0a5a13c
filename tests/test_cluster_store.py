"""RedisClusterStore on a real 3-primary cluster: hash-tagged stacks, MOVED/ASK, NOSCRIPT."""

from __future__ import annotations

import asyncio

import pytest
import redis

from ratekeeper import (
    AsyncLimiter,
    ConfigError,
    Limiter,
    ManualClock,
    RedisClusterStore,
    StoreUnavailable,
)
from ratekeeper.stores.redis.keys import redis_key
from tests import redis_servers as rs

TIMEOUT = 2.0  # these tests check behaviour on a shared machine, not latency


def owner_of(cluster: rs.RedisCluster, key: str) -> rs.RedisServer:
    """The node that serves ``key``'s slot now."""
    slot = cluster.nodes[0].client().cluster("keyslot", key)
    for node in cluster.nodes:
        for start, end, *_ in node.client().execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return next(n for n in cluster.nodes if n.port == int(_[0][1]))
    raise AssertionError(f"slot {slot} is not served")


def node_id(node: rs.RedisServer) -> str:
    raw = node.client().execute_command("CLUSTER", "MYID")
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def begin_migration(src: rs.RedisServer, dst: rs.RedisServer, slot: int) -> None:
    """Mark ``slot`` as moving from ``src`` to ``dst`` and move its keys (redis-cli's steps)."""
    dst.client().execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", node_id(src))
    src.client().execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", node_id(dst))
    keys = src.client().execute_command("CLUSTER", "GETKEYSINSLOT", slot, 1000)
    if keys:
        src.client().execute_command("MIGRATE", "127.0.0.1", dst.port, "", 0, 5000, "KEYS", *keys)


def finish_migration(cluster: rs.RedisCluster, dst: rs.RedisServer, slot: int) -> None:
    for node in cluster.nodes:
        node.client().execute_command("CLUSTER", "SETSLOT", slot, "NODE", node_id(dst))


def command_calls(node: rs.RedisServer, name: str) -> int:
    return int(node.client().info("commandstats").get(f"cmdstat_{name}", {}).get("calls", 0))


def errors(node: rs.RedisServer, kind: str) -> int:
    """How many ``kind`` error replies (MOVED, ASK, ...) the node sent since RESETSTAT."""
    return int(node.client().info("errorstats").get(f"errorstat_{kind}", {}).get("count", 0))


def test_a_stack_is_one_slot_and_all_or_nothing(cluster_url: str) -> None:
    clock = ManualClock()
    limiter = Limiter(
        RedisClusterStore(cluster_url, socket_timeout=TIMEOUT), clock=clock, fail_open=False
    )
    rate = "2/minute; 5/hour"
    assert [limiter.hit("user:1", rate).allowed for _ in range(3)] == [True, True, False]
    clock.advance(60)
    decision = limiter.hit("user:1", rate)
    assert decision.allowed and decision.remaining == 1  # minute window: 1 left; hour: 2 left
    assert limiter.peek("user:1", "5/hour").remaining == 2  # the rejection charged nothing
    client = redis.RedisCluster.from_url(cluster_url)
    slots = {client.keyslot(redis_key("rk", "user:1", slot)) for slot in ("f:1m", "f:1h")}
    assert len(slots) == 1
    client.close()


@pytest.mark.parametrize("key", ["a{b}c", "a{b}d", "{}", "ключ 🔑 ün espacio", "x" * 10_000])
def test_awkward_keys_keep_separate_counters(cluster_url: str, key: str) -> None:
    limiter = Limiter(
        RedisClusterStore(cluster_url, socket_timeout=TIMEOUT), clock=ManualClock(), fail_open=False
    )
    limiter.hit("a{b}", "3/minute", cost=3)  # a neighbour that shares the "b" hash tag
    assert limiter.hit(key, "3/minute").remaining == 2


def test_follows_moved_after_a_slot_is_resharded(
    cluster_url: str, redis_cluster: rs.RedisCluster
) -> None:
    clock = ManualClock()
    store = RedisClusterStore(cluster_url, socket_timeout=TIMEOUT)
    limiter = Limiter(store, clock=clock, fail_open=False)
    assert limiter.hit("mover", "10/minute").remaining == 9  # the client caches the slot map
    key = redis_key("rk", "mover", "f:1m")
    src = owner_of(redis_cluster, key)
    dst = next(n for n in redis_cluster.nodes if n is not src)
    slot = src.client().cluster("keyslot", key)
    begin_migration(src, dst, slot)
    finish_migration(redis_cluster, dst, slot)
    src.client().config_resetstat()
    assert limiter.hit("mover", "10/minute").remaining == 8  # MOVED followed, state kept
    assert errors(src, "MOVED") == 1
    assert dst.client().exists(key) == 1
    assert src.client().execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
    assert limiter.stats()["store_errors"] == 0


def test_follows_ask_while_a_slot_is_migrating(
    cluster_url: str, redis_cluster: rs.RedisCluster
) -> None:
    clock = ManualClock()
    limiter = Limiter(
        RedisClusterStore(cluster_url, socket_timeout=TIMEOUT), clock=clock, fail_open=False
    )
    assert limiter.hit("asker", "10/minute").remaining == 9
    key = redis_key("rk", "asker", "f:1m")
    src = owner_of(redis_cluster, key)
    dst = next(n for n in redis_cluster.nodes if n is not src)
    slot = src.client().cluster("keyslot", key)
    begin_migration(src, dst, slot)  # the key now lives on dst; the slot still belongs to src
    try:
        dst.client().config_resetstat()
        src.client().config_resetstat()
        assert limiter.hit("asker", "10/minute").remaining == 8  # src answers ASK -> dst
        assert errors(src, "ASK") >= 1
        assert command_calls(dst, "asking") >= 1
        assert src.client().execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
    finally:
        finish_migration(redis_cluster, dst, slot)
    assert limiter.hit("asker", "10/minute").remaining == 7


def test_noscript_on_every_node_reloads_transparently(
    cluster_url: str, redis_cluster: rs.RedisCluster
) -> None:
    limiter = Limiter(
        RedisClusterStore(cluster_url, socket_timeout=TIMEOUT), clock=ManualClock(), fail_open=False
    )
    keys = [f"user:{i}" for i in range(12)]  # spread over the three nodes
    for key in keys:
        limiter.hit(key, "5/minute")
    for node in redis_cluster.nodes:
        node.client().script_flush()
    assert [limiter.hit(key, "5/minute").remaining for key in keys] == [3] * len(keys)
    assert [limiter.peek(key, "5/minute").remaining for key in keys] == [3] * len(keys)
    assert limiter.stats()["store_errors"] == 0


def test_peek_is_one_round_trip_on_the_primary(
    cluster_url: str, redis_cluster: rs.RedisCluster
) -> None:
    limiter = Limiter(
        RedisClusterStore(cluster_url, socket_timeout=TIMEOUT), clock=ManualClock(), fail_open=False
    )
    limiter.hit("peeker", "5/minute")
    for node in redis_cluster.nodes:
        node.client().config_resetstat()
    assert limiter.peek("peeker", "5/minute").remaining == 4
    calls = {
        name: sum(command_calls(n, name) for n in redis_cluster.nodes)
        for name in ("evalsha", "evalsha_ro", "command|getkeys")
    }
    assert calls == {"evalsha": 1, "evalsha_ro": 0, "command|getkeys": 0}


def test_async_matches_sync(cluster_url: str) -> None:
    clock = ManualClock()

    async def run() -> list[tuple[bool, int, float]]:
        store = RedisClusterStore(cluster_url, socket_timeout=TIMEOUT)
        limiter = AsyncLimiter(store, clock=clock, fail_open=False)
        out = []
        for _ in range(3):
            d = await limiter.hit("user:a", "2/minute; 10/hour")
            out.append((d.allowed, d.remaining, d.reset_at))
        p = await limiter.peek("user:a", "2/minute; 10/hour")
        out.append((p.allowed, p.remaining, p.reset_at))
        await limiter.refund("user:a", "2/minute; 10/hour")
        p = await limiter.peek("user:a", "2/minute; 10/hour")
        out.append((p.allowed, p.remaining, p.reset_at))
        await limiter.reset("user:a", "2/minute; 10/hour")
        p = await limiter.peek("user:a", "2/minute; 10/hour")
        out.append((p.allowed, p.remaining, p.reset_at))
        await store.aclose()
        return out

    got = asyncio.run(run())
    end = clock() + 60
    assert got == [
        (True, 1, end),
        (True, 0, end),
        (False, 0, end),
        (False, 0, end),
        (True, 1, end),
        (True, 2, end),
    ]


def test_unreachable_cluster_fails_open_or_raises() -> None:
    url = f"redis://127.0.0.1:{rs.free_port()}"
    store = RedisClusterStore(url)  # discovery is lazy: building the store does not raise
    assert Limiter(store, clock=ManualClock()).hit("k", "1/second").degraded
    with pytest.raises(StoreUnavailable, match="redis cluster could not run hit"):
        Limiter(store, clock=ManualClock(), fail_open=False).hit("k", "1/second")

    async def run() -> bool:
        limiter = AsyncLimiter(RedisClusterStore(url), clock=ManualClock())
        return (await limiter.hit("k", "1/second")).degraded

    assert asyncio.run(run())


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "needs a url"),
        ({"url": "http://x:7000"}, "scheme 'http'"),
        ({"url": "unix:///tmp/r.sock"}, "unix socket"),
        ({"url": "redis://x:7000", "socket_timeout": 0}, "socket_timeout=0"),
        ({"url": "redis://x:7000", "prefix": "{"}, "prefix '{'"),
    ],
)
def test_bad_settings_name_the_value(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        RedisClusterStore(**kwargs)  # type: ignore[arg-type]


def test_a_rejected_hit_is_one_script_call(
    cluster_url: str, redis_cluster: rs.RedisCluster
) -> None:
    clock = ManualClock()
    limiter = Limiter(RedisClusterStore(cluster_url, socket_timeout=TIMEOUT), clock=clock)
    first = limiter.hit("full", "2/minute; 10/hour")
    limiter.hit("full", "2/minute; 10/hour")
    clock.advance(20)
    for node in redis_cluster.nodes:
        node.client().config_resetstat()
    rejected = limiter.hit("full", "2/minute; 10/hour")
    calls = sum(command_calls(n, name) for n in redis_cluster.nodes for name in ("evalsha", "eval"))
    assert calls == 1
    assert not rejected.allowed and not rejected.degraded
    assert (rejected.remaining, rejected.reset_at) == (0, first.reset_at)
    assert rejected.retry_after == pytest.approx(40.0)


def test_concurrent_first_async_calls_on_a_fresh_store_all_reach_the_cluster(
    cluster_url: str,
) -> None:
    """A fresh asyncio cluster client loads its slot map once before the first commands."""

    async def main() -> tuple[list[bool], list[bool]]:
        store = RedisClusterStore(cluster_url, socket_timeout=5)
        limiter = AsyncLimiter(store, clock=ManualClock())
        hits = await asyncio.gather(*(limiter.hit("first", "4/minute") for _ in range(9)))
        fresh = RedisClusterStore(cluster_url, socket_timeout=5)
        leases = await asyncio.gather(
            *(fresh.acquire_lease_async("first", f"id{i}", 4, 0, 60_000) for i in range(9))
        )
        await store.aclose()
        await fresh.aclose()
        return [d.degraded for d in hits] + [not d.allowed for d in hits], [ok for ok, _ in leases]

    flags, acquired = asyncio.run(main())
    assert flags[:9] == [False] * 9 and sum(flags[9:]) == 5  # 4 allowed, 5 rejected
    assert sum(acquired) == 4
