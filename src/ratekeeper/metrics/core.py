"""``Metrics``: where ratekeeper records its metrics, in process and at near-zero cost.

Counters, gauges and histograms here are plain numbers under a lock (about 0.1 µs to count),
with a small subset of prometheus-client's API (``labels(...).inc()``, ``observe``, ``set``)
so call sites read the same. Nothing is exported from here: the adapters
(``ratekeeper.metrics.prometheus``, ``ratekeeper.metrics.otel``) read the values when scraped
or collected, so with no adapter attached nothing costs more than the counting, and
``import ratekeeper`` imports neither client library.

Gauges may also be *watched*: a source (a function, or a bound method held weakly so a
discarded limiter does not live on) is asked for samples at collection time, and samples of
the same labels from several sources are summed or maxed as the metric's spec says. That is
how breaker states, requests in flight and shedders' drop probabilities are exported without
touching their hot paths.
"""

from __future__ import annotations

import inspect
import threading
import weakref
from bisect import bisect_left
from collections.abc import Callable, Iterable
from typing import Any

from ..errors import ConfigError
from . import vocabulary as v
from .topkeys import SpaceSaving
from .vocabulary import MetricSpec

OTHER = "_other"
"""The label value that stands for every label set past a metric's ``max_series``."""
MAX_LABEL_LENGTH = 200

Labels = tuple[str, ...]
Sample = tuple[Labels, float]


class _Cell:
    """One counter or gauge series."""

    __slots__ = ("_lock", "value")

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        lock = self._lock
        lock.acquire()  # not ``with``: cheaper, and every decision counts one
        try:
            self.value += amount
        finally:
            lock.release()

    def dec(self, amount: float = 1.0) -> None:
        with self._lock:
            self.value -= amount

    def set(self, value: float) -> None:
        self.value = float(value)


