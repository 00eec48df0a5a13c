"""Nested limits on routes in every integration: FastAPI (decorator, dependency), Flask and
Django (``nested_ratelimit``): all or nothing, the level named, a streamed completion settled
with the tokens the view reported, a response header's cost — the first request to a route
included (its check is added after the request has started)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from fastapi import Depends, FastAPI, Request
from fastapi.responses import PlainTextResponse, StreamingResponse
from flask import Flask, Response
from flask import request as flask_request
from starlette.testclient import TestClient

from ratekeeper import ConfigError, Level, Limiter, ManualClock, MemoryStore
from ratekeeper.integrations.fastapi import RouteLimits as FastAPILimits
from ratekeeper.integrations.flask import RouteLimits as FlaskLimits
from ratekeeper.integrations.nested_routes import NestedLimit
from ratekeeper.middleware import CheckLevel, costs, keys

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

T0 = 1_700_000_040.0
TOKENS = [
    CheckLevel("org", "1000/minute", key=keys.header("x-org")),
    CheckLevel("key", "100/minute", key=keys.header("x-key")),
]
WHO = {"x-org": "acme", "x-key": "k1"}


def left(store: Any, check: str, clock: Any) -> list[int]:
    """The org's and the key's remaining tokens under ``check``."""
    levels = [
        Level(f"{check}:acme", "1000/minute", cost=0),
        Level(f"{check}:k1", "100/minute", cost=0, name=f"{check}.key"),
    ]
    return [d.remaining for d in Limiter(store, clock=clock).nested(levels, cost=0).levels]


def test_fastapi_decorator_settles_a_streamed_completion() -> None:
    store, clock = MemoryStore(), ManualClock(T0)
    limits = FastAPILimits(store=store, clock=clock)
    app = FastAPI()
    limits.init_app(app)

    @app.get("/complete")
    @limits.nested_limit(TOKENS, cost=40, actual=costs.reported(), name="chat")
    async def complete(request: Request, tokens: int) -> StreamingResponse:
        async def chunks() -> AsyncIterator[bytes]:
            for _ in range(tokens):
                costs.report(request.scope, 1)
                yield b"tok "

        return StreamingResponse(chunks())

    @app.get("/plain")
    @limits.nested_limit([CheckLevel("org", "2/minute", key=keys.header("x-org"))])
    async def plain() -> dict[str, bool]:
        return {"ok": True}

    client = TestClient(app)
    # the first request to the route: its check is added while the request runs
    r = client.get("/complete", params={"tokens": 7}, headers=WHO)
    assert r.content == b"tok " * 7
    assert r.headers["RateLimit-Policy"] == '"chat.key";q=100;w=60'
    assert left(store, "chat", clock) == [993, 93]
    client.get("/complete", params={"tokens": 150}, headers=WHO)  # the key runs into debt
    assert left(store, "chat", clock) == [843, 0]
    refused = client.get("/complete", params={"tokens": 1}, headers=WHO)
    assert refused.status_code == 429 and refused.json()["level"] == "chat.key"
    assert left(store, "chat", clock) == [843, 0]
    # counted per route when it has no name
    assert [client.get("/plain", headers=WHO).status_code for _ in range(3)] == [200, 200, 429]
    assert client.get("/plain", headers=WHO).headers["X-RateLimit-Resource"] == "GET /plain"


def test_fastapi_dependency_takes_a_nested_limit() -> None:
    store, clock = MemoryStore(), ManualClock(T0)
    limits = FastAPILimits(store=store, clock=clock)
    app = FastAPI()
    limits.init_app(app)
    limit = NestedLimit(tuple(TOKENS), cost=30, actual=costs.header("x-usage-tokens"), name="dep")

    @app.get("/used", dependencies=[Depends(limits.dependency(limit))])
    def used(tokens: int) -> PlainTextResponse:
        return PlainTextResponse("ok", headers={"x-usage-tokens": str(tokens)})

    client = TestClient(app)
    assert client.get("/used", params={"tokens": 12}, headers=WHO).status_code == 200
    assert left(store, "dep", clock) == [988, 88]
    with pytest.raises(ConfigError, match="takes no options"):
        limits.dependency(limit, cost=3)


def test_flask_decorator_settles_from_reports_when_the_body_closes() -> None:
    store, clock = MemoryStore(), ManualClock(T0)
    limits = FlaskLimits(store=store, clock=clock)
    app = Flask(__name__)
    limits.init_app(app)

    @app.get("/complete")
    @limits.nested_limit(TOKENS, cost=40, actual=costs.reported(), name="chat")
    def complete() -> Response:
        environ = flask_request.environ
        tokens = int(flask_request.args["tokens"])

        def chunks() -> Iterator[bytes]:
            for _ in range(tokens):
                costs.report(environ, 1)
                yield b"tok "

        return Response(chunks())

    client = app.test_client()
    r = client.get("/complete", query_string={"tokens": 9}, headers=WHO)
    assert r.get_data() == b"tok " * 9
    assert r.headers["RateLimit"] == '"chat.key";r=60;t=60'  # the estimate, when answered
    r.close()
    assert left(store, "chat", clock) == [991, 91]
    refused = client.get("/complete", query_string={"tokens": 1}, headers={**WHO, "x-org": ""})
    assert refused.status_code == 200  # no org key: the check does not apply


def test_nested_limit_bad_input_fails_at_decoration() -> None:
    limits = FastAPILimits()
    with pytest.raises(ConfigError, match="used twice"):
        limits.nested_limit([TOKENS[0], TOKENS[0]])
    with pytest.raises(ConfigError, match="ttl"):
        limits.nested_limit(TOKENS, ttl=0)
    with pytest.raises(TypeError):
        limits.nested_limit(TOKENS, rate="1/minute")


def test_django_nested_ratelimit_header_and_stream() -> None:
    from tests.integrations.django_project import setup

    setup()
    from django.test import Client, override_settings

    clock = ManualClock(T0)
    store = MemoryStore()
    with override_settings(RATEKEEPER={"CLOCK": clock}):
        from ratekeeper.integrations import django as rk

        limits = rk.current()
        store = limits.sync.limiter.store
        client = Client(REMOTE_ADDR="198.51.100.7")
        meta = {"HTTP_X_ORG": "acme", "HTTP_X_KEY": "k1"}
        r = client.get("/completion/", {"tokens": "25"}, **meta)
        assert r.status_code == 200 and r["RateLimit-Policy"] == '"completion.key";q=100;w=60'
        assert left(store, "completion", clock) == [975, 75]
        r = client.get("/completion/stream/", {"tokens": "11"}, **meta)
        assert b"".join(r.streaming_content) == b"tok " * 11  # type: ignore[attr-defined]
        r.close()
        assert left(store, "streamed", clock) == [989, 89]
