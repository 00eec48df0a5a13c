"""Middleware metrics: decisions under the checks' names, one per verdict, in both middlewares."""

from __future__ import annotations

import httpx
from flask import Flask
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from ratekeeper import ManualClock
from ratekeeper.metrics import Metrics
from ratekeeper.middleware import (
    ConcurrencyCheck,
    Controls,
    RateCheck,
    RateLimitMiddleware,
    WorkerCheck,
    WSGIRateLimitMiddleware,
    keys,
)


def checks() -> list[RateCheck | ConcurrencyCheck | WorkerCheck]:
    return [
        RateCheck("per-user", "3/minute", key=keys.header("x-user")),
        RateCheck("beta", "1/minute", key=keys.header("x-user")),
        ConcurrencyCheck("concurrent", 5, key=keys.header("x-user")),
        WorkerCheck(),
    ]


def expected(m: Metrics) -> None:
    assert m.count_of("per-user", "allowed") == 3
    assert m.count_of("per-user", "rejected") == 2
    assert m.count_of("beta", "allowed") == 1
    assert m.count_of("beta", "shadow_rejected") == 2  # then per-user rejected first
    assert m.count_of("workers", "allowed") == 3
    assert m.count_of("concurrent", "allowed") == 3
    assert m.top is not None
    assert {(h.group, h.item, h.count) for h in m.top.top()} == {
        ("per-user", "bob", 2),
        ("beta", "bob", 2),
    }
    series = {labels for labels, _ in m.breaker_state.samples()}
    assert series == {("memory", "0", "rate"), ("memory", "0", "lease")}
    assert {labels[0] for labels, _ in m.shed_drop.samples()} == {"workers"}
    assert dict(m.in_flight.samples())[()] == 0


def test_wsgi_middleware_counts_every_verdict_by_check_name() -> None:
    app = Flask(__name__)
    app.get("/")(lambda: "ok")
    m = Metrics(top_keys=8)
    controls = Controls({"beta": "shadow"})
    mw = WSGIRateLimitMiddleware(
        app.wsgi_app, checks(), clock=ManualClock(), controls=controls, metrics=m
    )
    with httpx.Client(transport=httpx.WSGITransport(app=mw), base_url="http://t") as client:
        codes = [client.get("/", headers={"x-user": "bob"}).status_code for _ in range(5)]
    assert codes == [200, 200, 200, 429, 429]
    expected(m)


def test_asgi_middleware_counts_every_verdict_by_check_name() -> None:
    async def home(request: object) -> PlainTextResponse:
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/", home)])
    m = Metrics(top_keys=8)
    app.add_middleware(
        RateLimitMiddleware,
        checks=checks(),
        clock=ManualClock(),
        controls=Controls({"beta": "shadow"}),
        metrics=m,
    )
    with TestClient(app) as client:
        codes = [client.get("/", headers={"x-user": "bob"}).status_code for _ in range(5)]
    assert codes == [200, 200, 200, 429, 429]
    expected(m)


def test_a_switched_off_check_counts_as_disabled() -> None:
    app = Flask(__name__)
    app.get("/")(lambda: "ok")
    m = Metrics()
    mw = WSGIRateLimitMiddleware(
        app.wsgi_app, checks()[:1], clock=ManualClock(), controls=Controls({"per-user": "off"}),
        metrics=m,
    )  # fmt: skip
    with httpx.Client(transport=httpx.WSGITransport(app=mw), base_url="http://t") as client:
        client.get("/", headers={"x-user": "bob"})
    assert m.count_of("per-user", "disabled") == 1
