"""Which limit to pick: suggestions from the per-key needs, with what each would do.

A key's *need* (``suggest.Demand.needs``) is the smallest count that never rejects it. From
the needs of all keys of one rate of one limit:

- **touches almost nobody**: the smallest count that limits at most ``share`` of the keys
  (``suggest.suggest``);
- **stops the outliers**: when the keys split into a bulk and a heavy minority — a *knee* in
  the sorted needs, where the next key needs at least ``KNEE_RATIO`` times (and ``KNEE_GAP``
  more than) the one before it, with at most half of the keys above — the largest need of
  the bulk: the smallest count under which none of the bulk is ever rejected, every heavy key
  is. Of several knees, the widest (by ratio) is taken. A credential-stuffing attack from a
  few hundred addresses among ordinary users is such a minority, as are scrapers in a crowd.

Each suggestion says what it would do, found by replaying the requests of the keys it limits
through the algorithm at its count (``Demand.rejected_at``): keys limited, requests rejected
and their share of the traffic, and the keys it stops, heaviest first, each with its share of
the traffic. Counts of requests, not of keys: 46 scrapers among 46,000 addresses are 0.1 % of
the keys and may be half of the requests.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..rates import Rate
from .suggest import Demand, Suggestion, suggest

KNEE_RATIO = 2.0
"""The next need must be at least this many times the one before (after adding one to each,
so that small whole counts — 1, 2, 3 — do not look like gaps)."""
KNEE_GAP = 3
"""... and at least this much larger."""
NAMED = 10
"""Keys named per suggestion."""


def knee(needs: Sequence[float]) -> tuple[float, float] | None:
    """(the bulk's largest need, the heavy keys' smallest) at the widest knee, or None."""
    ordered = sorted(needs)
    size = len(ordered)
    best: tuple[float, float, float] | None = None
    for i in range(size // 2 - 1, size - 1):  # at most half of the keys above
        low, high = ordered[i], ordered[i + 1]
        if high == low or low < 1:
            continue
        ratio = math.inf if math.isinf(high) else (high + 1) / (low + 1)
        if ratio >= KNEE_RATIO and high - low >= KNEE_GAP and (best is None or ratio > best[0]):
            best = (ratio, low, high)
    return None if best is None else (best[1], best[2])


def advise(
    demand: Demand,
    needs: list[float],
    algorithm: str,
    period: float,
    share: float,
    buckets: int | None,
    total_requests: int,
) -> dict[str, Any]:
    """The suggestions for one rate and algorithm, as JSON-ready data."""
    nobody = suggest(needs, share, algorithm, period)
    out = _impact(demand, needs, nobody, algorithm, buckets, total_requests)
    found = knee(needs)
    if found is not None:
        low, high = found
        count = max(1, int(low))
        outliers = suggest_count(needs, count, algorithm, period)
        out["outliers"] = _impact(demand, needs, outliers, algorithm, buckets, total_requests)
        out["outliers"]["gap"] = [int(low), None if math.isinf(high) else int(high)]
    else:
        out["outliers"] = None
    return out


def suggest_count(needs: Sequence[float], count: int, algorithm: str, period: float) -> Suggestion:
    """``count`` as a ``Suggestion``: the keys it limits."""
    limited = sum(1 for x in needs if x > count)
    return Suggestion(algorithm, count, Rate(count, period).code, limited, limited)


def _impact(
    demand: Demand,
    needs: list[float],
    s: Suggestion,
    algorithm: str,
    buckets: int | None,
    total: int,
) -> dict[str, Any]:
    """A suggestion with what it would do (see the module docstring)."""
    out: dict[str, Any] = {
        "algorithm": s.algorithm,
        "count": s.count,
        "rate": s.rate,
        "limited_keys": s.limited_keys,
        "allowed_keys": s.allowed_keys,
        "rejected_requests": None,
        "rejected_share": None,
        "stops": [],
    }
    if s.count is None:
        return out
    limited = [k for k, need in enumerate(needs) if need > s.count]
    rejected = demand.rejected_at(algorithm, s.count, limited, buckets) if limited else {}
    names = {kid: key for key, kid in demand.ids.items() if kid in rejected}
    counts = demand.counts
    rejected_total = sum(rejected.values())
    out["rejected_requests"] = rejected_total
    out["rejected_share"] = rejected_total / total if total else 0.0
    heaviest = sorted(rejected, key=lambda k: (-counts[k], names[k]))[:NAMED]
    out["stops"] = [
        {
            "key": names[k],
            "need": None if math.isinf(needs[k]) else int(needs[k]),
            "requests": counts[k],
            "traffic_share": counts[k] / total if total else 0.0,
            "rejections": rejected[k],
        }
        for k in heaviest
    ]
    return out
