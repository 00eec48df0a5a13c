"""Decision.headers(): X-RateLimit-*, the IETF RateLimit / RateLimit-Policy fields, Retry-After.

The IETF fields follow draft-ietf-httpapi-ratelimit-headers: a structured-field List whose items
are Strings (the policy name) with integer parameters, ``q`` (quota) and ``w`` (window seconds)
in ``RateLimit-Policy``, ``r`` (remaining) and ``t`` in ``RateLimit``: on a rejection that can
succeed ``t`` equals ``Retry-After``, otherwise it is the seconds to the deciding rate's reset.
Every value is also parsed by ``http_sfv`` (an RFC 8941 parser), not only by our regexes.
"""

from __future__ import annotations

import math
import re

import http_sfv
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ratekeeper import Decision, Limiter, ManualClock, Rate
from tests.harness import NAMES, T0, make_limiter, small_rates, timelines

SF_STRING = r'"(?:[\x20\x21\x23-\x5b\x5d-\x7e]|\\["\\])*"'
SF_ITEM = SF_STRING + r"(?:;[a-z*][a-z0-9_.*-]*=-?\d{1,15})*"
SF_LIST = re.compile(rf"^{SF_ITEM}(?:, {SF_ITEM})*$")


def _params(item: str) -> dict[str, int]:
    return {k: int(v) for k, v in re.findall(r";([a-z]+)=(-?\d+)", item)}


def test_allowed_single_rate() -> None:
    limiter, _ = make_limiter(T0 + 0.25)
    d = limiter.hit("k", "100/minute")
    assert d.headers() == {
        "X-RateLimit-Limit": "100",
        "X-RateLimit-Remaining": "99",
        "X-RateLimit-Reset": str(int(T0) + 61),  # 60.25 s from T0, rounded up
        "X-RateLimit-Used": "1",
        "RateLimit-Policy": '"100/1m";q=100;w=60',
        "RateLimit": '"100/1m";r=99;t=60',
    }


def test_rejected_adds_retry_after_rounded_up() -> None:
    limiter, clock = make_limiter()
    limiter.hit("k", "2/second", algorithm="gcra", burst=1)
    clock.advance(0.1)
    d = limiter.hit("k", "2/second", algorithm="gcra", burst=1)
    assert not d.allowed and d.retry_after == 0.4
    h = d.headers()
    assert h["Retry-After"] == "1"
    assert h["X-RateLimit-Remaining"] == "0" and h["X-RateLimit-Used"] == "1"
    assert h["RateLimit"] == '"2/1s";r=0;t=1'


def test_retry_after_is_never_rounded_down() -> None:
    limiter, clock = make_limiter()
    limiter.hit("k", "1/minute", algorithm="sliding_log")
    for waited, header in ((0.001, "60"), (15.3, "45"), (59.0, "1"), (59.999, "1")):
        clock.set(T0 + waited)
        d = limiter.hit("k", "1/minute", algorithm="sliding_log")
        assert d.headers()["Retry-After"] == header
        assert int(header) >= d.retry_after


def test_a_stack_lists_every_policy_and_names_the_deciding_one() -> None:
    limiter, _ = make_limiter()
    limiter.hit("k", "2/second; 100/minute")
    d = limiter.hit("k", "2/second; 100/minute")
    h = d.headers()
    assert h["RateLimit-Policy"] == '"2/1s";q=2;w=1, "100/1m";q=100;w=60'
    assert h["RateLimit"] == '"2/1s";r=0;t=1'
    d = limiter.hit("k", "2/second; 100/minute")
    assert h["RateLimit"] == d.headers()["RateLimit"] and "Retry-After" in d.headers()


def test_policy_quotas_do_not_change_with_the_deciding_rate() -> None:
    # burst applies to every rate of the stack: each holds 50, whichever decides
    limiter, _ = make_limiter()
    policies = set()
    for _ in range(60):
        d = limiter.hit("k", "10/second; 100/minute", algorithm="token_bucket", burst=50)
        policies.add(d.headers()["RateLimit-Policy"])
        assert d.headers()["X-RateLimit-Limit"] == "50"
    assert policies == {'"10/1s";q=50;w=1, "100/1m";q=50;w=60'}


def test_policy_names_are_quoted_and_escaped() -> None:
    limiter, _ = make_limiter()
    d = limiter.hit("k", "5/minute")
    assert d.headers(policy="api")["RateLimit-Policy"] == '"api";q=5;w=60'
    d = limiter.hit("k", "1/second; 5/minute")
    assert d.headers(policy="api")["RateLimit-Policy"] == '"api.1/1s";q=1;w=1, "api.5/1m";q=5;w=60'
    h = d.headers(policy='a "quoted" \\ name')
    assert h["RateLimit"].startswith(r'"a \"quoted\" \\ name.1/1s";')
    assert SF_LIST.match(h["RateLimit"]) and SF_LIST.match(h["RateLimit-Policy"])


def test_sub_second_windows_still_give_whole_seconds() -> None:
    limiter, _ = make_limiter()
    d = limiter.hit("k", Rate(10, 0.25))
    h = d.headers()
    assert h["RateLimit-Policy"] == '"10/250ms";q=10;w=1'
    assert h["RateLimit"] == '"10/250ms";r=9;t=1'


def test_degraded_decision_has_plain_headers() -> None:
    rate = Rate(5, 60.0)
    d = Decision(True, 5, 5, T0 + 60, 0.0, rate, (rate,), T0, degraded=True)
    assert d.used == 0
    assert d.headers()["RateLimit"] == '"5/1m";r=5;t=60'


