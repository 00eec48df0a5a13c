"""Whose counter each level of a nested call is: its own, whatever strings a client chose.

An inner level's counter is named by the outer key, the level (its name, and which level of
that name it is) and its key, so no key a client sends at one level can select another
level's counter, and no two keys can collapse two levels into one:

1. The issue's reproductions on every store: a key level keyed by another user's name
   spends nothing of that user's budget; a request whose user and key are the same string is
   charged on every level (no ``ConfigError``, no level skipped).
2. A property test: levels keyed by arbitrary client strings (equal, overlapping, empty, one
   a prefix of another, escapes and separators), named as the middleware, the service and the
   library name them, decide on every store exactly as a model in which every (level, key)
   has a counter of its own.
3. A cost above 10**12 is refused with the documented ``ConfigError``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ratekeeper import AsyncLimiter, ConfigError, Limiter, ManualClock, MemoryStore
from ratekeeper.middleware import CheckLevel, NestedCheck, keys
from ratekeeper.middleware.request import RequestInfo
from ratekeeper.nested import Level
from ratekeeper.service import config
from ratekeeper.service.engine import Engine
from ratekeeper.service.metrics import Metrics
from tests.nested_stores import NESTED_STORES, close, nested_store

START = 1_699_999_980.0  # on a minute of the epoch


def org_user_key(user: str, key: str, org: str = "acme") -> list[Level]:
    """The middleware's levels for one request (``CheckLevel.level`` names them)."""
    check = NestedCheck(
        "llm",
        [
            CheckLevel("org", "100/minute", key=keys.header("x-org")),
            CheckLevel("user", "3/minute", key=keys.header("x-user")),
            CheckLevel("key", "2/minute", key=keys.header("x-api-key")),
        ],
    )
    headers = {"x-org": org, "x-user": user, "x-api-key": key}
    levels = check.levels_of(RequestInfo("GET", "/", None, None, headers.get, {}))
    assert levels is not None
    return levels


@pytest.mark.parametrize("kind", NESTED_STORES)
def test_a_key_level_cannot_spend_a_users_budget(kind: str, request: pytest.FixtureRequest) -> None:
    """Issue 36, 1: ``x-user: eve, x-api-key: ann`` twice used to leave user ann at 0 of 3."""
    store = nested_store(kind, request)
    limiter = Limiter(store, clock=ManualClock(START), fail_open=False)
    for _ in range(2):
        assert limiter.nested(org_user_key("eve", "ann")).allowed
    d = limiter.nested(org_user_key("ann", "a1"))
    assert d.allowed and [x.remaining for x in d.levels] == [97, 2, 1]
    assert d.headers()["RateLimit"] == '"llm.key";r=1;t=60'
    assert limiter.nested(org_user_key("eve", "ann")).levels[2].remaining == 0  # ann's key: 2 of 2
    close(store)


@pytest.mark.parametrize("kind", NESTED_STORES)
def test_equal_user_and_key_charge_every_level(kind: str, request: pytest.FixtureRequest) -> None:
    """Issue 36, 2: ``x-user: same, x-api-key: same`` used to raise ``ConfigError`` (and the
    middleware failed open): now each level is charged on its own counter."""
    store = nested_store(kind, request)
    limiter = Limiter(store, clock=ManualClock(START), fail_open=False)
    seen = [limiter.nested(org_user_key("same", "same")) for _ in range(4)]
    assert [d.allowed for d in seen] == [True, True, False, False]
    assert [x.remaining for x in seen[1].levels] == [98, 1, 0]
    assert seen[2].rejected_by == 2  # the key level (2/minute), the user still has 1
    assert limiter.nested(org_user_key("other", "k"), cost=0).levels[0].remaining == 98
    close(store)


