"""Calendar periods: a day, week, month or year of a time zone, starting at an anchor.

A rate such as ``1000/calendar-month`` counts per calendar month rather than per 30 days: its
windows start on the period's boundaries in a time zone (``zoneinfo`` names, UTC by default)
at an anchor, and its reset is the period's true end. Every key shares the boundaries.

Anchors, per unit (all times local to the zone, ``HH:MM`` 24-hour, default 00:00):

    day     "HH:MM"                 a day from 06:00 to 06:00: "06:00"
    week    "<weekday> [HH:MM]"     the default week starts monday 00:00
    month   "<day> [HH:MM]"         a billing day: "15" or "15 09:30"; day 1-31, and a day the
                                    month lacks is its last (an anchor on the 31st starts
                                    February's period on the 28th, or the 29th in a leap year)
    year    "<MM-DD> [HH:MM]"       "04-01" for a fiscal year; 02-29 is 02-28 in other years

Daylight saving time: a boundary is the instant the zone's clock shows the anchor, so a month
of a Berlin calendar is one hour shorter when it spans the spring change. An anchor time the
clock skips (02:30 on the spring-forward night) is read with the offset before the change,
i.e. as 03:30; one it shows twice (the autumn night) is its first occurrence. Both follow
``zoneinfo``'s ``fold=0``.

``Calendar.window(now_ms)`` gives the period holding ``now_ms`` as epoch ms ``(start, end)``;
the last period found is kept, so a decision inside it costs a comparison. Nothing here reads
a clock: the limiter's clock gives ``now_ms``, and the window end goes to the stores (the Lua
scripts get it as an argument), which store it with the count.
"""

from __future__ import annotations

import calendar as _days
import re
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

from .errors import ConfigError

DAY_MS = 86_400_000
UNITS: dict[str, int] = {
    "day": DAY_MS,
    "week": 7 * DAY_MS,
    "month": 30 * DAY_MS,
    "year": 365 * DAY_MS,
}
"""The calendar units and their nominal lengths (a rate's ``period``, the headers' ``w``)."""

WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
_TIME = re.compile(r"^([01]?\d|2[0-3]):([0-5]\d)$")
_ANCHORS = {
    "day": "'HH:MM' (e.g. '06:00')",
    "week": "a weekday and an optional 'HH:MM' (e.g. 'monday' or 'sunday 18:00')",
    "month": "a day of the month 1-31 and an optional 'HH:MM' (e.g. '15' or '15 09:30')",
    "year": "'MM-DD' and an optional 'HH:MM' (e.g. '04-01' or '04-01 06:00')",
}


@dataclass(frozen=True, slots=True)
class Calendar:
    """A calendar period: ``unit`` (day, week, month, year) in ``timezone`` from ``anchor``.

    ``anchor`` is read by unit (see the module docstring) and kept in a canonical spelling, so
    two calendars that start at the same instants compare equal."""

    unit: str
    timezone: str = "UTC"
    anchor: str = ""
    zone: ZoneInfo = field(init=False, repr=False, compare=False, hash=False)
    start: tuple[int, int, int, int] = field(init=False, repr=False, compare=False, hash=False)
    """(month or weekday, day, hour, minute) of the anchor; unused parts 0."""
    _span: list[tuple[int, int]] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ConfigError(
                f"calendar unit {self.unit!r} is unknown; expected one of {', '.join(UNITS)}"
            )
        object.__setattr__(self, "zone", _zone(self.timezone))
        start, text = _anchor(self.unit, self.anchor)
        object.__setattr__(self, "start", start)
        object.__setattr__(self, "anchor", text)
        object.__setattr__(self, "_span", [(0, 0)])

    @property
    def nominal_ms(self) -> int:
        """The unit's nominal length: a month 30 days, a year 365 (what ``w`` advertises)."""
        return UNITS[self.unit]

    def __str__(self) -> str:
        return f"calendar-{self.unit} from {self.anchor} {self.timezone}"

    def window(self, now_ms: int) -> tuple[int, int]:
        """The period holding ``now_ms``: epoch ms ``(start, end)``, ``start <= now_ms < end``."""
        span = self._span[0]
        if span[0] <= now_ms < span[1]:
            return span
        span = self._find(now_ms)
        self._span[0] = span  # one assignment: a reader sees the old span or the new one
        return span

    def end_ms(self, now_ms: int) -> int:
        """When the period holding ``now_ms`` ends (the next period's start)."""
        span = self._span[0]
        if span[0] <= now_ms < span[1]:
            return span[1]
        return self.window(now_ms)[1]

    def _find(self, now_ms: int) -> tuple[int, int]:
        try:
            return self._search(now_ms)
        except (OverflowError, ValueError) as exc:  # datetime counts years 1 to 9999
            raise ConfigError(
                f"time {now_ms} ms is outside the years a calendar period can count"
            ) from exc

    def _search(self, now_ms: int) -> tuple[int, int]:
        local = (_EPOCH + now_ms * _MS).astimezone(self.zone)
        index = self._index(local)
        start = self._boundary(index)
        while start > now_ms:  # the anchor of this day/week/month/year is still ahead
            index -= 1
            start = self._boundary(index)
        end = self._boundary(index + 1)
        while end <= now_ms:  # never in practice; a guard against a zone's odd transitions
            index += 1
            start, end = end, self._boundary(index + 1)
        return start, end

    def _index(self, local: datetime) -> int:
        """The number of the period ``local`` falls in by the calendar's date (its boundary may
        still be ahead that day): days since 0001-01-01, weeks since the anchor's weekday of
        that week, months, years."""
        if self.unit == "day":
            return local.date().toordinal()
        if self.unit == "week":
            # ordinal 1 (0001-01-01) is a monday, so ordinals 7k + 1 + w fall on weekday w
            return (local.date().toordinal() - 1 - self.start[0]) // 7
        if self.unit == "month":
            return local.year * 12 + local.month - 1
        return local.year

    def _boundary(self, index: int) -> int:
        """Epoch ms of the boundary that starts period ``index`` (see ``_index``)."""
        first, day, hour, minute = self.start
        if self.unit == "day":
            when = date.fromordinal(index)
        elif self.unit == "week":
            when = date.fromordinal(7 * index + 1 + first)
        elif self.unit == "month":
            year, month = divmod(index, 12)
            when = date(year, month + 1, min(day, _days.monthrange(year, month + 1)[1]))
        else:
            when = date(index, first, min(day, _days.monthrange(index, first)[1]))
        local = datetime(when.year, when.month, when.day, hour, minute, tzinfo=self.zone)
        return (local - _EPOCH) // _MS


