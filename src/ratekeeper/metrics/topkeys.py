"""``SpaceSaving``: the heaviest items of a stream in bounded memory (Metwally et al., 2005).

At most ``capacity`` counters are kept. A new item, when all are taken, replaces the item with
the smallest count and inherits that count (+1) as its own, remembering the inherited part as
its ``error``. Any item whose true count exceeds ``total / capacity`` is guaranteed to be
present, and each reported count overestimates the truth by at most its ``error``. The
dashboard feeds it the keys of rejected requests: the top limited keys, never a map of every
key. Item text is cut to ``max_len`` characters so one long key cannot take much memory. Each
item also keeps when it was first and last counted (by ``clock``): an item that replaced
another is first seen when it came in.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ConfigError


@dataclass(frozen=True, slots=True)
class Heavy:
    """One tracked item: ``count`` may overestimate its true count by at most ``error``."""

    group: str
    item: str
    count: int
    error: int
    first_seen: float = 0.0
    """When it was first counted (the clock's seconds)."""
    last_seen: float = 0.0
    """When it was last counted."""


class SpaceSaving:
    """A Space-Saving sketch of (group, item) pairs, e.g. (policy, key)."""

    def __init__(
        self, capacity: int = 64, max_len: int = 200, clock: Callable[[], float] = time.time
    ) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ConfigError(f"capacity={capacity!r} is invalid; expected a whole number >= 1")
        self.capacity = capacity
        self.max_len = max_len
        self.total = 0
        self.clock = clock
        # item -> [count, error, first seen, last seen]
        self._counts: dict[tuple[str, str], list[float]] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._counts)

    def add(self, group: str, item: str, n: int = 1) -> None:
        """Count ``n`` occurrences of ``item`` in ``group``."""
        if len(item) > self.max_len:
            item = item[: self.max_len] + "…"
        k = (group, item)
        now = self.clock()
        with self._lock:
            self.total += n
            cell = self._counts.get(k)
            if cell is not None:
                cell[0] += n
                cell[3] = now
            elif len(self._counts) < self.capacity:
                self._counts[k] = [n, 0, now, now]
            else:
                smallest = min(self._counts, key=lambda x: self._counts[x][0])
                floor = self._counts.pop(smallest)[0]
                self._counts[k] = [floor + n, floor, now, now]

    def top(self, n: int = 10) -> list[Heavy]:
        """The ``n`` items with the highest counts, highest first."""
        with self._lock:
            items = [
                Heavy(g, i, int(c), int(e), first, last)
                for (g, i), (c, e, first, last) in self._counts.items()
            ]
        items.sort(key=lambda h: (-h.count, h.group, h.item))
        return items[:n]

    def clear(self) -> None:
        """Forget everything."""
        with self._lock:
            self._counts.clear()
            self.total = 0
