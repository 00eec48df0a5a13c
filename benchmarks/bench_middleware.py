"""Middleware overhead per allowed request: ratekeeper vs slowapi on the same FastAPI app.

Every variant serves the same FastAPI endpoint with the same rule (1,000,000 requests per minute
per client IP, memory storage, so every request is allowed). Requests are plain ASGI calls in
one event loop — no network, no test client — so the difference from the bare app is the
middleware's own cost. Run::

    .venv/bin/python -m benchmarks.bench_middleware [--requests 3000] [--rounds 7]

Prints microseconds of CPU time per request (median of rounds; this process's CPU time, so
other processes on the machine add little noise) for each variant, the overhead over the bare
app, and each ratekeeper variant's overhead as a share of its slowapi counterpart's (the pure
middleware and the default limit against slowapi's middleware, ``@limit`` against slowapi's
decorator; below 0.5 is at most half of slowapi's cost), and each ``ratekeeper.compat.slowapi``
variant's against the integration path it maps onto. Compare ratios within one run, not numbers
across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request, Response
from slowapi import Limiter as SlowLimiter
from slowapi import _rate_limit_exceeded_handler
from slowapi.errors import RateLimitExceeded
from slowapi.middleware import SlowAPIASGIMiddleware
from slowapi.util import get_remote_address

from ratekeeper.integrations.fastapi import RouteLimits
from ratekeeper.middleware import RateCheck, RateLimitMiddleware

RULE = "1000000/minute"
Variant = Callable[[], Any]


def bare() -> Any:
    app = FastAPI()

    @app.get("/items")
    async def items() -> dict[str, bool]:
        return {"ok": True}

    return app


def ratekeeper_headers() -> Any:
    """ratekeeper, pure ASGI, rate headers on every response (its only mode)."""
    return RateLimitMiddleware(bare(), [RateCheck("api", RULE)])


def ratekeeper_defaults() -> Any:
    """ratekeeper's FastAPI integration, the rule as a default limit on every route."""
    limits = RouteLimits(default=RULE)
    app = FastAPI()
    limits.init_app(app)

    @app.get("/items")
    async def items() -> dict[str, bool]:
        return {"ok": True}

    return app


def ratekeeper_matching() -> Any:
    """ratekeeper's FastAPI integration, the rule as a default limit, the middleware that
    matches the route itself (``RouteLimits.matching``: for routes declared before it)."""
    return RouteLimits(default=RULE).matching(bare())


def ratekeeper_decorator() -> Any:
    """ratekeeper's FastAPI integration, the rule as a decorator on the route."""
    limits = RouteLimits()
    app = FastAPI()
    limits.init_app(app)

    @app.get("/items")
    @limits.limit(RULE)
    async def items() -> dict[str, bool]:
        return {"ok": True}

    return app


def ratekeeper_guard() -> Any:
    """ratekeeper's ``@limit`` without ``init_app``, on an endpoint taking the request and the
    response (slowapi's signature): the guard decides alone."""
    limits = RouteLimits()
    app = FastAPI()

    @app.get("/items")
    @limits.limit(RULE)
    async def items(request: Request, response: Response) -> dict[str, bool]:
        return {"ok": True}

    return app


def compat_decorator() -> Any:
    """slowapi's decorator app with ``ratekeeper.compat.slowapi``'s imports."""
    from ratekeeper.compat import slowapi as compat

    limiter = compat.Limiter(key_func=compat.get_remote_address)
    app = FastAPI()
    app.state.limiter = limiter
    app.add_exception_handler(compat.RateLimitExceeded, compat._rate_limit_exceeded_handler)  # type: ignore[arg-type]  # the handler takes RateLimited

    @app.get("/items")
    @limiter.limit(RULE)
    async def items(request: Request, response: Response) -> dict[str, bool]:
        return {"ok": True}

    return app


def compat_middleware() -> Any:
    """slowapi's middleware app (a default limit) with ``ratekeeper.compat.slowapi``'s imports."""
    from ratekeeper.compat import slowapi as compat

    limiter = compat.Limiter(key_func=compat.get_remote_address, default_limits=[RULE])
    app = bare()
    app.state.limiter = limiter
    app.add_exception_handler(compat.RateLimitExceeded, compat._rate_limit_exceeded_handler)
    app.add_middleware(compat.SlowAPIMiddleware)
    return app


