"""The gate's hooks for framework integrations: rates per request, charge by response, checks
registered after startup and walked by position — through a plain WSGI app, no framework."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import pytest

from ratekeeper import ConfigError, Limiter, ManualClock, MemoryStore
from ratekeeper.middleware import RateCheck, RequestInfo, WSGIRateLimitMiddleware, keys
from ratekeeper.middleware.gate import Admission, Gate, Op, added_headers, run
from ratekeeper.middleware.runner import Runner

StartResponse = Callable[..., Any]


def app_answering(status: str) -> Callable[[dict[str, Any], StartResponse], Iterable[bytes]]:
    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        start_response(environ.get("HTTP_X_STATUS", status), [("Content-Type", "text/plain")])
        return [b"ok"]

    return app


def call(
    mw: WSGIRateLimitMiddleware, path: str = "/", **headers: str
) -> tuple[int, dict[str, str]]:
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": path, "REMOTE_ADDR": "192.0.2.1"}
    environ.update({"HTTP_" + k.upper(): v for k, v in headers.items()})
    seen: dict[str, Any] = {}

    def start_response(line: str, hdrs: list[tuple[str, str]], *exc: Any) -> None:
        seen["status"] = int(line[:3])
        seen["headers"] = dict(hdrs)

    body = mw(environ, start_response)
    list(body)
    close = getattr(body, "close", None)
    if close is not None:
        close()
    return seen["status"], seen["headers"]


PLANS = {"free": "2/minute", "pro": "5/minute"}


def plan_rate(request: RequestInfo) -> str | None:
    plan = request.header("x-plan")
    return None if plan == "internal" else PLANS.get(plan or "free", "not-a-rate")


def test_a_rate_function_picks_the_rate_per_request_and_none_means_no_limit() -> None:
    mw = WSGIRateLimitMiddleware(
        app_answering("200 OK"),
        [RateCheck("plan", plan_rate, key=keys.header("x-user"))],
        clock=ManualClock(),
    )
    free = [call(mw, x_user="a", x_plan="free")[0] for _ in range(3)]
    pro = [call(mw, x_user="b", x_plan="pro")[0] for _ in range(6)]
    assert free == [200, 200, 429] and pro == [200] * 5 + [429]
    status, headers = call(mw, x_user="b", x_plan="pro")
    assert status == 429 and headers["X-RateLimit-Limit"] == "5"
    internal = [call(mw, x_user="c", x_plan="internal") for _ in range(10)]
    assert all(s == 200 and "X-RateLimit-Limit" not in h for s, h in internal)
    assert mw.controls.stats()["plan"]["allowed"] == 7  # unlimited requests skip the check


def test_a_bad_rate_from_a_rate_function_fails_open_and_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    mw = WSGIRateLimitMiddleware(
        app_answering("200 OK"), [RateCheck("plan", plan_rate)], clock=ManualClock()
    )
    with caplog.at_level(logging.WARNING, logger="ratekeeper"):
        assert [call(mw, x_plan="gold")[0] for _ in range(3)] == [200, 200, 200]
    assert mw.controls.stats()["plan"]["failed_open"] == 3
    assert "not-a-rate" in caplog.text


def test_charge_when_decides_from_the_status_per_check_and_for_the_gate() -> None:
    clock = ManualClock()
    failures_only = RateCheck(
        "logins", "2/minute", key=keys.constant("x"), charge_when=lambda status: status >= 400
    )
    everything = RateCheck("all", "10/minute", key=keys.constant("x"))
    mw = WSGIRateLimitMiddleware(
        app_answering("200 OK"),
        [failures_only, everything],
        clock=clock,
        charge_when=lambda status: status != 204,
    )
    assert [call(mw)[0] for _ in range(3)] == [200, 200, 200]  # successes are free for logins
    assert call(mw, x_status="204 No Content")[0] == 204  # the gate's predicate: free for "all"
    assert [call(mw, x_status="401 Unauthorized")[0] for _ in range(3)] == [401, 401, 429]
    stats = mw.controls.stats()
    assert stats["logins"]["rejected"] == 1 and stats["all"]["allowed"] == 6


def test_refund_statuses_are_the_default_predicate() -> None:
    mw = WSGIRateLimitMiddleware(
        app_answering("304 Not Modified"), [RateCheck("api", "1/minute")], clock=ManualClock()
    )
    assert [call(mw)[0] for _ in range(3)] == [304, 304, 304]
    mw = WSGIRateLimitMiddleware(
        app_answering("304 Not Modified"),
        [RateCheck("api", "1/minute")],
        clock=ManualClock(),
        charge_when=lambda status: True,  # a predicate replaces refund_statuses
    )
    assert [call(mw)[0] for _ in range(2)] == [304, 429]


def test_a_failing_charge_predicate_keeps_the_charge(caplog: pytest.LogCaptureFixture) -> None:
    def broken(status: int) -> bool:
        raise ZeroDivisionError("predicate bug")

    check = RateCheck("api", "1/minute", charge_when=broken)
    mw = WSGIRateLimitMiddleware(app_answering("200 OK"), [check], clock=ManualClock())
    with caplog.at_level(logging.WARNING, logger="ratekeeper"):
        assert [call(mw)[0] for _ in range(2)] == [200, 429]
    assert "predicate bug" in caplog.text


def test_bad_hooks_fail_at_startup() -> None:
    with pytest.raises(ConfigError, match="charge_when=5"):
        RateCheck("api", "1/s", charge_when=5)  # type: ignore[arg-type]  # bad on purpose
    with pytest.raises(ConfigError, match="charge_when='no'"):
        WSGIRateLimitMiddleware(app_answering("200 OK"), charge_when="no")  # type: ignore[arg-type]  # bad on purpose
    with pytest.raises(ConfigError, match="option 'burst' does not apply"):
        RateCheck("api", plan_rate, burst=5)  # a rate function's options are checked too


def _gate(*checks: RateCheck) -> Gate:
    return Gate(checks, None, (), None, (304,), ManualClock(), 60.0)


def test_checks_added_later_run_only_where_named() -> None:
    gate = _gate(RateCheck("app", "100/minute", key=keys.constant("k")))
    route = RateCheck("route", "1/minute", key=keys.constant("k"))
    position = gate.add(route)
    assert gate.add(route) == position  # the same check again: shared, one position
    with pytest.raises(ConfigError, match="'route' is used twice with different settings"):
        gate.add(RateCheck("route", "2/minute", key=keys.constant("k")))
    assert gate.every == (0,)

    ops: list[Op] = []
    limiter = Limiter(MemoryStore(), clock=gate.clock)

    def execute(op: Op) -> Any:
        ops.append(op)
        return limiter.hit(op.key, op.rate)

    request = RequestInfo("GET", "/", None, None, lambda name: None, {})
    adm = Admission()
    run(gate.admit(request, adm), execute)  # the app-wide walk
    assert [op.position for op in ops] == [0] and gate.in_flight == 1
    run(gate.admit(request, adm, (position,)), execute)  # the route's, same admission
    assert [op.position for op in ops] == [0, 1] and gate.in_flight == 1
    assert dict(added_headers(adm))["X-RateLimit-Resource"] == "route"  # least remaining
    assert [op.rate for op in ops] == ["100/minute", "1/minute"]
    second = Admission()
    run(gate.admit(request, second, (position,)), execute)
    assert second.rejection is not None and second.rejection.status == 429
    refunds = gate.finish(second, None)
    assert refunds == []  # the rejected walk charged nothing
    assert [op.kind for op in gate.finish(adm, 304)] == ["refund", "refund"]
    assert gate.in_flight == 0


def test_a_failing_finish_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    gate = _gate(RateCheck("app", "1/minute"))
    runner = Runner(gate, MemoryStore(), gate.clock)
    adm = Admission()
    adm.entered = True
    adm.charged.append(Op("hit", 7, "app:k", 1, rate="1/minute"))  # no check at position 7
    with caplog.at_level(logging.WARNING, logger="ratekeeper"):
        runner.finish(adm, 200)  # the response is on its way: log, do not raise
    assert "IndexError" in caplog.text
