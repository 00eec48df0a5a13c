"""The service's nested decisions and reservations (``NestedAPI``) on the engine: levels
from policies, level 0 on ``/v1/hit``'s own counter, toggles per level, tokens that any
instance can settle, hostile tokens and bodies refused with a 4xx."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from ratekeeper import AsyncLimiter, ManualClock, MemoryStore
from ratekeeper.errors import BadRequest
from ratekeeper.service import config
from ratekeeper.service.engine import Engine
from ratekeeper.service.http.nested import NestedAPI
from ratekeeper.service.metrics import InstrumentedStore, Metrics

T = TypeVar("T")

CONFIG = """\
limits:
  max_key_length: 40
policies:
  org:
    rate: 1000/minute
  user:
    rate: 3/minute
  key:
    rate: 100/minute
    algorithm: token_bucket
  watch:
    rate: 1/minute
    shadow: true
  off:
    rate: 1/minute
    enabled: false
"""


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1_800_000_000.0)


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


def make(store: MemoryStore, clock: ManualClock) -> tuple[Engine, NestedAPI]:
    metrics = Metrics()
    limiter = AsyncLimiter(InstrumentedStore(store, metrics), clock=clock)
    engine = Engine(config.parse_text(CONFIG), limiter, metrics, clock)
    return engine, NestedAPI(engine)


def lv(policy: str, key: str, **more: Any) -> dict[str, Any]:
    return {"policy": policy, "key": key, **more}


ORG_USER = [lv("org", "acme"), lv("user", "u1")]


def test_nested_hit_is_all_or_nothing_and_level_0_is_hits_counter(
    store: MemoryStore, clock: ManualClock
) -> None:
    engine, api = make(store, clock)
    answers = [run(api.hit({"levels": ORG_USER, "cost": 1})) for _ in range(4)]
    assert [a[1]["allowed"] for a in answers] == [True, True, True, False]
    status, body, headers = answers[3]
    assert status == 200 and body["rejected_by"] == 1 and body["policy"] == "user"
    assert [x["remaining"] for x in body["levels"]] == [997, 0]
    assert dict(headers)[b"ratelimit-policy"] == b'"user";q=3;w=60'
    over = run(api.hit({"levels": ORG_USER, "over_limit_status": 429}))
    assert over[0] == 429
    # level 0 is the counter /v1/hit {"policy": "org", "key": "acme"} uses
    result = run(engine.hit(engine.spec("org"), "acme", 1))
    assert result.decision.remaining == 996


def test_reserve_settle_cancel_through_tokens(store: MemoryStore, clock: ManualClock) -> None:
    _, api = make(store, clock)
    levels = [lv("org", "acme"), lv("key", "k1"), lv("user", "u1", cost=1)]
    status, body, _ = run(api.reserve({"levels": levels, "estimate": 40, "ttl": 60}))
    assert status == 200 and body["allowed"] and body["expires_at"] == 1_800_000_060.0
    assert [x["remaining"] for x in body["levels"]] == [960, 60, 2]
    token = body["reservation"]
    # another instance of the service (a new engine over the same store) settles it
    _, other = make(store, clock)
    assert run(other.settle({"reservation": token, "actual": 70}))[1] == {
        "status": "settled", "settled": True, "actual": 70,
    }  # fmt: skip
    assert run(other.settle({"reservation": token, "actual": 70}))[1]["status"] == (
        "already_settled"
    )
    look = run(api.hit({"levels": [lv("org", "acme"), lv("key", "k1")], "cost": 0}))[1]
    assert [x["remaining"] for x in look["levels"]] == [930, 30]
    r2 = run(api.reserve({"levels": levels, "estimate": 20}))[1]
    assert run(api.settle({"reservation": r2["reservation"]}, cancel=True))[1] == {
        "status": "settled", "settled": True,
    }  # fmt: skip
    look = run(api.hit({"levels": [lv("org", "acme"), lv("key", "k1")], "cost": 0}))[1]
    assert [x["remaining"] for x in look["levels"]] == [930, 30]
    # an expired reservation gives its estimate back; settling it charges the actual cost
    r3 = run(api.reserve({"levels": levels, "estimate": 25, "ttl": 1}))[1]
    clock.advance(2)
    look = run(api.hit({"levels": [lv("org", "acme"), lv("key", "k1")], "cost": 0}))[1]
    assert look["levels"][0]["remaining"] == 930
    late = run(api.settle({"reservation": r3["reservation"], "actual": 5}))[1]
    assert late["status"] == "expired"
    look = run(api.hit({"levels": [lv("org", "acme"), lv("key", "k1")], "cost": 0}))[1]
    assert look["levels"][0]["remaining"] == 925


def test_toggles_per_level(store: MemoryStore, clock: ManualClock) -> None:
    engine, api = make(store, clock)
    levels = [lv("org", "acme"), lv("watch", "w"), lv("off", "x")]
    first = run(api.hit({"levels": levels}))[1]
    assert first["allowed"] and not first["shadow"] and len(first["levels"]) == 2
    second = run(api.hit({"levels": levels}))[1]
    assert second["allowed"]  # watch (1/minute, shadow) is only looked at
    engine.toggle("watch", None, None, None)
    assert second["levels"][1]["remaining"] == 1  # never charged
    engine.toggle("user", None, None, True)
    blocked = run(api.hit({"levels": [lv("org", "acme"), lv("user", "u")]}))
    assert blocked[1]["allowed"] is False and blocked[1]["blocked"] is True
    assert blocked[1]["policy"] == "user"
    look = run(api.hit({"levels": [lv("org", "acme")], "cost": 0}))[1]
    assert look["remaining"] == 998  # the blocked call charged nothing
    engine.toggle("user", None, None, False)
    tight = [lv("org", "acme"), {"policy": "watch", "key": "w", "cost": 5}]
    assert run(api.hit({"levels": tight}))[1]["shadow"] is True


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"levels": []},
        {"levels": "org"},
        {"levels": [lv("nope", "a")]},
        {"levels": [{"policy": "org"}]},
        {"levels": [lv("org", "")]},
        {"levels": [lv("org", "a", cost=-1)]},
        {"levels": [lv("org", "a", extra=1)]},
        {"levels": [lv("org", str(i)) for i in range(17)]},
        {"levels": [lv("org", "a")], "cost": 1.5},
        {"levels": [lv("org", "a")], "over_limit_status": 503},
    ],
)
def test_bad_bodies_are_refused(store: MemoryStore, clock: ManualClock, body: Any) -> None:
    _, api = make(store, clock)
    with pytest.raises(BadRequest):
        run(api.hit(body))
    assert len(store) == 0


def _b64(value: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "token",
    [
        None, 5, "", "!!!", "x" * 9000, _b64({"a": 1}), _b64(["id", 1000]),
        _b64(["", 1000, [["org", "a", None]]]), _b64(["id", 0, [["org", "a", None]]]),
        _b64(["id", 1000, []]), _b64(["id", 1000, [["org", "", None]]]),
        _b64(["id", 1000, [["org", "a", -3]]]), _b64(["id", 1000, [["org", "a", True]]]),
        base64.urlsafe_b64encode(b"\xff\xfe").decode(),
    ],
)  # fmt: skip
def test_hostile_tokens_are_refused(store: MemoryStore, clock: ManualClock, token: Any) -> None:
    _, api = make(store, clock)
    with pytest.raises(BadRequest) as caught:
        run(api.settle({"reservation": token, "actual": 3}))
    assert caught.value.field == "reservation"


def test_a_forged_token_charges_no_more_than_a_real_settle(
    store: MemoryStore, clock: ManualClock
) -> None:
    _, api = make(store, clock)
    forged = _b64(["made-up", 60_000, [["user", "u1", None]]])
    assert run(api.settle({"reservation": forged, "actual": 10**9}))[1]["status"] == "expired"
    look = run(api.hit({"levels": [lv("user", "u1")], "cost": 0}))[1]
    assert look["remaining"] == 0  # within the debt bound, refused until the window ends
    gone = _b64(["id", 60_000, [["dropped", "a", None]]])
    with pytest.raises(BadRequest) as caught:
        run(api.settle({"reservation": gone, "actual": 1}))
    assert caught.value.status == 409
