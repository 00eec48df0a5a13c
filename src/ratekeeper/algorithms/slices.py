"""slices — a process's share of a key's budget, taken from the store in one atomic step.

A *slice* (the docs call it a local lease) is budget a process takes ahead of its requests and
then spends in process, without a store call per request. One operation, ``take``, does in one
atomic step what a process needs from the store: give back what it did not spend of earlier
slices (``settles``), charge what it admitted on its own while the store was unreachable
(``debt``, never past empty), and grant a new slice, named ``slice_id``, of at least ``need``
units (the request's cost) and at most ``want``, or nothing. A grant is at most
``max(need, available // share)``: near the limit slices shrink, so little budget sits unspent
in other processes when one of them runs out. ``need=0`` only settles and charges;
``share=0`` is a peek: it grants nothing (and, with nothing to settle or charge, writes
nothing), and answers what a take of ``need`` would find. ``reset`` starts the key over: the
settled slices (the resetting process's own) are forgotten without giving anything back, and
the state becomes that of a fresh key less the units still held in the other live slices
(their processes may still spend them, so they stay counted until given back); with none
held the state is deleted, as a plain reset does. The reply is then a peek's.

Every key keeps a *reservation*: each live slice's (expires_ms, slice id, units granted). A
settle names a slice and the units its process spent from it; the store gives back the rest
and forgets the slice. So a settle is idempotent: sent twice, or for a take that failed on
the way (the process cannot know whether it ran, so it settles that slice's id as unspent at
its next call), it gives back exactly what was granted and not spent, once.

The rule per algorithm (``SLICED``; the others are decided exactly, one store call each):

- **fixed_window**: a slice is count reserved in the current window: the window's count grows
  by the slice when it is taken, the process admits from it until the window's end, and a
  settle gives back into that same window only (a slice of an ended window is gone), never
  into a later one. Each window still admits at most the limit. Limit 10/minute, two
  processes::

      t=0   A takes 4 (count 4)     t=1  B takes 3 (count 7)    A spends 4, B spends 2
      t=20  A settles its 4 (spent 4) and takes 1 (count 8)
      t=59  B settles its 3 (spent 2): 1 back (count 7): 7 admitted, 3 left
      t=60  the window ends: whatever is still held ends with it

  A window whose state is missing while slices of it are still reserved (reset by a process
  without slices, or evicted) starts from the units they hold, until their end: what their
  processes still spend of them stays counted.
- **token_bucket** and **gcra** (a bucket of ``burst`` units refilled at the rate; gcra is the
  same bucket told by its arrival time): a slice takes units now, to be spent later. A bucket
  that refills while units are held would otherwise hand out the same capacity twice (a full
  bucket sliced at t=0, full again at t=T, sliced again: two bursts at T). So while units are
  reserved the bucket refills only up to ``burst - reserved``: what the store holds plus what
  processes hold unspent then never exceeds one exact bucket, and every admission is one an
  exact bucket would allow. A slice expires at the end of the epoch (``epoch_ms``) after the
  one it was taken in; the reservation of a slice never settled (its process was killed) lapses
  then. A settle gives back only while the slice lives; after that its unspent units are lost
  (a full bucket would have lost them too).
- **sliding_window**, **sliding_log**: no slices. A log records when each unit was spent, and a
  sliding estimate weighs units by when they were counted: a unit spent later than counted
  would leave the estimate early.

States are the algorithms' own (``fixed_window``: (count, end_ms); ``token_bucket``: (debt:
missing tokens x period_ms, updated_ms); ``gcra``: (tat_us, the count it was written under)),
so a peek or a process without slices reads the same counters, and a changed rate keeps them
as the algorithms do (a debt past a lowered capacity leaves nothing available until it has
drained; a tat of another count is converted, ``gcra.convert``). Calendar rates are not
sliced (``LocalBudget`` sends them to the store). The Lua twin is ``lua/slices.lua``;
``tests/test_slices.py`` drives both with the same random traffic and requires the same
replies and states.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from .base import INF, Limit
from .fixed_window import ALIGNED
from .gcra import convert

SLICED = frozenset({"fixed_window", "token_bucket", "gcra"})
"""Algorithms whose limits can be sliced."""

Pairs = tuple[tuple[int, str, int], ...]
"""A key's reservation: (expires_ms, slice id, units granted) of each slice, by expiry."""


class Ask(NamedTuple):
    """What a process asks of one key in a ``take``."""

    need: int
    """The least worth granting (the request's cost); 0: grant nothing, only settle and charge."""
    want: int
    """The most it would like (>= need)."""
    share: int
    """A grant is at most max(need, available // share); 0: a peek, grants nothing."""
    debt: int = 0
    """Units it admitted without the store, charged now (never past empty)."""
    settles: tuple[tuple[str, int], ...] = ()
    """(slice id, units spent from it) of slices to give back (hex ids)."""
    slice_id: str = ""
    """The id of the slice granted now (hex; unique among the key's live slices)."""
    epoch_ms: int = 1000
    """token_bucket, gcra: slices expire at the end of the epoch after the one they start in."""
    reset: bool = False
    """Start the key over (see the module): ``settles`` names the resetter's own slices."""


