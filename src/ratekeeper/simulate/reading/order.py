"""Log lines back in time order: a reorder buffer per file, then a k-way merge of the files.

A log is rarely in time order. Apache and nginx write a line when the response ends but stamp
it with the time the request arrived, so a slow request lands after quicker later ones; two
servers' logs given together interleave; rotation puts the newest file first in a shell glob.
A window algorithm decided on such a clock counts a request in the wrong window (or, for the
refilling ones, refills backwards), so lines are put back in order before anything decides:

- each file's lines go through a reorder buffer over ``window`` seconds: a line is released
  once the file has shown a line ``window`` seconds newer, so any line at most ``window``
  behind the newest before it is decided in its place;
- a line further behind than that arrives after its moment was decided: it is *late*, counted
  with a few samples in ``Skew``, and not decided (deciding it on the clock of its own time
  would rewind the limiter's; on the current clock would be a wrong time);
- the files' ordered streams are merged by time (``heapq.merge``), so the order the files are
  given in does not matter, nor whether one log was split across several.

Lines of one time are decided together as one run when they are keyed on one field (their
order within the run cannot change a per-key count); entries for the general path are ordered
by (time, their fields' text), so equal times are decided in an order that does not depend on
the order of the input either. ``Skew`` also counts the backward steps (lines earlier than the
line before them) and the largest lag behind the newest line before.

Memory: the lines of ``window`` seconds per file.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

from .logs import Entry, Run

DEFAULT_WINDOW = 180.0
"""Seconds a line may lag the newest line before it (three minutes: Apache's longest request
logs of the busiest sites stay far below; a few seconds covers NTP-kept clocks)."""
LATE_SAMPLES = 5


@dataclass(slots=True)
class Skew:
    """How far from time order one file was."""

    backward: int = 0
    """Lines earlier than the line before them."""
    largest: float = 0.0
    """The most seconds a line lagged the newest line before it."""
    late: int = 0
    """Lines further behind than the window: counted, not decided."""
    late_samples: list[tuple[float, float, str]] = field(default_factory=list)
    """(time, seconds behind the newest line before, its key) of a few late lines."""

    def stepped(self, t: float, newest: float) -> None:
        """A line earlier than the one before it, ``newest - t`` behind the newest."""
        self.backward += 1
        if newest - t > self.largest:
            self.largest = newest - t

    def missed(self, t: float, newest: float, lines: int, what: str) -> None:
        """``lines`` lines of time ``t`` came after their moment was decided."""
        self.late += lines
        if len(self.late_samples) < LATE_SAMPLES:
            self.late_samples.append((t, newest - t, what))

    def add(self, other: Skew) -> None:
        self.backward += other.backward
        self.largest = max(self.largest, other.largest)
        self.late += other.late
        room = LATE_SAMPLES - len(self.late_samples)
        self.late_samples.extend(other.late_samples[: max(room, 0)])


def ordered_runs(batches: Iterable[list[Run]], window: float, skew: Skew) -> Iterator[list[Run]]:
    """Runs (one time, a field per line) of one file, in time order (see the module
    docstring); runs of one time are joined."""
    pending: dict[float, list[str | None]] = {}
    times: list[float] = []  # a heap of the times pending
    newest = prev = done = float("-inf")
    push, pop = heapq.heappush, heapq.heappop
    for batch in batches:
        out = []
        for t, values in batch:
            if t < prev:
                skew.stepped(t, newest)
            prev = t
            if t < done:
                skew.missed(t, newest, len(values), _first(values))
                continue
            held = pending.get(t)
            if held is not None:
                held.extend(values)
                continue
            pending[t] = values
            push(times, t)
            if t > newest:
                newest = t
                edge = t - window
                while times and times[0] <= edge:
                    done = pop(times)
                    out.append((done, pending.pop(done)))
        if out:
            yield out
    if times:
        yield [(t, pending.pop(t)) for t in sorted(times)]


def _first(values: list[str | None]) -> str:
    return next((v for v in values if v), "-")


def order_key(entry: Entry) -> tuple[float, str]:
    """What orders entries: their time, then their fields' text (equal times are decided
    in an order that does not depend on the input's)."""
    return entry.time, "\x1f".join(entry.fields.values())


Keyed = tuple[float, str, int, Entry]
"""An entry with what orders it: (time, its fields' text, its place in its file, entry)."""


def ordered_entries(
    entries: Iterable[Entry], window: float, skew: Skew, show: str = "ip"
) -> Iterator[Keyed]:
    """Entries of one file in (time, fields) order (see the module docstring); a late
    line's sample shows its field ``show``."""
    heap: list[Keyed] = []
    newest = prev = done = float("-inf")
    push, pop = heapq.heappush, heapq.heappop
    for i, entry in enumerate(entries):
        t = entry.time
        if t < prev:
            skew.stepped(t, newest)
        prev = t
        if t < done:
            skew.missed(t, newest, 1, entry.fields.get(show) or "-")
            continue
        if t > newest:
            newest = t
        push(heap, (*order_key(entry), i, entry))
        edge = newest - window
        while heap[0][0] <= edge:
            item = pop(heap)
            done = item[0]
            yield item
            if not heap:
                break
    while heap:
        yield pop(heap)


def merged_runs(streams: list[Iterator[list[Run]]]) -> Iterator[list[Run]]:
    """Ordered run streams merged by time (one stream: as it is)."""
    if len(streams) == 1:
        return streams[0]
    runs = heapq.merge(*(_flat(s) for s in streams), key=itemgetter(0))
    return _batched(runs)


def merged_entries(streams: list[Iterator[Keyed]]) -> Iterator[Entry]:
    """Ordered entry streams merged by (time, fields), as entries."""
    merged: Iterator[Any] = (
        streams[0] if len(streams) == 1 else heapq.merge(*streams, key=itemgetter(0, 1, 2))
    )
    return (item[3] for item in merged)


def _flat(batches: Iterator[list[Run]]) -> Iterator[Run]:
    for batch in batches:
        yield from batch


def _batched(runs: Iterator[Run], size: int = 256) -> Iterator[list[Run]]:
    out: list[Run] = []
    for run in runs:
        out.append(run)
        if len(out) >= size:
            yield out
            out = []
    if out:
        yield out
