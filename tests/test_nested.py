"""Nested calls: the documented timeline on every store, what names the decision, one store
round trip each (counted by Redis), sync and async alike, failing open, and bad levels
refused with a clear error."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import redis

from ratekeeper import (
    AsyncLimiter,
    ConfigError,
    Limiter,
    ManualClock,
    RedisClusterStore,
    RedisStore,
    SentinelStore,
    StoreUnavailable,
)
from ratekeeper.nested import MAX_LEVELS, Level
from tests import redis_servers as rs
from tests.nested_stores import NESTED_STORES, close, nested_store

START = 1_699_999_980.0  # on a minute of the epoch


@pytest.fixture(params=NESTED_STORES)
def limiter(request: pytest.FixtureRequest) -> Iterator[Limiter]:
    store = nested_store(request.param, request)
    yield Limiter(store, clock=ManualClock(START), fail_open=False)
    close(store)


def test_the_documented_timeline(limiter: Limiter) -> None:
    """nested.py's timeline: org 3/minute, users 2/minute."""
    clock = limiter.clock
    assert isinstance(clock, ManualClock)

    def call(user: str) -> Any:
        d = limiter.nested([Level("org", "3/minute"), Level(user, "2/minute")])
        clock.advance(1)
        return d

    a, b, c, d, e = call("user:1"), call("user:1"), call("user:1"), call("user:2"), call("user:3")
    assert [x.allowed for x in (a, b, c, d, e)] == [True, True, False, True, False]
    assert [r.remaining for r in a.levels] == [2, 1] and a.level == 1
    assert c.rejected_by == 1 and c.retry_after == 58 and c.levels[0].remaining == 1
    assert d.levels[0].remaining == 0 and d.level == 0  # org is the tightest now
    assert e.rejected_by == 0 and e.retry_after == 56
    assert e.levels[1].allowed and e.levels[1].remaining == 2  # user:3: looked at, not charged
    assert limiter.nested([Level("user:3", "2/minute")]).remaining == 1  # its own counter: 2 left


def test_an_inner_counter_belongs_to_its_outer_key(limiter: Limiter) -> None:
    """user:42 under two orgs is two counters (on every store: Cluster keeps each call on the
    outer key's slot); the outer key's own counter is the one ``hit`` uses."""
    for org in ("org:acme", "org:beta"):
        d = limiter.nested([Level(org, "10/minute"), Level("user:42", "1/minute")])
        assert d.allowed
    assert not limiter.nested(
        [Level("org:acme", "10/minute"), Level("user:42", "1/minute")]
    ).allowed
    assert limiter.hit("org:acme", "10/minute").remaining == 8  # 1 admitted + this one


def test_the_rejecting_level_that_frees_up_last_decides(limiter: Limiter) -> None:
    fast, slow = Level("a", "1/second", name="fast"), Level("b", "1/hour", name="slow")
    assert limiter.nested([fast, slow]).allowed
    d = limiter.nested([fast, slow])
    assert not d.allowed and {i for i, x in enumerate(d.levels) if not x.allowed} == {0, 1}
    assert d.rejected_by == 1 and d.retry_after == 3600
    headers = d.headers()
    assert headers["Retry-After"] == "3600" and headers["RateLimit"] == '"slow";r=0;t=3600'


def test_the_tightest_level_names_the_headers(limiter: Limiter) -> None:
    org = Level("org", "10000/hour", name="org")
    key = Level("key:k1", "100/minute", name="key", algorithm="token_bucket")
    d = limiter.nested([org, key], cost=10)
    assert d.allowed and d.level == 1 and d.remaining == 90
    assert d.headers()["RateLimit"] == '"key";r=90;t=6'
    tokens = Level("org", "100000/minute", algorithm="gcra", name="tokens")
    d = limiter.nested([replace(org, cost=1), replace(key, cost=1), tokens], cost=5000)
    assert d.level == 2  # 95,000 tokens left is 19 requests of 5000: fewer than 89 or 9,990


def test_a_look_of_cost_zero_writes_nothing(limiter: Limiter) -> None:
    clock = limiter.clock
    assert isinstance(clock, ManualClock)
    look = limiter.nested([Level("org", "5/minute"), Level("u", "5/minute")], cost=0)
    assert look.allowed and [d.remaining for d in look.levels] == [5, 5]
    clock.advance(30)
    d = limiter.nested([Level("org", "5/minute"), Level("u", "5/minute")])
    assert d.reset_at == START + 90  # the window opened now, not at the look


async def async_sequence(store: Any, clock: ManualClock, levels: list[Level]) -> list[Any]:
    limiter = AsyncLimiter(store, clock=clock, fail_open=False)
    out: list[Any] = []
    for i in range(5):
        out.append(await limiter.nested(levels, cost=1 + i % 2))
    r = await limiter.reserve(levels[:1], 2, ttl=10)
    out += [r.decision, await limiter.settle(r, 1), await limiter.cancel(r)]
    out.append(await limiter.nested(levels, cost=0))
    aclose = getattr(store, "aclose", None)
    if aclose is not None:
        await aclose()
    return out


