"""Nested calls and reservations beside quotas' features: calendar rates (their window end sent
per call, a reservation settled in the next period), counters named by window (a level
repeating a key), 0.1's key names read during an upgrade (``legacy_keys``), plan limits
refused as levels, quota units (``Rate.unit`` beside a check's ``unit=``) and problem details
for a nested rejection."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
import redis
from starlette.testclient import TestClient

from ratekeeper import ConfigError, Limiter, ManualClock, MemoryStore, Rate, RedisStore
from ratekeeper.middleware import (
    CheckLevel,
    NestedCheck,
    RateCheck,
    RateLimitMiddleware,
    keys,
)
from ratekeeper.nested import Level
from ratekeeper.stores.redis.keys import redis_key
from tests.nested_stores import NESTED_STORES, close, nested_store

JAN_END = datetime(2026, 1, 31, 23, 58, tzinfo=UTC).timestamp()
FEB = datetime(2026, 2, 1, tzinfo=UTC).timestamp()
MAR = datetime(2026, 3, 1, tzinfo=UTC).timestamp()


@pytest.mark.parametrize("kind", NESTED_STORES)
def test_a_calendar_level_resets_at_the_period_end_and_settles_into_the_next(
    kind: str, request: pytest.FixtureRequest
) -> None:
    store = nested_store(kind, request)
    clock = ManualClock(JAN_END)
    limiter = Limiter(store, clock=clock, fail_open=False)
    org = Level("org", "10/calendar-month")
    levels = [org, Level("key:1", "100/minute")]
    d = limiter.nested(levels, cost=4)
    assert d.allowed and d.levels[0].reset_at == FEB and d.levels[0].remaining == 6
    r = limiter.reserve(levels, 3)
    assert r.allowed and r.decision.levels[0].remaining == 3
    clock.advance(180)  # February: January's window, with the estimate in it, is over
    # the 2 units over the estimate go into February's window, which ends on March 1st
    assert limiter.settle(r, 5).status == "settled"
    look = limiter.nested([org], cost=0)
    assert look.levels[0].remaining == 8 and look.levels[0].reset_at == MAR
    assert not limiter.nested([org], cost=9).allowed
    close(store)


@pytest.mark.parametrize("kind", ["memory", "redis", "cluster-compact"])
def test_a_key_may_be_an_outer_and_an_inner_level_each_its_own_counter(
    kind: str, request: pytest.FixtureRequest
) -> None:
    """Counters are named by level: the outer key's own counter and its counter as an inner
    level (scoped under the outer key) are two, and so is one key at two inner levels."""
    store = nested_store(kind, request)
    limiter = Limiter(store, clock=ManualClock(JAN_END), fail_open=False)
    both = [Level("acme", "5/minute"), Level("acme", "2/minute")]
    assert [limiter.nested(both).allowed for _ in range(3)] == [True, True, False]
    assert limiter.hit("acme", "5/minute").remaining == 2  # the outer counter took 2, not 3
    twice = [Level("o", "9/minute"), Level("u", "5/minute"), Level("u", "7/minute")]
    assert [x.remaining for x in limiter.nested(twice).levels] == [8, 4, 6]
    close(store)


def test_legacy_keys_carry_the_outer_levels_count_over(redis_url: str) -> None:
    """During an upgrade from 0.1 (``legacy_keys=True``) a nested call's outer level reads
    its counter from 0.1's name, as ``hit`` does; without it the count starts over."""
    now_ms = 1_700_000_000_000
    client = redis.Redis.from_url(redis_url)
    old = redis_key("rk", "org", "f:5/1m")
    client.set(old, f"3{now_ms + 60_000:013d}", px=61_000)
    levels = [Level("org", "5/minute"), Level("user:1", "9/minute")]
    fresh = Limiter(RedisStore(redis_url, socket_timeout=5), clock=ManualClock(now_ms / 1000))
    assert fresh.nested(levels, cost=0).levels[0].remaining == 5
    store = RedisStore(redis_url, socket_timeout=5, legacy_keys=True)
    limiter = Limiter(store, clock=ManualClock(now_ms / 1000), fail_open=False)
    assert limiter.nested(levels, cost=0).levels[0].remaining == 2
    r = limiter.reserve(levels, 1)
    assert r.allowed and r.decision.levels[0].remaining == 1
    assert limiter.settle(r, 2).status == "settled"  # the extra unit: 6 of 5 (a debt)
    assert not limiter.nested(levels).allowed
    assert limiter.hit("org", "5/minute").remaining == 0
    client.close()