@pytest.mark.parametrize("kind", ["memory", "redis", "cluster-compact"])
def test_unnamed_levels_with_one_key_are_counters_of_their_own(
    kind: str, request: pytest.FixtureRequest
) -> None:
    """The library: the same key at two unnamed inner levels of one window is two counters,
    each charged as written (it was refused: ``level 2 repeats level 1``)."""
    store = nested_store(kind, request)
    limiter = Limiter(store, clock=ManualClock(START), fail_open=False)
    levels = [Level("o", "9/minute"), Level("u", "5/minute"), Level("u", "2/minute")]
    seen = [limiter.nested(levels) for _ in range(3)]
    assert [d.allowed for d in seen] == [True, True, False]
    assert [x.remaining for x in seen[1].levels] == [7, 3, 0]
    assert limiter.nested(levels[:2], cost=0).levels[1].remaining == 3  # level 1's own counter
    close(store)


@pytest.mark.parametrize("kind", ["memory", "redis", "redis-compact", "cluster"])
def test_names_that_spell_a_repeat_are_levels_of_their_own(
    kind: str, request: pytest.FixtureRequest
) -> None:
    """A level named ``a#1``, the second level named ``a`` and names holding ``%`` or ``>``
    never share a counter (a label is written injectively)."""
    store = nested_store(kind, request)
    limiter = Limiter(store, clock=ManualClock(START), fail_open=False)
    names = ["a#1", "a", "a", "a%231", "%", "%25", ">", "%3E", None, None]
    levels = [Level("o", "99/minute")] + [
        Level("k", f"{n}/minute", name=name) for n, name in enumerate(names, 2)
    ]
    d = limiter.nested(levels)
    assert [x.remaining for x in d.levels] == [98] + [n - 1 for n in range(2, 12)]
    close(store)


# ---------------------------------------------------------------- the property

CLIENT = st.sampled_from(
    ["", "a", "ab", "a:b", "b", "ab:", ":", "a>b", ">", "%3E", "#", "#1", "a#1", "{a}", "}", "é"]
)
"""Client strings that are equal, empty, prefixes of each other, or spell our separators."""
NAMINGS = ("middleware", "service", "service-one-policy", "library")
LIMITS = (4, 3, 2, 3)
"""Each level's count per minute, all fixed_window of one minute: one state slot for all, so
only the naming keeps their counters apart."""

SERVICE = """\
policies:
  l0: {rate: 4/minute}
  l1: {rate: 3/minute}
  l2: {rate: 2/minute}
  l3: {rate: 3/minute}
  same: {rate: 3/minute}
"""


def raw_header(name: str) -> Callable[[RequestInfo], str | None]:
    """A key function answering the header as sent, the empty string too."""
    return lambda request: request.header(name)


def namer(naming: str, depth: int) -> Callable[[list[str]], list[Level]]:
    """The levels a surface builds from one request's client strings, outermost first."""
    if naming == "middleware":
        check = NestedCheck(
            "c",
            [
                CheckLevel(f"l{i}", f"{n}/minute", key=raw_header(f"h{i}"))
                for i, n in enumerate(LIMITS[:depth])
            ],
        )

        def middleware(strings: list[str]) -> list[Level]:
            headers = {f"h{i}": s for i, s in enumerate(strings)}
            levels = check.levels_of(RequestInfo("GET", "/", None, None, headers.get, {}))
            assert levels is not None
            return levels

        return middleware
    if naming.startswith("service"):
        engine = Engine(config.parse_text(SERVICE), AsyncLimiter(), Metrics(), ManualClock(0))
        one = naming == "service-one-policy"  # the same policy at every inner level

        def service(strings: list[str]) -> list[Level]:
            raw = [
                {"policy": "same" if i and one else f"l{i}", "key": s or "-", "cost": None}
                for i, s in enumerate(strings)
            ]
            if one:
                for item in raw[1:]:  # 3/minute at every inner level
                    item["cost"] = 1
            return engine.nested.levels(raw).levels

        return service

    def library(strings: list[str]) -> list[Level]:
        return [Level(s or "-", f"{LIMITS[i]}/minute") for i, s in enumerate(strings)]

    return library


