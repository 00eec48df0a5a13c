"""Responses as third-party clients read them: GitHub's convention for primary and secondary
limits (what @octokit/plugin-throttling acts on), RFC 8941 header values for any check name,
ASGI and WSGI alike."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import http_sfv
import pytest
from flask import Flask
from starlette.testclient import TestClient

from ratekeeper import ManualClock, MemoryStore
from ratekeeper.middleware import (
    ConcurrencyCheck,
    RateCheck,
    RateLimitMiddleware,
    WSGIRateLimitMiddleware,
)


def octokit_reaction(status: int, headers: Any, body: bytes) -> str | None:
    """What @octokit/plugin-throttling does with a response (its order of tests): a message
    matching /\\bsecondary rate\\b/i is a secondary limit (it waits Retry-After), else
    ``x-ratelimit-remaining: "0"`` a primary one (it waits for x-ratelimit-reset); else
    nothing, and the client does not back off."""
    if status not in (403, 429):
        return None
    message = json.loads(body).get("message", "")
    if re.search(r"\bsecondary rate\b", message, re.IGNORECASE):
        assert int(headers["retry-after"]) >= 1
        return "secondary"
    if headers.get("x-ratelimit-remaining") == "0":
        assert int(headers["x-ratelimit-reset"]) > 0
        return "primary"
    return None


Send = Callable[[str, int], tuple[int, Any, bytes]]


def asgi_client(checks: list[Any], store: Any = None) -> Send:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    mw = RateLimitMiddleware(app, checks, store=store, clock=ManualClock())
    client = TestClient(mw, client=("198.51.100.7", 4000), raise_server_exceptions=False)

    def send(path: str, cost: int) -> tuple[int, Any, bytes]:
        r = client.get(path, headers={"x-cost": str(cost)})
        return r.status_code, r.headers, r.content

    return send


def wsgi_client(checks: list[Any], store: Any = None) -> Send:
    app = Flask(__name__)

    @app.get("/<path:anything>")
    def ok(anything: str) -> str:
        return "ok"

    app.wsgi_app = WSGIRateLimitMiddleware(app.wsgi_app, checks, store=store, clock=ManualClock())  # type: ignore[method-assign]  # the documented Flask way
    client = app.test_client()

    def send(path: str, cost: int) -> tuple[int, Any, bytes]:
        r = client.get(path, headers={"x-cost": str(cost)}, environ_base={"REMOTE_ADDR": "1.2.3.4"})
        return r.status_code, {k.lower(): v for k, v in r.headers.items()}, r.data

    return send


CLIENTS = [pytest.param(asgi_client, id="asgi"), pytest.param(wsgi_client, id="wsgi")]


def _cost(request: Any) -> int:
    return int(request.header("x-cost") or 1)


@pytest.mark.parametrize("make", CLIENTS)
def test_a_limit_used_up_is_a_primary_rate_limit(make: Callable[..., Send]) -> None:
    send = make([RateCheck("api", "2/minute", key=lambda r: "k")])
    assert [send("/a", 1)[0] for _ in range(2)] == [200, 200]
    status, headers, body = send("/a", 1)
    assert status == 429 and headers["x-ratelimit-remaining"] == "0"
    assert octokit_reaction(status, headers, body) == "primary"


@pytest.mark.parametrize("make", CLIENTS)
def test_a_cost_above_what_is_left_is_a_secondary_rate_limit(make: Callable[..., Send]) -> None:
    send = make([RateCheck("api", "5/minute", key=lambda r: "k", cost=_cost)])
    assert send("/a", 3)[0] == 200
    status, headers, body = send("/a", 3)  # 2 left, 3 asked: nothing is used up
    assert status == 429 and headers["x-ratelimit-remaining"] == "2"
    assert octokit_reaction(status, headers, body) == "secondary"
    assert json.loads(body)["retry_after"] == int(headers["retry-after"])


@pytest.mark.parametrize("make", CLIENTS)
def test_a_concurrency_limit_is_a_secondary_rate_limit(make: Callable[..., Send]) -> None:
    store = MemoryStore()
    send = make([ConcurrencyCheck("conc", 1, key=lambda r: "k")], store)
    assert send("/a", 1)[0] == 200
    store.acquire_lease("conc:k", "held-elsewhere", 1, 0, 2**52)  # a request in progress
    status, headers, body = send("/a", 1)
    assert status == 429
    assert octokit_reaction(status, headers, body) == "secondary"


@pytest.mark.parametrize("make", CLIENTS)
@pytest.mark.parametrize("name", ["限流", "café", "per ip", "100%"])
def test_any_check_name_gives_ascii_structured_headers(
    make: Callable[..., Send], name: str
) -> None:
    send = make([RateCheck(name, "1/minute; 10/hour", key=lambda r: "k")])
    for expected in (200, 429):
        status, headers, body = send("/a", 1)
        assert status == expected  # never a 500 from encoding the name
        for field in ("ratelimit", "ratelimit-policy"):
            http_sfv.List().parse(headers[field].encode("ascii"))
        resource = headers["x-ratelimit-resource"]
        assert resource.isascii() and resource.isprintable()
    assert json.loads(body)["policy"] == name  # the body (JSON) keeps the name as it is
