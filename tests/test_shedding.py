"""Load shedders: fleet usage reserves room for critical work; worker utilization ramps slowly."""

from __future__ import annotations

import asyncio
import random

import pytest

from ratekeeper import (
    AsyncFleetUsageShedder,
    FleetUsageShedder,
    ManualClock,
    MemoryStore,
    ShedderSettings,
    WorkerUtilizationShedder,
)
from ratekeeper.errors import ConfigError
from ratekeeper.stores.leases import LeaseStore
from tests.conftest import Backend


@pytest.fixture
def store(backend: Backend) -> LeaseStore:
    """Every store: memory, Redis, sharded Redis and Redis Cluster (the fleet key on one shard)."""
    lease_store: LeaseStore = backend.store
    return lease_store


def test_fleet_reserves_capacity_for_critical(store: LeaseStore) -> None:
    shedder = FleetUsageShedder(store, capacity=10, reserved_for_critical=0.2, clock=ManualClock())
    normal = [shedder.admit() for _ in range(10)]
    assert sum(1 for lease in normal if lease is not None) == 8  # 80% of 10
    critical = [shedder.admit(critical=True) for _ in range(5)]
    assert all(lease is not None for lease in critical)  # never shed, even past capacity
    assert shedder.in_use() == 13
    for lease in critical + normal:
        shedder.release(lease)
    # critical load alone can fill the non-critical share too
    busy = [shedder.admit(critical=True) for _ in range(8)]
    assert shedder.admit() is None
    shedder.release(busy[0])
    with shedder.slot() as lease:
        assert lease is not None
    assert shedder.in_use() == 7


def test_fleet_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"reserved_for_critical=1\.5"):
        FleetUsageShedder(MemoryStore(), 10, reserved_for_critical=1.5)
    everything_reserved = FleetUsageShedder(MemoryStore(), 10, reserved_for_critical=1.0)
    assert everything_reserved.admit() is None
    assert everything_reserved.admit(critical=True) is not None


def _run(
    shedder: WorkerUtilizationShedder, clock: ManualClock, utilization: float, seconds: int
) -> list[dict[str, float]]:
    """Sample once a second at a fixed utilization; the drop probabilities after each sample."""
    out = []
    for _ in range(seconds):
        clock.advance(1)
        shedder.update(utilization)
        out.append({t: shedder.drop_probability(t) for t in shedder.tiers})
    return out


def test_worker_shedder_follows_the_scripted_curve() -> None:
    clock = ManualClock()
    shedder = WorkerUtilizationShedder(clock=clock, random=random.Random(7).random)
    shedder.update(0.5)  # first sample: nothing moves
    # healthy, then the dead zone: nothing is ever shed
    for u, secs in ((0.5, 60), (0.75, 300)):
        assert all(p == 0 for row in _run(shedder, clock, u, secs) for p in row.values())
    # saturated: shedding waits ~28 s, then the lowest tier first, everything but critical by
    # ~148 s, critical never
    bad = _run(shedder, clock, 1.0, 200)
    first = {t: next(i for i, row in enumerate(bad, 1) if row[t] > 0) for t in ("test", "get")}
    full = {
        t: next(i for i, row in enumerate(bad, 1) if row[t] == 1) for t in ("test", "get", "post")
    }
    assert 28 <= first["test"] <= 30
    assert first["get"] == pytest.approx(68, abs=2) and full["test"] == pytest.approx(68, abs=2)
    assert full["get"] == pytest.approx(108, abs=2) and full["post"] == pytest.approx(148, abs=2)
    assert all(row["critical"] == 0 for row in bad)
    for tier in shedder.tiers:  # monotone while bad: no flapping
        series = [row[tier] for row in bad]
        assert series == sorted(series)
    # recovery is as slow: 10 s of health barely moves it, the top tier comes back first
    good = _run(shedder, clock, 0.0, 200)
    assert good[9]["test"] == 1 and good[9]["get"] == 1 and good[9]["post"] > 0.7
    back = {t: next(i for i, row in enumerate(good, 1) if row[t] == 0) for t in ("post", "test")}
    assert back["post"] < back["test"] == pytest.approx(120, abs=2)
    for tier in shedder.tiers:
        series = [row[tier] for row in good]
        assert series == sorted(series, reverse=True)


