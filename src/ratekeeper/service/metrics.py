"""The service's metrics: ratekeeper's one vocabulary (``ratekeeper.metrics``), exported on a
Prometheus registry of its own (no global state) at ``/metrics``.

Names (all prefixed ``ratekeeper_``; the table is ``ratekeeper.metrics.vocabulary``):

- ``decisions_total{policy, outcome}``: outcome is ``allowed``, ``rejected``,
  ``local_rejected`` (answered by the over-limit cache), ``shadow_rejected`` (a shadow policy
  would have rejected), ``degraded`` (fail-open: the store could not be asked), ``disabled``;
- ``store_latency_seconds``: histogram of store calls (one per batch when batching; lease
  calls of concurrency policies too);
- ``store_errors_total``: store calls that raised;
- ``breaker_state{store, shard, kind}``: 0 closed, 1 failing, 2 open, per store part;
- ``in_flight_requests``: HTTP requests being served;
- ``batch_size``: histogram of plans per store call;
- ``requests_refused_total{reason}``: requests refused before any counting (4xx);
- ``config_reloads_total{result}``: ``ok`` or ``error``; ``policies``: policies loaded.

Also: ``InstrumentedStore`` and ``InstrumentedLeases``, the store wrappers that feed the
latency and error metrics.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, generate_latest

from ..algorithms import Outcome
from ..metrics import core
from ..metrics.prometheus import register
from ..plan import Plan
from ..stores.base import AsyncStore, KeyPartitioned
from ..stores.leases import AsyncLeaseStore
from ..stores.sharded import ShardedRedisStore

TOP_KEYS = 64
"""Rejected (policy, key) pairs the dashboard's Space-Saving sketch keeps."""


class Metrics(core.Metrics):
    """The service's metrics (the shared ``Metrics``) and their exposition."""

    def __init__(self) -> None:
        super().__init__(top_keys=TOP_KEYS)
        self.registry = CollectorRegistry(auto_describe=True)
        register(self, self.registry)

    def exposition(self) -> bytes:
        """The text format Prometheus scrapes."""
        return generate_latest(self.registry)


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
