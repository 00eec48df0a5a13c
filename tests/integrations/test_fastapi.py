"""RouteLimits for FastAPI: decorator, shared limits, dependency, defaults, exemptions, dynamic
rates, costs, charge by response and the 429 hook — through TestClient and a real uvicorn."""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import json
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import httpx
import pytest
from fastapi import APIRouter, Depends, FastAPI, Request, Response
from fastapi.responses import JSONResponse, PlainTextResponse
from fastapi.routing import APIRoute
from starlette.testclient import TestClient

from ratekeeper import ConfigError, ManualClock, RedisStore
from ratekeeper.integrations.fastapi import RateLimited, RouteLimits
from ratekeeper.middleware import (
    ConcurrencyCheck,
    RateCheck,
    RateLimitMiddleware,
    RequestInfo,
    keys,
)
from ratekeeper.middleware.gate import Admission
from ratekeeper.middleware.responses import Rejection
from tests.middleware.servers import uvicorn_server

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

PLANS = {"free": "2/minute", "pro": "4/minute"}


def plan_rate(request: RequestInfo) -> str | None:
    plan = request.header("x-plan") or "free"
    return None if plan == "internal" else PLANS[plan]


def make(limits: RouteLimits) -> FastAPI:
    app = FastAPI()
    limits.init_app(app)

    @app.get("/items")
    def items() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/search")
    @limits.limit("2/minute", cost=lambda r: int(r.header("x-cost") or 1))
    async def search(q: str = "") -> dict[str, str]:
        return {"q": q}

    @app.get("/both")
    @limits.limit("10/minute", override_defaults=False)
    def both() -> dict[str, bool]:
        return {"ok": True}

    shared = limits.shared_limit("3/minute", "reports")

    @app.get("/reports/a")
    @shared
    def report_a() -> dict[str, str]:
        return {"r": "a"}

    @app.get("/reports/b")
    @shared
    def report_b() -> dict[str, str]:
        return {"r": "b"}

    @app.get("/plan")
    @limits.limit(plan_rate, key=keys.header("x-user"))
    def plan() -> dict[str, bool]:
        return {"ok": True}

    @app.post("/login")
    @limits.limit("2/minute", charge_when=lambda status: status >= 400)
    def login(request: Request) -> Response:
        ok = request.headers.get("x-password") == "right"
        return Response(status_code=200 if ok else 401)

    @app.get("/etag")
    def etag() -> Response:
        return Response(status_code=304)

    @app.get("/health")
    @limits.exempt
    def health() -> str:
        return "ok"

    router = APIRouter(
        prefix="/v1", dependencies=[Depends(limits.dependency("2/minute", name="v1"))]
    )

    @router.get("/a")
    def v1_a() -> int:
        return 1

    @router.get("/b")
    def v1_b() -> int:
        return 2

    @app.get("/own", dependencies=[Depends(limits.dependency("1/minute"))])
    @limits.exempt
    def own() -> int:
        return 3

    app.include_router(router)
    return app


def statuses(client: TestClient, path: str, n: int, **headers: str) -> list[int]:
    sent = {name.replace("_", "-"): value for name, value in headers.items()}
    return [client.get(path, headers=sent).status_code for _ in range(n)]


@pytest.fixture
def client() -> TestClient:
    limits = RouteLimits(default="3/minute", clock=ManualClock())
    return TestClient(make(limits), client=("198.51.100.7", 1))


def test_default_limits_count_per_route_with_headers_and_a_json_429(client: TestClient) -> None:
    assert statuses(client, "/items", 4) == [200, 200, 200, 429]
    allowed = client.get("/etag")  # another route: a counter of its own
    assert allowed.status_code == 304 and allowed.headers["X-RateLimit-Remaining"] == "2"
    rejected = client.get("/items")
    assert rejected.status_code == 429
    assert rejected.headers["X-RateLimit-Resource"] == "GET /items"
    assert rejected.headers["Retry-After"] == "60"
    assert rejected.headers["RateLimit-Policy"] == '"GET /items";q=3;w=60'
    assert rejected.headers["Content-Type"] == "application/json"
    body = json.loads(rejected.content)
    assert body["error"] == "rate_limited" and body["policy"] == "GET /items"


