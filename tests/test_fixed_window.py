"""fixed_window: a stored window end (no wobble), stale windows ignored, per-window promise."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ratekeeper import ConfigError, Rate
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


# --- options: envoyproxy/ratelimit's counting ----------------------------------------------


def test_aligned_windows_start_on_the_period(make_store: StoreFactory) -> None:
    limiter, clock = make_limiter(T0 + 75.5, store=make_store())  # "1:15.5" on a minute grid
    d = limiter.hit("k", "3/minute", aligned=True)
    assert d.reset_at == T0 + 120  # the minute ends at 2:00, not 2:15.5
    clock.set(T0 + 119.999)
    assert limiter.hit("k", "3/minute", aligned=True).remaining == 1
    clock.set(T0 + 120)
    d = limiter.hit("k", "3/minute", aligned=True)
    assert (d.remaining, d.reset_at) == (2, T0 + 180)
    # a week is 7 days, aligned on the epoch as envoyproxy/ratelimit does (now - now % unit)
    week = 7 * 86400
    d = limiter.hit("w", f"5/{week}s", aligned=True)
    assert d.reset_at == (T0 + 120) - (T0 + 120) % week + week


def test_count_rejected_charges_every_hit(make_store: StoreFactory) -> None:
    limiter, clock = make_limiter(store=make_store())
    opts = {"aligned": True, "count_rejected": True}
    got = [limiter.hit("k", "10/minute", cost=c, **opts) for c in (8, 5, 1)]
    assert [d.allowed for d in got] == [True, False, False]  # the 5 was counted: 13 > 10
    assert [d.remaining for d in got] == [2, 2, 0]  # a rejection reports what it found
    plain, _ = make_limiter(store=make_store())
    assert [plain.hit("p", "10/minute", cost=c).allowed for c in (8, 5, 1)] == [True, False, True]
    # a peek of cost 0 asks whether the key is within its limit: 14 > 10 is not
    assert not limiter.peek("k", "10/minute", cost=0, **opts).allowed
    clock.advance(60)
    assert limiter.hit("k", "10/minute", cost=10, **opts).remaining == 0
    at_limit = limiter.peek("k", "10/minute", cost=0, **opts)
    assert (at_limit.allowed, at_limit.remaining) == (True, 0)  # exactly at the limit is within
    assert not limiter.peek("k", "10/minute", cost=1, **opts).allowed


def test_count_rejected_counter_is_shared_by_limits_of_one_period() -> None:
    limiter, _ = make_limiter()
    opts = {"aligned": True, "count_rejected": True}
    assert limiter.hit("k", "5/minute", cost=4, **opts).allowed
    d = limiter.hit("k", "100/minute", **opts)  # the same counter: 5 hits of 100
    assert (d.allowed, d.remaining) == (True, 95)
    assert not limiter.hit("k", "5/minute", **opts).allowed  # 6 of 5
    # without count_rejected each limit keeps its own counter, as before
    assert limiter.hit("k", "5/minute", aligned=True).remaining == 4


def test_count_rejected_stacks_charge_every_rate_and_need_distinct_periods() -> None:
    limiter, _ = make_limiter()
    opts = {"count_rejected": True}
    assert limiter.hit("k", "2/second; 3/minute", cost=2, **opts).allowed
    d = limiter.hit("k", "2/second; 3/minute", **opts)
    assert not d.allowed  # 3 of 2 per second; the minute rate (3 of 3) is charged too
    assert limiter.peek("k", "3/minute", cost=0, count_rejected=True).remaining == 0  # 3 of 3
    with pytest.raises(ConfigError, match="repeat a period"):
        limiter.hit("k", "2/minute; 3/minute", **opts)


def test_options_are_checked() -> None:
    limiter, _ = make_limiter()
    with pytest.raises(ConfigError, match="expected True/False"):
        limiter.hit("k", "1/second", aligned=1)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="'aligned' does not apply to token_bucket"):
        limiter.hit("k", "1/second", algorithm="token_bucket", aligned=True)
    limiter.hit("k", "1/second", aligned=True)  # cached: the same check still applies
    with pytest.raises(ConfigError, match="expected True/False"):
        limiter.hit("k", "1/second", aligned=1)  # type: ignore[arg-type]


def test_count_rejected_counter_stops_at_its_cap() -> None:
    limit = fixed_window.make_limit(Rate(10, 60.0), {"count_rejected": True})
    outcome, state = fixed_window.step((fixed_window.MAX_COUNT - 1, 60_000), limit, 0, 5, True)
    assert not outcome.allowed and state == (fixed_window.MAX_COUNT, 60_000)