@given(st.data())
def test_headers_agree_with_the_decision(data: st.DataObject) -> None:
    algorithm = data.draw(st.sampled_from(NAMES))
    rates = tuple(
        data.draw(st.lists(small_rates, min_size=1, max_size=3, unique_by=lambda r: r.period))
    )
    limiter, clock = make_limiter()
    for event in data.draw(timelines(rates[0])):
        clock.set(T0 + event.at_ms / 1000)
        d = limiter.hit("k", rates, algorithm=algorithm, cost=event.cost)
        h = d.headers()
        assert SF_LIST.match(h["RateLimit-Policy"]), h["RateLimit-Policy"]
        assert SF_LIST.match(h["RateLimit"]), h["RateLimit"]
        items = h["RateLimit-Policy"].split(", ")
        assert len(items) == len(rates)
        for item, rate in zip(items, rates, strict=True):
            assert item.startswith(f'"{rate.code}";')
            assert _params(item)["w"] == max(1, math.ceil(rate.period))
        assert h["RateLimit"].startswith(f'"{d.rate.code}";')
        r, t = _params(h["RateLimit"])["r"], _params(h["RateLimit"])["t"]
        assert r == d.remaining == int(h["X-RateLimit-Remaining"]) >= 0
        assert int(h["X-RateLimit-Used"]) == d.limit - d.remaining
        assert int(h["X-RateLimit-Reset"]) >= d.reset_at > int(h["X-RateLimit-Reset"]) - 1
        if d.allowed or math.isinf(d.retry_after):
            assert "Retry-After" not in h
            assert t == max(0, math.ceil(d.reset_at - d.now - 1e-9))
        else:
            retry = int(h["Retry-After"])
            assert retry >= d.retry_after > retry - 1
            assert t == retry
        _sf_parse(h)


def _sf_parse(headers: dict[str, str]) -> None:
    """Both IETF fields parse as RFC 8941 Lists (http_sfv raises on anything else)."""
    for name in ("RateLimit", "RateLimit-Policy"):
        http_sfv.List().parse(headers[name].encode("ascii"))


@pytest.mark.parametrize("algorithm", NAMES)
def test_t_equals_retry_after_when_nothing_is_left(algorithm: str) -> None:
    # 2 per 2 s: the refilling algorithms have one unit back after 1 s and all after 2 s, so a
    # t meaning "full reset" pointed later than Retry-After (t=2, Retry-After: 1)
    clock = ManualClock(start=T0)
    limiter = Limiter(clock=clock)
    rate = Rate(2, 2.0)
    for _ in range(2):
        assert limiter.hit("k", rate, algorithm=algorithm).allowed
    clock.advance(0.25)
    d = limiter.hit("k", rate, algorithm=algorithm)
    assert not d.allowed and d.remaining == 0
    h = d.headers()
    assert _params(h["RateLimit"])["t"] == int(h["Retry-After"]) >= d.retry_after


@pytest.mark.parametrize("algorithm", NAMES)
def test_t_equals_retry_after_when_the_cost_exceeds_what_is_left(algorithm: str) -> None:
    clock = ManualClock(start=T0)
    limiter = Limiter(clock=clock)
    rate = Rate(4, 4.0)
    assert limiter.hit("k", rate, algorithm=algorithm).allowed
    d = limiter.hit("k", rate, algorithm=algorithm, cost=4)
    assert not d.allowed and d.remaining == 3
    h = d.headers()
    assert _params(h["RateLimit"])["t"] == int(h["Retry-After"])
    _sf_parse(h)


@pytest.mark.parametrize(
    ("name", "sent"),
    [
        ("café", '"caf%C3%A9"'),
        ("edge/city=東京", '"edge/city=%E6%9D%B1%E4%BA%AC"'),
        ("100%", '"100%25"'),  # % itself is escaped, so the mapping is injective
        ("tab\there", '"tab%09here"'),
        ('say "hi" \\ ok', r'"say \"hi\" \\ ok"'),
    ],
)
def test_names_outside_printable_ascii_are_percent_encoded(name: str, sent: str) -> None:
    limiter, _ = make_limiter()
    h = limiter.hit("k", "5/minute").headers(policy=name)
    assert h["RateLimit"].startswith(sent + ";")
    assert h["RateLimit-Policy"].startswith(sent + ";")
    for value in h.values():
        assert value.isascii() and value.isprintable()
    _sf_parse(h)
    parsed = http_sfv.List()
    parsed.parse(h["RateLimit"].encode("ascii"))
    assert parsed[0].value == sent[1:-1].replace('\\"', '"').replace("\\\\", "\\")


@given(st.text(min_size=1, max_size=30))
def test_any_name_gives_valid_structured_fields(name: str) -> None:
    limiter, _ = make_limiter()
    h = limiter.hit("k", "1/second; 5/minute").headers(policy=name)
    for value in h.values():
        assert value.isascii() and value.isprintable()
    _sf_parse(h)


def test_header_values_match_headers_whatever_objects_carry_the_rates() -> None:
    """``header_values`` finds the policy's names by the identity of the stack and rate; equal
    rates in other objects, and other policies or limits, still get their own names."""
    from ratekeeper.decision import HEADER_NAMES, _names

    for policy in (None, "api", "ä/β"):
        for limit in (5, 7):
            a, b = Rate(5, 60.0), Rate(100, 3600.0)
            stack = (a, b)
            for rate in (Rate(5, 60.0), a, b):  # an equal rate in another object, then the stack's
                d = Decision(False, limit, 0, 1_700_000_060.0, 12.5, rate, stack, 1_700_000_047.5)
                values = d.header_values(policy)
                assert dict(zip(HEADER_NAMES, values, strict=True)) == d.headers(policy)
                deciding, quota_policy = _names(policy, stack, rate, limit, ())
                assert values[4] == quota_policy and values[5].startswith(deciding + ";r=0;")
                assert values[6] == "13"
