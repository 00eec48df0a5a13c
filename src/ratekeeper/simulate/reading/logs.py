"""One log stream -> ``Entry`` (time, fields), or runs of one time and one field.

The format is told from a sample of the first lines (``formats.detect``) unless given; the
combined family is parsed a block of lines per ``findall`` (``combined``), the others a line
at a time (``formats``, ``jsonlog``). Blocks come from ``lines.Blocks``: gzip, stdin, bounded
line length. A line that does not parse is counted and a few are kept as samples
(``LogStats``); it is never fatal. Field names are normalised so that key functions read the
same names from every format: ``ip``, ``user``, ``method``, ``path``, ``status`` and, where
the format has them, ``protocol``, ``bytes``, ``referer``, ``user_agent``. ``aliases`` maps a
normalised name to the field that holds it (``{"ip": "request.remote_ip"}``).

Counts add up: every line read is a request (``parsed``), a bad line (``unparsable``), or
``other`` — blank lines, W3C directives, a CSV header.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import IO, NamedTuple

from ...errors import ConfigError
from .combined import NAMES, block_pattern
from .formats import COMBINED_FAMILY, FORMATS, SAMPLE, Detected, LineFormat, detect
from .formats import line_format as make_line_format
from .jsonlog import Bad
from .lines import MAX_LINE, OVERLONG, Blocks
from .times import TimeParser

SAMPLES = 5
RUN_LINES = 4096
"""Lines per list of ``LogReader.runs`` when the runs come from entries."""


@dataclass(slots=True)
class LogStats:
    """Lines read, parsed, and a few unparsable ones (``(line number, text, why)``)."""

    lines: int = 0
    parsed: int = 0
    unparsable: int = 0
    samples: list[tuple[int, str, str]] = field(default_factory=list)
    bytes_read: int = 0

    def bad(self, number: int, text: str, why: str) -> None:
        self.unparsable += 1
        if len(self.samples) < SAMPLES:
            self.samples.append((number, text[:200], why))

    @property
    def other(self) -> int:
        """Lines that are neither requests nor bad: blank, directives, headers."""
        return self.lines - self.parsed - self.unparsable


class Entry(NamedTuple):
    """One request of the log: epoch seconds and its fields (all strings)."""

    time: float
    fields: Mapping[str, str]


Run = tuple[float, list[str | None]]
"""Consecutive log lines of one time: the time, and one field of each line."""


class LogReader:
    """Parse one log stream into ``Entry``s (see the module docstring)."""

    def __init__(
        self,
        fmt: str = "auto",
        time_field: str | None = None,
        aliases: Mapping[str, str] | None = None,
        max_line: int = MAX_LINE,
    ) -> None:
        if fmt not in FORMATS:
            raise ConfigError(f"format {fmt!r} is unknown; expected one of {', '.join(FORMATS)}")
        self.fmt = fmt
        self.time_field = time_field
        self.aliases = dict(aliases or {})
        self.max_line = max_line
        self.stats = LogStats()
        self.time = TimeParser()
        self.detected: Detected | None = None
        """The format read, and how much of the sample it read (None: nothing to read)."""
        self.field_names: list[str] = []
        """The fields of the first request read (what keys and ``--field`` may name)."""
        self._blocks: Blocks | None = None
        self._split: tuple[str, list[str]] = ("", [])
        """The lines of the last block a bad time was found in."""

    def read(self, stream: IO[bytes]) -> Iterator[Entry]:
        """Entries of ``stream`` in file order; bad lines go to ``stats``."""
        opened = self._open(stream)
        if opened is None:
            return iter(())
        fmt, blocks = opened
        if fmt in COMBINED_FAMILY:
            self.field_names = [n for n in NAMES if n != "time"]
            return self._combined(blocks)
        return self._lines(make_line_format(fmt, self.time_field), blocks)

    def runs(self, stream: IO[bytes], name: str) -> Iterator[list[Run]]:
        """What ``read`` gives, grouped: lists of runs of consecutive entries with one time,
        each as ``(time, [entry.fields.get(name) for each entry])``. A replay keyed on one
        field reads this: a combined log is then parsed for that field and the time only.
        A run may be split between lists; a list holds a bounded number of lines."""
        opened = self._open(stream)
        if opened is None:
            return iter(())
        fmt, blocks = opened
        if fmt in COMBINED_FAMILY:
            self.field_names = [n for n in NAMES if n != "time"]
            if name in NAMES and name != "time":
                return self._combined_runs(blocks, name)
            return _grouped(self._combined(blocks), name)
        return _grouped(self._lines(make_line_format(fmt, self.time_field), blocks), name)

    def _open(self, stream: IO[bytes]) -> tuple[str, Blocks] | None:
        """The format and the blocks (the sample given back); None: no line to read."""
        blocks = self._blocks = Blocks(stream, self.max_line)
        sample = blocks.sample(SAMPLE)
        if sample is None:
            return None
        if self.fmt != "auto":
            self.detected = Detected(self.fmt, -1, len(sample))
            return self.fmt, blocks
        self.detected = detect(sample, self.time_field)
        name = self.detected.name
        return ("combined" if name == "none" else name), blocks

    def _combined(self, blocks: Blocks) -> Iterator[Entry]:
        """The hot loop of most general replays: one ``findall`` per block of lines."""
        stats = self.stats
        rows = block_pattern(NAMES).findall
        time_of = self._time_of
        n = begun = stats.lines
        skipped = 0
        seen = None  # the time text of the line before
        t = 0.0
        try:
            for block in blocks:
                start = n
                for (
                    ip,
                    user,
                    when,
                    method,
                    path,
                    protocol,
                    status,
                    size,
                    referer,
                    agent,
                    bad,
                ) in rows(block):
                    n += 1
                    if when != seen:
                        value = time_of(when, bad, n, block, n - start)
                        if value is None:
                            skipped += 1
                            continue
                        t, seen = value, when
                    fields = {  # NAMES but the time (a display: far cheaper than dict(zip()))
                        "ip": ip,
                        "user": user,
                        "method": method,
                        "path": path,
                        "protocol": protocol,
                        "status": status,
                        "bytes": size,
                        "referer": referer,
                        "user_agent": agent,
                    }
                    if user == "-":
                        del fields["user"]
                    yield Entry(t, fields)
                stats.lines = n  # the progress bar reads it
                stats.bytes_read = blocks.chars
        finally:
            stats.lines = n
            stats.bytes_read = blocks.chars
            stats.parsed += n - begun - skipped

    def _combined_runs(self, blocks: Blocks, name: str) -> Iterator[list[Run]]:
        """``runs`` of a combined log: ``_combined``'s loop with only ``name`` and the time
        taken from each line, and no ``Entry`` made."""
        stats = self.stats
        rows = block_pattern((name,)).findall
        grouped = [n for n in NAMES if n in (name, "time")]
        at, of = grouped.index("time"), grouped.index(name)
        time_of = self._time_of
        n = begun = stats.lines
        skipped = 0
        values: list[str | None] = []
        try:
            for block in blocks:
                start = n
                seen = None  # the time text of the run (each block starts its own runs)
                out: list[Run] = []
                for row in rows(block):
                    n += 1
                    when = row[at]
                    if when != seen:
                        t = time_of(when, row[-1], n, block, n - start)
                        if t is None:
                            skipped += 1
                            continue
                        seen = when
                        values = []
                        out.append((t, values))
                    values.append(row[of])
                if name == "user":  # "-" is no user: _combined leaves the field out
                    for _, users in out:
                        users[:] = [None if u == "-" else u for u in users]
                stats.lines = n  # the progress bar reads it
                stats.bytes_read = blocks.chars
                yield out
        finally:
            stats.lines = n
            stats.bytes_read = blocks.chars
            stats.parsed += n - begun - skipped

    def _time_of(self, when: str, bad: str, n: int, block: str, i: int) -> float | None:
        """The time of line ``n`` (the ``i``-th of ``block``), or None when it is not in the
        format (then ``bad`` is its text) or its time is not a time (both counted bad)."""
        if not when:
            if bad.strip():  # a blank line is not a bad one
                self._bad_line(n, bad, "not in combined log format")
            return None
        try:
            return self.time(when)
        except ValueError:
            if self._split[0] is not block:  # once per block with a bad time in it
                self._split = (block, block.split("\n"))
            line = self._split[1][i - 1]
            self.stats.bad(n, line, f"time {when!r} is not [dd/Mon/yyyy:HH:MM:SS +zone]")
            return None

    def _bad_line(self, n: int, line: str, why: str) -> None:
        """Count line ``n`` bad: an overlong line's stand-in says its own why."""
        if line.startswith(OVERLONG) and self._blocks is not None:
            found = self._blocks.overlong_reason(line)
            if found is not None:
                line, why = found
        self.stats.bad(n, line.rstrip("\r"), why)

    def _lines(self, fmt: LineFormat, blocks: Iterable[str]) -> Iterator[Entry]:
        """Entries of a format read a line at a time."""
        stats = self.stats
        aliases = self.aliases.items()
        time_field = self.time_field
        parse = fmt.parse
        n = stats.lines
        try:
            for block in blocks:
                lines = block.split("\n")
                lines.pop()  # the block ends with a newline
                for line in lines:
                    n += 1
                    if not line or line.isspace():
                        continue
                    try:
                        if line[0] == "\x00":
                            raise Bad("not a request")
                        got = parse(line)
                    except Bad as exc:
                        self._bad_line(n, line, str(exc))
                        continue
                    if got is None:
                        continue
                    fields, when = got
                    for name, source in aliases:
                        if source in fields:
                            fields[name] = fields[source]
                    if time_field is not None:  # W3C and ALB logs too
                        when = fields.get(time_field)
                    if when is None:
                        tried = time_field or "the format's time fields"
                        self._bad_line(n, line, f"no time field ({tried}; use --time-field)")
                        continue
                    try:
                        t = self.time(when)
                    except ValueError:
                        self._bad_line(n, line, f"time {when[:40]!r} is not a time")
                        continue
                    stats.parsed += 1
                    if not self.field_names:
                        self.field_names = list(fields)
                    yield Entry(t, fields)
                stats.lines = n
                if isinstance(blocks, Blocks):
                    stats.bytes_read = blocks.chars
        finally:
            stats.lines = n


def _grouped(entries: Iterator[Entry], name: str) -> Iterator[list[Run]]:
    """``runs`` from entries: lists of at most ``RUN_LINES`` lines."""
    out: list[Run] = []
    t: float | None = None
    values: list[str | None] = []
    lines = 0
    for e in entries:
        if e.time != t or lines >= RUN_LINES:
            if lines >= RUN_LINES:
                yield out
                out, lines = [], 0
            t = e.time
            values = []
            out.append((t, values))
        values.append(e.fields.get(name))
        lines += 1
    if out:
        yield out
