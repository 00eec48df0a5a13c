"""The over-limit cache: rejected (policy, key) pairs answered without the store until the
moment the store said a retry could succeed (see ``service.engine``)."""

from __future__ import annotations

import math
import threading
from dataclasses import replace

from ...decision import Decision


class OverLimitCache:
    """Rejected (policy, key) pairs and when the store said they could next succeed. Safe
    from many threads: reads are single dict operations, writes take a lock."""

    def __init__(self, max_entries: int = 100_000) -> None:
        self.max_entries = max_entries
        self._entries: dict[tuple[str, str], tuple[int, int, Decision]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, name: str, key: str, cost: int, now_ms: int) -> Decision | None:
        """The cached rejection for a request of ``cost`` at ``now_ms``, or None."""
        entry = self._entries.get((name, key))
        if entry is None:
            return None
        until_ms, min_cost, decision = entry
        if now_ms >= until_ms:
            self._entries.pop((name, key), None)
            return None
        if cost < min_cost:
            return None
        retry = (
            decision.retry_after if math.isinf(decision.retry_after) else (until_ms - now_ms) / 1000
        )
        return replace(decision, retry_after=retry, now=now_ms / 1000)

    def put(self, name: str, key: str, cost: int, decision: Decision) -> None:
        """Remember a rejection until its ``retry_after`` (skipped when never admissible)."""
        if math.isinf(decision.retry_after) or decision.retry_after <= 0:
            return
        until_ms = round((decision.now + decision.retry_after) * 1000)
        entries = self._entries
        with self._lock:
            if len(entries) >= self.max_entries:
                now_ms = round(decision.now * 1000)
                first = list(entries.items())[:64]
                stale = [k for k, v in first if v[0] <= now_ms]
                for k in stale or [k for k, _ in first[:1]]:
                    entries.pop(k, None)
            entries[(name, key)] = (until_ms, cost, decision)

    def forget(self, name: str, key: str) -> None:
        self._entries.pop((name, key), None)

    def clear(self) -> None:
        self._entries.clear()
