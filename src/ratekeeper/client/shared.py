"""One pace across processes: the learned quotas' pace kept on a shared ratekeeper store.

Each process learns the server's quotas from its own answers; what they must share is the
*pace*. With ``shared=`` (a ``RedisStore``, ``ShardedRedisStore`` or ``RedisClusterStore``), every
request that its local budgets let go also books its
turn in a GCRA on the store at ``headroom`` times the quota's rate (key
``{prefix}{server}|{partition}|{quota}``; ``|{server partition}`` when the server sent
``pk``), through ratekeeper's own ``Limiter``/``AsyncLimiter``: one ``hit`` whose burst is
the queue (a day of turns), so it is admitted at once, and whose ``reset_at`` (the
GCRA's arrival time after it) less its own units is the request's turn; it sleeps until
then. No polling: each request asks once, and eight processes on one API key send like one
client, at most ``burst + headroom * limit`` in any window of the quota's length. A turn
past ``max_wait`` is a wait too long.

Only quotas whose window is known (``RateLimit-Policy``'s ``w``) are shared; the others are
paced by each process from the server's ``remaining``. The limiter fails open: with the store
unreachable each process paces alone at the full rate (counted in ``shared_degraded``), and
the server's ``remaining`` still holds every process back once the quota runs low. Each
request costs one round trip to the store. Local leases (``LocalBudget``) do not fit: a turn
is the arrival time the store holds after the request's hit, which a slice spent in process
does not know, so they are refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..limiter import AsyncLimiter, Limiter
from ..stores.base import AsyncStore, Store
from ..stores.local_budget import LocalBudget
from .budget import Budget
from .core import Ticket

QUEUE_SECONDS = 86400
"""How far ahead turns may be booked (the GCRA's burst; it does not let more through at once:
turns are spaced by the pace whatever it is). Each request's own ``max_wait`` decides."""
MAX_QUEUE = 10**9
"""The most units booked ahead on one key."""
MAX_RATE_PER_SECOND = 1_000_000
"""Quotas faster than this are not shared (ratekeeper's gcra refuses them, and no client
needs to pace that finely)."""


@dataclass(frozen=True, slots=True)
class SharedAsk:
    """One request's booking in the shared pace: the key, the rate, the units, the burst
    (units that may go at once), the queue (the GCRA's burst: how far ahead turns are
    booked) and the pace's seconds per unit."""

    key: str
    rate: str
    cost: int
    burst: int
    queue: int
    interval: float


class Shared:
    """The shared store, and the limiters the sync and async pacers hit it through."""

    def __init__(self, store: Any, prefix: str, clock: Any) -> None:
        if not isinstance(store, Store):
            raise ConfigError(f"shared={store!r} is invalid; expected a ratekeeper store")
        if isinstance(store, LocalBudget):
            raise ConfigError(
                "shared=LocalBudget(...) cannot keep the pace: a request's turn is the arrival "
                "time the store holds after its hit, which a slice spent in process does not "
                "know; pass the store it wraps (RedisStore, ShardedRedisStore, "
                "RedisClusterStore)"
            )
        if not isinstance(prefix, str) or len(prefix) > 128:
            raise ConfigError(f"shared_prefix={prefix!r} is invalid; expected a short string")
        self.store = store
        self.prefix = prefix
        self.clock = clock
        self._sync: Limiter | None = None
        self._async: AsyncLimiter | None = None

    def limiter(self) -> Limiter:
        if self._sync is None:
            self._sync = Limiter(self.store, clock=self.clock, count_decisions=False)
        return self._sync

    def async_limiter(self) -> AsyncLimiter:
        if self._async is None:
            if not isinstance(self.store, AsyncStore):
                raise ConfigError(f"shared={self.store!r} cannot be used by AsyncPacer")
            self._async = AsyncLimiter(self.store, clock=self.clock, count_decisions=False)
        return self._async

    def asks(
        self,
        ticket: Ticket,
        charged: list[tuple[Budget, float]],
        headroom: float,
        burst: int,
    ) -> list[SharedAsk]:
        """The shared bookings of a request charged ``charged`` (budget, cost) locally."""
        out = []
        for budget, cost in charged:
            limit, window = budget.limit, budget.window_seconds
            if not limit or not window or budget.unit == "concurrent-requests" or cost <= 0:
                continue
            count = max(1, math.floor(limit * headroom))
            period_ms = max(1, round(window * 1000))
            if count * 1000 / period_ms > MAX_RATE_PER_SECOND:
                continue
            size = burst if budget.unit == "requests" else max(1, math.ceil(limit * (1 - headroom)))
            interval = period_ms / 1000 / count
            units = max(1, math.ceil(cost))
            queue = min(MAX_QUEUE, math.ceil(QUEUE_SECONDS / interval) + max(units, size))
            key = f"{self.prefix}{ticket.request.server}|{ticket.partition}|{budget.name}"
            if budget.server_partition is not None:
                key += f"|{budget.server_partition}"
            rate = f"{count}/{period_ms}ms"
            out.append(SharedAsk(key, rate, units, min(size, count), queue, interval))
        return out
