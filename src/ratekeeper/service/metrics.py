"""Prometheus metrics of the service, on a registry of its own (no global state).

Names (all prefixed ``ratekeeper_``):

- ``decisions_total{policy, outcome}``: outcome is ``allowed``, ``rejected``,
  ``local_rejected`` (answered by the over-limit cache), ``shadow_rejected`` (a shadow policy
  would have rejected), ``degraded`` (fail-open: the store could not be asked), ``disabled``;
- ``store_latency_seconds``: histogram of store calls (one per batch when batching, which
  carries lease calls of concurrency policies too; else one per call);
- ``store_errors_total``: store calls that raised (with batching: calls of a batch that failed);
- ``batch_size``: histogram of calls per batch;
- ``requests_refused_total{reason}``: requests refused before any counting (4xx);
- ``config_reloads_total{result}``: ``ok`` or ``error``; ``policies``: policies loaded.

Also: ``BatchMetrics``, the batch observer of a batching Redis store, and
``InstrumentedStore`` and ``InstrumentedLeases``, the wrappers of a store that does not batch;
they feed the latency and error metrics.
"""

from __future__ import annotations

import time

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

from ..algorithms import Outcome
from ..plan import Plan
from ..stores.base import AsyncStore, KeyPartitioned
from ..stores.leases import AsyncLeaseStore
from ..stores.sharded import ShardedRedisStore

_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class Metrics:
    """The service's metrics and their exposition."""

    def __init__(self) -> None:
        # the *_created series only double the scrape size (prometheus_client is untyped here)
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.decisions = Counter(
            "ratekeeper_decisions", "Decisions by policy and outcome.", ["policy", "outcome"],
            registry=r,
        )  # fmt: skip
        self.store_latency = Histogram(
            "ratekeeper_store_latency_seconds", "Latency of store calls.",
            buckets=_LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.store_errors = Counter(
            "ratekeeper_store_errors", "Store calls that raised.", registry=r
        )
        self.batch_size = Histogram(
            "ratekeeper_batch_size", "Calls per batch.", buckets=_BATCH_BUCKETS, registry=r
        )
        self.refused = Counter(
            "ratekeeper_requests_refused", "Requests refused before counting.", ["reason"],
            registry=r,
        )  # fmt: skip
        self.reloads = Counter(
            "ratekeeper_config_reloads", "Config reloads by result.", ["result"], registry=r
        )
        self.policies = Gauge("ratekeeper_policies", "Policies loaded.", registry=r)
        self._children: dict[tuple[str, str], Counter] = {}

    def decision(self, policy: str, outcome: str) -> None:
        """Count one decision (label children are cached: this is on the hot path)."""
        child = self._children.get((policy, outcome))
        if child is None:
            child = self.decisions.labels(policy, outcome)
            self._children[(policy, outcome)] = child
        child.inc()

    def exposition(self) -> bytes:
        """The text format Prometheus scrapes."""
        return generate_latest(self.registry)


class BatchMetrics:
    """A ``stores.batching.BatchObserver`` feeding the batch size, latency and error metrics."""

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


class InstrumentedPartitionedStore(InstrumentedStore):
    """``InstrumentedStore`` over a ``Partitioned`` store (one breaker per shard stays)."""

    def __init__(self, inner: ShardedRedisStore, metrics: Metrics) -> None:
        super().__init__(inner, metrics)
        self.partition = inner.partition


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

    async def release_lease_async(self, key: str, lease_id: str) -> bool:
        start = time.perf_counter()
        try:
            return await self.inner.release_lease_async(key, lease_id)
        except Exception:
            self.metrics.store_errors.inc()
            raise
        finally:
            self.metrics.store_latency.observe(time.perf_counter() - start)

    async def count_leases_async(self, key: str, now_ms: int) -> int:
        return await self.inner.count_leases_async(key, now_ms)
