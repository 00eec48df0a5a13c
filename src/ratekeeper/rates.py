"""Rates: ``"100/minute"`` parsed once into a frozen ``Rate``; stacks are tuples of rates.

Accepted forms (case-insensitive, spaces allowed around parts)::

    100/second   100/minute   5000/hour   10000/day      unit words, singular or plural
    1000/week    100000/month   1000000/year             (a month is 30 days, a year 365)
    100/s  100/sec  100/m  100/min  100/h  100/hr  100/d  abbreviations
    100/w  100/wk  100/mo  100/y  100/yr
    100/30s  100/5 minutes  20/2h  1/1d  7/1500ms         a multiple of a unit
    100 per minute                                        "per" instead of "/"
    2/second; 100/minute                                  a stack: every rate must admit
    1000/calendar-month   10/calendar-day                 calendar periods (also -week, -year)

A bad string raises ``RateSpecError`` (a ``ValueError``) naming the bad part and listing what
is accepted; nothing is ever silently read as some other limit.

A month is 30 days and a year 365, the lengths envoyproxy/ratelimit gives its ``MONTH`` and
``YEAR`` units: windows of fixed length. ``calendar-day``, ``-week``, ``-month`` and ``-year``
count calendar periods instead (``ratekeeper.calendar``: UTC from the period's start; a time
zone and an anchor such as a billing day with ``Rate.per_calendar``). The service reads
Envoy-format units through ``UNIT_MS``, so the library and the service speak one grammar.

A rate may say what it counts (``unit``: ``requests``, ``content-bytes``,
``concurrent-requests``, the quota units of the IETF draft's ``RateLimit-Policy``); None means
not stated (requests).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from .calendar import UNITS as CALENDAR_UNITS
from .calendar import Calendar
from .errors import RateSpecError

DAY_MS = 86_400_000
UNIT_MS: dict[str, int] = {}
"""Every unit word and abbreviation, lower case, in milliseconds."""
for _names, _ms in (
    (("ms", "msec", "millisecond", "milliseconds"), 1),
    (("s", "sec", "secs", "second", "seconds"), 1_000),
    (("m", "min", "mins", "minute", "minutes"), 60_000),
    (("h", "hr", "hrs", "hour", "hours"), 3_600_000),
    (("d", "day", "days"), DAY_MS),
    (("w", "wk", "wks", "week", "weeks"), 7 * DAY_MS),
    (("mo", "mon", "month", "months"), 30 * DAY_MS),
    (("y", "yr", "yrs", "year", "years"), 365 * DAY_MS),
):
    for _name in _names:
        UNIT_MS[_name] = _ms

_UNIT_WORDS = {
    1_000: "second",
    60_000: "minute",
    3_600_000: "hour",
    DAY_MS: "day",
    7 * DAY_MS: "week",
    30 * DAY_MS: "month",
    365 * DAY_MS: "year",
}
_UNIT_SHORT = {1_000: "s", 60_000: "m", 3_600_000: "h", DAY_MS: "d"}
ACCEPTED = (
    "a rate like '100/minute', '5000/hour', '100/30s' or '2/second; 100/minute' "
    "(units: ms, s, sec, second(s), m, min, minute(s), h, hr, hour(s), d, day(s), "
    "w, wk, week(s), mo, month(s) of 30 days, y, yr, year(s) of 365 days; calendar-day, "
    "calendar-week, calendar-month, calendar-year)"
)
QUOTA_UNITS = ("requests", "content-bytes", "concurrent-requests")
"""What a rate may count: the quota units of draft-ietf-httpapi-ratelimit-headers-11."""
MAX_COUNT = 10**12
MAX_PERIOD_MS = 3650 * 86_400_000
"""Ten years: keeps every algorithm's times far below 2**53 ms, where Lua's doubles are exact."""
_RATE = re.compile(
    r"^\s*(?P<count>\S+?)\s*(?:/|\s+per\s+)\s*(?P<mult>\d+)?\s*(?P<unit>[a-z]+(?:-[a-z]+)?)\s*$",
    re.ASCII,
)


@dataclass(frozen=True, slots=True, repr=False)
class Rate:
    """``count`` units per ``period`` seconds, e.g. ``Rate(100, 60.0)`` is 100/minute.

    ``calendar``: the windows are calendar periods (``per_calendar``); ``period`` is then the
    unit's nominal length. ``unit``: what is counted (``QUOTA_UNITS``), None if not stated."""

    count: int
    period: float
    period_ms: int = field(init=False, repr=False, compare=False)
    calendar: Calendar | None = None
    unit: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.count, bool) or not isinstance(self.count, int):
            raise RateSpecError(
                f"rate count {self.count!r} is not a whole number; expected {ACCEPTED}"
            )
        if not 1 <= self.count <= MAX_COUNT:
            raise RateSpecError(
                f"rate count {self.count} is out of range; expected 1 to {MAX_COUNT:_}"
            )
        period_ms = round(float(self.period) * 1000)
        if period_ms < 1 or abs(period_ms - float(self.period) * 1000) > 1e-6:
            raise RateSpecError(
                f"rate period {self.period!r} s is not a positive whole number of milliseconds; "
                "expected e.g. 1, 0.5 or 0.001 seconds"
            )
        if period_ms > MAX_PERIOD_MS:
            raise RateSpecError(
                f"rate period {self.period!r} s is too long; expected at most 3650 days"
            )
        object.__setattr__(self, "period", period_ms / 1000)
        object.__setattr__(self, "period_ms", period_ms)
        if self.calendar is not None:
            if not isinstance(self.calendar, Calendar):
                raise RateSpecError(f"calendar {self.calendar!r} must be a Calendar")
            if period_ms != self.calendar.nominal_ms:
                raise RateSpecError(
                    f"rate period {self.period!r} s does not match calendar-"
                    f"{self.calendar.unit}; build calendar rates with Rate.per_calendar"
                )
        if self.unit is not None and self.unit not in QUOTA_UNITS:
            raise RateSpecError(
                f"rate unit {self.unit!r} is invalid; expected one of {', '.join(QUOTA_UNITS)}"
            )

    def __repr__(self) -> str:
        extra = "" if self.calendar is None else f", calendar={self.calendar!r}"
        extra += "" if self.unit is None else f", unit={self.unit!r}"
        return f"Rate(count={self.count!r}, period={self.period!r}{extra})"

    @staticmethod
    def per_calendar(count: int, unit: str, *, timezone: str = "UTC", anchor: str = "") -> Rate:
        """``count`` per calendar ``unit`` (day, week, month, year) of ``timezone``, starting
        at ``anchor`` (e.g. ``Rate.per_calendar(1000, "month", timezone="Europe/Berlin",
        anchor="15")``: from the 15th at 00:00 Berlin time); see ``ratekeeper.calendar``."""
        calendar = Calendar(unit, timezone, anchor)
        return Rate(count, calendar.nominal_ms / 1000, calendar=calendar)

    def with_unit(self, unit: str | None) -> Rate:
        """The same rate counting ``unit``."""
        if unit == self.unit:
            return self
        return Rate(self.count, self.period, calendar=self.calendar, unit=unit)

    @property
    def window(self) -> str:
        """The window's length in short form (``1m``, ``30d``, ``1500ms``): with the algorithm,
        its options and the limit's name, what names a rate's counters in a store."""
        for ms in (DAY_MS, 3_600_000, 60_000, 1_000):
            if self.period_ms % ms == 0:
                return f"{self.period_ms // ms}{_UNIT_SHORT[ms]}"
        return f"{self.period_ms}ms"

    @staticmethod
    def parse(text: str) -> tuple[Rate, ...]:
        """Parse one rate or a ``;``-separated stack; always returns a tuple of rates."""
        if not isinstance(text, str):
            raise RateSpecError(f"rate {text!r} is not a string; expected {ACCEPTED}")
        return _parse_cached(text)

    @property
    def code(self) -> str:
        """Short canonical form, e.g. ``100/1m``, ``7/1500ms`` or ``1000/calendar-month``; the
        rate's name in metrics and headers."""
        if self.calendar is not None:
            return f"{self.count}/calendar-{self.calendar.unit}"
        return f"{self.count}/{self.window}"

    def __str__(self) -> str:
        if self.calendar is not None:
            return self.code
        for ms, word in _UNIT_WORDS.items():
            if self.period_ms == ms:
                return f"{self.count}/{word}"
        return self.code


