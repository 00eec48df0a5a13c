"""Per-key need and suggested limits against a brute-force search with the real limiter."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from ratekeeper import Limiter, ManualClock, Rate
from ratekeeper.simulate import suggest as suggest_module
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


def brute_needs(events: list[tuple[str, int, int]], period: float, algo: str) -> dict[str, float]:
    """Each key's need: the smallest count under which ``Limiter.hit`` rejects none of it."""
    keys = {k for k, _, _ in events}
    most = sum(c for _, _, c in events)
    brute: dict[str, float] = {}
    for n in range(1, most + 1):
        limited = limited_keys(events, n, period, algo)
        for k in keys - limited - brute.keys():
            brute[k] = float(n)
        if len(brute) == len(keys):
            break
    return brute


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_needs_of_steady_and_bursty_keys_match_brute_force(algorithm: str) -> None:
    """Keys whose need is far from their peak usage at their total (a steady key under a
    token bucket: at the total, its bucket refills far faster) and keys of one burst."""
    start = 1_700_000_000_000
    events = [("steady", start + i * 450, 1) for i in range(100)]
    events += [("burst", start + 20_000 + i, 2) for i in range(30)]
    events += [("both", start + i * 900, 1 + 3 * (i % 25 == 0)) for i in range(50)]
    assert_needs_are_brute_force(events, algorithm)


def assert_needs_are_brute_force(events: list[tuple[str, int, int]], algorithm: str) -> None:
    """``Demand.needs`` of the events (sorted by time) at 5 s is the brute-force search's."""
    events.sort(key=lambda e: e[1])
    demand = Demand(5000)
    for key, t, cost in events:
        demand.add(key, t, cost)
    needs = demand.needs(algorithm)
    assert {k: needs[i] for k, i in demand.ids.items()} == brute_needs(events, 5.0, algorithm)
    demand.close()


@pytest.mark.parametrize("algorithm", ["token_bucket", "gcra"])
def test_passes_leave_settled_keys_behind_and_find_the_same_needs(
    algorithm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once most events are of settled keys, the passes read a copy without them."""
    compactions = []

    def compact(*args: Any) -> Any:
        compactions.append(args[1].count(True))
        return real(*args)

    real = suggest_module._compact
    monkeypatch.setattr(suggest_module, "_compact", compact)
    monkeypatch.setattr(suggest_module, "CHUNK", 3 * 7)  # events split between chunks
    start = 1_700_000_000_000
    events = [("steady", start + i * 450, 1) for i in range(90)]
    events += [(f"once{i}", start + i * 337, 1 + i % 3) for i in range(120)]
    assert_needs_are_brute_force(events, algorithm)
    assert compactions and compactions[-1] == 1  # at last only the steady key is read


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
    brute = brute_needs(events, period, algorithm)
    assert {k: needs[demand.ids[k]] for k in keys} == brute
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
