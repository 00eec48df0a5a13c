"""Hostile upstreams and clients: the response goes through, the estimate stands, the case is
logged and counted, and nothing reaches the client as an exception."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import httpx
import pytest

from ratekeeper.llm import Caller, Estimator, Limit
from tests.llm.fake_upstream import FakeUpstream
from tests.llm.harness import CHAT, bearer, chat, ended, gateway, upstream, used


@pytest.fixture(scope="module")
def up() -> Iterator[tuple[FakeUpstream, str]]:
    with upstream() as pair:
        yield pair


def _estimate(response: httpx.Response) -> int:
    return 2000 - int(response.headers["x-ratelimit-remaining-tokens"])


@pytest.mark.parametrize(
    ("mode", "problem"),
    [
        ("malformed", "malformed_event"),
        ("no_usage", "usage_missing"),
        ("negative", "usage_invalid"),
        ("huge", "usage_invalid"),
        ("float", "usage_invalid"),
        ("string_usage", "usage_invalid"),
        ("twice", "usage_repeated"),
    ],
)
def test_bad_usage_keeps_the_estimate(
    up: tuple[FakeUpstream, str], mode: str, problem: str, caplog: pytest.LogCaptureFixture
) -> None:
    _, url = up
    with gateway(url) as (gw, base), httpx.Client(base_url=base, timeout=20) as client:
        with caplog.at_level(logging.WARNING, "ratekeeper.llm"):
            for stream in (True, False):
                headers = bearer("k1", **{"x-fake-mode": mode, "x-fake-output": "5"})
                r = client.post(CHAT, json=chat(max_tokens=100, stream=stream), headers=headers)
                assert r.status_code == 200
                if stream:
                    assert r.text.endswith("data: [DONE]\n\n")  # passed on whole
                    estimate = _estimate(r)
                if mode in ("malformed", "twice"):
                    break  # JSON bodies carry one usage and no events
        assert ended(gw, 2 if mode not in ("malformed", "twice") else 1)
        charged = used(gw, "k1")["key-tokens"]
        assert charged >= estimate * (1 if mode in ("malformed", "twice") else 2) - 5
        assert gw.stats()["problems"][problem] >= 1
        assert problem in caplog.text  # logged (once per log_interval)


@pytest.mark.parametrize("mode", ["bytewise", "crlf"])
def test_odd_but_valid_streams_are_read(up: tuple[FakeUpstream, str], mode: str) -> None:
    _app, url = up
    with gateway(url) as (gw, base):
        headers = bearer("k1", **{"x-fake-mode": mode, "x-fake-output": "6", "x-fake-prompt": "4"})
        r = httpx.post(
            base + CHAT, json=chat(max_tokens=100, stream=True), headers=headers, timeout=30
        )
        assert r.status_code == 200
        assert ended(gw, 1)
        assert used(gw, "k1")["key-tokens"] == 10 and gw.stats()["problems"] == {}


def test_a_stream_that_never_ends_is_cut(up: tuple[FakeUpstream, str]) -> None:
    _, url = up
    with gateway(url, stream_timeout=1.0) as (gw, base):
        headers = bearer("k1", **{"x-fake-mode": "never_ends"})
        r = httpx.post(
            base + CHAT, json=chat(max_tokens=100, stream=True), headers=headers, timeout=30
        )
        assert r.status_code == 200 and r.text.startswith("data: ")
        assert ended(gw, 1)
        assert used(gw, "k1")["key-tokens"] >= _estimate(r)
        assert gw.stats()["problems"]["stream_timeout"] == 1


def test_a_body_of_100_mb(up: tuple[FakeUpstream, str]) -> None:
    _, url = up
    with gateway(url) as (gw, base), httpx.Client(base_url=base, timeout=60) as client:
        headers = bearer("k1", **{"x-fake-mode": "big_body"})
        with client.stream("POST", CHAT, json=chat(max_tokens=100), headers=headers) as r:
            size = sum(len(chunk) for chunk in r.iter_raw())
            estimate = _estimate(r)
        assert size > 100 << 20  # passed on whole, never kept whole
        assert ended(gw, 1)
        assert used(gw, "k1")["key-tokens"] == estimate
        assert gw.stats()["problems"]["body_too_large"] == 1


def test_an_upstream_that_breaks_mid_stream(up: tuple[FakeUpstream, str]) -> None:
    _, url = up
    with gateway(url) as (gw, base), httpx.Client(base_url=base, timeout=20) as client:
        headers = bearer("k1", **{"x-fake-mode": "broken", "x-fake-output": "20"})
        with (
            client.stream(
                "POST", CHAT, json=chat(max_tokens=100, stream=True), headers=headers
            ) as r,
            pytest.raises(httpx.HTTPError),
        ):
            r.read()  # the body ends short (the client sees the break)
        assert ended(gw, 1)
        charged = used(gw, "k1")["key-tokens"]
        assert 0 < charged < 100  # what was produced: the prompt and the text that came
        assert gw.stats()["problems"]["upstream_broken"] == 1


def test_the_apps_own_functions_failing(up: tuple[FakeUpstream, str]) -> None:
    _, url = up

    def counter(text: str) -> int:
        raise RuntimeError("tokenizer down")

    def price(usage: object) -> int:
        raise RuntimeError("price list down")

    with gateway(url, estimator=Estimator(count=counter), price=price) as (gw, base):
        r = httpx.post(base + CHAT, json=chat(max_tokens=100), headers=bearer("k1"), timeout=20)
        assert r.status_code == 200
        assert ended(gw, 1)
        assert used(gw, "k1")["key-tokens"] == _estimate(r)  # heuristic estimate, kept
        assert gw.stats()["problems"] == {"counter_error": 1, "price_error": 1}

    def budget(caller: Caller) -> str:
        raise KeyError(caller.org)

    with gateway(url, [Limit("key", "1000/minute"), Limit("org", budget)]) as (gw, base):
        r = httpx.post(base + CHAT, json=chat(max_tokens=100), headers=bearer("k1"), timeout=20)
        assert r.status_code == 500 and "limits" in r.json()["error"]["message"]
        assert gw.stats()["problems"] == {"limit_error": 1}


def test_a_meter_that_raises_keeps_the_estimate(
    up: tuple[FakeUpstream, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from ratekeeper.llm import meters

    def boom(self: object, chunk: bytes) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(meters.StreamMeter, "feed", boom)
    _, url = up
    with gateway(url) as (gw, base):
        r = httpx.post(
            base + CHAT, json=chat(max_tokens=100, stream=True), headers=bearer("k1"), timeout=20
        )
        assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
        assert ended(gw, 1)
        assert used(gw, "k1")["key-tokens"] == _estimate(r)
        assert gw.stats()["problems"]["meter_error"] == 1


def test_an_identify_that_misbehaves_is_a_500(up: tuple[FakeUpstream, str]) -> None:
    from ratekeeper import ManualClock
    from ratekeeper.llm import Gateway
    from tests.middleware.servers import uvicorn_server

    _, url = up
    answers: list[object] = [RuntimeError("db down"), "k1", Caller("", "acme")]

    def identify(request: object) -> object:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    gw = Gateway(url, [Limit("key", "1000/minute")], identify, clock=ManualClock(1e9))  # type: ignore[arg-type]
    with uvicorn_server(gw) as base:
        for kind in ("identify_error", "identify_error", "limit_error"):
            r = httpx.post(base + CHAT, json=chat(max_tokens=5), headers=bearer("k1"), timeout=20)
            assert r.status_code == 500 and r.json()["error"]["message"], kind
            assert gw.stats()["problems"][kind] >= 1


def test_a_store_down_fails_open_or_refuses(up: tuple[FakeUpstream, str]) -> None:
    from ratekeeper import AsyncLimiter, RedisStore
    from tests.redis_servers import free_port

    _, url = up
    dead = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    with gateway(url, store=RedisStore(dead)) as (gw, base):
        r = httpx.post(base + CHAT, json=chat(max_tokens=5), headers=bearer("k1"), timeout=20)
        assert r.status_code == 200 and "x-ratelimit-remaining-tokens" not in r.headers
    closed = AsyncLimiter(RedisStore(dead), fail_open=False)
    with gateway(url, limiter=closed) as (gw, base):
        r = httpx.post(base + CHAT, json=chat(max_tokens=5), headers=bearer("k1"), timeout=20)
        assert r.status_code == 503 and r.json()["error"]["type"] == "server_error"
        assert gw.stats()["problems"]["store_unavailable"] == 1
