"""The circuit breaker's states, timed by the caller's clock (no store, no sleeping), and
every limiter timing it by its monotonic clock, apart from the rate clock."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ratekeeper import (
    AsyncConcurrencyLimiter,
    AsyncLimiter,
    ConcurrencyLimiter,
    ConfigError,
    Limiter,
    ManualClock,
    MemoryStore,
)
from ratekeeper.breaker import Breaker
from ratekeeper.errors import StoreUnavailable


def test_opens_after_threshold_failures_in_a_row() -> None:
    b = Breaker(3, 0.5, 30.0)
    assert not b.failed(100.0) and not b.failed(100.0)
    assert b.state == "failing" and b.allow(100.0)
    assert b.failed(100.0)
    assert b.state == "open"
    assert not b.allow(100.0) and not b.allow(100.49)


def test_a_success_before_the_threshold_starts_the_count_again() -> None:
    b = Breaker(3, 0.5, 30.0)
    b.failed(1.0)
    b.failed(1.0)
    b.succeeded()
    assert b.state == "closed"
    assert not b.failed(1.0) and not b.failed(1.0)
    assert b.failed(1.0)


def test_one_trial_after_the_cool_down_and_its_success_closes() -> None:
    b = Breaker(1, 0.5, 30.0)
    b.failed(10.0)
    assert b.allow(10.5)  # the trial
    assert not b.allow(10.5)  # others still skip while it runs
    b.succeeded()
    assert b.state == "closed" and b.allow(10.5)
    b.failed(11.0)
    assert not b.allow(11.4) and b.allow(11.5)  # the cool-down went back to 0.5 s


def test_failed_trials_double_the_cool_down_up_to_the_maximum() -> None:
    b = Breaker(1, 0.5, 3.0)
    now = 0.0
    b.failed(now)
    cooldowns = []
    for _ in range(5):
        start = now
        while not b.allow(now):
            now = round(now + 0.25, 2)
        cooldowns.append(now - start)
        b.failed(now)
    assert cooldowns == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_failures_in_flight_when_it_opened_do_not_lengthen_the_cool_down() -> None:
    b = Breaker(3, 0.5, 30.0)
    for _ in range(10):  # ten concurrent calls fail together
        b.failed(5.0)
    assert b.cooldown == 0.5
    assert not b.allow(5.49) and b.allow(5.5)


@pytest.mark.parametrize(
    ("threshold", "cooldown", "max_cooldown", "bad"),
    [
        (0, 0.5, 30.0, "threshold=0"),
        (3, 0.0, 30.0, "cooldown=0.0"),
        (3, 5.0, 1.0, "5.0"),
        (3, "1s", 30.0, "cooldown='1s'"),
        (2.5, 0.5, 30.0, "threshold=2.5"),
    ],
)
def test_bad_settings_are_refused(
    threshold: int, cooldown: float, max_cooldown: float, bad: str
) -> None:
    with pytest.raises(ConfigError, match=bad):
        Breaker(threshold, cooldown, max_cooldown)


class Outage:
    """A memory store behind a switch: every call fails while ``down`` (an outage injected in
    front of a real store, for the breaker's timing only)."""

    def __init__(self) -> None:
        self.memory = MemoryStore()
        self.down = True
        self.calls = 0

    def _gate(self) -> MemoryStore:
        self.calls += 1
        if self.down:
            raise StoreUnavailable("injected outage")
        return self.memory

    def execute(self, plan: Any) -> Any:
        return self._gate().execute(plan)

    async def execute_async(self, plan: Any) -> Any:
        return self._gate().execute(plan)

    def acquire_lease(self, *args: Any) -> tuple[bool, int]:
        return self._gate().acquire_lease(*args)

    def release_lease(self, *args: Any) -> bool:
        return self._gate().release_lease(*args)

    def count_leases(self, *args: Any) -> int:
        return self._gate().count_leases(*args)

    async def acquire_lease_async(self, *args: Any) -> tuple[bool, int]:
        return self.acquire_lease(*args)

    async def release_lease_async(self, *args: Any) -> bool:
        return self.release_lease(*args)

    async def count_leases_async(self, *args: Any) -> int:
        return self.count_leases(*args)


def test_cool_downs_run_on_the_monotonic_clock_not_the_rate_clock() -> None:
    """A rate clock that never moves (a ManualClock, a replay) must not keep the breaker open:
    the store is back, the monotonic clock passes the cool-down, decisions recover."""
    rate_clock, monotonic = ManualClock(), ManualClock(start=100.0)
    store = Outage()
    limiter = Limiter(store, clock=rate_clock, monotonic=monotonic)
    leases = ConcurrencyLimiter(store, 5, clock=rate_clock, monotonic=monotonic)
    aleases = AsyncConcurrencyLimiter(store, 5, clock=rate_clock, monotonic=monotonic)
    alimiter = AsyncLimiter(store, clock=rate_clock, monotonic=monotonic)
    for _ in range(3):
        assert limiter.hit("k", "5/minute").degraded
        assert leases.acquire("k").degraded  # type: ignore[union-attr]  # fail open: a lease
        assert asyncio.run(alimiter.hit("k", "5/minute")).degraded
        assert asyncio.run(aleases.acquire("k")).degraded  # type: ignore[union-attr]
    assert limiter.stats()["breaker"] == leases.stats()["breaker"] == "open"
    store.down = False
    monotonic.advance(0.6)  # past the 0.5 s cool-down; the rate clock has not moved at all
    assert not limiter.hit("k", "5/minute").degraded
    assert not asyncio.run(alimiter.hit("k", "5/minute")).degraded
    assert not leases.acquire("k").degraded  # type: ignore[union-attr]
    assert not asyncio.run(aleases.acquire("k")).degraded  # type: ignore[union-attr]
    for stats in (limiter.stats(), alimiter.stats(), leases.stats(), aleases.stats()):
        assert stats["breaker"] == "closed"


def test_a_rate_clock_far_ahead_does_not_skip_the_cool_down() -> None:
    rate_clock, monotonic = ManualClock(), ManualClock(start=100.0)
    store = Outage()
    limiter = Limiter(store, clock=rate_clock, monotonic=monotonic)
    for _ in range(3):
        limiter.hit("k", "5/minute")
    calls = store.calls
    rate_clock.advance(3600)  # an NTP step or a replay jumping ahead: still inside cool-down
    assert limiter.hit("k", "5/minute").degraded
    assert store.calls == calls  # skipped by the open breaker