def _zone(name: object) -> ZoneInfo:
    if not isinstance(name, str) or not name or len(name) > 100:
        raise ConfigError(f"time zone {name!r} is invalid; expected a name like 'Europe/Berlin'")
    try:
        return ZoneInfo(name)
    except (ValueError, OSError) as exc:  # ZoneInfoNotFoundError is a KeyError too
        raise ConfigError(
            f"time zone {name!r} is unknown; expected an IANA name like 'Europe/Berlin' or "
            "'UTC' (the system's zone database, or the tzdata package)"
        ) from exc
    except KeyError as exc:
        raise ConfigError(
            f"time zone {name!r} is unknown; expected an IANA name like 'Europe/Berlin' or "
            "'UTC' (the system's zone database, or the tzdata package)"
        ) from exc


def _anchor(unit: str, anchor: object) -> tuple[tuple[int, int, int, int], str]:
    """Parse ``anchor`` for ``unit``: its parts and its canonical spelling."""
    if not isinstance(anchor, str) or len(anchor) > 40:
        raise ConfigError(f"calendar anchor {anchor!r} is invalid; expected {_ANCHORS[unit]}")
    words = anchor.lower().split()
    hour = minute = 0
    if words and _TIME.match(words[-1]) and (unit == "day" or len(words) == 2):
        match = _TIME.match(words.pop())
        assert match is not None
        hour, minute = int(match.group(1)), int(match.group(2))
    clock = f"{hour:02d}:{minute:02d}"
    bad = ConfigError(
        f"calendar anchor {anchor!r} is invalid for a calendar {unit}; expected {_ANCHORS[unit]}"
    )
    if unit == "day":
        if words:
            raise bad
        return (0, 0, hour, minute), clock
    if len(words) > 1:
        raise bad
    word = words[0] if words else ""
    if unit == "week":
        day = next((i for i, name in enumerate(WEEKDAYS) if word and name.startswith(word)), -1)
        if word and (len(word) < 3 or day < 0):
            raise bad
        day = max(day, 0)
        return (day, 0, hour, minute), f"{WEEKDAYS[day]} {clock}"
    if unit == "month":
        if word and not (word.isascii() and word.isdigit() and 1 <= int(word) <= 31):
            raise bad
        day = int(word) if word else 1
        return (0, day, hour, minute), f"{day} {clock}"
    month, day = 1, 1
    if word:
        parts = word.split("-")
        if len(parts) != 2 or not all(p.isascii() and p.isdigit() for p in parts):
            raise bad
        month, day = int(parts[0]), int(parts[1])
        if not 1 <= month <= 12 or not 1 <= day <= _days.monthrange(2000, month)[1]:
            raise bad  # 2000 is a leap year: 02-29 is an anchor, 02-30 is not
    return (month, day, hour, minute), f"{month:02d}-{day:02d} {clock}"
