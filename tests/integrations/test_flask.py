"""The Flask extension: settings from app.config, @limit/@exempt on views and blueprints, default
and shared limits, rates per request, charge by response and the 429's handler — through
Flask's test client and a real WSGI server (waitress)."""

from __future__ import annotations

import concurrent.futures
import json
from typing import Any

import httpx
import pytest
from flask import Blueprint, Flask, Response, request
from flask.testing import FlaskClient

from ratekeeper import ConfigError, ManualClock, MemoryStore, RedisStore
from ratekeeper.integrations.flask import RateLimited, RouteLimits
from ratekeeper.middleware import RequestInfo, keys
from ratekeeper.middleware.responses import Rejection
from tests.middleware.servers import waitress_server

PLANS = {"free": "2/minute", "pro": "4/minute"}


def plan_rate(request: RequestInfo) -> str | None:
    plan = request.header("x-plan") or "free"
    return None if plan == "internal" else PLANS[plan]


class BufferedClient(FlaskClient):
    """Reads each response whole and closes it, as a server does (the middleware finishes a
    request when its response is closed: refunds and releases happen then)."""

    def open(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("buffered", True)
        return super().open(*args, **kwargs)


def make(limits: RouteLimits, **config: object) -> Flask:
    app = Flask(__name__)
    app.test_client_class = BufferedClient
    app.config.update(config)

    @app.get("/items")
    def items() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/search")
    @limits.limit("2/minute", cost=lambda r: int(r.header("x-cost") or 1))
    def search() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/both")
    @limits.limit("10/minute", override_defaults=False)
    def both() -> dict[str, bool]:
        return {"ok": True}

    shared = limits.shared_limit("3/minute", "reports")

    @app.get("/reports/a")
    @shared
    def report_a() -> str:
        return "a"

    @app.get("/reports/b")
    @shared
    def report_b() -> str:
        return "b"

    @app.get("/plan")
    @limits.limit(plan_rate, key=keys.header("x-user"))
    def plan() -> str:
        return "ok"

    @app.post("/login")
    @limits.limit("2/minute", charge_when=lambda status: status >= 400)
    def login() -> Response:
        ok = request.headers.get("x-password") == "right"
        return Response(status=200 if ok else 401)

    @app.get("/etag")
    def etag() -> Response:
        return Response(status=304)

    @app.get("/health")
    @limits.exempt
    def health() -> str:
        return "ok"

    admin = Blueprint("admin", __name__, url_prefix="/admin")
    limits.limit("1/minute")(admin)

    @admin.get("/a")
    def admin_a() -> str:
        return "a"

    @admin.get("/b")
    def admin_b() -> str:
        return "b"

    public = Blueprint("public", __name__, url_prefix="/public")
    limits.exempt(public)

    @public.get("/page")
    def page() -> str:
        return "page"

    app.register_blueprint(admin)
    app.register_blueprint(public)
    limits.init_app(app)
    return app


def statuses(client: FlaskClient, path: str, n: int, **headers: str) -> list[int]:
    sent = {name.replace("_", "-"): value for name, value in headers.items()}
    return [client.get(path, headers=sent).status_code for _ in range(n)]


@pytest.fixture
def client() -> FlaskClient:
    limits = RouteLimits(clock=ManualClock())
    return make(limits, RATELIMIT_DEFAULT="3/minute").test_client()


def test_default_limits_from_app_config_count_per_endpoint(client: FlaskClient) -> None:
    assert statuses(client, "/items", 4) == [200, 200, 200, 429]
    rejected = client.get("/items")
    assert rejected.headers["X-RateLimit-Resource"] == "items"
    assert rejected.headers["Retry-After"] == "60"
    assert rejected.headers["Content-Type"] == "application/json"
    assert json.loads(rejected.data)["policy"] == "items"
    assert client.get("/etag").headers["X-RateLimit-Remaining"] == "2"  # its own counter


def test_own_limits_replace_the_defaults_unless_told(client: FlaskClient) -> None:
    assert statuses(client, "/search", 3) == [200, 200, 429]
    assert statuses(client, "/both", 4) == [200, 200, 200, 429]
    assert client.get("/both").headers["X-RateLimit-Resource"] == "both#2"


def test_a_cost_function_and_a_shared_limit(client: FlaskClient) -> None:
    assert client.get("/search", headers={"x-cost": "2"}).status_code == 200
    assert client.get("/search").status_code == 429
    got = [client.get(p).status_code for p in ("/reports/a", "/reports/b", "/reports/a")]
    assert got == [200, 200, 200]
    assert client.get("/reports/b").headers["X-RateLimit-Resource"] == "reports"


def test_blueprint_limits_and_exemptions(client: FlaskClient) -> None:
    assert statuses(client, "/admin/a", 2) == [200, 429]  # the blueprint's limit, per route
    assert statuses(client, "/admin/b", 2) == [200, 429]
    assert client.get("/admin/b").headers["X-RateLimit-Resource"] == "admin.admin_b"
    pages = [client.get("/public/page") for _ in range(6)]  # exempt blueprint: no defaults
    assert all(r.status_code == 200 and "X-RateLimit-Limit" not in r.headers for r in pages)
    assert statuses(client, "/health", 6) == [200] * 6
    assert client.get("/nowhere").status_code == 404


def test_rates_per_request_and_charge_by_response(client: FlaskClient) -> None:
    assert statuses(client, "/plan", 3, x_user="a", x_plan="free") == [200, 200, 429]
    assert statuses(client, "/plan", 5, x_user="b", x_plan="pro") == [200] * 4 + [429]
    assert statuses(client, "/plan", 9, x_user="c", x_plan="internal") == [200] * 9
    assert [client.post("/login", headers={"x-password": "right"}).status_code] * 4 == [200] * 4
    assert [client.post("/login").status_code for _ in range(3)] == [401, 401, 429]
    assert statuses(client, "/etag", 5) == [304] * 5  # 304s are refunded by default


def test_an_errorhandler_shapes_the_429_and_keeps_the_headers() -> None:
    limits = RouteLimits(clock=ManualClock(), default="1/minute")
    app = make(limits)

    @app.errorhandler(429)
    def too_many(error: RateLimited) -> tuple[str, int]:
        return f"slow down ({error.rejection.check})", 429

    client = app.test_client()
    client.get("/items")
    rejected = client.get("/items")
    assert rejected.text == "slow down (items)"
    assert rejected.headers["Retry-After"] == "60" and rejected.headers["X-RateLimit-Limit"] == "1"


def test_on_breach_answers_the_rejection() -> None:
    def on_breach(rejection: Rejection) -> tuple[dict[str, object], int]:
        return {"limited": rejection.check}, 429

    limits = RouteLimits(clock=ManualClock(), default="1/minute", on_breach=on_breach)
    client = make(limits).test_client()
    client.get("/items")
    rejected = client.get("/items")
    assert rejected.json == {"limited": "items"} and rejected.headers["Retry-After"] == "60"


def test_settings_code_wins_and_bad_settings_are_named() -> None:
    limits = RouteLimits(clock=ManualClock(), default="1/minute")
    client = make(limits, RATELIMIT_DEFAULT="5/minute").test_client()
    assert statuses(client, "/items", 2) == [200, 429]
    shadow = RouteLimits(clock=ManualClock())
    client = make(shadow, RATELIMIT_DEFAULT="1/minute", RATELIMIT_MODE="shadow").test_client()
    assert statuses(client, "/items", 3) == [200, 200, 200]
    assert shadow.stats(client.application)["checks"]["items"]["shadow_rejected"] == 2
    off = RouteLimits(clock=ManualClock())
    client = make(off, RATELIMIT_DEFAULT="1/minute", RATELIMIT_ENABLED=False).test_client()
    assert statuses(client, "/items", 3) == [200, 200, 200]
    for config, named in [
        ({"RATELIMIT_STORAGE_URL": "redis://x"}, "'RATELIMIT_STORAGE_URL' is unknown"),
        ({"RATELIMIT_STORAGE_URI": "mongodb://x"}, "STORAGE_URI 'mongodb://x' is not supported"),
        ({"RATELIMIT_STORAGE_URI": "redis+sentinel://h:1"}, "names no service"),
        ({"RATELIMIT_STORAGE_URI": "redis+cluster://h"}, "names host 'h'"),
        ({"RATELIMIT_DEFAULT": "5/fortnight"}, "fortnight"),
        ({"RATELIMIT_STRATEGY": "moving-window"}, "ratekeeper's is 'sliding_log'"),
        ({"RATELIMIT_ON_ERROR": "ignore"}, "ON_ERROR='ignore' is invalid"),
        ({"RATELIMIT_TRUSTED_PROXIES": ["10.0.0.0/33"]}, "TRUSTED_PROXIES"),
        ({"RATELIMIT_ENABLED": "no"}, "ENABLED 'no' must be True or False"),
        ({"RATELIMIT_MODE": "dark"}, "MODE 'dark' is invalid"),
        ({"RATELIMIT_STORAGE_OPTIONS": {"timeout": 1}}, "option 'timeout' is unknown"),
        ({"RATELIMIT_STORAGE_OPTIONS": 5}, "STORAGE_OPTIONS 5 must be a dict"),
    ]:
        with pytest.raises(ConfigError, match=named):
            make(RouteLimits(), **{"RATELIMIT_DEFAULT": "1/minute", **config})


def test_trusted_proxies_from_config_key_clients_by_forwarded_address() -> None:
    limits = RouteLimits(clock=ManualClock())
    app = make(limits, RATELIMIT_DEFAULT="1/minute", RATELIMIT_TRUSTED_PROXIES=["10.0.0.0/8"])
    client = app.test_client()
    env = {"REMOTE_ADDR": "10.0.0.5"}
    a = {"X-Forwarded-For": "203.0.113.1"}
    b = {"X-Forwarded-For": "203.0.113.2"}
    assert client.get("/items", headers=a, environ_base=env).status_code == 200
    assert client.get("/items", headers=b, environ_base=env).status_code == 200
    assert client.get("/items", headers=a, environ_base=env).status_code == 429


def test_storage_options_reach_the_redis_store(redis_url: str) -> None:
    from ratekeeper.integrations.settings import read

    config = {
        "RATELIMIT_STORAGE_URI": redis_url,
        "RATELIMIT_STORAGE_OPTIONS": {"socket_timeout": 2.5},
    }
    store = read(config, "RATELIMIT_", "test config").store()
    assert isinstance(store, RedisStore)
    assert store.client.connection_pool.connection_kwargs["socket_timeout"] == 2.5
    bad = RouteLimits(clock=ManualClock())
    with pytest.raises(ConfigError, match="socket_timeout"):
        make(bad, RATELIMIT_STORAGE_URI=redis_url, RATELIMIT_STORAGE_OPTIONS={"socket_timeout": -1})


def test_real_waitress_server_on_redis_admits_exactly_the_limit(redis_url: str) -> None:
    limits = RouteLimits(store=RedisStore(redis_url, socket_timeout=2.0), clock=ManualClock())
    app = make(limits, RATELIMIT_DEFAULT="5/minute")
    with waitress_server(app) as base, httpx.Client(base_url=base, timeout=20) as http:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            got = list(pool.map(lambda _: http.get("/items").status_code, range(20)))
        assert sorted(got) == [200] * 5 + [429] * 15
        response = http.get("/search")
        assert response.headers["X-RateLimit-Resource"] == "search"
        rejected = http.get("/items")
        assert rejected.status_code == 429 and json.loads(rejected.content)["policy"] == "items"
    assert limits.stats(app)["in_flight"] == 0


def test_one_extension_serves_two_apps() -> None:
    limits = RouteLimits(clock=ManualClock(), store=MemoryStore())
    first = make(limits, RATELIMIT_DEFAULT="1/minute").test_client()
    second = make(limits, RATELIMIT_DEFAULT="2/minute").test_client()
    assert statuses(first, "/items", 2) == [200, 429]
    # each app reads its own rate; a check of one name on one store is one counter (a limit's
    # name owns its counters): the second app's 2/minute finds the first app's hit
    assert statuses(second, "/items", 2) == [200, 429]


# --- regressions: one RouteLimits for several apps, a strategy typo without default limits


def test_each_app_of_a_factory_keeps_its_own_mode_and_counters() -> None:
    limits = RouteLimits(clock=ManualClock())
    on = make(limits, RATELIMIT_DEFAULT="1/minute")
    off = make(limits, RATELIMIT_DEFAULT="1/minute", RATELIMIT_ENABLED=False)
    shadow = make(limits, RATELIMIT_DEFAULT="1/minute", RATELIMIT_MODE="shadow")
    assert statuses(on.test_client(), "/items", 2) == [200, 429]  # the last init_app did not win
    assert statuses(off.test_client(), "/items", 2) == [200, 200]
    assert statuses(shadow.test_client(), "/items", 2) == [200, 200]
    assert limits.stats(on)["checks"]["items"] == {
        "allowed": 1, "rejected": 1, "shadow_rejected": 0, "failed_open": 0, "skipped": 0
    }  # fmt: skip
    assert limits.stats(off)["checks"]["items"]["skipped"] == 2
    assert limits.stats(shadow)["checks"]["items"]["shadow_rejected"] == 1
    assert limits.controls_of(on) is not limits.controls_of(off)
    shared = RouteLimits(clock=ManualClock(), controls=limits.controls_of(on))
    one, two = (
        make(shared, RATELIMIT_DEFAULT="1/minute"),
        make(shared, RATELIMIT_DEFAULT="1/minute"),
    )
    assert shared.controls_of(one) is shared.controls_of(two)  # given: shared on purpose


def test_a_strategy_typo_is_refused_at_init_app_without_default_limits() -> None:
    for bad in ("fixed_windw", "moving-window"):
        with pytest.raises(ConfigError, match="STRATEGY"):
            make(RouteLimits(), RATELIMIT_STRATEGY=bad)
    with pytest.raises(ConfigError, match="algorithm 'bogus' is unknown"):
        RouteLimits(algorithm="bogus")
