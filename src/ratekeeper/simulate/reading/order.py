"""Log lines back in time order: a reorder buffer per file and a k-way merge of the files,
or, when a line is further behind than that, every line sorted.

A log is rarely in time order. Apache and nginx write a line when the response ends but stamp
it with the time the request arrived, so a slow request lands after quicker later ones; two
servers' logs given together interleave; rotation puts the newest file first in a shell glob,
or in one stream (``zcat access.log.3.gz access.log.2.gz ...``). A window algorithm decided on
such a clock counts a request in the wrong window (or, for the refilling ones, refills
backwards), so lines are put back in order before anything decides:

- each file's lines go through a reorder buffer over ``window`` seconds: a line is released
  once the file has shown a line ``window`` seconds newer, so any line at most ``window``
  behind the newest before it is decided in its place;
- the files' ordered streams are merged by time (``heapq.merge``), so the order the files are
  given in does not matter, nor whether one log was split across several;
- a line further behind than that arrives after its moment was decided: it is *late*. Unless
  the file's ``Skew`` says to skip such lines (``skip``: counted with a few samples, not
  decided), ``Late`` is raised: the replay then reads the logs again and sorts every line
  (``sorted_runs``, ``sorted_entries``: an external merge sort, ``sort``), or refuses.

Lines of one time are decided together as one run when they are keyed on one field (their
order within the run cannot change a per-key count); entries for the general path are ordered
by (time, their fields' text), so equal times are decided in an order that does not depend on
the order of the input either. ``Skew`` also counts the backward steps (lines earlier than the
line before them), the largest lag behind the newest line before, and, when sorting, the
lines further behind than ``window`` (``beyond``).

Memory: the lines of ``window`` seconds per file, about ``HELD_RUN_LINES`` lines of runs
(``HELD_ENTRIES`` entries) in all the files' buffers at most, twice that in the worst case
(``Room``: past it, a file's oldest lines go early, and a line behind them comes late);
sorting, as many, the rest in runs in temporary files (``sort``).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

from .logs import Entry, Run
from .sort import ExternalSort

DEFAULT_WINDOW = 180.0
"""Seconds a line may lag the newest line before it (three minutes: Apache's longest request
logs of the busiest sites stay far below; a few seconds covers NTP-kept clocks)."""
LATE_SAMPLES = 5
HELD_RUN_LINES = 1_000_000
"""Lines of runs (a time and one field per line) held to put them in order, by the reorder
buffers of a replay in all or by a sort: about 70 MB when the field is an IP address
(measured with ``tracemalloc``)."""
HELD_ENTRIES = 100_000
"""Entries (a time and every field) held likewise: about 85 MB of combined log lines
(measured likewise; longer lines take more)."""
ENTRY_BATCH = 4096
"""Entries handed to the sort at a time."""


class Late(Exception):
    """A line came after its moment was decided (a file's ``Skew`` does not skip): not an
    error a user sees; the replay sorts the logs, or refuses with ``LogOrderError``."""

    def __init__(self, skew: Skew, t: float, behind: float, what: str) -> None:
        super().__init__(f"a line at {t} is {behind} s behind the newest line before it")
        self.skew = skew
        self.time = t
        self.behind = behind
        self.what = what


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
    name: str = ""
    """The file it describes (for messages)."""
    skip: bool = False
    """Late lines are counted and skipped (``--late skip``); else ``Late`` is raised."""
    full: bool = False
    """Its buffer was full once (lines went before their time: ``Room``)."""
    beyond: int = 0
    """Lines more than the window behind the newest line before them (counted when
    sorting)."""

    def stepped(self, t: float, newest: float) -> None:
        """A line earlier than the one before it, ``newest - t`` behind the newest."""
        self.backward += 1
        if newest - t > self.largest:
            self.largest = newest - t

    def missed(self, t: float, newest: float, lines: int, what: str) -> None:
        """``lines`` lines of time ``t`` came after their moment was decided."""
        if not self.skip:
            raise Late(self, t, newest - t, what)
        self.late += lines
        if len(self.late_samples) < LATE_SAMPLES:
            self.late_samples.append((t, newest - t, what))

    def add(self, other: Skew) -> None:
        self.backward += other.backward
        self.largest = max(self.largest, other.largest)
        self.late += other.late
        self.beyond += other.beyond
        room = LATE_SAMPLES - len(self.late_samples)
        self.late_samples.extend(other.late_samples[: max(room, 0)])


@dataclass(slots=True)
class Room:
    """What the reorder buffers of one replay hold in all, and the most they may: a file
    whose buffer would take more (a file in reverse order holds every line until a newer
    one comes) releases its oldest lines early, so a line behind them comes late. The lines
    of a file's newest time stay (more of that time may follow) unless they alone would
    take the buffers past twice the most."""

    limit: int
    held: int = 0


def ordered_runs(
    batches: Iterable[list[Run]], window: float, skew: Skew, room: Room | None = None
) -> Iterator[list[Run]]:
    """Runs (one time, a field per line) of one file, in time order (see the module
    docstring); runs of one time are joined; the buffer shares ``room`` with the other
    files' (default: ``HELD_RUN_LINES`` of its own)."""
    room = Room(HELD_RUN_LINES) if room is None else room
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
            if t <= done:  # its time was decided (as in ordered_entries)
                skew.missed(t, newest, len(values), _first(values))
                continue
            room.held += len(values)
            kept = pending.get(t)
            if kept is not None:
                kept.extend(values)
            else:
                pending[t] = values
                push(times, t)
                if t > newest:
                    newest = t
                    edge = t - window
                    while times and times[0] < edge:
                        done = pop(times)
                        run = pending.pop(done)
                        room.held -= len(run)
                        out.append((done, run))
            if room.held > room.limit:  # full: the oldest go early (see Room)
                skew.full = True
                while times and room.held > room.limit:
                    if times[0] >= newest and room.held <= 2 * room.limit:
                        break
                    done = pop(times)
                    run = pending.pop(done)
                    room.held -= len(run)
                    out.append((done, run))
        if out:
            yield out
    if times:
        rest = [(t, pending.pop(t)) for t in sorted(times)]
        room.held -= sum(len(run) for _, run in rest)
        yield rest


def _first(values: list[str | None]) -> str:
    return next((v for v in values if v), "-")


def order_key(entry: Entry) -> tuple[float, str]:
    """What orders entries: their time, then their fields' text (equal times are decided
    in an order that does not depend on the input's)."""
    return entry.time, "\x1f".join(entry.fields.values())


Keyed = tuple[float, str, int, Entry]
"""An entry with what orders it: (time, its fields' text, its place in its file, entry)."""


def ordered_entries(
    entries: Iterable[Entry],
    window: float,
    skew: Skew,
    show: str = "ip",
    room: Room | None = None,
) -> Iterator[Keyed]:
    """Entries of one file in (time, fields) order (see the module docstring); a late
    line's sample shows its field ``show``; the buffer shares ``room`` (default:
    ``HELD_ENTRIES`` of its own)."""
    room = Room(HELD_ENTRIES) if room is None else room
    heap: list[Keyed] = []
    newest = prev = done = float("-inf")
    push, pop = heapq.heappush, heapq.heappop
    for i, entry in enumerate(entries):
        t = entry.time
        if t < prev:
            skew.stepped(t, newest)
        prev = t
        if t <= done:  # its time was decided: in (time, fields) order it came too late
            skew.missed(t, newest, 1, entry.fields.get(show) or "-")
            continue
        push(heap, (*order_key(entry), i, entry))
        room.held += 1
        if t > newest:  # as in ordered_runs: what is due goes when a newer line comes
            newest = t
            edge = t - window
            while heap[0][0] < edge:  # strictly: with no window, a time waits
                item = pop(heap)
                room.held -= 1
                done = item[0]
                yield item
        if room.held > room.limit:  # full: the oldest go early (see Room)
            skew.full = True
            while heap and room.held > room.limit:
                if heap[0][0] >= newest and room.held <= 2 * room.limit:
                    break
                item = pop(heap)
                room.held -= 1
                done = item[0]
                yield item
    while heap:
        room.held -= 1
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


def sorted_runs(
    streams: Iterable[tuple[Iterable[list[Run]], Skew]],
    window: float,
    sorter: ExternalSort[Run],
    tick: Callable[[], None],
) -> Iterator[list[Run]]:
    """Runs of every file, all sorted by time (``sorter``: an ``ExternalSort`` by time with
    the lines of each run counted); ``Skew`` counts as ``ordered_runs`` does, and the lines
    further behind than ``window`` in ``beyond``. Each file is read whole before any run is
    given."""
    for batches, skew in streams:
        newest = prev = float("-inf")
        for batch in batches:
            lines = 0
            for t, values in batch:
                lines += len(values)
                if t > newest:
                    newest = t
                else:
                    if t < prev:
                        skew.stepped(t, newest)
                    if newest - t > window:
                        skew.beyond += len(values)
                prev = t
            sorter.extend(batch, lines)
            tick()
    return _batched(sorter.items())


def run_lines(run: Run) -> int:
    """Lines of a run (how ``sorted_runs``'s sort counts)."""
    return len(run[1])


SortedEntry = tuple[float, str, dict[str, str]]
"""An entry as the sort holds it: (time, its fields' text, its fields)."""


def sorted_entries(
    streams: Iterable[tuple[Iterable[Entry], Skew]],
    window: float,
    sorter: ExternalSort[SortedEntry],
    tick: Callable[[], None],
) -> Iterator[Entry]:
    """Entries of every file, all sorted by (time, fields) (``sorter``: an
    ``ExternalSort`` by the first two items); ``Skew`` as in ``sorted_runs``."""
    for entries, skew in streams:
        newest = prev = float("-inf")
        chunk: list[SortedEntry] = []
        for entry in entries:
            t, fields = entry
            if t > newest:
                newest = t
            else:
                if t < prev:
                    skew.stepped(t, newest)
                if newest - t > window:
                    skew.beyond += 1
            prev = t
            kept = fields if type(fields) is dict else dict(fields)  # what marshal writes
            chunk.append((t, "\x1f".join(fields.values()), kept))
            if len(chunk) >= ENTRY_BATCH:
                sorter.extend(chunk, len(chunk))
                chunk = []
                tick()
        sorter.extend(chunk, len(chunk))
    return (Entry(t, fields) for t, _, fields in sorter.items())
