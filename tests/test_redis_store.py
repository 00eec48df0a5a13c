"""RedisStore against a real redis-server: script loading, NOSCRIPT, TTLs, errors, async."""

from __future__ import annotations

import asyncio

import pytest
import redis

from ratekeeper import (
    AsyncLimiter,
    ConfigError,
    Limiter,
    ManualClock,
    MemoryStore,
    RedisStore,
    StoreUnavailable,
)
from ratekeeper.algorithms import Outcome
from ratekeeper.plan import Op
from ratekeeper.stores.redis.keys import redis_key
from tests import redis_servers as rs

ALGORITHMS = ["fixed_window", "token_bucket", "gcra", "sliding_window", "sliding_log"]


def test_fixed_window_counts_and_resets_by_stored_end(redis_url: str) -> None:
    clock = ManualClock()
    limiter = Limiter(RedisStore(redis_url, socket_timeout=5), clock=clock, fail_open=False)
    first = limiter.hit("user:1", "2/minute")
    assert (first.allowed, first.remaining) == (True, 1)
    clock.advance(10)
    assert limiter.hit("user:1", "2/minute").remaining == 0
    rejected = limiter.hit("user:1", "2/minute")
    assert not rejected.allowed
    assert rejected.reset_at == first.reset_at
    assert rejected.retry_after == pytest.approx(50.0)
    clock.advance(50)
    assert limiter.hit("user:1", "2/minute").allowed


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_noscript_after_script_flush_reloads_transparently(redis_url: str, algorithm: str) -> None:
    clock = ManualClock()
    limiter = Limiter(RedisStore(redis_url, socket_timeout=5), clock=clock, fail_open=False)
    assert limiter.hit("k", "5/minute", algorithm=algorithm).remaining == 4
    redis.Redis.from_url(redis_url).script_flush()
    assert limiter.hit("k", "5/minute", algorithm=algorithm).remaining == 3
    redis.Redis.from_url(redis_url).script_flush()
    assert limiter.peek("k", "5/minute", algorithm=algorithm).remaining == 3
    redis.Redis.from_url(redis_url).script_flush()
    limiter.refund("k", "5/minute", algorithm=algorithm)
    assert limiter.peek("k", "5/minute", algorithm=algorithm).remaining == 4
    assert limiter.stats()["store_errors"] == 0


def test_noscript_after_restart_reloads(fresh_redis: rs.RedisServer) -> None:
    clock = ManualClock()
    limiter = Limiter(RedisStore(fresh_redis.url, socket_timeout=5), clock=clock, fail_open=False)
    for algorithm in ALGORITHMS:
        assert limiter.hit("k", "5/minute", algorithm=algorithm).remaining == 4
    fresh_redis.restart()
    # the restarted server is empty: fresh state, and each script is loaded again
    for algorithm in ALGORITHMS:
        assert limiter.hit("k", "5/minute", algorithm=algorithm).remaining == 4
        assert limiter.hit("k", "5/minute", algorithm=algorithm).remaining == 3


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("start", [1_700_000_000.0, 1_000.0, 9_000_000_000.0])
def test_every_written_key_gets_a_relative_ttl(
    redis_url: str, algorithm: str, start: float
) -> None:
    # the ManualClock is far from Redis' own clock: TTLs must still be "period + 1 s" from now
    clock = ManualClock(start)
    limiter = Limiter(RedisStore(redis_url, socket_timeout=5), clock=clock, fail_open=False)
    stack = "3/second; 10/minute; 100/hour"
    limiter.hit("k", stack, algorithm=algorithm, cost=2)
    client = redis.Redis.from_url(redis_url)
    keys = client.keys()
    assert len(keys) == 3
    periods = {b"1s": 1000, b"1m": 60_000, b"1h": 3_600_000}
    for key in keys:
        ttl = client.pttl(key)
        # a sliding window's newest bucket weighs in until the end of the next period
        factor = 2 if algorithm == "sliding_window" else 1
        longest = factor * periods[key.rsplit(b":", 1)[1]] + 1000
        assert 1000 < ttl <= longest, (key, ttl)
    clock.advance(0.5)
    client.persist(keys[0])
    limiter.refund("k", stack, algorithm=algorithm)
    assert all(client.pttl(k) > 0 for k in client.scan_iter())  # the persisted key got one again


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_stale_state_that_redis_still_holds_never_rejects(redis_url: str, algorithm: str) -> None:
    clock = ManualClock()
    limiter = Limiter(RedisStore(redis_url, socket_timeout=5), clock=clock, fail_open=False)
    rate = "4/minute; 6/hour"
    while limiter.hit("k", rate, algorithm=algorithm).allowed:
        pass
    clock.advance(2 * 3600)  # all state has stopped mattering by our clock, not by Redis' TTL
    client = redis.Redis.from_url(redis_url)
    assert client.dbsize() == 2  # the ended state is still stored
    fresh = limiter.hit("k", rate, algorithm=algorithm)
    assert fresh.allowed
    assert fresh.remaining == 3
    assert fresh == Limiter(MemoryStore(), clock=clock).hit("k", rate, algorithm=algorithm)


KEYS = [
    "a", "a ", " a", "A", "ключ", "😀", "{a}", "a}", "{", "}", "{}", "%", "%7B", "%7D", "%25",
    "#x", "%23x", "a}b", "a%7Db", "x" * 200, "x" * 201, "k" * 10_000, "k" * 10_000 + "x",
    "\n", "\t", "\x00", "null",
]  # fmt: skip


