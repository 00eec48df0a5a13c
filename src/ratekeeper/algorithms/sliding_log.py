"""sliding_log — the exact sliding window: one timestamp per admitted unit.

A unit admitted at ``ts`` counts while ``now < ts + period``. A request is admitted if the
units still in the window plus ``cost`` fit the limit; ``retry_after`` is when enough of the
oldest units will have left.

Timeline, 2/minute: t=0 admitted, t=30 admitted, t=45 rejected (retry_after 15 s: the t=0
unit leaves at 60), t=60 admitted.

This is the costly, precise one (ClassDojo's original design): memory grows with the limit
(one entry per admitted unit, up to ``count`` per key) and every hit prunes old entries, so
use it for small limits where exactness matters. Limits above 100,000 are refused.
Accuracy: exact over any window. Store: one read-modify-write per decision.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort

from ..errors import ConfigError
from ..rates import Rate
from .base import DEBT, INF, Limit, Outcome, new_outcome

NAME = "sliding_log"
CODE = "l"
OPTIONS: frozenset[str] = frozenset()
MAX_COUNT = 100_000

State = tuple[int, ...]
"""Admission times in epoch ms, oldest first (a unit of cost n is n equal entries)."""


def make_limit(rate: Rate, options: dict[str, int]) -> Limit:
    """A sliding log takes no options; its count is capped to keep memory bounded."""
    if rate.count > MAX_COUNT:
        raise ConfigError(
            f"rate {rate} is too large for sliding_log (at most {MAX_COUNT:_} per period); "
            "use sliding_window, which keeps a few counters instead of one entry per request"
        )
    return Limit(rate, rate.count, rate.period_ms)


def _live(state: State | None, limit: Limit, now_ms: int) -> list[int]:
    if not state:
        return []
    start = bisect_right(state, now_ms - limit.period_ms)
    return list(state[start:])


def step(
    state: State | None, limit: Limit, now_ms: int, cost: int, charge: bool
) -> tuple[Outcome, State | None]:
    """Admit if the entries inside the window plus ``cost`` fit the limit."""
    most = limit.count
    log: State = state[bisect_right(state, now_ms - limit.period_ms) :] if state else ()
    size = len(log)
    allowed = size + cost <= most
    if allowed and charge:
        if not log or log[-1] <= now_ms:  # the usual case: now is the newest entry
            log += (now_ms,) * cost
        else:  # this caller's clock is behind the writer's: keep the log sorted
            entries = list(log)
            for _ in range(cost):
                insort(entries, now_ms)
            log = tuple(entries)
        size += cost
        state = log
    if allowed:
        retry = 0.0
    elif cost > most:
        retry = INF
    else:
        retry = log[size + cost - most - 1] + limit.period_ms - now_ms
    reset = log[-1] + limit.period_ms if log else now_ms
    if reset < now_ms:  # conditionals, not max(): a builtin call each, on the hot path
        reset = now_ms
    return new_outcome((allowed, most - size if size < most else 0, reset, retry)), state


def refund(state: State | None, limit: Limit, now_ms: int, cost: int) -> State | None:
    """Remove the ``cost`` newest entries still in the window."""
    log = _live(state, limit, now_ms)
    del log[max(0, len(log) - cost) :]
    return tuple(log)


credit = refund
"""An admin's top-up: a refund (the newest units out of the log)."""


def debit(state: State | None, limit: Limit, now_ms: int, cost: int) -> State:
    """An admin's charge: ``cost`` units logged at ``now_ms`` whatever the window holds, up to
    ``DEBT`` capacities past the limit."""
    log = _live(state, limit, now_ms)
    n = min(cost, (DEBT + 1) * limit.count - len(log))
    for _ in range(max(n, 0)):
        insort(log, now_ms)
    return tuple(log)


def check_debt(limit: Limit, debt: int) -> None:
    """A log holds up to ``count + debt`` entries: keep it within twice the cap."""
    if debt > MAX_COUNT:
        raise ConfigError(f"debt {debt} is too large for sliding_log (at most {MAX_COUNT:_})")


def settle(
    state: State | None,
    limit: Limit,
    now_ms: int,
    delta: int,
    since_ms: int,
    charged_ms: int,
    debt: int,
) -> State | None:
    """A reservation made at ``since_ms`` settled ``delta`` units from its estimate (its
    entries are stamped ``since_ms``; ``charged_ms`` is not needed).

    ``delta < 0`` removes up to ``-delta`` entries stamped ``since_ms`` (the reservation's,
    or others of the same millisecond, which are alike) while they are in the window;
    ``delta > 0`` appends entries at now, past the limit up to ``count + debt`` in the window.
    Returns ``state`` itself when nothing changes.
    """
    log = _live(state, limit, now_ms)
    if delta < 0:
        lo, hi = bisect_left(log, since_ms), bisect_right(log, since_ms)
        take = min(-delta, hi - lo)
        return tuple(log[:lo] + log[lo + take :]) if take else state
    room = limit.count + debt - len(log)
    add = delta if delta <= room else max(room, 0)
    if add == 0:
        return state
    for _ in range(add):
        insort(log, now_ms)
    return tuple(log)


def expires_ms(state: State, limit: Limit) -> int:
    """When the newest entry leaves the window."""
    return state[-1] + limit.period_ms if state else 0
