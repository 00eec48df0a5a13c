"""Every header family read into one shape; hostile input is never an exception."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from ratekeeper import Decision, Limiter, ManualClock, Rate
from ratekeeper.client.headers import (
    Quota,
    duration,
    header_map,
    instant,
    read,
    reset_value,
    retry_after,
)
from ratekeeper.client.structured import parse_list

NOW = 1_700_000_000.0


def test_ratekeeper_own_headers_are_read_as_sent() -> None:
    clock = ManualClock(NOW)
    limiter = Limiter(clock=clock)
    decision: Decision = limiter.hit("k", "10/1m; 100/1h", algorithm="fixed_window")
    seen = read(header_map(decision.headers("api").items()), NOW)
    assert seen.family == "ietf"
    quotas = {q.name: q for q in seen.quotas}
    assert quotas["api.10/1m"] == Quota("api.10/1m", "requests", 10, 60.0, 9, 60.0)
    assert quotas["api.100/1h"] == Quota("api.100/1h", "requests", 100, 3600.0)


def test_ietf_units_partition_keys_and_a_rejection() -> None:
    headers = {
        "ratelimit-policy": '"day";q=1000;w=86400;qu="content-bytes";pk=:AQI=:, "burst";q=5;w=1',
        "ratelimit": '"day";r=0;t=3600;pk=:AQI=:',
        "retry-after": "3600",
    }
    seen = read(headers, NOW)
    day = next(q for q in seen.quotas if q.name == "day")
    assert (day.unit, day.limit, day.remaining, day.reset_seconds) == (
        "content-bytes",
        1000,
        0,
        3600,
    )
    assert day.partition == "0102"
    assert seen.retry_after_seconds == 3600


def test_the_earlier_drafts_fields() -> None:
    headers = {"ratelimit-limit": "50", "ratelimit-remaining": "7", "ratelimit-reset": "12"}
    (quota,) = read(headers, NOW).quotas
    assert (quota.limit, quota.remaining, quota.reset_seconds) == (50, 7, 12.0)


def test_github_epoch_reset_and_resource() -> None:
    headers = {
        "x-ratelimit-limit": "5000",
        "x-ratelimit-remaining": "4999",
        "x-ratelimit-reset": str(int(NOW) + 3600),
        "x-ratelimit-used": "1",
        "x-ratelimit-resource": "search",
    }
    seen = read(headers, NOW)
    assert seen.family == "x-ratelimit"
    assert seen.quotas == (Quota("search", "requests", 5000, None, 4999, 3600.0),)


def test_x_ratelimit_reset_in_seconds_or_milliseconds() -> None:
    assert reset_value("30", NOW) == 30.0
    assert reset_value(str(int(NOW * 1000) + 1500), NOW) == 1.5
    assert reset_value(str(int(NOW) - 10), NOW) == 0.0  # a past epoch: now
    assert reset_value("soon", NOW) is None


def test_openai_durations() -> None:
    assert duration("6m0s") == 360.0
    assert duration("1s") == 1.0
    assert duration("20ms") == 0.02
    assert duration("1h2m3.5s") == 3723.5
    assert duration("0.5") == 0.5
    for bad in ("", "6x", "m", "1s2", "-1s", "1e9s", "nan"):
        assert duration(bad) is None, bad
    headers = {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "59",
        "x-ratelimit-reset-requests": "1s",
        "x-ratelimit-limit-tokens": "150000",
        "x-ratelimit-remaining-tokens": "149984",
        "x-ratelimit-reset-tokens": "6ms",
    }
    seen = read(headers, NOW)
    assert seen.family == "openai"
    assert [(q.name, q.unit, q.remaining, q.reset_seconds, q.refills) for q in seen.quotas] == [
        ("requests", "requests", 59, 1.0, True),
        ("tokens", "tokens", 149984, 0.006, True),
    ]


def test_anthropic_rfc3339_resets() -> None:
    headers = {
        "anthropic-ratelimit-requests-limit": "50",
        "anthropic-ratelimit-requests-remaining": "49",
        "anthropic-ratelimit-requests-reset": "2023-11-14T22:13:21Z",
        "anthropic-ratelimit-input-tokens-limit": "40000",
        "anthropic-ratelimit-input-tokens-remaining": "39000",
        "anthropic-ratelimit-input-tokens-reset": "2023-11-14T22:13:50+00:00",
    }
    seen = read(headers, NOW)
    assert seen.family == "anthropic"
    quotas = {q.name: q for q in seen.quotas}
    assert quotas["requests"].reset_seconds == 1.0
    assert quotas["input-tokens"].unit == "tokens"
    assert quotas["input-tokens"].reset_seconds == 30.0
    assert instant("yesterday", NOW) is None


def test_retry_after_seconds_and_http_dates() -> None:
    assert retry_after("120", NOW) == 120.0
    assert retry_after("Tue, 14 Nov 2023 22:14:20 GMT", NOW) == 60.0
    assert retry_after("Tue, 14 Nov 2023 22:00:00 GMT", NOW) == 0.0  # past: now
    assert retry_after("-5", NOW) is None
    assert retry_after("Tuesday", NOW) is None
    assert read({"retry-after": "7"}, NOW).retry_after_seconds == 7.0


def test_contradictions_are_made_consistent_or_dropped() -> None:
    # remaining above limit: cut to the limit; a zero window: no window
    (q,) = read({"ratelimit-policy": '"a";q=5;w=0', "ratelimit": '"a";r=9;t=1'}, NOW).quotas
    assert (q.limit, q.window_seconds, q.remaining) == (5, None, 5)
    # negative, fractional, enormous or non-numeric: dropped
    assert read({"x-ratelimit-limit": "-1", "x-ratelimit-remaining": "x"}, NOW).quotas == ()
    assert read({"x-ratelimit-limit": "1" * 30}, NOW).quotas == ()
    assert read({"ratelimit": '"a";r=-3;t=1'}, NOW).quotas == ()
    assert read({"ratelimit": '"a";r=1.5;t=1e9'}, NOW).quotas == ()  # not a structured field


def test_structured_lists() -> None:
    assert parse_list('"a";q=1, b;x=?0;y=:AA==:, ("x" "y");z') == [
        ("a", {"q": 1}),
        ("b", {"x": False, "y": b"\x00"}),
    ]
    assert parse_list('"a", ') is None  # a trailing comma
    assert parse_list('"unterminated') is None
    assert parse_list("1234567890123456") is None  # 16 digits
    assert parse_list("1.2345") is None
    assert parse_list("x" * 5000) is None
    assert parse_list("") == []


HEADER_NAMES = [
    "ratelimit-policy", "ratelimit", "ratelimit-limit", "ratelimit-remaining", "ratelimit-reset",
    "x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset", "x-ratelimit-resource",
    "x-ratelimit-reset-after", "retry-after", "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens",
    "anthropic-ratelimit-requests-limit", "anthropic-ratelimit-requests-remaining",
    "anthropic-ratelimit-requests-reset",
]  # fmt: skip
FRAGMENTS = st.sampled_from(
    ['"a"', "b", ";q=", ";w=", ";r=", ";t=", ";pk=", ";qu=", "=", ",", " ", "-", "1", "0",
     "99999999999999", "1.5", ":AQ==:", "?1", "(", ")", '"', "\\", "s", "ms", "m", "h",
     "T", "Z", "2024-01-01", "GMT", "Tue, 14 Nov 2023 22:14:20 GMT", "\x00", "é", "nan"]
)  # fmt: skip
VALUES = st.one_of(st.text(max_size=40), st.lists(FRAGMENTS, max_size=12).map("".join))


@given(st.dictionaries(st.sampled_from(HEADER_NAMES), VALUES, max_size=8), st.floats(0, 4e9))
def test_no_header_is_an_exception_and_every_quota_is_consistent(
    headers: dict[str, str], now: float
) -> None:
    seen = read(headers, now)
    for quota in seen.quotas:
        for value in (quota.limit, quota.remaining):
            assert value is None or 0 <= value <= 10**15
        for seconds in (quota.window_seconds, quota.reset_seconds):
            assert seconds is None or (math.isfinite(seconds) and 0 <= seconds <= 10**8)
        assert quota.window_seconds != 0
        if quota.limit is not None and quota.remaining is not None:
            assert quota.remaining <= quota.limit
    wait = seen.retry_after_seconds
    assert wait is None or (math.isfinite(wait) and 0 <= wait <= 10**8)


@given(st.text(max_size=200))
def test_any_text_is_a_list_or_none(text: str) -> None:
    parsed = parse_list(text)
    assert parsed is None or isinstance(parsed, list)


@given(st.integers(1, 10**6), st.sampled_from(["second", "minute", "hour", "day"]))
def test_every_decision_ratekeeper_sends_is_read_back(count: int, unit: str) -> None:
    clock = ManualClock(NOW)
    rate = Rate.parse(f"{count}/{unit}")[0]
    decision = Limiter(clock=clock).hit("k", rate)
    (quota,) = read(header_map(decision.headers().items()), NOW).quotas
    assert (quota.limit, quota.remaining, quota.window_seconds) == (count, count - 1, rate.period)
