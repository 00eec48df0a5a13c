"""A client that leaves mid-stream is charged what the upstream produced."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.llm.fake_upstream import FakeUpstream
from tests.llm.harness import CHAT, bearer, chat, ended, gateway, upstream, used
from tests.middleware.servers import wait_until


@pytest.fixture(scope="module")
def up() -> Iterator[tuple[FakeUpstream, str]]:
    with upstream() as pair:
        yield pair


def _leave_early(base: str, api: str = CHAT, chunks: int = 3, **headers: str) -> int:
    """Read a few chunks of a streamed completion, then hang up; the estimate it was given."""
    body = chat(max_tokens=200, stream=True)
    key = {"x-api-key": "k1"} if "messages" in api else bearer("k1")
    with (
        httpx.Client(base_url=base, timeout=20) as client,
        client.stream("POST", api, json=body, headers={**key, **headers}) as r,
    ):
        assert r.status_code == 200
        remaining = (
            r.headers.get("x-ratelimit-remaining-tokens")
            or r.headers["anthropic-ratelimit-tokens-remaining"]
        )
        for n, _ in enumerate(r.iter_raw()):
            if n + 1 >= chunks:
                break
    return 2000 - int(remaining)


@pytest.mark.parametrize("api", [CHAT, "/v1/messages"])
def test_drain_charges_the_true_usage(up: tuple[FakeUpstream, str], api: str) -> None:
    app, url = up
    with gateway(url) as (gw, base):
        tag = f"drain-{api}"
        _leave_early(
            base, api, **{"x-fake-output": "100", "x-fake-delay": "0.01", "x-fake-tag": tag}
        )
        assert ended(gw, 1)
        (entry,) = [e for e in app.log if e["tag"] == tag]
        assert used(gw, "k1")["key-tokens"] == entry["total"]  # the upstream's own figure
        assert gw.stats()["counts"]["disconnects"] == 1
        assert gw.stats()["problems"] == {}


def test_close_charges_what_was_streamed(up: tuple[FakeUpstream, str]) -> None:
    _app, url = up
    with gateway(url, on_disconnect="close") as (gw, base):
        estimate = _leave_early(base, **{"x-fake-output": "150", "x-fake-delay": "0.02"})
        assert ended(gw, 1)
        charged = used(gw, "k1")["key-tokens"]
        assert 0 < charged < estimate  # the prompt and the few tokens that went out


def test_a_drain_that_does_not_finish_keeps_the_estimate(up: tuple[FakeUpstream, str]) -> None:
    _, url = up
    with gateway(url, drain_timeout=0.5) as (gw, base):
        estimate = _leave_early(base, **{"x-fake-output": "200", "x-fake-delay": "0.05"})
        assert ended(gw, 1)
        assert used(gw, "k1")["key-tokens"] == estimate
        assert wait_until(lambda: gw.stats()["problems"].get("drain_timeout") == 1)
