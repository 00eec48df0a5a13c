"""gcra — the generic cell rate algorithm (as in redis-cell): one stored timestamp per key.

Each unit has an emission interval ``T = period / count``. The key stores the theoretical
arrival time ``tat`` (when the limiter is fully idle again). A request of ``cost`` moves it to
``max(tat, now) + cost*T`` and is admitted if that is no more than ``burst*T`` ahead of now.
``burst`` (default ``count``) is how many requests may pass at one instant; ``burst=1`` spaces
requests evenly.

Timeline, 2/second, burst=1: t=0 admitted (tat 0.5 s); t=0.1 rejected, retry_after 0.4 s;
t=0.5 admitted (tat 1.0 s).

``T`` is rounded *up* to a whole microsecond (never admits more than the rate; at 3/second the
error is 1 µs per request). Rates above 1,000,000/second are refused: use token_bucket.

The state keeps the count its ``tat`` was written under, so a changed rate keeps what the key
has used: the debt ``tat - now`` of the old ``T`` becomes the same number of units of the new
``T`` (rounded down to the µs: the client gains less than 1 µs), so a raised limit has room at
once and a lowered one admits again once the units used have drained under it. The first hit
under the new rate, admitted or not, writes the state restated (``step`` returns it), so from
then on it drains at the new pace and a rejection's ``retry_after`` holds.
Accuracy: exact, with exact retry_after. Memory: one integer per key. Store: one
read-modify-write per decision.
"""

from __future__ import annotations

import math

from ..errors import ConfigError
from ..rates import Rate
from .base import (
    DEBT,
    HORIZON_MS,
    INF,
    Limit,
    Outcome,
    ceil_div,
    check_exact,
    int_option,
    new_outcome,
)

NAME = "gcra"
CODE = "g"
OPTIONS: frozenset[str] = frozenset({"burst"})

State = tuple[int, int]
"""(tat_us, count): the theoretical arrival time in epoch microseconds, and the rate's count
when it was written."""


def make_limit(rate: Rate, options: dict[str, int]) -> Limit:
    """``burst``: how many may pass at one instant, 1..10**9 (default: the rate's count)."""
    burst = int_option("burst", options.get("burst", rate.count), 1, 10**9, NAME)
    if rate.count * 1000 > rate.period_ms * 1_000_000:
        raise ConfigError(
            f"rate {rate} is above 1,000,000/second, too fine for gcra; use token_bucket"
        )
    # the largest value a step computes is the stored tat (at most now + (DEBT + 1) * tau after
    # an admin's debit) + cost*T (admitted: cost <= burst) <= now + (DEBT + 2) * tau
    tau = burst * interval_us(rate.count, rate.period_ms)
    check_exact(HORIZON_MS * 1000 + (DEBT + 2) * tau, f"burst {burst} x interval", NAME)
    return Limit(rate, rate.count, rate.period_ms, burst=burst, unit=tau // burst)


def interval_us(count: int, period_ms: int) -> int:
    """The emission interval T in whole microseconds, rounded up."""
    return ceil_div(period_ms * 1000, count)


def step(
    state: State | None, limit: Limit, now_ms: int, cost: int, charge: bool
) -> tuple[Outcome, State | None]:
    """Admit if the new arrival time stays within ``burst*T`` of now."""
    t = limit.unit  # interval_us(count, period_ms), derived once by make_limit
    capacity = limit.capacity
    tau = capacity * t
    now_us = now_ms * 1000
    if state is None:
        tat = now_us
    else:
        tat = state[0]
        if state[1] != limit.count:  # written under another rate: restated under this one
            tat = convert(tat, state[1], limit, now_us)
            state = (tat if tat > now_us else now_us, limit.count)
        if tat < now_us:
            tat = now_us
    new_tat = tat + cost * t
    if cost <= capacity and new_tat - now_us <= tau:
        if charge:
            tat = new_tat
            state = (tat, limit.count)
        # here tat <= now + tau, so the remaining count is >= 0 without max()
        return new_outcome((True, (now_us + tau - tat) // t, -(-tat // 1000), 0.0)), state
    retry = INF if cost > capacity else -(-(new_tat - tau - now_us) // 1000)
    ahead = now_us + tau - tat
    return new_outcome((False, ahead // t if ahead > 0 else 0, -(-tat // 1000), retry)), state


def convert(tat: int, count: int, limit: Limit, now_us: int) -> int:
    """A ``tat`` written under rate count ``count``, under ``limit``'s: the same units used
    (the debt ``tat - now`` in units of the old ``T`` as units of the new one, rounded down to
    the µs; the remainder's product in doubles, as the Lua twin computes it)."""
    debt = tat - now_us
    if debt <= 0 or count < 1:
        return now_us
    old = interval_us(count, limit.period_ms)
    q, r = divmod(debt, old)
    return now_us + q * limit.unit + math.floor(float(r) * limit.unit / old)


def _tat(state: State | None, limit: Limit, now_us: int) -> int:
    if state is None:
        return now_us
    tat = state[0] if state[1] == limit.count else convert(state[0], state[1], limit, now_us)
    return tat if tat > now_us else now_us


def refund(state: State | None, limit: Limit, now_ms: int, cost: int) -> State | None:
    """Move the arrival time back by ``cost*T``, never before now."""
    if state is None:
        return None
    now_us = now_ms * 1000
    return (max(now_us, _tat(state, limit, now_us) - cost * limit.unit), limit.count)


credit = refund
"""An admin's top-up: a refund (never more room than ``burst``)."""


def debit(state: State | None, limit: Limit, now_ms: int, cost: int) -> State:
    """An admin's charge: the arrival time moved ``cost*T`` on whatever it was, at most
    ``DEBT`` capacities past empty."""
    now_us = now_ms * 1000
    tat = _tat(state, limit, now_us) + cost * limit.unit
    most = now_us + (DEBT + 1) * limit.capacity * limit.unit
    return (tat if tat < most else most, limit.count)


def expires_ms(state: State, limit: Limit) -> int:
    """The arrival time: after it the key means the same as no key (a state written under
    another count means as long: ``tat`` stays where it was when counted the new way)."""
    return -(-state[0] // 1000)  # ceil_div, inlined: runs on every admitted hit


def check_debt(limit: Limit, debt: int) -> None:
    """The arrival time may run ``debt x T`` past ``now + burst x T``: keep it exact."""
    check_exact(HORIZON_MS * 1000 + (2 * limit.capacity + debt) * limit.unit, "debt", NAME)


def settle(
    state: State | None,
    limit: Limit,
    now_ms: int,
    delta: int,
    since_ms: int,
    charged_ms: int,
    debt: int,
) -> State | None:
    """A reservation settled ``delta`` units from its estimate: units are alike, so a negative
    ``delta`` moves the arrival time back now (never before now) and a positive one moves it
    on, up to ``now + (burst + debt) x T``: a debt later requests wait out. Neither mark is
    needed. Returns ``state`` itself when nothing changes."""
    if delta < 0:
        return state if state is None else refund(state, limit, now_ms, -delta)
    t = limit.unit
    now_us = now_ms * 1000
    tat = _tat(state, limit, now_us)
    cap = now_us + (limit.capacity + debt) * t
    new = tat + delta * t
    if new > cap:
        new = cap if tat < cap else tat
    return (new, limit.count) if new != tat else state
