"""The compact layout's sweep never changes a decision: a new field deletes another caller's
field only when its state decides like none under every rate its hash serves.

A hash is named by its window, not its count, so it holds fields written at different counts of
one period; the caller sweeping them may run at yet another count. Each test writes a state,
lets a caller of another count add a field to the same hash (one bucket and at most three
fields: the sweep samples every field), then asks again as the memory store (the reference) is
asked, and demands the same decision.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from ratekeeper import CompactLayout, Decision, Limiter, ManualClock, MemoryStore, RedisStore

PACKED = ["fixed_window", "token_bucket", "gcra", "sliding_window"]


class Pair:
    """A compact-layout Redis limiter and a memory one on one clock, asked the same things."""

    def __init__(self, url: str) -> None:
        self.clock = ManualClock(1_700_000_000.0)
        self.client = redis.Redis.from_url(url)
        self.store = RedisStore(url, layout=CompactLayout(buckets=1), socket_timeout=5)
        self.redis = Limiter(self.store, clock=self.clock, fail_open=False)
        self.memory = Limiter(MemoryStore(), clock=self.clock, fail_open=False)

    def hit(self, key: str, rate: str, algorithm: str, cost: int = 1) -> Decision:
        want = self.memory.hit(key, rate, algorithm=algorithm, cost=cost)
        got = self.redis.hit(key, rate, algorithm=algorithm, cost=cost)
        assert got == want, (key, rate, algorithm, cost)
        return got

    def fields(self) -> set[bytes]:
        return {f for name in self.client.scan_iter(match="rk*") for f in self.client.hkeys(name)}

    def close(self) -> None:
        self.store.close()
        self.client.close()


@pytest.fixture
def pair(redis_url: str) -> Iterator[Pair]:
    p = Pair(redis_url)
    yield p
    p.close()


def test_a_bucket_full_again_at_its_old_rate_still_counts_under_a_lowered_one(pair: Pair) -> None:
    """5 tokens taken at 7/minute are back after 43 s; cut to 2/minute, 60 s later 3 are still
    missing (2 come back per minute), so a request is refused, as the memory store refuses it.
    Another caller's new field in between must not sweep the debt away."""
    assert pair.hit("k", "7/minute", "token_bucket", cost=5).allowed
    pair.clock.advance(60)
    pair.hit("other", "7/minute", "token_bucket")  # a new field: samples "k"
    assert b"k" in pair.fields()
    assert not pair.hit("k", "2/minute", "token_bucket").allowed


def test_a_faster_caller_does_not_sweep_a_slower_bucket(pair: Pair) -> None:
    """A bucket at 2/minute short of 1 token is full again after 30 s; a caller at 25/minute
    (whose own buckets refill in 2.4 s) adds a field 3 s on: the slow bucket stays."""
    assert pair.hit("k", "2/minute", "token_bucket").allowed
    pair.clock.advance(3)
    pair.hit("other", "25/minute", "token_bucket")
    assert b"k" in pair.fields()
    assert not pair.hit("k", "2/minute", "token_bucket", cost=2).allowed


def test_a_faster_caller_does_not_sweep_a_slower_arrival_time(pair: Pair) -> None:
    """gcra at 1/minute: one hit puts the arrival time a minute on. A caller at 60,000/minute
    10 ms before it would read those 10 ms as less than one of its units (1 ms) and call the
    state idle: it is not, at 1/minute, and the next hit there must wait the 10 ms."""
    assert pair.hit("k", "1/minute", "gcra").allowed
    pair.clock.advance(59.99)
    pair.hit("other", "60000/minute", "gcra")
    assert b"k" in pair.fields()
    d = pair.hit("k", "1/minute", "gcra")
    assert not d.allowed and d.retry_after == pytest.approx(0.01)


@pytest.mark.parametrize("algorithm", PACKED)
def test_callers_of_every_count_share_a_hash_and_decide_like_memory(
    pair: Pair, algorithm: str
) -> None:
    """One key knocks at 1, 30 and 600 per minute in turn, every 0.1 to 59 s, while callers
    at each count add fields to its hash: every decision is the memory store's."""
    rates = ["1/minute", "30/minute", "600/minute"]
    steps = [0.1, 2, 0.5, 13, 40, 1, 0.1, 31, 7, 0.3, 59, 2, 0.02, 19]
    for n, wait in enumerate(steps):
        pair.clock.advance(wait)
        pair.hit("old", rates[n % 3], algorithm, cost=1 + n % 4)
        for j, rate in enumerate(rates):
            pair.hit("new", rate, algorithm, cost=1 + j)  # a new field: samples "old"
            for limiter in (pair.redis, pair.memory):  # two fields: the sample holds both
                limiter.reset("new", rate, algorithm=algorithm)


@pytest.mark.parametrize("algorithm", PACKED)
def test_a_state_idle_under_every_rate_is_swept(pair: Pair, algorithm: str) -> None:
    """The sweep still works: a state that decides like none at any count (here an hour after
    one unit at 2/minute: idle even at 1/minute) goes when the next new field samples it."""
    opts: dict[str, Any] = {"buckets": 3} if algorithm == "sliding_window" else {}
    pair.redis.hit("k", "2/minute", algorithm=algorithm, **opts)
    pair.clock.advance(3600)
    pair.redis.hit("other", "30/minute", algorithm=algorithm, **opts)
    assert pair.fields() == {b"other"}
