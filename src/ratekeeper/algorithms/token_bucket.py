"""token_bucket — Stripe's request limiter: tokens refill continuously up to ``burst``.

``count`` tokens per ``period`` drip in continuously (fractions included) up to ``burst``
(default ``count``); a request takes ``cost`` tokens or is rejected without taking any.

Timeline, 100/second with burst=500 (Stripe's example): an idle bucket holds 500, so a burst of
500 requests at t=0 passes and the 501st is rejected with retry_after 10 ms; at t=1 s the bucket
holds 100 again. Over any interval of d seconds at most ``burst + rate*d`` requests pass.

The state is what the bucket lacks, not what it holds: ``debt``, the missing tokens scaled by
``period_ms`` (tokens x period_ms, an integer: the refill per ms is then exactly ``count``), and
when it was counted. So the arithmetic is exact in Python and in Lua, a missing key is a full
bucket, and a changed rate or burst keeps what the key has used: raised, the bucket has room
at once; lowered below the debt, it admits again once the debt has drained under the new
capacity. Accuracy: exact. Memory: two integers per key. Store: one read-modify-write per
decision.
"""

from __future__ import annotations

from ..rates import Rate
from .base import DEBT, INF, Limit, Outcome, check_exact, int_option, new_outcome

NAME = "token_bucket"
CODE = "t"
OPTIONS: frozenset[str] = frozenset({"burst"})

State = tuple[int, int]
"""(debt: missing tokens x period_ms, updated_ms)."""


def make_limit(rate: Rate, options: dict[str, int]) -> Limit:
    """``burst``: bucket capacity, 1..10**12 (default: the rate's count)."""
    burst = int_option("burst", options.get("burst", rate.count), 1, 10**12, NAME)
    check_exact(
        (DEBT + 1) * burst * rate.period_ms, f"burst {burst} x period {rate.period_ms} ms", NAME
    )
    return Limit(rate, rate.count, rate.period_ms, burst=burst)


def _debt(state: State | None, limit: Limit, now_ms: int) -> tuple[int, int]:
    """The debt refilled to ``now_ms`` and when it was counted (a clock behind the writer's
    changes nothing)."""
    if state is None:
        return 0, now_ms
    debt, updated = state
    if now_ms <= updated:
        return debt, updated
    debt -= (now_ms - updated) * limit.count
    return (debt if debt > 0 else 0), now_ms


def step(
    state: State | None, limit: Limit, now_ms: int, cost: int, charge: bool
) -> tuple[Outcome, State | None]:
    """Refill to ``now_ms``, then take ``cost`` tokens if there are enough."""
    count, period = limit.count, limit.period_ms
    full = limit.capacity * period
    # _debt, inlined: this is the hot path
    if state is None:
        debt, updated = 0, now_ms
    else:
        debt, updated = state
        if now_ms > updated:  # conditionals, not max(): a builtin call each, on the hot path
            debt -= (now_ms - updated) * count
            if debt < 0:
                debt = 0
            updated = now_ms
    need = cost * period
    since = updated if updated > now_ms else now_ms
    if debt + need <= full:
        if charge:
            debt += need
            state = (debt, updated)
        reset = since - (-debt // count)
        return new_outcome((True, (full - debt) // period, reset, 0.0)), state
    reset = since - (-debt // count)
    wait = since - now_ms - (-(debt + need - full) // count)
    retry = INF if cost > limit.capacity else wait
    left = full - debt
    return new_outcome((False, left // period if left > 0 else 0, reset, retry)), state


def refund(state: State | None, limit: Limit, now_ms: int, cost: int) -> State | None:
    """Put ``cost`` tokens back, never above ``burst``."""
    if state is None:
        return None
    debt, updated = _debt(state, limit, now_ms)
    debt -= cost * limit.period_ms
    return ((debt if debt > 0 else 0), updated)


credit = refund
"""An admin's top-up: a refund (a bucket never holds more than ``burst``)."""


def debit(state: State | None, limit: Limit, now_ms: int, cost: int) -> State:
    """An admin's charge: ``cost`` tokens taken whatever the bucket holds, down to ``DEBT``
    capacities past empty."""
    debt, updated = _debt(state, limit, now_ms)
    debt += cost * limit.period_ms
    most = (DEBT + 1) * limit.capacity * limit.period_ms
    return ((debt if debt < most else most), updated)


def expires_ms(state: State, limit: Limit) -> int:
    """When the bucket is full again (a missing key means a full bucket)."""
    debt, updated = state
    return updated - (-debt // limit.count)  # ceil_div, inlined: runs on every admitted hit


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
    missing, updated = _debt(state, limit, now_ms)
    period = limit.period_ms
    most = (limit.capacity + debt) * period
    new = missing + delta * period
    if new > most:
        new = most if missing < most else missing
    return (new, updated) if new != missing else state