def test_shed_fraction_matches_probability_per_tier() -> None:
    clock = ManualClock()
    shedder = WorkerUtilizationShedder(clock=clock, random=random.Random(42).random)
    shedder.update(1.0)
    _run(shedder, clock, 1.0, 28 + 50)  # s = 50/120: test fully shed, get at 25%
    fractions = {}
    for tier in shedder.tiers:
        fractions[tier] = sum(shedder.shed(tier) for _ in range(4000)) / 4000
    assert fractions["critical"] == 0 and fractions["post"] == 0
    assert fractions["test"] == 1
    assert fractions["get"] == pytest.approx(0.25, abs=0.03)
    assert shedder.stats()["shed"]["test"] == 4000


def test_closed_loop_does_not_flap() -> None:
    """Load that drops as traffic is shed settles instead of oscillating between extremes."""
    clock = ManualClock()
    shedder = WorkerUtilizationShedder(clock=clock, random=random.Random(1).random)
    mix = {"critical": 0.3, "post": 0.3, "get": 0.3, "test": 0.3}  # offered load: 1.2 workers
    shedder.update(0.0)
    history = []
    for _ in range(1200):
        clock.advance(1)
        load = sum(share * (1 - shedder.drop_probability(t)) for t, share in mix.items())
        shedder.update(min(1.0, load))
        history.append(shedder.shedding_amount)
    tail = history[600:]
    assert max(tail) - min(tail) < 0.05  # settled
    assert 0 < tail[-1] < 1
    turns = sum(
        1
        for a, b, c in zip(history, history[1:], history[2:], strict=False)
        if (b - a) * (c - b) < 0
    )
    assert turns == 0


def test_sampling_interval_and_callable_utilization() -> None:
    clock = ManualClock()
    level = [1.0]
    shedder = WorkerUtilizationShedder(
        utilization=lambda: level[0],
        settings=ShedderSettings(seconds_before_shedding=2, seconds_to_shed_all=6, sample_every=1),
        clock=clock,
        random=random.Random(3).random,
    )
    shedder.shed("test")
    for _ in range(4):
        clock.advance(1)
        shedder.shed("test")
    assert shedder.shedding_amount == pytest.approx(-2 / 6 + 4 / 6)
    shedder.shed("test")  # same instant: no new sample
    assert shedder.shedding_amount == pytest.approx(2 / 6)
    clock.advance(100)  # a long gap counts at most seconds_before_shedding
    shedder.shed("test")
    assert shedder.shedding_amount == pytest.approx(2 / 6 + 2 / 6)


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda: ShedderSettings(good_below=0.9, bad_above=0.8), "good_below=0.9"),
        (lambda: ShedderSettings(seconds_to_shed_all=0), "seconds_to_shed_all=0"),
        (lambda: WorkerUtilizationShedder(tiers=("only",)), "tiers=('only',)"),
        (lambda: WorkerUtilizationShedder().drop_probability("vip"), "tier 'vip'"),
    ],
)
def test_bad_settings_name_the_value(make: object, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        make()  # type: ignore[operator]  # each case is a zero-argument callable


def test_async_fleet_shedder_on_every_store(backend: Backend) -> None:
    async def main() -> list[bool]:
        store = backend.make()
        shedder = AsyncFleetUsageShedder(store, capacity=5, reserved_for_critical=0.4)
        leases = await asyncio.gather(*(shedder.admit() for _ in range(6)))
        admitted = [lease is not None for lease in leases]
        critical = await shedder.admit(critical=True)
        assert critical is not None and not critical.degraded
        assert await shedder.in_use() == 4
        for lease in [*leases, critical]:
            await shedder.release(lease)
        assert await shedder.in_use() == 0
        if hasattr(store, "aclose"):
            await store.aclose()
        return admitted

    assert sum(asyncio.run(main())) == 3  # 60% of 5
