"""Flask-Limiter's apps ported by changing imports answer as under Flask-Limiter: the quick start
of docs/migrating.md and the README app, run by Flask-Limiter and by
ratekeeper.compat.flask_limiter side by side, through Flask's test client and a real waitress,
on memory and on Redis. Then the settings and options a port meets."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis
from flask import Blueprint, Flask

from ratekeeper import ConfigError
from tests.compat import ports
from tests.compat.side import Answer, Clock, namespace, side_by_side, statuses
from tests.middleware.servers import waitress_server

QUICK_START = ports.sample("Flask-Limiter", 0)
README = """\
from flask import Flask

from ratekeeper.compat.flask_limiter import Limiter, get_remote_address

app = Flask(__name__)
limiter = Limiter(
    get_remote_address,
    app=app,
    default_limits=["2 per minute", "1 per second"],
    storage_uri="memory://",
    strategy="fixed-window",
)


@app.route("/slow")
@limiter.limit("1 per day")
def slow():
    return "24"


@app.route("/fast")
def fast():
    return "42"


@app.route("/ping")
@limiter.exempt
def ping():
    return "PONG"
"""
QUICK_START_REQUESTS = ["/slow"] * 3 + ["/medium"] * 3 + ["/fast"] * 3 + ["/ping"] * 3
README_REQUESTS = ["/fast"] * 4 + ["/slow"] * 2 + ["/ping"] * 3


@pytest.fixture(params=["memory", "redis"])
def storage(request: pytest.FixtureRequest) -> Iterator[str | None]:
    yield None if request.param == "memory" else request.getfixturevalue("redis_url")


def build(source: str, peer: bool, url: str | None) -> Flask:
    if peer:
        source = ports.peer_source(source)
    if url is not None:
        redis.Redis.from_url(url).flushall()
        source = ports.on_redis(source, "flask_limiter", url)
    app: Flask = namespace(source, "flask_port_peer" if peer else "flask_port")["app"]
    return app


def answer(status: int, text: str) -> Answer:
    return Answer(status, text if status == 429 else None)


def through_test_client(source: str, paths: list[str], url: str | None) -> Any:
    def run(peer: bool) -> tuple[list[Answer], float]:
        client = build(source, peer, url).test_client()
        clock = Clock()
        out = []
        for path in paths:
            clock.tick()
            response = client.get(path, buffered=True)  # closed, as a server closes it
            out.append(answer(response.status_code, response.get_data(as_text=True)))
        clock.tick()
        return out, clock.seconds

    return run


def through_waitress(source: str, paths: list[str], url: str | None) -> Any:
    def run(peer: bool) -> tuple[list[Answer], float]:
        with waitress_server(build(source, peer, url)) as base, httpx.Client(base_url=base) as http:
            clock = Clock()
            out = []
            for path in paths:
                clock.tick()
                response = http.get(path)
                out.append(answer(response.status_code, response.text))
            clock.tick()
            return out, clock.seconds

    return run


TRANSPORTS = {"test-client": through_test_client, "waitress": through_waitress}


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_quick_start_app_answers_as_under_flask_limiter(
    transport: str, storage: str | None
) -> None:
    theirs, ours = side_by_side(TRANSPORTS[transport](QUICK_START, QUICK_START_REQUESTS, storage))
    assert ours == theirs
    assert statuses(ours) == [200, 429, 429, 200, 429, 429] + [200] * 6
    assert ours[1].body is not None and "<p>1 per 1 day</p>" in ours[1].body


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_readme_app_answers_as_under_flask_limiter(transport: str, storage: str | None) -> None:
    theirs, ours = side_by_side(TRANSPORTS[transport](README, README_REQUESTS, storage))
    assert ours == theirs
    assert statuses(ours) == [200, 429, 429, 429, 200, 429, 200, 200, 200]


def test_the_ports_differ_from_the_peers_apps_only_in_imports() -> None:
    for source in (QUICK_START, README):
        peer = ports.peer_source(source)
        assert "ratekeeper" not in peer and "flask_limiter" in peer
        assert ports.without_imports(peer) == ports.without_imports(source)


# --- settings and options a port meets


def limiter_on(app: Flask, **options: Any) -> Any:
    from ratekeeper.compat.flask_limiter import Limiter, get_remote_address

    return Limiter(get_remote_address, app=app, **options)


def test_flask_limiter_settings_are_translated() -> None:
    app = Flask(__name__)
    app.config.update(
        RATELIMIT_DEFAULT="1 per minute",
        RATELIMIT_STRATEGY="moving-window",
        RATELIMIT_HEADERS_ENABLED=True,
        RATELIMIT_STORAGE_URI="memory://",
        RATELIMIT_SWALLOW_ERRORS=True,
        RATELIMIT_HEADER_RETRY_AFTER="Retry-After",  # the default name: accepted
        RATELIMIT_MODE="enforce",  # ratekeeper's own, passed through
    )

    @app.get("/x")
    def x() -> str:
        return "x"

    limiter = limiter_on(app)
    client = app.test_client()
    got = [client.get("/x", buffered=True) for _ in range(2)]
    assert [r.status_code for r in got] == [200, 429]
    assert got[0].headers["X-RateLimit-Limit"] == "1"  # headers on every response
    assert limiter.routes.stats(app)["checks"]["x"]["rejected"] == 1


def test_settings_and_options_that_cannot_be_honoured_are_refused_naming_ours() -> None:
    for config, named in [
        ({"RATELIMIT_DEFAULTS_DEDUCT_WHEN": lambda r: True}, "charge_when"),
        ({"RATELIMIT_ON_BREACH_CALLBACK": print}, "errorhandler"),
        ({"RATELIMIT_META": "5/hour"}, "meta limits"),
        ({"RATELIMIT_IN_MEMORY_FALLBACK_ENABLED": True}, "fail open"),
        ({"RATELIMIT_HEADER_LIMIT": "X-Limit"}, "keep their names"),
        ({"RATELIMIT_HEADER_RETRY_AFTER_VALUE": "http-date"}, "delta-seconds"),
        ({"RATELIMIT_FAIL_ON_FIRST_BREACH": False}, "all-or-nothing"),
        ({"RATELIMIT_STORAGE_URI": "mongodb://localhost"}, "memory"),
        ({"RATELIMIT_STRATEGY": "fixed-window-elastic-expiry"}, "fixed-window"),
        ({"RATELIMIT_STORAGE_URL": "redis://x"}, "unknown to Flask-Limiter"),
    ]:
        app = Flask(__name__)
        app.config.update(config)
        with pytest.raises(ConfigError, match=named):
            limiter_on(app)
    for options, named in [
        ({"on_breach": print}, "errorhandler"),
        ({"meta_limits": ["1/hour"]}, "meta limits"),
        ({"default_limits_deduct_when": lambda r: True}, "charge_when"),
        ({"request_identifier": lambda: "x"}, "per endpoint"),
        ({"header_name_mapping": {"a": "b"}}, "keep their names"),
        ({"retry_after": "http-date"}, "delta-seconds"),
    ]:
        with pytest.raises(ConfigError, match=named):
            limiter_on(Flask(__name__), **options)
    limiter = limiter_on(Flask(__name__))
    for call, named in [
        (lambda: limiter.limit("1/minute", deduct_when=lambda r: True), "charge_when"),
        (lambda: limiter.limit("1/minute", scope=lambda endpoint: endpoint), "give a string"),
        (lambda: limiter.limit("1/minute", error_message=lambda: "x"), "give a string"),
        (lambda: limiter.request_filter(lambda: True), "return None"),
        (lambda: limiter.exempt(flags=limiter_flags().DEFAULT), "default flags"),
        (lambda: limiter.reset(), "yourself"),
        (lambda: limiter.current_limit, "headers"),
    ]:
        with pytest.raises(ConfigError, match=named):
            call()
    with pytest.raises(ConfigError, match="context manager"), limiter.limit("1/second"):
        pass


def limiter_flags() -> Any:
    from ratekeeper.compat.flask_limiter import ExemptionScope

    return ExemptionScope


def test_per_method_costs_blueprints_and_shared_limits() -> None:
    from ratekeeper.compat.flask_limiter import Limit, Limiter, get_remote_address

    app = Flask(__name__)
    limiter = Limiter(
        get_remote_address,
        app=app,
        default_limits=[Limit("1/minute", per_method=True)],
        application_limits=["100/minute"],
        storage_uri="memory://",
    )

    @app.route("/any", methods=["GET", "POST"])
    def any_method() -> str:
        return "any"

    @app.get("/costly")
    @limiter.limit("3/minute", cost=lambda: 2)
    def costly() -> str:
        return "costly"

    api = Blueprint("api", __name__)
    limiter.limit("1/minute")(api)

    @api.get("/api/one")
    def one() -> str:
        return "one"

    shared = limiter.shared_limit("2/minute", scope="reports")

    @app.get("/r1")
    @shared
    def r1() -> str:
        return "r1"

    @app.get("/r2")
    @shared
    def r2() -> str:
        return "r2"

    app.register_blueprint(api)
    client = app.test_client()

    def get(path: str) -> int:
        return int(client.get(path, buffered=True).status_code)

    assert [get("/any"), client.post("/any", buffered=True).status_code, get("/any")] == [
        200,
        200,
        429,
    ]
    assert [get("/costly"), get("/costly")] == [200, 429]
    assert [get("/api/one"), get("/api/one")] == [200, 429]
    assert [get("/r1"), get("/r2"), get("/r1")] == [200, 200, 429]
    assert limiter.routes.stats(app)["checks"]["global"]["allowed"] >= 6  # the application's