def test_own_limits_replace_the_defaults_unless_told(client: TestClient) -> None:
    assert statuses(client, "/search", 3) == [200, 200, 429]
    assert client.get("/search", headers={"x-cost": "1"}).headers["X-RateLimit-Limit"] == "2"
    assert statuses(client, "/both", 4) == [200, 200, 200, 429]  # the default 3 still applies
    assert client.get("/both").headers["X-RateLimit-Resource"] == "GET /both#2"


def test_a_cost_function_charges_per_request() -> None:
    client = TestClient(make(RouteLimits(clock=ManualClock())))
    assert client.get("/search", headers={"x-cost": "2"}).status_code == 200
    assert client.get("/search").status_code == 429
    too_big = client.get("/search", headers={"x-cost": "3"})
    assert too_big.status_code == 429 and json.loads(too_big.content)["retry_after"] is None


def test_a_shared_limit_is_one_counter_across_routes(client: TestClient) -> None:
    got = [client.get(p).status_code for p in ("/reports/a", "/reports/b", "/reports/a")]
    assert got == [200, 200, 200]
    rejected = client.get("/reports/b")
    assert rejected.status_code == 429 and rejected.headers["X-RateLimit-Resource"] == "reports"


def test_exempt_routes_have_no_default_limits_and_no_headers(client: TestClient) -> None:
    responses = [client.get("/health") for _ in range(10)]
    assert all(r.status_code == 200 for r in responses)
    assert "X-RateLimit-Limit" not in responses[-1].headers


def test_dependencies_per_route_and_shared_by_name(client: TestClient) -> None:
    got = [client.get(p).status_code for p in ("/v1/a", "/v1/b", "/v1/a")]
    assert got == [200, 200, 429]
    assert client.get("/v1/b").headers["X-RateLimit-Resource"] == "v1"
    assert statuses(client, "/own", 2) == [200, 429]  # exempt from defaults, its own still holds
    assert client.get("/own").headers["X-RateLimit-Resource"] == "GET /own@d2"


def test_a_rate_function_gives_each_plan_its_rate_and_none_no_limit(client: TestClient) -> None:
    assert statuses(client, "/plan", 3, x_user="a", x_plan="free") == [200, 200, 429]
    assert statuses(client, "/plan", 5, x_user="b", x_plan="pro") == [200] * 4 + [429]
    internal = [
        client.get("/plan", headers={"x-user": "c", "x-plan": "internal"}) for _ in range(9)
    ]
    assert all(r.status_code == 200 for r in internal)
    assert "X-RateLimit-Limit" not in internal[0].headers


def test_charge_when_counts_only_failed_logins(client: TestClient) -> None:
    ok = [client.post("/login", headers={"x-password": "right"}).status_code for _ in range(5)]
    assert ok == [200] * 5
    bad = [client.post("/login").status_code for _ in range(3)]
    assert bad == [401, 401, 429]
    assert client.post("/login", headers={"x-password": "right"}).status_code == 429


def test_304_is_refunded_by_default(client: TestClient) -> None:
    assert statuses(client, "/etag", 6) == [304] * 6


def test_on_breach_shapes_the_429_and_the_headers_are_added() -> None:
    seen: list[Rejection] = []

    async def on_breach(request: Request, rejection: Rejection) -> Response:
        seen.append(rejection)
        return PlainTextResponse(f"slow down, {request.url.path}", status_code=429)

    limits = RouteLimits(default="1/minute", clock=ManualClock(), on_breach=on_breach)
    client = TestClient(make(limits))
    client.get("/items")
    rejected = client.get("/items")
    assert rejected.text == "slow down, /items" and rejected.status_code == 429
    assert rejected.headers["Retry-After"] == "60"
    assert rejected.headers["X-RateLimit-Remaining"] == "0"
    assert seen[0].check == "GET /items"


