"""The DRF throttles: DRF's contract (allow_request, wait, scopes, DEFAULT_THROTTLE_RATES), the
middleware's headers, and exact admission under concurrent requests on real Redis."""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from tests.integrations.django_project import setup

setup()

from django.core.exceptions import ImproperlyConfigured  # noqa: E402
from django.core.wsgi import get_wsgi_application  # noqa: E402
from django.test import Client, override_settings  # noqa: E402
from rest_framework.request import Request  # noqa: E402
from rest_framework.test import APIRequestFactory  # noqa: E402

from ratekeeper import ManualClock  # noqa: E402
from ratekeeper.integrations import django as rk  # noqa: E402
from ratekeeper.integrations.drf import RateThrottle, UserRateThrottle  # noqa: E402
from tests.integrations.django_project.views import UserView  # noqa: E402
from tests.middleware.servers import waitress_server  # noqa: E402

PEER = {"REMOTE_ADDR": "198.51.100.7"}


@contextmanager
def ratekeeper(**config: Any) -> Iterator[ManualClock]:
    clock = ManualClock()
    with override_settings(RATEKEEPER={"CLOCK": clock, **config}):
        yield clock


@pytest.fixture
def client() -> Iterator[Client]:
    with ratekeeper():
        yield Client(**PEER)


def get(client: Client, path: str, n: int, **headers: str) -> list[int]:
    return [client.get(path, headers=headers).status_code for _ in range(n)]


def test_user_throttle_by_user_with_drf_429_and_our_headers(client: Client) -> None:
    assert get(client, "/api/user/", 4, x_user="alice") == [200, 200, 200, 429]
    assert get(client, "/api/user/", 1, x_user="bob") == [200]
    rejected = client.get("/api/user/", headers={"x-user": "alice"})
    assert rejected["Retry-After"] == "60"
    assert json.loads(rejected.content)["detail"].startswith("Request was throttled")
    assert rejected["X-RateLimit-Resource"] == "throttle:user"
    allowed = client.get("/api/user/", headers={"x-user": "bob"})
    assert allowed["X-RateLimit-Remaining"] == "1" and allowed["X-RateLimit-Limit"] == "3"


def test_anon_throttle_counts_anonymous_clients_by_ip(client: Client) -> None:
    assert get(client, "/api/anon/", 3) == [200, 200, 429]
    assert get(client, "/api/anon/", 3, x_user="alice") == [200] * 3
    other = Client(REMOTE_ADDR="198.51.100.8")
    assert other.get("/api/anon/").status_code == 200


def test_scoped_throttle_and_a_refused_request_charges_no_other_throttle(client: Client) -> None:
    assert get(client, "/api/burst/", 3, x_user="alice") == [200, 200, 429]  # burst: 2/minute
    # the refused request charged nothing to "user" (3/minute): alice has one left
    assert get(client, "/api/user/", 2, x_user="alice") == [200, 429]
    assert get(client, "/api/open/", 5) == [200] * 5  # a view without throttle_scope


def test_the_window_passes_on_the_injected_clock() -> None:
    with ratekeeper() as clock:
        client = Client(**PEER)
        assert get(client, "/api/anon/", 3) == [200, 200, 429]
        clock.advance(60)
        assert get(client, "/api/anon/", 1) == [200]


def test_drf_contract_allow_request_and_wait() -> None:
    factory = APIRequestFactory()
    view = UserView()

    def request() -> Request:
        return Request(factory.get("/api/user/", REMOTE_ADDR="203.0.113.9"))

    with ratekeeper():
        throttles = [UserRateThrottle() for _ in range(4)]
        allowed = [t.allow_request(request(), view) for t in throttles]
        assert allowed == [True, True, True, False]
        assert throttles[0].wait() is None
        assert throttles[3].wait() == 60.0
        assert rk.current().gate.in_flight == 0  # without the middleware: done at once

    class Fixed(RateThrottle):
        rate = "1/second"

        def get_cache_key(self, request: Any, view: Any) -> str | None:
            return "everyone"

    with ratekeeper():
        first, second = Fixed(), Fixed()
        assert first.allow_request(request(), view) and not second.allow_request(request(), view)
        assert second.wait() == 1.0

    class Unset(RateThrottle):
        scope = "nowhere"

    with pytest.raises(ImproperlyConfigured, match="No default throttle rate set for 'nowhere'"):
        Unset()


def test_throttles_work_without_the_middleware() -> None:
    with (
        ratekeeper(),
        override_settings(MIDDLEWARE=["tests.integrations.django_project.auth.header_user"]),
    ):
        client = Client(**PEER)
        assert get(client, "/api/user/", 4, x_user="carol") == [200, 200, 200, 429]
        assert "X-RateLimit-Limit" not in client.get("/api/user/", headers={"x-user": "dave"})


def test_exact_admission_under_concurrent_requests_on_redis(redis_url: str) -> None:
    """30 concurrent requests from one user against 10/minute: exactly 10 pass, every time
    (one atomic script per decision; DRF's cache throttles read, decide, then write)."""
    rates = {"user": "10/minute", "anon": "2/minute", "burst": "2/minute"}
    with (
        override_settings(
            RATEKEEPER={
                "STORAGE_URI": redis_url,
                "STORAGE_OPTIONS": {"socket_timeout": 5},  # no fail-open on a busy machine
                "CLOCK": ManualClock(),
            }
        ),
        override_settings(REST_FRAMEWORK={"DEFAULT_THROTTLE_RATES": rates, **_auth()}),
    ):
        for user in ("erin", "frank", "grace"):
            with (
                waitress_server(get_wsgi_application()) as base,
                httpx.Client(base_url=base, timeout=20) as http,
                concurrent.futures.ThreadPoolExecutor(10) as pool,
            ):
                got = sorted(
                    pool.map(
                        lambda name: http.get("/api/user/", headers={"x-user": name}).status_code,
                        [user] * 30,
                    )
                )
            assert got == [200] * 10 + [429] * 20
        assert rk.current().gate.in_flight == 0


def _auth() -> dict[str, Any]:
    return {
        "DEFAULT_AUTHENTICATION_CLASSES": ["tests.integrations.django_project.auth.HeaderAuth"],
        "DEFAULT_PERMISSION_CLASSES": [],
    }
