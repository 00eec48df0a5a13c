"""``ConcurrencyLimiter``: at most N requests in progress per key (Stripe's second limiter).

A request takes a ``Lease`` when it starts and gives it back when it ends. Leases live in a
lease store (``stores.leases``: memory, or a Redis sorted set scored by expiry) and expire after
``lease_ttl`` seconds by the limiter's clock, so a worker that crashed mid-request frees its slot
on its own. Sweeping expired leases, counting live ones and adding the new one are a single
atomic store call — there is no window between cleanup and count. Timeline, capacity 2, TTL 60::

    t=0   acquire(a) -> lease 1 (1 live)     t=1   acquire(a) -> lease 2 (2 live)
    t=2   acquire(a) -> None (2 live)        t=3   release(lease 1)      (1 live)
    t=4   acquire(a) -> lease 3 (2 live)     t=61  acquire(a) -> lease 4: lease 2 expired

Failure policy (``fail_open=True``, the default): a store error gives a lease marked
``degraded`` (the request goes ahead; releasing it is a no-op) and is logged at most once per
``log_interval`` seconds; ``fail_open=False`` raises ``StoreUnavailable``. As in ``Limiter``,
a ``breaker.Breaker`` (after 3 failures in a row the store is not called for 0.5 s, doubling on
each failed trial up to 30 s; all three settable) keeps a hung Redis from adding its timeout to
every request (a lease taken before the breaker opened then expires by its TTL instead of being
released). A store that is ``KeyPartitioned`` (sharded Redis) gets one breaker per shard, so a
dead shard degrades only the keys it owns. As in ``Limiter``, cool-downs and the log interval
run on ``monotonic`` (``time.monotonic`` unless injected), lease expiry on ``clock``.
``Limiter``'s rule of "over the limit is an answer, not an exception" holds: ``acquire``
returns ``None``.

``ConcurrencyLimiter`` and ``AsyncConcurrencyLimiter`` share ``_LeaseCore`` and differ only
where ``await`` appears.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

from ..breaker import Breaker
from ..clock import Clock
from ..errors import ConfigError, StoreUnavailable
from ..plan import check_key
from ..stores.base import KeyPartitioned
from ..stores.leases import AsyncLeaseStore, LeaseStore

log = logging.getLogger("ratekeeper")


@dataclass(frozen=True, slots=True)
class Lease:
    """One request in progress under ``key``; ``expires_at`` is epoch seconds.

    ``degraded`` marks a lease granted without the store (fail open); releasing it does nothing.
    """

    key: str
    id: str
    expires_at: float
    degraded: bool = False


def check_capacity(capacity: object, what: str = "capacity") -> int:
    """A capacity is a whole number >= 1 and below 2**52."""
    if isinstance(capacity, bool) or not isinstance(capacity, int) or not 1 <= capacity < 2**52:
        raise ConfigError(f"{what}={capacity!r} is invalid; expected a whole number >= 1")
    return capacity


def check_lease_ttl(lease_ttl: object) -> float:
    """A lease TTL is seconds, more than 0 and at most a year."""
    if (
        isinstance(lease_ttl, bool)
        or not isinstance(lease_ttl, int | float)
        or not 0 < lease_ttl <= 86_400 * 365
    ):
        raise ConfigError(f"lease_ttl={lease_ttl!r} is invalid; expected seconds > 0")
    return float(lease_ttl)


class _LeaseCore:
    """Validation, lease ids, expiry arithmetic, fail-open policy, breakers and counters."""

    def __init__(
        self,
        store: object,
        capacity: int,
        lease_ttl: float,
        clock: Clock,
        fail_open: bool,
        log_interval: float,
        breaker: tuple[int, float, float],
        monotonic: Clock,
    ) -> None:
        self.capacity = check_capacity(capacity)
        self.lease_ttl = check_lease_ttl(lease_ttl)
        if not callable(clock) or not callable(monotonic):
            raise ConfigError(
                f"clock={clock!r} / monotonic={monotonic!r}: expected callables such as "
                "time.time and time.monotonic"
            )
        self.clock = clock
        self.monotonic = monotonic
        self.fail_open = fail_open
        self.log_interval = log_interval
        self._last_log = -1e18
        self._breaker_settings = breaker
        self._breakers: dict[int, Breaker] = {0: Breaker(*breaker)}  # validates the settings
        self._partition = store.partition_key if isinstance(store, KeyPartitioned) else None
        self.counts = {
            "acquired": 0,
            "rejected": 0,
            "released": 0,
            "degraded": 0,
            "errors": 0,
            "breaker_opened": 0,
            "breaker_skips": 0,
        }

    def breaker(self, key: str) -> Breaker:
        """The breaker guarding ``key``'s partition (the one breaker, for most stores)."""
        if self._partition is None:
            return self._breakers[0]
        part = self._partition(key)
        breaker = self._breakers.get(part)
        if breaker is None:
            breaker = self._breakers.setdefault(part, Breaker(*self._breaker_settings))
        return breaker

    def skip(self, breaker: Breaker) -> bool:
        """True while ``breaker`` is open: the store is not called (counted)."""
        if breaker.open_until and not breaker.allow(self.monotonic()):
            self.counts["breaker_skips"] += 1
            return True
        return False

    def breaker_states(self) -> dict[str, Any]:
        """``breaker`` (worst state over partitions) and ``breakers_open``."""
        states = {b.state for b in self._breakers.values()}
        worst = "open" if "open" in states else "failing" if "failing" in states else "closed"
        return {
            "breaker": worst,
            "breakers_open": sum(b.state == "open" for b in self._breakers.values()),
        }

    def start(
        self, key: str, capacity: int | None, lease_ttl: float | None
    ) -> tuple[str, int, int, int]:
        """Validate one acquire: (lease id, capacity, now_ms, expires_ms)."""
        if type(key) is not str or not key:
            check_key(key)
        cap = self.capacity if capacity is None else check_capacity(capacity)
        ttl = self.lease_ttl if lease_ttl is None else check_lease_ttl(lease_ttl)
        now_ms = int(self.clock() * 1000)
        return os.urandom(9).hex(), cap, now_ms, now_ms + int(ttl * 1000)

    def granted(self, key: str, lease_id: str, ok: bool, expires_ms: int) -> Lease | None:
        """The answer to an acquire the store replied to."""
        if not ok:
            self.counts["rejected"] += 1
            return None
        self.counts["acquired"] += 1
        return Lease(key, lease_id, expires_ms / 1000)

    def failed(
        self, key: str, lease_id: str, expires_ms: int, exc: Exception | None, breaker: Breaker
    ) -> Lease:
        """A store error (None: breaker open) on acquire: a degraded lease or an error."""
        if exc is not None:
            self.record_error(exc, breaker)
        if not self.fail_open:
            if exc is None:
                raise StoreUnavailable("lease store unavailable (circuit breaker open)")
            raise StoreUnavailable(f"lease store unavailable: {exc}") from exc
        self.counts["degraded"] += 1
        return Lease(key, lease_id, expires_ms / 1000, degraded=True)

    def record_error(self, exc: Exception, breaker: Breaker) -> None:
        """Count a store error, tell the breaker, log at most once per interval."""
        self.counts["errors"] += 1
        now = self.monotonic()
        if breaker.failed(now):
            self.counts["breaker_opened"] += 1
        if now - self._last_log >= self.log_interval:
            self._last_log = now
            log.warning("ratekeeper lease store failed (%s); failing open", exc)


