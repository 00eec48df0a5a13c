"""sliding_window: ClassDojo's worked examples from the definitions, and the two promises."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from ratekeeper import Rate
from ratekeeper.algorithms import sliding_window
from tests.harness import T0, StoreFactory, drain, make_limiter, replay, small_rates, timelines

SW: dict[str, Any] = {"algorithm": "sliding_window"}


def test_classdojo_one_bucket_admits_25_at_1_15_and_75_at_1_45(make_store: StoreFactory) -> None:
    for at, expected in ((75, 25), (105, 75)):
        limiter, clock = make_limiter(store=make_store())
        key = f"client-{at}"  # one store for both runs: a key each
        for i in range(100):
            clock.set(T0 + i * 0.15)
            assert limiter.hit(key, "100/minute", **SW).allowed
        clock.set(T0 + at)
        assert drain(limiter, key, "100/minute", **SW) == expected


def test_classdojo_two_buckets_admit_50_at_1_15(make_store: StoreFactory) -> None:
    limiter, clock = make_limiter(store=make_store())
    for i in range(100):
        clock.set(T0 + i * 0.15)
        assert limiter.hit("k", "100/minute", buckets=2, **SW).allowed
    clock.set(T0 + 75)
    assert drain(limiter, "k", "100/minute", buckets=2, **SW) == 50


def test_classdojo_late_burst_still_blocked_at_1_15_with_two_buckets(
    make_store: StoreFactory,
) -> None:
    limiter, clock = make_limiter(store=make_store())
    clock.set(T0 + 59.4)
    assert sum(limiter.hit("k", "100/minute", buckets=2, **SW).allowed for _ in range(100)) == 100
    clock.set(T0 + 75)
    d = limiter.hit("k", "100/minute", buckets=2, **SW)
    assert not d.allowed
    # the 0:30-1:00 bucket counts in full until 1:30, then fades: 1 fits once it weighs 99
    assert d.retry_after == 15.3
    clock.set(T0 + 90.299)
    assert not limiter.hit("k", "100/minute", buckets=2, **SW).allowed
    clock.set(T0 + 90.3)
    assert limiter.hit("k", "100/minute", buckets=2, **SW).allowed


def test_classdojo_late_burst_with_one_bucket_lets_25_through_at_1_15(
    make_store: StoreFactory,
) -> None:
    limiter, clock = make_limiter(store=make_store())
    clock.set(T0 + 59.4)
    for _ in range(100):
        assert limiter.hit("k", "100/minute", **SW).allowed
    clock.set(T0 + 75)
    assert drain(limiter, "k", "100/minute", **SW) == 25


def test_reset_at_is_when_the_newest_bucket_stops_counting(make_store: StoreFactory) -> None:
    limiter, clock = make_limiter(store=make_store())
    clock.set(T0 + 10)
    d = limiter.hit("k", "100/minute", buckets=2, **SW)
    # counted from the 0:00-0:30 bucket: in full until 1:00, fading out by 1:30
    assert d.reset_at == T0 + 90
    assert limiter.peek("k", "100/minute", buckets=2, **SW).reset_at == T0 + 90


def test_refund_takes_from_the_newest_bucket_first() -> None:
    limit = sliding_window.make_limit(Rate(10, 60.0), {"buckets": 2})
    state = (5, (1, 0, 4))
    assert sliding_window.refund(state, limit, 5 * 30_000, 3) == (5, (0, 0, 2))
    assert sliding_window.refund(state, limit, 5 * 30_000, 99) == (5, (0,))


@given(st.data())
def test_aligned_periods_hold_the_limit_and_any_period_twice_it(data: st.DataObject) -> None:
    rate = data.draw(small_rates)
    buckets = data.draw(st.integers(1, 4))
    events = data.draw(timelines(rate))
    offset_ms = data.draw(st.integers(0, rate.period_ms))
    start = T0 + offset_ms / 1000
    admitted = replay("sliding_window", rate, events, start=start, buckets=buckets)
    by_bucket: dict[int, int] = {}
    for a in admitted:
        index = (round(T0 * 1000) + offset_ms + a.at_ms) * buckets // rate.period_ms
        by_bucket[index] = by_bucket.get(index, 0) + a.cost
    for oldest in by_bucket:
        aligned = sum(by_bucket.get(oldest + j, 0) for j in range(buckets))
        assert aligned <= rate.count
    for first in admitted:
        inside = sum(
            a.cost for a in admitted if first.at_ms <= a.at_ms < first.at_ms + rate.period_ms
        )
        assert inside <= 2 * rate.count
