"""DRF's own throttles over-admit under concurrency; ratekeeper's do not. Measured, not argued.

DRF's ``SimpleRateThrottle`` reads a request history from Django's cache, decides, then writes
it back: requests arriving together all read the same history and all pass. DRF's maintainers
document the race and leave it (a "best effort" throttle, not a security control).
ratekeeper's throttles decide with one atomic store call.

Each trial empties a Redis, serves one DRF view with one throttle class through waitress
(``--threads`` worker threads), releases ``--threads`` client threads together, each sending
``--each`` requests as the same user, and counts the 200s against the limit (``--limit`` per
minute). Variants: DRF's ``UserRateThrottle`` on Django's Redis cache and on its local-memory
cache, ratekeeper's ``integrations.drf.UserRateThrottle`` and ``compat.drf.UserRateThrottle``
on the same Redis. Run::

    .venv/bin/python -m benchmarks.drf_race [--trials 10] [--threads 16] [--each 4] [--limit 10]

Prints, per variant, the admitted requests of each trial and how many trials admitted more
than the limit. It starts its own redis-server on 127.0.0.1 (tests/redis_servers.py).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import statistics
import threading
from typing import Any

import django
import httpx
import redis
from django.conf import settings

from tests import redis_servers as rs

VARIANTS = {
    "DRF UserRateThrottle, Redis cache": ("drf/", "redis"),
    "DRF UserRateThrottle, local-memory cache": ("drf/", "locmem"),
    "ratekeeper integrations.drf.UserRateThrottle, Redis": ("ours/", "redis"),
    "ratekeeper compat.drf.UserRateThrottle, Redis": ("compat/", "redis"),
}


class Header:
    """DRF authentication by the ``X-User`` header (no database)."""

    def authenticate(self, request: Any) -> tuple[Any, None] | None:
        name = request.headers.get("x-user")
        if not name:
            return None
        user = type("User", (), {"pk": name, "is_authenticated": True})()
        return user, None

    def authenticate_header(self, request: Any) -> str:
        return "Header"


def configure(url: str, limit: int) -> Any:
    """Django for this process: three views, one per throttle class; returns the WSGI app."""
    settings.configure(
        ROOT_URLCONF=__name__,
        ALLOWED_HOSTS=["*"],
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "rest_framework"],
        DATABASES={},
        MIDDLEWARE=[],
        CACHES={
            "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": url},
            "locmem": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        },
        RATEKEEPER={"STORAGE_URI": url, "STORAGE_OPTIONS": {"socket_timeout": 5}},
        REST_FRAMEWORK={
            "DEFAULT_AUTHENTICATION_CLASSES": [f"{__name__}.Header"],
            "DEFAULT_PERMISSION_CLASSES": [],
            "DEFAULT_THROTTLE_RATES": {"user": f"{limit}/minute"},
        },
    )
    django.setup()
    from django.core.cache import caches
    from django.core.wsgi import get_wsgi_application
    from django.urls import path
    from rest_framework import throttling
    from rest_framework.response import Response
    from rest_framework.views import APIView

    from ratekeeper.compat import drf as compat
    from ratekeeper.integrations import drf as ours

    class LocMemThrottle(throttling.UserRateThrottle):
        cache = caches["locmem"]

    def view(throttle: Any) -> Any:
        class Limited(APIView):
            throttle_classes = [throttle]  # noqa: RUF012  # as DRF declares it

            def get(self, request: Any) -> Any:
                return Response({"ok": True})

        return Limited.as_view()

    global urlpatterns
    urlpatterns = [
        path("drf/redis", view(throttling.UserRateThrottle)),
        path("drf/locmem", view(LocMemThrottle)),
        path("ours/redis", view(ours.UserRateThrottle)),
        path("compat/redis", view(compat.UserRateThrottle)),
    ]
    return get_wsgi_application()


urlpatterns: list[Any] = []


def trial(base: str, path: str, threads: int, each: int, user: str) -> int:
    """Requests admitted when ``threads`` clients send ``each`` requests together."""
    barrier = threading.Barrier(threads)

    def client(_: int) -> int:
        with httpx.Client(base_url=base, timeout=30) as http:
            barrier.wait(30)
            return sum(
                http.get(path, headers={"x-user": user}).status_code == 200 for _ in range(each)
            )

    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        return sum(pool.map(client, range(threads)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--each", type=int, default=4)
    parser.add_argument("--limit", type=int, default=10)
    args = parser.parse_args()
    server = rs.RedisServer()
    try:
        app = configure(server.url, args.limit)
        from django.core.cache import caches

        from tests.middleware.servers import waitress_server

        with waitress_server(app, threads=args.threads) as base:
            print(
                f"{args.threads} clients x {args.each} requests as one user, limit "
                f"{args.limit}/minute, {args.trials} trials (admitted per trial)"
            )
            for name, (prefix, cache) in VARIANTS.items():
                got = []
                for i in range(args.trials):
                    redis.Redis.from_url(server.url).flushall()
                    caches["locmem"].clear()
                    got.append(trial(base, prefix + cache, args.threads, args.each, f"u{i}"))
                over = sum(g > args.limit for g in got)
                print(
                    f"{name:52} median {statistics.median(got):5.1f}  max {max(got):3d}  "
                    f"over the limit in {over}/{args.trials}  {got}"
                )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
