"""The service's nested routes over HTTP: ``/v1/hit`` with ``levels``, ``/v1/reserve``,
``/v1/settle`` and ``/v1/cancel``, through the service's own HTTP server (the inline path and
the ASGI app) on real Redis: the same answers both ways, one EVALSHA per call (commandstats),
a 4xx for every malformed body."""

from __future__ import annotations

import base64
import json
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


def token(levels: list[list[Any]]) -> str:
    raw = json.dumps(["made-up-id", 60_000, levels]).encode()  # "\ud800" stays an escape
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.mark.parametrize(
    "key", ["\ud800", "x" * 6000, "a\udfffb", ""], ids=["surrogate", "6000", "inner", "empty"]
)
@pytest.mark.parametrize("path", ["/v1/settle", "/v1/cancel"])
def test_a_tokens_keys_get_hits_key_checks(
    served: Served, redis_url: str, key: str, path: str
) -> None:
    """Issue 36, 6: a token naming a lone surrogate or a 6,000-character key settled (200)
    and charged that counter, where ``/v1/hit`` answers 400: now the same 400, nothing
    charged."""
    client = redis.Redis.from_url(redis_url)
    before = set(client.keys("*"))
    for levels in ([["user", key, None]], [["org", "acme", None], ["user", key, None]]):
        body: dict[str, Any] = {"reservation": token(levels)}
        if path == "/v1/settle":
            body["actual"] = 5
        answer = post(served, path, body)
        assert answer.status_code == 400, answer.text
        assert answer.json()["field"] == "reservation"
        with httpx.Client(base_url=f"http://127.0.0.1:{served.port}", timeout=10) as http:
            hit = http.post(  # JSON's "\ud800" escape: what a client can send
                "/v1/hit", content=json.dumps({"levels": [{"policy": "user", "key": key}]}),
                headers={"content-type": "application/json"},
            )  # fmt: skip
        assert hit.status_code == 400  # what /v1/hit says of the same key
    assert set(client.keys("*")) == before
    client.close()


HUGE = 10**12 + 1
OWN_HUGE = [LEVELS[0], {**LEVELS[1], "cost": HUGE}]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/hit", {"levels": LEVELS, "cost": HUGE}),
        ("/v1/hit", {"levels": OWN_HUGE}),
        ("/v1/reserve", {"levels": LEVELS, "estimate": HUGE}),
        ("/v1/reserve", {"levels": OWN_HUGE, "estimate": 1}),
    ],
)
def test_a_cost_above_10_12_is_a_400(served: Served, path: str, body: Any) -> None:
    """Issue 36, 5: a nested cost above 10**12 is refused, never a rejection forever."""
    answer = post(served, path, body)
    assert answer.status_code == 400, answer.text
    assert "1000000000000" in answer.json()["error"]


def test_one_policy_and_key_at_two_levels_is_charged_on_both(served: Served) -> None:
    """The same policy and key at two levels are two levels (the outer key's own counter,
    and one inside it), charged as written: it was a 400 that a client's choice of key
    could trigger, where the caller passes the client's strings."""
    twice = [{"policy": "user", "key": "same"}, {"policy": "user", "key": "same"}]
    answers = [post(served, "/v1/hit", {"levels": twice}).json() for _ in range(4)]
    assert [a["allowed"] for a in answers] == [True, True, True, False]
    assert [x["remaining"] for x in answers[2]["levels"]] == [0, 0]
    inner = [{"policy": "org", "key": "acme"}, *twice]
    assert [
        x["remaining"] for x in post(served, "/v1/hit", {"levels": inner}).json()["levels"]
    ] == [999, 2, 2]
