"""sliding_window — ClassDojo's sliding-window counter, with tunable resolution.

The period is cut into ``buckets`` sub-intervals aligned to the epoch
(``index = floor(now * buckets / period)``). The estimate of use over the last period is the
sum of the current and the ``buckets - 1`` previous sub-interval counts plus the oldest one
weighted by the part of the current sub-interval not yet elapsed. ``buckets=1`` is the plain
two-counter version.

ClassDojo's worked example, 100/minute, buckets=1: 100 requests in the first 15 s of minute 0,
then at 1:15 the estimate is 0 + 100 x 0.75 = 75, so 25 more pass. With buckets=2 (30 s
sub-intervals) the oldest sub-interval is half elapsed at 1:15 and 50 pass.

Promise: any ``buckets`` consecutive aligned sub-intervals (a full period on the grid) admit at
most the limit. An unaligned period can admit up to 2x the limit when the oldest sub-interval's
traffic all came at its very end (ClassDojo's "0.99 minutes" case); more buckets make that
rarer, not impossible. Memory: ``buckets + 1`` small counters per key. Store: one
read-modify-write per decision.
"""

from __future__ import annotations

from ..rates import Rate
from .base import DEBT, INF, Limit, Outcome, ceil_div, check_exact, int_option, new_outcome

NAME = "sliding_window"
CODE = "s"
OPTIONS: frozenset[str] = frozenset({"buckets"})
MAX_BUCKETS = 60

State = tuple[int, tuple[int, ...]]
"""(index of the newest bucket, counts newest first: counts[j] is bucket index - j)."""


def make_limit(rate: Rate, options: dict[str, int]) -> Limit:
    """``buckets``: sub-intervals per period, 1..60 (default 1)."""
    buckets = int_option("buckets", options.get("buckets", 1), 1, MAX_BUCKETS, NAME)
    check_exact((DEBT + 1) * rate.count * rate.period_ms * (buckets + 1), f"rate {rate}", NAME)
    return Limit(rate, rate.count, rate.period_ms, buckets=buckets)


def _align(state: State | None, limit: Limit, now_ms: int) -> tuple[int, int, list[int]]:
    """Shift the counts to the bucket holding now: (index, elapsed part x period, counts)."""
    n, p = limit.buckets, limit.period_ms
    cur = now_ms * n // p
    if state is None:
        return cur, now_ms * n - cur * p, [0] * (n + 1)
    idx, stored = state
    if cur < idx:  # this caller's clock is behind the writer's: count in the newest bucket
        cur, elapsed, shift = idx, 0, 0
    else:
        elapsed = now_ms * n - cur * p
        shift = cur - idx
    if shift > n:
        return cur, elapsed, [0] * (n + 1)
    counts = [0] * shift + list(stored[: n + 1 - shift])
    if len(counts) <= n:
        counts += [0] * (n + 1 - len(counts))
    return cur, elapsed, counts


def _used(counts: list[int], elapsed: int, limit: Limit) -> int:
    """The estimate x period (an integer): full buckets plus the weighted oldest one."""
    n, p = limit.buckets, limit.period_ms
    return sum(counts[:n]) * p + counts[n] * (p - elapsed)


def step(
    state: State | None, limit: Limit, now_ms: int, cost: int, charge: bool
) -> tuple[Outcome, State | None]:
    """Admit if the estimate plus ``cost`` stays within the limit."""
    if limit.buckets != 1:
        return _step_buckets(state, limit, now_ms, cost, charge)
    # buckets=1, the default: the general step below with its two counters unrolled (the same
    # arithmetic; tests/test_hot_path.py compares the two)
    p, most = limit.period_ms, limit.count
    cur = now_ms // p
    new = old = 0
    if state is None:
        elapsed = now_ms - cur * p
    else:
        idx, stored = state
        if cur < idx:  # this caller's clock is behind the writer's: count in the newest bucket
            cur, elapsed = idx, 0
        else:
            elapsed = now_ms - cur * p
        if cur == idx:
            new = stored[0]
            old = stored[1] if len(stored) > 1 else 0
        elif cur == idx + 1:
            old = stored[0]
    used = new * p + old * (p - elapsed)
    allowed = used + cost * p <= most * p
    if allowed and charge:
        new += cost
        used += cost * p
        state = (cur, (new, old) if old else (new,))
    left = most * p - used  # conditionals, not max(): a builtin call each, on the hot path
    remaining = left // p if left > 0 else 0
    reset = (cur + 2) * p if new else (cur + 1) * p if old else now_ms
    if reset < now_ms:
        reset = now_ms
    if allowed:
        return new_outcome((True, remaining, reset, 0.0)), state
    if cost > most:
        retry = INF
    else:  # _admit_at for one bucket: when the old counter has faded enough, or has left
        room = (most - new - cost) * p
        if room >= 0:
            start, oldest = cur * p, old
        else:
            room, start, oldest = (most - cost) * p, (cur + 1) * p, new
        need = p - room // oldest if oldest else 0
        at = start + need if need > 0 else start
        retry = at - now_ms if at > now_ms else 0
    return new_outcome((False, remaining, reset, retry)), state


