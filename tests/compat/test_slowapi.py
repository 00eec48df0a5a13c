"""slowapi's apps ported by changing imports answer as under slowapi: the README app and the
default-limits app of docs/migrating.md, run by slowapi and by ratekeeper.compat.slowapi side
by side, through FastAPI's TestClient and a real uvicorn, on memory and on Redis. Then the
options a port meets: translated, or refused naming ratekeeper's equivalent."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from ratekeeper import ConfigError
from tests.compat import ports
from tests.compat.side import Answer, Clock, namespace, side_by_side, statuses
from tests.middleware.servers import uvicorn_server

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

README = ports.sample("slowapi", 0)
DEFAULTS = ports.sample("slowapi", 1)
README_REQUESTS = ["/home"] * 7 + ["/mars"] * 7
DEFAULTS_REQUESTS = ["/"] * 4 + ["/health"] * 4 + ["/missing"] * 2


@pytest.fixture(params=["memory", "redis"])
def storage(request: pytest.FixtureRequest) -> Iterator[str | None]:
    if request.param == "memory":
        yield None
        return
    url = request.getfixturevalue("redis_url")
    yield url


def build(source: str, peer: bool, url: str | None) -> Any:
    if peer:
        source = ports.peer_source(source)
    if url is not None:
        redis.Redis.from_url(url).flushall()
        source = ports.on_redis(source, "slowapi", url)
    return namespace(source, "slowapi_port_peer" if peer else "slowapi_port")["app"]


def answer(response: Any) -> Answer:
    body = response.text if response.status_code == 429 else None
    return Answer(response.status_code, body)


def through_testclient(source: str, paths: list[str], url: str | None) -> Any:
    def run(peer: bool) -> tuple[list[Answer], float]:
        client = TestClient(build(source, peer, url))
        clock = Clock()
        out = []
        for path in paths:
            clock.tick()
            out.append(answer(client.get(path)))
        clock.tick()
        return out, clock.seconds

    return run


def through_uvicorn(source: str, paths: list[str], url: str | None) -> Any:
    def run(peer: bool) -> tuple[list[Answer], float]:
        with uvicorn_server(build(source, peer, url)) as base, httpx.Client(base_url=base) as http:
            clock = Clock()
            out = []
            for path in paths:
                clock.tick()
                out.append(answer(http.get(path)))
            clock.tick()
            return out, clock.seconds

    return run


TRANSPORTS = {"testclient": through_testclient, "uvicorn": through_uvicorn}


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_readme_app_answers_as_under_slowapi(transport: str, storage: str | None) -> None:
    theirs, ours = side_by_side(
        TRANSPORTS[transport](README, README_REQUESTS, storage), budget=20.0
    )
    assert ours == theirs
    assert statuses(ours) == ([200] * 5 + [429] * 2) * 2  # and it limits at all
    assert ours[5].body == '{"error":"Rate limit exceeded: 5 per 1 minute"}'


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_default_limits_with_the_middleware_answer_as_under_slowapi(
    transport: str, storage: str | None
) -> None:
    theirs, ours = side_by_side(
        TRANSPORTS[transport](DEFAULTS, DEFAULTS_REQUESTS, storage), budget=20.0
    )
    assert ours == theirs
    assert statuses(ours) == [200, 200, 429, 429] + [200] * 4 + [404, 404]


def test_the_ports_differ_from_the_peers_apps_only_in_imports() -> None:
    for source in (README, DEFAULTS):
        peer = ports.peer_source(source)
        assert "ratekeeper" not in peer and "slowapi" in peer
        assert ports.without_imports(peer) == ports.without_imports(source)


# --- options a port meets


def make(**options: Any) -> Any:
    from ratekeeper.compat.slowapi import Limiter, get_remote_address

    return Limiter(key_func=get_remote_address, **options)


def test_options_that_cannot_be_honoured_are_refused_naming_ours() -> None:
    for options, named in [
        ({"in_memory_fallback": ["1/second"]}, "fail open"),
        ({"in_memory_fallback_enabled": True}, "fail open"),
        ({"retry_after": "http-date"}, "seconds"),
        ({"auto_check": False}, "return None from its key"),
        ({"config_filename": "limits.env"}, "pass the options"),
        ({"strategy": "fixed-window-elastic-expiry"}, "fixed-window"),
        ({"storage_uri": "memcached://localhost:11211"}, "memory"),
        ({"storage_uri": "redis://h:1", "storage_options": {"password": "x"}}, "in the URI"),
    ]:
        with pytest.raises(ConfigError, match=named):
            make(**options)
    limiter = make()
    with pytest.raises(ConfigError, match="give a string"):
        limiter.shared_limit("1/minute", scope=lambda endpoint: endpoint)
    with pytest.raises(ConfigError, match="a function is not supported"):
        limiter.limit("1/minute", error_message=lambda: "slow")
    with pytest.raises(ConfigError, match="empty it yourself"):
        limiter.reset()


def test_a_dotenv_with_slowapi_settings_is_refused(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".env").write_text("RATELIMIT_ENABLED=false\n")
    with pytest.raises(ConfigError, match=r"RATELIMIT_ENABLED from \.env"):
        make()


def test_translated_options_behave_as_slowapi_documents() -> None:
    from ratekeeper.compat.slowapi import (
        Limiter,
        RateLimitExceeded,
        _rate_limit_exceeded_handler,
        get_remote_address,
    )

    limiter = Limiter(key_func=get_remote_address, strategy="moving-window")
    app = FastAPI()
    app.state.limiter = limiter
    app.add_exception_handler(RateLimitExceeded, _rate_limit_exceeded_handler)

    @app.api_route("/m", methods=["GET", "POST"])
    @limiter.limit("1 per minute", per_method=True, error_message="slow down")
    async def per_method(request: Request) -> str:
        return "m"

    @app.get("/items/{n}")
    @limiter.limit("1/minute", cost=lambda request: int(request.query_params.get("c", 1)))
    async def item(request: Request, n: int) -> int:
        return n

    @app.get("/vip")
    @limiter.limit("1/minute", exempt_when=lambda request: request.headers.get("x-vip") == "1")
    async def vip(request: Request) -> str:
        return "vip"

    @app.get("/a")
    @limiter.shared_limit("2/minute", scope="pair")
    async def a(request: Request) -> str:
        return "a"

    @app.get("/b")
    @limiter.shared_limit("2/minute", scope="pair")
    async def b(request: Request) -> str:
        return "b"

    client = TestClient(app)
    assert [client.get("/m").status_code, client.post("/m").status_code] == [200, 200]
    refused = client.get("/m")
    assert refused.status_code == 429 and refused.json() == {
        "error": "Rate limit exceeded: slow down"
    }
    assert [client.get(f"/items/{n}").status_code for n in (1, 2, 1)] == [200, 200, 429]  # per path
    assert client.get("/items/3?c=2").status_code == 429  # cost 2 over 1/minute
    assert [client.get("/vip", headers={"x-vip": "1"}).status_code for _ in range(3)] == [200] * 3
    assert [client.get(p).status_code for p in ("/a", "/b", "/a")] == [200, 200, 429]
    limiter.enabled = False
    assert client.get("/a").status_code == 200
    assert limiter.routes.stats()["checks"]["pair"]["rejected"] == 1
