"""What a replay found, per limit: counts, keys, rejections over time, demand per rate.

``Recorder`` is a ``ratekeeper.metrics.Metrics`` whose ``decision`` also feeds these stats:
the middleware's gate and the service's engine report every decision through their
``metrics`` hook, so the simulation counts exactly what they decide, with no second copy of
their rules. Memory grows with the number of distinct keys (and, for keys that were
rejected, the minutes they were rejected in), never with the number of lines.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import chain

from ..metrics.core import Metrics
from ..rates import Rate
from .suggest import Demand

WOULD_REJECT = frozenset({"rejected", "local_rejected", "shadow_rejected"})


class Rejections:
    """One key's rejections: how many, first and last time, per window of the stack that
    rejected, per minute (epoch s // 60)."""

    __slots__ = ("count", "first", "last", "minutes", "windows")

    def __init__(self, now: float) -> None:
        self.count = 0
        self.first = self.last = now
        self.windows: Counter[str] = Counter()
        self.minutes: Counter[int] = Counter()

    def add(self, now: float, n: int) -> None:
        self.count += n
        if now < self.first:
            self.first = now
        if now > self.last:
            self.last = now
        self.minutes[int(now // 60)] += n


@dataclass(slots=True)
class LimitStats:
    """One limit (a middleware check, a service policy or a candidate) over the replay."""

    name: str
    rates: tuple[Rate, ...]
    algorithm: str
    buckets: int | None = None
    key: str = "key function"
    """What keys it: a field's name, or how the check computes its key."""
    outcomes: dict[str, int] = field(default_factory=dict)
    rejected: dict[str, Rejections] = field(default_factory=dict)
    timeline: dict[int, list[int]] = field(default_factory=dict)
    """Minute (epoch s // 60) -> [requests, would-reject]."""
    demand: list[Demand] = field(default_factory=list)
    """One per rate of the stack (none when no suggestions are asked for)."""
    counts: Counter[str] = field(default_factory=Counter)
    """Requests per key, when there is no demand to hold them."""
    key_missing: int = 0
    """Requests whose key field was missing or empty (the limit did not apply)."""

    def track_demand(self) -> None:
        """Keep every request's key, time and cost for the per-key needs (suggestions)."""
        self.demand = [Demand(r.period_ms) for r in self.rates]

    @property
    def requests(self) -> int:
        return sum(self.outcomes.values())

    @property
    def would_reject(self) -> int:
        return sum(n for o, n in self.outcomes.items() if o in WOULD_REJECT)

    @property
    def window(self) -> str | None:
        """The rate's code when the limit has one rate: it rejects every rejection."""
        return self.rates[0].code if len(self.rates) == 1 else None

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
                record = self.rejected.get(key)
                if record is None:
                    record = self.rejected[key] = Rejections(now)
                record.add(now, 1)
                window = self.window
                if window is not None:
                    record.windows[window] += 1

    def windowed(self, key: str, window: str) -> None:
        """Which rate of a stack rejected ``key``'s last rejection (told after ``decided``)."""
        record = self.rejected.get(key)
        if record is not None and len(self.rates) != 1:
            record.windows[window] += 1

    def decided_runs(
        self, runs: list[tuple[float, int, list[str]]], rejected: list[list[str]]
    ) -> None:
        """``decided`` for runs ``(time, ms, keys)`` of requests of one time, one per key,
        of which those of the keys ``rejected`` (a list per run) were rejected and the
        others allowed."""
        timeline = self.timeline
        records = self.rejected
        window = self.window
        requests = refused = 0
        minute = None
        bucket = [0, 0]
        for (now, _, keys), out in zip(runs, rejected, strict=True):
            m = int(now // 60)
            if m != minute:
                minute = m
                found = timeline.get(m)
                bucket = timeline[m] = [0, 0] if found is None else found
            bucket[0] += len(keys)
            requests += len(keys)
            if out:
                bucket[1] += len(out)
                refused += len(out)
                for key, n in Counter(out).items():
                    record = records.get(key)
                    if record is None:
                        record = records[key] = Rejections(now)
                    record.add(now, n)
                    if window is not None:
                        record.windows[window] += n
        outcomes = self.outcomes
        if requests > refused:
            outcomes["allowed"] = outcomes.get("allowed", 0) + requests - refused
        if refused:
            outcomes["rejected"] = outcomes.get("rejected", 0) + refused

    def wanted_runs(self, runs: list[tuple[float, int, list[str]]]) -> None:
        """``wanted`` for runs ``(time, ms, keys)`` of requests of cost 1, one per key."""
        if not self.demand:
            self.counts.update(chain.from_iterable(keys for _, _, keys in runs))
            return
        for d in self.demand:
            for _, now_ms, keys in runs:
                d.add_run(keys, now_ms)

    def wanted(self, key: str, now_ms: int, cost: int, refunded: bool = False) -> None:
        """A request this limit applies to, whatever was decided (its demand); ``refunded``:
        its charge is given back once it is answered (a 304 in the middleware)."""
        if not self.demand:
            self.counts[key] += 1
            return
        for d in self.demand:
            d.add(key, now_ms, cost, refunded)

    @property
    def keys_seen(self) -> int:
        return len(self.demand[0].ids) if self.demand else len(self.counts)

    def requests_of(self, key: str) -> int:
        """Requests of ``key`` this limit applied to."""
        if self.demand:
            kid = self.demand[0].ids.get(key)
            return 0 if kid is None else self.demand[0].counts[kid]
        return self.counts.get(key, 0)


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
