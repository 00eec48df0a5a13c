"""MemoryStore: exact under threads and asyncio, bounded memory (expiry, sweep, LRU eviction)."""

from __future__ import annotations

import asyncio

import pytest

from ratekeeper import AsyncLimiter, Limiter, ManualClock, MemoryStore
from tests.harness import NAMES, T0, drain

algorithms = pytest.mark.parametrize("algorithm", NAMES)


@algorithms
def test_asyncio_gather_admits_exactly_the_limit(algorithm: str) -> None:
    limiter = AsyncLimiter(store=MemoryStore(), clock=ManualClock(T0))

    async def main() -> list[bool]:
        hits = [limiter.hit("k", "1000/minute", algorithm=algorithm) for _ in range(2000)]
        return [d.allowed for d in await asyncio.gather(*hits)]

    assert sum(asyncio.run(main())) == 1000


@algorithms
def test_a_key_whose_state_stopped_mattering_decides_like_none_until_swept(
    algorithm: str,
) -> None:
    """A stale entry is read as it is (as a Redis key is until its TTL): under its own rate it
    decides like no state; a write replaces it, a sweep drops it."""
    store = MemoryStore()
    clock = ManualClock(T0)
    limiter = Limiter(store=store, clock=clock)
    d = limiter.hit("k", "5/minute", algorithm=algorithm)
    assert len(store) == 1
    clock.set(d.reset_at - 0.001)
    assert limiter.peek("k", "5/minute", algorithm=algorithm, cost=0).remaining < 5
    clock.set(d.reset_at)
    assert limiter.peek("k", "5/minute", algorithm=algorithm).remaining == 5
    assert store.sweep(clock()) == 1
    assert len(store) == 0
    limiter.hit("k", "5/minute", algorithm=algorithm)
    clock.set(clock() + 3600)
    assert limiter.hit("k", "5/minute", algorithm=algorithm).remaining == 4  # replaced
    assert len(store) == 1


@algorithms
def test_sweep_frees_every_expired_key_and_only_those(algorithm: str) -> None:
    store = MemoryStore()
    clock = ManualClock(T0)
    limiter = Limiter(store=store, clock=clock)
    for i in range(10):
        old = limiter.hit(f"old{i}", "5/minute", algorithm=algorithm)
    clock.set(old.reset_at - 0.001)
    limiter.hit("new", "5/minute", algorithm=algorithm)
    assert store.sweep(clock()) == 0
    assert store.sweep(old.reset_at) == 10
    assert len(store) == 1
    assert limiter.peek("new", "5/minute", algorithm=algorithm).remaining == 4


def test_writes_sweep_a_few_expired_keys_as_they_go() -> None:
    store = MemoryStore(sweep_every=10)
    clock = ManualClock(T0)
    limiter = Limiter(store=store, clock=clock)
    for i in range(10):
        limiter.hit(f"old{i}", "5/second")
    clock.advance(2)
    for i in range(9):
        limiter.hit(f"new{i}", "5/second")
    assert len(store) == 19
    limiter.hit("new9", "5/second")  # the tenth write since the last sweep
    assert len(store) == 10


def test_max_keys_evicts_the_least_recently_used() -> None:
    store = MemoryStore(max_keys=3)
    limiter = Limiter(store=store, clock=ManualClock(T0))
    for key in ("a", "b", "c"):
        limiter.hit(key, "5/minute")
    limiter.hit("a", "5/minute")  # a is now the most recent
    limiter.hit("d", "5/minute")
    assert len(store) == 3
    assert limiter.peek("b", "5/minute").remaining == 5  # evicted: starts fresh
    assert limiter.peek("a", "5/minute").remaining == 3
    for i in range(1000):
        limiter.hit(f"flood{i}", "5/minute")
    assert len(store) == 3


def test_a_rejected_key_stays_in_the_cache_while_it_keeps_knocking() -> None:
    store = MemoryStore(max_keys=3)
    limiter = Limiter(store=store, clock=ManualClock(T0))
    assert drain(limiter, "abuser", "5/minute") == 5
    for i in range(20):
        assert not limiter.hit("abuser", "5/minute").allowed
        limiter.hit(f"other{i}", "5/minute")
    assert not limiter.hit("abuser", "5/minute").allowed


@algorithms
def test_refund_of_an_unknown_key_stores_nothing(algorithm: str) -> None:
    store = MemoryStore()
    Limiter(store=store, clock=ManualClock(T0)).refund("k", "5/minute", algorithm=algorithm)
    assert len(store) == 0


@pytest.mark.parametrize("max_keys", [0, -1, 1.5, "10", True])
def test_bad_max_keys_is_named(max_keys: object) -> None:
    with pytest.raises(ValueError, match=r"max_keys=.* expected a whole number >= 1"):
        MemoryStore(max_keys=max_keys)  # type: ignore[arg-type]  # bad on purpose