class _Buckets:
    """One histogram series: counts per bucket (the last is +Inf), their sum and count."""

    __slots__ = ("_bounds", "_listeners", "_lock", "counts", "labels", "sum")

    def __init__(self, family: Family, labels: Labels) -> None:
        self._lock = family.lock
        self._bounds = family.spec.buckets
        self._listeners = family.listeners
        self.labels = labels
        self.counts = [0] * (len(self._bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        i = bisect_left(self._bounds, value)
        lock = self._lock
        lock.acquire()  # not ``with``: cheaper, and every store call observes one
        try:
            self.counts[i] += 1
            self.sum += value
        finally:
            lock.release()
        if self._listeners:
            for listener in self._listeners:
                listener(value, self.labels)


class Family:
    """One metric of the vocabulary and its series (label values -> cell)."""

    def __init__(self, spec: MetricSpec, max_series: int) -> None:
        self.spec = spec
        self.max_series = max_series
        self.lock = threading.Lock()
        self.series: dict[Labels, Any] = {}
        self.listeners: list[Callable[[float, Labels], None]] = []
        """Called with every histogram observation (the OpenTelemetry adapter)."""
        self._sources: list[Callable[[], Iterable[Sample] | None]] = []
        if not spec.labels:  # shown from the start, as prometheus-client does
            self.labels()

    def labels(self, *values: object) -> Any:
        """The series of these label values (created on first use; ``_other`` past the cap)."""
        series = self.series.get(values)  # type: ignore[arg-type]  # str values hit the cache
        if series is None:
            series = self._add(values)
        return series

    def _add(self, values: tuple[object, ...]) -> Any:
        spec = self.spec
        if len(values) != len(spec.labels):
            raise ConfigError(
                f"{spec.name} takes labels {list(spec.labels)}; got {len(values)} values"
            )
        labels = tuple(str(x)[:MAX_LABEL_LENGTH] for x in values)
        with self.lock:
            series = self.series.get(labels)
            if series is not None:
                return series
            if len(self.series) >= self.max_series:
                labels = (OTHER,) * len(labels)
                series = self.series.get(labels)
                if series is not None:
                    return series
            series = _Buckets(self, labels) if spec.kind == "histogram" else _Cell(self.lock)
            self.series[labels] = series
            return series

    # the unlabelled metrics' calls, as in prometheus-client
    def inc(self, amount: float = 1.0) -> None:
        self.labels().inc(amount)

    def set(self, value: float) -> None:
        self.labels().set(value)

    def observe(self, value: float) -> None:
        self.labels().observe(value)

    def watch(self, source: Callable[[], Iterable[Sample] | None]) -> None:
        """Ask ``source`` for samples at every collection; it returns None once the object it
        reads is gone, and is then dropped."""
        with self.lock:
            self._sources.append(source)

    def samples(self) -> list[Sample]:
        """Counter or gauge values now, watched sources included."""
        with self.lock:
            out: dict[Labels, float] = {k: c.value for k, c in self.series.items()}
            sources = list(self._sources)
        dead = []
        for source in sources:
            got = source()
            if got is None:
                dead.append(source)
                continue
            for labels, value in got:
                if labels in out and self.spec.combine == "max":
                    out[labels] = max(out[labels], value)
                elif labels in out:
                    out[labels] += value
                else:
                    out[labels] = value
        if dead:
            with self.lock:
                self._sources = [s for s in self._sources if s not in dead]
        return sorted(out.items())

    def histograms(self) -> list[tuple[Labels, list[int], float]]:
        """Per series: cumulative counts per bucket (last: +Inf) and the sum."""
        with self.lock:
            raw = [(b.labels, list(b.counts), b.sum) for b in self.series.values()]
        out = []
        for labels, counts, total in sorted(raw):
            running = 0
            cumulative = []
            for c in counts:
                running += c
                cumulative.append(running)
            out.append((labels, cumulative, total))
        return out


class Metrics:
    """ratekeeper's metrics for one process (or one app): pass it to ``Limiter(metrics=...)``,
    the middleware's ``metrics=`` and export it with an adapter.

    ``top_keys`` > 0 keeps a Space-Saving sketch of that many (policy, key) pairs of rejected
    requests (``top``), for the dashboard.
    """

    def __init__(self, max_series: int = 1000, top_keys: int = 0) -> None:
        self.families: dict[str, Family] = {s.name: Family(s, max_series) for s in v.METRICS}
        f = self.families
        self.decisions = f[v.DECISIONS.name]
        self.store_latency = f[v.STORE_LATENCY.name]
        self.store_errors = f[v.STORE_ERRORS.name]
        self.breaker_state = f[v.BREAKER_STATE.name]
        self.in_flight = f[v.IN_FLIGHT.name]
        self.shed_drop = f[v.SHED_DROP.name]
        self.batch_size = f[v.BATCH_SIZE.name]
        self.refused = f[v.REFUSED.name]
        self.reloads = f[v.RELOADS.name]
        self.policies = f[v.POLICIES.name]
        self.user_errors = f[v.USER_ERRORS.name]
        self.slices = f[v.SLICES.name]
        self.slice_units = f[v.SLICE_UNITS.name]
        self.false_rejections = f[v.FALSE_REJECTIONS.name]
        self.fail_local = f[v.FAIL_LOCAL.name]
        self.top = SpaceSaving(top_keys) if top_keys else None
        self._cells: dict[tuple[str, str], _Cell] = {}

    def decision(self, policy: str, outcome: str, key: str | None = None) -> None:
        """Count one decision; a rejection's ``key`` feeds the top-keys sketch, if kept."""
        cell = self._cells.get((policy, outcome)) or self.decision_cell(policy, outcome)
        cell.inc()
        if key is not None and self.top is not None and outcome in v.REJECTIONS:
            self.top.add(policy, key)

    def decision_cell(self, policy: str, outcome: str) -> Any:
        """The series ``decision(policy, outcome)`` counts in (``inc()`` it to count one without
        the top-keys sketch: for an outcome that is no rejection)."""
        cell = self._cells.get((policy, outcome))
        if cell is None:
            cell = self.decisions.labels(policy, outcome)
            if len(self._cells) < self.decisions.max_series:
                self._cells[(policy, outcome)] = cell
        return cell

    def count_of(self, policy: str, outcome: str) -> float:
        """Decisions counted so far for ``policy`` with ``outcome`` (0 if none)."""
        cell = self.decisions.series.get((policy, outcome))
        return 0.0 if cell is None else float(cell.value)

    def watch_breakers(
        self, source: Callable[[], dict[str, str]], store: str, kind: str = "rate"
    ) -> None:
        """Export the breaker states ``source`` returns (shard -> state) under ``store``."""
        self.breaker_state.watch(
            _weakly(source, lambda states: [
                ((store, shard, kind), float(v.BREAKER_STATES[state]))
                for shard, state in states.items()
            ])
        )  # fmt: skip

    def watch_in_flight(self, source: Callable[[], float]) -> None:
        """Export ``source()`` as requests in progress (summed with other sources)."""
        self.in_flight.watch(_weakly(source, lambda n: [((), float(n))]))

    def watch_local_budget(self, source: Callable[[], dict[str, float]]) -> None:
        """Export a ``LocalBudget``'s counters (``LocalBudget.counters``), read at collection:
        its hot path counts in plain integers."""
        read = _reader(source)
        families: dict[Family, list[tuple[Labels, str]]] = {
            self.slices: [(("taken",), "slices_taken"), (("returned",), "slices_returned")],
            self.slice_units: [
                (("taken",), "units_taken"),
                (("returned",), "units_returned"),
                (("expired",), "units_expired"),
            ],
            self.false_rejections: [((), "false_rejections")],
            self.fail_local: [
                (("allowed",), "fail_local_allowed"),
                (("rejected",), "fail_local_rejected"),
            ],
        }
        for family, series in families.items():
            family.watch(_counts_of(read, series))

    def watch_shedder(self, name: str, source: Any) -> None:
        """Export a shedder's drop probability per tier: ``source`` has ``tiers`` and
        ``drop_probability(tier)`` (as ``WorkerUtilizationShedder``), or is a function
        returning ``{tier: probability}``."""
        if hasattr(source, "drop_probability"):
            reader = _TierReader(source)
            source = lambda: reader.read()  # noqa: E731  # a function: held strongly
        self.shed_drop.watch(
            _weakly(source, lambda probs: [((name, t), float(p)) for t, p in probs.items()])
        )


def _reader(source: Callable[[], dict[str, float]]) -> Callable[[], dict[str, float] | None]:
    """``source`` called through a weak reference when it is a bound method (None once its
    object is gone)."""
    if not inspect.ismethod(source):
        return source
    ref = weakref.WeakMethod(source)

    def read() -> dict[str, float] | None:
        fn = ref()
        return None if fn is None else fn()

    return read


def _counts_of(
    read: Callable[[], dict[str, float] | None], series: list[tuple[Labels, str]]
) -> Callable[[], Iterable[Sample] | None]:
    """A watch source picking ``series`` (labels, counter name) out of a counters dict."""

    def samples() -> Iterable[Sample] | None:
        counts = read()
        if counts is None:
            return None
        return [(labels, float(counts[name])) for labels, name in series]

    return samples


class _TierReader:
    """``{tier: drop probability}`` of a shedder, holding the shedder weakly."""

    def __init__(self, shedder: Any) -> None:
        self._ref = weakref.ref(shedder)

    def read(self) -> dict[str, float] | None:
        shedder = self._ref()
        if shedder is None:
            return None
        return {t: shedder.drop_probability(t) for t in shedder.tiers}


def _weakly(
    source: Callable[[], Any], convert: Callable[[Any], Iterable[Sample]]
) -> Callable[[], Iterable[Sample] | None]:
    """A watch source reading ``source()`` through ``convert``; a bound method is held weakly,
    so a discarded limiter or middleware stops being exported instead of living on."""
    if inspect.ismethod(source):
        ref = weakref.WeakMethod(source)

        def weak() -> Iterable[Sample] | None:
            fn = ref()
            if fn is None:
                return None
            value = fn()
            return None if value is None else convert(value)

        return weak

    def strong() -> Iterable[Sample] | None:
        value = source()
        return None if value is None else convert(value)

    return strong
