"""ShardedRedisStore on real servers: placement, primaries for writes, replicas for reads."""

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
    Shard,
    ShardedRedisStore,
    StoreUnavailable,
)
from ratekeeper.stores.base import AsyncStore, Partitioned, Store
from ratekeeper.stores.redis.keys import redis_key
from tests import redis_servers as rs

TIMEOUT = 2.0  # these tests check behaviour on a shared machine, not latency
ALGORITHMS = ["fixed_window", "token_bucket", "sliding_window", "sliding_log", "gcra"]


def script_calls(server: rs.RedisServer) -> int:
    """Script calls (EVAL, EVALSHA and their _RO forms) the server has run since RESETSTAT."""
    stats = server.client().info("commandstats")
    return sum(
        int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))
        for name in ("eval", "evalsha", "eval_ro", "evalsha_ro")
    )


def reset_stats(*servers: rs.RedisServer) -> None:
    for server in servers:
        server.client().config_resetstat()


def keys_by_shard(store: ShardedRedisStore, n: int = 200) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {s.name: [] for s in store.shards}
    for i in range(n):
        out[store.shard_of(f"user:{i}").name].append(f"user:{i}")
    return out


@pytest.fixture
def replicated(
    primary_replica: tuple[rs.RedisServer, rs.RedisServer], fresh_redis: rs.RedisServer
) -> tuple[rs.RedisServer, rs.RedisServer, rs.RedisServer]:
    """Shard A: a primary with one replica; shard B: a primary alone."""
    return (*primary_replica, fresh_redis)


