"""WSGIRateLimitMiddleware in front of a real Flask app: test client and a real wsgiref server."""

from __future__ import annotations

import logging
import socket
import struct
import threading
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest
from flask import Flask, Response

from ratekeeper import ManualClock, MemoryStore, RedisStore
from ratekeeper.middleware import (
    ConcurrencyCheck,
    Controls,
    FleetCheck,
    RateCheck,
    WSGIRateLimitMiddleware,
    keys,
    priorities,
)
from tests import redis_servers as rs
from tests.middleware.servers import wait_until, wsgi_server


def make_app(streamed: list[int] | None = None, gate: threading.Event | None = None) -> Flask:
    app = Flask(__name__)

    @app.get("/items")
    def items() -> dict[str, bool]:
        return {"ok": True}

    @app.post("/charges")
    def charge() -> dict[str, bool]:
        return {"charged": True}

    @app.get("/etag")
    def etag() -> Response:
        return Response(status=304)

    @app.get("/boom")
    def boom() -> str:
        raise RuntimeError("handler failed")

    @app.get("/stream")
    def stream() -> Response:
        def chunks() -> Iterator[bytes]:
            for i in range(2000):
                if streamed is not None:
                    streamed.append(i)
                if gate is not None and i == 1:
                    gate.wait(10)
                yield b"x" * 4096

        return Response(chunks())

    return app


def wrap(app: Flask, **options: object) -> Flask:
    app.wsgi_app = WSGIRateLimitMiddleware(app.wsgi_app, **options)  # type: ignore[method-assign, arg-type]  # the documented Flask way
    return app


def middleware(app: Flask) -> WSGIRateLimitMiddleware:
    mw = app.wsgi_app
    assert isinstance(mw, WSGIRateLimitMiddleware)
    return mw


PEER = {"REMOTE_ADDR": "198.51.100.7"}


def test_headers_on_allowed_and_rejected_responses() -> None:
    clock = ManualClock()
    app = wrap(make_app(), checks=[RateCheck("api", "2/minute")], clock=clock)
    client = app.test_client()
    first = client.get("/items", environ_base=PEER, buffered=True)
    assert first.status_code == 200 and first.json == {"ok": True}
    assert first.headers["X-RateLimit-Remaining"] == "1"
    assert first.headers["X-RateLimit-Resource"] == "api"
    assert first.headers["RateLimit"] == '"api";r=1;t=60'
    client.get("/items", environ_base=PEER, buffered=True)
    rejected = client.get("/items", environ_base=PEER, buffered=True)
    assert rejected.status_code == 429 and rejected.headers["Retry-After"] == "60"
    assert rejected.json is not None and rejected.json["error"] == "rate_limited"
    assert rejected.json["limit"] == 2 and rejected.json["policy"] == "api"
    clock.advance(60)
    assert client.get("/items", environ_base=PEER, buffered=True).status_code == 200


def test_not_modified_is_refunded() -> None:
    app = wrap(make_app(), checks=[RateCheck("api", "2/minute")], clock=ManualClock())
    client = app.test_client()
    for _ in range(5):
        assert client.get("/etag", environ_base=PEER, buffered=True).status_code == 304
    assert (
        client.get("/items", environ_base=PEER, buffered=True).headers["X-RateLimit-Remaining"]
        == "1"
    )


def test_concurrency_released_on_exception_and_after_streaming() -> None:
    store = MemoryStore()
    app = wrap(make_app(), checks=[ConcurrencyCheck("conc", 1)], store=store)
    app.testing = False  # let Flask turn the exception into a 500
    client = app.test_client()
    for _ in range(3):
        assert client.get("/boom", environ_base=PEER, buffered=True).status_code == 500
    assert store.count_leases("conc:198.51.100.7", 0) == 0
    response = client.get("/stream", environ_base=PEER, buffered=False)
    assert store.count_leases("conc:198.51.100.7", 0) == 1
    assert client.get("/items", environ_base=PEER, buffered=True).status_code == 429
    assert len(response.get_data()) == 2000 * 4096
    response.close()
    assert store.count_leases("conc:198.51.100.7", 0) == 0


def test_shadow_and_kill_switch() -> None:
    controls = Controls({"api": "shadow"})
    app = wrap(make_app(), checks=[RateCheck("api", "1/minute")], controls=controls)
    client = app.test_client()
    assert [
        client.get("/items", environ_base=PEER, buffered=True).status_code for _ in range(3)
    ] == [200] * 3
    assert controls.stats()["api"]["shadow_rejected"] == 2
    controls.enforce("api")
    assert client.get("/items", environ_base=PEER, buffered=True).status_code == 429
    controls.kill("api")
    assert client.get("/items", environ_base=PEER, buffered=True).status_code == 200


