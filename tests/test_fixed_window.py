"""fixed_window: a stored window end (no wobble), stale windows ignored, per-window promise."""

from __future__ import annotations

import itertools
import math

from hypothesis import given
from hypothesis import strategies as st

from ratekeeper import Rate
from ratekeeper.algorithms import fixed_window
from tests.harness import T0, StoreFactory, make_limiter, replay, small_rates, timelines


def test_docstring_timeline(make_store: StoreFactory) -> None:
    limiter, clock = make_limiter(store=make_store())
    clock.set(T0 + 10)
    assert limiter.hit("k", "3/minute").reset_at == T0 + 70
    clock.set(T0 + 20)
    assert limiter.hit("k", "3/minute").remaining == 1
    clock.set(T0 + 30)
    d = limiter.hit("k", "3/minute")
    assert (d.allowed, d.remaining) == (True, 0)
    clock.set(T0 + 40)
    d = limiter.hit("k", "3/minute")
    assert (d.allowed, d.retry_after, d.reset_at) == (False, 30.0, T0 + 70)
    clock.set(T0 + 70)
    d = limiter.hit("k", "3/minute")
    assert (d.allowed, d.remaining, d.reset_at) == (True, 2, T0 + 130)


def test_reset_at_never_wobbles_within_a_window(make_store: StoreFactory) -> None:
    limiter, clock = make_limiter(T0 + 0.123, store=make_store())
    resets = set()
    headers = set()
    for step_ms in range(0, 60_000, 997):
        clock.set(T0 + 0.123 + step_ms / 1000)
        for op in (limiter.hit, limiter.peek):
            d = op("k", "50/minute")
            resets.add(d.reset_at)
            headers.add(d.headers()["X-RateLimit-Reset"])
    assert resets == {T0 + 60.123}
    assert headers == {str(math.ceil(T0 + 60.123))}


def test_stored_window_whose_end_passed_is_treated_as_fresh() -> None:
    limit = fixed_window.make_limit(Rate(3, 60.0), {})
    end = 1_000_000
    full = (3, end)
    outcome, state = fixed_window.step(full, limit, end - 1, 1, True)
    assert not outcome.allowed and state == full
    outcome, state = fixed_window.step(full, limit, end, 1, True)
    assert outcome.allowed and state == (1, end + 60_000)
    assert outcome.reset_ms == end + 60_000 and outcome.remaining == 2
    # a stale window cannot be refunded into either
    assert fixed_window.refund(full, limit, end + 5, 1) is None


def test_refund_keeps_the_window_end(make_store: StoreFactory) -> None:
    limiter, clock = make_limiter(store=make_store())
    for _ in range(3):
        limiter.hit("k", "3/minute")
    clock.advance(20)
    limiter.refund("k", "3/minute", cost=2)
    d = limiter.peek("k", "3/minute")
    assert (d.remaining, d.reset_at) == (2, T0 + 60)


@given(st.data())
def test_each_window_admits_at_most_the_limit(data: st.DataObject) -> None:
    rate = data.draw(small_rates)
    events = data.draw(timelines(rate))
    admitted = replay("fixed_window", rate, events)
    windows: dict[float, int] = {}
    for a in admitted:
        end_ms = round((a.decision.reset_at - T0) * 1000)
        assert end_ms - rate.period_ms <= a.at_ms < end_ms
        windows[end_ms] = windows.get(end_ms, 0) + a.cost
    assert all(used <= rate.count for used in windows.values())
    ends = sorted(windows)
    assert all(b - a >= rate.period_ms for a, b in itertools.pairwise(ends))
    # the documented weakness is bounded too: any period holds at most two windows' worth
    for first in admitted:
        inside = sum(
            a.cost for a in admitted if first.at_ms <= a.at_ms < first.at_ms + rate.period_ms
        )
        assert inside <= 2 * rate.count
