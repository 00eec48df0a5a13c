"""The dashboard mounted into an ASGI app beside the middleware (no service)."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route
from starlette.testclient import TestClient

from ratekeeper import ManualClock
from ratekeeper.dashboard import ControlsModes, Dashboard
from ratekeeper.metrics import Metrics
from ratekeeper.middleware import Controls, RateCheck, RateLimitMiddleware, WorkerCheck, keys

ADMIN = "admin-token-mounted-0123456789"


def make() -> tuple[TestClient, Controls]:
    async def home(request: object) -> PlainTextResponse:
        return PlainTextResponse("ok")

    checks = [RateCheck("per-user", "2/minute", key=keys.header("x-user")), WorkerCheck()]
    controls = Controls()
    metrics = Metrics(top_keys=16)
    dashboard = Dashboard(metrics, ControlsModes(controls, checks), admin_token=ADMIN)
    app = Starlette(routes=[Route("/", home), Mount("/dashboard", dashboard)])
    app.add_middleware(
        RateLimitMiddleware, checks=checks, controls=controls, metrics=metrics,
        clock=ManualClock(), exempt=["/dashboard*"],
    )  # fmt: skip
    return TestClient(app), controls


def test_mounted_dashboard_serves_page_data_and_guarded_toggles() -> None:
    client, controls = make()
    with client:
        codes = [client.get("/", headers={"x-user": "bob"}).status_code for _ in range(3)]
        assert codes == [200, 200, 429]
        assert client.get("/dashboard").text.startswith("<!doctype html>")
        data = client.get("/dashboard/data").json()
        row = next(p for p in data["policies"] if p["name"] == "per-user")
        assert row["decisions"] == {"allowed": 2, "rejected": 1} and row["mode"] == "enforce"
        top = data["top_keys"][0]
        assert {k: top[k] for k in ("policy", "key", "count", "error")} == {
            "policy": "per-user", "key": "bob", "count": 1, "error": 0,
        }  # fmt: skip
        assert 0 < top["first_seen"] <= top["last_seen"] <= data["now"]
        assert {s["tier"] for s in data["shedders"]} == {"critical", "post", "get", "test"}
        body = {"name": "per-user", "mode": "shadow"}
        assert client.post("/dashboard/modes", json=body).status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert client.post("/dashboard/modes", json=body, headers=wrong).status_code == 403
        admin = {"Authorization": f"Bearer {ADMIN}"}
        assert controls.mode("per-user") == "enforce"
        answer = client.post("/dashboard/modes", json=body, headers=admin)
        assert answer.json() == {"name": "per-user", "mode": "shadow"}
        assert controls.mode("per-user") == "shadow"
        assert client.get("/", headers={"x-user": "bob"}).status_code == 200  # shadow now
        bad = client.post("/dashboard/modes", json={"name": "x", "mode": "on"}, headers=admin)
        assert bad.status_code == 400 and bad.json()["field"] == "mode"
        missing = client.post("/dashboard/modes", json={"name": "x", "mode": "off"}, headers=admin)
        assert missing.status_code == 404


def test_toggles_are_refused_without_an_admin_token() -> None:
    dashboard = Dashboard(Metrics(), ControlsModes(Controls(), []))
    client = TestClient(dashboard)
    answer = client.post("/modes", json={"name": "a", "mode": "off"})
    assert answer.status_code == 403 and "no admin token" in answer.json()["error"]
