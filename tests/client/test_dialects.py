"""Against loopback servers that limit like GitHub, OpenAI, a Retry-After-only API and
ratekeeper itself: after the first answer that states a policy, no avoidable 429.

The servers decide on the test's ``ManualClock``; the client's ``sleep`` moves it, so a run
of many windows takes no wall-clock time. Each test also bounds the virtual time the run
took (the pace is not needlessly slow).
"""

from __future__ import annotations

import httpx
import pytest

from ratekeeper import ManualClock
from ratekeeper.client import Pacer, Retries
from ratekeeper.client.httpx import PacedTransport
from tests.client import servers


def _client(clock: ManualClock, **options: object) -> tuple[httpx.Client, Pacer]:
    pacer = Pacer(clock=clock, sleep=clock.advance, random=lambda: 0.5, **options)  # type: ignore[arg-type]
    return httpx.Client(transport=PacedTransport(pacer)), pacer


def _after_first_policy(served: servers.Served) -> list[int]:
    return served.statuses()[1:]


@pytest.mark.parametrize("algorithm", ["fixed_window", "token_bucket", "gcra"])
def test_ratekeeper_headers_no_429_after_the_first_answer(algorithm: str) -> None:
    clock = ManualClock(1_700_000_000.25)
    with servers.serving(servers.ietf(clock, "10/1s", algorithm), clock) as served:
        client, pacer = _client(clock)
        start = clock()
        with client:
            for _ in range(60):
                assert client.get(served.url + "/items").status_code == 200
    assert 429 not in _after_first_policy(served)
    # 60 requests at 97% of 10/s: about 6.2 s; the first window may run at the burst
    assert clock() - start < 60 / (10 * 0.97) + 1.5
    assert pacer.stats()["refused"] == 0


@pytest.mark.parametrize("burst", [None, 1])
def test_github_no_429_and_burst_1_spreads_the_hour(burst: int | None) -> None:
    clock = ManualClock(1_700_000_000.0)
    with servers.serving(servers.github(clock, limit=20, window=60), clock) as served:
        client, pacer = _client(clock, burst=burst, max_wait=120)
        times = []
        with client:
            for _ in range(70):
                assert client.get(served.url + "/repos/x").status_code == 200
                times.append(clock())
    assert 429 not in served.statuses()
    first_window = [t for t in times if t < 1_700_000_060.0]
    assert len(first_window) <= 20
    assert times[-1] - times[0] < 4 * 60  # 70 requests at 20 a minute: within four windows
    if burst is None:  # what is left goes at once, then the reset is waited for
        assert first_window == [1_700_000_000.0] * 20
    else:  # without a stated window, what is left is spread until the reset
        assert first_window[10] - first_window[0] > 20
    (policy,) = pacer.policies()
    assert (policy.name, policy.limit) == ("core", 20)


def test_openai_requests_and_tokens_no_429_after_the_first_answer() -> None:
    clock = ManualClock(1_700_000_000.0)
    dialect = servers.openai(clock, requests=30, tokens=3000, window=60)
    with servers.serving(dialect, clock) as served:
        client, pacer = _client(clock)
        with client:
            for i in range(80):
                used = 100 + (i % 5) * 40  # the response's usage, a little off the estimate
                headers = {"Ratekeeper-Tokens": "150", "X-Test-Tokens": str(used)}
                response = client.post(served.url + "/v1/chat/completions", headers=headers)
                assert response.status_code == 200
    assert 429 not in served.statuses()
    names = {p.name: p for p in pacer.policies()}
    assert names["tokens"].unit == "tokens" and names["tokens"].limit == 3000
    assert names["requests"].limit == 30


def test_the_declared_tokens_are_not_sent() -> None:
    clock = ManualClock()
    seen: list[dict[str, str]] = []

    def dialect(path: str, headers: dict[str, str]) -> servers.Reply:
        seen.append(headers)
        return 200, {}

    with servers.serving(dialect, clock) as served:
        client, _ = _client(clock)
        with client:
            client.get(served.url, headers={"Ratekeeper-Tokens": "5", "Ratekeeper-Priority": "2"})
    assert not any(name.startswith("ratekeeper-") for name in seen[0])


def test_retry_after_only_waits_out_every_refusal() -> None:
    clock = ManualClock(1_700_000_000.0)
    with servers.serving(servers.retry_after(clock, limit=5, window=10), clock) as served:
        client, pacer = _client(clock, retries=Retries(attempts=5))
        with client:
            for _ in range(30):
                assert client.get(served.url + "/x").status_code == 200
    log = served.log
    refusals = [t for t, _, status in log if status == 429]
    # at most one refusal per window (the server says nothing until it refuses), and no request
    # is sent while a Retry-After runs
    windows = (log[-1][0] - log[0][0]) / 10 + 1
    assert len(refusals) <= windows
    for when in refusals:
        later = [t for t, _, _ in log if when < t]
        assert not later or later[0] >= when + 1  # never before the Retry-After (>= 1 s)
    assert pacer.stats()["retries"] == len(refusals)
