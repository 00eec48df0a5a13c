"""Calendar periods: windows that are a zone's days, weeks, months and years from an anchor.

The boundaries are checked against ``zoneinfo`` by hand-written instants (DST changes, month
ends, leap years, an anchor on the 31st); the limiter is time-travelled with a ``ManualClock``
across them on every store, and its reset, ``retry_after`` and headers must name the period's
true end.
"""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from ratekeeper import ConfigError, Limiter, ManualClock, Rate, RateSpecError
from ratekeeper.calendar import Calendar
from ratekeeper.plan import make_policy
from tests.conftest import Backend

BERLIN = ZoneInfo("Europe/Berlin")


def ms(text: str, zone: ZoneInfo = BERLIN) -> int:
    """Epoch ms of a local time in ``zone`` (the first of two, the offset before a gap)."""
    return int(datetime.fromisoformat(text).replace(tzinfo=zone).timestamp() * 1000)


def window(calendar: Calendar, text: str) -> tuple[str, str]:
    start, end = calendar.window(ms(text, calendar.zone))
    show = lambda t: datetime.fromtimestamp(t / 1000, calendar.zone).isoformat()  # noqa: E731
    return show(start), show(end)


def test_a_berlin_month_spans_the_spring_change_and_is_an_hour_short() -> None:
    cal = Calendar("month", "Europe/Berlin")
    assert window(cal, "2024-03-20T12:00") == (
        "2024-03-01T00:00:00+01:00",
        "2024-04-01T00:00:00+02:00",
    )
    start, end = cal.window(ms("2024-03-20T12:00"))
    assert end - start == 31 * 86_400_000 - 3_600_000
    start, end = cal.window(ms("2024-10-20T12:00"))  # the autumn change: an hour longer
    assert end - start == 31 * 86_400_000 + 3_600_000


def test_a_billing_anchor_on_the_15th_in_berlin() -> None:
    cal = Calendar("month", "Europe/Berlin", "15")
    assert window(cal, "2024-03-14T23:59") == (
        "2024-02-15T00:00:00+01:00",
        "2024-03-15T00:00:00+01:00",
    )
    assert window(cal, "2024-03-15T00:00") == (
        "2024-03-15T00:00:00+01:00",
        "2024-04-15T00:00:00+02:00",
    )
    # the instant itself belongs to the new period; one ms before to the old one
    start, _ = cal.window(ms("2024-03-15T00:00"))
    assert cal.window(start - 1)[1] == start


@pytest.mark.parametrize(
    ("now", "expected"),
    [
        ("2024-02-10T00:00", ("2024-01-31T00:00:00+01:00", "2024-02-29T00:00:00+01:00")),
        ("2024-02-29T12:00", ("2024-02-29T00:00:00+01:00", "2024-03-31T00:00:00+01:00")),
        ("2023-02-28T00:00", ("2023-02-28T00:00:00+01:00", "2023-03-31T00:00:00+02:00")),
        ("2023-02-27T23:59", ("2023-01-31T00:00:00+01:00", "2023-02-28T00:00:00+01:00")),
        ("2024-04-30T12:00", ("2024-04-30T00:00:00+02:00", "2024-05-31T00:00:00+02:00")),
    ],
)
def test_an_anchor_on_the_31st_is_a_short_months_last_day(
    now: str, expected: tuple[str, str]
) -> None:
    assert window(Calendar("month", "Europe/Berlin", "31"), now) == expected


def test_a_year_from_february_29th_starts_on_the_28th_in_other_years() -> None:
    cal = Calendar("year", "UTC", "02-29")
    utc = ZoneInfo("UTC")
    assert window(cal, "2025-03-01T00:00")[0].startswith("2025-02-28")
    assert cal.window(ms("2024-03-01T00:00", utc))[0] == ms("2024-02-29T00:00", utc)
    assert cal.window(ms("2024-02-28T23:59", utc))[0] == ms("2023-02-28T00:00", utc)


def test_days_and_weeks_across_the_spring_change() -> None:
    day = Calendar("day", "Europe/Berlin")
    start, end = day.window(ms("2024-03-31T12:00"))
    assert end - start == 23 * 3_600_000  # the day the clocks go forward
    week = Calendar("week", "Europe/Berlin", "sun 18:00")
    assert window(week, "2024-03-31T12:00") == (
        "2024-03-24T18:00:00+01:00",
        "2024-03-31T18:00:00+02:00",
    )
    assert window(week, "2024-03-31T18:00")[0] == "2024-03-31T18:00:00+02:00"
    # an anchor time the clock skips is read with the offset before the change: 03:30
    skipped = Calendar("day", "Europe/Berlin", "02:30")
    assert window(skipped, "2024-03-31T12:00")[0] == "2024-03-31T03:30:00+02:00"
    # and one it shows twice is its first occurrence
    twice = Calendar("day", "Europe/Berlin", "02:30")
    start, _ = twice.window(ms("2024-10-27T12:00"))
    assert start == ms("2024-10-27T02:30")  # fold 0: CEST, the first 02:30


def test_equal_calendars_compare_equal_in_any_spelling() -> None:
    assert Calendar("month", anchor="1") == Calendar("month", anchor="1 00:00")
    assert Calendar("week", anchor="mon") == Calendar("week", anchor="Monday 00:00")
    assert Calendar("month", anchor="15") != Calendar("month", anchor="16")


