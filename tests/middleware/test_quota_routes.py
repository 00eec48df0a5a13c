"""Plans in the middleware, through real servers (uvicorn, wsgiref): a plan's limit decides per
customer, an exhausted quota answers 403 with Retry-After at the period's end, the draft's
``quota-exceeded`` problem details when asked, ``RateLimit-Policy`` with ``qu``, and the status
route lists a caller's limits without charging anything."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from ratekeeper import ConfigError, ManualClock, RedisStore
from ratekeeper.middleware import RateCheck, RateLimitMiddleware, WSGIRateLimitMiddleware, keys
from ratekeeper.quotas import Plans, Quotas
from tests.middleware.servers import uvicorn_server, wsgi_server

PLANS = Plans.from_yaml("""\
default: free
plans:
  free:
    api: 100/hour
    exports: {rate: 3/calendar-month, status: 403, unit: requests}
  pro:
    api: 5000/hour
    exports: {rate: 1000/calendar-month, timezone: Europe/Berlin, anchor: "15"}
customers:
  acme: pro
""")
NOW = datetime(2026, 3, 20, 12, tzinfo=UTC).timestamp()
APRIL = datetime(2026, 4, 1, tzinfo=UTC).timestamp()


async def asgi_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def wsgi_app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]


def checks() -> list[RateCheck]:
    return [
        RateCheck("api", "plan:api", key=keys.header("X-API-Key")),
        RateCheck("exports", "plan:exports", key=keys.header("X-API-Key"), routes=["/exports"]),
        RateCheck("per-ip", "50/minute"),
    ]


Serve = Callable[..., AbstractContextManager[str]]


@pytest.fixture(params=["asgi", "wsgi"])
def serve(request: pytest.FixtureRequest) -> Serve:
    """Serve the middleware over ``PLANS`` with options; yields the base URL."""

    def start(store: Any = None, **options: Any) -> AbstractContextManager[str]:
        clock = ManualClock(NOW)
        if request.param == "asgi":
            app = RateLimitMiddleware(
                asgi_app, checks(), store=store, clock=clock, quotas=Quotas(PLANS), **options
            )
            return uvicorn_server(app)
        wsgi = WSGIRateLimitMiddleware(
            wsgi_app, checks(), store=store, clock=clock, quotas=Quotas(PLANS), **options
        )
        return wsgi_server(wsgi)

    return start


def test_an_exhausted_quota_answers_403_with_retry_after_at_the_month_end(serve: Serve) -> None:
    with serve() as url, httpx.Client(base_url=url) as client:
        caller = {"X-API-Key": "initech"}
        first = client.post("/exports", headers=caller)
        assert '"exports";q=3;w=2592000;qu="requests"' in first.headers["RateLimit-Policy"]
        assert int(first.headers["X-RateLimit-Reset"]) == APRIL
        assert [client.post("/exports", headers=caller).status_code for _ in range(2)] == [200] * 2
        r = client.post("/exports", headers=caller)
        assert r.status_code == 403
        assert int(r.headers["Retry-After"]) == APRIL - NOW  # the calendar month's true end
        assert r.headers["Content-Type"] == "application/json"
        assert r.json()["error"] == "rate_limited"
        assert client.post("/", headers=caller).status_code == 200  # api: refunded, not spent


def test_problem_details_when_the_client_asks_or_always(serve: Serve) -> None:
    with serve() as url, httpx.Client(base_url=url) as client:
        for _ in range(3):
            client.post("/exports", headers={"X-API-Key": "initech"})
        plain = client.post("/exports", headers={"X-API-Key": "initech", "Accept": "*/*"})
        assert plain.headers["Content-Type"] == "application/json"
        asked = {"X-API-Key": "initech", "Accept": "application/problem+json"}
        r = client.post("/exports", headers=asked)
        assert r.headers["Content-Type"] == "application/problem+json"
        body = r.json()
        assert body["type"] == "https://iana.org/assignments/http-problem-types#quota-exceeded"
        assert (body["status"], body["violated-policies"]) == (403, ["exports"])
        refused = {"X-API-Key": "initech", "Accept": "application/problem+json;q=0"}
        assert client.post("/exports", headers=refused).headers["Content-Type"] == (
            "application/json"
        )
    with serve(problem_details=True) as url, httpx.Client(base_url=url) as client:
        for _ in range(4):
            r = client.post("/exports", headers={"X-API-Key": "initech"})
        assert r.headers["Content-Type"] == "application/problem+json"


def status_rows(client: httpx.Client, api_key: str) -> list[tuple[Any, ...]]:
    r = client.get("/rate_limit", headers={"X-API-Key": api_key})
    assert r.status_code == 200, r.text
    assert r.headers["Cache-Control"] == "no-store"
    return [
        (row["check"], row["name"], row["limit"], row["used"], row["plan"], row["source"])
        for row in r.json()["limits"]
    ]


def test_the_status_route_lists_every_limit_and_charges_nothing(serve: Serve) -> None:
    with serve(status_path="/rate_limit") as url, httpx.Client(base_url=url) as client:
        client.post("/exports", headers={"X-API-Key": "acme"})
        expected = [
            ("api", "api", 5000, 1, "pro", "plan"),
            ("exports", "exports", 1000, 1, "pro", "plan"),
            ("per-ip", "per-ip", 50, 1, "", "rate"),
        ]
        assert status_rows(client, "acme") == expected
        assert status_rows(client, "acme") == expected  # asking twice charged nothing
        rows = client.get("/rate_limit", headers={"X-API-Key": "acme"}).json()["limits"]
        berlin = datetime(2026, 4, 14, 22, tzinfo=UTC).timestamp()  # the 15th, 00:00 CEST
        assert rows[1]["reset"] == berlin
        assert status_rows(client, "initech")[:2] == [
            ("api", "api", 100, 0, "free", "default"),
            ("exports", "exports", 3, 0, "free", "default"),
        ]
        assert client.post("/rate_limit").status_code == 405
        assert client.head("/rate_limit").content == b""


def test_the_status_route_answers_503_when_the_store_does_not(serve: Serve) -> None:
    down = RedisStore("redis://127.0.0.1:1/0", socket_timeout=0.05)
    with serve(store=down, status_path="/rate_limit") as url, httpx.Client(base_url=url) as c:
        r = c.get("/rate_limit", headers={"X-API-Key": "acme"})
        assert (r.status_code, r.json()["error"]) == (503, "unavailable")


def test_plan_checks_are_refused_without_plans_or_with_options() -> None:
    with pytest.raises(ConfigError, match="has no plans"):
        RateLimitMiddleware(asgi_app, [RateCheck("api", "plan:api")])
    with pytest.raises(ConfigError, match="names no limit"):
        RateLimitMiddleware(asgi_app, [RateCheck("api", "plan:nope")], quotas=Quotas(PLANS))
    with pytest.raises(ConfigError, match="plan sets"):
        RateCheck("api", "plan:api", algorithm="gcra")
    with pytest.raises(ConfigError, match="status"):
        RateCheck("api", "10/second", status=500)
    with pytest.raises(ConfigError, match="status_path"):
        RateLimitMiddleware(asgi_app, [], status_path="rate_limit")
