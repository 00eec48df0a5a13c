"""What a replay found, per limit: counts, keys, rejections over time, demand per rate.

``Recorder`` is a ``ratekeeper.metrics.Metrics`` whose ``decision`` also feeds these stats:
the middleware's gate and the service's engine report every decision through their
``metrics`` hook, so the simulation counts exactly what they decide, with no second copy of
their rules. Memory grows with the number of distinct keys, never with the number of lines.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..metrics.core import Metrics
from ..rates import Rate
from .suggest import Demand

WOULD_REJECT = frozenset({"rejected", "local_rejected", "shadow_rejected"})


@dataclass(slots=True)
class LimitStats:
    """One limit (a middleware check or a service policy) over the replay."""

    name: str
    rates: tuple[Rate, ...]
    algorithm: str
    buckets: int | None = None
    outcomes: dict[str, int] = field(default_factory=dict)
    rejected_keys: dict[str, int] = field(default_factory=dict)
    timeline: dict[int, list[int]] = field(default_factory=dict)
    """Minute (epoch s // 60) -> [requests, would-reject]."""
    demand: list[Demand] = field(default_factory=list)
    """One per rate of the stack (none when no suggestions are asked for)."""
    keys: set[str] = field(default_factory=set)
    """Distinct keys seen, when there is no demand to hold them."""

    def track_demand(self) -> None:
        """Keep every request's key, time and cost for the per-key needs (suggestions)."""
        self.demand = [Demand(r.period_ms) for r in self.rates]

    @property
    def requests(self) -> int:
        return sum(self.outcomes.values())

    @property
    def would_reject(self) -> int:
        return sum(n for o, n in self.outcomes.items() if o in WOULD_REJECT)

    def decided(self, outcome: str, key: str | None, now: float) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        minute = int(now // 60)
        bucket = self.timeline.get(minute)
        if bucket is None:
            bucket = self.timeline[minute] = [0, 0]
        bucket[0] += 1
        if outcome in WOULD_REJECT:
            bucket[1] += 1
            if key is not None:
                self.rejected_keys[key] = self.rejected_keys.get(key, 0) + 1

    def decided_run(self, now: float, requests: int, rejected: list[str]) -> None:
        """``decided`` for ``requests`` requests at one time, of which those of the keys
        ``rejected`` were rejected and the others allowed."""
        outcomes = self.outcomes
        allowed = requests - len(rejected)
        if allowed:
            outcomes["allowed"] = outcomes.get("allowed", 0) + allowed
        if rejected:
            outcomes["rejected"] = outcomes.get("rejected", 0) + len(rejected)
            counts = self.rejected_keys
            for key in rejected:
                counts[key] = counts.get(key, 0) + 1
        if requests:
            minute = int(now // 60)
            bucket = self.timeline.get(minute)
            if bucket is None:
                bucket = self.timeline[minute] = [0, 0]
            bucket[0] += requests
            bucket[1] += len(rejected)

    def wanted_run(self, keys: list[str], now_ms: int) -> None:
        """``wanted`` for requests of cost 1 at one time, one per key."""
        if not self.demand:
            self.keys.update(keys)
            return
        for d in self.demand:
            d.add_run(keys, now_ms)

    def wanted(self, key: str, now_ms: int, cost: int) -> None:
        """A request this limit applies to, whatever was decided (its demand)."""
        if not self.demand:
            self.keys.add(key)
            return
        for d in self.demand:
            d.add(key, now_ms, cost)

    @property
    def keys_seen(self) -> int:
        return len(self.demand[0].ids) if self.demand else len(self.keys)


class Recorder(Metrics):
    """Metrics that hand each decision to the replay's ``LimitStats`` instead of counting
    it (a replay reports no metric: its stats are the count)."""

    def __init__(self, limits: dict[str, LimitStats], clock: Callable[[], float]) -> None:
        super().__init__()
        self.limits = limits
        self.clock = clock

    def decision(self, policy: str, outcome: str, key: str | None = None) -> None:
        stats = self.limits.get(policy)
        if stats is not None:
            stats.decided(outcome, key, self.clock())
