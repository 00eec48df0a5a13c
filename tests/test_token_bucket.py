"""token_bucket: Stripe's burst example, fractional refill, costs above 1, burst + rate*d bound."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tests.harness import StoreFactory, burst, drain, make_limiter, replay, small_rates, timelines

TB: dict[str, Any] = {"algorithm": "token_bucket"}


def test_stripe_burst_example(make_store: StoreFactory) -> None:
    limiter, clock = make_limiter(store=make_store())
    assert burst(limiter, "k", "100/second", 500, burst=500, **TB) == 500
    d = limiter.hit("k", "100/second", burst=500, **TB)
    assert (d.allowed, d.retry_after, d.limit, d.remaining) == (False, 0.01, 500, 0)
    assert d.reset_at == clock() + 5.0  # empty -> full takes 500 / 100 per second
    clock.advance(1)
    assert drain(limiter, "k", "100/second", burst=500, **TB) == 100


def test_steady_rate_after_a_burst_is_one_per_interval(make_store: StoreFactory) -> None:
    limiter, clock = make_limiter(store=make_store())
    assert drain(limiter, "k", "100/second", burst=500, **TB) == 500
    for _ in range(50):
        clock.advance(0.009)
        assert not limiter.hit("k", "100/second", burst=500, **TB).allowed
        clock.advance(0.001)
        assert limiter.hit("k", "100/second", burst=500, **TB).allowed


def test_fractional_refill(make_store: StoreFactory) -> None:
    limiter, clock = make_limiter(store=make_store())
    assert drain(limiter, "k", "3/second", **TB) == 3
    d = limiter.hit("k", "3/second", **TB)
    assert d.retry_after == 0.334  # one token is 1000/3 ms of refill, rounded up to whole ms
    clock.advance(0.333)
    assert not limiter.hit("k", "3/second", **TB).allowed
    clock.advance(0.001)
    assert limiter.hit("k", "3/second", **TB).allowed
    clock.advance(0.667)  # 1001 ms since the drain: 3.003 tokens refilled, 1 taken
    assert drain(limiter, "k", "3/second", **TB) == 2


def test_cost_above_one(make_store: StoreFactory) -> None:
    limiter, clock = make_limiter(store=make_store())
    d = limiter.hit("k", "10/second", cost=7, **TB)
    assert (d.allowed, d.remaining) == (True, 3)
    d = limiter.hit("k", "10/second", cost=4, **TB)
    assert (d.allowed, d.remaining, d.retry_after) == (False, 3, 0.1)
    clock.advance(0.1)
    assert limiter.hit("k", "10/second", cost=4, **TB).allowed
    d = limiter.hit("k", "10/second", cost=11, **TB)
    assert not d.allowed and d.retry_after == math.inf


def test_refund_never_overfills(make_store: StoreFactory) -> None:
    limiter, _ = make_limiter(store=make_store())
    limiter.hit("k", "10/second", cost=2, **TB)
    limiter.refund("k", "10/second", cost=5, **TB)
    assert limiter.peek("k", "10/second", **TB).remaining == 10
    assert drain(limiter, "k", "10/second", **TB) == 10


@given(st.data())
def test_never_more_than_burst_plus_refill(data: st.DataObject) -> None:
    rate = data.draw(small_rates)
    capacity = data.draw(st.integers(1, 15))
    events = data.draw(timelines(rate))
    admitted = replay("token_bucket", rate, events, burst=capacity)
    for i, first in enumerate(admitted):
        used = 0
        for last in admitted[i:]:
            used += last.cost
            refill = (last.at_ms - first.at_ms) * rate.count // rate.period_ms
            assert used <= capacity + refill
