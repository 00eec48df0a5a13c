"""Rate.parse: every accepted spelling, and bad input named with what would be accepted."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ratekeeper import Rate, RateSpecError
from ratekeeper.rates import to_rates

ACCEPTED = r"expected a rate like '100/minute'"


@pytest.mark.parametrize(
    ("text", "count", "period"),
    [
        ("100/second", 100, 1.0),
        ("100/seconds", 100, 1.0),
        ("100/s", 100, 1.0),
        ("100/sec", 100, 1.0),
        ("100/minute", 100, 60.0),
        ("100/m", 100, 60.0),
        ("100/min", 100, 60.0),
        ("100/mins", 100, 60.0),
        ("5000/hour", 5000, 3600.0),
        ("5000/hr", 5000, 3600.0),
        ("5000/h", 5000, 3600.0),
        ("10000/day", 10000, 86400.0),
        ("10000/days", 10000, 86400.0),
        ("10000/d", 10000, 86400.0),
        ("100/30s", 100, 30.0),
        ("100/5 minutes", 100, 300.0),
        ("20/2h", 20, 7200.0),
        ("1/1d", 1, 86400.0),
        ("1000/week", 1000, 604_800.0),
        ("1000/weeks", 1000, 604_800.0),
        ("1000/wk", 1000, 604_800.0),
        ("1000/2w", 1000, 1_209_600.0),
        ("100/month", 100, 2_592_000.0),
        ("100/months", 100, 2_592_000.0),
        ("100/mo", 100, 2_592_000.0),
        ("100/3 months", 100, 7_776_000.0),
        ("5/year", 5, 31_536_000.0),
        ("5/yr", 5, 31_536_000.0),
        ("5/y", 5, 31_536_000.0),
        ("5/10years", 5, 315_360_000.0),
        ("100 per minute", 100, 60.0),
        ("  7 / Minute ", 7, 60.0),
        ("3/MIN", 3, 60.0),
    ],
)
def test_accepted_forms(text: str, count: int, period: float) -> None:
    assert Rate.parse(text) == (Rate(count, period),)


def test_a_stack_is_a_tuple_in_order() -> None:
    assert Rate.parse("2/second; 100/minute") == (Rate(2, 1.0), Rate(100, 60.0))
    assert Rate.parse("2/second, 100/minute") == (Rate(2, 1.0), Rate(100, 60.0))


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("ten/minute", r"count 'ten' in 'ten/minute'.*" + ACCEPTED),
        ("100/fortnight", r"unit 'fortnight' in '100/fortnight'.*" + ACCEPTED),
        ("0/minute", r"count 0 in '0/minute' admits nothing; the count must be at least 1"),
        ("", r"rate '' is empty; " + ACCEPTED),
        ("   ", r"rate '   ' is empty; " + ACCEPTED),
        ("100", r"part '100' of '100' is not understood; " + ACCEPTED),
        ("100/0s", r"period '0s' in '100/0s' is empty; the period must be at least 1"),
        ("-5/minute", r"count '-5' in '-5/minute' is not a positive whole number"),
        ("1.5/minute", r"count '1.5' in '1.5/minute' is not a positive whole number"),
        ("²/minute", r"count '²' in '²/minute' is not a positive whole number"),
        ("\uff11\uff10\uff10/minute", "count '\uff11\uff10\uff10' in .* is not a positive whole"),
        ("100/minute;", r"'100/minute;' has an empty part between separators; " + ACCEPTED),
        ("1/minute; 1/minute", r"names the same rate twice"),
        ("1/3651d", r"period 315446400.0 s is too long; expected at most 3650 days"),
        ("1/11y", r"period 346896000.0 s is too long; expected at most 3650 days"),
        ("100/fortnights", r"unit 'fortnights' .*w, wk, week\(s\), mo, month\(s\) of 30 days"),
        ("1000000000001/second", r"count 1000000000001 is out of range; expected 1 to"),
    ],
)
def test_bad_rates_name_the_bad_part_and_what_is_accepted(text: str, names: str) -> None:
    with pytest.raises(RateSpecError, match=names) as info:
        Rate.parse(text)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("count", "period", "names"),
    [
        (0, 1.0, r"count 0 is out of range; expected 1 to"),
        (True, 1.0, r"count True is not a whole number"),
        (1.0, 1.0, r"count 1.0 is not a whole number"),
        (1, 0.0, r"period 0.0 s is not a positive whole number of milliseconds"),
        (1, 0.0005, r"period 0.0005 s is not a positive whole number of milliseconds"),
        (1, 17000000.001, r"milliseconds; expected e\.g\. 1, 0\.5 or 0\.001 seconds"),
    ],
)
def test_bad_rate_values(count: object, period: float, names: str) -> None:
    with pytest.raises(RateSpecError, match=names):
        Rate(count, period)  # type: ignore[arg-type]  # bad on purpose


def test_code_and_str() -> None:
    assert [r.code for r in Rate.parse("100/minute; 7/90s; 5/2h; 1/1d")] == [
        "100/1m",
        "7/90s",
        "5/2h",
        "1/1d",
    ]
    assert Rate(7, 1.5).code == "7/1500ms"
    assert str(Rate(100, 60.0)) == "100/minute"
    assert str(Rate(100, 30.0)) == "100/30s"
    month, week, year = Rate.parse("100/month; 10/week; 1000/year")
    assert (str(month), str(week), str(year)) == ("100/month", "10/week", "1000/year")
    # a month is 30 days: the same rate, and so the same store keys, as "100/30d"
    assert month.code == "100/30d" and Rate.parse("100/30d") == (month,)


def test_to_rates_accepts_a_rate_or_a_sequence_and_refuses_the_rest() -> None:
    assert to_rates(Rate(1, 1.0)) == (Rate(1, 1.0),)
    assert to_rates([Rate(1, 1.0), Rate(5, 60.0)]) == (Rate(1, 1.0), Rate(5, 60.0))
    for bad in ([], ["1/second"], 5):
        with pytest.raises(RateSpecError, match=r"must be a rate string, a Rate or a non-empty"):
            to_rates(bad)  # type: ignore[arg-type]  # bad on purpose
    with pytest.raises(RateSpecError, match=r"name the same rate twice"):
        to_rates([Rate(1, 1.0), Rate(1, 1.0)])
    with pytest.raises(RateSpecError, match=r"rate 5 is not a string"):
        Rate.parse(5)  # type: ignore[arg-type]  # bad on purpose


@given(
    st.integers(1, 10**6),
    st.integers(1, 9),
    st.sampled_from(["s", "m", "h", "d", "w", "mo", "y", "week", "month", "year"]),
)
def test_str_and_code_parse_back_to_the_same_rate(count: int, mult: int, unit: str) -> None:
    (rate,) = Rate.parse(f"{count}/{mult}{unit}")
    assert Rate.parse(str(rate)) == (rate,)
    assert Rate.parse(rate.code) == (rate,)


@given(st.text(max_size=30))
def test_any_text_parses_or_raises_rate_spec_error(text: str) -> None:
    try:
        rates = Rate.parse(text)
    except RateSpecError:
        return
    assert rates and all(isinstance(r, Rate) for r in rates)


@pytest.mark.parametrize("period", [0.001, 1.5, 7.25, 30.0, 90.0, 5400.0, 86_400.0, 172_800.0])
def test_code_parses_back_to_the_same_rate(period: float) -> None:
    rate = Rate(7, period)
    assert Rate.parse(rate.code) == (rate,)