@pytest.mark.parametrize(
    ("unit", "zone", "anchor", "message"),
    [
        ("decade", "UTC", "", "unit 'decade' is unknown"),
        ("month", "Mars/Olympus_Mons", "", "time zone 'Mars/Olympus_Mons' is unknown"),
        ("month", "../../etc/passwd", "", "time zone"),
        ("month", "", "", "time zone"),
        ("month", "UTC", "32", "anchor '32' is invalid"),
        ("month", "UTC", "0", "anchor '0' is invalid"),
        ("month", "UTC", "15 25:00", "anchor"),
        ("month", "UTC", "15 9", "anchor"),
        ("month", "UTC", "fifteenth", "anchor"),
        ("year", "UTC", "02-30", "anchor '02-30' is invalid"),
        ("year", "UTC", "13-01", "anchor"),
        ("week", "UTC", "someday", "anchor 'someday' is invalid"),
        ("week", "UTC", "mo", "anchor"),
        ("day", "UTC", "monday", "anchor 'monday' is invalid"),
    ],
)
def test_bad_calendars_are_refused_naming_the_value(
    unit: str, zone: str, anchor: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        Calendar(unit, zone, anchor)


def test_rates_parse_calendar_units_and_refuse_what_they_cannot_count() -> None:
    (rate,) = Rate.parse("1000/calendar-month")
    assert rate.calendar == Calendar("month")
    assert rate.code == "1000/calendar-month" and str(rate) == "1000/calendar-month"
    assert Rate.parse("5 per calendar-day")[0].calendar == Calendar("day")
    with pytest.raises(RateSpecError, match="counts several calendar periods"):
        Rate.parse("5/2 calendar-months")
    with pytest.raises(RateSpecError, match="calendar-fortnight"):
        Rate.parse("5/calendar-fortnight")
    with pytest.raises(RateSpecError, match="does not match calendar-month"):
        Rate(5, 60.0, calendar=Calendar("month"))


@pytest.mark.parametrize("algorithm", ["token_bucket", "gcra", "sliding_window", "sliding_log"])
def test_only_fixed_window_counts_calendar_periods(algorithm: str) -> None:
    with pytest.raises(ConfigError, match=f"only fixed_window does; {algorithm} needs"):
        make_policy("1000/calendar-month", algorithm, None, None)
    with pytest.raises(ConfigError, match="aligned to its calendar already"):
        make_policy("1000/calendar-month", "fixed_window", None, None, aligned=True)


def test_calendar_rates_need_their_own_counters() -> None:
    rolling = make_policy("1000/30d", "fixed_window", None, None)
    monthly = make_policy("1000/calendar-month", "fixed_window", None, None)
    assert rolling.slots != monthly.slots
    both = make_policy("10/minute; 1000/calendar-month", "fixed_window", None, None)
    assert both.calendar and len(set(both.slots)) == 2


def test_a_monthly_quota_with_a_billing_anchor_resets_at_the_true_end(backend: Backend) -> None:
    """The 15th of the month at 00:00 Berlin, across the spring change: a window opened on
    March 20 stores April 15 00:00 CEST as its end; retry_after, reset_at and the headers say
    so to the second; at that instant the quota is back, not an hour early or late."""
    clock = ManualClock(ms("2024-03-20T12:00") / 1000)
    limiter = Limiter(backend.store, clock=clock, fail_open=False)
    rate = Rate.per_calendar(3, "month", timezone="Europe/Berlin", anchor="15")
    end = ms("2024-04-15T00:00") / 1000
    for _ in range(3):
        assert limiter.hit("acme", rate).allowed
    d = limiter.hit("acme", rate)
    assert not d.allowed
    assert d.reset_at == end
    assert d.retry_after == pytest.approx(end - clock())
    headers = d.headers("exports")
    assert headers["Retry-After"] == str(int(end - clock()))
    assert headers["X-RateLimit-Reset"] == str(int(end))
    assert headers["RateLimit"] == f'"exports";r=0;t={int(end - clock())}'
    assert headers["RateLimit-Policy"] == '"exports";q=3;w=2592000'
    clock.set(end - 0.001)
    assert not limiter.hit("acme", rate).allowed
    clock.set(end)
    d = limiter.hit("acme", rate)
    assert d.allowed and d.remaining == 2
    assert d.reset_at == ms("2024-05-15T00:00") / 1000


def test_month_ends_and_a_leap_february_on_every_store(backend: Backend) -> None:
    """An anchor on the 31st in UTC: the period after January 31 ends on February 29 (2024),
    then March 31; each window ends where it should and opens fresh after."""
    clock = ManualClock(ms("2024-01-31T10:00", ZoneInfo("UTC")) / 1000)
    limiter = Limiter(backend.store, clock=clock, fail_open=False)
    rate = Rate.per_calendar(1, "month", anchor="31")
    ends = ["2024-02-29T00:00", "2024-03-31T00:00", "2024-04-30T00:00", "2024-05-31T00:00"]
    for end in ends:
        d = limiter.hit("k", rate)
        assert d.allowed
        assert d.reset_at == ms(end, ZoneInfo("UTC")) / 1000
        assert not limiter.hit("k", rate).allowed
        clock.set(d.reset_at)


def test_a_stored_end_does_not_move_when_the_anchor_changes(backend: Backend) -> None:
    """The end is stored with the count (no wobble): a customer whose billing day moves keeps
    this period's count and end; the next period follows the new anchor."""
    clock = ManualClock(ms("2024-03-20T12:00") / 1000)
    limiter = Limiter(backend.store, clock=clock, fail_open=False)
    old = Rate.per_calendar(5, "month", timezone="Europe/Berlin", anchor="15")
    new = Rate.per_calendar(5, "month", timezone="Europe/Berlin", anchor="1")
    assert limiter.hit("k", old, cost=4).allowed
    d = limiter.hit("k", new)
    assert d.remaining == 0 and d.reset_at == ms("2024-04-15T00:00") / 1000
    clock.set(d.reset_at)
    assert limiter.hit("k", new).reset_at == ms("2024-05-01T00:00") / 1000
