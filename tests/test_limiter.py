"""Limiter and AsyncLimiter: one surface, bad input named, time read once per call and rounded."""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from typing import Any

import pytest

from ratekeeper import (
    AsyncLimiter,
    ConfigError,
    Limiter,
    ManualClock,
    MemoryStore,
    Rate,
    RateSpecError,
)
from tests.harness import NAMES, T0, StoreFactory, make_limiter


def _public(cls: type) -> dict[str, Any]:
    return {n: getattr(cls, n) for n in dir(cls) if not n.startswith("_")}


def test_sync_and_async_limiters_have_the_same_surface() -> None:
    sync, aio = _public(Limiter), _public(AsyncLimiter)
    # waiting by callback for a store's batch is the event loop's: no sync twin
    assert sorted(sync) == sorted(set(aio) - {"decide_soon"})
    assert {"hit", "peek", "refund", "reset", "decide", "stats", "clock"} <= set(sync)
    assert {"nested", "reserve", "settle", "cancel"} <= set(sync)
    for name, member in sync.items():
        if not callable(member):
            continue
        a, b = inspect.signature(member), inspect.signature(aio[name])
        assert [(p.name, p.kind, p.default) for p in a.parameters.values()] == [
            (p.name, p.kind, p.default) for p in b.parameters.values()
        ], name
        assert inspect.iscoroutinefunction(aio[name]) == (
            name
            in {"hit", "peek", "refund", "reset", "check", "decide", "status", "administer"}
            | {"nested", "refund_nested", "reserve", "settle", "cancel"}
        )
        assert not inspect.iscoroutinefunction(member)
    init_a = inspect.signature(Limiter.__init__).parameters
    init_b = inspect.signature(AsyncLimiter.__init__).parameters
    assert [(p.name, p.default) for p in init_a.values()] == [
        (p.name, p.default) for p in init_b.values()
    ]


def test_async_limiter_decides_like_the_sync_one() -> None:
    sync, clock = make_limiter()
    aio = AsyncLimiter(store=MemoryStore(), clock=clock)

    async def run() -> None:
        for name in NAMES:
            for step in range(12):
                clock.set(T0 + step * 7.5)
                cost = 1 + step % 3
                assert await aio.hit("k", "5/minute", algorithm=name, cost=cost) == sync.hit(
                    "k", "5/minute", algorithm=name, cost=cost
                )
                assert await aio.peek("k", "5/minute", algorithm=name) == sync.peek(
                    "k", "5/minute", algorithm=name
                )
                if step % 4 == 0:
                    await aio.refund("k", "5/minute", algorithm=name)
                    sync.refund("k", "5/minute", algorithm=name)
            await aio.reset("k", "5/minute", algorithm=name)
            sync.reset("k", "5/minute", algorithm=name)
            assert await aio.peek("k", "5/minute", algorithm=name) == sync.peek(
                "k", "5/minute", algorithm=name
            )

    asyncio.run(run())


def test_defaults_are_a_memory_store_and_the_system_clock() -> None:
    limiter = Limiter()
    assert isinstance(limiter.store, MemoryStore) and limiter.clock is time.time
    d = limiter.hit("k", "5/minute")
    assert d.allowed and abs(d.now - time.time()) < 60
    stats = limiter.stats()
    assert stats["breaker"] == "closed"
    assert all(v == 0 for k, v in stats.items() if k != "breaker"), stats


