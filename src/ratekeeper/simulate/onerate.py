"""One rate decided in the replay's own dict: ``MemoryStore.hit_one``'s steps, no store around.

``simulate --limit`` decides every line of a log with the store call ``Limiter.hit`` makes for
one rate on a memory store. The replay is one thread with one limit per store, so the store's
work around the algorithm's step buys it nothing: the lock, the ``(slot, key)`` tuple built and
hashed per line, the ``OrderedDict``'s least-recently-used order (a replay store is never
full), the per-line outcome handed back. ``OneRate`` keeps each key's ``(expires_ms, state)``
in a plain dict keyed by the key and runs the same pure ``step`` of the same ``Limit`` with
the same rules as ``hit_one``:

- the state is given to the step even when its ``expires_ms`` has passed (under the rate it
  was written for, it then decides like no state);
- an admitted step writes ``(outcome.reset_ms, new state)``; a rejected one writes the same
  when the limit counts rejected hits (``COUNT_REJECTED``), else nothing. (``hit_one`` also
  writes after a rejection when the state was written under another rate, a restated gcra
  state or a lowered limit's later expiry; a replay's rate never changes.)

So the decisions are the store's (``tests/simulate/test_fast_paths.py`` drives both with the
same random, partly unsorted logs for every algorithm and option ``--limit`` takes). Memory:
one entry per key seen, with the expired ones swept each time the dict doubles.
"""

from __future__ import annotations

from typing import Any

from ..algorithms import Algorithm, Limit
from ..algorithms.base import COUNT_REJECTED

SWEEP_FROM = 65536
"""Entries before the first sweep of expired ones."""


class OneRate:
    """One rate's states, hit a run of keys at a time (see the module docstring)."""

    __slots__ = ("_count_rejected", "_limit", "_step", "_sweep_at", "states")

    def __init__(self, algorithm: Algorithm, limit: Limit) -> None:
        self._step = algorithm.step
        self._limit = limit
        self._count_rejected = bool(limit.flags & COUNT_REJECTED)
        self._sweep_at = SWEEP_FROM
        self.states: dict[str, tuple[int, Any]] = {}
        """Key -> (expires_ms, the algorithm's state), as the memory store holds them."""

    def hit_runs(self, runs: list[tuple[float, int, list[str]]]) -> list[list[str]]:
        """For each run ``(time, now_ms, keys)``, in time order, one hit of cost 1 per key
        (in order; a key may come more than once) at ``now_ms``: the keys of the hits
        rejected, a list per run."""
        states = self.states
        get = states.get
        step = self._step
        limit = self._limit
        count_rejected = self._count_rejected
        out: list[list[str]] = []
        for _, now_ms, keys in runs:
            rejected: list[str] = []
            for key in keys:
                entry = get(key)
                state = None if entry is None else entry[1]  # a stale one too, as hit_one
                outcome, new = step(state, limit, now_ms, 1, True)
                if outcome[0]:
                    states[key] = (outcome[2], new)  # reset_ms: expires_ms(new), algorithms/base
                    continue
                rejected.append(key)
                if count_rejected:
                    states[key] = (outcome[2], new)
            out.append(rejected)
        if len(states) > self._sweep_at and runs:
            self._sweep(runs[-1][1])
        return out

    def _sweep(self, now_ms: int) -> None:
        """Drop the entries that no longer matter; sweep again when the dict has doubled."""
        states = self.states
        for key in [k for k, (expires, _) in states.items() if expires <= now_ms]:
            del states[key]
        self._sweep_at = max(SWEEP_FROM, 2 * len(states))
