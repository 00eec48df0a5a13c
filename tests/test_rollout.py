"""RolloutStore on real Redis: a 0 -> 10 -> 50 -> 100 % migration from one Redis to a sharded
store under traffic, the share read from a Redis flag; compare mode; resets, leases, breakers."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from typing import Any

import pytest
import redis

from ratekeeper import (
    AsyncLimiter,
    ConcurrencyLimiter,
    Limiter,
    ManualClock,
    RedisStore,
    RolloutStore,
    Shard,
    ShardedRedisStore,
)
from ratekeeper.errors import ConfigError
from ratekeeper.middleware import redis_flags
from ratekeeper.stores.rollout import position
from tests import redis_servers as rs

FLAG = "ratekeeper:rollout"
LIMIT = 5
RATE = f"{LIMIT}/day"  # one window for the whole test: a key's count only starts over by moving
KEYS = [f"user:{i}" for i in range(120)]


def test_positions_are_stable_and_spread() -> None:
    places = [position(k) for k in KEYS * 2]
    assert places[: len(KEYS)] == places[len(KEYS) :]  # the same key, the same place
    assert all(0 <= p < 10_000 for p in places)
    share = sum(position(f"k{i}") < 1000 for i in range(10_000)) / 10_000
    assert 0.08 < share < 0.12  # 10 % of the keys at share 10


def holders(client: redis.Redis) -> set[str]:
    """The caller keys a Redis holds state for (``rk{key}f:...``)."""
    return {k.decode().split("{")[1].split("}")[0] for k in client.scan_iter(match="rk{*")}


def test_a_migration_0_10_50_100_under_traffic(redis_url: str, shard_urls: list[str]) -> None:
    """Four threads hit 120 keys while the share goes 0 -> 10 -> 50 -> 100 through a Redis
    flag. Keys move only forward, exactly the share moves, and a moved key's count starts
    over once: every key is admitted its limit on the old store and its limit on the new."""
    flags = redis.Redis.from_url(redis_url)
    old = RedisStore(redis_url, socket_timeout=5)
    new = ShardedRedisStore([Shard(u) for u in shard_urls], socket_timeout=5)
    store = RolloutStore(old, new, source=redis_flags(flags, FLAG), refresh_every=0.02)
    limiter = Limiter(store, clock=ManualClock(1_800_000_000.0), fail_open=False)
    admitted: Counter[str] = Counter()
    hits: Counter[str] = Counter()
    errors: list[BaseException] = []
    stop = threading.Event()
    lock = threading.Lock()

    def traffic(offset: int) -> None:
        i = offset
        while not stop.is_set():
            key = KEYS[i % len(KEYS)]
            i += 1
            try:
                allowed = limiter.hit(key, RATE).allowed
            except BaseException as exc:
                errors.append(exc)
                continue
            with lock:
                admitted[key] += allowed
                hits[key] += 1

    threads = [threading.Thread(target=traffic, args=(t * 31,)) for t in range(4)]
    for thread in threads:
        thread.start()
    new_clients = [redis.Redis.from_url(u) for u in shard_urls]
    stages: dict[int, set[str]] = {}
    try:
        for share in (0, 10, 50, 100):
            flags.hset(FLAG, "share", str(share))
            deadline = time.monotonic() + 30
            while store.share != share:
                assert time.monotonic() < deadline, "the flag was not picked up"
                time.sleep(0.01)
            with lock:
                hits.clear()
            while min(hits[k] for k in KEYS) <= 2 * LIMIT:  # every key saturated since
                assert time.monotonic() < deadline and not errors, errors[:3]
                time.sleep(0.02)
            stages[share] = set().union(*(holders(c) for c in new_clients))
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    assert not errors, errors[:3]
    for share, on_new in stages.items():
        assert on_new == {k for k in KEYS if position(k) < share * 100}, share
    assert stages[0] <= stages[10] <= stages[50] <= stages[100] == set(KEYS)
    assert len(stages[10]) < len(stages[50]) < len(KEYS)
    assert admitted == Counter(dict.fromkeys(KEYS, 2 * LIMIT))  # the limit, once per store
    assert holders(redis.Redis.from_url(redis_url)) >= set(KEYS)  # old state left behind
    assert store.stats()["to_new"] > 0 and store.stats()["flag_errors"] == 0


def test_compare_mode_answers_from_old_and_measures_new(
    redis_url: str, shard_urls: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Compare at 100 %: the old store answers; the new one is asked too and differences are
    counted and logged. It warms up: switching afterwards, keys keep their counts."""
    old = RedisStore(redis_url, socket_timeout=5)
    new = ShardedRedisStore([Shard(u) for u in shard_urls], socket_timeout=5)
    clock = ManualClock(1_800_000_000.0)
    store = RolloutStore(old, new, share=100, mode="compare", log_interval=0)
    limiter = Limiter(store, clock=clock, fail_open=False)
    alone = Limiter(old, clock=clock, fail_open=False)
    for _ in range(2):  # the old store alone first: new has never seen these hits
        alone.hit("early", RATE)
    caplog.set_level(logging.WARNING, "ratekeeper")
    answers = [limiter.hit("early", RATE).remaining for _ in range(5)]
    assert answers == [2, 1, 0, 0, 0]  # the old store's count
    stats = store.stats()
    assert stats["compared"] == 5 and stats["to_new"] == 0
    assert stats["differed"] == 3  # remaining differs while both admit
    assert stats["disagreed"] == 2  # old rejects, new (two behind) still admits
    assert any("rollout compare" in r.getMessage() for r in caplog.records)
    for _ in range(3):  # a key seen only in compare mode: both stores agree
        limiter.hit("warm", RATE)
    store.set(mode="switch")
    assert limiter.hit("warm", RATE).remaining == 1  # counted on new during compare
    assert store.stats()["to_new"] == 1


