"""NestedCheck in the ASGI and WSGI middleware: all or nothing over org > user > key, the
rejecting level named, reservations settled when the response has ended (a header, what the
app reported while streaming, body bytes), cancelled when the request is cut short; quota
units in the headers."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from typing import Any

import httpx
import pytest
import redis
from fastapi import FastAPI, Request, Response
from fastapi.responses import StreamingResponse
from starlette.testclient import TestClient

from ratekeeper import AsyncLimiter, Level, Limiter, ManualClock, MemoryStore, RedisStore
from ratekeeper.errors import ConfigError
from ratekeeper.middleware import (
    CheckLevel,
    ConcurrencyCheck,
    NestedCheck,
    RateCheck,
    RateLimitMiddleware,
    WSGIRateLimitMiddleware,
    costs,
    keys,
)
from tests.middleware.servers import uvicorn_server, wait_until, wsgi_server

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

T0 = 1_700_000_040.0


def org_user_key(actual: costs.Actual | None = None, cost: Any = 1, **options: Any) -> NestedCheck:
    return NestedCheck(
        "llm",
        [
            CheckLevel("org", "3/minute", key=keys.header("x-org")),
            CheckLevel("user", "2/minute", key=keys.header("x-user")),
            CheckLevel("key", "100/minute", key=keys.header("x-key")),
        ],
        cost=cost,
        actual=actual,
        **options,
    )


def who(org: str = "acme", user: str = "u1", key: str = "k1") -> dict[str, str]:
    return {"x-org": org, "x-user": user, "x-key": key}


def remaining(store: Any, levels: list[Level], clock: Any) -> list[int]:
    """Each level's remaining units, looked at (cost 0) through a limiter of its own."""
    probe = [replace(lv, cost=0) for lv in levels]
    return [d.remaining for d in Limiter(store, clock=clock).nested(probe, cost=0).levels]


def llm_levels(org: str = "acme", user: str = "u1", key: str = "k1") -> list[Level]:
    return [
        Level(f"llm:{org}", "3/minute"),
        Level(f"llm:{user}", "2/minute", name="llm.user"),  # an inner level's counter is named
        Level(f"llm:{key}", "100/minute", name="llm.key"),  # by its level too
    ]


def app_with_routes() -> FastAPI:
    app = FastAPI()

    @app.get("/items")
    def items() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/boom")
    def boom() -> None:
        raise RuntimeError("handler failed")

    @app.get("/used")
    def used(tokens: int) -> Response:
        return Response("done", headers={"x-usage-tokens": str(tokens)})

    @app.get("/error")
    def error() -> Response:
        return Response("no", status_code=500, headers={"x-usage-tokens": "7"})

    @app.get("/complete")
    async def complete(request: Request, tokens: int) -> StreamingResponse:
        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(tokens):
                costs.report(request.scope, 1)  # one token per chunk, as it goes out
                yield b"tok "

        return StreamingResponse(chunks())

    @app.post("/upload")
    async def upload(request: Request) -> dict[str, int]:
        return {"read": len(await request.body())}

    return app


def client_for(app: Any) -> TestClient:
    return TestClient(app, client=("198.51.100.7", 40000), raise_server_exceptions=False)


