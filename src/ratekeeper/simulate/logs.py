"""Traffic logs -> ``Entry`` (time, fields): nginx/Apache combined, JSON lines, CSV.

Files may be gzip-compressed (detected by their magic bytes, whatever the name) and ``-`` is
standard input. A line that does not parse is counted and a few are kept as samples
(``LogStats``); it is never fatal. Field names are normalised so that key functions read the
same names from every format: ``ip``, ``user``, ``method``, ``path``, ``status`` and, for the
combined format, ``protocol``, ``bytes``, ``referer``, ``user_agent``. JSON and CSV fields keep
their own names too; ``aliases`` maps a normalised name to the field that holds it
(``{"ip": "client_addr"}``), and common spellings (``remote_addr``, ``uri``, ...) are known.

Times: the combined format's ``[10/Oct/2000:13:55:36 -0700]``, ISO 8601 (``2024-05-01T12:00:00Z``)
or epoch seconds (or milliseconds, when above 1e11). Conversions are cached per minute, so a
log costs one ``strptime`` per distinct minute, not per line.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import IO, Any, NamedTuple

from ..errors import ConfigError
from .combined import LINE, NAMES, block_pattern, blocks

FORMATS = ("auto", "combined", "jsonl", "csv")
TIME_FIELDS = ("time", "timestamp", "ts", "@timestamp", "time_local", "date")
KNOWN_ALIASES: dict[str, tuple[str, ...]] = {
    "ip": ("ip", "remote_addr", "client_ip", "client", "remote_ip", "clientip", "peer"),
    "user": ("user", "remote_user", "username", "user_id"),
    "method": ("method", "request_method", "verb"),
    "path": ("path", "uri", "request_uri", "url", "request_path"),
    "status": ("status", "status_code", "response_code"),
}
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


class Entry(NamedTuple):
    """One request of the log: epoch seconds and its fields (all strings)."""

    time: float
    fields: Mapping[str, str]


Run = tuple[float, list[str | None]]
"""Consecutive log lines of one time: the time, and one field of each line."""


def open_log(path: str) -> IO[bytes]:
    """A binary stream of the log at ``path`` (``-``: stdin), un-gzipped if it is gzip."""
    raw: IO[bytes]
    if path == "-":
        raw = sys.stdin.buffer
    else:
        try:
            raw = open(path, "rb")  # noqa: SIM115  # closed by the reader
        except OSError as exc:
            raise ConfigError(f"cannot read log {path!r}: {exc.strerror or exc}") from None
    head = raw.peek(2)[:2] if isinstance(raw, io.BufferedReader) else b""
    if head == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=raw)  # type: ignore[return-value]  # a binary stream
    return raw


class TimeParser:
    """Log timestamps -> epoch seconds, cached per minute."""

    def __init__(self) -> None:
        self._minutes: dict[str, float] = {}
        self._seen: dict[str, float] = {}

    def __call__(self, text: str) -> float:
        """Epoch seconds of ``text`` (cached: busy logs repeat the same second)."""
        seen = self._seen.get(text)
        if seen is not None:
            return seen
        if len(self._seen) > 4096:
            self._seen.clear()
        value = self._seen[text] = self._parse(text)
        return value

    def _parse(self, text: str) -> float:
        if not text:
            raise ValueError("no time")
        if text.replace(".", "", 1).isdigit():  # epoch seconds or ms
            value = float(text)
            return value / 1000 if value > 1e11 else value
        if len(text) >= 20 and text[2] == "/" and text[11] == ":":  # 10/Oct/2000:13:55:36 -0700
            head = text[:17] + text[20:]
            base = self._minutes.get(head)
            if base is None:
                when = datetime.strptime(text[:17] + ":00" + text[20:], "%d/%b/%Y:%H:%M:%S %z")
                base = self._minutes[head] = when.timestamp()
            return base + float(text[18:20])
        return self._iso(text)

    def _iso(self, text: str) -> float:
        # ISO 8601: cache the minute (the first 16 characters) with the zone after the seconds
        rest = text[16:]
        seconds_end = 3
        while seconds_end < len(rest) and (rest[seconds_end].isdigit() or rest[seconds_end] == "."):
            seconds_end += 1
        zone = rest[seconds_end:]
        head = text[:16] + zone
        base = self._minutes.get(head)
        if base is None:
            when = datetime.fromisoformat(
                text[:16] + ":00" + (zone or "+00:00").replace("Z", "+00:00")
            )
            base = self._minutes[head] = when.timestamp()
        return base + (float(rest[1:seconds_end]) if seconds_end > 1 else 0.0)


class LogReader:
    """Parse one log stream into ``Entry``s (see the module docstring)."""

    def __init__(
        self,
        fmt: str = "auto",
        time_field: str | None = None,
        aliases: Mapping[str, str] | None = None,
    ) -> None:
        if fmt not in FORMATS:
            raise ConfigError(f"format {fmt!r} is unknown; expected one of {', '.join(FORMATS)}")
        self.fmt = fmt
        self.time_field = time_field
        self.aliases = dict(aliases or {})
        self.stats = LogStats()
        self.time = TimeParser()
        self._split: tuple[str, list[str]] = ("", [])
        """The lines of the last block a bad time was found in."""

    def read(self, stream: IO[bytes]) -> Iterator[Entry]:
        """Entries of ``stream`` in file order; bad lines go to ``stats``. (Not a generator
        itself: it returns the format's own, one layer less per line.)"""
        opened = self._open(stream)
        return iter(()) if opened is None else self._entries(*opened)

    def runs(self, stream: IO[bytes], name: str) -> Iterator[list[Run]]:
        """What ``read`` gives, grouped: lists of runs of consecutive entries with one time,
        each as ``(time, [entry.fields.get(name) for each entry])``. A replay keyed on one
        field reads this: a combined log is then parsed for that field and the time only.
        A run may be split between lists; a list holds a bounded number of lines."""
        opened = self._open(stream)
        if opened is None:
            return iter(())
        fmt, text, first = opened
        if fmt == "combined" and name in NAMES and name != "time":
            return self._combined_runs(text, first, name)
        return _grouped(self._entries(fmt, text, first), name)

    def _open(self, stream: IO[bytes]) -> tuple[str, IO[str], str] | None:
        """The format, the text, and its first line that is not blank (None: there is none;
        the blank lines before it are counted, and so is it unless the format is combined,
        whose reader counts it)."""
        text = io.TextIOWrapper(stream, encoding="utf-8", errors="replace")
        stats = self.stats
        first = ""
        for first in text:
            stats.lines += 1
            stats.bytes_read += len(first)
            if first.strip():
                break
        if not first.strip():
            return None
        fmt = self.fmt
        if fmt == "auto":
            if first.lstrip().startswith("{"):
                fmt = "jsonl"
            else:
                fmt = "combined" if LINE.match(first) else "csv"
        if fmt == "combined":
            stats.lines -= 1
            stats.bytes_read -= len(first)
        return fmt, text, first

    def _entries(self, fmt: str, text: IO[str], first: str) -> Iterator[Entry]:
        if fmt == "combined":
            return self._combined(text, first)
        if fmt == "jsonl":
            return self._jsonl(first, self._count(text))
        return self._csv(first, self._count(text))

    def _count(self, lines: Iterator[str]) -> Iterator[str]:
        stats = self.stats
        for line in lines:
            stats.lines += 1
            stats.bytes_read += len(line)
            yield line

    def _combined(self, text: IO[str], first: str) -> Iterator[Entry]:
        """The hot loop of most replays: one ``findall`` per block of lines."""
        stats = self.stats
        rows = block_pattern(NAMES).findall
        time_of = self._time_of
        n = begun = stats.lines
        skipped = 0
        seen = None  # the time text of the line before
        t = 0.0
        try:
            for block in blocks(text, first, stats):
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
        finally:
            stats.lines = n
            stats.parsed += n - begun - skipped

    def _combined_runs(self, text: IO[str], first: str, name: str) -> Iterator[list[Run]]:
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
            for block in blocks(text, first, stats):
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
                yield out
        finally:
            stats.lines = n
            stats.parsed += n - begun - skipped

    def _time_of(self, when: str, bad: str, n: int, block: str, i: int) -> float | None:
        """The time of line ``n`` (the ``i``-th of ``block``), or None when it is not in the
        format (then ``bad`` is its text) or its time is not a time (both counted bad)."""
        if not when:
            if bad.strip():  # a blank line is not a bad one
                self.stats.bad(n, bad, "not in combined log format")
            return None
        try:
            return self.time(when)
        except ValueError:
            if self._split[0] is not block:  # once per block with a bad time in it
                self._split = (block, block.split("\n"))
            line = self._split[1][i - 1]
            self.stats.bad(n, line, f"time {when!r} is not [dd/Mon/yyyy:HH:MM:SS +zone]")
            return None

    def _jsonl(self, first: str, lines: Iterator[str]) -> Iterator[Entry]:
        stats = self.stats
        for line in _chain(first, self._count(lines)):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError as exc:
                stats.bad(stats.lines, line.rstrip("\n"), f"not JSON: {exc}")
                continue
            if not isinstance(obj, dict):
                stats.bad(stats.lines, line.rstrip("\n"), "not a JSON object")
                continue
            entry = self._entry({k: _text(v) for k, v in obj.items()}, line)
            if entry is not None:
                yield entry

    def _csv(self, first: str, lines: Iterator[str]) -> Iterator[Entry]:
        header = next(csv.reader([first]))
        for row in csv.reader(self._count(lines)):
            if not row:
                continue
            if len(row) != len(header):
                self.stats.bad(
                    self.stats.lines,
                    ",".join(row),
                    f"{len(row)} columns; the header has {len(header)}",
                )
                continue
            entry = self._entry(dict(zip(header, row, strict=True)), ",".join(row))
            if entry is not None:
                yield entry

    def _entry(self, fields: dict[str, str], line: str) -> Entry | None:
        stats = self.stats
        for name, source in self.aliases.items():
            if source in fields:
                fields[name] = fields[source]
        for name, spellings in KNOWN_ALIASES.items():
            if name not in fields:
                for s in spellings:
                    if s in fields:
                        fields[name] = fields[s]
                        break
        time_field = self.time_field
        if time_field is None:
            time_field = next((f for f in TIME_FIELDS if f in fields), None)
            if time_field is None:
                stats.bad(
                    stats.lines,
                    line.rstrip("\n"),
                    f"no time field (tried {', '.join(TIME_FIELDS)}; use --time-field)",
                )
                return None
        raw = fields.get(time_field)
        try:
            t = self.time(raw) if raw is not None else None
        except ValueError:
            t = None
        if t is None:
            stats.bad(
                stats.lines,
                line.rstrip("\n"),
                f"time field {time_field!r} is missing or not a time",
            )
            return None
        stats.parsed += 1
        return Entry(t, fields)


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


def _chain(first: str, rest: Iterator[str]) -> Iterator[str]:
    yield first
    yield from rest


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    return str(value)