@pytest.mark.parametrize(
    ("call", "error", "names"),
    [
        ({"rate": "ten/minute"}, RateSpecError, r"count 'ten'.*expected a rate like"),
        ({"rate": "100/fortnight"}, RateSpecError, r"unit 'fortnight'.*expected a rate like"),
        ({"rate": "0/minute"}, RateSpecError, r"count 0 .* must be at least 1"),
        ({"rate": ""}, RateSpecError, r"rate '' is empty; expected a rate like"),
        (
            {"algorithm": "leaky_bucket"},
            ConfigError,
            r"algorithm 'leaky_bucket' is unknown; expected one of fixed_window, gcra, "
            r"sliding_log, sliding_window, token_bucket",
        ),
        (
            {"algorithm": "token_bucket", "buckets": 2},
            ConfigError,
            r"option 'buckets' does not apply to token_bucket; it takes burst",
        ),
        (
            {"algorithm": "fixed_window", "burst": 2},
            ConfigError,
            r"option 'burst' does not apply to fixed_window; it takes aligned, count_rejected",
        ),
        (
            {"algorithm": "sliding_log", "buckets": 2},
            ConfigError,
            r"option 'buckets' does not apply to sliding_log; it takes no options",
        ),
        (
            {"algorithm": "gcra", "buckets": 2},
            ConfigError,
            r"option 'buckets' does not apply to gcra; it takes burst",
        ),
        (
            {"algorithm": "sliding_window", "burst": 2},
            ConfigError,
            r"option 'burst' does not apply to sliding_window; it takes buckets",
        ),
        (
            {"algorithm": "token_bucket", "burst": 0},
            ConfigError,
            r"option burst=0 for token_bucket is invalid; expected a whole number from 1 to",
        ),
        (
            {"algorithm": "gcra", "burst": 2.5},
            ConfigError,
            r"option burst=2.5 for gcra is invalid; expected a whole number from 1 to",
        ),
        (
            {"algorithm": "sliding_window", "buckets": 61},
            ConfigError,
            r"option buckets=61 for sliding_window is invalid; expected a whole number from 1 to "
            r"60",
        ),
        ({"key": ""}, ConfigError, r"key '' is invalid; expected a non-empty string"),
        ({"key": 42}, ConfigError, r"key 42 is invalid; expected a non-empty string"),
    ],
)
def test_bad_input_is_a_value_error_naming_the_bad_part(
    call: dict[str, Any], error: type[Exception], names: str
) -> None:
    args = {"key": "k", "rate": "5/minute", **call}
    key, rate = args.pop("key"), args.pop("rate")
    limiter, _ = make_limiter()
    for method in (limiter.hit, limiter.peek, limiter.refund):
        with pytest.raises(error, match=names) as info:
            method(key, rate, **args)
        assert isinstance(info.value, ValueError)

    async def run() -> None:
        with pytest.raises(error, match=names):
            await AsyncLimiter(clock=ManualClock(T0)).hit(key, rate, **args)

    asyncio.run(run())


def test_bad_construction_is_named() -> None:
    with pytest.raises(ConfigError, match=r"store 5 cannot be used by Limiter"):
        Limiter(store=5)  # type: ignore[arg-type]  # bad on purpose
    with pytest.raises(
        ConfigError, match=r"cannot be used by AsyncLimiter; it has no execute_async"
    ):
        AsyncLimiter(store=object())  # type: ignore[arg-type]  # bad on purpose
    with pytest.raises(ConfigError, match=r"clock=5 is not callable"):
        Limiter(clock=5)  # type: ignore[arg-type]  # bad on purpose
    with pytest.raises(ConfigError, match=r"breaker settings are invalid"):
        Limiter(breaker_threshold=0)


def test_advancing_by_retry_after_always_lands_on_the_admitting_millisecond() -> None:
    # float epochs plus float seconds land a hair below the intended millisecond about one
    # time in ten; the limiter rounds, so retry_after is honoured from any starting instant
    for offset_ms in range(0, 3000, 7):
        limiter, clock = make_limiter(T0 + offset_ms / 1000)
        assert limiter.hit("k", "3/second", algorithm="token_bucket", cost=3).allowed
        d = limiter.hit("k", "3/second", algorithm="token_bucket")
        clock.advance(d.retry_after)
        assert limiter.hit("k", "3/second", algorithm="token_bucket").allowed, offset_ms


def test_rates_may_be_given_as_objects_and_lists() -> None:
    limiter, _ = make_limiter()
    stack = [Rate(1, 1.0), Rate(5, 60.0)]
    assert limiter.hit("k", stack).allowed
    assert not limiter.hit("k", tuple(stack)).allowed
    assert not limiter.hit("k", "1/second; 5/minute").allowed  # the same state, however spelled
    assert limiter.peek("k", Rate(5, 60.0)).remaining == 4


def test_validation_does_not_depend_on_what_was_cached_before() -> None:
    limiter, _ = make_limiter()
    assert limiter.hit("k", "5/minute", algorithm="token_bucket", burst=5).allowed
    assert limiter.hit("k", "5/minute", algorithm="sliding_window", buckets=1).allowed
    with pytest.raises(ConfigError, match=r"option burst=5.0 for token_bucket is invalid"):
        limiter.hit("k", "5/minute", algorithm="token_bucket", burst=5.0)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"option buckets=True for sliding_window is invalid"):
        limiter.hit("k", "5/minute", algorithm="sliding_window", buckets=True)


@pytest.mark.parametrize("algorithm", NAMES)
def test_eight_threads_on_one_key_admit_exactly_the_limit(
    algorithm: str, make_store: StoreFactory
) -> None:
    limiter, _ = make_limiter(store=make_store())
    admitted = [0] * 8
    start = threading.Barrier(8)

    def hammer(i: int) -> None:
        start.wait()
        for _ in range(250):
            if limiter.hit("k", "1000/minute", algorithm=algorithm).allowed:
                admitted[i] += 1

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # a store that timed out answered by failing open: that run proves nothing about exactness
    assert limiter.stats()["degraded"] == 0, f"the store failed under load: {limiter.stats()}"
    assert sum(admitted) == 1000
    assert limiter.peek("k", "1000/minute", algorithm=algorithm).remaining == 0
