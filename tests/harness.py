"""Helpers the algorithm tests share: a limiter on a ManualClock, bursts, and event replays.

Everything here drives the public ``Limiter`` (or the pure steps, for state-level checks);
nothing is mocked. ``T0`` is aligned to the hour, so ``T0 + 75`` is "1:15" on a minute grid.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hypothesis import strategies as st

from ratekeeper import Decision, Limiter, ManualClock, MemoryStore, Rate
from ratekeeper.algorithms import ALGORITHMS, Limit

T0 = 1_699_999_200.0
"""An epoch second on an hour boundary (so on every minute and second boundary too)."""

NAMES = tuple(sorted(ALGORITHMS))

StoreFactory = Callable[[], Any]
"""The ``make_store`` fixture's type: each call returns a store on the test's backend."""


def make_limiter(start: float = T0, store: Any = None) -> tuple[Limiter, ManualClock]:
    """A limiter on ``store`` (default: a fresh memory store) and the clock that drives it."""
    clock = ManualClock(start=start)
    return Limiter(store=MemoryStore() if store is None else store, clock=clock), clock


def burst(limiter: Limiter, key: str, rate: str | Rate, n: int, **options: Any) -> int:
    """Send ``n`` hits at the current instant; return how many were admitted."""
    return sum(limiter.hit(key, rate, **options).allowed for _ in range(n))


def drain(limiter: Limiter, key: str, rate: str | Rate, **options: Any) -> int:
    """Hit at the current instant until the first rejection; return how many passed."""
    admitted = 0
    while limiter.hit(key, rate, **options).allowed:
        admitted += 1
        if admitted > 1_000_000:
            raise AssertionError("drain never ended: the limiter admits without bound")
    return admitted


def drain_state(algorithm: str, state: Any, limit: Limit, now_ms: int) -> int:
    """Like ``drain`` on the pure step: cost-1 hits at ``now_ms`` until the first rejection."""
    step = ALGORITHMS[algorithm].step
    admitted = 0
    while True:
        outcome, state = step(state, limit, now_ms, 1, True)
        if not outcome.allowed:
            return admitted
        admitted += 1


@dataclass(frozen=True, slots=True)
class Event:
    """One hit of a replay: ``at_ms`` after the start, with ``cost``."""

    at_ms: int
    cost: int


@dataclass(frozen=True, slots=True)
class Admitted:
    """A hit that was admitted, and the decision it got."""

    at_ms: int
    cost: int
    decision: Decision


def replay(
    algorithm: str, rate: Rate, events: list[Event], start: float = T0, **options: Any
) -> list[Admitted]:
    """Run ``events`` (sorted by time) through a fresh limiter; return the admitted ones."""
    limiter, clock = make_limiter(start)
    admitted = []
    for event in events:
        clock.set(start + event.at_ms / 1000)
        d = limiter.hit("k", rate, algorithm=algorithm, cost=event.cost, **options)
        if d.allowed:
            admitted.append(Admitted(event.at_ms, event.cost, d))
    return admitted


small_rates = st.builds(
    lambda count, period_ms: Rate(count, period_ms / 1000),
    st.integers(1, 12),
    st.integers(1, 4000),
)
"""Small rates, so a short replay reaches the limit often."""


@st.composite
def timelines(draw: st.DrawFn, rate: Rate, max_cost: int = 3) -> list[Event]:
    """Hits at non-decreasing times over a few periods, often several at one instant."""
    gaps = draw(
        st.lists(
            st.one_of(
                st.just(0),
                st.integers(0, rate.period_ms // 4 + 1),
                st.integers(0, 2 * rate.period_ms),
            ),
            min_size=1,
            max_size=60,
        )
    )
    costs = draw(st.lists(st.integers(1, max_cost), min_size=len(gaps), max_size=len(gaps)))
    events, at = [], 0
    for gap, cost in zip(gaps, costs, strict=True):
        at += gap
        events.append(Event(at, cost))
    return events
