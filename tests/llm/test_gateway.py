"""The gateway through real servers: reserved at the worst case, settled with the provider's
usage, refused in the provider's format, and nothing a client sends lowers its charge."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from ratekeeper.llm import Limit
from tests.llm.fake_upstream import FakeUpstream
from tests.llm.harness import CHAT, bearer, chat, ended, gateway, upstream, used


@pytest.fixture(scope="module")
def up() -> Iterator[tuple[FakeUpstream, str]]:
    with upstream() as pair:
        yield pair


def test_streamed_chat_settles_with_the_usage(up: tuple[FakeUpstream, str]) -> None:
    app, url = up
    with gateway(url) as (gw, base), httpx.Client(base_url=base, timeout=20) as client:
        body = chat(max_tokens=100, stream=True)
        with client.stream(
            "POST",
            CHAT,
            json=body,
            headers=bearer("k1", **{"x-fake-output": "30", "x-fake-prompt": "12"}),
        ) as r:
            assert r.status_code == 200
            estimate = 2000 - int(r.headers["x-ratelimit-remaining-tokens"])
            assert estimate >= 100  # the most it may write, plus the prompt
            assert r.headers["x-ratelimit-remaining-requests"] == "9"
            text = r.read()
        assert text.endswith(b"data: [DONE]\n\n") and text.count(b"data:") == 34
        assert ended(gw, 1)
        assert used(gw, "k1") == {
            "org-tokens": 42,
            "team-tokens": 42,
            "key-tokens": 42,
            "key-requests": 1,
        }
        sent = app.requests[-1]
        assert sent["body"]["stream_options"] == {"include_usage": True}
        assert "authorization" not in sent["headers"]  # the client's key stays here


PATHS = ["/v1/chat/completions", "/v1/responses", "/v1/messages", "/v1/completions"]


@pytest.mark.parametrize(
    ("path", "stream"),
    [*((p, s) for p in PATHS for s in (False, True)), ("/v1/embeddings", False)],
)
def test_every_api_settles(up: tuple[FakeUpstream, str], path: str, stream: bool) -> None:
    _, url = up
    body = {"model": "m", "max_tokens": 50, "stream": stream}
    body |= (
        {"messages": [{"role": "user", "content": "x"}]}
        if "chat" in path or "messages" in path
        else {}
    )
    body |= {"input": "x"} if "responses" in path or "embeddings" in path else {}
    body |= {"prompt": "x"} if path == "/v1/completions" else {}
    if "responses" in path:
        body["max_output_tokens"] = body.pop("max_tokens")
    with gateway(url) as (gw, base), httpx.Client(base_url=base, timeout=20) as client:
        r = client.post(
            path, json=body, headers=bearer("k1", **{"x-fake-output": "7", "x-fake-prompt": "5"})
        )
        assert r.status_code == 200, r.text
        assert ended(gw, 1)
        expected = 5 if "embeddings" in path else 12
        assert used(gw, "k1")["key-tokens"] == expected
        assert gw.stats()["problems"] == {}
        if path == "/v1/messages":
            assert "anthropic-ratelimit-tokens-remaining" in r.headers
        else:
            assert "x-ratelimit-remaining-tokens" in r.headers


def test_refusals_in_each_format(up: tuple[FakeUpstream, str]) -> None:
    _, url = up
    limits = [Limit("key", "3/minute", counts="requests"), Limit("key", "100000/minute")]
    with gateway(url, limits) as (gw, base), httpx.Client(base_url=base, timeout=20) as client:
        for _ in range(3):
            assert (
                client.post(CHAT, json=chat(max_tokens=5), headers=bearer("k1")).status_code == 200
            )
        r = client.post(CHAT, json=chat(max_tokens=5), headers=bearer("k1"))
        assert r.status_code == 429
        error = r.json()["error"]
        assert (error["type"], error["code"]) == ("requests", "rate_limit_exceeded")
        assert "key-requests" in error["message"] and "Limit 3, Used 3" in error["message"]
        assert r.headers["x-ratelimit-remaining-requests"] == "0"
        assert r.headers["x-should-retry"] == "true"
        assert 0 < int(r.headers["retry-after-ms"]) <= 60_000
        assert int(r.headers["retry-after"]) == -(-int(r.headers["retry-after-ms"]) // 1000)
        r = client.post("/v1/messages", json=chat(max_tokens=5), headers={"x-api-key": "k1"})
        assert r.status_code == 429
        assert r.json()["type"] == "error" and r.json()["error"]["type"] == "rate_limit_error"
        assert r.headers["anthropic-ratelimit-requests-remaining"] == "0"
        assert r.headers["anthropic-ratelimit-requests-reset"].endswith("Z")
        assert used(gw, "k1")["key-requests"] == 3  # refusals charge nothing


def test_a_request_above_the_limit_can_never_pass(up: tuple[FakeUpstream, str]) -> None:
    _, url = up
    with gateway(url, [Limit("key", "500/minute")]) as (_, base):
        r = httpx.post(base + CHAT, json=chat(max_tokens=5000), headers=bearer("k1"))
        assert r.status_code == 429
        assert r.headers["x-should-retry"] == "false" and "retry-after" not in r.headers
        assert "Request too large" in r.json()["error"]["message"]


def test_a_budget_tells_the_sdks_not_to_retry(up: tuple[FakeUpstream, str]) -> None:
    _, url = up
    limits = [Limit("org", "300/calendar-month", name="org-month")]
    with gateway(url, limits) as (_, base), httpx.Client(base_url=base, timeout=20) as client:
        assert client.post(CHAT, json=chat(max_tokens=250), headers=bearer("k1")).status_code == 200
        r = client.post(CHAT, json=chat(max_tokens=250), headers=bearer("k1"))
        assert r.status_code == 429
        assert r.json()["error"]["code"] == "insufficient_quota"
        assert r.headers["x-should-retry"] == "false" and int(r.headers["retry-after"]) > 86_400


def test_caller_errors(up: tuple[FakeUpstream, str]) -> None:
    app, url = up
    with (
        gateway(url, max_request_bytes=10_000) as (gw, base),
        httpx.Client(base_url=base, timeout=20) as client,
    ):
        seen = len(app.requests)
        r = client.post(CHAT, json=chat(), headers=bearer("nobody"))
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        r = client.post("/v1/messages", json=chat(), headers={"x-api-key": "nobody"})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        r = client.post(CHAT, content=b"{nope", headers=bearer("k1"))
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
        r = client.post(CHAT, json=chat(max_tokens=-1), headers=bearer("k1"))
        assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
        assert client.post("/v1/nothing", json={}, headers=bearer("k1")).status_code == 404
        assert client.get(CHAT, headers=bearer("k1")).status_code == 405
        r = client.post(CHAT, json=chat("x" * 20_000), headers=bearer("k1"))
        assert r.status_code == 413
        assert len(app.requests) == seen  # none of them reached the upstream
        assert used(gw, "k1")["key-requests"] == 0


def test_a_lying_max_is_capped_by_the_upstreams_most(up: tuple[FakeUpstream, str]) -> None:
    app, url = up
    from ratekeeper.llm import Estimator

    est = Estimator(max_output=300, model_max_output={"m": 200})
    with gateway(url, estimator=est) as (gw, base):
        r = httpx.post(
            base + CHAT,
            json=chat(max_tokens=10**9),
            headers=bearer("k1", **{"x-fake-output": "1000000"}),
        )
        assert r.status_code == 200
        assert app.requests[-1]["body"]["max_tokens"] == 200
        assert ended(gw, 1)
        assert used(gw, "k1")["key-tokens"] == app.log[-1]["total"] <= 200 + app.log[-1]["prompt"]
        r = httpx.post(
            base + CHAT, json=chat(), headers=bearer("k1", **{"x-fake-output": "1000000"})
        )
        assert app.requests[-1]["body"]["max_completion_tokens"] == 200  # none named: the cap


def test_upstream_failures_are_cancelled(up: tuple[FakeUpstream, str]) -> None:
    _, url = up
    with gateway(url) as (gw, base), httpx.Client(base_url=base, timeout=20) as client:
        r = client.post(
            CHAT, json=chat(max_tokens=50), headers=bearer("k1", **{"x-fake-mode": "500"})
        )
        assert r.status_code == 500 and r.json()["error"]["message"] == "upstream down"
        assert ended(gw, 1)
        assert used(gw, "k1") == {
            "org-tokens": 0,
            "team-tokens": 0,
            "key-tokens": 0,
            "key-requests": 1,
        }
    with gateway("http://127.0.0.1:9") as (gw, base):  # nothing listens on the discard port
        r = httpx.post(base + CHAT, json=chat(max_tokens=50), headers=bearer("k1"))
        assert r.status_code == 502 and r.json()["error"]["type"] == "server_error"
        assert ended(gw, 1)
        assert used(gw, "k1")["key-tokens"] == 0 and gw.stats()["counts"]["cancelled"] == 1