def test_nested_check_is_all_or_nothing_and_names_the_level() -> None:
    store, clock = MemoryStore(), ManualClock(T0)
    mw = RateLimitMiddleware(app_with_routes(), [org_user_key()], store=store, clock=clock)
    client = client_for(mw)
    first = client.get("/items", headers=who())
    assert first.status_code == 200
    # the tightest level's headers: user (1 left of 2) over org (2 of 3) and key (99 of 100)
    assert first.headers["RateLimit-Policy"] == '"llm.user";q=2;w=60'
    assert first.headers["RateLimit"] == '"llm.user";r=1;t=60'
    assert first.headers["X-RateLimit-Resource"] == "llm"
    assert client.get("/items", headers=who()).status_code == 200
    refused = client.get("/items", headers=who())
    assert refused.status_code == 429
    body = refused.json()
    assert body["level"] == "llm.user" and body["policy"] == "llm"
    assert "'llm.user' (2/1m)" in body["message"]
    assert refused.headers["RateLimit-Policy"] == '"llm.user";q=2;w=60'
    # the user's refusal charged neither the org nor the key
    assert remaining(store, llm_levels(), clock) == [1, 0, 98]
    assert client.get("/items", headers=who(user="u2")).status_code == 200  # org: 0 left
    by_org = client.get("/items", headers=who(user="u3", key="k3"))
    assert by_org.status_code == 429 and by_org.json()["level"] == "llm.org"
    assert remaining(store, llm_levels(user="u3", key="k3"), clock) == [0, 2, 100]
    # a request without one of the keys is not this check's business
    assert client.get("/items", headers={"x-org": "acme"}).status_code == 200
    assert mw.stats()["checks"]["llm"]["rejected"] == 2


def test_a_later_rejection_and_a_304_give_every_level_back() -> None:
    store, clock = MemoryStore(), ManualClock(T0)
    app = app_with_routes()

    @app.get("/etag")
    def etag() -> Response:
        return Response(status_code=304)

    mw = RateLimitMiddleware(
        app,
        [org_user_key(), RateCheck("strict", "1/minute", routes=("/items",))],
        store=store,
        clock=clock,
    )
    client = client_for(mw)
    assert client.get("/items", headers=who()).status_code == 200
    assert client.get("/items", headers=who()).status_code == 429  # by "strict"
    assert remaining(store, llm_levels(), clock) == [2, 1, 99]
    for _ in range(4):
        assert client.get("/etag", headers=who()).status_code == 304
    assert remaining(store, llm_levels(), clock) == [2, 1, 99]


def test_settled_from_a_response_header() -> None:
    store, clock = MemoryStore(), ManualClock(T0)
    check = NestedCheck(
        "tokens",
        [
            CheckLevel("org", "1000/minute", key=keys.header("x-org")),
            CheckLevel("key", "500/minute", key=keys.header("x-key"), algorithm="token_bucket"),
        ],
        cost=200,
        actual=costs.header("x-usage-tokens"),
    )
    mw = RateLimitMiddleware(app_with_routes(), [check], store=store, clock=clock)
    client = client_for(mw)
    levels = [
        Level("tokens:acme", "1000/minute"),
        Level("tokens:k1", "500/minute", "token_bucket", name="tokens.key"),
    ]
    r = client.get("/used", params={"tokens": 37}, headers=who())
    assert r.status_code == 200
    assert r.headers["RateLimit"] == '"tokens.key";r=300;t=24'  # the estimate, when answered
    assert remaining(store, levels, clock) == [963, 463]
    client.get("/used", params={"tokens": 650}, headers=who())  # past the reservation
    assert remaining(store, levels, clock) == [313, 0]  # the key is 150 in debt
    refused = client.get("/used", params={"tokens": 1}, headers=who())
    assert refused.status_code == 429 and refused.json()["level"] == "tokens.key"
    assert remaining(store, levels, clock) == [313, 0]
    # a 500 is not charged (charge_when: default charges all but 304; here a rule of its own)
    strict = NestedCheck(
        "t2", [CheckLevel("org", "100/minute", key=keys.header("x-org"))], cost=10,
        actual=costs.header("x-usage-tokens"), charge_when=lambda status: status < 500,
    )  # fmt: skip
    mw2 = RateLimitMiddleware(app_with_routes(), [strict], store=store, clock=clock)
    assert client_for(mw2).get("/error", headers=who()).status_code == 500
    assert remaining(store, [Level("t2:acme", "100/minute")], clock) == [100]