class Taken(NamedTuple):
    """The store's answer to a ``take``."""

    granted: int
    """Units granted (0: none; a rejection when ``need`` was > 0)."""
    remaining: int
    """What the store has left after the take (not counting units held in slices)."""
    reset_ms: int
    """As the algorithm's step reports it (a window's end, a bucket full again)."""
    retry_ms: float
    """0 when ``need`` fits; else when it could fit at the earliest, INF if never."""
    expires_ms: int
    """When the granted slice expires (fixed_window: the window's end)."""
    held: int
    """Units of the key held in live slices, this one included (the reservation)."""
    returned: int
    """Units the settles gave back."""
    charged: int
    """Units of debt charged."""


def live(pairs: Pairs, now_ms: int) -> Pairs:
    """The slices still reserved at ``now_ms``."""
    return tuple(p for p in pairs if p[0] > now_ms)


def _held(pairs: Pairs) -> int:
    return sum(p[2] for p in pairs)


def _settle(pairs: Pairs, ask: Ask) -> tuple[Pairs, int]:
    """Forget the settled slices; the units granted and not spent (what goes back)."""
    if not ask.settles:
        return pairs, 0
    spent = dict(ask.settles)
    back = 0
    kept = []
    for p in pairs:
        if p[1] in spent:
            rest = p[2] - spent[p[1]]
            back += rest if rest > 0 else 0
        else:
            kept.append(p)
    return tuple(kept), back


def _add(pairs: Pairs, expires: int, slice_id: str, units: int) -> Pairs:
    if units <= 0:
        return pairs
    return tuple(sorted((*pairs, (expires, slice_id or "-", units))))


def _grant(ask: Ask, available: int) -> int:
    if ask.need <= 0 or ask.need > available or ask.share <= 0:
        return 0
    split = available // ask.share
    most = ask.need if split < ask.need else split
    return ask.want if ask.want < most else most


def take(
    name: str, state: Any, pairs: Pairs, limit: Limit, now_ms: int, ask: Ask
) -> tuple[Taken, Any, Pairs, bool]:
    """Settle, charge and grant (see the module); returns the answer, the new state and
    reservation, and whether they changed (nothing is written otherwise)."""
    if ask.reset:
        state, pairs = restart(name, pairs, limit, now_ms, ask)
        peek = ask._replace(need=0, want=0, share=0, debt=0, settles=(), reset=False)
        answer = take(name, state, pairs, limit, now_ms, peek)[0]
        return answer, state, pairs, True
    if name == "fixed_window":
        return _window(state, pairs, limit, now_ms, ask)
    if name == "token_bucket":
        return _bucket(state, pairs, limit, now_ms, ask)
    if name == "gcra":
        return _gcra(state, pairs, limit, now_ms, ask)
    raise ValueError(f"algorithm {name!r} cannot be sliced; expected one of {sorted(SLICED)}")


def restart(name: str, pairs: Pairs, limit: Limit, now_ms: int, ask: Ask) -> tuple[Any, Pairs]:
    """A reset's state and reservation (see the module): a fresh key's, less the units held
    in the live slices not settled by ``ask`` (None: no state)."""
    pairs, _ = _settle(live(pairs, now_ms), ask)
    held = _held(pairs)
    if not held:
        return None, ()
    if name == "fixed_window":  # the window of the slices still held (they end with it)
        return (held, max(p[0] for p in pairs)), pairs
    held = held if held < limit.capacity else limit.capacity
    if name == "token_bucket":  # what the bucket lacks: the units held
        return (held * limit.period_ms, now_ms), pairs
    return (now_ms * 1000 + held * limit.unit, limit.count), pairs  # gcra's (tat, count)


