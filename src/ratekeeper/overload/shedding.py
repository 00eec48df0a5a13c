"""Load shedders: Stripe's fleet-usage shedder and worker-utilization shedder.

A load shedder decides from the state of the system, not from who is asking.

**Fleet usage** (``FleetUsageShedder``): the concurrency limiter's leases on one global key.
Every request in progress holds a lease; a non-critical request is admitted only while fewer
than ``(1 - reserved_for_critical) * capacity`` leases are live, a critical one always (and its
lease counts), so the reserved share of the fleet stays free for critical work.

**Worker utilization** (``WorkerUtilizationShedder``): a local controller, utilization in and a
drop probability per priority tier out. ``tiers`` run from most to least important; the first
is never shed. The controller keeps a *shedding amount* ``s`` in ``[resting, 1]`` where
``resting = -seconds_before_shedding / seconds_to_shed_all``. Each sample moves ``s`` by
``elapsed * d / seconds_to_shed_all`` (``elapsed`` capped at ``seconds_before_shedding``):

- utilization ``u < good_below``:  ``d = u / good_below - 1`` (in ``[-1, 0)``: recover slowly)
- ``good_below <= u < bad_above``:  ``d = 0`` (a dead zone: no change)
- ``u >= bad_above``:  ``d = (u - bad_above) / (1 - bad_above)`` (up to 1: shed more)

With ``m`` sheddable tiers, the j-th least important drops with probability
``clamp(s * m - j, 0, 1)``: the lowest tier fills first, everything but the first tier is shed
at ``s = 1``. Timeline with the defaults (0.7 / 0.8 / 28 s / 120 s) and tiers critical > post >
get > test, utilization pinned at 1.0 from rest::

    t=0 s    s=-0.233  nothing shed
    t=28 s   s=0       shedding starts (test tier)     t=68 s   test tier fully shed
    t=108 s  get tier fully shed                        t=148 s  everything but critical shed

and back at utilization 0 it takes as long again to recover — slow both ways, so shedding a tier
and the relief it brings cannot make it flap. Time and randomness are injected.
"""

from __future__ import annotations

import contextlib
import math
import random as _random
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..clock import Clock
from ..errors import ConfigError
from ..stores.leases import AsyncLeaseStore, LeaseStore
from .concurrency import AsyncConcurrencyLimiter, ConcurrencyLimiter, Lease, check_capacity

DEFAULT_TIERS = ("critical", "post", "get", "test")
"""Priority tiers, most important first: critical methods, POSTs, GETs, test-mode traffic."""

UNLIMITED = 2**52 - 1


def check_tiers(tiers: Sequence[str]) -> tuple[str, ...]:
    """Priority tiers: two or more distinct names, most important first."""
    tiers = tuple(tiers)
    if (
        len(tiers) < 2
        or len(set(tiers)) != len(tiers)
        or not all(isinstance(t, str) and t for t in tiers)
    ):
        raise ConfigError(
            f"tiers={tiers!r} is invalid; expected two or more distinct names, most important first"
        )
    return tiers


def _reserve(capacity: int, reserved: float) -> int:
    check_capacity(capacity)
    if isinstance(reserved, bool) or not isinstance(reserved, int | float):
        raise ConfigError(f"reserved_for_critical={reserved!r} is invalid; expected 0 to 1")
    if not 0 <= reserved <= 1:
        raise ConfigError(f"reserved_for_critical={reserved!r} is invalid; expected 0 to 1")
    return math.floor(capacity * (1 - reserved) + 1e-9)


