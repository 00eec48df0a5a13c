"""Two app servers whose clocks differ by 2 s share one key, on every store.

The documented bound (docs/scaling.md, "Clock skew"): state holds the writer's times and a
lagging clock never moves it back, so decisions are those of one clock running up to ``s``
ahead — over any span of ``D`` seconds the limiter admits at most what one correct clock admits
over ``D + s``. Per algorithm (limit ``L`` per period ``P``):

- fixed_window: each window admits at most ``L``, and windows open at least ``P - s`` apart;
- token_bucket, gcra: at most ``burst + L * (D + s) / P`` over any ``D``;
- sliding_log: at most ``L`` in any ``P - s``;
- sliding_window: at most ``L`` in ``[kP, (k+1)P - s)`` for every grid period ``k``.

And no wobble: ``reset_at`` comes from stored state, so for fixed_window, token_bucket and gcra
the two servers never disagree back and forth (the sequence never decreases).
"""

from __future__ import annotations

import itertools
import random
from collections import defaultdict
from dataclasses import dataclass

import pytest

from ratekeeper import Limiter, ManualClock
from tests.conftest import Backend

SKEW = 2.0
L, P = 10, 10.0
RATE = "10/10s"
START = 1_700_000_000.0  # a multiple of P: the grid is the same in true time
ALGORITHMS = ["fixed_window", "token_bucket", "gcra", "sliding_window", "sliding_log"]


@dataclass(frozen=True)
class Event:
    true: float
    server: str
    allowed: bool
    reset_at: float


def run(backend: Backend, algorithm: str, seed: int) -> list[Event]:
    """Both servers hit one key at random, busy 10 s out of every 15 s, for 60 s."""
    rng = random.Random(seed)
    behind, ahead = ManualClock(START), ManualClock(START + SKEW)
    servers = {
        "behind": Limiter(backend.make(), clock=behind, fail_open=False),
        "ahead": Limiter(backend.make(), clock=ahead, fail_open=False),
    }
    events = []
    step = 0.1
    for i in range(600):
        true = round(i * step, 3)
        if true % 15 < 10:
            names = ["behind", "ahead"]
            rng.shuffle(names)
            for name in names:
                if rng.random() < 0.6:
                    d = servers[name].hit("shared", RATE, algorithm=algorithm)
                    assert not d.degraded
                    events.append(Event(true, name, d.allowed, d.reset_at))
        behind.advance(step)
        ahead.advance(step)
    return events


def most_in_any(times: list[float], span: float) -> int:
    """The most admissions in any half-open interval of ``span`` seconds."""
    best, j = 0, 0
    for i, t in enumerate(times):
        while times[j] <= t - span + 1e-9:
            j += 1
        best = max(best, i - j + 1)
    return best


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_skewed_clocks_stay_within_the_documented_bound(backend: Backend, algorithm: str) -> None:
    backend.flush()
    events = run(backend, algorithm, seed=ALGORITHMS.index(algorithm))
    admitted = [e for e in events if e.allowed]
    times = [e.true for e in admitted]
    assert {e.server for e in admitted} == {"behind", "ahead"}
    assert len(admitted) < len(events)  # the limit was reached: the bound is exercised

    if algorithm == "fixed_window":
        windows: dict[float, list[float]] = defaultdict(list)
        for e in admitted:
            windows[e.reset_at].append(e.true)
        assert max(len(ts) for ts in windows.values()) <= L
        opened = sorted(ts[0] for ts in windows.values())
        assert all(b - a >= P - SKEW - 1e-9 for a, b in itertools.pairwise(opened))
    elif algorithm in ("token_bucket", "gcra"):
        for i, t_i in enumerate(times):
            for j in range(i, len(times)):
                assert j - i + 1 <= L + L * (times[j] - t_i + SKEW) / P + 1e-9, (t_i, times[j])
    elif algorithm == "sliding_log":
        assert most_in_any(times, P - SKEW) <= L
    else:
        for k in range(7):
            assert sum(k * P <= t < (k + 1) * P - SKEW for t in times) <= L

    if algorithm in ("fixed_window", "token_bucket", "gcra"):
        resets = [e.reset_at for e in events]
        assert all(a <= b for a, b in itertools.pairwise(resets)), "reset_at wobbled"


def test_fixed_window_servers_agree_on_reset_at(backend: Backend) -> None:
    """GitHub's wobble: both servers report the stored end, whatever their own clocks say."""
    backend.flush()
    behind, ahead = ManualClock(START), ManualClock(START + SKEW)
    a = Limiter(backend.make(), clock=behind, fail_open=False)
    b = Limiter(backend.make(), clock=ahead, fail_open=False)
    first = a.hit("user:1", "5/minute")
    seen = {first.reset_at}
    for _ in range(3):
        behind.advance(0.7)
        ahead.advance(0.7)
        seen |= {b.hit("user:1", "5/minute").reset_at, a.hit("user:1", "5/minute").reset_at}
    assert seen == {START + 60}
