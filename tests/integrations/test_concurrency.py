"""Under 16 concurrent clients on Redis every integration — and every compat module — admits
exactly the limit: each decision is one atomic store call, whatever the server's threads or
event loop do. Real servers (uvicorn, waitress with 16 threads) and a real Redis; 16 threads
start together and send 4 requests each against a limit of 10."""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
import redis
from fastapi import FastAPI, Request

from ratekeeper import RedisStore
from tests.integrations.django_project import setup
from tests.middleware.servers import uvicorn_server, waitress_server

setup()

from django.core.asgi import get_asgi_application  # noqa: E402
from django.core.wsgi import get_wsgi_application  # noqa: E402
from django.test import override_settings  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

THREADS = 16
EACH = 4
LIMIT = 10
ROOMY = {"socket_timeout": 5}  # a loaded machine must not fail open here


def fastapi_app(url: str, default: bool) -> Any:
    from ratekeeper.integrations.fastapi import RouteLimits

    limits = RouteLimits(store=RedisStore(url, **ROOMY), default="10/minute" if default else None)
    app = FastAPI()
    limits.init_app(app)

    if default:

        @app.get("/x")
        async def x() -> str:
            return "x"

    else:

        @app.get("/x")
        @limits.limit("10/minute")
        async def y() -> str:
            return "x"

    return app


def flask_app(url: str) -> Any:
    from flask import Flask

    from ratekeeper.integrations.flask import RouteLimits

    app = Flask(__name__)
    app.config.update(
        RATELIMIT_STORAGE_URI=url, RATELIMIT_STORAGE_OPTIONS=ROOMY, RATELIMIT_DEFAULT="10/minute"
    )

    @app.get("/x")
    def x() -> str:
        return "x"

    RouteLimits().init_app(app)
    return app


def slowapi_app(url: str) -> Any:
    from ratekeeper.compat.slowapi import (
        Limiter,
        RateLimitExceeded,
        _rate_limit_exceeded_handler,
        get_remote_address,
    )

    limiter = Limiter(key_func=get_remote_address, storage_uri=url, storage_options=ROOMY)
    app = FastAPI()
    app.state.limiter = limiter
    app.add_exception_handler(RateLimitExceeded, _rate_limit_exceeded_handler)

    async def x(request: Request) -> str:
        return "x"

    app.get("/x")(limiter.limit("10/minute")(x))
    return app


def flask_limiter_app(url: str) -> Any:
    from flask import Flask

    from ratekeeper.compat.flask_limiter import Limiter, get_remote_address

    app = Flask(__name__)
    limiter = Limiter(
        get_remote_address, app=app, storage_uri=url, storage_options=ROOMY, default_limits=[]
    )

    @app.get("/x")
    @limiter.limit("10 per minute")
    def x() -> str:
        return "x"

    return app


@contextmanager
def django(url: str, asgi: bool) -> Iterator[str]:
    config = {"STORAGE_URI": url, "STORAGE_OPTIONS": ROOMY, "DEFAULT": "10/minute"}
    rates = {"user": "10/minute", "anon": "10/minute", "burst": "2/minute"}
    with override_settings(
        RATEKEEPER=config,
        REST_FRAMEWORK={
            "DEFAULT_AUTHENTICATION_CLASSES": ["tests.integrations.django_project.auth.HeaderAuth"],
            "DEFAULT_PERMISSION_CLASSES": [],
            "DEFAULT_THROTTLE_RATES": rates,
        },
    ):
        if asgi:
            with uvicorn_server(get_asgi_application()) as base:
                yield base
        else:
            with waitress_server(get_wsgi_application(), threads=THREADS) as base:
                yield base


def served(kind: str, url: str) -> Any:
    if kind == "fastapi @limit":
        return uvicorn_server(fastapi_app(url, default=False)), "/x"
    if kind == "fastapi default":
        return uvicorn_server(fastapi_app(url, default=True)), "/x"
    if kind == "flask":
        return waitress_server(flask_app(url), threads=THREADS), "/x"
    if kind == "django wsgi":
        return django(url, asgi=False), "/items/"
    if kind == "django asgi":
        return django(url, asgi=True), "/async/items/"
    if kind == "drf":
        return django(url, asgi=False), "/api/user/"
    if kind == "compat slowapi":
        return uvicorn_server(slowapi_app(url)), "/x"
    if kind == "compat flask_limiter":
        return waitress_server(flask_limiter_app(url), threads=THREADS), "/x"
    if kind == "compat django_ratelimit":
        return django(url, asgi=False), "/compat/limited/"
    return django(url, asgi=False), "/compat/user/"


KINDS = [
    "fastapi @limit", "fastapi default", "flask", "django wsgi", "django asgi", "drf",
    "compat slowapi", "compat flask_limiter", "compat django_ratelimit", "compat drf",
]  # fmt: skip


def hammer(base: str, path: str, headers: dict[str, str]) -> list[int]:
    barrier = threading.Barrier(THREADS)

    def client(_: int) -> list[int]:
        with httpx.Client(base_url=base, timeout=30) as http:
            barrier.wait(30)
            return [http.get(path, headers=headers).status_code for _ in range(EACH)]

    with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
        return sorted(s for got in pool.map(client, range(THREADS)) for s in got)


@pytest.mark.parametrize("kind", KINDS)
def test_sixteen_concurrent_clients_get_exactly_the_limit(kind: str, redis_url: str) -> None:
    server, path = served(kind, redis_url)
    headers = {"x-user": "hammer"} if "drf" in kind else {}
    refused = 403 if kind == "compat django_ratelimit" else 429
    with server as base:
        for _ in range(2):  # and again on fresh counters
            redis.Redis.from_url(redis_url).flushall()
            got = hammer(base, path, headers)
            assert got == [200] * LIMIT + [refused] * (THREADS * EACH - LIMIT), kind
