"""The service's metrics: ratekeeper's one vocabulary (``ratekeeper.metrics``), exported on a
Prometheus registry of its own (no global state) at ``/metrics``.

Names (all prefixed ``ratekeeper_``; the table is ``ratekeeper.metrics.vocabulary``):

- ``decisions_total{policy, outcome}``: outcome is ``allowed``, ``rejected``,
  ``local_rejected`` (answered by the over-limit cache), ``shadow_rejected`` (a shadow policy
  would have rejected), ``degraded`` (fail-open: the store could not be asked), ``disabled``;
- ``store_latency_seconds``: histogram of store calls (one per batch when batching, which
  carries lease calls of concurrency policies too; else one per call);
- ``store_errors_total``: store calls that raised (with batching: calls of a batch that failed);
- ``breaker_state{store, shard, kind}``: 0 closed, 1 failing, 2 open, per store part;
- ``in_flight_requests``: HTTP requests being served;
- ``batch_size``: histogram of calls per batch;
- ``requests_refused_total{reason}``: requests refused before any counting (4xx);
- ``config_reloads_total{result}``: ``ok`` or ``error``; ``policies``: policies loaded;
- ``envoy_*``: envoyproxy/ratelimit's stats (``EnvoyStats``);
- ``rlqs_*``: the quota service's buckets and streams (``rlqs_stats``).

Also: ``BatchMetrics``, the batch observer of a batching Redis store, and
``InstrumentedStore`` and ``InstrumentedLeases``, the wrappers of a store that does not batch;
they feed the latency and error metrics.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import struct
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS_CONTENT_TYPE
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.parser import text_string_to_metric_families

from ..algorithms import Algorithm, Limit, Outcome
from ..errors import ConfigError
from ..metrics import core
from ..metrics.prometheus import register
from ..metrics.vocabulary import OUTCOMES
from ..nested import NestedPlan, NestedReply
from ..plan import Plan
from ..stores.base import AsyncNestedStore, AsyncStore, KeyPartitioned
from ..stores.leases import AsyncLeaseStore
from ..stores.memory import MemoryStore
from ..stores.redis.sharded import ShardedRedisStore
from .rlqs_stats import RlqsStats

_perf_counter = time.perf_counter
TOP_KEYS = 64
"""Rejected (policy, key) pairs the dashboard's Space-Saving sketch keeps."""


class Metrics(core.Metrics):
    """The service's metrics (the shared ``Metrics``) and their exposition.

    Under ``--workers`` (``worker`` set) every series carries ``worker="<i>"``; each worker
    writes its series to ``peers_dir`` (``publish``, every second) and answers a scrape with
    its own series and the other workers' last published ones, so any worker a scrape reaches
    reports them all.
    """

    def __init__(self, worker: int | None = None, peers_dir: str | None = None) -> None:
        super().__init__(top_keys=TOP_KEYS)
        self.worker = worker
        self.peers_dir = Path(peers_dir) if peers_dir else None
        self.registry = CollectorRegistry(auto_describe=True)
        register(self, self.registry)
        self.envoy = EnvoyStats(self.registry, 0.8, 1000)
        self.rlqs = RlqsStats(self.registry)
        for result in ("ok", "error"):  # at zero from the start: increase() sees the first one
            self.reloads.labels(result)

    def zero(self, policies: Iterable[str]) -> int:
        """Create ``decisions_total{policy, outcome}`` at zero for every outcome of these
        policies (in order), so ``increase()`` and alerts see their first decision; stops
        where half of the family's series cap would be used, leaving the rest to traffic.
        Returns how many policies were zeroed."""
        family = self.decisions
        budget = family.max_series // 2
        done = 0
        for policy in policies:
            if len(family.series) + len(OUTCOMES) > budget:
                break
            for outcome in OUTCOMES:
                family.labels(policy, outcome)
            done += 1
        return done

    def exposition(self, openmetrics: bool = False) -> bytes:
        """The text format Prometheus scrapes, or OpenMetrics when asked (``openmetrics``)."""
        render = openmetrics_latest if openmetrics else generate_latest
        if self.worker is None:
            return render(self.registry)
        texts = [self.publish()]
        if self.peers_dir is not None:
            for path in sorted(self.peers_dir.glob("*.prom")):
                if path.stem != str(self.worker):
                    with contextlib.suppress(OSError):  # a worker replacing its file
                        texts.append(path.read_text())
        merged = CollectorRegistry(auto_describe=False)
        merged.register(_Merged(texts))
        return render(merged)

    def publish(self) -> str:
        """This worker's series, labelled with it, also written to ``peers_dir``."""
        assert self.worker is not None
        labelled = CollectorRegistry(auto_describe=False)
        labelled.register(_Labelled(self.registry, str(self.worker)))
        text = generate_latest(labelled).decode()
        if self.peers_dir is not None:
            path = self.peers_dir / f"{self.worker}.prom"
            partial = path.with_suffix(".tmp")
            with contextlib.suppress(OSError):  # the supervisor removed it: shutting down
                partial.write_text(text)
                os.replace(partial, path)
        return text


PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_TEXT = OPENMETRICS_CONTENT_TYPE


def wants_openmetrics(accept: str) -> bool:
    """True when an ``Accept`` header asks for OpenMetrics (Prometheus' scrapes do, first)."""
    return any(
        part.split(";")[0].strip().lower() == "application/openmetrics-text"
        and "q=0" not in part.replace(" ", "").split(";")[1:]
        for part in accept.split(",")
    )


class _Labelled:
    """A registry's metrics with a ``worker`` label on every sample."""

    def __init__(self, registry: CollectorRegistry, worker: str) -> None:
        self.registry, self.worker = registry, worker

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            out = Metric(family.name, family.documentation, family.type, family.unit)
            out.samples = [
                s._replace(labels={**s.labels, "worker": self.worker}) for s in family.samples
            ]
            yield out


class _Merged:
    """Several workers' expositions as one: each family once, with every worker's samples."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for text in self.texts:
            for family in text_string_to_metric_families(text):
                have = families.get(family.name)
                if have is None:
                    families[family.name] = family
                else:
                    have.samples.extend(family.samples)
        yield from families.values()


class BatchMetrics:
    """A ``stores.redis.batching.BatchObserver`` feeding the batch size, latency, error metrics."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def batch(self, size: int, seconds: float) -> None:
        self.metrics.batch_size.observe(size)
        self.metrics.store_latency.observe(seconds)

    def error(self) -> None:
        self.metrics.store_errors.inc()


class InstrumentedStore:
    """An ``AsyncStore`` that times every call of the store it wraps and counts its errors."""

    def __init__(self, inner: AsyncStore, metrics: Metrics) -> None:
        self.inner = inner
        self.metrics = metrics

    async def execute_async(self, plan: Plan) -> tuple[Outcome, ...]:
        start = time.perf_counter()
        try:
            return await self.inner.execute_async(plan)
        except Exception:
            self.metrics.store_errors.inc()
            raise
        finally:
            self.metrics.store_latency.observe(time.perf_counter() - start)

    async def execute_nested_async(self, plan: NestedPlan) -> NestedReply:
        """A nested call or reservation step (``/v1/hit`` with levels, reserve, settle)."""
        inner = self.inner
        if not isinstance(inner, AsyncNestedStore):
            raise ConfigError(f"store {inner!r} cannot run nested calls or reservations")
        start = time.perf_counter()
        try:
            return await inner.execute_nested_async(plan)
        except Exception:
            self.metrics.store_errors.inc()
            raise
        finally:
            self.metrics.store_latency.observe(time.perf_counter() - start)

    async def administer_async(self, plan: Plan) -> tuple[tuple[Outcome, ...], tuple[Outcome, ...]]:
        """An admin's reset, credit or debit (``AsyncAdminStore``), by the store it wraps."""
        administer = getattr(self.inner, "administer_async", None)
        if administer is None:
            raise ConfigError(f"store {self.inner!r} cannot reset or credit (no administer)")
        found: tuple[tuple[Outcome, ...], tuple[Outcome, ...]] = await administer(plan)
        return found