def test_keys_never_collide_and_share_one_hash_tag(redis_url: str) -> None:
    from redis.crc import key_slot

    clock = ManualClock()
    store = RedisStore(redis_url, socket_timeout=5)
    limiter = Limiter(store, clock=clock, fail_open=False)
    stack = "1/minute; 5/hour"
    for key in KEYS:
        assert limiter.hit(key, stack).allowed, key
        plan = limiter._core.plan("hit", key, stack, "fixed_window", 1, None, None)
        slots = {key_slot(k.encode()) for k in store.codec.keys(plan)}
        assert len(slots) == 1, key
    for key in KEYS:
        assert not limiter.hit(key, stack).allowed, key
    assert redis.Redis.from_url(redis_url).dbsize() == 2 * len(KEYS)


def test_sliding_log_takes_large_costs(redis_url: str) -> None:
    clock = ManualClock()
    limiter = Limiter(RedisStore(redis_url, socket_timeout=5), clock=clock, fail_open=False)
    memory = Limiter(MemoryStore(), clock=clock)
    for cost in (2500, 400, 200):
        got = limiter.hit("k", "3000/minute", algorithm="sliding_log", cost=cost)
        assert got == memory.hit("k", "3000/minute", algorithm="sliding_log", cost=cost)
        clock.advance(1)
    client = redis.Redis.from_url(redis_url)
    assert client.llen(client.keys()[0]) == 2900


def test_down_redis_raises_store_unavailable_from_driver_error() -> None:
    store = RedisStore(f"redis://127.0.0.1:{rs.free_port()}/0")
    limiter = Limiter(store, clock=ManualClock(), fail_open=False)
    with pytest.raises(StoreUnavailable) as info:
        limiter.hit("k", "1/second")
    assert isinstance(info.value.__cause__, StoreUnavailable | redis.RedisError)
    with pytest.raises(StoreUnavailable) as direct:
        store.execute(limiter._core.plan("hit", "k", "1/second", "fixed_window", 1, None, None))
    assert isinstance(direct.value.__cause__, redis.RedisError)


def test_down_redis_fails_open_by_default() -> None:
    limiter = Limiter(RedisStore(f"redis://127.0.0.1:{rs.free_port()}/0"), clock=ManualClock())
    decision = limiter.hit("k", "1/second")
    assert decision.allowed and decision.degraded


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "needs a url"),
        ({"url": "redis://127.0.0.1:1/0", "socket_timeout": 0}, "socket_timeout=0"),
        ({"url": "redis://127.0.0.1:1/0", "prefix": "a{b"}, "prefix 'a{b'"),
        ({"url": "http://nowhere"}, "http://nowhere"),
    ],
)
def test_bad_settings_name_the_value(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        RedisStore(**kwargs)  # type: ignore[arg-type]


def test_reset_deletes_every_key_of_the_stack(redis_url: str) -> None:
    clock = ManualClock()
    limiter = Limiter(RedisStore(redis_url, socket_timeout=5), clock=clock, fail_open=False)
    limiter.hit("k", "1/minute; 10/hour")
    client = redis.Redis.from_url(redis_url)
    assert client.dbsize() == 2
    limiter.reset("k", "1/minute; 10/hour")
    assert client.dbsize() == 0
    assert limiter.hit("k", "1/minute; 10/hour").allowed


def test_client_and_prefix_are_honoured(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    limiter = Limiter(RedisStore(client=client, prefix="app1:"), clock=ManualClock())
    limiter.hit("k", "3/minute")
    assert client.exists(redis_key("app1:", "k", "f:1m")) == 1


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_async_limiter_matches_memory(redis_url: str, algorithm: str) -> None:
    clock = ManualClock()

    async def run() -> list[tuple[bool, int, float, float]]:
        store = RedisStore(redis_url, socket_timeout=5)
        limiter = AsyncLimiter(store, clock=clock, fail_open=False)
        out = []
        for _ in range(5):
            d = await limiter.hit("k", "3/minute", algorithm=algorithm)
            out.append((d.allowed, d.remaining, d.reset_at, d.retry_after))
            clock.advance(7)
        peek = await limiter.peek("k", "3/minute", algorithm=algorithm)
        out.append((peek.allowed, peek.remaining, peek.reset_at, peek.retry_after))
        await limiter.refund("k", "3/minute", algorithm=algorithm)
        await limiter.reset("k", "3/minute", algorithm=algorithm)
        await store.aclose()
        return out

    got = asyncio.run(run())
    clock2 = ManualClock()
    memory = Limiter(MemoryStore(), clock=clock2)
    want = []
    for _ in range(5):
        d = memory.hit("k", "3/minute", algorithm=algorithm)
        want.append((d.allowed, d.remaining, d.reset_at, d.retry_after))
        clock2.advance(7)
    p = memory.peek("k", "3/minute", algorithm=algorithm)
    want.append((p.allowed, p.remaining, p.reset_at, p.retry_after))
    assert got == want


OPS: tuple[Op, ...] = ("hit", "hit", "peek", "refund", "hit", "reset")


def test_execute_and_execute_async_give_the_same_outcomes(redis_url: str) -> None:
    clock = ManualClock()
    sync_store = RedisStore(redis_url, prefix="sync", socket_timeout=5)
    async_store = RedisStore(redis_url, prefix="async", socket_timeout=5)
    planner = Limiter(MemoryStore(), clock=clock)._core
    plans = []
    for i in range(60):
        algorithm = ALGORITHMS[i % len(ALGORITHMS)]
        op = OPS[i % len(OPS)]
        plans.append(
            planner.plan(op, f"k{i % 3}", "3/second; 5/minute", algorithm, 1 + i % 2, None, None)
        )
        clock.advance(0.1)

    async def run_async() -> list[tuple[Outcome, ...]]:
        out = [await async_store.execute_async(plan) for plan in plans]
        await async_store.aclose()
        return out

    assert [sync_store.execute(plan) for plan in plans] == asyncio.run(run_async())
