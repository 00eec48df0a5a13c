"""Plans meet the application's functions: a rate function may return a plan's limit (counted
under the tenant's key, answered with the plan's status), one that names no limit of the plans
is the function's error (counted, logged, raised with ``on_error="raise"``) as a rate that is
no rate is, and so is a key function raising on the status route; a check's own message is
the problem details' ``detail``. ASGI and WSGI, through their frameworks' test clients."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from starlette.testclient import TestClient
from werkzeug.test import Client

from ratekeeper import ConfigError, ManualClock
from ratekeeper.middleware import (
    RateCheck,
    RateLimitMiddleware,
    RequestInfo,
    WSGIRateLimitMiddleware,
    keys,
)
from ratekeeper.quotas import Plans, Quotas

PLANS = Plans.from_dict(
    {
        "default": "free",
        "plans": {
            "free": {"exports": {"rate": "2/calendar-month", "status": 403}},
            "pro": {"exports": "100/calendar-month"},
        },
        "customers": {"acme": "pro"},
    }
)
NOW = datetime(2026, 3, 20, 12, tzinfo=UTC).timestamp()

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


async def asgi_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def wsgi_app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]


class Answer:
    """A response from either test client: status, headers, JSON body."""

    def __init__(self, status: int, headers: Any, body: bytes) -> None:  # case-insensitive
        self.status, self.headers, self.body = status, headers, body

    def json(self) -> Any:
        return json.loads(self.body)


Get = Callable[..., Answer]


def client_of(kind: str, checks: list[RateCheck], **options: Any) -> tuple[Any, Get]:
    """The middleware of ``kind`` over ``checks`` and a ``get(path, **headers)``."""
    options = {"clock": ManualClock(NOW), "quotas": Quotas(PLANS), **options}
    if kind == "asgi":
        asgi = RateLimitMiddleware(asgi_app, checks, **options)
        client = TestClient(asgi)

        def get_asgi(path: str, headers: dict[str, str] | None = None) -> Answer:
            r = client.get(path, headers=headers or {})
            return Answer(r.status_code, r.headers, r.content)

        return asgi, get_asgi
    wsgi = WSGIRateLimitMiddleware(wsgi_app, checks, **options)
    wclient = Client(wsgi)

    def get_wsgi(path: str, headers: dict[str, str] | None = None) -> Answer:
        r = wclient.get(path, headers=headers or {})
        return Answer(r.status_code, r.headers, r.data)

    return wsgi, get_wsgi


KINDS = ["asgi", "wsgi"]


def returning(rate: str) -> Callable[[RequestInfo], str]:
    """A rate function answering ``rate`` for every request."""
    return lambda request: rate


@pytest.mark.parametrize("kind", KINDS)
def test_a_rate_function_may_return_a_plans_limit(kind: str) -> None:
    check = RateCheck(
        "exports", returning("plan:exports"), key=keys.header("X-API-Key"), message="Upgrade."
    )
    middleware, get = client_of(kind, [check])
    free = {"X-API-Key": "initech", "Accept": "application/problem+json"}
    assert [get("/", free).status for _ in range(2)] == [200, 200]
    r = get("/", free)
    assert r.status == 403  # the free plan's status
    assert r.headers["Content-Type"] == "application/problem+json"
    body = r.json()
    assert (body["status"], body["detail"], body["message"]) == (403, "Upgrade.", "Upgrade.")
    assert get("/", {"X-API-Key": "acme"}).status == 200  # pro: 100 a month
    # counted under the tenant's key, as a fixed "plan:exports" counts it
    status = middleware.limiter.status("initech")
    if kind == "asgi":
        import asyncio

        status = asyncio.run(status)
    assert [(row.name, row.used) for row in status] == [("exports", 2)]
    assert middleware.stats()["user_errors"] == {}


@pytest.mark.parametrize("kind", KINDS)
def test_a_rate_function_naming_no_plan_limit_errs_as_a_function_does(kind: str) -> None:
    check = RateCheck("c", returning("plan:nope"), key=keys.header("X-API-Key"))
    middleware, get = client_of(kind, [check])
    assert [get("/", {"X-API-Key": "acme"}).status for _ in range(3)] == [200] * 3
    assert middleware.stats()["user_errors"] == {"c": {"rate": 3}}
    assert middleware.stats()["checks"]["c"]["failed_open"] == 3
    _, get = client_of(kind, [check], on_error="raise")
    with pytest.raises(ConfigError, match="'plan:nope' names no limit"):
        get("/", {"X-API-Key": "acme"})
    _, get = client_of(kind, [check], quotas=None)
    _, raising = client_of(kind, [check], quotas=None, on_error="raise")
    assert get("/", {"X-API-Key": "acme"}).status == 200
    with pytest.raises(ConfigError, match="has no plans"):
        raising("/", {"X-API-Key": "acme"})


def broken(request: RequestInfo) -> str:
    raise KeyError("no such header")


@pytest.mark.parametrize("kind", KINDS)
def test_a_key_function_raising_on_the_status_route_is_the_functions_error(kind: str) -> None:
    checks = [
        RateCheck("exports", "plan:exports", key=keys.header("X-API-Key")),
        RateCheck("bad", "10/minute", key=broken),
    ]
    middleware, get = client_of(kind, checks, status_path="/rate_limit")
    r = get("/rate_limit", {"X-API-Key": "acme"})
    assert r.status == 200
    assert [row["check"] for row in r.json()["limits"]] == ["exports"]
    assert middleware.stats()["user_errors"] == {"bad": {"key": 1}}
    _, get = client_of(kind, checks, status_path="/rate_limit", on_error="raise")
    with pytest.raises(KeyError, match="no such header"):
        get("/rate_limit", {"X-API-Key": "acme"})
