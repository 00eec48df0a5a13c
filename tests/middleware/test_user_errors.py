"""A bug in the application's key, rate, cost, priority or charge function is not a store
outage: the request goes through that check as before, but the first error of each function is
logged at ERROR with its traceback, every one is counted (``user_errors`` in stats, and the
``ratekeeper_user_function_errors`` metric), and ``on_error="raise"`` raises it for tests — in
the ASGI and WSGI middleware and every framework integration."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from fastapi import FastAPI
from flask import Flask
from starlette.testclient import TestClient

from ratekeeper import ConfigError, ManualClock
from ratekeeper.metrics import Metrics
from ratekeeper.middleware import (
    RateCheck,
    RateLimitMiddleware,
    RequestInfo,
    WorkerCheck,
    WSGIRateLimitMiddleware,
)

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


class Oops(Exception):
    pass


def broken(request: RequestInfo) -> Any:
    raise Oops("a bug in the application")


def app() -> FastAPI:
    api = FastAPI()

    @api.get("/items")
    def items() -> dict[str, bool]:
        return {"ok": True}

    return api


CASES = {
    "key": RateCheck("c", "1/minute", key=broken),
    "rate": RateCheck("c", broken),
    "cost": RateCheck("c", "1/minute", cost=broken),
    "charge_when": RateCheck("c", "5/minute", charge_when=broken),  # type: ignore[arg-type]  # raises on any input
}


@pytest.mark.parametrize("kind", CASES)
def test_each_function_errs_open_logged_once_and_counted(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = Metrics()
    mw = RateLimitMiddleware(app(), [CASES[kind]], clock=ManualClock(), metrics=metrics)
    client = TestClient(mw)
    with caplog.at_level(logging.WARNING, logger="ratekeeper"):
        got = [client.get("/items").status_code for _ in range(3)]
    assert got == [200, 200, 200]  # fail open (charge_when: the charges stay; 5/minute)
    assert mw.stats()["user_errors"] == {"c": {kind: 3}}
    errors = [r for r in caplog.records if f"its {kind} function" in r.message]
    assert len(errors) == 1 and errors[0].levelno == logging.ERROR
    assert errors[0].exc_info is not None and errors[0].exc_info[0] is Oops  # the traceback
    assert metrics.user_errors.labels("c", kind).value == 3
    if kind != "charge_when":
        assert mw.stats()["checks"]["c"]["failed_open"] == 3


def test_a_priority_function_errs_open() -> None:
    mw = RateLimitMiddleware(
        app(), [WorkerCheck(max_in_flight=10)], clock=ManualClock(), priority=broken
    )
    client = TestClient(mw)
    assert [client.get("/items").status_code for _ in range(2)] == [200, 200]
    assert mw.stats()["user_errors"] == {"workers": {"priority": 2}}


def test_values_that_are_no_rate_or_cost_are_the_functions_errors() -> None:
    checks = [
        RateCheck("r", lambda r: "twice a fortnight"),
        RateCheck("c", "9/minute", cost=lambda r: 0),
        RateCheck("n", "9/minute", cost=lambda r: "2"),  # type: ignore[arg-type, return-value]  # the bug under test
    ]
    mw = RateLimitMiddleware(app(), checks, clock=ManualClock())
    assert TestClient(mw).get("/items").status_code == 200
    assert mw.stats()["user_errors"] == {"r": {"rate": 1}, "c": {"cost": 1}, "n": {"cost": 1}}


def test_on_error_raise_lets_tests_see_the_bug() -> None:
    mw = RateLimitMiddleware(app(), [CASES["key"]], clock=ManualClock(), on_error="raise")
    with pytest.raises(Oops):
        TestClient(mw).get("/items")
    with pytest.raises(ConfigError, match="on_error='loud' is invalid"):
        RateLimitMiddleware(app(), on_error="loud")


def test_a_store_failure_is_no_user_error(caplog: pytest.LogCaptureFixture) -> None:
    from ratekeeper import RedisStore

    dead = RedisStore("redis://127.0.0.1:1/0", socket_timeout=0.05)
    mw = RateLimitMiddleware(app(), [RateCheck("c", "1/minute")], store=dead, on_error="raise")
    assert TestClient(mw).get("/items").status_code == 200  # an outage fails open even so
    assert mw.stats()["user_errors"] == {}


def wsgi_app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    start_response("200 OK", [("Content-Type", "text/plain")])
    return [b"ok"]


def test_wsgi_middleware_counts_and_raises_alike() -> None:
    mw = WSGIRateLimitMiddleware(wsgi_app, [CASES["rate"]], clock=ManualClock())
    flask_like = Flask(__name__)
    flask_like.wsgi_app = mw  # type: ignore[method-assign]  # a WSGI app under a test client
    client = flask_like.test_client()
    assert [client.get("/").status_code for _ in range(2)] == [200, 200]
    assert mw.stats()["user_errors"] == {"c": {"rate": 2}}
    loud = WSGIRateLimitMiddleware(wsgi_app, [CASES["rate"]], on_error="raise")
    flask_like.wsgi_app = loud  # type: ignore[method-assign]
    with pytest.raises(Oops):
        flask_like.test_client().get("/")


def test_fastapi_integration_on_error() -> None:
    from ratekeeper.integrations.fastapi import RouteLimits

    for on_error, expect in (("open", 200), ("raise", None)):
        limits = RouteLimits(clock=ManualClock(), on_error=on_error)
        api = FastAPI()
        limits.init_app(api)

        @api.get("/x")
        @limits.limit("1/minute", key=broken)
        def x() -> int:
            return 1

        client = TestClient(api)
        if expect is None:
            with pytest.raises(Oops):
                client.get("/x")
        else:
            assert [client.get("/x").status_code for _ in range(2)] == [200, 200]
            assert limits.stats()["user_errors"] == {"GET /x": {"key": 2}}


def test_flask_integration_on_error() -> None:
    from ratekeeper.integrations.flask import RouteLimits

    for on_error in ("open", "raise"):
        limits = RouteLimits(clock=ManualClock())
        flask_app = Flask(__name__)
        flask_app.config["RATELIMIT_ON_ERROR"] = on_error

        @flask_app.get("/x")
        @limits.limit(broken)
        def x() -> str:
            return "x"

        limits.init_app(flask_app)
        client = flask_app.test_client()
        if on_error == "raise":
            flask_app.config["PROPAGATE_EXCEPTIONS"] = True
            with pytest.raises(Oops):
                client.get("/x")
        else:
            assert [client.get("/x").status_code for _ in range(2)] == [200, 200]
            assert limits.stats(flask_app)["user_errors"] == {"x": {"rate": 2}}
