"""Per-key need and the suggested limit: exact, by parallel binary search over spooled events.

A key's *need* under an algorithm and period is the smallest count ``N`` for which replaying
that key's requests through the algorithm's own step, at rate ``N/period``, rejects nothing:
its peak usage per window, as that algorithm counts windows. Being never rejected only gets
easier as ``N`` grows, so each key's need is found by binary search, all keys at once: every
pass reads the spooled events (key id, time, cost) once and steps each unresolved key at the
middle of its own interval. The first pass checks ``N`` = the key's total cost (almost always
enough); about log2(total) passes follow. Memory: a few numbers per distinct key; the events
wait in a temporary file.

The suggested limit for a share ``s`` of ``K`` keys is the smallest ``N`` that limits at most
``floor(s * K)`` keys: the ``(K - floor(s * K))``-th smallest need. token_bucket and gcra are
searched with their burst equal to the count (their default), sliding_window with its buckets.
"""

from __future__ import annotations

import math
import tempfile
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..algorithms import ALGORITHMS, Limit
from ..errors import RateSpecError
from ..rates import Rate

CHUNK = 3 * 65536


@dataclass(frozen=True, slots=True)
class Suggestion:
    """The smallest count limiting at most ``allowed_keys`` keys, and how many it limits."""

    algorithm: str
    count: int | None
    """None: no count the algorithm accepts keeps enough keys unlimited."""
    rate: str | None
    limited_keys: int
    allowed_keys: int


class Demand:
    """The requests one rate of one limit saw: key, time and cost, for the needs."""

    def __init__(self, period_ms: int) -> None:
        self.period_ms = period_ms
        self.ids: dict[str, int] = {}
        self.totals: list[int] = []
        self._buffer = array("q")
        self._spool = tempfile.TemporaryFile()  # noqa: SIM115  # closed in close()

    def add(self, key: str, now_ms: int, cost: int) -> None:
        """One request of ``key``."""
        kid = self.ids.get(key)
        if kid is None:
            kid = self.ids[key] = len(self.totals)
            self.totals.append(0)
        self.totals[kid] += cost
        buf = self._buffer
        buf.extend((kid, now_ms, cost))
        if len(buf) >= CHUNK:
            self._spool.write(buf.tobytes())
            del buf[:]

    def _replay(self) -> Iterator[array[int]]:
        if self._buffer:
            self._spool.write(self._buffer.tobytes())
            del self._buffer[:]
        self._spool.flush()
        self._spool.seek(0)
        while True:
            raw = self._spool.read(CHUNK * 8)
            if not raw:
                return
            chunk = array("q")
            chunk.frombytes(raw)
            yield chunk

    def needs(self, algorithm: str, buckets: int | None = None) -> list[float]:
        """Each key's need (``math.inf`` past the largest count the algorithm takes)."""
        module: Any = ALGORITHMS[algorithm]
        options = {"buckets": buckets} if buckets and "buckets" in module.OPTIONS else {}
        limits: dict[int, Limit | None] = {}

        def limit_of(n: int) -> Limit | None:
            if n not in limits:
                try:
                    limits[n] = module.make_limit(Rate(n, self.period_ms / 1000), options)
                except RateSpecError:
                    limits[n] = None
                except ValueError:  # e.g. sliding_log past its largest count
                    limits[n] = None
            return limits[n]

        size = len(self.totals)
        lo = [0] * size  # the largest count known to reject (0: none yet)
        hi = list(self.totals)  # the smallest count known not to, once checked
        checked = [False] * size
        step = module.step
        while True:
            trial = [
                -1
                if checked[k] and hi[k] - lo[k] <= 1
                else (hi[k] + lo[k]) // 2
                if checked[k]
                else hi[k]
                for k in range(size)
            ]
            if all(t < 0 for t in trial):
                break
            lims = [None if t < 0 else limit_of(t) for t in trial]
            ok = [t >= 0 and lims[k] is not None for k, t in enumerate(trial)]
            states: list[Any] = [None] * size
            for chunk in self._replay():
                for i in range(0, len(chunk), 3):
                    k = chunk[i]
                    if not ok[k]:
                        continue
                    outcome, new = step(states[k], lims[k], chunk[i + 1], chunk[i + 2], True)
                    if outcome[0]:
                        states[k] = new
                    else:
                        ok[k] = False
            for k, t in enumerate(trial):
                if t < 0:
                    continue
                if not checked[k]:
                    checked[k] = True
                    if not ok[k]:  # the total was not enough: search above it
                        lo[k], hi[k] = t, _ceiling(module)
                elif ok[k]:
                    hi[k] = t
                else:
                    lo[k] = t
        ceiling = _ceiling(module)
        return [math.inf if h >= ceiling else float(h) for h in hi]

    def close(self) -> None:
        self._spool.close()


def _ceiling(module: Any) -> int:
    """One past the largest count the search tries."""
    return int(getattr(module, "MAX_COUNT", 10**9)) + 1


def quantiles(needs: list[float]) -> dict[str, float]:
    """p50, p90, p99 and max of the needs (nearest rank); empty when there are none."""
    if not needs:
        return {}
    ordered = sorted(needs)
    n = len(ordered)

    def rank(q: float) -> float:
        return ordered[max(0, math.ceil(q * n) - 1)]

    return {"p50": rank(0.5), "p90": rank(0.9), "p99": rank(0.99), "max": ordered[-1]}


def suggest(needs: list[float], share: float, algorithm: str, period: float) -> Suggestion:
    """The smallest count that limits at most ``floor(share * keys)`` keys."""
    allowed = math.floor(share * len(needs) + 1e-9)
    ordered = sorted(needs)
    index = len(ordered) - allowed - 1
    value = ordered[index] if index >= 0 else 1.0
    if math.isinf(value):
        return Suggestion(algorithm, None, None, sum(1 for x in needs if math.isinf(x)), allowed)
    count = max(1, int(value))
    limited = sum(1 for x in needs if x > count)
    return Suggestion(algorithm, count, Rate(count, period).code, limited, allowed)
