"""fixed_window — GitHub's counter with a stored window end.

The first hit opens a window ``[now, now + period)`` and stores its end beside the count; every
later hit in that window reads the end back, so ``reset_at`` is the same on every call (no
"wobble" from deriving it from a TTL). A stored window whose end has passed is ignored and a
fresh one opened, so a stale copy (an unexpired key, a lagging replica) can never reject.

Timeline, limit 3/minute, first hit at t=10 s::

    t=10 hit  -> count 1, end 70     t=20 hit -> 2     t=30 hit -> 3 (remaining 0)
    t=40 hit  -> rejected, retry_after 30 s, nothing charged
    t=70 hit  -> window ended: fresh window, count 1, end 130

Accuracy: exact per window; two adjacent windows can together admit 2x the limit within one
period. Memory: one count and one end per key. Store: one read-modify-write per decision.
"""

from __future__ import annotations

from ..rates import Rate
from .base import INF, Limit, Outcome, new_outcome

NAME = "fixed_window"
CODE = "f"
OPTIONS: frozenset[str] = frozenset()

State = tuple[int, int]
"""(count, end_ms)."""


def make_limit(rate: Rate, options: dict[str, int]) -> Limit:
    """A fixed window takes no options."""
    return Limit(rate, rate.count, rate.period_ms)


def step(
    state: State | None, limit: Limit, now_ms: int, cost: int, charge: bool
) -> tuple[Outcome, State | None]:
    """Admit ``cost`` if it fits in the current window; a rejection changes nothing."""
    if state is None or state[1] <= now_ms:
        count, end = 0, now_ms + limit.period_ms
    else:
        count, end = state
    most = limit.count
    if count + cost <= most:
        if charge:
            count += cost
            state = (count, end)
        return new_outcome((True, most - count, end, 0.0)), state
    retry = end - now_ms if cost <= most else INF
    return new_outcome((False, most - count if count < most else 0, end, retry)), state


def refund(state: State | None, limit: Limit, now_ms: int, cost: int) -> State | None:
    """Give back up to ``cost`` in a live window; an ended window has nothing to refund."""
    if state is None or state[1] <= now_ms:
        return None
    return (max(0, state[0] - cost), state[1])


def expires_ms(state: State, limit: Limit) -> int:
    """The window's end."""
    return state[1]
