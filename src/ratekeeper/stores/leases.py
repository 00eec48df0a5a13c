"""Lease stores: the capability behind the concurrency limiter and the fleet-usage shedder.

A lease is one request in progress under a key. A store keeps, per key, the live lease ids and
the epoch ms at which each expires (a crashed worker's lease dies on its own). One call,
``acquire_lease``, drops expired leases, counts the rest and adds the new one if the count is
below capacity, all in one atomic step: there is no window between cleanup and count.

``LeaseStore`` / ``AsyncLeaseStore`` are the protocols (checked once, when a limiter is built);
``MemoryLeases`` is the in-process implementation that ``MemoryStore`` delegates to. The Redis
implementation is in ``redis_leases``.
"""

from __future__ import annotations

import threading
from typing import Protocol, runtime_checkable


@runtime_checkable
class LeaseStore(Protocol):
    """Holds leases synchronously."""

    def acquire_lease(
        self, key: str, lease_id: str, capacity: int, now_ms: int, expires_ms: int
    ) -> tuple[bool, int]:
        """Sweep expired leases of ``key``, then add ``lease_id`` if fewer than ``capacity`` live.

        Returns (acquired, live leases after the call).
        """
        ...

    def release_lease(self, key: str, lease_id: str) -> bool:
        """Remove one lease; True if it was still live."""
        ...

    def count_leases(self, key: str, now_ms: int) -> int:
        """Live (unexpired) leases of ``key``; writes nothing."""
        ...


@runtime_checkable
class AsyncLeaseStore(Protocol):
    """Holds leases on an event loop: the same three operations, awaited."""

    async def acquire_lease_async(
        self, key: str, lease_id: str, capacity: int, now_ms: int, expires_ms: int
    ) -> tuple[bool, int]:
        """See ``LeaseStore.acquire_lease``."""
        ...

    async def release_lease_async(self, key: str, lease_id: str) -> bool:
        """See ``LeaseStore.release_lease``."""
        ...

    async def count_leases_async(self, key: str, now_ms: int) -> int:
        """See ``LeaseStore.count_leases``."""
        ...


class MemoryLeases:
    """Leases in a dict of dicts under one lock; keys without live leases are dropped."""

    __slots__ = ("_leases", "_lock")

    def __init__(self) -> None:
        self._leases: dict[str, dict[str, int]] = {}
        self._lock = threading.Lock()

    def acquire_lease(
        self, key: str, lease_id: str, capacity: int, now_ms: int, expires_ms: int
    ) -> tuple[bool, int]:
        """Sweep, count and add under the lock (see ``LeaseStore``)."""
        with self._lock:
            live = self._leases.get(key)
            if live is None:
                live = self._leases[key] = {}
            else:
                expired = [i for i, exp in live.items() if exp <= now_ms]
                for i in expired:
                    del live[i]
            if len(live) >= capacity:
                count = len(live)
                if not live:
                    del self._leases[key]
                return False, count
            live[lease_id] = expires_ms
            return True, len(live)

    def release_lease(self, key: str, lease_id: str) -> bool:
        """Remove one lease (see ``LeaseStore``)."""
        with self._lock:
            live = self._leases.get(key)
            if live is None or live.pop(lease_id, None) is None:
                return False
            if not live:
                del self._leases[key]
            return True

    def count_leases(self, key: str, now_ms: int) -> int:
        """Live leases of ``key`` (see ``LeaseStore``)."""
        with self._lock:
            live = self._leases.get(key, {})
            return sum(1 for exp in live.values() if exp > now_ms)

    def sweep(self, now_ms: int) -> int:
        """Drop every expired lease (and emptied key); returns how many leases went."""
        dropped = 0
        with self._lock:
            for key in list(self._leases):
                live = self._leases[key]
                expired = [i for i, exp in live.items() if exp <= now_ms]
                for i in expired:
                    del live[i]
                dropped += len(expired)
                if not live:
                    del self._leases[key]
        return dropped

    def __len__(self) -> int:
        return len(self._leases)
