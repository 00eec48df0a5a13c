"""Rules every algorithm keeps, checked on all five: costs, peeks, stacks, retry_after, refunds.

The plan layer (``make_policy``, ``run_stack``, ``decide``) is where these rules live; the tests
drive it through the public ``Limiter`` on the memory store, and through the pure steps for
state-level properties (a rejection or a peek returns the state it was given).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ratekeeper import Rate, RateSpecError
from ratekeeper.algorithms import ALGORITHMS
from tests.harness import (
    NAMES,
    T0,
    Event,
    StoreFactory,
    drain,
    drain_state,
    make_limiter,
    small_rates,
    timelines,
)

algorithms = pytest.mark.parametrize("algorithm", NAMES)


def options(algorithm: str) -> st.SearchStrategy[dict[str, int]]:
    """Random options the algorithm takes (none, or burst / buckets)."""
    if algorithm in ("token_bucket", "gcra"):
        return st.one_of(st.just({}), st.builds(lambda b: {"burst": b}, st.integers(1, 15)))
    if algorithm == "sliding_window":
        return st.one_of(st.just({}), st.builds(lambda n: {"buckets": n}, st.integers(1, 4)))
    return st.just({})


@algorithms
def test_a_rejection_consumes_nothing(algorithm: str, make_store: StoreFactory) -> None:
    limiter, clock = make_limiter(store=make_store())
    assert drain(limiter, "k", "5/minute", algorithm=algorithm) == 5
    first = limiter.hit("k", "5/minute", algorithm=algorithm)
    for _ in range(50):
        again = limiter.hit("k", "5/minute", algorithm=algorithm)
        assert (again.allowed, again.remaining, again.retry_after, again.reset_at) == (
            False,
            first.remaining,
            first.retry_after,
            first.reset_at,
        )
    clock.advance(first.retry_after)
    assert limiter.hit("k", "5/minute", algorithm=algorithm).allowed


@algorithms
def test_cost_zero_is_a_peek(algorithm: str, make_store: StoreFactory) -> None:
    limiter, _ = make_limiter(store=make_store())
    limiter.hit("k", "5/minute", algorithm=algorithm, cost=2)
    peeked = limiter.peek("k", "5/minute", algorithm=algorithm)
    for _ in range(10):
        assert limiter.hit("k", "5/minute", algorithm=algorithm, cost=0) == peeked
    assert peeked.allowed and peeked.remaining == 3
    assert drain(limiter, "k", "5/minute", algorithm=algorithm) == 3


@algorithms
@pytest.mark.parametrize("cost", [-1, 1.5, 1.0, "1", True, None])
def test_bad_cost_is_a_value_error_naming_it(
    algorithm: str, cost: Any, make_store: StoreFactory
) -> None:
    limiter, _ = make_limiter(store=make_store())
    with pytest.raises(RateSpecError, match=r"cost .* expected a whole number >= 1 \(0 to peek\)"):
        limiter.hit("k", "5/minute", algorithm=algorithm, cost=cost)
    with pytest.raises(ValueError, match=repr(cost).replace(".", r"\.")):
        limiter.refund("k", "5/minute", algorithm=algorithm, cost=cost)


@algorithms
def test_cost_above_capacity_never_fits(algorithm: str, make_store: StoreFactory) -> None:
    limiter, _ = make_limiter(store=make_store())
    d = limiter.hit("k", "5/minute", algorithm=algorithm, cost=6)
    assert (d.allowed, d.retry_after, d.remaining) == (False, math.inf, 5)
    assert "Retry-After" not in d.headers()
    assert drain(limiter, "k", "5/minute", algorithm=algorithm) == 5


@algorithms
def test_a_stack_is_all_or_nothing(algorithm: str, make_store: StoreFactory) -> None:
    limiter, clock = make_limiter(store=make_store())
    stack = "1/second; 3/minute"
    second, minute = Rate.parse(stack)
    d = limiter.hit("k", stack, algorithm=algorithm)
    assert d.allowed and d.rate == second and d.remaining == 0  # least remaining
    for _ in range(5):  # rejected by the per-second rate: the per-minute one is not charged
        d = limiter.hit("k", stack, algorithm=algorithm)
        assert not d.allowed and d.rate == second
    assert limiter.peek("k", minute, algorithm=algorithm).remaining == 2
    for _ in range(2):
        d = limiter.hit("k", stack, algorithm=algorithm)
        assert not d.allowed and d.rate == second
        clock.advance(d.retry_after)
        assert limiter.hit("k", stack, algorithm=algorithm).allowed
    clock.advance(2)  # the per-second rate admits again (sliding_window needs two periods)
    for _ in range(5):
        d = limiter.hit("k", stack, algorithm=algorithm)
        assert not d.allowed and d.rate == minute  # the second rate admits, the minute rejects
    assert limiter.peek("k", second, algorithm=algorithm).remaining == 1


@algorithms
def test_refund_never_below_zero_nor_above_capacity(
    algorithm: str, make_store: StoreFactory
) -> None:
    limiter, _ = make_limiter(store=make_store())
    limiter.refund("fresh", "5/minute", algorithm=algorithm, cost=3)
    assert limiter.peek("fresh", "5/minute", algorithm=algorithm).remaining == 5
    assert drain(limiter, "fresh", "5/minute", algorithm=algorithm) == 5
    limiter.hit("k", "5/minute", algorithm=algorithm, cost=2)
    limiter.refund("k", "5/minute", algorithm=algorithm, cost=1)
    assert limiter.peek("k", "5/minute", algorithm=algorithm).remaining == 4
    limiter.refund("k", "5/minute", algorithm=algorithm, cost=10)
    assert limiter.peek("k", "5/minute", algorithm=algorithm).remaining == 5
    assert drain(limiter, "k", "5/minute", algorithm=algorithm) == 5


@algorithms
def test_reset_forgets_every_rate_of_the_stack(algorithm: str, make_store: StoreFactory) -> None:
    limiter, _ = make_limiter(store=make_store())
    drain(limiter, "k", "2/second; 3/minute", algorithm=algorithm)
    limiter.reset("k", "2/second; 3/minute", algorithm=algorithm)
    assert drain(limiter, "k", "2/second; 3/minute", algorithm=algorithm) == 2


@given(st.data())
def test_retry_after_admits_then_and_not_a_millisecond_earlier(data: st.DataObject) -> None:
    algorithm = data.draw(st.sampled_from(NAMES))
    opts = data.draw(options(algorithm))
    rates = tuple(
        data.draw(st.lists(small_rates, min_size=1, max_size=2, unique_by=lambda r: r.period))
    )
    events = data.draw(timelines(rates[0]))
    limiter, clock = make_limiter()
    for event in events:
        clock.set(T0 + event.at_ms / 1000)
        d = limiter.hit("k", rates, algorithm=algorithm, cost=event.cost, **opts)
        if d.allowed or math.isinf(d.retry_after):
            continue
        retry_ms = round(d.retry_after * 1000)
        assert retry_ms >= 1 and abs(retry_ms - d.retry_after * 1000) < 1e-6  # whole ms
        clock.set(T0 + (event.at_ms + retry_ms - 1) / 1000)
        assert not limiter.peek("k", rates, algorithm=algorithm, cost=event.cost, **opts).allowed
        clock.set(T0 + (event.at_ms + retry_ms) / 1000)
        assert limiter.peek("k", rates, algorithm=algorithm, cost=event.cost, **opts).allowed


@given(st.data())
def test_stack_charges_exactly_the_admitted_hits(data: st.DataObject) -> None:
    algorithm = data.draw(st.sampled_from(NAMES))
    opts = data.draw(options(algorithm))
    rates = tuple(
        data.draw(st.lists(small_rates, min_size=2, max_size=3, unique_by=lambda r: r.period))
    )
    events = data.draw(timelines(rates[0]))
    stacked, clock = make_limiter()
    admitted: list[Event] = []
    for event in events:
        clock.set(T0 + event.at_ms / 1000)
        alone = [stacked.peek("k", r, algorithm=algorithm, cost=event.cost, **opts) for r in rates]
        d = stacked.hit("k", rates, algorithm=algorithm, cost=event.cost, **opts)
        assert d.allowed == all(a.allowed for a in alone)
        if d.allowed:
            admitted.append(event)
            after = [stacked.peek("k", r, algorithm=algorithm, **opts).remaining for r in rates]
            assert d.remaining == min(after) == after[rates.index(d.rate)]
        else:
            rejecting = [a for a in alone if not a.allowed]
            assert d.rate in [a.rate for a in rejecting]
            assert d.retry_after == max(a.retry_after for a in rejecting)
    end = clock()
    for rate in rates:  # each rate alone, fed only the admitted hits, ends in the same state
        single, single_clock = make_limiter()
        for event in admitted:
            single_clock.set(T0 + event.at_ms / 1000)
            assert single.hit("k", rate, algorithm=algorithm, cost=event.cost, **opts).allowed
        single_clock.set(end)
        assert single.peek("k", rate, algorithm=algorithm, **opts) == stacked.peek(
            "k", rate, algorithm=algorithm, **opts
        )


@given(st.data())
def test_rejections_refunds_and_peeks_never_create_capacity(data: st.DataObject) -> None:
    algorithm = data.draw(st.sampled_from(NAMES))
    module = ALGORITHMS[algorithm]
    rate = data.draw(small_rates)
    limit = module.make_limit(rate, data.draw(options(algorithm)))
    now = 1_000_000_000_000
    state: Any = None
    for event in data.draw(timelines(rate)):
        now_ms = now + event.at_ms
        before = drain_state(algorithm, state, limit, now_ms)
        assert before <= limit.capacity
        outcome, peeked = module.step(state, limit, now_ms, event.cost, False)
        assert peeked == state  # a peek never changes state
        if data.draw(st.booleans(), label="refund"):
            refunded = module.refund(state, limit, now_ms, event.cost)
            after = drain_state(algorithm, refunded, limit, now_ms)
            assert after <= min(limit.capacity, before + event.cost)
            state = refunded
            continue
        outcome, new_state = module.step(state, limit, now_ms, event.cost, True)
        if not outcome.allowed:
            assert new_state == state  # a rejection changes nothing
        else:
            assert drain_state(algorithm, new_state, limit, now_ms) <= before - event.cost
        state = new_state