class InstrumentedLocalStore(InstrumentedStore):
    """``InstrumentedStore`` over an in-process store: its ``hit_one`` is timed too, so the
    limiters keep their shortcut (``LocalStore``)."""

    def __init__(self, inner: MemoryStore, metrics: Metrics) -> None:
        super().__init__(inner, metrics)
        self._hit_one = inner.hit_one
        self._observe = metrics.store_latency.labels().observe  # the one series, bound once

    def hit_one(
        self, slot: str, key: str, algorithm: Algorithm, limit: Limit, now: int, cost: int
    ) -> Outcome:
        start = _perf_counter()
        outcome = self._hit_one(slot, key, algorithm, limit, now, cost)
        self._observe(_perf_counter() - start)
        return outcome


class InstrumentedPartitionedStore(InstrumentedStore):
    """``InstrumentedStore`` over a ``Partitioned`` store (one breaker per shard stays)."""

    def __init__(self, inner: ShardedRedisStore, metrics: Metrics) -> None:
        super().__init__(inner, metrics)
        self.partition = inner.partition
        self.partition_key = inner.partition_key  # a nested call's breaker: its outer key's


class InstrumentedLeases:
    """An ``AsyncLeaseStore`` that times every call of the lease store it wraps.

    It is ``KeyPartitioned`` when the inner store is (one breaker per shard stays).
    """

    def __init__(self, inner: AsyncLeaseStore, metrics: Metrics) -> None:
        self.inner = inner
        self.metrics = metrics
        if isinstance(inner, KeyPartitioned):
            self.partition_key = inner.partition_key

    async def acquire_lease_async(
        self, key: str, lease_id: str, capacity: int, now_ms: int, expires_ms: int
    ) -> tuple[bool, int]:
        start = time.perf_counter()
        try:
            return await self.inner.acquire_lease_async(key, lease_id, capacity, now_ms, expires_ms)
        except Exception:
            self.metrics.store_errors.inc()
            raise
        finally:
            self.metrics.store_latency.observe(time.perf_counter() - start)

    async def release_lease_async(self, key: str, lease_id: str, now_ms: int) -> bool:
        start = time.perf_counter()
        try:
            return await self.inner.release_lease_async(key, lease_id, now_ms)
        except Exception:
            self.metrics.store_errors.inc()
            raise
        finally:
            self.metrics.store_latency.observe(time.perf_counter() - start)

    async def count_leases_async(self, key: str, now_ms: int) -> int:
        return await self.inner.count_leases_async(key, now_ms)


_IPV4 = re.compile(r"\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}")
OTHER = "<other>"
"""The ``key`` (or ``domain``) label of caller-derived stat keys past ``max_stat_keys``."""


def sanitize(key: str) -> str:
    """Upstream's stat name clean-up: ``:`` and ``|`` become ``_``, so do an IPv4's dots."""
    key = key.replace(":", "_").replace("|", "_")
    return _IPV4.sub(lambda m: m.group().replace(".", "_"), key) if "." in key else key