class _Base:
    _core: _LeaseCore

    @property
    def capacity(self) -> int:
        """Most leases live at once per key."""
        return self._core.capacity

    @property
    def lease_ttl(self) -> float:
        """Seconds after which an unreleased lease expires."""
        return self._core.lease_ttl

    def breaker_states(self) -> dict[str, str]:
        """Each store partition's breaker: ``closed``, ``failing`` or ``open``."""
        return {str(p): b.state for p, b in sorted(self._core._breakers.items())}

    def stats(self) -> dict[str, Any]:
        """Counters (``acquired``, ``rejected``, ``released``, ``degraded``, ``errors``,
        ``breaker_opened``, ``breaker_skips``) and ``breaker``/``breakers_open``."""
        return {**self._core.counts, **self._core.breaker_states()}


class ConcurrencyLimiter(_Base):
    """At most ``capacity`` leases live per key, over any ``LeaseStore``."""

    def __init__(
        self,
        store: LeaseStore,
        capacity: int,
        lease_ttl: float = 60.0,
        *,
        clock: Clock = time.time,
        fail_open: bool = True,
        log_interval: float = 10.0,
        breaker_threshold: int = 3,
        breaker_cooldown: float = 0.5,
        breaker_max_cooldown: float = 30.0,
        monotonic: Clock = time.monotonic,
    ) -> None:
        if not isinstance(store, LeaseStore):
            raise ConfigError(f"store {store!r} cannot hold leases; expected a LeaseStore")
        self.store = store
        breaker = (breaker_threshold, breaker_cooldown, breaker_max_cooldown)
        self._core = _LeaseCore(
            store, capacity, lease_ttl, clock, fail_open, log_interval, breaker, monotonic
        )

    def acquire(
        self, key: str, *, capacity: int | None = None, lease_ttl: float | None = None
    ) -> Lease | None:
        """A lease if fewer than ``capacity`` (default: the limiter's) are live, else None.

        ``lease_ttl`` overrides the limiter's for this one lease.
        """
        return self.acquire_counted(key, capacity=capacity, lease_ttl=lease_ttl)[0]

    def acquire_counted(
        self, key: str, *, capacity: int | None = None, lease_ttl: float | None = None
    ) -> tuple[Lease | None, int | None]:
        """``acquire``, and the live leases of ``key`` after it (None: the store was not asked)."""
        core = self._core
        lease_id, cap, now_ms, expires_ms = core.start(key, capacity, lease_ttl)
        breaker = core.breaker(key)
        if core.skip(breaker):
            return core.failed(key, lease_id, expires_ms, None, breaker), None
        try:
            ok, count = self.store.acquire_lease(key, lease_id, cap, now_ms, expires_ms)
        except Exception as exc:
            return core.failed(key, lease_id, expires_ms, exc, breaker), None
        breaker.succeeded()
        return core.granted(key, lease_id, ok, expires_ms), count

    def release(self, lease: Lease | None) -> bool:
        """Give a lease back; True if it was live (None and degraded leases are ignored, store
        errors logged: False)."""
        if lease is None or lease.degraded:
            return False
        breaker = self._core.breaker(lease.key)
        if self._core.skip(breaker):
            return False
        try:
            live = self.store.release_lease(lease.key, lease.id, int(self._core.clock() * 1000))
        except Exception as exc:
            self._core.record_error(exc, breaker)
            return False
        breaker.succeeded()
        self._core.counts["released"] += 1
        return live

    @contextlib.contextmanager
    def slot(self, key: str) -> Iterator[Lease | None]:
        """``with limiter.slot(key) as lease:`` — None when full; released on any exit."""
        lease = self.acquire(key)
        try:
            yield lease
        finally:
            self.release(lease)

    def in_use(self, key: str) -> int:
        """Live leases of ``key`` now."""
        return self.store.count_leases(check_key(key), int(self._core.clock() * 1000))


