"""Admission control: at most ``limit`` requests in progress, the rest queued by priority and
shed when they have waited too long (queue management in the spirit of CoDel).

Rules (``AdmissionCore``, the sans-I/O state both drivers share):

- the first tier (critical) is admitted at once, always; it counts in the requests in progress;
- another request is admitted at once while fewer than ``limit`` are in progress and nobody is
  queued; otherwise it queues, one FIFO per tier;
- when a slot frees, the most important tier's oldest waiter gets it;
- a waiter is shed (503) once it has waited ``interval`` (100 ms), or only ``target_delay``
  (10 ms) while the queue has not been empty for a whole ``interval`` — a standing queue is
  overload, so waits are cut short; a passing burst may wait longer (Facebook's variant of
  CoDel);
- ``limit`` is a fixed number or a ``GradientLimit`` fed with every admitted request's
  latency (admission to release).

``AdmissionQueue`` drives it with threads (a waiting thread blocks on a lock); in an asyncio
server ``AsyncAdmissionQueue`` does with futures — and because a handler that never awaits
finishes before the next request starts, in-progress stays near 1 however long the loop's queue
is: while the loop lags past ``target_delay`` every request goes through the queue, so at most
``limit`` requests run per turn of the loop and a critical one is never behind more.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from ..clock import Clock
from ..errors import ConfigError
from .adaptive import GradientLimit
from .shedding import DEFAULT_TIERS, check_tiers
from .signals import LoopLag


class Ticket:
    """A slot held by one admitted request; give it back with ``release``."""

    __slots__ = ("admitted_at", "tier")

    def __init__(self, tier: int, admitted_at: float) -> None:
        self.tier = tier
        self.admitted_at = admitted_at


class Waiter:
    """A queued request: ``ticket`` once admitted, ``shed`` once dropped."""

    __slots__ = ("handle", "shed", "since", "ticket", "tier")

    def __init__(self, tier: int, since: float) -> None:
        self.tier = tier
        self.since = since
        self.ticket: Ticket | None = None
        self.shed = False
        self.handle: Any = None  # what the driver wakes (a lock or a future)


def _check_delay(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ConfigError(f"{name}={value!r} is invalid; expected seconds > 0")
    return float(value)


class AdmissionCore:
    """The queue's state and rules (see the module docstring); the caller serializes calls."""

    def __init__(
        self,
        limit: int | GradientLimit,
        tiers: Sequence[str] = DEFAULT_TIERS,
        *,
        target_delay: float = 0.01,
        interval: float = 0.1,
        clock: Clock = time.monotonic,
    ) -> None:
        if isinstance(limit, bool) or not isinstance(limit, int | GradientLimit):
            raise ConfigError(
                f"limit={limit!r} is invalid; expected a whole number or GradientLimit"
            )
        if isinstance(limit, int) and limit < 1:
            raise ConfigError(f"limit={limit!r} is invalid; expected a whole number >= 1")
        tiers = check_tiers(tiers)
        self.limiter = limit
        self.tiers = tiers
        self.rank = {t: i for i, t in enumerate(tiers)}
        self.target_delay = _check_delay("target_delay", target_delay)
        self.interval = _check_delay("interval", interval)
        if self.target_delay > self.interval:
            raise ConfigError(
                f"target_delay={target_delay!r} is invalid; expected <= interval={interval!r}"
            )
        self.clock = clock
        self.in_flight = 0
        self.queues: list[deque[Waiter]] = [deque() for _ in tiers]
        self.waiting = 0
        self._busy_since: float | None = None  # when the queue last became non-empty
        self.counts = {t: {"admitted": 0, "queued": 0, "shed": 0} for t in tiers}

    @property
    def limit(self) -> int:
        """Requests allowed in progress now."""
        limiter = self.limiter
        return limiter if isinstance(limiter, int) else limiter.limit

    def tier_of(self, tier: str) -> int:
        """The rank of a tier name (0 is the most important)."""
        rank = self.rank.get(tier)
        if rank is None:
            raise ConfigError(f"tier {tier!r} is unknown; expected one of {', '.join(self.tiers)}")
        return rank

    def try_admit(self, rank: int, now: float, queue: bool = False) -> Ticket | None:
        """A ticket at once, or None: the request must ``enqueue`` (``queue``: always, unless
        critical)."""
        if rank == 0 or (not queue and not self.waiting and self.in_flight < self.limit):
            return self._grant(rank, now)
        return None

    def enqueue(self, rank: int, now: float) -> tuple[Waiter, list[Waiter]]:
        """Queue a request; returns its waiter and the waiters decided now (maybe itself)."""
        waiter = Waiter(rank, now)
        self.queues[rank].append(waiter)
        self.waiting += 1
        self.counts[self.tiers[rank]]["queued"] += 1
        if self._busy_since is None:
            self._busy_since = now
        return waiter, self.dispatch(now)

    def release(self, ticket: Ticket, now: float) -> list[Waiter]:
        """A request ended: free its slot, learn its latency; returns the waiters decided."""
        self.in_flight -= 1
        limiter = self.limiter
        if not isinstance(limiter, int):
            limiter.sample(now - ticket.admitted_at, self.in_flight + 1)
        return self.dispatch(now)

    def abandon(self, waiter: Waiter, now: float) -> bool:
        """A waiter timed out or went away: True if it was still queued (now removed, shed)."""
        if waiter.ticket is not None or waiter.shed:
            return False
        self.queues[waiter.tier].remove(waiter)
        self._drop(waiter)
        if not self.waiting:
            self._busy_since = None
        return True

    def max_wait(self, now: float) -> float:
        """How long a waiter may wait now: short under a standing queue."""
        since = self._busy_since
        standing = since is not None and now - since >= self.interval
        return self.target_delay if standing else self.interval

    def dispatch(self, now: float) -> list[Waiter]:
        """Give free slots to the most important oldest waiters; shed those waited too long."""
        decided: list[Waiter] = []
        if not self.waiting:
            return decided
        oldest = now - self.max_wait(now)
        for queue in self.queues:
            while queue and queue[0].since < oldest:
                waiter = queue.popleft()
                self._drop(waiter)
                decided.append(waiter)
        limit = self.limit
        for queue in self.queues:
            while queue and self.in_flight < limit:
                waiter = queue.popleft()
                self.waiting -= 1
                waiter.ticket = self._grant(waiter.tier, now)
                decided.append(waiter)
        if not self.waiting:
            self._busy_since = None
        return decided

    def _grant(self, rank: int, now: float) -> Ticket:
        self.in_flight += 1
        self.counts[self.tiers[rank]]["admitted"] += 1
        return Ticket(rank, now)

    def _drop(self, waiter: Waiter) -> None:
        waiter.shed = True
        self.waiting -= 1
        self.counts[self.tiers[waiter.tier]]["shed"] += 1

    def stats(self) -> dict[str, Any]:
        """Limit, requests in progress and queued, and counts per tier."""
        return {
            "limit": self.limit,
            "in_flight": self.in_flight,
            "waiting": self.waiting,
            "tiers": {t: dict(c) for t, c in self.counts.items()},
        }


