"""sliding_log: exact over every window, in both directions, against a reference count."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ratekeeper import ConfigError, Limiter
from tests.harness import T0, StoreFactory, make_limiter, small_rates, timelines

SL: dict[str, Any] = {"algorithm": "sliding_log"}


def test_docstring_timeline(make_store: StoreFactory) -> None:
    limiter, clock = make_limiter(store=make_store())
    assert limiter.hit("k", "2/minute", **SL).allowed
    clock.set(T0 + 30)
    assert limiter.hit("k", "2/minute", **SL).allowed
    clock.set(T0 + 45)
    d = limiter.hit("k", "2/minute", **SL)
    assert (d.allowed, d.retry_after, d.reset_at) == (False, 15.0, T0 + 90)
    clock.set(T0 + 59.999)
    d = limiter.hit("k", "2/minute", **SL)
    assert (d.allowed, d.retry_after) == (False, 0.001)
    clock.set(T0 + 60)
    d = limiter.hit("k", "2/minute", **SL)
    assert (d.allowed, d.remaining, d.reset_at) == (True, 0, T0 + 120)


def test_retry_after_for_a_cost_waits_for_enough_old_units(make_store: StoreFactory) -> None:
    limiter, clock = make_limiter(store=make_store())
    for at in (0, 10, 20, 30):
        clock.set(T0 + at)
        assert limiter.hit("k", "4/minute", **SL).allowed
    clock.set(T0 + 40)
    d = limiter.hit("k", "4/minute", cost=3, **SL)
    assert (d.allowed, d.retry_after) == (False, 40.0)  # the t=20 unit is the third to leave
    clock.set(T0 + 80)
    assert limiter.hit("k", "4/minute", cost=3, **SL).allowed


def test_large_limits_are_refused_with_the_alternative() -> None:
    with pytest.raises(ConfigError, match=r"sliding_log.*use sliding_window"):
        Limiter().hit("k", "100001/hour", **SL)


@given(st.data())
def test_admits_exactly_what_fits_in_the_trailing_window(data: st.DataObject) -> None:
    rate = data.draw(small_rates)
    events = data.draw(timelines(rate))
    limiter, clock = make_limiter()
    admitted: list[tuple[int, int]] = []
    for event in events:
        clock.set(T0 + event.at_ms / 1000)
        in_window = sum(c for at, c in admitted if at > event.at_ms - rate.period_ms)
        d = limiter.hit("k", rate, cost=event.cost, **SL)
        assert d.allowed == (in_window + event.cost <= rate.count)
        if d.allowed:
            admitted.append((event.at_ms, event.cost))
            assert d.remaining == rate.count - in_window - event.cost