def _step_buckets(
    state: State | None, limit: Limit, now_ms: int, cost: int, charge: bool
) -> tuple[Outcome, State | None]:
    """The general step, for any number of buckets."""
    p = limit.period_ms
    cur, elapsed, counts = _align(state, limit, now_ms)
    used = _used(counts, elapsed, limit)
    allowed = used + cost * p <= limit.count * p
    if allowed and charge:
        counts[0] += cost
        used += cost * p
        state = (cur, _trim(counts))
    remaining = max(0, (limit.count * p - used) // p)
    if allowed:
        retry = 0.0
    elif cost > limit.count:
        retry = INF
    else:
        retry = _admit_at(counts, cur, limit, cost, now_ms) - now_ms
    return new_outcome((allowed, remaining, _reset_ms(counts, cur, limit, now_ms), retry)), state


def _trim(counts: list[int]) -> tuple[int, ...]:
    end = len(counts)
    while end > 1 and counts[end - 1] == 0:
        end -= 1
    return tuple(counts[:end])


def _reset_ms(counts: list[int], cur: int, limit: Limit, now_ms: int) -> int:
    """When every counted request has aged out of the estimate."""
    n, p = limit.buckets, limit.period_ms
    for j, c in enumerate(counts):
        if c:
            return max(now_ms, ceil_div((cur - j + n + 1) * p, n))
    return now_ms


def _admit_at(counts: list[int], cur: int, limit: Limit, cost: int, now_ms: int) -> int:
    """The first whole ms at which ``cost`` more would fit, if nothing else arrives."""
    n, p = limit.buckets, limit.period_ms
    for k in range(n + 1):
        full = sum(counts[: n - k])
        oldest = counts[n - k]
        room = (limit.count - full - cost) * p
        if room < 0:
            continue
        start = (cur + k) * p
        need = p - room // oldest if oldest else 0
        t = max(now_ms, ceil_div(start + max(0, need), n))
        return t
    return now_ms  # unreachable: at k = n only the newest bucket is left and cost <= count


def refund(state: State | None, limit: Limit, now_ms: int, cost: int) -> State | None:
    """Take ``cost`` back from the newest buckets first, never below zero."""
    if state is None:
        return None
    cur, _, counts = _align(state, limit, now_ms)
    for j in range(len(counts)):
        give = min(cost, counts[j])
        counts[j] -= give
        cost -= give
        if cost == 0:
            break
    return (cur, _trim(counts))


credit = refund
"""An admin's top-up: a refund (never below zero)."""


def debit(state: State | None, limit: Limit, now_ms: int, cost: int) -> State:
    """An admin's charge: ``cost`` in the newest bucket whatever the estimate, up to ``DEBT``
    capacities past the limit."""
    cur, _, counts = _align(state, limit, now_ms)
    room = (DEBT + 1) * limit.count - sum(counts)
    counts[0] += cost if cost < room else max(room, 0)
    return (cur, _trim(counts))


def check_debt(limit: Limit, debt: int) -> None:
    """The estimate may reach ``count + debt``: keep its arithmetic exact."""
    total = (limit.count + debt) * limit.period_ms * (limit.buckets + 1)
    check_exact(total, f"rate {limit.rate} + debt {debt}", NAME)


def settle(
    state: State | None,
    limit: Limit,
    now_ms: int,
    delta: int,
    since_ms: int,
    charged_ms: int,
    debt: int,
) -> State | None:
    """A reservation settled ``delta`` units from its estimate; its charge answered
    ``charged_ms`` (the ``reset_ms`` of a bucket just counted in, which names that bucket).

    ``delta < 0`` takes units back from that bucket while it is still in the estimate (never
    from another: those are other requests'); ``delta > 0`` counts in the newest bucket, past
    the limit while the estimate stays within ``count + debt``. Returns ``state`` itself when
    nothing changes.
    """
    if delta == 0 or (state is None and delta < 0):
        return state
    n, p = limit.buckets, limit.period_ms
    cur, elapsed, counts = _align(state, limit, now_ms)
    if delta < 0:
        for j in range(n + 1):  # the bucket whose reset is charged_ms, newest first
            if -(-(cur - j + n + 1) * p // n) == charged_ms and counts[j]:
                counts[j] -= min(-delta, counts[j])
                return (cur, _trim(counts))
        return state
    room = ((limit.count + debt) * p - _used(counts, elapsed, limit)) // p
    add = delta if delta <= room else max(room, 0)
    if add == 0:
        return state
    counts[0] += add
    return (cur, _trim(counts))


def expires_ms(state: State, limit: Limit) -> int:
    """When the newest bucket leaves the estimate."""
    idx, _ = state
    n = limit.buckets
    return -(-(idx + n + 1) * limit.period_ms // n)  # ceil_div, inlined: runs on every admitted hit
