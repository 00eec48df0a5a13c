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
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import IO, Any, NamedTuple

from ..errors import ConfigError

FORMATS = ("auto", "combined", "jsonl", "csv")
TIME_FIELDS = ("time", "timestamp", "ts", "@timestamp", "time_local", "date")
KNOWN_ALIASES: dict[str, tuple[str, ...]] = {
    "ip": ("ip", "remote_addr", "client_ip", "client", "remote_ip", "clientip", "peer"),
    "user": ("user", "remote_user", "username", "user_id"),
    "method": ("method", "request_method", "verb"),
    "path": ("path", "uri", "request_uri", "url", "request_path"),
    "status": ("status", "status_code", "response_code"),
}
_COMBINED = re.compile(
    r'(\S+) \S+ (\S+) \[([^\]]+)\] "(\S+) (\S+)(?: (\S+))?" (\d{3}) (\S+)'
    r'(?: "([^"]*)" "([^"]*)")?'
)
_NAMES = ("ip", "user", "time", "method", "path", "protocol", "status", "bytes", "referer",
          "user_agent")  # fmt: skip
"""The combined format's groups, in order."""
SAMPLES = 5


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

    def read(self, stream: IO[bytes]) -> Iterator[Entry]:
        """Entries of ``stream`` in file order; bad lines go to ``stats``. (Not a generator
        itself: it returns the format's own, one layer less per line.)"""
        text = io.TextIOWrapper(stream, encoding="utf-8", errors="replace")
        stats = self.stats
        first = ""
        for first in text:
            stats.lines += 1
            stats.bytes_read += len(first)
            if first.strip():
                break
        if not first.strip():
            return iter(())
        fmt = self.fmt
        if fmt == "auto":
            if first.lstrip().startswith("{"):
                fmt = "jsonl"
            else:
                fmt = "combined" if _COMBINED.match(first) else "csv"
        if fmt == "combined":
            stats.lines -= 1
            stats.bytes_read -= len(first)
            return self._combined(_chain(first, text))
        if fmt == "jsonl":
            return self._jsonl(first, self._count(text))
        return self._csv(first, self._count(text))

    def _count(self, lines: Iterator[str]) -> Iterator[str]:
        stats = self.stats
        for line in lines:
            stats.lines += 1
            stats.bytes_read += len(line)
            yield line

    def _combined(self, lines: Iterator[str]) -> Iterator[Entry]:
        """The hot loop of most replays: it counts lines itself (no ``_count`` layer)."""
        stats = self.stats
        match = _COMBINED.match
        parse_time = self.time
        n = stats.lines
        size = stats.bytes_read
        parsed = 0
        try:
            for line in lines:
                n += 1
                size += len(line)
                m = match(line)
                if m is None:
                    if line.strip():
                        stats.bad(n, line.rstrip("\n"), "not in combined log format")
                    continue
                fields = dict(zip(_NAMES, m.groups(""), strict=True))
                try:
                    t = parse_time(fields.pop("time"))
                except ValueError:
                    why = f"time {m.group(3)!r} is not [dd/Mon/yyyy:HH:MM:SS +zone]"
                    stats.bad(n, line.rstrip("\n"), why)
                    continue
                if fields["user"] == "-":
                    del fields["user"]
                parsed += 1
                if not n & 0xFFF:  # the progress bar reads these
                    stats.lines, stats.bytes_read = n, size
                yield Entry(t, fields)
        finally:
            stats.lines, stats.bytes_read = n, size
            stats.parsed += parsed

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


def _chain(first: str, rest: Iterator[str]) -> Iterator[str]:
    yield first
    yield from rest


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    return str(value)