class AdmissionQueue:
    """Admission control for threaded servers: a request over the limit blocks its thread."""

    def __init__(self, core: AdmissionCore) -> None:
        self.core = core
        self._lock = threading.Lock()

    def enter(self, tier: str, wait: bool = True) -> Ticket | None:
        """A ticket, after waiting for a slot if needed; None if shed (or busy and not ``wait``)."""
        core = self.core
        rank = core.tier_of(tier)
        with self._lock:
            now = core.clock()
            ticket = core.try_admit(rank, now)
            if ticket is not None or not wait:
                return ticket
            waiter, decided = core.enqueue(rank, now)
            if waiter.ticket is None and not waiter.shed:
                waiter.handle = threading.Lock()
                waiter.handle.acquire()
        _wake(decided, waiter)
        if waiter.handle is not None and not waiter.handle.acquire(timeout=core.interval):
            with self._lock:
                core.abandon(waiter, core.clock())
        return waiter.ticket

    def release(self, ticket: Ticket | None) -> None:
        """Give a slot back (None: nothing to give)."""
        if ticket is None:
            return
        with self._lock:
            decided = self.core.release(ticket, self.core.clock())
        _wake(decided)

    leave = release


def _wake(decided: list[Waiter], me: Waiter | None = None) -> None:
    for waiter in decided:
        if waiter is not me and waiter.handle is not None:
            waiter.handle.release()


class AsyncAdmissionQueue:
    """Admission control for asyncio servers (one event loop; calls come from its thread).

    While ``lag`` (the loop's lag) is past the core's ``target_delay``, every non-critical
    request queues, so that no more than ``limit`` run per turn of the loop.
    """

    def __init__(self, core: AdmissionCore, lag: LoopLag | None = None) -> None:
        self.core = core
        self.lag = LoopLag(clock=core.clock) if lag is None else lag

    def congested(self) -> bool:
        """Whether the loop lags past the target delay (the timer starts on first use)."""
        lag = self.lag
        lag.follow()
        return lag.lag() > self.core.target_delay

    async def enter(self, tier: str, wait: bool = True) -> Ticket | None:
        """A ticket, after waiting for a slot if needed; None if shed (or busy and not ``wait``)."""
        core = self.core
        rank = core.tier_of(tier)
        now = core.clock()
        ticket = core.try_admit(rank, now, queue=rank != 0 and self.congested())
        if ticket is not None or not wait:
            return ticket
        waiter, decided = core.enqueue(rank, now)
        _resolve(decided, waiter)
        if waiter.shed:
            return None
        timer = None
        try:
            if waiter.ticket is not None:
                await asyncio.sleep(0)  # admitted, but runs next turn, as the queue would
            else:
                loop = asyncio.get_running_loop()
                waiter.handle = future = loop.create_future()
                timer = loop.call_later(core.interval, self._expire, waiter)
                await future
        except asyncio.CancelledError:
            if waiter.ticket is not None:
                self.release(waiter.ticket)
            else:
                core.abandon(waiter, core.clock())
            raise
        finally:
            if timer is not None:
                timer.cancel()
        return waiter.ticket

    def _expire(self, waiter: Waiter) -> None:
        if self.core.abandon(waiter, self.core.clock()):
            _resolve([waiter])

    def release(self, ticket: Ticket | None) -> None:
        """Give a slot back (None: nothing to give)."""
        if ticket is not None:
            _resolve(self.core.release(ticket, self.core.clock()))

    async def leave(self, ticket: Ticket | None) -> None:
        """``release``, awaitable like the runner's other calls."""
        self.release(ticket)


def _resolve(decided: list[Waiter], me: Waiter | None = None) -> None:
    for waiter in decided:
        future = waiter.handle
        if waiter is not me and future is not None and not future.done():
            future.set_result(None)