def test_an_exception_handler_of_the_app_wins() -> None:
    limits = RouteLimits(default="1/minute", clock=ManualClock())
    app = make(limits)

    @app.exception_handler(RateLimited)
    async def handler(request: Request, exc: RateLimited) -> JSONResponse:
        return JSONResponse({"detail": "mine", "policy": exc.rejection.check}, status_code=429)

    client = TestClient(app)
    client.get("/items")
    rejected = client.get("/items")
    assert rejected.json() == {"detail": "mine", "policy": "GET /items"}
    assert rejected.headers["X-RateLimit-Resource"] == "GET /items"


def test_app_wide_checks_run_before_routing_and_a_route_rejection_refunds_them() -> None:
    clock = ManualClock()
    limits = RouteLimits(
        default="1/minute",
        clock=clock,
        checks=[ConcurrencyCheck("conc", 5)],
        exempt=["/health"],
    )
    client = TestClient(make(limits))
    assert statuses(client, "/items", 2) == [200, 429]
    assert client.get("/nowhere").status_code == 404  # unrouted: app-wide checks only
    stats = limits.stats()
    assert stats["in_flight"] == 0
    assert stats["checks"]["conc"]["allowed"] == 3


def test_init_app_after_routes_is_refused_and_a_missing_init_app_is_loud() -> None:
    limits = RouteLimits(default="1/minute")
    app = FastAPI()

    @app.get("/x")
    def x() -> int:
        return 1

    with pytest.raises(ConfigError, match="init_app\\(\\) was called after routes"):
        limits.init_app(app)
    app = FastAPI(dependencies=[Depends(limits)])  # the dependency given up front: fine

    @app.get("/x")
    def y() -> int:
        return 1

    limits.init_app(app)
    assert TestClient(app).get("/x").status_code == 200
    bare = FastAPI()

    @bare.get("/d", dependencies=[Depends(RouteLimits().dependency("1/minute"))])
    def d() -> int:
        return 1

    with pytest.raises(RuntimeError, match=r"call limits.init_app\(app\)"):
        TestClient(bare).get("/d")


def test_a_decorated_endpoint_without_the_middleware_is_loud() -> None:
    limits = RouteLimits()
    app = FastAPI()

    @app.get("/x")
    @limits.limit("1/minute")
    def x() -> int:
        return 1

    with pytest.raises(RuntimeError, match=r"call limits.init_app\(app\)"):
        TestClient(app).get("/x")


def test_guarded_endpoints_keep_their_signature_and_kind() -> None:
    limits = RouteLimits(clock=ManualClock())
    app = FastAPI()
    limits.init_app(app)

    @app.get("/items/{item_id}")
    @limits.limit("2/minute")
    @limits.limit("5/minute")  # a second decorator: one guard, two limits
    def item(item_id: int, q: str = "") -> dict[str, object]:
        return {"id": item_id, "q": q}

    client = TestClient(app)
    assert client.get("/items/3?q=a").json() == {"id": 3, "q": "a"}
    assert client.get("/items/x").status_code == 422  # refused by FastAPI: never charged
    names = {p["name"] for p in app.openapi()["paths"]["/items/{item_id}"]["get"]["parameters"]}
    assert names == {"item_id", "q"}
    assert [client.get("/items/4").status_code for _ in range(2)] == [200, 429]
    with pytest.raises(ConfigError, match="sync generator endpoint"):

        @limits.limit("1/minute")
        def chunks() -> Iterator[bytes]:
            yield b"x"


def test_bad_limits_fail_when_declared() -> None:
    limits = RouteLimits()
    with pytest.raises(ValueError, match="fortnight"):
        limits.limit("1/fortnight")
    with pytest.raises(ConfigError, match="algorithm 'leaky'"):
        limits.limit("1/minute", algorithm="leaky")
    limits.shared_limit("1/minute", "x")
    with pytest.raises(ConfigError, match="shared limit 'x' is defined twice"):
        limits.shared_limit("2/minute", "x")
    with pytest.raises(ConfigError, match="default limit 5 is invalid"):
        RouteLimits(default=[5])  # type: ignore[list-item]  # bad on purpose