def test_a_new_store_down_in_compare_mode_is_never_seen(redis_url: str) -> None:
    dead = RedisStore(f"redis://127.0.0.1:{rs.free_port()}/0", socket_timeout=0.2)
    store = RolloutStore(RedisStore(redis_url, socket_timeout=5), dead, share=100, mode="compare")
    limiter = Limiter(store, clock=ManualClock(), fail_open=False)
    assert [limiter.hit("k", RATE).remaining for _ in range(3)] == [4, 3, 2]
    assert store.stats()["new_errors"] == 3

    async def run() -> list[int]:
        limiter = AsyncLimiter(store, clock=ManualClock(), fail_open=False)
        ds = await asyncio.gather(*(limiter.hit(f"a{i}", RATE) for i in range(10)))
        return [d.remaining for d in ds]

    assert asyncio.run(run()) == [4] * 10
    assert store.stats()["new_errors"] == 13


def test_a_failing_new_store_opens_only_its_own_breaker(redis_url: str) -> None:
    """Switch mode at 50 % with the new store dead: its keys fail open, the old keys do not."""
    dead = RedisStore(f"redis://127.0.0.1:{rs.free_port()}/0", socket_timeout=0.2)
    store = RolloutStore(RedisStore(redis_url, socket_timeout=5), dead, share=50)
    limiter = Limiter(store, clock=ManualClock())
    for _ in range(3):
        for key in KEYS:
            decision = limiter.hit(key, "1000/day")
            assert decision.degraded == store.moved(key), key
    assert limiter.stats()["breakers_open"] == 1


def test_reset_reaches_both_stores_and_a_key_moved_back_finds_its_old_count(
    redis_url: str, shard_urls: list[str]
) -> None:
    old = RedisStore(redis_url, socket_timeout=5)
    new = RedisStore(shard_urls[0], socket_timeout=5)
    store = RolloutStore(old, new)
    limiter = Limiter(store, clock=ManualClock(), fail_open=False)
    key = next(k for k in KEYS if position(k) < 5000)
    assert [limiter.hit(key, RATE).remaining for _ in range(2)] == [4, 3]  # on old
    store.set(share=50)
    assert limiter.hit(key, RATE).remaining == 4  # moved: starts over on new
    store.set(share=0)
    assert limiter.hit(key, RATE).remaining == 2  # moved back: old's count is still there
    limiter.reset(key, RATE)
    store.set(share=50)
    assert limiter.hit(key, RATE).remaining == 4  # reset on both: new starts over
    store.set(share=0)
    assert limiter.hit(key, RATE).remaining == 4


def test_leases_follow_the_share_and_release_where_they_are(
    redis_url: str, shard_urls: list[str]
) -> None:
    store = RolloutStore(
        RedisStore(redis_url, socket_timeout=5), RedisStore(shard_urls[0], socket_timeout=5)
    )
    slots = ConcurrencyLimiter(store, 2, clock=ManualClock())
    key = next(k for k in KEYS if position(k) < 5000)
    lease = slots.acquire(key)
    assert lease is not None and not lease.degraded
    store.set(share=50)  # the key's leases now start on the new store
    assert slots.in_use(key) == 0
    assert slots.release(lease)  # found on the old store
    assert slots.acquire(key) is not None and slots.in_use(key) == 1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"share": 101}, "share=101"),
        ({"share": -1}, "share=-1"),
        ({"mode": "shadow"}, "mode='shadow'"),
        ({"refresh_every": 0}, "refresh_every=0"),
    ],
)
def test_bad_settings_name_the_value(kwargs: dict[str, Any], match: str) -> None:
    from ratekeeper import MemoryStore

    with pytest.raises(ConfigError, match=match):
        RolloutStore(MemoryStore(), MemoryStore(), **kwargs)


def test_a_bad_flag_keeps_the_last_good_settings(caplog: pytest.LogCaptureFixture) -> None:
    from ratekeeper import MemoryStore

    flags = {"share": "10", "mode": "compare"}
    now = [0.0]
    store = RolloutStore(
        MemoryStore(),
        MemoryStore(),
        source=lambda: flags,
        refresh_every=1,
        monotonic=lambda: now[0],
    )
    limiter = Limiter(store, clock=ManualClock())
    limiter.hit("k", RATE)
    assert (store.share, store.mode) == (10.0, "compare")
    flags["share"] = "ten"
    now[0] = 2.0
    limiter.hit("k", RATE)
    assert (store.share, store.stats()["flag_errors"]) == (10.0, 1)
    assert any("rollout flags unreadable" in r.getMessage() for r in caplog.records)
    flags["share"] = "55.5"
    now[0] = 2.5  # not due yet
    limiter.hit("k", RATE)
    assert store.share == 10.0
    now[0] = 3.0
    limiter.hit("k", RATE)
    assert store.share == 55.5