def test_a_streamed_completion_is_settled_when_its_last_chunk_goes_out() -> None:
    store, clock = MemoryStore(), ManualClock(T0)
    check = NestedCheck(
        "tokens",
        [
            CheckLevel("org", "1000/minute", key=keys.header("x-org")),
            CheckLevel("key", "100/minute", key=keys.header("x-key")),
        ],
        cost=50,
        actual=costs.reported(),
    )
    mw = RateLimitMiddleware(app_with_routes(), [check], store=store, clock=clock)
    client = client_for(mw)
    levels = [
        Level("tokens:acme", "1000/minute"),
        Level("tokens:k1", "100/minute", name="tokens.key"),
    ]
    with client.stream("GET", "/complete", params={"tokens": 12}, headers=who()) as response:
        assert response.headers["RateLimit"] == '"tokens.key";r=50;t=60'
        assert b"".join(response.iter_bytes()) == b"tok " * 12
    assert remaining(store, levels, clock) == [988, 88]
    with client.stream("GET", "/complete", params={"tokens": 130}, headers=who()) as response:
        response.read()
    assert remaining(store, levels, clock) == [858, 0]  # the key: 130 past 88, in debt
    assert client.get("/complete", params={"tokens": 1}, headers=who()).status_code == 429


async def _raw(mw: Any, path: str, receive_body: bytes = b"", headers: Any = None) -> list[Any]:
    """One request through ``mw`` as an ASGI server would make it; the messages sent."""
    sent: list[Any] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": receive_body, "more_body": False}

    async def send(message: Any) -> None:
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
        "root_path": "", "headers": headers or [(b"host", b"t"), (b"x-org", b"acme")],
        "client": ("192.0.2.1", 5000), "server": ("t", 80),
    }  # fmt: skip
    await asyncio.wait_for(mw(scope, receive, send), timeout=30)
    return sent


