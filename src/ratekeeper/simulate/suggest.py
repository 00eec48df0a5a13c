"""Per-key need and the suggested limit: exact, by a parallel search over spooled events.

A key's *need* under an algorithm and period is the smallest count ``N`` for which replaying
that key's requests through the algorithm's own step, at rate ``N/period``, rejects nothing:
its peak usage per window, as that algorithm counts windows. Being never rejected only gets
easier as ``N`` grows, so each key's need is found by narrowing an interval (the largest
count known to reject, the smallest known not to), all keys at once: every pass reads the
spooled events (key id, time, cost) once and steps each unresolved key at one count of its
interval. The first pass tries the key's total cost (almost always enough) and notes the
least remaining it was answered; the total less that is the key's peak usage at that count,
which for the window algorithms is the need itself, so the next pass tries it and the one
after tries one less: most keys are settled in three passes. When the guess falls short (a
token bucket at its total refills far faster), the count doubles until it is enough, then
the interval is halved. Once the keys still searching hold at most half the events read,
the passes go on over a copy of theirs alone. Memory: a few numbers per distinct key; the
events wait in a temporary file.

The suggested limit for a share ``s`` of ``K`` keys is the smallest ``N`` that limits at most
``floor(s * K)`` keys: the ``(K - floor(s * K))``-th smallest need. token_bucket and gcra are
searched with their burst equal to the count (their default), sliding_window with its buckets.
"""

from __future__ import annotations

import math
import tempfile
from array import array
from collections import Counter
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from itertools import chain, compress
from typing import IO, Any, cast

from ..algorithms import ALGORITHMS, Limit
from ..errors import RateSpecError
from ..rates import Rate

CHUNK = 3 * 65536


@dataclass(frozen=True, slots=True)
class Suggestion:
    """The smallest count limiting at most ``allowed_keys`` keys, and how many it limits."""

    algorithm: str
    count: int | None
    """None: no count the algorithm accepts keeps enough keys unlimited."""
    rate: str | None
    limited_keys: int
    allowed_keys: int