def expires_ms(name: str, state: Any, pairs: Pairs, limit: Limit) -> int:
    """When a key's state and reservation stop mattering: the algorithm's own expiry, or later
    while a reservation (or the refill it held back) still shapes the bucket."""
    if name == "fixed_window":
        return int(state[1])
    last = max(p[0] for p in pairs) if pairs else 0
    if name == "token_bucket":
        debt, updated = state
        full = limit.capacity * limit.period_ms
        bucket = updated - (-debt // limit.count)
        held_back = last - (-full // limit.count) if pairs else 0
        return bucket if bucket > held_back else held_back
    tat = -(-state[0] // 1000)
    held_back = last - (-(limit.capacity * limit.unit) // 1000) if pairs else 0
    return tat if tat > held_back else held_back


def _window(
    state: tuple[int, int] | None, pairs: Pairs, limit: Limit, now: int, ask: Ask
) -> tuple[Taken, Any, Pairs, bool]:
    period, most = limit.period_ms, limit.count
    pairs = live(pairs, now)
    if state is not None and state[1] > now:
        count, end = state
    elif pairs:  # the state is gone but slices of its window are held: they stay counted
        count, end = _held(pairs), max(p[0] for p in pairs)
    else:
        count, end = 0, (now - now % period if limit.flags & ALIGNED else now) + period
    pairs, back = _settle(pairs, ask)
    returned = back if back < count else count
    count -= returned
    available = most - count if count < most else 0
    charged = ask.debt if ask.debt < available else available
    count += charged
    granted = _grant(ask, available - charged)
    count += granted
    changed = bool(ask.settles or charged or granted)
    pairs = _add(pairs, end, ask.slice_id, granted)
    retry: float = 0
    if ask.need > available - charged:
        retry = end - now if ask.need <= most else INF
    left = most - count if count < most else 0
    answer = Taken(granted, left, end, retry, end, _held(pairs), returned, charged)
    return answer, (count, end), pairs, changed


def _bucket(
    state: tuple[int, int] | None, pairs: Pairs, limit: Limit, now: int, ask: Ask
) -> tuple[Taken, Any, Pairs, bool]:
    rate, period, burst = limit.count, limit.period_ms, limit.capacity
    full = burst * period
    scaled, updated = (full, now) if state is None else (full - state[0], state[1])
    if now > updated:  # refill phase by phase: each lapsed reservation lifts the cap
        held, t = _held(pairs), updated
        for e, _, u in pairs:
            if e >= now:
                break
            if e > t:
                scaled = min((burst - held) * period, scaled + (e - t) * rate)
                t = e
            held -= u
        scaled = min((burst - held) * period, scaled + (now - t) * rate)
        updated = now
    else:  # a clock behind the last writer refills nothing (as the algorithm's step)
        scaled = min(scaled, (burst - _held(live(pairs, now))) * period)
    pairs, back = _settle(live(pairs, now), ask)
    returned = 0
    if back:
        new = min((burst - _held(pairs)) * period, scaled + back * period)
        if new > scaled:
            returned = (new - scaled) // period
            scaled = new
    available = scaled // period if scaled > 0 else 0  # a lowered capacity: the debt drains
    charged = ask.debt if ask.debt < available else available
    scaled -= charged * period
    short = ask.need > available - charged
    granted = _grant(ask, available - charged)
    scaled -= granted * period
    epoch = ask.epoch_ms
    expires = (now // epoch + 2) * epoch
    pairs = _add(pairs, expires, ask.slice_id, granted)
    since = updated if updated > now else now
    reset = since - (-(full - scaled) // rate)
    retry: float = 0
    if short:
        retry = INF if ask.need > burst else since - now - (-(ask.need * period - scaled) // rate)
    left = scaled // period if scaled > 0 else 0
    answer = Taken(granted, left, reset, retry, expires, _held(pairs), returned, charged)
    return answer, (full - scaled, updated), pairs, bool(ask.settles or charged or granted)


def _gcra(
    state: tuple[int, int] | None, pairs: Pairs, limit: Limit, now: int, ask: Ask
) -> tuple[Taken, Any, Pairs, bool]:
    t, burst = limit.unit, limit.capacity
    tau = burst * t
    now_us = now * 1000
    if state is None:
        tat = now_us
    else:
        tat = state[0] if state[1] == limit.count else convert(state[0], state[1], limit, now_us)
        if tat < now_us:
            tat = now_us
    held = _held(pairs)
    for e, _, u in pairs:  # while units are reserved the arrival time stays >= time + held x T
        floor = (e if e < now else now) * 1000 + held * t
        if floor > tat:
            tat = floor
        if e > now:
            break
        held -= u
    pairs, back = _settle(live(pairs, now), ask)
    returned = 0
    if back:
        floor = now_us + _held(pairs) * t
        new = tat - back * t
        if new < floor:
            new = floor
        if new < tat:
            returned = (tat - new) // t
            tat = new
    ahead = now_us + tau - tat
    available = ahead // t if ahead > 0 else 0
    charged = ask.debt if ask.debt < available else available
    tat += charged * t
    short = ask.need > available - charged
    granted = _grant(ask, available - charged)
    tat += granted * t
    epoch = ask.epoch_ms
    expires = (now // epoch + 2) * epoch
    pairs = _add(pairs, expires, ask.slice_id, granted)
    retry: float = 0
    if short:
        retry = INF if ask.need > burst else -(-(tat + ask.need * t - tau - now_us) // 1000)
    ahead = now_us + tau - tat
    left = ahead // t if ahead > 0 else 0
    answer = Taken(granted, left, -(-tat // 1000), retry, expires, _held(pairs), returned, charged)
    return answer, (tat, limit.count), pairs, bool(ask.settles or charged or granted)
