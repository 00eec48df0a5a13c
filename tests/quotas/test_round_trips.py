"""A plan served from the cache costs no Redis round trip: on a Redis store with a Redis plan
source, a decision on a cached plan is the one script call a plain rate's decision is."""

from __future__ import annotations

import asyncio

import redis

from ratekeeper import AsyncLimiter, Limiter, RedisStore
from ratekeeper.quotas import Plans, Quotas, RedisSource

PLANS = Plans.from_dict(
    {"default": "free", "plans": {"free": {"api": "100/hour"}, "pro": {"api": "5000/hour"}}}
)


def calls(client: redis.Redis) -> dict[str, int]:
    """Calls per command Redis has served since the last ``CONFIG RESETSTAT``."""
    stats = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


def scripts(counted: dict[str, int]) -> int:
    return sum(n for name, n in counted.items() if name in ("evalsha", "eval", "fcall"))


def test_a_cached_plan_adds_no_round_trip(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    source = RedisSource(client=client)
    source.set_plan("acme", "pro")
    quotas = Quotas(PLANS, source, ttl=3600, listen=False)
    limiter = Limiter(RedisStore(client=client), fail_open=False, quotas=quotas)
    assert limiter.hit("acme", "plan:api").limit == 5000  # the lookup, and the script loaded
    limiter.hit("bob", "100/hour")
    client.config_resetstat()
    for _ in range(50):
        assert limiter.hit("acme", "plan:api").allowed
    plan_calls = calls(client)
    client.config_resetstat()
    for _ in range(50):
        assert limiter.hit("bob", "100/hour").allowed
    rate_calls = calls(client)
    assert "hgetall" not in plan_calls  # the source was not asked again
    assert scripts(plan_calls) == scripts(rate_calls) == 50
    assert plan_calls == rate_calls  # the same commands, inside the script too
    assert quotas.stats()["lookups"] == 1


def test_the_async_limiter_neither(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    RedisSource(client=client).set_plan("acme", "pro")

    async def main() -> dict[str, int]:
        source = RedisSource(redis_url)
        quotas = Quotas(PLANS, source, ttl=3600, listen=False)
        limiter = AsyncLimiter(RedisStore(redis_url, batching=None), quotas=quotas)
        assert (await limiter.hit("acme", "plan:api")).limit == 5000
        client.config_resetstat()
        for _ in range(20):
            assert (await limiter.hit("acme", "plan:api")).allowed
        return calls(client)

    counted = asyncio.run(main())
    assert "hgetall" not in counted
    assert scripts(counted) == 20