class Demand:
    """The requests one rate of one limit saw: key, time and cost, for the needs."""

    def __init__(self, period_ms: int) -> None:
        self.period_ms = period_ms
        self.ids: dict[str, int] = {}
        self.counts: list[int] = []
        """Requests per key id."""
        self._extra: list[int] = []
        """Cost per key id beyond one per request."""
        self._buffer = array("q")
        self._spool = tempfile.TemporaryFile()  # noqa: SIM115  # closed in close()

    @property
    def totals(self) -> list[int]:
        """The total cost per key id."""
        return [n + extra for n, extra in zip(self.counts, self._extra, strict=True)]

    def _new(self, key: str) -> int:
        kid = self.ids[key] = len(self.counts)
        self.counts.append(0)
        self._extra.append(0)
        return kid

    def add(self, key: str, now_ms: int, cost: int, refunded: bool = False) -> None:
        """One request of ``key``; ``refunded``: its charge is given back once answered (it
        must still fit when it arrives). Stored as a negative cost."""
        kid = self.ids.get(key)
        if kid is None:
            kid = self._new(key)
        self.counts[kid] += 1
        self._extra[kid] += cost - 1
        buf = self._buffer
        buf.extend((kid, now_ms, -cost if refunded else cost))
        if len(buf) >= CHUNK:
            self._spool.write(buf.tobytes())
            del buf[:]

    def add_run(self, keys: list[str], now_ms: int) -> None:
        """``add`` for one request of cost 1 per key, all at ``now_ms`` (the events are
        built a run at a time, in array operations)."""
        get = self.ids.get
        found = [get(k) for k in keys]
        if None in found:  # keys seen for the first time
            for i, kid in enumerate(found):
                if kid is None:
                    kid = get(keys[i])  # the run may hold a new key twice
                    found[i] = self._new(keys[i]) if kid is None else kid
        kids = cast(list[int], found)
        counts = self.counts
        for kid in kids:
            counts[kid] += 1
        n = len(kids)
        events = array("q", bytes(24 * n))  # (key id, time, cost) per request
        events[0::3] = array("q", kids)
        events[1::3] = array("q", (now_ms,)) * n
        events[2::3] = array("q", (1,)) * n
        buf = self._buffer
        buf += events
        if len(buf) >= CHUNK:
            self._spool.write(buf.tobytes())
            del buf[:]

    def needs(self, algorithm: str, buckets: int | None = None) -> list[float]:
        """Each key's need (``math.inf`` past the largest count the algorithm takes)."""
        module: Any = ALGORITHMS[algorithm]
        options = {"buckets": buckets} if buckets and "buckets" in module.OPTIONS else {}
        limits: dict[int, Limit | None] = {}

        def limit_of(n: int) -> Limit | None:
            if n not in limits:
                try:
                    limits[n] = module.make_limit(Rate(n, self.period_ms / 1000), options)
                except RateSpecError:
                    limits[n] = None
                except ValueError:  # e.g. sliding_log past its largest count
                    limits[n] = None
            return limits[n]

        totals = self.totals
        size = len(totals)
        lo = [0] * size  # the largest count known to reject (0: none yet)
        hi = totals  # the smallest count known not to, once checked
        plan = [_TOTAL] * size  # which count each key tries next
        guess = [0] * size
        step, refund = module.step, module.refund
        ceiling = _ceiling(module)
        self._flush()
        source: IO[bytes] = self._spool  # the events; later only those of unsettled keys
        held = sum(self.counts)
        try:
            while True:
                trial = [_trial(plan[k], lo[k], hi[k], guess[k]) for k in range(size)]
                if all(t < 0 for t in trial):
                    break
                lims = [None if t < 0 else limit_of(t) for t in trial]
                ok = [t >= 0 and lims[k] is not None for k, t in enumerate(trial)]
                active = sum(n for n, t in zip(self.counts, trial, strict=True) if t >= 0)
                if active * 2 <= held:  # most events are of settled keys: leave them behind
                    source = _compact(source, [t >= 0 for t in trial], self._spool)
                    held = active
                least = [ceiling] * size  # the least remaining a key was answered
                states: list[Any] = [None] * size
                for chunk in _chunks(source):
                    events = iter(chunk)
                    for k, now, cost in zip(events, events, events, strict=True):
                        if ok[k]:
                            if cost < 0:  # charged, then given back once answered
                                outcome, new = step(states[k], lims[k], now, -cost, True)
                                if outcome[0]:
                                    new = refund(new, lims[k], now, -cost)
                            else:
                                outcome, new = step(states[k], lims[k], now, cost, True)
                            if outcome[0]:
                                states[k] = new
                                if outcome[1] < least[k]:
                                    least[k] = outcome[1]
                            else:
                                ok[k] = False
                for k, t in enumerate(trial):
                    if t < 0:
                        continue
                    if ok[k]:
                        hi[k] = t
                    elif plan[k] == _TOTAL:  # the total was not enough: search above it
                        lo[k], hi[k] = t, ceiling
                    else:
                        lo[k] = t
                    plan[k], guess[k] = _next(plan[k], ok[k], t, least[k])
        finally:
            if source is not self._spool:
                source.close()
        return [math.inf if h >= ceiling else float(h) for h in hi]

    def rejected_at(
        self,
        algorithm: str,
        count: int,
        kids: Collection[int],
        buckets: int | None = None,
        most: int | None = None,
    ) -> dict[int, int]:
        """Requests of each key of ``kids`` that ``count`` per period rejects (one pass
        over the events; a key's decisions depend on its own requests only). With
        ``most``, the pass stops once more than ``most`` are rejected in all (the counts
        are then partial: only their sum passing ``most`` is known)."""
        module: Any = ALGORITHMS[algorithm]
        options = {"buckets": buckets} if buckets and "buckets" in module.OPTIONS else {}
        try:
            limit = module.make_limit(Rate(count, self.period_ms / 1000), options)
        except ValueError:  # past the algorithm's largest count: nothing fits a stricter one
            return {}
        step, refund = module.step, module.refund
        wanted = set(kids)
        states: dict[int, Any] = {}
        out = dict.fromkeys(wanted, 0)
        left = math.inf if most is None else most
        self._flush()
        for chunk in _chunks(self._spool):
            events = iter(chunk)
            for k, now, cost in zip(events, events, events, strict=True):
                if k in wanted:
                    outcome, new = step(states.get(k), limit, now, abs(cost), True)
                    if outcome[0]:
                        states[k] = refund(new, limit, now, -cost) if cost < 0 else new
                    else:
                        out[k] += 1
                        left -= 1
            if left < 0:
                break
        return out

    def timelines(self, kids: Collection[int], bucket_ms: int) -> dict[int, Counter[int]]:
        """Requests of each key of ``kids`` per ``bucket_ms`` (bucket = time // bucket_ms)."""
        wanted = set(kids)
        out: dict[int, Counter[int]] = {k: Counter() for k in wanted}
        self._flush()
        for chunk in _chunks(self._spool):
            events = iter(chunk)
            for k, now, _ in zip(events, events, events, strict=True):
                if k in wanted:
                    out[k][now // bucket_ms] += 1
        return out

    def _flush(self) -> None:
        if self._buffer:
            self._spool.write(self._buffer.tobytes())
            del self._buffer[:]

    def close(self) -> None:
        self._spool.close()


def _chunks(spool: IO[bytes]) -> Iterator[array[int]]:
    """The events of ``spool`` from its start, a chunk at a time (whole events)."""
    spool.flush()
    spool.seek(0)
    while True:
        raw = spool.read(CHUNK * 8)
        if not raw:
            return
        chunk = array("q")
        chunk.frombytes(raw)
        yield chunk


def _compact(source: IO[bytes], keep: list[bool], original: IO[bytes]) -> IO[bytes]:
    """A new spool of the events of ``source`` whose key is kept (``source`` is closed unless
    it is the ``original``)."""
    out = tempfile.TemporaryFile()  # noqa: SIM115  # closed by needs()
    try:
        for chunk in _chunks(source):
            kept = [keep[k] for k in chunk[0::3]]
            if all(kept):
                out.write(chunk.tobytes())
                continue
            events = iter(chunk)
            chosen = compress(zip(events, events, events, strict=True), kept)
            out.write(array("q", chain.from_iterable(chosen)).tobytes())
    except BaseException:
        out.close()
        raise
    finally:
        if source is not original:
            source.close()
    return out


_TOTAL, _GUESS, _BELOW, _UP, _HALVE = range(5)
"""What a key tries next: its total, a guess, one below the least count known to do,
twice the largest count known not to, or the middle of the two (binary search)."""


def _trial(plan: int, lo: int, hi: int, guess: int) -> int:
    """The count a key tries in the next pass (-1: its need is known)."""
    if plan == _TOTAL:
        return hi
    if hi - lo <= 1:
        return -1
    if plan == _GUESS and lo < guess < hi:
        return guess
    if plan == _BELOW:
        return hi - 1
    if plan == _UP and 2 * lo < hi:
        return 2 * lo
    return (hi + lo) // 2


def _next(plan: int, ok: bool, count: int, least: int) -> tuple[int, int]:
    """What a key tries after ``count`` was tried (``ok``: it rejected nothing, and the least
    remaining it was answered is ``least``). Every answer narrows the key's interval; these
    are only the order the counts are tried in, chosen to need few passes: a window
    algorithm's peak usage at the total is usually the need itself, so the guess and one
    below it settle most keys in three passes."""
    if plan == _TOTAL:
        if not ok:
            return _HALVE, 0
        guess = count - least
        return (_GUESS, guess) if 0 < guess < count else (_BELOW, 0)
    if plan == _GUESS:
        return (_BELOW, 0) if ok else (_UP, 0)
    if plan == _UP and not ok:
        return _UP, 0
    return _HALVE, 0


def _ceiling(module: Any) -> int:
    """One past the largest count the search tries."""
    return int(getattr(module, "MAX_COUNT", 10**9)) + 1


def largest_count(algorithm: str) -> int:
    """The largest count the search tries for ``algorithm``."""
    return _ceiling(ALGORITHMS[algorithm]) - 1


def quantiles(needs: list[float]) -> dict[str, float]:
    """p50, p90, p99 and max of the needs (nearest rank); empty when there are none."""
    if not needs:
        return {}
    ordered = sorted(needs)
    n = len(ordered)

    def rank(q: float) -> float:
        return ordered[max(0, math.ceil(q * n) - 1)]

    return {"p50": rank(0.5), "p90": rank(0.9), "p99": rank(0.99), "max": ordered[-1]}


def suggest(needs: list[float], share: float, algorithm: str, period: float) -> Suggestion:
    """The smallest count that limits at most ``floor(share * keys)`` keys."""
    allowed = math.floor(share * len(needs) + 1e-9)
    ordered = sorted(needs)
    index = len(ordered) - allowed - 1
    value = ordered[index] if index >= 0 else 1.0
    if math.isinf(value):
        return Suggestion(algorithm, None, None, sum(1 for x in needs if math.isinf(x)), allowed)
    count = max(1, int(value))
    limited = sum(1 for x in needs if x > count)
    return Suggestion(algorithm, count, Rate(count, period).code, limited, allowed)
