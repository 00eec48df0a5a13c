"""Lease stores: the capability behind the concurrency limiter and the fleet-usage shedder.

A lease is one request in progress under a key. A store keeps, per key, the live lease ids and
the epoch ms at which each expires (a crashed worker's lease dies on its own). One call,
``acquire_lease``, drops expired leases, counts the rest and adds the new one if the count is
below capacity, all in one atomic step: there is no window between cleanup and count.

``LeaseStore`` / ``AsyncLeaseStore`` are the protocols (checked once, when a limiter is built);
``MemoryLeases`` is the in-process implementation that ``MemoryStore`` delegates to. The Redis
implementation is in ``redis.leases``.

Releasing a lease after its expiry answers False on every store: at its expiry the lease
stopped counting, and its slot may already be someone else's, so "it was live" would be wrong;
a caller that sees False learns that its work outlived ``lease_ttl``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
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

    def release_lease(self, key: str, lease_id: str, now_ms: int) -> bool:
        """Remove one lease; True if it was still live at ``now_ms`` (an expired lease had
        already stopped counting: releasing it removes it and answers False)."""
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

    async def release_lease_async(self, key: str, lease_id: str, now_ms: int) -> bool:
        """See ``LeaseStore.release_lease``."""
        ...

    async def count_leases_async(self, key: str, now_ms: int) -> int:
        """See ``LeaseStore.count_leases``."""
        ...


class MemoryLeases:
    """Leases in an ordered dict of dicts under one lock.

    Memory stays bounded without anyone calling ``sweep``: a key is dropped when its last lease
    goes; each new key visits the ``SWEEP_BUDGET`` keys at the head of the order, dropping
    their expired leases and moving the keys still holding live ones to the end, so keys are
    visited faster than they are added and expired leases cannot pile up; and past
    ``max_keys`` keys the one at the head (the least recently acquired or visited) is dropped
    with its leases: its slots come free early, which fails open, never closed.
    """

    __slots__ = ("_leases", "_lock", "max_keys")

    SWEEP_BUDGET = 2

    def __init__(self, max_keys: int = 1_000_000) -> None:
        self.max_keys = max_keys
        self._leases: OrderedDict[str, dict[str, int]] = OrderedDict()
        self._lock = threading.Lock()

    def acquire_lease(
        self, key: str, lease_id: str, capacity: int, now_ms: int, expires_ms: int
    ) -> tuple[bool, int]:
        """Sweep, count and add under the lock (see ``LeaseStore``)."""
        with self._lock:
            leases = self._leases
            live = leases.get(key)
            if live is None:
                live = leases[key] = {}
                self._grew(now_ms)
            else:
                _drop_expired(live, now_ms)
                leases.move_to_end(key)
            if len(live) >= capacity:
                count = len(live)
                if not live:
                    del leases[key]
                return False, count
            live[lease_id] = expires_ms
            return True, len(live)

    def release_lease(self, key: str, lease_id: str, now_ms: int) -> bool:
        """Remove one lease (see ``LeaseStore``); an expired one is removed too, but answers
        False: it had stopped counting at its expiry."""
        with self._lock:
            live = self._leases.get(key)
            if live is None:
                return False
            expires_ms = live.pop(lease_id, None)
            if not live:
                del self._leases[key]
            return expires_ms is not None and expires_ms > now_ms

    def count_leases(self, key: str, now_ms: int) -> int:
        """Live leases of ``key`` (see ``LeaseStore``)."""
        with self._lock:
            live = self._leases.get(key, {})
            return sum(1 for exp in live.values() if exp > now_ms)

    def sweep(self, now_ms: int) -> int:
        """Drop every expired lease (and emptied key); returns how many leases went."""
        with self._lock:
            return self._sweep(list(self._leases), now_ms)

    def _grew(self, now_ms: int) -> None:
        """A key was added last (under the lock): bound the keys, and visit a few at the head."""
        leases = self._leases
        if len(leases) > self.max_keys:
            leases.popitem(last=False)
        head: list[str] = []
        for key in leases:
            if len(head) >= self.SWEEP_BUDGET or len(head) >= len(leases) - 1:
                break  # never the key just added (it is last)
            head.append(key)
        self._sweep(head, now_ms)

    def _sweep(self, keys: list[str], now_ms: int) -> int:
        """Drop the expired leases of ``keys``; keys left empty go, the others to the end."""
        dropped = 0
        leases = self._leases
        for key in keys:
            live = leases[key]
            dropped += _drop_expired(live, now_ms)
            if live:
                leases.move_to_end(key)
            else:
                del leases[key]
        return dropped

    def __len__(self) -> int:
        """Keys holding leases (live, or expired and not yet swept)."""
        return len(self._leases)


def _drop_expired(live: dict[str, int], now_ms: int) -> int:
    expired = [i for i, exp in live.items() if exp <= now_ms]
    for i in expired:
        del live[i]
    return len(expired)