def test_a_plan_limit_is_refused_as_a_level() -> None:
    with pytest.raises(ConfigError, match="names a plan's limit"):
        Limiter().nested([Level("org", "plan:api")])
    with pytest.raises(ConfigError, match="names a plan's limit"):
        NestedCheck("n", [CheckLevel("org", "plan:api")])


def test_one_quota_unit_per_rate() -> None:
    """A rate's ``unit`` is what ``qu`` says; a check's ``unit=`` is the unit of its rates that
    state none, so a check may not contradict its rate, nor give a plan's limit a unit."""
    counted = Rate(10, 60.0, unit="content-bytes")
    with pytest.raises(ConfigError, match="counts 'requests'"):
        RateCheck("a", Rate(10, 60.0, unit="requests"), unit="content-bytes")
    with pytest.raises(ConfigError, match="the plan sets"):
        RateCheck("a", "plan:api", unit="content-bytes")
    RateCheck("a", counted, unit="content-bytes")  # the same unit twice is no contradiction
    with pytest.raises(ConfigError, match="level 'user' of check 'n' has unit='content-bytes' but"):
        NestedCheck(
            "n",
            [CheckLevel("org", counted), CheckLevel("user", Rate(10, 60.0, unit="requests"))],
            unit="content-bytes",
        )  # a nested check's levels are held to its unit as a rate check's rate is
    with pytest.raises(ConfigError, match="counts 'concurrent-requests'"):
        NestedCheck(
            "n",
            [CheckLevel("org", (Rate(5, 1.0), Rate(9, 60.0, unit="concurrent-requests")))],
            unit="content-bytes",
        )
    NestedCheck("n", [CheckLevel("org", counted), CheckLevel("u", "5/s")], unit="content-bytes")
    d = Limiter(clock=ManualClock(JAN_END)).hit("k", [counted, Rate(5, 1.0)])
    assert d.headers("api")["RateLimit-Policy"] == (
        '"api.10/1m";q=10;w=60;qu="content-bytes", "api.5/1s";q=5;w=1'
    )
    assert d.headers("api", "content-bytes")["RateLimit-Policy"] == (
        '"api.10/1m";q=10;w=60;qu="content-bytes", "api.5/1s";q=5;w=1;qu="content-bytes"'
    )


async def _ok(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


@pytest.mark.parametrize("asked", [False, True], ids=["option", "accept"])
def test_a_nested_rejection_as_problem_details(asked: bool) -> None:
    check = NestedCheck(
        "llm",
        [
            CheckLevel("org", "5/minute", key=keys.header("x-org")),
            CheckLevel("user", "1/minute", key=keys.header("x-user")),
        ],
    )
    mw = RateLimitMiddleware(
        _ok, [check], store=MemoryStore(), clock=ManualClock(JAN_END), problem_details=not asked
    )
    client = TestClient(mw)
    headers = {"x-org": "acme", "x-user": "u1"}
    if asked:
        headers["accept"] = "application/problem+json"
    assert client.get("/", headers=headers).status_code == 200
    refused = client.get("/", headers=headers)
    assert refused.status_code == 429
    assert refused.headers["content-type"] == "application/problem+json"
    body = refused.json()
    assert body["type"].endswith("#quota-exceeded") and body["status"] == 429
    assert body["violated-policies"] == ["llm.user"] and body["level"] == "llm.user"
    assert refused.headers["RateLimit-Policy"] == '"llm.user";q=1;w=60'
