"""The gradient concurrency limit, driven by scripted latency models on a ManualClock."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from ratekeeper import GradientLimit, GradientSettings, ManualClock
from ratekeeper.errors import ConfigError

SERVICE = 0.003  # seconds a request costs alone


def drive(
    limit: GradientLimit,
    clock: ManualClock,
    latency: Callable[[int], float],
    seconds: float,
    rate: int = 2000,
    busy: bool = True,
) -> list[int]:
    """Requests finish ``rate`` times a second with ``latency(limit)``; the limit after each
    quarter second. ``busy``: every slot is in use (else one request at a time)."""
    out = []
    for step in range(int(seconds * rate)):
        clock.advance(1 / rate)
        current = limit.limit
        limit.sample(latency(current), current if busy else 1)
        if step % (rate // 4) == rate // 4 - 1:
            out.append(limit.limit)
    return out


def make(**settings: float) -> tuple[GradientLimit, ManualClock]:
    clock = ManualClock(0)
    return GradientLimit(GradientSettings(**settings), clock=clock, random=lambda: 0.5), clock  # type: ignore[arg-type]  # test settings


def test_one_core_cpu_bound_settles_low() -> None:
    """Processor sharing: L requests at once each take L times as long. The limit settles at
    1-2 within a few seconds and stays there."""
    limit, clock = make()
    history = drive(limit, clock, lambda n: n * SERVICE, seconds=20)
    settled = history[12:]  # after 3 s
    assert max(settled) <= 2 and min(settled) >= 1
    assert limit.baseline == pytest.approx(SERVICE)


@pytest.mark.parametrize("knee", [40, 250])
def test_io_bound_finds_the_knee(knee: int) -> None:
    """Latency flat up to ``knee`` in progress, then growing with the queue: the limit climbs
    from 4 past the knee (a quarter of the way to 1.2x per 0.1 s: 250 within 6 s) and settles
    within the tolerance band above it, without oscillating."""
    limit, clock = make(tolerance=0.2)
    history = drive(limit, clock, lambda n: SERVICE * max(1.0, n / knee), seconds=30)
    assert history[23] >= knee  # after 6 s
    tail = history[-40:]
    assert all(knee <= x <= 1.4 * knee for x in tail)
    assert max(tail) - min(tail) <= 0.02 * knee + 2


def test_recovers_when_latency_returns_to_baseline() -> None:
    limit, clock = make()
    drive(limit, clock, lambda n: SERVICE, seconds=2)  # baseline learnt
    slow = drive(limit, clock, lambda n: 5 * SERVICE, seconds=5)  # overload: 5x latency
    assert slow[-1] <= 3  # pushed down towards the floor
    fast = drive(limit, clock, lambda n: SERVICE, seconds=10)
    recovered = next(i for i, x in enumerate(fast) if x >= 16) / 4
    assert recovered <= 5  # back above the initial limit within 5 s


def test_app_limited_does_not_grow() -> None:
    """One request at a time is no evidence that more would go well: the limit stays put."""
    limit, clock = make()
    history = drive(limit, clock, lambda n: SERVICE, seconds=5, busy=False)
    assert set(history) == {GradientSettings().initial}


def test_probe_drops_to_floor_for_one_update_and_is_jittered() -> None:
    draws = iter([0.0, 1.0, 0.5])
    clock = ManualClock(0)
    settings = GradientSettings(probe_every=10, jitter=0.5, min_samples=1, update_every=0.1)
    limit = GradientLimit(settings, clock=clock, random=lambda: next(draws))
    probes = []
    for _ in range(300):  # 30 s, one request per 0.1 s, latency at baseline
        clock.advance(0.1)
        limit.sample(SERVICE, limit.limit)
        if limit.probing:
            probes.append(round(clock(), 1))
    # first probe at once; the next 10 s * (1 - 0.5) later, then 10 s * (1 + 0.5)
    assert probes[0] == pytest.approx(0.1)
    gaps = [b - a for a, b in itertools.pairwise(probes)]
    assert gaps == pytest.approx([5.1, 15.1], abs=0.15)  # one update's step either way


def test_ramp_bounds_each_update_and_floor_and_ceiling_hold() -> None:
    """However bad one update's latency, the limit moves a quarter of the way to half of it."""
    limit, clock = make(min_samples=1, probe_every=1000, smoothing=0.25, ceiling=40)
    drive(limit, clock, lambda n: SERVICE, seconds=5, rate=4)  # probe, then growth to 40
    assert limit.limit == 40
    clock.advance(0.25)
    limit.sample(100 * SERVICE, limit.limit)
    target = 40 * 0.5 + 40**0.5 - 1
    assert limit.value == pytest.approx(40 + 0.25 * (target - 40))
    drive(limit, clock, lambda n: 100 * SERVICE, seconds=10, rate=4)
    assert limit.limit == 1


@pytest.mark.parametrize(
    ("settings", "needle"),
    [
        ({"floor": 0}, "floor=0"),
        ({"floor": 8, "initial": 4}, "floor=8, initial=4"),
        ({"tolerance": 0}, "tolerance=0"),
        ({"smoothing": 0}, "smoothing=0"),
        ({"jitter": 1.5}, "jitter=1.5"),
        ({"min_samples": 2.5}, "min_samples=2.5"),
    ],
)
def test_bad_settings_name_the_value(settings: dict[str, float], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        GradientSettings(**settings)  # type: ignore[arg-type]  # deliberately bad
