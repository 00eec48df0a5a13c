"""RateLimitMiddleware in front of a real FastAPI app: test client, raw ASGI, and real uvicorn."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis
from fastapi import FastAPI, Response
from fastapi.responses import StreamingResponse
from starlette.testclient import TestClient

from ratekeeper import ManualClock, MemoryStore, RedisStore, WorkerUtilizationShedder
from ratekeeper.middleware import (
    ConcurrencyCheck,
    Controls,
    FleetCheck,
    RateCheck,
    RateLimitMiddleware,
    WorkerCheck,
    keys,
    priorities,
    redis_flags,
)
from tests import redis_servers as rs
from tests.middleware.servers import uvicorn_server, wait_until

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def make_app(streamed: list[int] | None = None) -> FastAPI:
    app = FastAPI()

    @app.get("/items")
    def items() -> dict[str, bool]:
        return {"ok": True}

    @app.post("/charges")
    def charge() -> dict[str, bool]:
        return {"charged": True}

    @app.get("/etag")
    def etag() -> Response:
        return Response(status_code=304)

    @app.get("/boom")
    def boom() -> None:
        raise RuntimeError("handler failed")

    @app.get("/health")
    def health() -> str:
        return "ok"

    @app.get("/stream")
    async def stream() -> StreamingResponse:
        async def chunks() -> AsyncIterator[bytes]:
            for i in range(1000):
                if streamed is not None:
                    streamed.append(i)
                yield b"x" * 1024
                await asyncio.sleep(0.001)

        return StreamingResponse(chunks())

    return app


def client_for(app: Any, peer: str = "198.51.100.7") -> TestClient:
    return TestClient(app, client=(peer, 40000), raise_server_exceptions=False)


def test_headers_on_allowed_and_rejected_responses() -> None:
    clock = ManualClock()
    mw = RateLimitMiddleware(
        make_app(), [RateCheck("api", "2/minute; 100/hour")], clock=clock, exempt=["/health"]
    )
    client = client_for(mw)
    first = client.get("/items")
    assert first.status_code == 200 and first.json() == {"ok": True}
    assert first.headers["X-RateLimit-Limit"] == "2"
    assert first.headers["X-RateLimit-Remaining"] == "1"
    assert first.headers["X-RateLimit-Resource"] == "api"
    assert first.headers["RateLimit-Policy"] == '"api.2/1m";q=2;w=60, "api.100/1h";q=100;w=3600'
    assert "Retry-After" not in first.headers
    assert client.get("/items").headers["X-RateLimit-Remaining"] == "0"
    rejected = client.get("/items")
    assert rejected.status_code == 429
    assert rejected.headers["X-RateLimit-Remaining"] == "0"
    assert rejected.headers["Retry-After"] == "60"
    assert rejected.headers["content-type"] == "application/json"
    body = rejected.json()
    assert body["error"] == "rate_limited" and body["limit"] == 2 and body["retry_after"] == 60
    assert body["policy"] == "api" and "Retry after 60 seconds" in body["message"]
    assert client.get("/health").status_code == 200  # exempt
    assert "X-RateLimit-Limit" not in client.get("/health").headers
    clock.advance(60)
    assert client.get("/items").status_code == 200
    assert mw.stats()["checks"]["api"] == {
        "allowed": 3,
        "rejected": 1,
        "shadow_rejected": 0,
        "failed_open": 0,
        "skipped": 0,
    }


def test_add_middleware_per_route_rules_cost_and_keys() -> None:
    app = make_app()
    controls = Controls()
    app.add_middleware(
        RateLimitMiddleware,
        checks=[
            RateCheck("per-token", "10/minute", key=keys.header("X-API-Key"), routes=("/items",)),
            RateCheck("writes", "3/minute", methods=("POST",), cost=lambda r: 2),
        ],
        controls=controls,
        clock=ManualClock(),
    )
    client = client_for(app)
    assert client.get("/items").status_code == 200  # no token: the token rule is skipped
    for _ in range(10):
        assert client.get("/items", headers={"X-API-Key": "a"}).status_code == 200
    assert client.get("/items", headers={"X-API-Key": "a"}).status_code == 429
    assert client.get("/items", headers={"X-API-Key": "b"}).status_code == 200
    assert client.post("/charges").status_code == 200  # cost 2 of 3
    refused = client.post("/charges")
    assert refused.status_code == 429 and refused.headers["X-RateLimit-Resource"] == "writes"
    assert controls.stats()["per-token"]["rejected"] == 1


def test_not_modified_is_refunded_and_statuses_configurable() -> None:
    clock = ManualClock()
    mw = RateLimitMiddleware(make_app(), [RateCheck("api", "3/minute")], clock=clock)
    client = client_for(mw)
    for _ in range(10):
        assert client.get("/etag").status_code == 304
    assert client.get("/items").headers["X-RateLimit-Remaining"] == "2"
    strict = RateLimitMiddleware(
        make_app(), [RateCheck("api", "3/minute")], clock=clock, refund_statuses=()
    )
    client = client_for(strict)
    assert [client.get("/etag").status_code for _ in range(4)] == [304, 304, 304, 429]
    by_error = RateLimitMiddleware(
        make_app(), [RateCheck("api", "1/minute")], clock=clock, refund_statuses=(500,)
    )
    client = client_for(by_error)
    assert [client.get("/boom").status_code for _ in range(3)] == [500, 500, 500]


def test_rejection_refunds_earlier_charges() -> None:
    store = MemoryStore()
    mw = RateLimitMiddleware(
        make_app(),
        [RateCheck("api", "5/minute"), ConcurrencyCheck("conc", 1, key=keys.constant("all"))],
        store=store,
        clock=ManualClock(),
    )
    lease = store.acquire_lease("conc:all", "held", 1, 0, 2**50)  # another request holds it
    assert lease == (True, 1)
    client = client_for(mw)
    for _ in range(8):
        assert client.get("/items").status_code == 429
    store.release_lease("conc:all", "held", 0)
    assert client.get("/items").headers["X-RateLimit-Remaining"] == "4"


def test_concurrency_released_on_exception_and_after_streaming() -> None:
    store = MemoryStore()
    clock = ManualClock()
    streamed: list[int] = []
    mw = RateLimitMiddleware(
        make_app(streamed), [ConcurrencyCheck("conc", 1)], store=store, clock=clock
    )
    client = client_for(mw)
    for _ in range(3):
        assert client.get("/boom").status_code == 500
    assert store.count_leases("conc:198.51.100.7", 0) == 0
    with client.stream("GET", "/stream") as response:
        assert response.status_code == 200
        assert store.count_leases("conc:198.51.100.7", 0) == 1
        assert client.get("/items").status_code == 429
        assert sum(len(c) for c in response.iter_bytes()) == 1000 * 1024
    assert store.count_leases("conc:198.51.100.7", 0) == 0
    rejected = client.get("/items")
    assert rejected.status_code == 200


def test_concurrency_released_on_client_disconnect() -> None:
    """Raw ASGI: the client goes away mid-stream; Starlette cancels the stream; slot freed."""
    store = MemoryStore()
    streamed: list[int] = []
    mw = RateLimitMiddleware(make_app(streamed), [ConcurrencyCheck("conc", 1)], store=store)

    async def main() -> list[dict[str, Any]]:
        sent: list[dict[str, Any]] = []
        first_chunk = asyncio.Event()
        calls = 0

        async def receive() -> dict[str, Any]:
            nonlocal calls
            calls += 1
            if calls == 1:
                return {"type": "http.request", "body": b"", "more_body": False}
            await first_chunk.wait()
            return {"type": "http.disconnect"}

        async def send(message: Any) -> None:
            sent.append(message)
            if message["type"] == "http.response.body" and message.get("body"):
                assert store.count_leases("conc:192.0.2.1", 0) == 1
                first_chunk.set()

        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": "/stream",
            "raw_path": b"/stream",
            "query_string": b"",
            "root_path": "",
            "headers": [(b"host", b"test")],
            "client": ("192.0.2.1", 5000),
            "server": ("test", 80),
        }
        await asyncio.wait_for(mw(scope, receive, send), timeout=30)
        return sent

    sent = asyncio.run(main())
    assert sent[0]["status"] == 200
    assert len(streamed) < 1000  # the stream stopped early
    assert store.count_leases("conc:192.0.2.1", 0) == 0


def test_shadow_mode_counts_without_rejecting_and_switches_at_runtime() -> None:
    controls = Controls({"api": "shadow"})
    mw = RateLimitMiddleware(
        make_app(), [RateCheck("api", "2/minute")], controls=controls, clock=ManualClock()
    )
    client = client_for(mw)
    responses = [client.get("/items") for _ in range(5)]
    assert [r.status_code for r in responses] == [200] * 5
    assert all("X-RateLimit-Limit" not in r.headers for r in responses)  # dark: no headers
    assert controls.stats()["api"]["shadow_rejected"] == 3
    assert controls.stats()["api"]["allowed"] == 2
    controls.enforce("api")
    assert client.get("/items").status_code == 429
    controls.kill("api")
    assert [client.get("/items").status_code for _ in range(3)] == [200] * 3
    assert controls.stats()["api"]["skipped"] == 3
    controls.set("*", "shadow")  # a default for every check without its own mode
    controls.clear("api")
    assert client.get("/items").status_code == 200
    assert controls.mode("api") == "shadow"


def test_modes_from_redis_flags(redis_url: str) -> None:
    flags = redis.Redis.from_url(redis_url)
    clock = ManualClock()
    controls = Controls(source=redis_flags(flags), refresh_every=5, monotonic=clock)
    mw = RateLimitMiddleware(
        make_app(), [RateCheck("api", "1/minute")], controls=controls, clock=clock
    )
    client = client_for(mw)
    assert [client.get("/items").status_code for _ in range(2)] == [200, 429]
    flags.hset("ratekeeper:modes", "api", "off")
    assert client.get("/items").status_code == 429  # not refreshed yet
    clock.advance(5)
    assert client.get("/items").status_code == 200
    flags.hset("ratekeeper:modes", mapping={"api": "bogus", "*": "shadow"})
    clock.advance(5)
    assert controls.mode("api") == "shadow"  # an unknown value falls back to "*"
    flags.delete("ratekeeper:modes")
    clock.advance(5)
    assert client.get("/items").status_code == 429


def test_fail_open_with_redis_killed(
    fresh_redis: rs.RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    store = RedisStore(fresh_redis.url)
    mw = RateLimitMiddleware(
        make_app(),
        [RateCheck("api", "1/minute"), ConcurrencyCheck("conc", 5), FleetCheck(capacity=10)],
        store=store,
        clock=ManualClock(),
    )
    with client_for(mw) as client:  # one event loop for the async Redis client's connections
        assert [client.get("/items").status_code for _ in range(2)] == [200, 429]
        fresh_redis.kill()
        with caplog.at_level(logging.WARNING, logger="ratekeeper"):
            statuses = [client.get("/items").status_code for _ in range(30)]
    assert statuses == [200] * 30
    stats = mw.stats()["checks"]
    assert stats["api"]["failed_open"] == 30
    assert stats["conc"]["failed_open"] == 30 and stats["fleet"]["failed_open"] == 30
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert 1 <= len(warnings) <= 3  # once per interval per component, never per request
    fresh_redis.restart()


def test_bug_in_a_key_function_fails_open(caplog: pytest.LogCaptureFixture) -> None:
    def broken(request: object) -> str:
        raise KeyError("no such thing")

    mw = RateLimitMiddleware(make_app(), [RateCheck("api", "1/minute", key=broken)])
    client = client_for(mw)
    with caplog.at_level(logging.WARNING, logger="ratekeeper"):
        assert [client.get("/items").status_code for _ in range(5)] == [200] * 5
    assert mw.stats()["checks"]["api"]["failed_open"] == 5
    assert mw.stats()["user_errors"] == {"api": {"key": 5}}
    logged = [r for r in caplog.records if "its key function" in r.message]
    assert len(logged) == 1 and logged[0].levelno == logging.ERROR and logged[0].exc_info


def test_spoofed_forwarded_for_from_untrusted_peer_is_ignored() -> None:
    check = RateCheck("ip", "2/minute", key=keys.client_ip(trusted_proxies=["10.0.0.0/8"]))
    mw = RateLimitMiddleware(make_app(), [check], clock=ManualClock())
    attacker = client_for(mw, peer="203.0.113.5")
    statuses = [
        attacker.get("/items", headers={"X-Forwarded-For": f"1.1.1.{i}"}).status_code
        for i in range(4)
    ]
    assert statuses == [200, 200, 429, 429]
    proxy = client_for(mw, peer="10.0.0.2")
    statuses = [
        proxy.get("/items", headers={"X-Forwarded-For": f"1.1.1.{i}"}).status_code for i in range(4)
    ]
    assert statuses == [200] * 4  # four distinct clients behind a trusted proxy


def test_fleet_shedder_returns_503_but_never_for_critical() -> None:
    store = MemoryStore()
    mw = RateLimitMiddleware(
        make_app(),
        [FleetCheck(capacity=5, reserved_for_critical=0.2)],
        store=store,
        priority=priorities(critical=["/charges"]),
    )
    for i in range(4):  # four requests in progress elsewhere in the fleet
        store.acquire_lease("fleet", f"other{i}", 10, 0, 2**50)
    client = client_for(mw)
    shed = client.get("/items")
    assert shed.status_code == 503 and shed.json()["error"] == "overloaded"
    assert shed.headers["Retry-After"] == "5"
    assert client.post("/charges").status_code == 200
    assert store.count_leases("fleet", 0) == 4  # the critical lease was released


def test_worker_shedder_drops_low_tiers_when_saturated() -> None:
    clock = ManualClock()
    level = [1.0]
    shedder = WorkerUtilizationShedder(lambda: level[0], clock=clock, random=lambda: 0.5)
    mw = RateLimitMiddleware(
        make_app(),
        [WorkerCheck(shedder)],
        clock=clock,
        priority=priorities(critical=["/charges"], test_mode=lambda r: r.header("x-test") == "1"),
    )
    client = client_for(mw)
    assert client.get("/items", headers={"x-test": "1"}).status_code == 200
    for _ in range(80):  # 80 s of saturation, sampled by (critical) traffic once a second
        clock.advance(1)
        assert client.post("/charges").status_code == 200
    assert client.get("/items", headers={"x-test": "1"}).status_code == 503  # test tier: 100%
    assert client.get("/items").status_code == 200  # get tier: 30% < 0.5, not shed
    for _ in range(20):
        clock.advance(1)
        assert client.post("/charges").status_code == 200
    assert client.get("/items").status_code == 503
    assert client.post("/charges").status_code == 200  # critical: never
    assert mw.stats()["checks"]["workers"]["rejected"] == 2


def test_worker_shedder_default_signal_is_in_flight_share() -> None:
    clock = ManualClock()
    shedder = WorkerUtilizationShedder(clock=clock, random=lambda: 0.0)
    mw = RateLimitMiddleware(make_app(), [WorkerCheck(shedder, max_in_flight=1)], clock=clock)
    client = client_for(mw)
    for _ in range(40):  # one request in flight of one allowed: utilization 1.0
        clock.advance(1)
        assert client.get("/items").status_code == 200 or shedder.shedding_amount > 0
    assert shedder.shedding_amount > 0
    assert mw.stats()["in_flight"] == 0


def test_lifespan_and_other_scopes_pass_through() -> None:
    app = make_app()
    started: list[bool] = []

    @app.on_event("startup")
    def startup() -> None:
        started.append(True)

    with TestClient(RateLimitMiddleware(app, [RateCheck("api", "1/minute")])) as client:
        assert client.get("/items").status_code == 200
    assert started == [True]


def test_real_uvicorn_server() -> None:
    store = MemoryStore()
    streamed: list[int] = []
    mw = RateLimitMiddleware(
        make_app(streamed),
        [
            RateCheck("api", "3/minute", routes=("/items",)),
            ConcurrencyCheck("conc", 1, routes=("/stream",)),
        ],
        store=store,
        clock=ManualClock(),
    )
    with uvicorn_server(mw) as base, httpx.Client(base_url=base, timeout=10) as http:
        statuses = [http.get("/items").status_code for _ in range(4)]
        assert statuses == [200, 200, 200, 429]
        allowed = http.get("/health")
        assert allowed.status_code == 200
        rejected = http.get("/items")
        assert rejected.headers["X-RateLimit-Resource"] == "api"
        assert json.loads(rejected.content)["error"] == "rate_limited"
        # the client hangs up mid-stream: uvicorn tells the app, the slot is released
        with http.stream("GET", "/stream") as response:
            assert store.count_leases("conc:127.0.0.1", 0) == 1
            next(response.iter_bytes())
        assert wait_until(lambda: store.count_leases("conc:127.0.0.1", 0) == 0)
        assert len(streamed) < 1000
        assert http.get("/health").status_code == 200
        head = http.head("/items")  # a rejected HEAD has the headers and no body
        assert head.status_code == 429 and head.content == b""
        assert head.headers["X-RateLimit-Resource"] == "api"


def test_slot_released_when_the_request_is_cancelled_on_redis(redis_url: str) -> None:
    """The app task is cancelled (anyio task group, as Starlette uses): the lease is released."""
    import anyio

    store = RedisStore(redis_url, socket_timeout=2.0)
    entered = asyncio.Event()

    async def hang(scope: Any, receive: Any, send: Any) -> None:
        entered.set()
        await asyncio.Event().wait()

    mw = RateLimitMiddleware(hang, [ConcurrencyCheck("conc", 1)], store=store)
    scope = {"type": "http", "method": "GET", "path": "/", "headers": [], "client": ("1.2.3.4", 1)}

    async def main() -> int:
        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": b""}

        async def send(message: Any) -> None:
            pass

        async with anyio.create_task_group() as group:
            group.start_soon(mw, scope, receive, send)
            await entered.wait()
            assert await store.count_leases_async("conc:1.2.3.4", 0) == 1
            group.cancel_scope.cancel()
        for _ in range(200):  # the (shielded) release may finish on its own task
            if await store.count_leases_async("conc:1.2.3.4", 0) == 0:
                break
            await asyncio.sleep(0.01)
        left = await store.count_leases_async("conc:1.2.3.4", 0)
        await store.aclose()
        return left

    assert asyncio.run(main()) == 0
