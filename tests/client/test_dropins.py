"""The drop-ins on real clients against loopback servers: httpx (sync and async), requests,
aiohttp. Each is one line on an existing client; each paces, strips the pacer's own request
headers, and retries only what may be sent again."""

from __future__ import annotations

import asyncio
import heapq
import itertools

import aiohttp
import httpx
import requests

from ratekeeper import ManualClock
from ratekeeper.client import AsyncPacer, Pacer
from ratekeeper.client.aiohttp import PacedMiddleware
from ratekeeper.client.httpx import AsyncPacedTransport, PacedTransport
from ratekeeper.client.requests import PacedAdapter
from tests.client import servers

NOW = 1_700_000_000.25


class VirtualTime:
    """``sleep`` for several tasks on one ``ManualClock``: a sleeper wakes when the clock
    reaches its time, and the clock jumps to the earliest sleeper whenever the loop has had a
    millisecond of real time with sleepers waiting (the others are doing real I/O)."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self.order = itertools.count()

    async def sleep(self, seconds: float) -> None:
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self.sleepers, (self.clock() + seconds, next(self.order), future))
        await future

    async def run(self) -> None:
        while True:
            await asyncio.sleep(0.001)
            if self.sleepers:
                wake, _, future = heapq.heappop(self.sleepers)
                if wake > self.clock():
                    self.clock.set(wake)
                if not future.done():
                    future.set_result(None)


def test_httpx_sync_paces_and_strips_its_headers() -> None:
    clock = ManualClock(NOW)
    seen: list[dict[str, str]] = []
    dialect = servers.ietf(clock, "5/1s")

    def recording(path: str, headers: dict[str, str]) -> servers.Reply:
        seen.append(headers)
        return dialect(path, headers)

    with servers.serving(recording, clock) as served:
        pacer = Pacer(clock=clock, sleep=clock.advance)
        with httpx.Client(transport=PacedTransport(pacer)) as client:
            for _ in range(20):
                response = client.get(served.url, headers={"Ratekeeper-Priority": "1"})
                assert response.status_code == 200
    assert 429 not in served.statuses()
    assert clock() - NOW >= 2.5  # 20 requests at 5 a second: paced, not sent at once
    assert all("ratekeeper-priority" not in h for h in seen)


def test_httpx_async_four_callers_share_one_budget() -> None:
    clock = ManualClock(NOW)

    async def main(url: str) -> None:
        time = VirtualTime(clock)
        ticker = asyncio.ensure_future(time.run())
        pacer = AsyncPacer(clock=clock, sleep=time.sleep)
        async with httpx.AsyncClient(transport=AsyncPacedTransport(pacer)) as client:

            async def caller() -> None:
                for _ in range(15):
                    assert (await client.get(url)).status_code == 200

            await asyncio.gather(*(caller() for _ in range(4)))
        ticker.cancel()

    with servers.serving(servers.ietf(clock, "10/1s", "fixed_window"), clock) as served:
        asyncio.run(main(served.url))
    assert 429 not in served.statuses()[1:]
    assert len(served.log) == 60


def test_requests_adapter_paces_and_retries_a_put_with_its_body() -> None:
    clock = ManualClock(NOW)
    bodies: list[int] = []
    dialect = servers.retry_after(clock, limit=2, window=5)

    def recording(path: str, headers: dict[str, str]) -> servers.Reply:
        bodies.append(int(headers.get("content-length", "0")))
        return dialect(path, headers)

    with servers.serving(recording, clock) as served:
        session = requests.Session()
        session.mount("http://", PacedAdapter(Pacer(clock=clock, sleep=clock.advance)))
        for _ in range(4):
            assert session.put(served.url, data=b"x" * 10).status_code == 200
    # the third is refused (the server states nothing before), waits out its Retry-After and
    # goes again with its body; the window that then opens takes the fourth
    assert served.statuses() == [200, 200, 429, 200, 200]
    assert bodies == [10] * 5


def test_requests_adapter_does_not_retry_a_post_or_a_generator_body() -> None:
    clock = ManualClock(NOW)

    def refusing(path: str, headers: dict[str, str]) -> servers.Reply:
        return 429, {"Retry-After": "1"}

    with servers.serving(refusing, clock) as served:
        session = requests.Session()
        session.mount("http://", PacedAdapter(Pacer(clock=clock, sleep=clock.advance)))
        assert session.post(served.url, data=b"x").status_code == 429
        assert len(served.log) == 1
        assert session.put(served.url, data=iter([b"x"])).status_code == 429
        assert len(served.log) == 2  # it waited out the Retry-After, and was sent once
        assert session.put(served.url, data=b"x").status_code == 429
        assert len(served.log) == 5  # bytes can be sent again: three attempts


def test_aiohttp_middleware_paces_and_retries() -> None:
    clock = ManualClock(NOW)

    async def main(url: str) -> list[int]:
        async def sleep(seconds: float) -> None:
            clock.advance(seconds)

        pacer = AsyncPacer(clock=clock, sleep=sleep)
        statuses = []
        async with aiohttp.ClientSession(middlewares=[PacedMiddleware(pacer)]) as session:
            for _ in range(12):
                async with session.get(url, headers={"Ratekeeper-Tokens": "3"}) as response:
                    statuses.append(response.status)
                    await response.read()
        return statuses

    with servers.serving(servers.github(clock, limit=5, window=10), clock) as served:
        assert asyncio.run(main(served.url)) == [200] * 12
    assert 429 not in served.statuses()


def test_aiohttp_retries_a_refusal_that_says_when() -> None:
    clock = ManualClock(NOW)

    async def main(url: str) -> list[int]:
        async def sleep(seconds: float) -> None:
            clock.advance(seconds)

        pacer = AsyncPacer(clock=clock, sleep=sleep)
        async with aiohttp.ClientSession(middlewares=[PacedMiddleware(pacer)]) as session:
            out = []
            for _ in range(3):
                async with session.get(url) as response:
                    out.append(response.status)
            return out

    with servers.serving(servers.retry_after(clock, limit=2, window=10), clock) as served:
        assert asyncio.run(main(served.url)) == [200, 200, 200]
    assert served.statuses() == [200, 200, 429, 200]