@pytest.mark.parametrize("kind", ["memory", "redis", "sharded", "cluster-compact", "rollout"])
def test_async_limiters_answer_as_sync_ones(kind: str, request: pytest.FixtureRequest) -> None:
    clock = ManualClock(START)
    sync_store, async_store = nested_store(kind, request), nested_store(kind, request)
    sync = Limiter(sync_store, clock=clock, fail_open=False)
    levels = [Level("org", "100/minute"), Level("u", "9/minute", algorithm="gcra", burst=3)]
    want: list[Any] = [sync.nested(levels, cost=1 + i % 2) for i in range(5)]
    r = sync.reserve(levels[:1], 2, ttl=10)
    want += [r.decision, sync.settle(r, 1), sync.cancel(r), sync.nested(levels, cost=0)]
    assert asyncio.run(async_sequence(async_store, clock, levels)) == want
    close(sync_store)


def test_one_round_trip_per_nested_decision_and_per_settle(redis_url: str) -> None:
    """Counted by Redis: one EVALSHA per call, whatever the levels (nothing else sent)."""
    client = redis.Redis.from_url(redis_url)
    limiter = Limiter(RedisStore(redis_url, socket_timeout=5), clock=ManualClock(START))
    levels = [
        Level("org", "10000/hour"),
        Level("user:42", "1000/hour", algorithm="sliding_window"),
        Level("key:k1", "100/minute", algorithm="token_bucket"),
        Level("key:k1", "60/minute", cost=1),
    ]
    limiter.nested(levels)  # loads the script (NOSCRIPT, then EVAL) before counting
    for call in (
        lambda: limiter.nested(levels),
        lambda: limiter.nested([replace(lv, rate="1/hour") for lv in levels], cost=5),  # rejected
        lambda: limiter.reserve(levels, 30),
    ):
        client.config_resetstat()
        call()
        stats = client.info("commandstats")
        assert stats["cmdstat_evalsha"]["calls"] == 1
        assert not {"cmdstat_eval", "cmdstat_multi", "cmdstat_exec"} & set(stats)
    r = limiter.reserve(levels, 30)
    client.config_resetstat()
    limiter.settle(r, 120)
    assert client.info("commandstats")["cmdstat_evalsha"]["calls"] == 1
    client.close()


def test_a_sentinel_store_runs_nested_calls_and_reservations(
    sentinel_group: rs.SentinelGroup,
) -> None:
    store = SentinelStore(sentinel_group.service, sentinel_group.urls, socket_timeout=5)
    limiter = Limiter(store, clock=ManualClock(START), fail_open=False)
    levels = [Level("org", "5/minute"), Level("user:1", "3/minute")]
    assert [limiter.nested(levels).allowed for _ in range(4)] == [True] * 3 + [False]
    r = limiter.reserve([Level("org", "5/minute")], 2)
    assert r.allowed and limiter.settle(r, 1).status == "settled"
    assert limiter.nested([Level("org", "5/minute")], cost=0).remaining == 1
    primary = sentinel_group.primary().client()
    assert primary.info("commandstats")["cmdstat_evalsha"]["calls"] >= 5
    store.close()


# ---------------------------------------------------------------- failing open


def test_a_dead_store_fails_open_or_closed_as_configured(fresh_redis: rs.RedisServer) -> None:
    store = RedisStore(fresh_redis.url, socket_timeout=0.2)
    levels = [Level("org", "5/minute"), Level("u", "1/minute")]
    limiter = Limiter(store, clock=ManualClock(START))
    r = limiter.reserve(levels, 1)
    fresh_redis.stop()
    d = limiter.nested(levels)
    assert d.allowed and d.degraded and all(x.degraded for x in d.levels)
    degraded = limiter.reserve(levels, 1)
    assert degraded.allowed and degraded.degraded
    assert limiter.settle(r, 3).status == "degraded"
    stats = limiter.stats()
    assert stats["degraded"] == 2 and stats["store_errors"] == 3 and stats["breaker"] == "open"
    strict = Limiter(store, clock=ManualClock(START), fail_open=False)
    with pytest.raises(StoreUnavailable):
        strict.nested(levels)
    with pytest.raises(StoreUnavailable):
        strict.settle(r, 1)


