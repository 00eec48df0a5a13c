"""Per-key need and suggested limits against a brute-force search with the real limiter."""

from __future__ import annotations

import math
import random

import pytest

from ratekeeper import Limiter, ManualClock, Rate
from ratekeeper.simulate.suggest import Demand, quantiles, suggest

ALGORITHMS = ["fixed_window", "sliding_window", "sliding_log", "token_bucket", "gcra"]


def small_log(seed: int) -> list[tuple[str, int, int]]:
    """(key, time ms, cost): a few keys, bursts and quiet stretches, costs 1-3."""
    rng = random.Random(seed)
    t = 1_700_000_000_000
    out = []
    for _ in range(rng.randrange(40, 160)):
        t += rng.choice((0, 0, 5, 50, 300, 900, 2500, 7000))
        out.append((f"k{rng.randrange(6)}", t, rng.choice((1, 1, 1, 2, 3))))
    return out


def limited_keys(events: list[tuple[str, int, int]], n: int, period: float, algo: str) -> set[str]:
    clock = ManualClock()
    limiter = Limiter(clock=clock)
    rate = Rate(n, period)
    hit = set()
    for key, t, cost in events:
        clock.set(t / 1000)
        if not limiter.hit(key, (rate,), algorithm=algo, cost=cost).allowed:
            hit.add(key)
    return hit


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("seed", range(4))
def test_needs_and_suggestion_match_brute_force(algorithm: str, seed: int) -> None:
    events = small_log(seed)
    period = 10.0
    demand = Demand(int(period * 1000))
    for key, t, cost in events:
        demand.add(key, t, cost)
    needs = demand.needs(algorithm)
    keys = list(demand.ids)
    totals = {k: sum(c for kk, _, c in events if kk == k) for k in keys}
    brute = {}
    for n in range(1, max(totals.values()) + 1):
        limited = limited_keys(events, n, period, algorithm)
        for k in keys:
            if k not in limited and k not in brute:
                brute[k] = n
    assert {k: needs[demand.ids[k]] for k in keys} == {k: float(brute[k]) for k in keys}
    for share in (0.0, 0.2, 0.5):
        s = suggest(needs, share, algorithm, period)
        allowed = math.floor(share * len(keys) + 1e-9)
        smallest = next(
            n
            for n in range(1, max(totals.values()) + 1)
            if len(limited_keys(events, n, period, algorithm)) <= allowed
        )
        assert s.count == smallest
        assert s.limited_keys == len(limited_keys(events, smallest, period, algorithm))
    demand.close()


def test_quantiles_by_nearest_rank() -> None:
    needs = [float(x) for x in range(1, 101)]
    assert quantiles(needs) == {"p50": 50.0, "p90": 90.0, "p99": 99.0, "max": 100.0}
    assert quantiles([]) == {}


def test_a_need_past_the_largest_count_is_infinite() -> None:
    demand = Demand(1000)
    for _ in range(3):
        demand.add("k", 1_700_000_000_000, 60_000)  # 180,000 at once: past sliding_log's cap
    assert demand.needs("sliding_log") == [math.inf]
    assert suggest([math.inf], 0.0, "sliding_log", 1.0).count is None
