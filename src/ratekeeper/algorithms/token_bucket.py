"""token_bucket — Stripe's request limiter: tokens refill continuously up to ``burst``.

``count`` tokens per ``period`` drip in continuously (fractions included) up to ``burst``
(default ``count``); a request takes ``cost`` tokens or is rejected without taking any.

Timeline, 100/second with burst=500 (Stripe's example): an idle bucket holds 500, so a burst of
500 requests at t=0 passes and the 501st is rejected with retry_after 10 ms; at t=1 s the bucket
holds 100 again. Over any interval of d seconds at most ``burst + rate*d`` requests pass.

Tokens are kept scaled by ``period_ms`` (tokens x period_ms, an integer: the refill per ms is
then exactly ``count``), so the arithmetic is exact in Python and in Lua. Accuracy: exact.
Memory: two integers per key. Store: one read-modify-write per decision.
"""

from __future__ import annotations

from ..rates import Rate
from .base import INF, Limit, Outcome, ceil_div, check_exact, int_option, new_outcome

NAME = "token_bucket"
CODE = "t"
OPTIONS: frozenset[str] = frozenset({"burst"})

State = tuple[int, int]
"""(tokens x period_ms, updated_ms)."""


def make_limit(rate: Rate, options: dict[str, int]) -> Limit:
    """``burst``: bucket capacity, 1..10**12 (default: the rate's count)."""
    burst = int_option("burst", options.get("burst", rate.count), 1, 10**12, NAME)
    check_exact(burst * rate.period_ms, f"burst {burst} x period {rate.period_ms} ms", NAME)
    return Limit(rate, rate.count, rate.period_ms, burst=burst)


def _level(state: State | None, limit: Limit, now_ms: int) -> tuple[int, int]:
    full = limit.capacity * limit.period_ms
    if state is None:
        return full, now_ms
    scaled, updated = state
    if now_ms <= updated:
        return scaled, updated
    elapsed = min(now_ms - updated, ceil_div(full - scaled, limit.count))
    return min(full, scaled + elapsed * limit.count), now_ms


def step(
    state: State | None, limit: Limit, now_ms: int, cost: int, charge: bool
) -> tuple[Outcome, State | None]:
    """Refill to ``now_ms``, then take ``cost`` tokens if there are enough."""
    count, period = limit.count, limit.period_ms
    full = limit.capacity * period
    # _level, inlined: this is the hot path
    if state is None:
        scaled, updated = full, now_ms
    else:
        scaled, updated = state
        if now_ms > updated:  # conditionals, not min(): a builtin call each, on the hot path
            elapsed = now_ms - updated
            fill = -(-(full - scaled) // count)
            if fill < elapsed:
                elapsed = fill
            scaled += elapsed * count
            if scaled > full:
                scaled = full
            updated = now_ms
    need = cost * period
    since = updated if updated > now_ms else now_ms
    if scaled >= need:
        if charge:
            scaled -= need
            state = (scaled, updated)
        reset = since - (-(full - scaled) // count)
        return new_outcome((True, scaled // period, reset, 0.0)), state
    reset = since - (-(full - scaled) // count)
    wait = since - now_ms - (-(need - scaled) // count)
    retry = INF if cost > limit.capacity else wait
    # a settled reservation may leave the bucket in debt (scaled < 0): nothing remains
    return new_outcome((False, scaled // period if scaled > 0 else 0, reset, retry)), state


def refund(state: State | None, limit: Limit, now_ms: int, cost: int) -> State | None:
    """Put ``cost`` tokens back, never above ``burst``."""
    if state is None:
        return None
    scaled, updated = _level(state, limit, now_ms)
    return (min(limit.capacity * limit.period_ms, scaled + cost * limit.period_ms), updated)


def expires_ms(state: State, limit: Limit) -> int:
    """When the bucket is full again (a missing key means a full bucket)."""
    scaled, updated = state
    # ceil_div, inlined: runs on every admitted hit
    return updated - (-(limit.capacity * limit.period_ms - scaled) // limit.count)


def check_debt(limit: Limit, debt: int) -> None:
    """The bucket may go down to ``-debt`` tokens: keep ``(burst + debt) x period`` exact."""
    check_exact((limit.capacity + debt) * limit.period_ms, f"burst + debt {debt}", NAME)


def settle(
    state: State | None,
    limit: Limit,
    now_ms: int,
    delta: int,
    since_ms: int,
    charged_ms: int,
    debt: int,
) -> State | None:
    """A reservation settled ``delta`` units from its estimate: tokens are alike, so a
    negative ``delta`` is a refund now (never above ``burst``) and a positive one takes tokens
    now, down to ``-debt`` (a debt the refill pays back before the next request passes).
    Neither mark is needed. Returns ``state`` itself when nothing changes."""
    if delta < 0:
        return state if state is None else refund(state, limit, now_ms, -delta)
    scaled, updated = _level(state, limit, now_ms)
    period = limit.period_ms
    floor = -debt * period
    new = scaled - delta * period
    if new < floor:
        new = floor if scaled > floor else scaled
    return (new, updated) if new != scaled else state