def limits_of(naming: str, depth: int) -> list[int]:
    if naming == "service-one-policy":
        return [LIMITS[0]] + [3] * (depth - 1)
    return list(LIMITS[:depth])


@pytest.mark.parametrize("kind", NESTED_STORES)
@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    naming=st.sampled_from(NAMINGS),
    depth=st.integers(2, 4),
    calls=st.lists(st.lists(CLIENT, min_size=4, max_size=4), min_size=1, max_size=30),
    advance=st.lists(st.sampled_from([0, 0, 0, 1, 30, 60]), min_size=30, max_size=30),
)
def test_client_chosen_keys_never_share_a_counter_or_skip_a_level(
    kind: str,
    request: pytest.FixtureRequest,
    naming: str,
    depth: int,
    calls: list[list[str]],
    advance: list[int],
) -> None:
    """Every (level, key) is a counter of its own (level 0: the outer key's; a level below:
    inside the outer key's), charged on every admitted call, whatever the strings."""
    store = nested_store(kind, request)
    clock = ManualClock(START)
    limiter = Limiter(store, clock=clock, fail_open=False)
    build = namer(naming, depth)
    limits = limits_of(naming, depth)
    model: dict[tuple[Any, ...], tuple[int, float]] = {}  # counter -> (count, window's end)

    def used(counter: tuple[Any, ...]) -> int:
        count, end = model.get(counter, (0, 0.0))
        return count if clock() < end else 0

    try:
        for strings, seconds in zip(calls, advance, strict=False):
            clock.advance(seconds)
            strings = strings[:depth]
            outer = strings[0] or "-"
            inner = [("in", outer, i, s) for i, s in enumerate(strings)][1:]
            counters: list[tuple[Any, ...]] = [("outer", outer), *inner]
            before = [used(c) for c in counters]
            admit = all(u + 1 <= n for u, n in zip(before, limits, strict=True))
            d = limiter.nested(build(strings))
            assert d.allowed == admit, (strings, before)
            if admit:  # each counter charged; a window opens at its first charge
                for c, u in zip(counters, before, strict=True):
                    end = model[c][1] if u and c in model else clock() + 60
                    model[c] = (u + 1, end)
            after = [used(c) for c in counters]
            assert [x.remaining for x in d.levels] == [
                n - u for n, u in zip(limits, after, strict=True)
            ]
    finally:
        close(store)


# ---------------------------------------------------------------- costs in range


@pytest.mark.parametrize("cost", [10**12 + 1, 10**15])
def test_a_cost_above_10_12_is_refused(cost: int) -> None:
    """Issue 36, 5: it was a rejection with ``retry_after=inf``; the docs promise a
    ``ConfigError``, for the call's cost and a level's own, sync and async."""
    levels = [Level("org", "10/minute"), Level("key:k1", "5/minute")]
    limiter = Limiter(MemoryStore(), clock=ManualClock(START))
    with pytest.raises(ConfigError, match="from 0 to 1_000_000_000_000"):
        limiter.nested(levels, cost=cost)
    with pytest.raises(ConfigError, match="from 0 to 1_000_000_000_000"):
        limiter.nested([levels[0], Level("key:k1", "5/minute", cost=cost)])
    with pytest.raises(ConfigError, match="from 0 to 1_000_000_000_000"):
        limiter.refund_nested(levels, cost=cost)
    alimiter = AsyncLimiter(clock=ManualClock(START))
    with pytest.raises(ConfigError, match="from 0 to 1_000_000_000_000"):
        asyncio.run(alimiter.nested(levels, cost=cost))
    assert limiter.nested(levels, cost=10**12).retry_after == float("inf")  # in range: never
    assert limiter.nested(levels, cost=0).levels[0].remaining == 10  # nothing was charged