# -- configuration -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: Shard("http://x:6379"), "scheme 'http'"),
        (lambda: Shard("redis://:6379"), "no host"),
        (lambda: Shard("redis://x:99999"), "invalid port"),
        (lambda: Shard("redis://x:6379/abc"), "database 'abc'"),
        (lambda: Shard("redis://x:6379", replicas="redis://y:6379"), "expected a list of URLs"),
        (lambda: Shard("redis://x:6379", replicas=["nope"]), "replica url 'nope'"),
        (lambda: Shard(""), "shard url ''"),
        (lambda: ShardedRedisStore([]), "at least one shard"),
        (lambda: ShardedRedisStore(Shard("redis://x")), "expected a list of Shard"),  # type: ignore[arg-type]
        (lambda: ShardedRedisStore(["redis://x"]), "expected Shard"),  # type: ignore[list-item]
        (
            lambda: ShardedRedisStore([Shard("redis://x:1/0"), Shard("redis://x:1/0")]),
            "more than once",
        ),
        (lambda: ShardedRedisStore([Shard("redis://x")], prefix="a}"), "prefix 'a}'"),
        (lambda: ShardedRedisStore([Shard("redis://x")], socket_timeout=-1), "socket_timeout"),
    ],
)
def test_bad_configuration_names_the_value(build: object, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        build()  # type: ignore[operator]


def test_shard_names_default_to_the_address_without_credentials() -> None:
    shard = Shard("redis://user:secret@cache-1:6380/2", replicas=["rediss://cache-1r:6380/2"])
    assert shard.name == "cache-1:6380/2"
    assert shard.replicas == ("rediss://cache-1r:6380/2",)
    assert Shard("redis://cache-1").name == "cache-1:6379/0"
    assert Shard("unix:///run/redis.sock").name == "/run/redis.sock"
    # an explicit name keeps placement when a shard moves to a new address
    moved = ShardedRedisStore([Shard("redis://new-host", name="s1"), Shard("redis://b", name="s2")])
    before = ShardedRedisStore(
        [Shard("redis://old-host", name="s1"), Shard("redis://b", name="s2")]
    )
    for i in range(100):
        assert moved.shard_of(f"k{i}").name == before.shard_of(f"k{i}").name


# -- placement and routing ------------------------------------------------------------------


def test_each_key_lives_wholly_on_its_owning_shard(shard_urls: list[str]) -> None:
    store = ShardedRedisStore([Shard(u) for u in shard_urls], socket_timeout=TIMEOUT)
    limiter = Limiter(store, clock=ManualClock(), fail_open=False)
    clients = {Shard(u).name: redis.Redis.from_url(u) for u in shard_urls}
    groups = keys_by_shard(store, 60)
    assert all(len(keys) > 10 for keys in groups.values())
    for name, keys in groups.items():
        for key in keys:
            limiter.hit(key, "5/minute; 50/hour")
            for other, client in clients.items():
                present = client.exists(redis_key("rk", key, "f:1m"), redis_key("rk", key, "f:1h"))
                assert present == (2 if other == name else 0)


def test_writes_go_to_the_primary_and_peeks_to_the_replica(
    replicated: tuple[rs.RedisServer, rs.RedisServer, rs.RedisServer],
) -> None:
    a, a2, b = replicated
    store = ShardedRedisStore(
        [Shard(a.url, replicas=[a2.url]), Shard(b.url)], socket_timeout=TIMEOUT
    )
    limiter = Limiter(store, clock=ManualClock(), fail_open=False)
    key = keys_by_shard(store)[Shard(a.url).name][0]
    limiter.hit(key, "5/minute")
    rs.wait_replicated(a)
    limiter.peek(key, "5/minute")  # the replica's first call loads the script (NOSCRIPT, EVAL)
    reset_stats(a, a2, b)
    assert limiter.peek(key, "5/minute").remaining == 4
    assert (script_calls(a), script_calls(a2), script_calls(b)) == (0, 1, 0)
    assert limiter.hit(key, "5/minute").remaining == 3
    limiter.refund(key, "5/minute")
    assert (script_calls(a), script_calls(a2), script_calls(b)) == (2, 1, 0)


def test_a_rejected_hit_is_one_store_call_that_fills_the_whole_decision(
    replicated: tuple[rs.RedisServer, rs.RedisServer, rs.RedisServer],
) -> None:
    a, a2, b = replicated
    clock = ManualClock()
    store = ShardedRedisStore(
        [Shard(a.url, replicas=[a2.url]), Shard(b.url)], socket_timeout=TIMEOUT
    )
    limiter = Limiter(store, clock=clock, fail_open=False)
    key = keys_by_shard(store)[Shard(a.url).name][0]
    first = limiter.hit(key, "2/minute")
    limiter.hit(key, "2/minute")
    clock.advance(15)
    reset_stats(a, a2, b)
    rejected = limiter.hit(key, "2/minute")
    assert (script_calls(a), script_calls(a2), script_calls(b)) == (1, 0, 0)
    assert not rejected.allowed
    assert (rejected.remaining, rejected.limit, rejected.reset_at) == (0, 2, first.reset_at)
    assert rejected.retry_after == pytest.approx(45.0)
    headers = rejected.headers()
    assert headers["X-RateLimit-Remaining"] == "0"
    assert headers["Retry-After"] == "45"


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_stale_replica_holding_an_ended_window_never_rejects(
    replicated: tuple[rs.RedisServer, rs.RedisServer, rs.RedisServer], algorithm: str
) -> None:
    a, a2, b = replicated
    clock = ManualClock()
    store = ShardedRedisStore(
        [Shard(a.url, replicas=[a2.url]), Shard(b.url)], socket_timeout=TIMEOUT
    )
    limiter = Limiter(store, clock=clock, fail_open=False)
    key = keys_by_shard(store)[Shard(a.url).name][0]
    while limiter.hit(key, "3/minute", algorithm=algorithm).allowed:
        pass
    rs.wait_replicated(a)
    assert not limiter.peek(key, "3/minute", algorithm=algorithm).allowed  # the replica agrees
    # Cut the replica off (its primary now points nowhere): it keeps serving what it holds.
    a2.client().replicaof("127.0.0.1", rs.free_port())
    clock.advance(121)  # every window, bucket and log entry of the full state has ended
    replica_keys = a2.client().keys("rk*")
    assert replica_keys, "the replica should still hold the ended state"
    stale = limiter.peek(key, "3/minute", algorithm=algorithm)
    assert stale.allowed and stale.remaining == 3 and not stale.degraded
    assert limiter.hit(key, "3/minute", algorithm=algorithm).allowed  # on the primary
    assert limiter.peek(key, "3/minute", algorithm=algorithm).allowed  # replica still stale
    assert a2.client().keys("rk*") == replica_keys


def test_peek_falls_back_to_the_primary_and_skips_a_failed_replica_for_a_while(
    replicated: tuple[rs.RedisServer, rs.RedisServer, rs.RedisServer],
) -> None:
    a, a2, b = replicated
    clock = ManualClock()
    store = ShardedRedisStore(
        [Shard(a.url, replicas=[a2.url]), Shard(b.url)], socket_timeout=TIMEOUT
    )
    limiter = Limiter(store, clock=clock, fail_open=False)
    key = keys_by_shard(store)[Shard(a.url).name][0]
    limiter.hit(key, "5/minute")
    a2.kill()
    peek = limiter.peek(key, "5/minute")
    assert (peek.remaining, peek.degraded) == (4, False)
    assert limiter.stats()["store_errors"] == 0
    a2.start()  # back, resynced from the primary
    reset_stats(a, a2)
    assert limiter.peek(key, "5/minute").remaining == 4
    assert (script_calls(a), script_calls(a2)) == (1, 0)  # still skipped: cooling down
    clock.advance(1.001)
    rs.wait_replicated(a)
    assert limiter.peek(key, "5/minute").remaining == 4
    assert script_calls(a) == 1 and script_calls(a2) >= 1  # (>= : the restarted replica reloads)


def test_replicas_take_turns(primary_replica: tuple[rs.RedisServer, rs.RedisServer]) -> None:
    primary, first = primary_replica
    second = rs.start_replica(primary)
    try:
        store = ShardedRedisStore(
            [Shard(primary.url, replicas=[first.url, second.url])], socket_timeout=TIMEOUT
        )
        limiter = Limiter(store, clock=ManualClock(), fail_open=False)
        limiter.hit("k", "5/minute")
        rs.wait_replicated(primary)
        for _ in range(2):  # each replica's first call loads the script
            limiter.peek("k", "5/minute")
        reset_stats(primary, first, second)
        for _ in range(4):
            limiter.peek("k", "5/minute")
        assert (script_calls(primary), script_calls(first), script_calls(second)) == (0, 2, 2)
    finally:
        second.stop()


# -- growth and failure ---------------------------------------------------------------------


def test_adding_a_shard_moves_some_keys_which_start_fresh(
    shard_urls: list[str], fresh_redis: rs.RedisServer
) -> None:
    clock = ManualClock()
    old = ShardedRedisStore([Shard(u) for u in shard_urls], socket_timeout=TIMEOUT)
    grown = ShardedRedisStore(
        [*(Shard(u) for u in shard_urls), Shard(fresh_redis.url)], socket_timeout=TIMEOUT
    )
    before = Limiter(old, clock=clock, fail_open=False)
    after = Limiter(grown, clock=clock, fail_open=False)
    keys = [f"user:{i}" for i in range(90)]
    for key in keys:
        before.hit(key, "3/minute", cost=3)
    moved = 0
    for key in keys:
        decision = after.peek(key, "3/minute")
        if grown.shard_of(key).url == fresh_redis.url:
            moved += 1
            assert decision.allowed and decision.remaining == 3  # a fresh window
        else:
            assert old.shard_of(key) == grown.shard_of(key)
            assert not decision.allowed  # state kept
    assert 15 <= moved <= 45  # about a third of the keys go to the third shard


def test_losing_one_shard_degrades_only_its_keys(shard_urls: list[str]) -> None:
    dead = rs.RedisServer()
    clock = ManualClock()
    store = ShardedRedisStore([Shard(shard_urls[0]), Shard(dead.url)], socket_timeout=TIMEOUT)
    limiter = Limiter(store, clock=clock)
    groups = keys_by_shard(store, 40)
    alive_keys, dead_keys = groups[Shard(shard_urls[0]).name], groups[Shard(dead.url).name]
    dead.stop()
    for round_ in range(3):
        for key in dead_keys[:5]:
            assert limiter.hit(key, "100/minute").degraded
        for key in alive_keys[:5]:
            decision = limiter.hit(key, "100/minute")
            assert not decision.degraded and decision.remaining == 99 - round_
        clock.advance(0.2)
    stats = limiter.stats()
    assert stats["breakers_open"] == 1 and stats["breaker"] == "open"
    assert stats["breaker_skips"] > 0


def test_fail_closed_names_the_shard(shard_urls: list[str]) -> None:
    port = rs.free_port()
    store = ShardedRedisStore([Shard(f"redis://127.0.0.1:{port}/0")])
    limiter = Limiter(store, clock=ManualClock(), fail_open=False)
    with pytest.raises(StoreUnavailable, match=f"shard 127.0.0.1:{port}/0"):
        limiter.hit("k", "1/second")


def test_async_routes_like_sync(
    replicated: tuple[rs.RedisServer, rs.RedisServer, rs.RedisServer],
) -> None:
    a, a2, b = replicated
    clock = ManualClock()

    async def run() -> tuple[int, int, int, list[tuple[bool, int, float]]]:
        store = ShardedRedisStore(
            [Shard(a.url, replicas=[a2.url]), Shard(b.url)], socket_timeout=TIMEOUT
        )
        limiter = AsyncLimiter(store, clock=clock, fail_open=False)
        key = keys_by_shard(store)[Shard(a.url).name][0]
        out = []
        for _ in range(3):
            d = await limiter.hit(key, "2/minute")
            out.append((d.allowed, d.remaining, d.reset_at))
        rs.wait_replicated(a)
        await limiter.peek(key, "2/minute")  # loads the script on the replica
        reset_stats(a, a2, b)
        p = await limiter.peek(key, "2/minute")
        out.append((p.allowed, p.remaining, p.reset_at))
        await limiter.refund(key, "2/minute")
        await limiter.reset(key, "2/minute")
        calls = (script_calls(a), script_calls(a2), script_calls(b))
        await store.aclose()
        return (*calls, out)

    a_calls, a2_calls, b_calls, out = asyncio.run(run())
    end = clock() + 60
    assert out == [(True, 1, end), (True, 0, end), (False, 0, end), (False, 0, end)]
    assert (a_calls, a2_calls, b_calls) == (1, 1, 0)  # refund on the primary, peek on the replica


@pytest.mark.parametrize(
    "store",
    [
        pytest.param(lambda: ShardedRedisStore([Shard("redis://127.0.0.1:1/0")]), id="sharded"),
        pytest.param(lambda: RedisClusterStore("redis://127.0.0.1:1"), id="cluster"),
    ],
)
def test_sync_and_async_surfaces_match(store: object) -> None:
    built = store()  # type: ignore[operator]
    assert isinstance(built, Store) and isinstance(built, AsyncStore)
    public = {name for name in dir(built) if not name.startswith("_")}
    for sync, async_ in (("execute", "execute_async"), ("close", "aclose")):
        assert {sync, async_} <= public
    # only the sharded store has independent parts (one breaker per shard)
    assert isinstance(built, Partitioned) == isinstance(built, ShardedRedisStore)