def test_real_uvicorn_server_on_redis_admits_exactly_the_limit(redis_url: str) -> None:
    limits = RouteLimits(
        default="5/minute", store=RedisStore(redis_url, socket_timeout=2.0), clock=ManualClock()
    )
    app = make(limits)
    with uvicorn_server(app) as base, httpx.Client(base_url=base, timeout=20) as http:

        def get(path: str) -> int:
            return http.get(path).status_code

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            got = list(pool.map(get, ["/items"] * 20))
        assert sorted(got) == [200] * 5 + [429] * 15
        assert [get("/reports/a"), get("/reports/b"), get("/reports/a"), get("/reports/b")] == [
            200,
            200,
            200,
            429,
        ]
        response = http.get("/search")
        assert response.headers["X-RateLimit-Resource"] == "GET /search"
        rejected = http.get("/items")
        assert rejected.status_code == 429 and rejected.headers["Retry-After"]
    assert limits.stats()["in_flight"] == 0


def test_a_user_set_by_authentication_added_before_init_app_keys_route_limits() -> None:
    from starlette.authentication import (
        AuthCredentials,
        AuthenticationBackend,
        SimpleUser,
    )
    from starlette.middleware.authentication import AuthenticationMiddleware
    from starlette.requests import HTTPConnection

    class HeaderAuth(AuthenticationBackend):
        async def authenticate(self, conn: HTTPConnection) -> tuple[AuthCredentials, SimpleUser]:
            return AuthCredentials(["authenticated"]), SimpleUser(conn.headers.get("x-user", "?"))

    limits = RouteLimits(clock=ManualClock())
    app = FastAPI()
    app.add_middleware(AuthenticationMiddleware, backend=HeaderAuth())
    limits.init_app(app)  # added after: ours is outside, the user arrives after routing

    @app.get("/me")
    @limits.limit("2/minute", key=keys.user())
    async def me() -> dict[str, bool]:
        return {"ok": True}

    client = TestClient(app)
    ann = [client.get("/me", headers={"x-user": "ann"}).status_code for _ in range(3)]
    assert ann == [200, 200, 429]  # counted per user: the key was never None
    assert client.get("/me", headers={"x-user": "bob"}).status_code == 200


def test_a_guarded_endpoint_taking_the_request_enforces_without_init_app() -> None:
    limits = RouteLimits(clock=ManualClock())
    app = FastAPI()

    @app.get("/x")
    @limits.limit("2/minute")
    async def x(request: Request) -> dict[str, bool]:
        return {"ok": True}

    @app.get("/y")
    @limits.limit("1/minute")
    def y(request: Request, response: Response) -> dict[str, bool]:
        return {"ok": True}

    client = TestClient(app)
    got = [client.get("/x") for _ in range(3)]
    assert [r.status_code for r in got] == [200, 200, 429]
    assert got[2].headers["Retry-After"] == "60"  # Starlette's own handler keeps the headers
    first = client.get("/y")
    assert first.headers["X-RateLimit-Remaining"] == "0"  # on the response parameter
    assert client.get("/y").status_code == 429
    assert limits.stats()["checks"]["GET /x"]["rejected"] == 1


