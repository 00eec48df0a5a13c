"""A ``NestedCheck`` whose levels are keyed by headers a client chooses, through the ASGI and
WSGI middleware (issue 36): no header spends another level's budget or skips a level, an
app that raises before answering gives every level back, and what is wrong with a level at
request time is the application's function's error, counted in ``user_errors``."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from ratekeeper import ConfigError, Level, Limiter, ManualClock, MemoryStore
from ratekeeper.middleware import (
    CheckLevel,
    NestedCheck,
    RateLimitMiddleware,
    WSGIRateLimitMiddleware,
    keys,
)
from tests.middleware.servers import uvicorn_server, wsgi_server

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

T0 = 1_700_000_040.0
WHO = ("x-org", "x-user", "x-api-key")


def levels(org: str = "5/minute", user: str = "3/minute", key: str = "2/minute") -> NestedCheck:
    """docs/nested.md's header layout: org > user > API key."""
    return NestedCheck(
        "llm",
        [
            CheckLevel("org", org, key=keys.header("x-org")),
            CheckLevel("user", user, key=keys.header("x-user")),
            CheckLevel("key", key, key=keys.header("x-api-key")),
        ],
    )


async def asgi_ok(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def wsgi_ok(environ: Any, start_response: Any) -> Iterable[bytes]:
    start_response("200 OK", [("content-type", "text/plain")])
    return [b"ok"]


@contextmanager
def serving(
    server: str, check: NestedCheck, store: MemoryStore, asgi: Any = None, wsgi: Any = None
) -> Iterator[tuple[Any, httpx.Client]]:
    """The middleware around an app, served by uvicorn (ASGI) or wsgiref (WSGI)."""
    clock = ManualClock(T0)
    if server == "asgi":
        mw: Any = RateLimitMiddleware(asgi or asgi_ok, [check], store=store, clock=clock)
        served = uvicorn_server(mw)
    else:
        mw = WSGIRateLimitMiddleware(wsgi or wsgi_ok, [check], store=store, clock=clock)
        served = wsgi_server(mw)
    with served as base, httpx.Client(base_url=base, timeout=10) as http:
        yield mw, http


def ask(client: httpx.Client, org: str, user: str, key: str) -> tuple[int, str]:
    r = client.get("/", headers=dict(zip(WHO, (org, user, key), strict=True)))
    return r.status_code, r.json()["level"] if r.status_code == 429 else r.headers["RateLimit"]


def left(store: MemoryStore, org: str = "acme", user: str = "ann", key: str = "k1") -> list[int]:
    """Each level's remaining for org > user > key, looked at (the counters' names: the
    check's name and the key, an inner level's inside the org's, named by its level)."""
    probe = [
        Level(f"llm:{org}", "5/minute", cost=0),
        Level(f"llm:{user}", "3/minute", cost=0, name="llm.user"),
        Level(f"llm:{key}", "2/minute", cost=0, name="llm.key"),
    ]
    return [d.remaining for d in Limiter(store, clock=ManualClock(T0)).nested(probe).levels]


@pytest.mark.parametrize("server", ["asgi", "wsgi"])
def test_a_key_header_cannot_spend_another_users_budget(server: str) -> None:
    """Issue 36, 1: ``x-user: eve, x-api-key: ann`` twice left user ann at ``r=0`` of 3."""
    with serving(server, levels(org="100/minute", key="100/minute"), MemoryStore()) as (_, http):
        assert [ask(http, "acme", "eve", "ann")[0] for _ in range(2)] == [200, 200]
        assert ask(http, "acme", "ann", "a1") == (200, '"llm.user";r=2;t=60')


@pytest.mark.parametrize("server", ["asgi", "wsgi"])
def test_equal_user_and_key_are_charged_on_every_level(server: str) -> None:
    """Issue 36, 2: 8 requests with ``x-user: same, x-api-key: same`` all passed (a
    ``ConfigError`` failed open) and the org's 5/minute was never charged."""
    store = MemoryStore()
    with serving(server, levels(), store) as (mw, http):
        seen = [ask(http, "acme", "same", "same") for _ in range(8)]
    assert seen[:2] == [(200, '"llm.key";r=1;t=60'), (200, '"llm.key";r=0;t=60')]
    assert seen[2:] == [(429, "llm.key")] * 6  # the key's 2/minute; the user had 1 more
    stats = mw.stats()
    assert stats["user_errors"] == {} and stats["checks"]["llm"]["failed_open"] == 0
    assert stats["checks"]["llm"]["allowed"] == 2 and stats["checks"]["llm"]["rejected"] == 6
    assert left(store, user="same", key="same") == [3, 1, 0]  # every level charged twice


async def asgi_raises(scope: Any, receive: Any, send: Any) -> None:
    raise RuntimeError("the app failed before answering")


def wsgi_raises(environ: Any, start_response: Any) -> Iterable[bytes]:
    raise RuntimeError("the app failed before answering")


@pytest.mark.parametrize("server", ["asgi", "wsgi"])
def test_an_app_that_raises_before_answering_gives_every_level_back(server: str) -> None:
    """Issue 36, 3: a ``NestedCheck`` without ``actual`` kept its charge (the settling
    variant cancels); docs/nested.md promises every level back."""
    store = MemoryStore()
    with serving(server, levels(), store, asgi_raises, wsgi_raises) as (mw, http):
        for _ in range(3):
            r = http.get("/", headers=dict(zip(WHO, ("acme", "ann", "k1"), strict=True)))
            assert r.status_code == 500
    assert left(store) == [5, 3, 2]
    assert mw.stats()["checks"]["llm"]["allowed"] == 3  # admitted, then given back


def erring(check: Callable[..., NestedCheck], server: str = "asgi") -> dict[str, Any]:
    """Three requests through ``check()``: their statuses and the middleware's stats."""
    with serving(server, check(), MemoryStore()) as (mw, http):
        headers = dict(zip(WHO, ("acme", "ann", "k1"), strict=True))
        got = [http.get("/", headers=headers).status_code for _ in range(3)]
    return {"statuses": got, **mw.stats()}


@pytest.mark.parametrize("server", ["asgi", "wsgi"])
def test_a_cost_above_10_12_is_the_cost_functions_error(server: str) -> None:
    """Issue 36, 5: it was a 429 with ``Retry-After`` of forever; a cost function's answer
    out of range is its error (counted, the request through), a fixed one is refused."""
    huge = 10**12 + 1
    for check in (
        lambda: NestedCheck("llm", [CheckLevel("org", "5/minute", key=keys.header("x-org"))],
                            cost=lambda request: huge),
        lambda: NestedCheck("llm", [CheckLevel("org", "5/minute", key=keys.header("x-org"),
                                               cost=lambda request: huge)]),
    ):  # fmt: skip
        seen = erring(check, server)
        assert seen["statuses"] == [200, 200, 200]
        assert seen["user_errors"] == {"llm": {"cost": 3}}
    with pytest.raises(ConfigError, match="cost=1000000000001 is invalid"):
        NestedCheck("llm", [CheckLevel("org", "5/minute")], cost=huge)
    with pytest.raises(ConfigError, match="cost=1000000000001 is invalid"):
        CheckLevel("org", "5/minute", cost=huge)
    assert erring(lambda: NestedCheck(
        "llm", [CheckLevel("org", "5/minute", key=keys.header("x-org"))], cost=10**12
    ))["statuses"] == [429, 429, 429]  # fmt: skip


@pytest.mark.parametrize(
    "rate",
    [
        "5/calendar-month",  # token_bucket counts no calendar periods
        "5/minute; 9/minute",  # two rates of one window
    ],
)
def test_a_rate_the_levels_algorithm_refuses_is_the_rate_functions_error(rate: str) -> None:
    """A rate function's answer that the level's algorithm and options refuse was a store
    failure (the nested call's ``ConfigError``, failed open uncounted as the app's bug)."""
    seen = erring(lambda: NestedCheck("llm", [
        CheckLevel("org", "100/minute", key=keys.header("x-org")),
        CheckLevel("user", lambda request: rate, key=keys.header("x-user"),
                   algorithm="token_bucket"),
    ]))  # fmt: skip
    assert seen["statuses"] == [200, 200, 200]
    assert seen["user_errors"] == {"llm": {"rate": 3}}
    assert seen["checks"]["llm"]["failed_open"] == 3
