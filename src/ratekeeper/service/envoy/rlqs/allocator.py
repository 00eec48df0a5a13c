"""Splitting a bucket's global rate between the Envoys that report it: the pure step of the
Rate Limit Quota Service, and its Lua twin ``allocate.lua`` (run on Redis, so that several
ratekeeper processes serving one fleet share one view).

Units: a rate is an integer of milli-requests per second (``mrps``: 1000 is one request a
second), so Python and Lua (whose numbers are doubles) compute the same integers. Times are
epoch milliseconds of the service's clock.

A bucket's state is one ``Record`` per stream (one Envoy's connection) that reported it:
its demand (requests it was offered a second, allowed or denied; -1 while unknown), the rate
it was assigned, when it last reported, until when its assignment is reserved, and whether
its stream has ended (an *orphan*). The step, run for a stream on each of its reports:

1. records whose reservation ended are dropped;
2. a reconnecting stream (``adopt``) may take over an orphan's or a stale record's
   reservation (a record not refreshed for ``STALE_MS``: its stream is gone): the share its
   Envoy held under its old stream, or another's that nobody enforces any more;
3. the *fresh* records (reported within ``STALE_MS``, not orphans) and the stream itself
   share the global rate max-min fairly: each needs its demand plus ``HEADROOM_PCT``
   (an unknown demand needs an equal share); if all needs fit, the rest is spread equally,
   else the water level is found and no one gets more than it;
4. the stream gets its target, but never more than what the others do not hold
   (``free``): **the sum of assigned rates never exceeds the global rate**, whatever order
   the streams report in; a stream over its target gives back at its next report, one
   under it grows into what others gave back. ``cap`` bounds it further (a reconnecting
   Envoy is held to the rate it was just allowed, so a restarted service resumes without
   a burst);
5. an assignment within ``BAND_PCT`` of the current one is kept: Envoy starts a new, full
   token bucket whenever an assignment changes, so needless changes would add bursts.

Timeline (global 60/s, ``HEADROOM_PCT`` 10): A reports demand 100/s alone -> 60. B joins
(demand unknown, needs 30): target 30, but A holds 60, free 0 -> B gets 0 (its process then
re-steps A: target 30, A -> 30; then B again: free 30 -> 30). A's demand falls to 10/s:
needs 11 and 30 fit in 60, the 19 left are spread: A 20.5, B 39.5 once each has reported.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

HEADROOM_PCT = 10
"""A stream's need is its demand plus this much, so that it can grow between reports."""
BAND_PCT = 5
"""An assignment that moves less than this (of the current one) is not changed."""
STALE_MS = 7_500
"""A record not refreshed for 1.5 report periods (Envoy reports every 5 s) is stale."""
MRPS = 1000
"""Milli-requests per second in one request per second."""


@dataclass(frozen=True, slots=True)
class Record:
    """One stream's part of a bucket."""

    demand: int
    """Requests offered per second, in mrps; -1 while unknown (a bucket's first report)."""
    assigned: int
    """The rate assigned, in mrps."""
    last_ms: int
    """When the stream last reported the bucket."""
    expires_ms: int
    """Until when its assignment is reserved (the assignment's TTL after ``last_ms``)."""
    orphan: bool = False
    """The stream has ended while its Envoy may still enforce the assignment."""


@dataclass(frozen=True, slots=True)
class Step:
    """One stream's report of a bucket, as the step takes it."""

    stream: str
    now_ms: int
    demand: int
    limit: int
    """The bucket's global rate, mrps."""
    hold_ms: int
    """How long the assignment is reserved: the assignment's TTL and a margin."""
    cap: int = -1
    """At most this rate (mrps); -1: no cap."""
    adopt: bool = False


@dataclass(frozen=True, slots=True)
class Grant:
    """The step's answer."""

    assigned: int
    target: int
    """The fair share; ``assigned`` is below it while others hold too much."""
    envoys: int
    """Fresh streams of the bucket, this one included."""
    held: int
    """What the other streams hold, mrps."""


def need(demand: int, fair: int) -> int:
    """What a stream needs: its demand and some headroom, or ``fair`` while unknown."""
    if demand < 0:
        return fair
    return demand + demand * HEADROOM_PCT // 100


def target(needs: list[int], mine: int, limit: int) -> int:
    """``mine``'s max-min fair share of ``limit`` among ``needs`` (which include it)."""
    count = len(needs)
    total = sum(needs)
    if total <= limit:
        return mine + (limit - total) // count
    remaining = limit
    for i, n in enumerate(sorted(needs)):
        share = remaining // (count - i)
        if n > share:
            return min(mine, share)
        remaining -= n
    return mine  # not reached: the needs exceed the limit


def step(records: dict[str, Record], s: Step) -> tuple[Grant, dict[str, Record]]:
    """The stream's assignment and the bucket's records after it (see the module docstring)."""
    now = s.now_ms
    live = {k: r for k, r in records.items() if r.expires_ms > now}
    mine = live.pop(s.stream, None)
    current = 0 if mine is None else mine.assigned
    if s.adopt:
        stale = now - STALE_MS
        taken = ""
        best = -1
        for k in sorted(live):
            r = live[k]
            if (r.orphan or r.last_ms <= stale) and r.assigned > best:
                taken, best = k, r.assigned
        if taken:
            current += live.pop(taken).assigned
    fresh = [r for r in live.values() if not r.orphan and r.last_ms > now - STALE_MS]
    fair = s.limit // (len(fresh) + 1)
    mine_need = need(s.demand, fair)
    goal = target([need(r.demand, fair) for r in fresh] + [mine_need], mine_need, s.limit)
    held = sum(r.assigned for r in live.values())
    free = max(0, s.limit - held)
    grant = min(goal, free)
    if s.cap >= 0:
        grant = min(grant, s.cap)
    if (
        0 < current <= free
        and (s.cap < 0 or current <= s.cap)
        and abs(grant - current) * 100 <= BAND_PCT * current
    ):
        grant = current
    live[s.stream] = Record(max(s.demand, -1), grant, now, now + s.hold_ms)
    return Grant(grant, goal, len(fresh) + 1, held), live


def drop(records: dict[str, Record], stream: str) -> dict[str, Record]:
    """The records without the stream's (its Envoy has gone: its share is free at once)."""
    return {k: r for k, r in records.items() if k != stream}


def orphan(records: dict[str, Record], stream: str) -> dict[str, Record]:
    """The records with the stream's marked orphan (the service is stopping: its Envoy
    keeps enforcing, and reconnects to take the reservation over)."""
    out = dict(records)
    if stream in out:
        out[stream] = replace(out[stream], orphan=True)
    return out