class FleetUsageShedder:
    """A fleet-wide count of requests in progress; non-critical ones shed past their share."""

    def __init__(
        self,
        store: LeaseStore,
        capacity: int,
        reserved_for_critical: float = 0.2,
        lease_ttl: float = 60.0,
        *,
        key: str = "fleet",
        clock: Clock = time.time,
        fail_open: bool = True,
    ) -> None:
        self.non_critical_capacity = _reserve(capacity, reserved_for_critical)
        self.reserved_for_critical = float(reserved_for_critical)
        self.key = key
        self.limiter = ConcurrencyLimiter(
            store, capacity, lease_ttl, clock=clock, fail_open=fail_open
        )

    def admit(self, critical: bool = False) -> Lease | None:
        """A lease for this request, or None if it should be shed (503)."""
        if critical:
            return self.limiter.acquire(self.key, capacity=UNLIMITED)
        if self.non_critical_capacity == 0:
            return None
        return self.limiter.acquire(self.key, capacity=self.non_critical_capacity)

    def release(self, lease: Lease | None) -> None:
        """Give the lease back when the request ends."""
        self.limiter.release(lease)

    @contextlib.contextmanager
    def slot(self, critical: bool = False) -> Iterator[Lease | None]:
        """``with shedder.slot(critical) as lease:`` — None means shed."""
        lease = self.admit(critical)
        try:
            yield lease
        finally:
            self.release(lease)

    def in_use(self) -> int:
        """Requests in progress over the fleet now."""
        return self.limiter.in_use(self.key)


class AsyncFleetUsageShedder:
    """The same shedder for asyncio."""

    def __init__(
        self,
        store: AsyncLeaseStore,
        capacity: int,
        reserved_for_critical: float = 0.2,
        lease_ttl: float = 60.0,
        *,
        key: str = "fleet",
        clock: Clock = time.time,
        fail_open: bool = True,
    ) -> None:
        self.non_critical_capacity = _reserve(capacity, reserved_for_critical)
        self.reserved_for_critical = float(reserved_for_critical)
        self.key = key
        self.limiter = AsyncConcurrencyLimiter(
            store, capacity, lease_ttl, clock=clock, fail_open=fail_open
        )

    async def admit(self, critical: bool = False) -> Lease | None:
        """A lease for this request, or None if it should be shed (503)."""
        if critical:
            return await self.limiter.acquire(self.key, capacity=UNLIMITED)
        if self.non_critical_capacity == 0:
            return None
        return await self.limiter.acquire(self.key, capacity=self.non_critical_capacity)

    async def release(self, lease: Lease | None) -> None:
        """Give the lease back when the request ends."""
        await self.limiter.release(lease)

    @contextlib.asynccontextmanager
    async def slot(self, critical: bool = False) -> AsyncIterator[Lease | None]:
        """``async with shedder.slot(critical) as lease:`` — None means shed."""
        lease = await self.admit(critical)
        try:
            yield lease
        finally:
            await self.release(lease)

    async def in_use(self) -> int:
        """Requests in progress over the fleet now."""
        return await self.limiter.in_use(self.key)


@dataclass(frozen=True, slots=True)
class ShedderSettings:
    """The worker-utilization controller's constants (see the module docstring)."""

    good_below: float = 0.7
    bad_above: float = 0.8
    seconds_before_shedding: float = 28.0
    seconds_to_shed_all: float = 120.0
    sample_every: float = 1.0

    def __post_init__(self) -> None:
        if not 0 < self.good_below <= self.bad_above < 1:
            raise ConfigError(
                f"good_below={self.good_below!r}, bad_above={self.bad_above!r} are invalid; "
                "expected 0 < good_below <= bad_above < 1"
            )
        for name in ("seconds_before_shedding", "seconds_to_shed_all"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name}={getattr(self, name)!r} is invalid; expected > 0")
        if not self.sample_every >= 0:
            raise ConfigError(f"sample_every={self.sample_every!r} is invalid; expected >= 0")

    @classmethod
    def fast(cls) -> ShedderSettings:
        """Constants for one server process, which saturates within a second: shedding starts
        after 1 s of a true overload signal and reaches every tier but the first in 8 s; the
        dead zone sits at 85-95 % utilization, where a Python server still answers in tens of
        milliseconds (the middleware's default; see docs/middleware.md for choosing them)."""
        return cls(
            0.85, 0.95, seconds_before_shedding=1.0, seconds_to_shed_all=8.0, sample_every=0.1
        )

    @property
    def resting(self) -> float:
        """The shedding amount at rest (negative: the delay before shedding starts)."""
        return -self.seconds_before_shedding / self.seconds_to_shed_all

    def direction(self, utilization: float) -> float:
        """The controller's push in [-1, 1] for one utilization sample."""
        u = min(1.0, max(0.0, utilization))
        if u < self.good_below:
            return u / self.good_below - 1
        if u < self.bad_above:
            return 0.0
        return min(1.0, (u - self.bad_above) / (1 - self.bad_above))