@lru_cache(maxsize=4096)
def _parse_cached(text: str) -> tuple[Rate, ...]:
    parts = [p for p in re.split(r"[;,]", text)]
    if not text.strip():
        raise RateSpecError(f"rate {text!r} is empty; expected {ACCEPTED}")
    if text.startswith("plan:"):
        raise RateSpecError(
            f"rate {text!r} names a plan's limit, but this limiter has no plans; give it "
            "quotas=Quotas(plans, ...) (ratekeeper.quotas)"
        )
    rates = []
    for part in parts:
        if not part.strip():
            raise RateSpecError(
                f"rate {text!r} has an empty part between separators; expected {ACCEPTED}"
            )
        rates.append(_parse_one(part, text))
    if len(set(rates)) != len(rates):
        raise RateSpecError(f"rate {text!r} names the same rate twice; each rate may appear once")
    return tuple(rates)


def _parse_one(part: str, whole: str) -> Rate:
    m = _RATE.match(part.lower())
    if m is None:
        raise RateSpecError(
            f"rate part {part.strip()!r} of {whole!r} is not understood; expected {ACCEPTED}"
        )
    count_text, mult_text, unit = m.group("count"), m.group("mult"), m.group("unit")
    if not (count_text.isascii() and count_text.isdigit()):
        raise RateSpecError(
            f"rate count {count_text!r} in {whole!r} is not a positive whole number; "
            f"expected {ACCEPTED}"
        )
    if len(count_text.lstrip("0")) > len(str(MAX_COUNT)):  # before int(): 5000 digits raise
        raise RateSpecError(
            f"rate count {_short(count_text)} in {_short(whole)} is out of range; "
            f"expected 1 to {MAX_COUNT:_}"
        )
    count = int(count_text)
    if count == 0:
        raise RateSpecError(
            f"rate count 0 in {whole!r} admits nothing; the count must be at least 1"
        )
    if unit.startswith("calendar-"):
        name = unit[9:].rstrip("s") if unit.endswith("s") else unit[9:]
        if name not in CALENDAR_UNITS:
            raise RateSpecError(f"rate unit {unit!r} in {whole!r} is unknown; expected {ACCEPTED}")
        if mult_text is not None:
            raise RateSpecError(
                f"rate {part.strip()!r} in {whole!r} counts several calendar periods; a "
                "calendar rate counts one (e.g. '1000/calendar-month')"
            )
        if count > MAX_COUNT:
            raise RateSpecError(f"rate count {count} is out of range; expected 1 to {MAX_COUNT:_}")
        return Rate.per_calendar(count, name)
    unit_ms = UNIT_MS.get(unit)
    if unit_ms is None:
        raise RateSpecError(f"rate unit {unit!r} in {whole!r} is unknown; expected {ACCEPTED}")
    if mult_text is not None and len(mult_text.lstrip("0")) > len(str(MAX_PERIOD_MS)):
        raise RateSpecError(  # a float of it could overflow; any such period is too long
            f"rate period {_short(mult_text)}{unit} in {_short(whole)} is too long; "
            "expected at most 3650 days"
        )
    mult = int(mult_text) if mult_text is not None else 1
    if mult == 0:
        raise RateSpecError(
            f"rate period '0{unit}' in {whole!r} is empty; the period must be at least 1"
        )
    return Rate(count, mult * unit_ms / 1000)


def _short(text: str, limit: int = 60) -> str:
    """``repr`` of a value for an error message, cut to ``limit`` characters."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"... ({len(text)} chars)"


def to_rates(spec: str | Rate | Sequence[Rate]) -> tuple[Rate, ...]:
    """Normalize what a ``Limiter`` method accepts into a non-empty tuple of rates."""
    if isinstance(spec, str):
        return _parse_cached(spec)
    if isinstance(spec, Rate):
        return (spec,)
    try:
        rates = tuple(spec)
    except TypeError:
        rates = ()
    if not rates or not all(isinstance(r, Rate) for r in rates):
        raise RateSpecError(
            f"rates {spec!r} must be a rate string, a Rate or a non-empty sequence of Rate"
        )
    if len(set(rates)) != len(rates):
        raise RateSpecError(f"rates {spec!r} name the same rate twice; each rate may appear once")
    return rates