class EnvoyStats:
    """envoyproxy/ratelimit's per-limit counters as Prometheus series, labelled by ``domain``
    and ``key`` (the stat key after the domain, e.g. ``key1_value1.subkey1``).

    Per decided limit and request, by ``hits`` (upstream's rules): ``total_hits``; a hit over
    the limit adds to ``over_limit`` (and ``over_limit_with_local_cache`` when the local cache
    answered, ``shadow_mode`` for a shadow limit); a request that crossed the limit counts the
    hits up to it as ``near_limit``; an admitted request adds to ``within_limit``, and to
    ``near_limit`` for its hits past the near-limit threshold (``floor(limit x ratio)``, in
    float32 as upstream). Keys built from caller text (``detailed_metric``, ``value_to_metric``,
    limit overrides, unknown domains) are bounded: past ``max_keys`` distinct ones they count
    under ``<other>``.

    The counts are plain integers in a dict, changed under one lock (gRPC's handler threads
    count at once); ``collect`` turns them into counter families when Prometheus scrapes.
    """

    STATS = ("total_hits", "over_limit", "near_limit", "within_limit", "shadow_mode",
             "over_limit_with_local_cache")  # fmt: skip

    def __init__(self, registry: CollectorRegistry, near_limit_ratio: float, max_keys: int) -> None:
        self._lock = threading.Lock()
        self.configure(near_limit_ratio, max_keys)
        self._counts: dict[tuple[str, str], list[int]] = {}
        self._labels: dict[tuple[str, str], tuple[str, str]] = {}
        self._dynamic: set[tuple[str, str]] = set()
        self._not_found: dict[str, int] = {}
        self.global_shadow_mode = 0
        registry.register(self)  # a collector: it has collect()

    def configure(self, near_limit_ratio: float, max_keys: int) -> None:
        """Apply (re)loaded settings (under the lock: a handler thread may be counting)."""
        with self._lock:
            self.ratio = _f32(near_limit_ratio)
            self.max_keys = max_keys
            self._near: dict[int, int] = {}

    def counts(self, domain: str, key: str, dynamic: bool) -> list[int]:
        """The six counts of a stat key (``domain.rest``), in ``STATS`` order (the caller
        holds the lock)."""
        found = self._counts.get((domain, key))
        if found is None:
            if dynamic and (domain, key) not in self._dynamic:
                if len(self._dynamic) >= self.max_keys:
                    return self.counts(domain, domain + "." + OTHER, False)
                self._dynamic.add((domain, key))
            rest = sanitize(key[len(domain) + 1 :]) if key.startswith(domain + ".") else key
            found = [0, 0, 0, 0, 0, 0]
            self._counts[(domain, key)] = found
            self._labels[(domain, key)] = (domain, rest)
        return found

    def count(
        self, domain: str, key: str, dynamic: bool, hits: int, limit: int, remaining: int,
        over: bool, local: bool, shadow: bool,
    ) -> None:  # fmt: skip
        """Count one decided limit: ``remaining`` is what the decision found (when ``over``)
        or left (when admitted)."""
        lock = self._lock
        lock.acquire()  # not ``with``: cheaper on this path
        try:
            c = self._counts.get((domain, key)) or self.counts(domain, key, dynamic)
            c[0] += hits
            near = self._near.get(limit)
            if near is None:
                near = self._near[limit] = self.threshold(limit)
            if not over:
                after = limit - remaining
                if after > near:
                    before = after - hits
                    c[2] += hits if before >= near else after - near
                c[3] += hits
            elif local:
                c[1] += hits
                c[5] += hits
                if shadow:
                    c[4] += hits
            else:
                crossed = remaining > 0  # the request found room, and asked for more
                excess = hits - remaining if crossed else hits
                c[1] += excess
                if crossed:
                    before = limit - remaining
                    c[2] += limit - (near if near > before else before)
                if shadow:
                    c[4] += excess
        finally:
            lock.release()

    def threshold(self, limit: int) -> int:
        """Upstream's near-limit threshold: ``floor(float32(limit) * ratio)`` in float32."""
        return math.floor(_f32(_f32(limit) * self.ratio))

    def not_found(self, domain: str) -> None:
        with self._lock:
            if domain not in self._not_found and len(self._not_found) >= self.max_keys:
                domain = OTHER
            self._not_found[domain] = self._not_found.get(domain, 0) + 1

    def shadowed(self) -> None:
        """Count a request the global shadow mode answered OK."""
        with self._lock:
            self.global_shadow_mode += 1

    def collect(self) -> Iterator[Metric]:
        """The counter families (``ratekeeper_envoy_<stat>_total``) for a scrape."""
        with self._lock:  # a copy: handler threads may add keys meanwhile
            rows = [(self._labels[k], list(values)) for k, values in self._counts.items()]
            not_found = list(self._not_found.items())
        for i, stat in enumerate(self.STATS):
            family = CounterMetricFamily(
                f"ratekeeper_envoy_{stat}", f"envoyproxy/ratelimit's {stat} per limit.",
                labels=["domain", "key"],
            )  # fmt: skip
            for labels, values in rows:
                family.add_metric(labels, values[i])
            yield family
        missing = CounterMetricFamily(
            "ratekeeper_envoy_domain_not_found", "Requests naming a domain not configured.",
            labels=["domain"],
        )  # fmt: skip
        for domain, n in not_found:
            missing.add_metric([domain], n)
        yield missing
        yield CounterMetricFamily(
            "ratekeeper_envoy_global_shadow_mode",
            "Requests answered OK by the global shadow mode although over the limit.",
            value=self.global_shadow_mode,
        )


def _f32(x: float) -> float:
    return float(struct.unpack("f", struct.pack("f", x))[0])