def test_settled_before_the_app_returns() -> None:
    """The settle runs when the last chunk has been sent, not when the app returns (which may
    be much later: a background task, a slow cleanup)."""
    store, clock = MemoryStore(), ManualClock(T0)
    seen: list[int] = []
    levels = [Level("tokens:acme", "100/minute")]

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        costs.report(scope, 7)
        await send({"type": "http.response.body", "body": b"abc", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        seen.append(remaining(store, levels, clock)[0])  # after the last chunk: settled
        await asyncio.sleep(0)

    check = NestedCheck(
        "tokens", [CheckLevel("org", "100/minute", key=keys.header("x-org"))], cost=40,
        actual=costs.reported(),
    )  # fmt: skip
    mw = RateLimitMiddleware(app, [check], store=store, clock=clock)
    asyncio.run(_raw(mw, "/"))
    assert seen == [93]
    assert remaining(store, levels, clock) == [93]  # settled once, not again at the end


def test_cut_short_requests_give_the_estimate_back() -> None:
    store, clock = MemoryStore(), ManualClock(T0)
    levels = [Level("tokens:acme", "100/minute")]
    check = NestedCheck(
        "tokens", [CheckLevel("org", "100/minute", key=keys.header("x-org"))], cost=40,
        actual=costs.reported(),
    )  # fmt: skip

    async def raises(scope: Any, receive: Any, send: Any) -> None:
        costs.report(scope, 5)
        raise RuntimeError("before any response")

    mw = RateLimitMiddleware(raises, [check], store=store, clock=clock)
    with pytest.raises(RuntimeError):
        asyncio.run(_raw(mw, "/"))
    assert remaining(store, levels, clock) == [100]  # cancelled: nothing was answered

    async def dies_mid_body(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        costs.report(scope, 9)
        await send({"type": "http.response.body", "body": b"partial", "more_body": True})
        raise RuntimeError("mid-stream")

    mw = RateLimitMiddleware(dies_mid_body, [check], store=store, clock=clock)
    with pytest.raises(RuntimeError):
        asyncio.run(_raw(mw, "/"))
    assert remaining(store, levels, clock) == [91]  # what went out is charged


def test_client_gone_mid_stream_is_settled_with_what_was_sent(redis_url: str) -> None:
    """A real uvicorn on Redis: the client hangs up mid-completion; the reservation is
    settled with the tokens reported so far (not the estimate, not nothing)."""
    store = RedisStore(redis_url, socket_timeout=2.0)
    sent_tokens: list[int] = []
    app = FastAPI()

    @app.get("/complete")
    async def complete(request: Request) -> StreamingResponse:
        async def chunks() -> AsyncIterator[bytes]:
            for i in range(10_000):
                costs.report(request.scope, 1)
                sent_tokens.append(i)
                yield b"tok " * 256
                await asyncio.sleep(0.001)

        return StreamingResponse(chunks())

    check = NestedCheck(
        "tokens", [CheckLevel("org", "100000/minute", key=keys.header("x-org"))], cost=5000,
        actual=costs.reported(),
    )  # fmt: skip
    mw = RateLimitMiddleware(app, [check], store=store)
    client = redis.Redis.from_url(redis_url)
    with uvicorn_server(mw) as base, httpx.Client(base_url=base, timeout=10) as http:
        with http.stream("GET", "/complete", headers={"x-org": "acme"}) as response:
            next(response.iter_bytes())
        assert wait_until(lambda: len(sent_tokens) > 0)
        levels = [Level("tokens:acme", "100000/minute")]
        sync = Limiter(RedisStore(redis_url))

        def settled() -> bool:
            left = 100000 - sync.nested([replace_cost(lv) for lv in levels], cost=0).remaining
            return 0 < left < 5000 and left == len(sent_tokens)

        assert wait_until(settled), (len(sent_tokens), sync.nested(levels, cost=0).remaining)
    assert len(sent_tokens) < 10_000
    client.close()


def replace_cost(level: Level) -> Level:
    return replace(level, cost=0)


def test_one_evalsha_per_reserve_and_per_settle(redis_url: str) -> None:
    """A settling request costs two store round trips (reserve, settle), a plain nested
    one one: Redis' own command counts say so."""
    client = redis.Redis.from_url(redis_url)
    store = RedisStore(redis_url)
    checks = [org_user_key(costs.header("x-usage-tokens"), routes=("/used",))]
    plain = NestedCheck(
        "plain", [CheckLevel("org", "100/minute", key=keys.header("x-org"))], routes=("/items",)
    )
    checks.append(plain)
    mw = RateLimitMiddleware(app_with_routes(), checks, store=store)
    with client_for(mw) as http:  # one event loop for the async store's connections
        http.get("/used", params={"tokens": 0}, headers=who())  # loads the script
        client.config_resetstat()
        for n in range(5):
            got = http.get("/used", params={"tokens": 0}, headers=who(user=f"u{n}"))
            assert got.status_code == 200
        stats = client.info("commandstats")
        for n in range(4):
            assert http.get("/items", headers=who(user=f"i{n}")).status_code == 200
        after = client.info("commandstats")
    # commandstats counts the script's own calls too: a round trip is an EVALSHA
    assert stats["cmdstat_evalsha"]["calls"] == 10  # 5 reserves, 5 settles
    assert not {"cmdstat_eval", "cmdstat_multi", "cmdstat_exec", "cmdstat_script"} & set(stats)
    assert after["cmdstat_evalsha"]["calls"] == 14  # one per nested decision
    # the actual cost was 0 each time: the org got every estimate back
    assert remaining(RedisStore(redis_url), llm_levels(), time.time)[0] == 3
    client.close()


def test_content_bytes_charges_the_body_and_names_the_unit() -> None:
    store, clock = MemoryStore(), ManualClock(T0)
    check = NestedCheck(
        "upload",
        [CheckLevel("org", "1000/minute", key=keys.header("x-org"))],
        cost=costs.content_length(),
        actual=costs.request_bytes(),
        unit="content-bytes",
    )
    mw = RateLimitMiddleware(app_with_routes(), [check], store=store, clock=clock)
    client = client_for(mw)
    r = client.post("/upload", content=b"x" * 300, headers=who())
    assert r.json() == {"read": 300}
    assert r.headers["RateLimit-Policy"] == '"upload.org";q=1000;w=60;qu="content-bytes"'
    assert remaining(store, [Level("upload:acme", "1000/minute")], clock) == [700]
    # a lying Content-Length is settled with the bytes the app really read
    sent = asyncio.run(
        _raw(mw, "/upload", b"y" * 250, [(b"x-org", b"acme"), (b"content-length", b"10")])
    )
    assert sent[0]["status"] == 200
    assert remaining(store, [Level("upload:acme", "1000/minute")], clock) == [450]
    # a rate check can count bytes too (its cost from Content-Length)
    rc = RateCheck("bytes", "100/minute", cost=costs.content_length(), unit="content-bytes")
    mw2 = RateLimitMiddleware(app_with_routes(), [rc], clock=clock)
    r = client_for(mw2).post("/upload", content=b"z" * 60)
    assert r.headers["RateLimit-Policy"] == '"bytes";q=100;w=60;qu="content-bytes"'
    assert r.headers["RateLimit"] == '"bytes";r=40;t=60'


def test_concurrent_requests_unit_in_the_headers() -> None:
    clock = ManualClock(T0)
    mw = RateLimitMiddleware(
        app_with_routes(), [RateCheck("api", "10/minute"), ConcurrencyCheck("conc", 3)],
        clock=clock,
    )  # fmt: skip
    r = client_for(mw).get("/items")
    assert r.headers["RateLimit-Policy"] == ('"api";q=10;w=60, "conc";q=3;qu="concurrent-requests"')
    assert r.headers["RateLimit"] == '"api";r=9;t=60, "conc";r=2'


def test_a_bad_actual_cost_keeps_the_estimate_and_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store, clock = MemoryStore(), ManualClock(T0)
    check = NestedCheck(
        "tokens", [CheckLevel("org", "100/minute", key=keys.header("x-org"))], cost=10,
        actual=lambda request, usage: "twelve",  # type: ignore[arg-type,return-value]
    )  # fmt: skip
    mw = RateLimitMiddleware(app_with_routes(), [check], store=store, clock=clock)
    with caplog.at_level(logging.WARNING, logger="ratekeeper"):
        assert client_for(mw).get("/items", headers=who()).status_code == 200
    assert remaining(store, [Level("tokens:acme", "100/minute")], clock) == [90]
    assert "twelve" in caplog.text


def test_bad_configuration_is_refused() -> None:
    lv = CheckLevel("org", "10/minute")
    with pytest.raises(ConfigError, match="expected a list of CheckLevel"):
        NestedCheck("n", lv)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="used twice"):
        NestedCheck("n", [lv, lv])
    with pytest.raises(ConfigError, match="1 to 16"):
        NestedCheck("n", [])
    with pytest.raises(ConfigError, match="actual="):
        NestedCheck("n", [lv], actual=5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="unit="):
        NestedCheck("n", [lv], unit="tokens")
    with pytest.raises(ConfigError, match=r"no '\.'"):
        CheckLevel("a.b", "10/minute")
    with pytest.raises(ValueError, match="debt"):
        CheckLevel("org", "10/minute", debt=-1)
    with pytest.raises(ConfigError, match="cost"):
        NestedCheck("n", [lv], cost=-1)
    with pytest.raises(ConfigError, match="no ratekeeper middleware"):
        costs.report({}, 3)
    with pytest.raises(ConfigError, match="reported cost"):
        costs.Usage().report(-1)


# WSGI


def wsgi_app(environ: dict[str, Any], start_response: Any) -> Iterator[bytes]:
    path = environ["PATH_INFO"]
    if path == "/upload":
        body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
        start_response("200 OK", [("Content-Type", "text/plain")])
        return iter([str(len(body)).encode()])
    if path == "/used":
        start_response("200 OK", [("X-Usage-Tokens", "33")])
        return iter([b"done"])
    start_response("200 OK", [("Content-Type", "text/plain")])

    def completion() -> Iterator[bytes]:
        for _ in range(int(environ.get("QUERY_STRING") or "5")):
            costs.report(environ, 2)
            yield b"tok "

    return completion()


def test_wsgi_settles_when_the_body_is_closed() -> None:
    store, clock = MemoryStore(), ManualClock(T0)
    check = NestedCheck(
        "tokens",
        [
            CheckLevel("org", "1000/minute", key=keys.header("x-org")),
            CheckLevel("key", "100/minute", key=keys.header("x-key")),
        ],
        cost=50,
        actual=costs.reported(),
    )
    levels = [
        Level("tokens:acme", "1000/minute"),
        Level("tokens:k1", "100/minute", name="tokens.key"),
    ]
    mw = WSGIRateLimitMiddleware(wsgi_app, [check], store=store, clock=clock)
    with wsgi_server(mw) as base, httpx.Client(base_url=base, timeout=10) as http:
        r = http.get("/complete?7", headers=who())
        assert r.content == b"tok " * 7
        assert r.headers["RateLimit"] == '"tokens.key";r=50;t=60'
        assert wait_until(lambda: remaining(store, levels, clock) == [986, 86])
        header_check = NestedCheck(
            "t2", [CheckLevel("org", "100/minute", key=keys.header("x-org"))], cost=5,
            actual=costs.header("X-Usage-Tokens"),
        )  # fmt: skip
        mw2 = WSGIRateLimitMiddleware(wsgi_app, [header_check], store=store, clock=clock)
        bytes_check = NestedCheck(
            "up", [CheckLevel("org", "1000/minute", key=keys.header("x-org"))],
            cost=costs.content_length(), actual=costs.request_bytes(), unit="content-bytes",
        )  # fmt: skip
        mw3 = WSGIRateLimitMiddleware(wsgi_app, [bytes_check], store=store, clock=clock)
    with wsgi_server(mw2) as base, httpx.Client(base_url=base, timeout=10) as http:
        assert http.get("/used", headers=who()).status_code == 200
        assert wait_until(lambda: remaining(store, [Level("t2:acme", "100/minute")], clock) == [67])
    with wsgi_server(mw3) as base, httpx.Client(base_url=base, timeout=10) as http:
        r = http.post("/upload", content=b"q" * 123, headers=who())
        assert r.content == b"123"
        assert r.headers["RateLimit-Policy"] == '"up.org";q=1000;w=60;qu="content-bytes"'
        assert wait_until(
            lambda: remaining(store, [Level("up:acme", "1000/minute")], clock) == [877]
        )


def test_wsgi_app_raising_cancels_the_reservation() -> None:
    store, clock = MemoryStore(), ManualClock(T0)

    def raises(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        costs.report(environ, 3)
        raise RuntimeError("boom")

    check = NestedCheck(
        "tokens", [CheckLevel("org", "100/minute", key=keys.header("x-org"))], cost=30,
        actual=costs.reported(),
    )  # fmt: skip
    mw = WSGIRateLimitMiddleware(raises, [check], store=store, clock=clock)
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/", "REMOTE_ADDR": "192.0.2.1"}
    environ["HTTP_X_ORG"] = "acme"
    with pytest.raises(RuntimeError):
        mw(environ, lambda status, headers, exc_info=None: None)
    assert remaining(store, [Level("tokens:acme", "100/minute")], clock) == [100]


def test_async_limiter_refund_nested_matches_sync() -> None:
    async def main() -> list[int]:
        limiter = AsyncLimiter(clock=ManualClock(T0))
        levels = [Level("o", "5/minute"), Level("u", "3/minute")]
        await limiter.nested(levels, cost=2)
        await limiter.refund_nested(levels, cost=2)
        look = await limiter.nested([replace_cost(lv) for lv in levels], cost=0)
        return [d.remaining for d in look.levels]

    assert asyncio.run(main()) == [5, 3]
