"""The real OpenAI and Anthropic SDKs against the gateway: on a 429 they wait as the headers
say, then succeed; one retry per refusal, never a storm; a budget is not retried."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from typing import Any

import anthropic
import openai
import pytest

from ratekeeper.llm import Caller, Gateway, Limit, callers
from tests.llm.fake_upstream import FakeUpstream
from tests.llm.harness import upstream
from tests.middleware.servers import uvicorn_server

Scope = MutableMapping[str, Any]


class Recorder:
    """Wraps an ASGI app; keeps (arrival time, path, status, headers) of every request."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seen: list[dict[str, Any]] = []

    async def __call__(
        self,
        scope: Scope,
        receive: Callable[[], Awaitable[Any]],
        send: Callable[[Any], Awaitable[None]],
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        entry: dict[str, Any] = {"at": time.monotonic(), "path": scope["path"]}
        self.seen.append(entry)

        async def recording(message: Any) -> None:
            if message["type"] == "http.response.start":
                entry["status"] = message["status"]
                entry["headers"] = {k.decode(): v.decode() for k, v in message["headers"]}
            await send(message)

        await self.app(scope, receive, recording)


@pytest.fixture(scope="module")
def up() -> Iterator[tuple[FakeUpstream, str]]:
    with upstream() as pair:
        yield pair


def _serve(url: str, limits: list[Limit]) -> Any:
    table = {"k1": Caller("k1", "acme"), "k2": Caller("k2", "acme")}
    gw = Gateway(url, limits, callers(table))
    return gw, Recorder(gw)


def _check_waited(seen: list[dict[str, Any]]) -> None:
    """Every retry arrived no earlier than the refusal before it said, and each refusal was
    followed by one success: attempts = calls + refusals."""
    refused = [i for i, e in enumerate(seen) if e["status"] == 429]
    assert refused, "the test must provoke a refusal"
    for i in refused:
        wait = int(seen[i]["headers"]["retry-after-ms"]) / 1000
        assert seen[i + 1]["at"] >= seen[i]["at"] + wait - 0.005  # waited as told
        assert seen[i + 1]["status"] == 200


REQUESTS = [Limit("key", "2/5s", counts="requests"), Limit("key", "1000000/minute")]
"""Two calls per 5 s: the third of three quick calls is refused even on a loaded machine."""


@pytest.mark.parametrize("stream", [False, True])
def test_openai_sdk_waits_then_succeeds(up: tuple[FakeUpstream, str], stream: bool) -> None:
    _, url = up
    gw, app = _serve(url, REQUESTS)
    with uvicorn_server(app) as base:
        client = openai.OpenAI(base_url=base + "/v1", api_key="k1", max_retries=2)
        for _ in range(3):
            kwargs: dict[str, Any] = {
                "model": "m",
                "max_tokens": 20,
                "stream": stream,
                "messages": [{"role": "user", "content": "hi"}],
            }
            result = client.chat.completions.create(**kwargs)
            if stream:
                text = "".join(c.choices[0].delta.content or "" for c in result if c.choices)
            else:
                text = result.choices[0].message.content
            assert text.startswith("t0")
        client.close()
    assert len(app.seen) == 4  # three calls, one refusal retried once
    _check_waited(app.seen)
    assert gw.stats()["counts"]["rejected"] == 1


def test_anthropic_sdk_waits_then_succeeds(up: tuple[FakeUpstream, str]) -> None:
    _, url = up
    _gw, app = _serve(url, REQUESTS)
    with uvicorn_server(app) as base:
        client = anthropic.Anthropic(base_url=base, api_key="k1", max_retries=2)
        for _ in range(3):
            with client.messages.stream(
                model="m", max_tokens=20, messages=[{"role": "user", "content": "hi"}]
            ) as s:
                message = s.get_final_message()
            assert message.usage.output_tokens == 20
        client.close()
    assert len(app.seen) == 4
    _check_waited(app.seen)
    assert app.seen[2]["headers"]["anthropic-ratelimit-requests-remaining"] == "0"


def test_the_sdks_errors_read_the_bodies(up: tuple[FakeUpstream, str]) -> None:
    _, url = up
    _gw, app = _serve(
        url, [Limit("key", "1/minute", counts="requests"), Limit("key", "9999/minute")]
    )
    with uvicorn_server(app) as base:
        oa = openai.OpenAI(base_url=base + "/v1", api_key="k1", max_retries=0)
        msgs: Any = [{"role": "user", "content": "hi"}]
        oa.chat.completions.create(model="m", messages=msgs, max_tokens=5)
        with pytest.raises(openai.RateLimitError) as err:
            oa.chat.completions.create(model="m", messages=msgs, max_tokens=5)
        assert err.value.code == "rate_limit_exceeded" and err.value.type == "requests"
        an = anthropic.Anthropic(base_url=base, api_key="k1", max_retries=0)
        with pytest.raises(anthropic.RateLimitError) as aerr:
            an.messages.create(model="m", messages=msgs, max_tokens=5)
        assert "key-requests" in aerr.value.message
        stranger = openai.OpenAI(base_url=base + "/v1", api_key="bad", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            stranger.chat.completions.create(model="m", messages=msgs, max_tokens=5)
        stranger.close()
        oa.close()
        an.close()


def test_a_spent_budget_is_not_retried(up: tuple[FakeUpstream, str]) -> None:
    _, url = up
    limits = [Limit("org", "50/calendar-month", name="org-month")]
    _gw, app = _serve(url, limits)
    msgs: Any = [{"role": "user", "content": "hi"}]
    with uvicorn_server(app) as base:
        oa = openai.OpenAI(base_url=base + "/v1", api_key="k1", max_retries=5)
        an = anthropic.Anthropic(base_url=base, api_key="k2", max_retries=5)
        with pytest.raises(openai.RateLimitError) as err:
            oa.chat.completions.create(model="m", messages=msgs, max_tokens=60)
        assert err.value.code == "insufficient_quota" or "Request too large" in err.value.message
        oa.chat.completions.create(model="m", messages=msgs, max_tokens=30)
        with pytest.raises(openai.RateLimitError) as err:
            oa.chat.completions.create(model="m", messages=msgs, max_tokens=30)
        assert err.value.code == "insufficient_quota"
        started = time.monotonic()
        with pytest.raises(anthropic.RateLimitError):
            an.messages.create(model="m", messages=msgs, max_tokens=30)
        assert time.monotonic() - started < 30  # no sleeping until the month ends
        oa.close()
        an.close()
    assert [e["status"] for e in app.seen] == [429, 200, 429, 429]  # each refusal tried once