class AsyncConcurrencyLimiter(_Base):
    """The same limiter for asyncio, over any ``AsyncLeaseStore``."""

    def __init__(
        self,
        store: AsyncLeaseStore,
        capacity: int,
        lease_ttl: float = 60.0,
        *,
        clock: Clock = time.time,
        fail_open: bool = True,
        log_interval: float = 10.0,
        breaker_threshold: int = 3,
        breaker_cooldown: float = 0.5,
        breaker_max_cooldown: float = 30.0,
        monotonic: Clock = time.monotonic,
    ) -> None:
        if not isinstance(store, AsyncLeaseStore):
            raise ConfigError(f"store {store!r} cannot hold leases; expected an AsyncLeaseStore")
        self.store = store
        breaker = (breaker_threshold, breaker_cooldown, breaker_max_cooldown)
        self._core = _LeaseCore(
            store, capacity, lease_ttl, clock, fail_open, log_interval, breaker, monotonic
        )

    async def acquire(
        self, key: str, *, capacity: int | None = None, lease_ttl: float | None = None
    ) -> Lease | None:
        """A lease if fewer than ``capacity`` (default: the limiter's) are live, else None.

        ``lease_ttl`` overrides the limiter's for this one lease.
        """
        return (await self.acquire_counted(key, capacity=capacity, lease_ttl=lease_ttl))[0]

    async def acquire_counted(
        self, key: str, *, capacity: int | None = None, lease_ttl: float | None = None
    ) -> tuple[Lease | None, int | None]:
        """``acquire``, and the live leases of ``key`` after it (None: the store was not asked)."""
        core = self._core
        lease_id, cap, now_ms, expires_ms = core.start(key, capacity, lease_ttl)
        breaker = core.breaker(key)
        if core.skip(breaker):
            return core.failed(key, lease_id, expires_ms, None, breaker), None
        try:
            ok, count = await self.store.acquire_lease_async(key, lease_id, cap, now_ms, expires_ms)
        except Exception as exc:
            return core.failed(key, lease_id, expires_ms, exc, breaker), None
        breaker.succeeded()
        return core.granted(key, lease_id, ok, expires_ms), count

    async def release(self, lease: Lease | None) -> bool:
        """Give a lease back; True if it was live (None and degraded leases are ignored, store
        errors logged: False)."""
        if lease is None or lease.degraded:
            return False
        breaker = self._core.breaker(lease.key)
        if self._core.skip(breaker):
            return False
        try:
            now_ms = int(self._core.clock() * 1000)
            live = await self.store.release_lease_async(lease.key, lease.id, now_ms)
        except Exception as exc:
            self._core.record_error(exc, breaker)
            return False
        breaker.succeeded()
        self._core.counts["released"] += 1
        return live

    @contextlib.asynccontextmanager
    async def slot(self, key: str) -> AsyncIterator[Lease | None]:
        """``async with limiter.slot(key) as lease:`` — None when full; released on any exit."""
        lease = await self.acquire(key)
        try:
            yield lease
        finally:
            await self.release(lease)

    async def in_use(self, key: str) -> int:
        """Live leases of ``key`` now."""
        return await self.store.count_leases_async(check_key(key), int(self._core.clock() * 1000))