def test_fleet_shedding_is_503_and_critical_passes() -> None:
    store = MemoryStore()
    store.acquire_lease("fleet", "elsewhere", 10, 0, 2**50)
    app = wrap(
        make_app(),
        checks=[FleetCheck(capacity=2, reserved_for_critical=0.5)],
        store=store,
        priority=priorities(critical=["/charges"]),
    )
    client = app.test_client()
    assert client.get("/items", environ_base=PEER, buffered=True).status_code == 503
    assert client.post("/charges", environ_base=PEER, buffered=True).status_code == 200


def test_trusted_proxy_and_spoofing() -> None:
    check = RateCheck("ip", "1/minute", key=keys.client_ip(["10.0.0.0/8"]))
    app = wrap(make_app(), checks=[check], clock=ManualClock())
    client = app.test_client()
    spoofed = [
        client.get(
            "/items", environ_base=PEER, buffered=True, headers={"X-Forwarded-For": f"1.1.1.{i}"}
        ).status_code
        for i in range(3)
    ]
    assert spoofed == [200, 429, 429]
    proxied = [
        client.get(
            "/items",
            environ_base={"REMOTE_ADDR": "10.1.2.3"},
            buffered=True,
            headers={"X-Forwarded-For": f"1.1.1.{i}"},
        ).status_code
        for i in range(3)
    ]
    assert proxied == [200, 200, 200]


def test_fail_open_with_redis_killed(
    fresh_redis: rs.RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    store = RedisStore(fresh_redis.url)
    app = wrap(
        make_app(),
        checks=[RateCheck("api", "1/minute"), ConcurrencyCheck("conc", 3)],
        store=store,
        clock=ManualClock(),
    )
    client = app.test_client()
    assert [
        client.get("/items", environ_base=PEER, buffered=True).status_code for _ in range(2)
    ] == [200, 429]
    fresh_redis.kill()
    with caplog.at_level(logging.WARNING, logger="ratekeeper"):
        statuses = [
            client.get("/items", environ_base=PEER, buffered=True).status_code for _ in range(20)
        ]
    assert statuses == [200] * 20
    checks = middleware(app).stats()["checks"]
    assert checks["api"]["failed_open"] == 20 and checks["conc"]["failed_open"] == 20
    assert 1 <= len([r for r in caplog.records if r.levelno == logging.WARNING]) <= 2


def test_real_wsgi_server_and_client_disconnect() -> None:
    store = MemoryStore()
    streamed: list[int] = []
    gate = threading.Event()
    app = wrap(
        make_app(streamed, gate),
        checks=[
            RateCheck("api", "2/minute", routes=("/items",)),
            ConcurrencyCheck("conc", 1, routes=("/stream", "/boom")),
        ],
        store=store,
        clock=ManualClock(),
    )
    with wsgi_server(app) as base:
        with httpx.Client(base_url=base, timeout=10) as web:
            assert [web.get("/items").status_code for _ in range(3)] == [200, 200, 429]
            assert web.get("/items").json()["error"] == "rate_limited"
        # a client that reads one chunk of a stream and hangs up
        parts = urlsplit(base)
        sock = socket.create_connection((parts.hostname or "", parts.port or 80), timeout=10)
        sock.sendall(b"GET /stream HTTP/1.1\r\nHost: test\r\n\r\n")
        assert sock.recv(100).startswith(b"HTTP/1.0 200")
        assert store.count_leases("conc:127.0.0.1", 0) == 1
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()  # a reset: the client is gone
        gate.set()
        assert wait_until(lambda: store.count_leases("conc:127.0.0.1", 0) == 0)
        assert len(streamed) < 2000
        with httpx.Client(base_url=base, timeout=10) as web:
            assert web.get("/boom").status_code == 500
            # the server closes the response after sending it: wait for that, bounded
            assert wait_until(lambda: store.count_leases("conc:127.0.0.1", 0) == 0)


def test_fleet_usage_is_shared_between_hosts_through_redis(redis_url: str) -> None:
    """Two app instances ("hosts") over one Redis: a request in progress on one counts on both."""
    hosts = [
        wrap(
            make_app(),
            checks=[FleetCheck(capacity=2, reserved_for_critical=0.5)],
            store=RedisStore(redis_url, socket_timeout=2.0),
            priority=priorities(critical=["/charges"]),
        ).test_client()
        for _ in range(2)
    ]
    streaming = hosts[0].get("/stream", environ_base=PEER)  # in progress until closed
    assert streaming.status_code == 200
    shed = hosts[1].get("/items", environ_base=PEER, buffered=True)
    assert shed.status_code == 503 and shed.json is not None
    assert shed.json["error"] == "overloaded" and shed.json["limit"] == 2
    assert hosts[1].post("/charges", environ_base=PEER, buffered=True).status_code == 200
    streaming.close()
    assert hosts[1].get("/items", environ_base=PEER, buffered=True).status_code == 200
