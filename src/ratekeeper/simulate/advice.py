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

- **rejects at most a share of the requests** (asked with ``reject_share``): the smallest
  count whose replay rejects at most ``floor(reject_share * requests)`` of the limit's
  requests, found by bisection between 0 and the largest need (which rejects nothing), a
  replay per count tried (``Demand.rejected_at``, stopped once past the bound). Keys bound
  the first suggestion, requests this one: one client sending half the traffic is one key
  of many, and limiting it may reject a third of all requests. Rejections only grow as the
  count falls for the window algorithms, so the bisection finds the smallest count; for
  the refilling ones it finds one that keeps to the bound, the smallest in every log tried
  (``tests/simulate/test_reject_share.py``).

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
from .suggest import Demand, Suggestion, largest_count, suggest

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
    reject_share: float | None = None,
) -> dict[str, Any]:
    """The suggestions for one rate and algorithm, as JSON-ready data."""
    nobody = suggest(needs, share, algorithm, period)
    out = _impact(demand, needs, nobody, algorithm, buckets, total_requests)
    out["requests"] = None
    if reject_share is not None:
        bounded = within_requests(
            demand, needs, algorithm, period, reject_share, buckets, total_requests
        )
        out["requests"] = _impact(demand, needs, bounded, algorithm, buckets, total_requests)
        out["requests"]["bound"] = reject_share
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


def within_requests(
    demand: Demand,
    needs: list[float],
    algorithm: str,
    period: float,
    reject_share: float,
    buckets: int | None,
    total: int,
) -> Suggestion:
    """The smallest count rejecting at most ``floor(reject_share * total)`` requests (see
    the module docstring); its ``count`` is None when even the largest count the algorithm
    takes rejects more."""
    allowed = math.floor(reject_share * total + 1e-9)

    def fits(count: int) -> bool:
        limited = [k for k, need in enumerate(needs) if need > count]
        if not limited:
            return True
        rejected = demand.rejected_at(algorithm, count, limited, buckets, most=allowed)
        return sum(rejected.values()) <= allowed

    if not needs:
        return Suggestion(algorithm, None, None, 0, 0)
    top = max(needs)
    if math.isinf(top):  # some key needs more than the algorithm counts
        top = float(largest_count(algorithm))
        if not fits(int(top)):
            limited = sum(1 for x in needs if x > top)
            return Suggestion(algorithm, None, None, limited, limited)
    lo, hi = 0, max(1, int(top))  # hi keeps to the bound; lo does not (0: no count)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return suggest_count(needs, hi, algorithm, period)


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
