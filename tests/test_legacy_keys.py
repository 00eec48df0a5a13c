"""Upgrading from ratekeeper 0.1, whose key names held the rate's count (``rk{k}f:5/1m``).

The states below are written by hand in 0.1's formats (docs/redis.md of 0.1: a fixed window's
"<count><end>", a bucket's tokens x period / gcd(count, period) before a 12-digit time, a
GCRA arrival time alone, a sliding window's "<index>:<counts>", a log's list), under 0.1's
names. With ``legacy_keys=True`` a store reads a state missing under its new name from its 0.1
name and carries it over, so an upgrade keeps every count; without it the counts start over
(what docs/redis.md says happens).
"""

from __future__ import annotations

from typing import Any

import pytest
import redis

from ratekeeper import CompactLayout, Limiter, ManualClock, RedisStore
from ratekeeper.stores.redis.keys import redis_key
from ratekeeper.stores.redis.layout import bucket_tag, compact_field

NOW_MS = 1_700_000_000_000
MINUTE = 60_000


def old_value(algorithm: str) -> Any:
    """0.1's state of 3 units used of 5/minute at NOW_MS."""
    if algorithm == "fixed_window":
        return f"3{NOW_MS + MINUTE:013d}"
    if algorithm == "token_bucket":  # 2 tokens left, x 60000 / gcd(5, 60000)
        return f"{2 * MINUTE // 5}{NOW_MS - 1_700_000_000_000:012d}"
    if algorithm == "gcra":  # three emission intervals of 12 s ahead
        return str(NOW_MS * 1000 + 3 * 12_000_000)
    if algorithm == "sliding_window":
        return f"{NOW_MS // MINUTE}:3"
    return [NOW_MS] * 3


CODES = {"fixed_window": "f", "token_bucket": "t", "gcra": "g", "sliding_window": "s"}
ALGORITHMS = [*CODES, "sliding_log"]


def write_old(client: redis.Redis, algorithm: str, compact: bool) -> str:
    value = old_value(algorithm)
    if algorithm == "sliding_log":
        name = redis_key("rk", "k", "l:5/1m")
        client.rpush(name, *value)
        client.pexpire(name, MINUTE + 1000)
        return name
    slot = f"{CODES[algorithm]}:5/1m"
    if compact:
        name = f"rk{{{bucket_tag(compact_field('k'), 4)}}}{slot}"
        client.hset(name, compact_field("k"), value)
        client.pexpire(name, 2 * MINUTE)
    else:
        name = redis_key("rk", "k", slot)
        client.set(name, value, px=MINUTE + 1000)
    return name


@pytest.mark.parametrize("compact", [False, True], ids=["keys", "compact"])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_an_upgrade_with_legacy_keys_keeps_the_counts(
    redis_url: str, algorithm: str, compact: bool
) -> None:
    client = redis.Redis.from_url(redis_url)
    old = write_old(client, algorithm, compact)
    layout = CompactLayout(buckets=4) if compact else None
    store = RedisStore(redis_url, socket_timeout=5, layout=layout, legacy_keys=True)
    limiter = Limiter(store, clock=ManualClock(NOW_MS / 1000), fail_open=False)
    before = set(client.keys())
    assert limiter.peek("k", "5/minute", algorithm=algorithm, cost=0).remaining == 2
    assert set(client.keys()) == before  # a peek writes nothing (it may run on a replica)
    assert limiter.hit("k", "5/minute", algorithm=algorithm).remaining == 1
    assert limiter.hit("k", "5/minute", algorithm=algorithm).remaining == 0
    assert not limiter.hit("k", "5/minute", algorithm=algorithm).allowed
    assert client.exists(old) == 1  # the 0.1 key stays for 0.1 processes, until its TTL
    # a raise keeps the count too (the point of the new names)
    assert limiter.hit("k", "7/minute", algorithm=algorithm).remaining == 1
    limiter.reset("k", "5/minute", algorithm=algorithm)  # the new name and the old one
    assert limiter.peek("k", "5/minute", algorithm=algorithm, cost=0).remaining == 5
    assert client.exists(old) == 0
    store.close()


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_without_legacy_keys_an_upgrade_starts_the_counts_over(
    redis_url: str, algorithm: str
) -> None:
    client = redis.Redis.from_url(redis_url)
    write_old(client, algorithm, compact=False)
    store = RedisStore(redis_url, socket_timeout=5)
    limiter = Limiter(store, clock=ManualClock(NOW_MS / 1000), fail_open=False)
    assert limiter.peek("k", "5/minute", algorithm=algorithm, cost=0).remaining == 5
    store.close()


def test_an_admins_reset_forgets_the_old_name_too(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    old = write_old(client, "fixed_window", compact=False)
    store = RedisStore(redis_url, socket_timeout=5, legacy_keys=True)
    limiter = Limiter(store, clock=ManualClock(NOW_MS / 1000), fail_open=False)
    _, before, after = limiter.administer("reset", "k", "5/minute")
    assert (before[0].remaining, after[0].remaining) == (2, 5)
    assert client.exists(old) == 0
    store.close()
