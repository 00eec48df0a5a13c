"""What a user, an operator or many threads can do to a pacer while it runs."""

from __future__ import annotations

import asyncio
import threading
import time

import aiohttp
import httpx
import requests

from ratekeeper import Limiter, ManualClock, MemoryStore
from ratekeeper.client import AsyncPacer, Pacer
from ratekeeper.client.aiohttp import PacedMiddleware
from ratekeeper.client.httpx import PacedTransport
from ratekeeper.client.requests import PacedAdapter
from tests.client import servers
from tests.client.fake import Fake, call, pacer

NOW = 1_700_000_000.0


def test_a_rate_changed_on_the_server_is_followed_from_its_next_answer() -> None:
    clock = ManualClock(NOW)
    limiter = Limiter(MemoryStore(), clock=clock)
    rate = ["10/1s"]

    def reply(n: int, headers: dict[str, str]) -> tuple[int, dict[str, str]]:
        d = limiter.hit("key", rate[0])
        return (200 if d.allowed else 429), d.headers("api")

    server = Fake(clock, reply)
    p = pacer(clock)
    for _ in range(30):
        assert call(p, server).status == 200
    rate[0] = "4/1s"  # the operator lowers it; the counter is the limit's, kept
    statuses = [call(p, server).status for _ in range(30)]
    assert statuses[1:].count(429) == 0  # the first answer under the new rate teaches it
    (policy,) = p.policies()
    assert policy.limit == 4
    assert clock() - NOW >= 3 + 30 / 4 - 1.5


def test_threads_share_one_pacer() -> None:
    # real time (about two seconds): four threads on one pacer against a token bucket, which
    # any delay on the way can only make more lenient
    with servers.serving(servers.ietf(time.time, "20/1s", "token_bucket"), time.time) as served:
        pacer_ = Pacer(max_wait=60)
        client = httpx.Client(transport=PacedTransport(pacer_))
        statuses: list[int] = []

        def caller() -> None:
            for _ in range(10):
                statuses.append(client.get(served.url).status_code)

        threads = [threading.Thread(target=caller) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        client.close()
    assert statuses == [200] * 40
    assert served.statuses() == [200] * 40
    assert pacer_.stats()["sent"] == 40


def test_requests_and_aiohttp_strip_the_pacers_headers() -> None:
    clock = ManualClock(NOW)
    seen: list[dict[str, str]] = []

    def recording(path: str, headers: dict[str, str]) -> servers.Reply:
        seen.append(headers)
        return 200, {}

    own = {"Ratekeeper-Tokens": "5", "Ratekeeper-Priority": "1", "Ratekeeper-Max-Wait": "3",
           "Ratekeeper-Partition": "x"}  # fmt: skip
    with servers.serving(recording, clock) as served:
        session = requests.Session()
        session.mount("http://", PacedAdapter(Pacer(clock=clock, sleep=clock.advance)))
        session.get(served.url, headers=own)

        async def main() -> None:
            async def sleep(seconds: float) -> None:
                clock.advance(seconds)

            middleware = PacedMiddleware(AsyncPacer(clock=clock, sleep=sleep))
            async with aiohttp.ClientSession(middlewares=[middleware]) as s:
                response = await s.get(served.url, headers=own)
                await response.read()
                response.release()

        asyncio.run(main())
    assert len(seen) == 2
    assert not any(name.startswith("ratekeeper-") for h in seen for name in h)