def slowapi_decorator(headers: bool) -> Variant:
    """slowapi's documented usage: a decorator on the route."""

    def build() -> Any:
        limiter = SlowLimiter(key_func=get_remote_address, headers_enabled=headers)
        app = FastAPI()
        app.state.limiter = limiter
        app.add_exception_handler(RateLimitExceeded, _rate_limit_exceeded_handler)  # type: ignore[arg-type, unused-ignore]  # slowapi's handler (unused: slowapi not installed)

        @app.get("/items")
        @limiter.limit(RULE)  # type: ignore[untyped-decorator, unused-ignore]  # slowapi: untyped
        async def items(request: Request, response: Response) -> dict[str, bool]:
            return {"ok": True}

        return app

    return build


def slowapi_middleware() -> Any:
    """slowapi's ASGI middleware applying a default limit to every route."""
    limiter = SlowLimiter(key_func=get_remote_address, default_limits=[RULE])
    app = bare()
    app.state.limiter = limiter
    app.add_exception_handler(RateLimitExceeded, _rate_limit_exceeded_handler)
    app.add_middleware(SlowAPIASGIMiddleware)
    return app


VARIANTS: dict[str, Variant] = {
    "bare FastAPI": bare,
    "ratekeeper (headers)": ratekeeper_headers,
    "ratekeeper FastAPI default limit": ratekeeper_defaults,
    "ratekeeper FastAPI matching": ratekeeper_matching,
    "ratekeeper FastAPI @limit": ratekeeper_decorator,
    "ratekeeper @limit, no init_app": ratekeeper_guard,
    "slowapi decorator": slowapi_decorator(False),
    "slowapi decorator (headers)": slowapi_decorator(True),
    "slowapi ASGI middleware": slowapi_middleware,
    "compat.slowapi decorator": compat_decorator,
    "compat.slowapi middleware": compat_middleware,
}

SCOPE = {
    "type": "http",
    "asgi": {"version": "3.0"},
    "http_version": "1.1",
    "method": "GET",
    "scheme": "http",
    "path": "/items",
    "raw_path": b"/items",
    "query_string": b"",
    "root_path": "",
    "headers": [(b"host", b"bench"), (b"user-agent", b"bench"), (b"accept", b"*/*")],
    "client": ("192.0.2.10", 50000),
    "server": ("bench", 80),
}


async def _receive() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


async def run_requests(app: Any, n: int) -> float:
    """Seconds for ``n`` sequential requests; checks every one got a 200."""
    statuses: list[int] = []

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    start = time.thread_time()
    for _ in range(n):
        await app(dict(SCOPE), _receive, send)
    elapsed = time.thread_time() - start
    if statuses != [200] * n:
        raise RuntimeError(f"unexpected statuses: {sorted(set(statuses))}")
    return elapsed


async def measure(requests: int, rounds: int) -> dict[str, float]:
    apps = {name: build() for name, build in VARIANTS.items()}
    for app in apps.values():  # warm up (lazy middleware stacks, caches)
        await run_requests(app, 200)
    samples: dict[str, list[float]] = {name: [] for name in apps}
    for _ in range(rounds):  # interleave variants so drifting load hits all alike
        for name, app in apps.items():
            samples[name].append(await run_requests(app, requests) / requests * 1e6)
    return {name: statistics.median(s) for name, s in samples.items()}


PAIRS = (
    ("ratekeeper (headers)", "slowapi ASGI middleware"),
    ("ratekeeper FastAPI default limit", "slowapi ASGI middleware"),
    ("ratekeeper FastAPI matching", "slowapi ASGI middleware"),
    ("ratekeeper FastAPI @limit", "slowapi decorator (headers)"),
    ("ratekeeper FastAPI @limit", "slowapi decorator"),
    ("ratekeeper @limit, no init_app", "slowapi decorator (headers)"),
    ("compat.slowapi decorator", "slowapi decorator (headers)"),
    ("compat.slowapi middleware", "slowapi ASGI middleware"),
)
SAME = (
    ("compat.slowapi decorator", "ratekeeper @limit, no init_app"),
    ("compat.slowapi middleware", "ratekeeper FastAPI matching"),
)
"""Each compat variant beside the integration path it maps onto."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    result = asyncio.run(measure(args.requests, args.rounds))
    base = result["bare FastAPI"]
    print(f"{'variant':34} {'us/request':>11} {'overhead us':>12}")
    for name, micros in result.items():
        print(f"{name:34} {micros:11.1f} {micros - base:12.1f}")
    print()
    for ours, theirs in PAIRS:
        ratio = (result[ours] - base) / (result[theirs] - base)
        print(f"{ours} / {theirs}: {ratio:.2f}x the overhead")
    print()
    for compat, native in SAME:
        ratio = (result[compat] - base) / (result[native] - base)
        print(f"{compat} / {native}: {ratio:.2f}x the overhead")
    print(f"({args.rounds} rounds of {args.requests} requests, median CPU time per request)")


if __name__ == "__main__":
    main()
