"""The service engine on the memory store with a manual clock: policies, shadow, kill switch
and the over-limit cache (Envoy's API: test_envoy.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from ratekeeper import AsyncLimiter, ManualClock, MemoryStore
from ratekeeper.errors import BadRequest
from ratekeeper.service.config import loader as config
from ratekeeper.service.engine import Engine, store_key
from ratekeeper.service.metrics import InstrumentedStore, Metrics

T = TypeVar("T")

CONFIG = """\
limits:
  max_key_length: 40
policies:
  five:
    rate: 5/minute
  five.too:
    rate: 5/minute
  bucket:
    rate: 6/minute
    algorithm: token_bucket
  shadowed:
    rate: 1/minute
    shadow: true
  off:
    rate: 1/minute
    enabled: false
"""


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


class Counting(MemoryStore):
    """A memory store that counts the plans it runs (to see what the cache saves)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    async def execute_async(self, plan: Any) -> Any:
        self.calls += 1
        return self.execute(plan)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_800_000_000.0)


@pytest.fixture
def store() -> Counting:
    return Counting()


@pytest.fixture
def engine(clock: ManualClock, store: Counting) -> Engine:
    metrics = Metrics()
    limiter = AsyncLimiter(InstrumentedStore(store, metrics), clock=clock)
    return Engine(config.parse_text(CONFIG), limiter, metrics, clock)


def hits(engine: Engine, name: str, key: str, n: int, cost: int = 1) -> list[bool]:
    async def go() -> list[bool]:
        spec = engine.spec(name)
        return [(await engine.hit(spec, key, cost)).decision.allowed for _ in range(n)]

    return run(go())


def test_policies_do_not_share_counters(engine: Engine) -> None:
    assert hits(engine, "five", "u", 6) == [True] * 5 + [False]
    assert hits(engine, "five.too", "u", 1) == [True]
    assert store_key("a", "b:c") != store_key("a:b", "c")


def test_over_limit_cache_answers_locally_until_retry(
    engine: Engine, clock: ManualClock, store: Counting
) -> None:
    hits(engine, "five", "u", 6)
    calls = store.calls
    clock.advance(10)
    spec = engine.spec("five")
    result = run(engine.hit(spec, "u", 1))
    assert result.local and not result.decision.allowed
    assert store.calls == calls  # a flood from one key costs the store nothing
    first = run(engine.peek(spec, "u", 1))
    assert first.local
    window_end = 1_800_000_000 - 1_800_000_000 % 60 + 60
    assert result.decision.reset_at == window_end
    assert result.decision.retry_after == pytest.approx(window_end - clock())
    assert result.decision.remaining == 0
    assert result.decision.headers()["Retry-After"] == str(int(window_end - clock()))
    clock.advance(window_end - clock())
    after = run(engine.hit(spec, "u", 1))
    assert after.decision.allowed and not after.local
    assert store.calls == calls + 1


def test_cached_rejection_applies_only_to_costs_at_least_as_large(
    engine: Engine, clock: ManualClock
) -> None:
    spec = engine.spec("bucket")
    assert hits(engine, "bucket", "k", 1, cost=5) == [True]
    rejected = run(engine.hit(spec, "k", 3))  # 1 token left: 3 does not fit
    assert not rejected.decision.allowed and not rejected.local
    assert run(engine.hit(spec, "k", 4)).local  # larger: still cannot fit
    small = run(engine.hit(spec, "k", 1))  # smaller: asks the store, and fits
    assert small.decision.allowed and not small.local
    # token_bucket refills 1 per 10 s: 3 tokens needed, 0 left -> retry in 30 s
    clock.advance(5)
    again = run(engine.hit(spec, "k", 3))
    assert again.local and again.decision.retry_after == pytest.approx(15.0)


def test_refund_and_reset_forget_the_cached_rejection(engine: Engine) -> None:
    spec = engine.spec("five")
    hits(engine, "five", "u", 6)
    run(engine.refund(spec, "u", 1))
    assert run(engine.hit(spec, "u", 1)).decision.allowed
    hits(engine, "five", "u", 1)
    run(engine.reset(spec, "u"))
    assert hits(engine, "five", "u", 5) == [True] * 5


def test_shadow_counts_but_allows(engine: Engine) -> None:
    spec = engine.spec("shadowed")
    first, second = run(engine.hit(spec, "u", 1)), run(engine.hit(spec, "u", 1))
    assert first.decision.allowed and not first.shadow
    assert second.decision.allowed and second.shadow and second.decision.retry_after == 0
    text = engine.metrics.exposition().decode()
    assert 'ratekeeper_decisions_total{outcome="shadow_rejected",policy="shadowed"} 1.0' in text


def test_disabled_policy_and_runtime_toggles(engine: Engine, store: Counting) -> None:
    assert hits(engine, "off", "u", 3) == [True] * 3
    assert store.calls == 0
    engine.toggle("off", enabled=True, shadow=None)
    assert hits(engine, "off", "u", 2) == [True, False]
    engine.toggle("five", enabled=None, shadow=True)
    assert hits(engine, "five", "v", 7) == [True] * 7
    engine.swap(config.parse_text(CONFIG))  # a reload drops runtime toggles
    assert hits(engine, "off", "w", 2) == [True, True]


def test_bad_names_and_keys(engine: Engine) -> None:
    with pytest.raises(BadRequest) as info:
        engine.spec("missing")
    assert info.value.status == 404 and info.value.field == "policy"
    with pytest.raises(BadRequest, match="41 characters long; the limit is 40"):
        engine.check_key("k" * 41)
    with pytest.raises(BadRequest, match="key 5 is invalid"):
        engine.check_key(5)
    with pytest.raises(BadRequest, match="not valid Unicode"):
        engine.check_key("a\ud800")
    assert engine.check_key("ключ ✓") == "ключ ✓"