class WorkerUtilizationShedder:
    """The last line of defence: sheds low-priority tiers while this process is saturated.

    ``utilization`` is a zero-argument callable returning a number in [0, 1] (the middleware
    passes its own in-flight fraction when this is None). ``random`` returns floats in [0, 1):
    pass ``random.Random(seed).random`` for repeatable tests.
    """

    def __init__(
        self,
        utilization: Callable[[], float] | None = None,
        tiers: Sequence[str] = DEFAULT_TIERS,
        *,
        settings: ShedderSettings | None = None,
        clock: Clock = time.time,
        random: Callable[[], float] = _random.random,
    ) -> None:
        tiers = check_tiers(tiers)
        self.utilization = utilization
        self.tiers = tiers
        self.settings = ShedderSettings() if settings is None else settings
        self.clock = clock
        self.random = random
        self._rank = {t: i for i, t in enumerate(reversed(tiers[1:]))}
        self._amount = self.settings.resting
        self._last_update: float | None = None
        self._lock = threading.Lock()
        self.counts = dict.fromkeys(tiers, 0)
        self.last_utilization = 0.0

    @property
    def shedding_amount(self) -> float:
        """The controller's state ``s`` (see the module docstring)."""
        return self._amount

    def update(self, utilization: float | None = None) -> float:
        """Take one utilization sample now and move the controller; returns ``s``."""
        if utilization is None:
            if self.utilization is None:
                raise ConfigError("no utilization given and no utilization callable configured")
            utilization = self.utilization()
        settings = self.settings
        with self._lock:
            now = self.clock()
            last = now if self._last_update is None else self._last_update
            self._last_update = now
            elapsed = min(max(0.0, now - last), settings.seconds_before_shedding)
            self.last_utilization = utilization
            push = settings.direction(utilization) / settings.seconds_to_shed_all
            self._amount = min(1.0, max(settings.resting, self._amount + elapsed * push))
            return self._amount

    def drop_probability(self, tier: str) -> float:
        """The chance a request of ``tier`` is shed now (0 for the first tier)."""
        if tier == self.tiers[0]:
            return 0.0
        rank = self._rank.get(tier)
        if rank is None:
            raise ConfigError(f"tier {tier!r} is unknown; expected one of {', '.join(self.tiers)}")
        return min(1.0, max(0.0, self._amount * len(self._rank) - rank))

    def shed(self, tier: str, utilization: float | None = None) -> bool:
        """Sample if due (at most every ``sample_every`` s), then decide one request."""
        last = self._last_update
        if last is None or self.clock() - last >= self.settings.sample_every:
            self.update(utilization)
        p = self.drop_probability(tier)
        if p <= 0.0 or (p < 1.0 and self.random() >= p):
            return False
        self.counts[tier] += 1
        return True

    def stats(self) -> dict[str, Any]:
        """The shedding amount, each tier's drop probability and shed counts."""
        return {
            "shedding_amount": self._amount,
            "utilization": self.last_utilization,
            "drop_probability": {t: self.drop_probability(t) for t in self.tiers},
            "shed": dict(self.counts),
        }
