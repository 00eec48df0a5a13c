"""The Django middleware and @ratelimit: settings.RATEKEEPER, per-view, shared and default limits,
exemptions, rates per request, charge by response, ON_BREACH, streaming — through Django's test
clients (sync and async) and real servers (waitress for WSGI, uvicorn for ASGI)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from tests.integrations.django_project import setup

setup()

from django.core.asgi import get_asgi_application  # noqa: E402
from django.core.wsgi import get_wsgi_application  # noqa: E402
from django.http import HttpRequest, HttpResponse  # noqa: E402
from django.test import AsyncClient, Client, override_settings  # noqa: E402

from ratekeeper import ConfigError, ManualClock  # noqa: E402
from ratekeeper.integrations import django as rk  # noqa: E402
from ratekeeper.middleware import ConcurrencyCheck  # noqa: E402
from ratekeeper.middleware.responses import Rejection  # noqa: E402
from tests.integrations.django_project import views  # noqa: E402
from tests.middleware.servers import uvicorn_server, waitress_server  # noqa: E402

PEER = {"REMOTE_ADDR": "198.51.100.7"}


@contextmanager
def ratekeeper(**config: Any) -> Iterator[None]:
    """``settings.RATEKEEPER`` for one test: defaults of 3/minute and a clock of its own."""
    with override_settings(RATEKEEPER={"DEFAULT": "3/minute", "CLOCK": ManualClock(), **config}):
        yield


@pytest.fixture
def client() -> Iterator[Client]:
    with ratekeeper():
        yield Client(**PEER)


def statuses(client: Client, path: str, n: int, **headers: str) -> list[int]:
    return [client.get(path, headers=headers).status_code for _ in range(n)]


def test_default_limits_per_view_with_headers_and_a_json_429(client: Client) -> None:
    assert statuses(client, "/items/", 4) == [200, 200, 200, 429]
    rejected = client.get("/items/")
    assert rejected["X-RateLimit-Resource"] == "items" and rejected["Retry-After"] == "60"
    assert rejected["Content-Type"] == "application/json"
    assert json.loads(rejected.content)["error"] == "rate_limited"
    assert client.get("/etag/")["X-RateLimit-Remaining"] == "2"  # a counter per view


def test_view_limits_replace_the_defaults_unless_told(client: Client) -> None:
    assert statuses(client, "/search/", 3) == [200, 200, 429]
    assert statuses(client, "/both/", 4) == [200, 200, 200, 429]
    assert client.get("/both/")["X-RateLimit-Resource"] == "both#2"


def test_a_cost_function_and_a_group_shared_by_views(client: Client) -> None:
    assert client.get("/search/", headers={"x-cost": "2"}).status_code == 200
    assert client.get("/search/").status_code == 429
    got = [client.get(p).status_code for p in ("/reports/a/", "/reports/b/", "/reports/a/")]
    assert got == [200, 200, 200]
    assert client.get("/reports/b/")["X-RateLimit-Resource"] == "reports"


def test_exempt_views_function_and_class_based(client: Client) -> None:
    for path in ("/health/", "/page/"):
        responses = [client.get(path) for _ in range(5)]
        assert all(r.status_code == 200 and "X-RateLimit-Limit" not in r for r in responses)


def test_rates_per_request_and_charge_by_response(client: Client) -> None:
    free = {"x-api-user": "a", "x-plan": "free"}
    assert statuses(client, "/plan/", 3, **free) == [200, 200, 429]
    assert statuses(client, "/plan/", 5, **{"x-api-user": "b", "x-plan": "pro"}) == [200] * 4 + [
        429
    ]
    assert statuses(client, "/plan/", 8, **{"x-api-user": "c", "x-plan": "internal"}) == [200] * 8
    good = [client.post("/login/", {"password": "right"}).status_code for _ in range(4)]
    assert good == [200] * 4
    assert [client.post("/login/").status_code for _ in range(3)] == [401, 401, 429]
    assert client.get("/login/").status_code == 401  # GET is not limited (methods=UNSAFE)
    assert statuses(client, "/etag/", 5) == [304] * 5  # refunded by default


def test_user_keys_follow_the_authenticated_user(client: Client) -> None:
    with ratekeeper(KEY="user_or_ip"):
        assert statuses(client, "/items/", 4, x_user="alice") == [200, 200, 200, 429]
        assert statuses(client, "/items/", 1, x_user="bob") == [200]
        assert statuses(client, "/items/", 1) == [200]  # anonymous: by IP


def limited(request: HttpRequest, rejection: Rejection) -> HttpResponse:
    return HttpResponse(f"slow down ({rejection.check})", status=429)


def test_on_breach_shapes_the_answer_and_the_headers_are_added() -> None:
    with ratekeeper(DEFAULT="1/minute", ON_BREACH=f"{__name__}.limited"):
        client = Client(**PEER)
        client.get("/items/")
        rejected = client.get("/items/")
        assert rejected.content == b"slow down (items)"
        assert rejected["Retry-After"] == "60" and rejected["X-RateLimit-Remaining"] == "0"


def test_app_wide_checks_and_a_streaming_response_holding_its_slot() -> None:
    with ratekeeper(CHECKS=[ConcurrencyCheck("conc", 1)], EXEMPT_PATHS=["/health/"]):
        client = Client(**PEER)
        streaming = client.get("/stream/")
        assert streaming.streaming
        assert client.get("/items/").status_code == 429  # the stream holds the one slot
        assert client.get("/health/").status_code == 200  # exempt path: no check at all
        assert b"".join(streaming.streaming_content) == b"x" * 30  # type: ignore[attr-defined]
        streaming.close()
        assert client.get("/items/").status_code == 200
        assert rk.current().gate.in_flight == 0


def test_the_decorator_enforces_without_the_middleware() -> None:
    with ratekeeper(), override_settings(MIDDLEWARE=[]):
        client = Client(**PEER)
        assert statuses(client, "/search/", 3) == [200, 200, 429]
        assert client.get("/search/")["X-RateLimit-Resource"] == "search"
        assert statuses(client, "/items/", 5) == [200] * 5  # defaults need the middleware
        assert rk.current().gate.in_flight == 0


def test_async_views_through_the_async_middleware() -> None:
    async def main() -> tuple[list[int], list[int], str]:
        client = AsyncClient(**PEER)
        items = [(await client.get("/async/items/")).status_code for _ in range(4)]
        search = [(await client.get("/async/search/")).status_code for _ in range(2)]
        head = (await client.get("/async/search/"))["X-RateLimit-Resource"]
        return items, search, head

    with ratekeeper():
        items, search, head = asyncio.run(main())
    assert items == [200, 200, 200, 429] and search == [200, 429] and head == "async-search"


def test_the_first_requests_arriving_together_build_one_set_of_limits() -> None:
    with ratekeeper():
        barrier = threading.Barrier(16)

        def build(_: int) -> int:
            barrier.wait(10)
            return id(rk.current())

        interval = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)  # switch threads often: the race, if any, shows
        try:
            with concurrent.futures.ThreadPoolExecutor(16) as pool:
                assert len(set(pool.map(build, range(16)))) == 1
        finally:
            sys.setswitchinterval(interval)


def test_bad_settings_are_named() -> None:
    for config, named in [
        ({"STORAGE_URL": "redis://x"}, "'STORAGE_URL' is unknown"),
        ({"KEY": "cookie:sid"}, "key 'cookie:sid' is invalid"),
        ({"DEFAULT": "3/fortnight"}, "fortnight"),
        ({"ON_BREACH": 42}, "ON_BREACH'] 42 is not a function"),
    ]:
        with ratekeeper(**config), pytest.raises(ConfigError, match=named):
            rk.current()


def hammer(base: str, path: str, n: int) -> list[int]:
    with (
        httpx.Client(base_url=base, timeout=20) as http,
        concurrent.futures.ThreadPoolExecutor(8) as pool,
    ):
        return sorted(pool.map(lambda _: http.get(path).status_code, range(n)))


# a loaded test machine can miss the 50 ms default timeout, which fails open: not under test
ROOMY = {"socket_timeout": 5}


def test_real_wsgi_server_on_redis_admits_exactly_the_limit(redis_url: str) -> None:
    with ratekeeper(STORAGE_URI=redis_url, STORAGE_OPTIONS=ROOMY, DEFAULT="5/minute"):
        with waitress_server(get_wsgi_application()) as base:
            assert hammer(base, "/items/", 20) == [200] * 5 + [429] * 15
            with httpx.Client(base_url=base, timeout=20) as http:
                assert http.get("/search/").headers["X-RateLimit-Resource"] == "search"
        assert rk.current().gate.in_flight == 0


def test_real_asgi_server_on_redis_admits_exactly_the_limit(redis_url: str) -> None:
    with ratekeeper(STORAGE_URI=redis_url, STORAGE_OPTIONS=ROOMY, DEFAULT="5/minute"):
        with uvicorn_server(get_asgi_application()) as base:
            assert hammer(base, "/async/items/", 20) == [200] * 5 + [429] * 15
            assert hammer(base, "/items/", 12) == [200] * 5 + [429] * 7  # a sync view
            # a sync generator streamed under ASGI on purpose (an app may): Django warns the
            # app, and the middleware must still add its headers and finish after the body
            warned = pytest.warns(Warning, match="StreamingHttpResponse must consume synchronous")
            with httpx.Client(base_url=base, timeout=20) as http, warned:
                streamed = http.get("/stream/")
                assert streamed.content == b"x" * 30
                assert streamed.headers["X-RateLimit-Resource"] == "stream"
        assert rk.current().gate.in_flight == 0
    assert views.STREAMED[-3:] == [0, 1, 2]


# --- regressions: method_decorator, groups with named keys, block=False, stacked decorators


@pytest.mark.parametrize("middleware", [True, False])
def test_method_decorator_on_a_class_based_view_is_enforced(middleware: bool) -> None:
    installed = ["ratekeeper.integrations.django.RateLimitMiddleware"] if middleware else []
    with ratekeeper(), override_settings(MIDDLEWARE=installed):
        client = Client(**PEER)
        assert statuses(client, "/decorated/", 3) == [200, 200, 429]
        assert client.get("/decorated/")["X-RateLimit-Resource"] == "decorated"
    with ratekeeper(DEFAULT=None), override_settings(MIDDLEWARE=installed):
        client = Client(**PEER)
        assert statuses(client, "/decorated/", 3) == [200, 200, 429]
        assert client.get("/decorated/")["X-RateLimit-Resource"] == "decorated"
        assert [client.post("/decorated/").status_code for _ in range(4)] == [200] * 4
        key = {"x-api-key": "k1"}
        assert statuses(client, "/dispatched/", 2, **key) == [200, 200]
        assert client.post("/dispatched/", headers=key).status_code == 429  # dispatch: all methods
        assert rk.current().gate.in_flight == 0


def test_method_decorator_keeps_no_state_per_request() -> None:
    with ratekeeper(DEFAULT=None, CLOCK=ManualClock()):
        client = Client(**PEER)
        limits = rk.current()

        def sizes() -> tuple[int, int, int, int]:
            routes = limits.routes
            return (
                len(rk.TABLE._limits),
                len(routes._cache),
                len(routes._bound),
                len(limits.gate.checks),
            )

        client.get("/decorated/")
        before = sizes()
        for i in range(60):
            client.get("/decorated/", REMOTE_ADDR=f"198.51.100.{i % 200}")
            client.get("/dispatched/", headers={"x-api-key": f"k{i}"})
        client.get("/decorated/")
        after = sizes()
        assert after[0] <= before[0] + 1 and after[1:] <= (
            before[1] + 2,
            before[2] + 1,
            before[3] + 1,
        )


def test_a_group_with_a_named_key_is_one_limit_across_views(client: Client) -> None:
    paths = ["/by-user/a/", "/by-user/b/", "/by-user/a/", "/by-user/b/"]
    assert [client.get(p, headers={"x-user": "ann"}).status_code for p in paths] == [200] * 3 + [
        429
    ]
    assert client.get("/by-user/b/", headers={"x-user": "bob"}).status_code == 200
    same = rk.key_function("header:x-api-key")
    assert same is rk.key_function("header:x-api-key") and rk.key_function("ip") is rk.key_function(
        None
    )


@pytest.mark.parametrize("middleware", [True, False])
def test_block_false_marks_the_request_and_refuses_nothing(middleware: bool) -> None:
    installed = ["ratekeeper.integrations.django.RateLimitMiddleware"] if middleware else []
    with ratekeeper(DEFAULT=None), override_settings(MIDDLEWARE=installed):
        client = Client(**PEER)
        bodies = [client.get("/watched/") for _ in range(4)]
        assert [r.status_code for r in bodies] == [200] * 4
        assert [r.content for r in bodies] == [b"fine", b"fine", b"limited", b"limited"]


@pytest.mark.parametrize("middleware", [True, False])
def test_stacked_decorators_charge_each_limit_once(middleware: bool) -> None:
    installed = ["ratekeeper.integrations.django.RateLimitMiddleware"] if middleware else []
    with ratekeeper(DEFAULT=None), override_settings(MIDDLEWARE=installed):
        client = Client(**PEER)
        assert statuses(client, "/stacked/", 3) == [200, 200, 429]
        assert client.get("/stacked/")["X-RateLimit-Remaining"] == "0"


def test_a_strategy_typo_is_refused_without_default_limits() -> None:
    with (
        ratekeeper(DEFAULT=None, STRATEGY="fixed-windw"),
        pytest.raises(ConfigError, match="STRATEGY"),
    ):
        rk.current()


def broken_key(request: Any) -> str:
    raise LookupError("a bug in the application's key function")


def test_a_broken_key_function_is_counted_and_raised_on_request() -> None:
    with ratekeeper(KEY=f"{__name__}.broken_key"):
        client = Client(**PEER)
        assert statuses(client, "/items/", 4) == [200] * 4
        assert rk.current().gate.user_error_stats() == {"items": {"key": 4}}
    with ratekeeper(KEY=f"{__name__}.broken_key", ON_ERROR="raise"), pytest.raises(LookupError):
        Client(**PEER, raise_request_exception=True).get("/items/")
