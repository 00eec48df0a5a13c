"""The HTTP API's hand-built decision body is exactly what ``json.dumps`` makes of the same
fields, and ``Decision.headers`` (with its cached policy names) matches a direct computation."""

from __future__ import annotations

import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from ratekeeper.decision import ascii_name, make_decision
from ratekeeper.rates import Rate
from ratekeeper.service.engine import Result
from ratekeeper.service.http.render import _result_body, _result_json

RATES = [Rate(5, 60.0), Rate(2, 1.0), Rate(1000, 3600.0), Rate(7, 30.0)]
floats = st.floats(min_value=0, max_value=4e9, allow_nan=False)


@settings(max_examples=300, deadline=None)
@given(
    allowed=st.booleans(),
    limit=st.integers(0, 2**53),
    remaining=st.integers(-5, 2**53),
    reset_at=floats,
    retry_after=st.one_of(floats, st.just(math.inf)),
    policy=st.text(max_size=40),
    degraded=st.booleans(),
    shadow=st.booleans(),
)
def test_result_body_is_json_dumps_of_the_fields(
    allowed: bool,
    limit: int,
    remaining: int,
    reset_at: float,
    retry_after: float,
    policy: str,
    degraded: bool,
    shadow: bool,
) -> None:
    rate = RATES[0]
    d = make_decision(
        allowed, limit, remaining, reset_at, retry_after, rate, (rate,), 1.0, degraded=degraded
    )
    result = Result(d, policy, shadow=shadow)
    expected = json.dumps(_result_json(result), separators=(",", ":"), allow_nan=False).encode()
    assert _result_body(result) == expected


@settings(max_examples=200, deadline=None)
@given(
    stack=st.lists(st.sampled_from(RATES), min_size=1, max_size=3, unique=True),
    pick=st.integers(0, 2),
    limit=st.integers(1, 10**6),
    remaining=st.integers(0, 10**6),
    policy=st.one_of(st.none(), st.text(max_size=10)),
    quotas=st.booleans(),
)
def test_headers_policy_fields_follow_the_stack(
    stack: list[Rate], pick: int, limit: int, remaining: int, policy: str | None, quotas: bool
) -> None:
    rate = stack[pick % len(stack)]
    q = tuple(r.count + 1 for r in stack) if quotas else ()
    d = make_decision(True, limit, remaining, 100.0, 0.0, rate, tuple(stack), 40.0, quotas=q)
    headers = d.headers(policy)

    def name(r: Rate) -> str:
        text = r.code if policy is None else (policy if len(stack) == 1 else f"{policy}.{r.code}")
        return '"' + ascii_name(text).replace("\\", "\\\\").replace('"', '\\"') + '"'

    def quota(r: Rate) -> int:
        return q[stack.index(r)] if q else limit if r == rate else r.count

    expected = ", ".join(f"{name(r)};q={quota(r)};w={math.ceil(r.period)}" for r in stack)
    assert headers["RateLimit-Policy"] == expected
    assert headers["RateLimit"] == f"{name(rate)};r={remaining};t=60"
    assert headers["X-RateLimit-Used"] == str(limit - remaining)
