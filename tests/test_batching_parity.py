"""Coalesced calls decide exactly like one call each, on every Redis store.

A hypothesis property drives two async limiters (and two concurrency limiters) over one
``ManualClock``: one on a batching store, sent concurrently round by round (``gather``: the
calls of a round ride in shared pipelines), and one on the same kind of store with
``batching=None``, awaited one call at a time in the same order. Every decision (allowed,
remaining, reset_at, retry_after, deciding rate) and every lease answer must be equal. A round
stays under the batch size, so its calls reach Redis in the order they were made (on a cluster,
once the slot map is loaded).
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ratekeeper import (
    AsyncConcurrencyLimiter,
    AsyncLimiter,
    Lease,
    ManualClock,
    RedisClusterStore,
    ShardedRedisStore,
)
from ratekeeper.stores.redis.batching import Batching
from tests.conftest import redis_store

KEYS = ["a", "b", "user:42", "ключ {x}", "#h"]
RATES = ["3/second", "5/10s", "7/minute", "3/second; 10/minute"]
OPS = ["hit", "hit", "hit", "peek", "refund", "reset", "acquire", "acquire", "release"]


@dataclass(frozen=True)
class Call:
    op: str
    key: str
    cost: int


calls = st.builds(
    Call, op=st.sampled_from(OPS), key=st.sampled_from(KEYS), cost=st.sampled_from([1, 1, 2, 3])
)
rounds = st.lists(
    st.tuples(st.sampled_from([0, 1, 250, 999, 5_000]), st.lists(calls, min_size=1, max_size=40)),
    min_size=1,
    max_size=6,
)


def make(kind: str, request: pytest.FixtureRequest, prefix: str, batched: bool) -> Any:
    return redis_store(kind, request, prefix=prefix, batching=Batching() if batched else None)


def batch_counts(store: Any) -> tuple[int, int, int]:
    """(batches, calls, batchers) over every batcher the store holds."""
    if isinstance(store, ShardedRedisStore):
        batchers = [node.primary.batcher for node in store._nodes]
    elif isinstance(store, RedisClusterStore):
        assert store.batcher is not None
        batchers = list(store.batcher.batchers.values())
    else:
        batchers = [store.batcher]
    made = [b for b in batchers if b is not None]
    return sum(b.batches for b in made), sum(b.calls for b in made), len(made)


class Side:
    """One store's limiters and the leases they hold."""

    def __init__(self, store: Any, clock: ManualClock) -> None:
        self.store = store
        self.limiter = AsyncLimiter(store, clock=clock, fail_open=False)
        self.leases = AsyncConcurrencyLimiter(store, 2, 30.0, clock=clock, fail_open=False)
        self.held: list[Lease] = []
        self.releasable: list[Lease] = []
        """Leases taken before this round: concurrent calls cannot release one taken in it."""
        self.asked = 0
        """Calls that reached the store (a release with no lease held asks nothing)."""

    def answers(self, results: list[object]) -> list[object]:
        """Comparable answers; the round's new leases are kept in call order."""
        out: list[object] = []
        for result in results:
            if isinstance(result, tuple):
                lease, count = result
                if lease is not None:
                    self.held.append(lease)
                result = (lease is not None, count)
            out.append(result)
        return out

    async def run(self, call: Call, rate: str, algorithm: str) -> object:
        self.asked += call.op != "release"
        if call.op == "acquire":
            lease, count = await self.leases.acquire_counted(call.key)
            return (lease, count)
        if call.op == "release":
            lease = self.releasable.pop(0) if self.releasable else None
            self.asked += lease is not None
            return await self.leases.release(lease)
        method = getattr(self.limiter, call.op)
        if call.op == "reset":
            return await method(call.key, rate, algorithm=algorithm)
        return await method(call.key, rate, algorithm=algorithm, cost=call.cost)


@pytest.mark.parametrize("kind", ["redis", "sharded", "cluster"])
@pytest.mark.parametrize("algorithm", ["fixed_window", "token_bucket", "gcra", "sliding_window"])
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_batched_decides_like_one_call_each(
    kind: str, algorithm: str, request: pytest.FixtureRequest, data: st.DataObject
) -> None:
    rate = data.draw(st.sampled_from(RATES))
    sequence = data.draw(rounds)
    prefix = f"p{os.urandom(6).hex()}"  # fresh keys without a flush (not drawn: replays differ)

    async def go() -> tuple[list[list[object]], list[list[object]], Side]:
        clock = ManualClock(1_800_000_000.0)
        batched = Side(make(kind, request, prefix + "b", True), clock)
        single = Side(make(kind, request, prefix + "s", False), clock)
        if isinstance(batched.store, RedisClusterStore):
            await batched.store.ready()  # concurrent first calls wait for the slot map in any order
        got, want = [], []
        for advance_ms, round_calls in sequence:
            clock.advance(advance_ms / 1000)
            for side in (batched, single):
                side.releasable += side.held
                side.held = []
            together = [batched.run(c, rate, algorithm) for c in round_calls]
            got.append(batched.answers(await asyncio.gather(*together)))
            want.append(single.answers([await single.run(c, rate, algorithm) for c in round_calls]))
        for side in (batched, single):
            await side.store.aclose()
            side.store.close()
        return got, want, batched

    got, want, batched = asyncio.run(go())
    assert got == want
    batches, made, batchers = batch_counts(batched.store)
    assert made == batched.asked  # every call that reached the store went through a batcher
    if any(sum(c.op != "release" for c in cs) > batchers for _, cs in sequence):
        assert batches < made  # some batch held two calls or more
