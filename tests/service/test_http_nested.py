"""The service's nested routes over HTTP: ``/v1/hit`` with ``levels``, ``/v1/reserve``,
``/v1/settle`` and ``/v1/cancel``, through the service's own HTTP server (the inline path and
the ASGI app) on real Redis: the same answers both ways, one EVALSHA per call (commandstats),
a 4xx for every malformed body."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from ratekeeper import ManualClock
from tests.service.served import Served

CONFIG = """\
policies:
  org:
    rate: 1000/minute
  user:
    rate: 3/minute
  key:
    rate: 100/minute
    algorithm: token_bucket
"""
LEVELS = [{"policy": "org", "key": "acme"}, {"policy": "user", "key": "u1"}]
T0 = 1_800_000_000.0


@pytest.fixture(params=["inline", "asgi"])
def served(request: pytest.FixtureRequest, redis_url: str) -> Iterator[Served]:
    s = Served(ManualClock(T0), request.param, CONFIG, redis_url)
    yield s
    s.stop()


def post(served: Served, path: str, body: Any) -> httpx.Response:
    with httpx.Client(base_url=f"http://127.0.0.1:{served.port}", timeout=10) as http:
        return http.post(path, json=body)


def test_nested_hit_over_http(served: Served) -> None:
    answers = [post(served, "/v1/hit", {"levels": LEVELS}) for _ in range(4)]
    assert [a.status_code for a in answers] == [200] * 4
    assert [a.json()["allowed"] for a in answers] == [True, True, True, False]
    last = answers[3].json()
    assert last["rejected_by"] == 1 and last["policy"] == "user"
    assert [x["remaining"] for x in last["levels"]] == [997, 0]
    assert answers[0].headers["ratelimit-policy"] == '"user";q=3;w=60'
    refused = post(served, "/v1/hit", {"levels": LEVELS, "over_limit_status": 429})
    assert refused.status_code == 429 and "retry-after" in refused.headers
    # level 0 is /v1/hit's own counter
    plain = post(served, "/v1/peek", {"policy": "org", "key": "acme"}).json()
    assert plain["allowed"] and plain["remaining"] == 997  # the 3 nested hits it admitted


def test_reserve_settle_cancel_over_http(served: Served, redis_url: str) -> None:
    levels = [{"policy": "org", "key": "acme"}, {"policy": "key", "key": "k1"}]
    client = redis.Redis.from_url(redis_url)
    post(served, "/v1/hit", {"levels": levels, "cost": 0})  # the script loaded
    client.config_resetstat()
    reserved = post(served, "/v1/reserve", {"levels": levels, "estimate": 40})
    body = reserved.json()
    assert reserved.status_code == 200 and body["allowed"] and body["reservation"]
    settled = post(served, "/v1/settle", {"reservation": body["reservation"], "actual": 15})
    assert settled.json() == {"status": "settled", "settled": True, "actual": 15}
    again = post(served, "/v1/settle", {"reservation": body["reservation"], "actual": 15})
    assert again.json()["status"] == "already_settled"
    stats = client.info("commandstats")
    assert stats["cmdstat_evalsha"]["calls"] == 3  # one round trip per call
    assert not {"cmdstat_eval", "cmdstat_multi", "cmdstat_exec"} & set(stats)
    look = post(served, "/v1/hit", {"levels": levels, "cost": 0}).json()
    assert [x["remaining"] for x in look["levels"]] == [985, 85]
    second = post(served, "/v1/reserve", {"levels": levels, "estimate": 30}).json()
    cancelled = post(served, "/v1/cancel", {"reservation": second["reservation"]})
    assert cancelled.json()["status"] == "settled"
    look = post(served, "/v1/hit", {"levels": levels, "cost": 0}).json()
    assert [x["remaining"] for x in look["levels"]] == [985, 85]
    client.close()


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/hit", {"levels": LEVELS, "policy": "org"}, "levels"),
        ("/v1/hit", {"levels": [{"policy": "nope", "key": "a"}]}, "policy"),
        ("/v1/hit", {"levels": 5}, "levels"),
        ("/v1/reserve", {"levels": LEVELS}, "estimate"),
        ("/v1/reserve", {"levels": LEVELS, "estimate": 1, "ttl": 0}, "ttl"),
        ("/v1/reserve", {"levels": LEVELS, "estimate": 1, "extra": 1}, "body"),
        ("/v1/settle", {"reservation": "garbage", "actual": 1}, "reservation"),
        ("/v1/settle", {"reservation": "x"}, "reservation"),
        ("/v1/cancel", {}, "reservation"),
    ],
)
def test_bad_bodies_are_a_4xx_naming_the_field(
    served: Served, path: str, body: Any, field: str
) -> None:
    response = post(served, path, body)
    assert 400 <= response.status_code < 500, response.text
    assert response.json()["field"] == field