def test_a_store_without_nested_calls_is_named() -> None:
    class Plain:
        def execute(self, plan: Any) -> tuple[Any, ...]:
            return ()

    with pytest.raises(ConfigError, match="cannot run nested calls"):
        Limiter(Plain()).nested([Level("a", "1/s")])  # type: ignore[arg-type]


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("levels", "match"),
    [
        ([], "has 0 levels"),
        ([Level(f"k{i}", "1/s") for i in range(MAX_LEVELS + 1)], "has 17 levels"),
        ([Level(f"k{i}", "1/s") for i in range(50)], "has 50 levels"),
        (Level("a", "1/s"), "expected a list of Level"),
        ("a", "expected a list of Level"),
        ({"key": "a", "rate": "1/s"}, "expected a list of Level"),
        ([Level("a", "1/s"), ("b", "1/s")], "level 1 is"),
        ([Level("a", "1/s"), Level("b", "1/s", cost=10**12 + 1)], "cost=1000000000001 is inv"),
        ([Level("", "1/s")], "key '' is invalid"),
        ([Level(7, "1/s")], "key 7 is invalid"),  # type: ignore[arg-type]
        ([Level("a", "0/s")], "admits nothing"),
        ([Level("a", "1/s", algorithm="leaky")], "algorithm 'leaky' is unknown"),
        ([Level("a", "1/s", burst=3)], "option 'burst' does not apply"),
        ([Level("a", "1/s"), Level("b", "1/s", cost=-1)], "cost=-1 is invalid"),
        ([Level("a", "1/s"), Level("b", "1/s", cost=1.5)], "cost=1.5 is invalid"),  # type: ignore[arg-type]
        ([Level("a", "1/s"), Level("b", "1/s", cost=True)], "cost=True is invalid"),
        ([Level("a", "1/s", debt=-1)], "debt=-1 is invalid"),
        ([Level("a", "1/s", debt=float("nan"))], "debt=nan is invalid"),  # type: ignore[arg-type]
        ([Level("a", "1/s", debt=10**13)], "debt=10000000000000 is invalid"),
        ([Level("a", "1/s", algorithm="sliding_log", debt=10**6)], "too large for sliding_log"),
        ([Level("a", "1/s", name="")], "name='' is invalid"),
    ],
)
def test_bad_levels_are_refused_naming_the_problem(levels: Any, match: str) -> None:
    limiter = Limiter(clock=ManualClock(START))
    with pytest.raises(ValueError, match=match):  # ConfigError, RateSpecError for a rate
        limiter.nested(levels)
    with pytest.raises(ValueError, match=match):
        limiter.reserve(levels, 1)
    assert limiter.store.execute_nested is not None and len(limiter.store) == 0  # type: ignore[attr-defined]


@pytest.mark.parametrize("cost", [-1, 1.5, True, "1", None, 10**12 + 1])
def test_bad_costs_are_refused(cost: Any) -> None:
    with pytest.raises(ValueError, match="cost"):
        Limiter().nested([Level("a", "1/s")], cost=cost)


def test_cluster_keys_of_a_call_share_the_outer_keys_slot(cluster_url: str) -> None:
    store = RedisClusterStore(cluster_url, socket_timeout=5)
    limiter = Limiter(store, clock=ManualClock(START), fail_open=False)
    levels = [Level("{org}:acme", "5/minute"), Level("user:4}2", "3/minute"), Level("k", "9/h")]
    assert limiter.reserve(levels, 1).allowed
    client = redis.RedisCluster.from_url(cluster_url)
    keys = [k for node in client.get_primaries() for k in client.keys(target_nodes=node)]
    assert len(keys) == 5 and len({client.keyslot(k) for k in keys}) == 1
    client.close()
    store.close()


def test_a_flushed_script_cache_costs_nothing_but_a_resend(redis_url: str) -> None:
    """After SCRIPT FLUSH (a restart, a failover) the nested script is sent again as EVAL,
    sync and batched alike, and the decisions go on as if nothing happened."""
    client = redis.Redis.from_url(redis_url)
    store = RedisStore(redis_url, socket_timeout=5)
    clock = ManualClock(START)
    sync = Limiter(store, clock=clock, fail_open=False)
    levels = [Level("org", "10/minute"), Level("u", "5/minute")]
    assert sync.nested(levels).remaining == 4
    client.script_flush()
    assert sync.nested(levels).remaining == 3

    async def batched() -> list[int]:
        limiter = AsyncLimiter(store, clock=clock, fail_open=False)
        client.script_flush()
        decisions = await asyncio.gather(*(limiter.nested(levels) for _ in range(4)))
        await store.aclose()
        return sorted(d.levels[1].remaining for d in decisions if d.allowed)

    assert asyncio.run(batched()) == [0, 1, 2]  # 3 of 4 admitted: u had 3 left
    assert sync.stats()["store_errors"] == 0
    store.close()
    client.close()


def test_refund_nested_gives_each_levels_cost_back(limiter: Limiter) -> None:
    levels = [Level("org", "10/minute"), Level("u", "5/minute"), Level("k", "9/h", cost=2)]
    limiter.nested(levels, cost=3)
    limiter.refund_nested(levels, cost=3)
    probe = [replace(lv, cost=0) for lv in levels]
    assert [d.remaining for d in limiter.nested(probe, cost=0).levels] == [10, 5, 9]
    limiter.refund_nested(levels, cost=3)  # never above full
    assert [d.remaining for d in limiter.nested(probe, cost=0).levels] == [10, 5, 9]
