"""Log timestamps -> epoch seconds, and the time zone the log was written in.

Accepted, whatever the format (each format says where its time is):

- the common log format's ``10/Oct/2000:13:55:36 -0700`` (with or without the brackets);
- ISO 8601 / RFC 3339: ``2024-05-01T12:00:00Z``, ``2024-05-01 12:00:00.123456789+02:00``,
  ``+0200`` or ``-07`` zones, any number of fraction digits; no zone means UTC;
- epochs as digits (or a JSON number), their unit told by their size: seconds below 1e11
  (until the year 5138), milliseconds below 1e14, microseconds below 1e17, else nanoseconds
  (Cloudflare's default). Nanoseconds are read as integers, so none of their precision
  beyond a float's is invented.

Conversions are cached per minute (one ``strptime`` per distinct minute, not per line) and
per text (busy logs repeat the same second). ``zones`` counts the UTC offsets seen, once per
minute parsed: the report draws its time axis in the most common one.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime

SECONDS_BELOW = 1e11
MILLIS_BELOW = 1e14
MICROS_BELOW = 1e17
SEEN = 4096
"""Texts whose value is remembered (then the memory starts over)."""


class TimeParser:
    """Timestamps -> epoch seconds (see the module docstring); ``ValueError`` if not a time."""

    def __init__(self) -> None:
        self._minutes: dict[str, float] = {}
        self._seen: dict[str, float] = {}
        self.zones: Counter[int] = Counter()
        """UTC offsets in seconds, counted once per minute parsed (epochs: once per text,
        as UTC)."""

    def __call__(self, text: str) -> float:
        seen = self._seen.get(text)
        if seen is not None:
            return seen
        if len(self._seen) > SEEN:
            self._seen.clear()
        value = self._seen[text] = self._parse(text)
        return value

    @property
    def zone(self) -> int:
        """The most common UTC offset (seconds), 0 before any time was parsed."""
        return self.zones.most_common(1)[0][0] if self.zones else 0

    def _parse(self, text: str) -> float:
        if not text:
            raise ValueError("no time")
        if text[0] == "[" and text[-1] == "]":
            text = text[1:-1]
        if text.isdigit():
            return self._epoch(int(text))
        if text.replace(".", "", 1).isdigit():
            return self._epoch(float(text))
        if len(text) >= 20 and text[2] == "/" and text[11] == ":":  # 10/Oct/2000:13:55:36 -0700
            head = text[:17] + text[20:]
            base = self._minutes.get(head)
            if base is None:
                when = datetime.strptime(text[:17] + ":00" + text[20:], "%d/%b/%Y:%H:%M:%S %z")
                base = self._minutes[head] = when.timestamp()
                self._zone(when)
            return base + float(text[18:20])
        return self._iso(text)

    def _epoch(self, value: float) -> float:
        self.zones[0] += 1  # epochs are UTC
        if value < SECONDS_BELOW:
            return float(value)
        if value < MILLIS_BELOW:
            return value / 1e3
        if value < MICROS_BELOW:
            return value / 1e6
        if isinstance(value, int):
            return value // 1000 / 1e6  # whole µs first: exact below 2**53
        return value / 1e9

    def _iso(self, text: str) -> float:
        # cache the minute (the first 16 characters) with the zone that follows the seconds
        if len(text) < 16 or text[4] != "-" or text[10] not in "T t":
            raise ValueError(f"{text!r} is not a time")
        rest = text[16:]
        end = 0
        if rest[:1] == ":":
            end = 3
            while end < len(rest) and (rest[end].isdigit() or rest[end] == "."):
                end += 1
        zone = rest[end:].strip()
        head = text[:10] + "T" + text[11:16] + zone
        base = self._minutes.get(head)
        if base is None:
            when = datetime.fromisoformat(f"{head[:16]}:00{_zone(zone)}")
            base = self._minutes[head] = when.timestamp()
            self._zone(when)
        return base + (float(rest[1:end]) if end > 1 else 0.0)

    def _zone(self, when: datetime) -> None:
        offset = when.utcoffset()
        self.zones[int(offset.total_seconds()) if offset is not None else 0] += 1


def _zone(zone: str) -> str:
    """An ISO zone as ``fromisoformat`` takes it (``+HH:MM``); UTC when there is none."""
    if not zone or zone in ("Z", "z"):
        return "+00:00"
    if zone[0] not in "+-" or not zone[1:].replace(":", "").isdigit():
        raise ValueError(f"time zone {zone!r} is not +HH:MM")
    digits = zone[1:].replace(":", "")
    if len(digits) == 2:
        digits += "00"
    if len(digits) != 4:
        raise ValueError(f"time zone {zone!r} is not +HH:MM")
    return f"{zone[0]}{digits[:2]}:{digits[2:]}"


def zone_name(offset: int) -> str:
    """``UTC`` or ``UTC-07:00``."""
    if offset == 0:
        return "UTC"
    sign = "-" if offset < 0 else "+"
    hours, minutes = divmod(abs(offset) // 60, 60)
    return f"UTC{sign}{hours:02d}:{minutes:02d}"
