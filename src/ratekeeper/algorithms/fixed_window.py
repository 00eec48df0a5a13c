"""fixed_window — GitHub's counter with a stored window end.

The first hit opens a window ``[now, now + period)`` and stores its end beside the count; every
later hit in that window reads the end back, so ``reset_at`` is the same on every call (no
"wobble" from deriving it from a TTL). A stored window whose end has passed is ignored and a
fresh one opened, so a stale copy (an unexpired key, a lagging replica) can never reject.

Timeline, limit 3/minute, first hit at t=10 s::

    t=10 hit  -> count 1, end 70     t=20 hit -> 2     t=30 hit -> 3 (remaining 0)
    t=40 hit  -> rejected, retry_after 30 s, nothing charged
    t=70 hit  -> window ended: fresh window, count 1, end 130

Two options give envoyproxy/ratelimit's counting (the service's Envoy domains use both):

- ``aligned``: windows are aligned to the period on the epoch, ``[now - now % period, ...)``,
  so every key's minute starts on the minute and a day at 00:00 UTC.
- ``count_rejected``: every hit is charged, admitted or not, so a client that keeps knocking
  stays over its limit until the window ends (limit 10: hits of 8, 5, 1 answer allowed,
  rejected, rejected; without the option the 1 passes). A rejection still reports what the
  request found (``remaining`` before it). The counter counts hits whatever the limit, so the
  state slot leaves the count out: every limit of the same period on a key reads one counter.

Calendar rates (``1000/calendar-month``, ``ratekeeper.calendar``) open a window that ends at
the calendar period's end, computed from ``now`` (and sent to the Lua twin as the rate's
``period_ms`` argument, with the ``CALENDAR`` bit): the stored end is that period's true end.

An admin's ``credit`` lowers the count, below zero if need be (a top-up: the window then holds
more than its limit); ``debit`` raises it whatever the limit. Both open a window if none is
live, as a hit would.

Accuracy: exact per window; two adjacent windows can together admit 2x the limit within one
period. Memory: one count and one end per key. Store: one read-modify-write per decision.
"""

from __future__ import annotations

from ..errors import ConfigError
from ..rates import Rate
from .base import COUNT_REJECTED, INF, Limit, Outcome, check_exact, new_outcome

NAME = "fixed_window"
CODE = "f"
OPTIONS: frozenset[str] = frozenset({"aligned", "count_rejected"})

ALIGNED = 1
"""``Limit.flags`` bit: windows start at multiples of the period since the epoch."""
CALENDAR = 4
"""``Limit.flags`` bit: windows are the rate's calendar periods (``Rate.calendar``)."""
MAX_COUNT = 10**15
"""A ``count_rejected`` counter stops growing here (exact in a double; no limit is this high)."""

State = tuple[int, int]
"""(count, end_ms)."""


def make_limit(rate: Rate, options: dict[str, int]) -> Limit:
    """``aligned`` and ``count_rejected``: true or false (default false)."""
    flags = 0
    for name, bit in (("aligned", ALIGNED), ("count_rejected", COUNT_REJECTED)):
        value = options.get(name, False)
        if not isinstance(value, bool):
            raise ConfigError(f"option {name}={value!r} for {NAME} is invalid; expected True/False")
        flags |= bit if value else 0
    if rate.calendar is not None:
        flags |= CALENDAR
    return Limit(rate, rate.count, rate.period_ms, flags=flags)


def window_end(limit: Limit, now_ms: int) -> int:
    """The end of a window opened at ``now_ms``."""
    if limit.flags & CALENDAR:
        return limit.rate.calendar.end_ms(now_ms)  # type: ignore[union-attr]  # the bit says so
    period = limit.period_ms
    return (now_ms - now_ms % period if limit.flags & ALIGNED else now_ms) + period


def step(
    state: State | None, limit: Limit, now_ms: int, cost: int, charge: bool
) -> tuple[Outcome, State | None]:
    """Admit ``cost`` if it fits in the current window; a rejection changes nothing (unless
    ``count_rejected``: then it is counted too)."""
    if state is None or state[1] <= now_ms:
        flags = limit.flags
        if flags & CALENDAR:
            count, end = 0, window_end(limit, now_ms)
        else:
            period = limit.period_ms
            count, end = 0, (now_ms - now_ms % period if flags & ALIGNED else now_ms) + period
    else:
        count, end = state
    most = limit.count
    if count + cost <= most:
        if charge:
            count += cost
            state = (count, end)
        return new_outcome((True, most - count, end, 0.0)), state
    retry = end - now_ms if cost <= most else INF
    left = most - count if count < most else 0
    if charge and limit.flags & COUNT_REJECTED:
        count += cost
        state = (count if count < MAX_COUNT else MAX_COUNT, end)
    return new_outcome((False, left, end, retry)), state


def refund(state: State | None, limit: Limit, now_ms: int, cost: int) -> State | None:
    """Give back up to ``cost`` in a live window, never below zero (a count an admin's credit
    took below zero stays); an ended window has nothing to refund."""
    if state is None or state[1] <= now_ms:
        return None
    count = state[0]
    return (count - cost if count > cost else min(count, 0), state[1])


def credit(state: State | None, limit: Limit, now_ms: int, cost: int) -> State:
    """An admin's top-up: ``cost`` off the window's count, below zero if need be."""
    count, end = _live(state, limit, now_ms)
    count -= cost
    return (count if count > -MAX_COUNT else -MAX_COUNT, end)


def debit(state: State | None, limit: Limit, now_ms: int, cost: int) -> State:
    """An admin's charge: ``cost`` on the window's count whatever the limit."""
    count, end = _live(state, limit, now_ms)
    count += cost
    return (count if count < MAX_COUNT else MAX_COUNT, end)


def _live(state: State | None, limit: Limit, now_ms: int) -> State:
    if state is None or state[1] <= now_ms:
        return (0, window_end(limit, now_ms))
    return state


def expires_ms(state: State, limit: Limit) -> int:
    """The window's end."""
    return state[1]


def check_debt(limit: Limit, debt: int) -> None:
    """Any debt fits: a count is a small integer (a ``count_rejected`` counter has none)."""
    if limit.flags & COUNT_REJECTED:
        raise ConfigError(
            "count_rejected counts every hit, admitted or not; a nested call or a reservation "
            "charges no level when one rejects, so it cannot take count_rejected"
        )
    check_exact(limit.count + debt, f"count {limit.count} + debt {debt}", NAME)


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
    ``charged_ms``, the end of the window it was counted in (``since_ms`` is not needed).

    ``delta < 0`` gives units back to that window, if it is still the live one (a window that
    has ended gave everything back when the next one opened); ``delta > 0`` charges the live
    window (opening one if none), past the limit up to ``count + debt``. Returns ``state``
    itself when nothing changes.
    """
    live = state is not None and state[1] > now_ms
    if delta < 0:
        if state is not None and live and state[1] == charged_ms:
            return refund(state, limit, now_ms, -delta)
        return state
    count, end = _live(state, limit, now_ms)
    room = limit.count + debt - count
    add = delta if delta <= room else max(room, 0)
    return (count + add, end) if add > 0 else state