def test_default_limits_reach_included_and_nested_routers_without_a_route_dependency() -> None:
    limits = RouteLimits(default="1/minute", clock=ManualClock())
    app = FastAPI()
    limits.init_app(app)
    outer, inner = APIRouter(prefix="/outer"), APIRouter(prefix="/inner")

    @inner.get("/x")
    async def x() -> str:
        return "x"

    @outer.get("/y")
    @limits.limit("2/minute")
    async def y() -> str:
        return "y"

    @app.get("/top")
    async def top() -> str:
        return "top"

    outer.include_router(inner)
    app.include_router(outer)
    assert not app.router.dependencies  # top-level routes walk in their handler, no dependency
    client = TestClient(app)
    for path, expected in (("/top", [200, 429]), ("/outer/inner/x", [200, 429])):
        got = [client.get(path) for _ in range(2)]
        assert [r.status_code for r in got] == expected, path
        assert got[1].headers["Retry-After"] == "60"
    assert [client.get("/outer/y").status_code for _ in range(3)] == [200, 200, 429]  # its own


class _TimedRoute(APIRoute):
    """FastAPI's documented custom route class idiom: a handler of its own around the route's."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def timed(request: Request) -> Response:
            response: Response = await handler(request)
            response.headers["X-Timed"] = "1"
            return response

        return timed


def test_a_route_class_set_after_init_app_keeps_the_default_limits() -> None:
    limits = RouteLimits(default="1/minute", clock=ManualClock())
    app = FastAPI()
    limits.init_app(app)
    app.router.route_class = _TimedRoute  # after init_app: FastAPI's docs set it on the app

    @app.get("/x")
    async def x() -> str:
        return "x"

    async def y() -> str:
        return "y"

    app.router.add_api_route("/y", y, methods=["GET"], route_class_override=_TimedRoute)

    client = TestClient(app)
    for path in ("/x", "/y"):
        first, second = client.get(path), client.get(path)
        assert (first.status_code, second.status_code) == (200, 429), path
        assert first.headers["X-Timed"] == "1"  # the app's route class still runs
        assert first.headers["X-RateLimit-Limit"] == "1"


def _garbage_admissions(app: Any, requests: int = 3) -> list[Any]:
    """The admissions left for the cycle collector by ``requests`` requests to ``app``."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": "/x", "raw_path": b"/x", "query_string": b"",
        "root_path": "", "headers": [(b"host", b"t")], "client": ("192.0.2.1", 1),
        "server": ("t", 80),
    }  # fmt: skip

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Any) -> None:
        pass

    async def run() -> None:
        for _ in range(requests):
            await app(dict(scope), receive, send)

    asyncio.run(run())  # once, so the app's lazy parts are built
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        asyncio.run(run())
        gc.collect()
        return [o for o in gc.garbage if isinstance(o, Admission)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


@pytest.mark.parametrize("kind", ["middleware", "default", "limit", "guard alone"])
def test_a_request_leaves_no_reference_cycle_for_the_collector(kind: str) -> None:
    # a cycle per request (scope -> admission -> request -> scope) took the cycle collector
    # through the scope's objects every few dozen requests: a fifth of the middleware's cost
    limits = RouteLimits(default="1000/minute" if kind == "default" else None)
    app = FastAPI()
    if kind != "guard alone":
        limits.init_app(app)

    @app.get("/x")
    @limits.limit("1000/minute")
    async def x(request: Request, response: Response) -> str:
        return "x"

    if kind == "middleware":
        app = RateLimitMiddleware(FastAPI(), [RateCheck("api", "1000/minute")])  # type: ignore[assignment]
    assert _garbage_admissions(app) == []


def test_matching_wrapped_around_the_app_limits_and_sees_routes_added_later() -> None:
    # ``app = limits.matching(app)`` runs before FastAPI puts itself in the scope: it used to
    # find no app there and let every request through
    limits = RouteLimits(default="1/minute", clock=ManualClock())
    app = FastAPI()

    @app.get("/x/{n}")
    async def x(n: int) -> int:
        return n

    client = TestClient(limits.matching(app))
    assert [client.get("/x/1").status_code for _ in range(2)] == [200, 429]
    assert client.get("/x/2").status_code == 429  # one route: one counter, whatever the path

    @app.get("/late")
    async def late() -> int:
        return 1

    assert [client.get("/late").status_code for _ in range(2)] == [200, 429]
    assert [client.get("/nowhere").status_code for _ in range(2)] == [404, 404]
