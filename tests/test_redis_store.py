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
from ratekeeper.stores.keys import redis_key
from tests import redis_servers as rs

ALGORITHMS = ["fixed_window"]


def test_fixed_window_counts_and_resets_by_stored_end(redis_url: str) -> None:
    clock = ManualClock()
    limiter = Limiter(RedisStore(redis_url), clock=clock, fail_open=False)
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


def test_noscript_after_script_flush_reloads_transparently(redis_url: str) -> None:
    clock = ManualClock()
    limiter = Limiter(RedisStore(redis_url), clock=clock, fail_open=False)
    assert limiter.hit("k", "5/minute").remaining == 4
    redis.Redis.from_url(redis_url).script_flush()
    assert limiter.hit("k", "5/minute").remaining == 3
    assert limiter.peek("k", "5/minute").remaining == 3
    redis.Redis.from_url(redis_url).script_flush()
    assert limiter.peek("k", "5/minute").remaining == 3
    assert limiter.stats()["store_errors"] == 0


def test_noscript_after_restart_reloads(fresh_redis: rs.RedisServer) -> None:
    clock = ManualClock()
    limiter = Limiter(RedisStore(fresh_redis.url), clock=clock, fail_open=False)
    assert limiter.hit("k", "5/minute").remaining == 4
    fresh_redis.restart()
    # the restarted server is empty: a fresh window, and the script is loaded again
    assert limiter.hit("k", "5/minute").remaining == 4
    assert limiter.hit("k", "5/minute").remaining == 3


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
    limiter = Limiter(RedisStore(redis_url), clock=clock, fail_open=False)
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
    assert client.exists(redis_key("app1:", "k", "f:3/1m")) == 1


def test_async_limiter_matches_memory(redis_url: str) -> None:
    clock = ManualClock()

    async def run() -> list[tuple[bool, int, float, float]]:
        store = RedisStore(redis_url)
        limiter = AsyncLimiter(store, clock=clock, fail_open=False)
        out = []
        for _ in range(5):
            d = await limiter.hit("k", "3/minute")
            out.append((d.allowed, d.remaining, d.reset_at, d.retry_after))
            clock.advance(7)
        peek = await limiter.peek("k", "3/minute")
        out.append((peek.allowed, peek.remaining, peek.reset_at, peek.retry_after))
        await limiter.refund("k", "3/minute")
        await limiter.reset("k", "3/minute")
        await store.aclose()
        return out

    got = asyncio.run(run())
    clock2 = ManualClock()
    memory = Limiter(MemoryStore(), clock=clock2)
    want = []
    for _ in range(5):
        d = memory.hit("k", "3/minute")
        want.append((d.allowed, d.remaining, d.reset_at, d.retry_after))
        clock2.advance(7)
    p = memory.peek("k", "3/minute")
    want.append((p.allowed, p.remaining, p.reset_at, p.retry_after))
    assert got == want
