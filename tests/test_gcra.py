"""gcra: burst=1 spacing, exact retry_after, and the burst + elapsed/T bound."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ratekeeper import ConfigError, Limiter
from ratekeeper.algorithms.gcra import interval_us
from tests.harness import (
    T0,
    StoreFactory,
    burst,
    drain,
    make_limiter,
    replay,
    small_rates,
    timelines,
)

GCRA: dict[str, Any] = {"algorithm": "gcra"}


def test_docstring_timeline(make_store: StoreFactory) -> None:
    limiter, clock = make_limiter(store=make_store())
    d = limiter.hit("k", "2/second", burst=1, **GCRA)
    assert (d.allowed, d.reset_at) == (True, T0 + 0.5)
    clock.set(T0 + 0.1)
    d = limiter.hit("k", "2/second", burst=1, **GCRA)
    assert (d.allowed, d.retry_after) == (False, 0.4)
    clock.set(T0 + 0.5)
    d = limiter.hit("k", "2/second", burst=1, **GCRA)
    assert (d.allowed, d.reset_at) == (True, T0 + 1.0)


def test_burst_one_spaces_requests_evenly(make_store: StoreFactory) -> None:
    limiter, clock = make_limiter(store=make_store())
    admitted_at = []
    for ms in range(0, 2000):
        clock.set(T0 + ms / 1000)
        if limiter.hit("k", "10/second", burst=1, **GCRA).allowed:
            admitted_at.append(ms)
    assert admitted_at == list(range(0, 2000, 100))  # one per 100 ms emission interval


def test_retry_after_is_exact_to_the_millisecond(make_store: StoreFactory) -> None:
    limiter, clock = make_limiter(store=make_store())
    assert drain(limiter, "k", "3/second", **GCRA) == 3
    d = limiter.hit("k", "3/second", **GCRA)
    # T = 333_334 us (rounded up); 4 units need now >= 4T - 3T: 333.334 ms -> 334 ms
    assert interval_us(3, 1000) == 333_334
    assert d.retry_after == 0.334
    clock.advance(0.333)
    assert not limiter.hit("k", "3/second", **GCRA).allowed
    clock.advance(0.001)
    assert limiter.hit("k", "3/second", **GCRA).allowed


def test_default_burst_is_the_count_and_cost_above_burst_never_fits(
    make_store: StoreFactory,
) -> None:
    limiter, _ = make_limiter(store=make_store())
    assert burst(limiter, "k", "5/minute", 9, **GCRA) == 5
    d = limiter.hit("j", "5/minute", cost=6, **GCRA)
    assert not d.allowed and d.retry_after == math.inf
    assert "Retry-After" not in d.headers()


def test_rates_too_fine_are_refused_with_the_alternative() -> None:
    with pytest.raises(ConfigError, match=r"1,000,000/second.*use token_bucket"):
        Limiter().hit("k", "2000001/second", **GCRA)


@given(st.data())
def test_never_more_than_burst_plus_elapsed_over_interval(data: st.DataObject) -> None:
    rate = data.draw(small_rates)
    capacity = data.draw(st.integers(1, 15))
    events = data.draw(timelines(rate))
    t_us = interval_us(rate.count, rate.period_ms)
    admitted = replay("gcra", rate, events, burst=capacity)
    for i, first in enumerate(admitted):
        used = 0
        for last in admitted[i:]:
            used += last.cost
            assert used <= capacity + (last.at_ms - first.at_ms) * 1000 // t_us
