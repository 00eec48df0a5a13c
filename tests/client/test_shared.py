"""One pace across processes, on a real Redis: pacers sharing a store send as one client."""

from __future__ import annotations

import asyncio
import math

from ratekeeper import Limiter, ManualClock, MemoryStore, RedisStore
from ratekeeper.client import Answer, AsyncPacer, Pacer, outgoing
from tests.client.fake import URL, Fake, call, pacer

NOW = 1_700_000_000.0


def _server(clock: ManualClock, rate: str = "10/1s") -> Fake:
    limiter = Limiter(MemoryStore(), clock=clock)

    def reply(n: int, headers: dict[str, str]) -> tuple[int, dict[str, str]]:
        d = limiter.hit("key", rate)
        return (200 if d.allowed else 429), d.headers()

    return Fake(clock, reply)


def test_two_pacers_on_one_store_keep_one_pace(redis_url: str) -> None:
    clock = ManualClock(NOW)
    server = _server(clock)
    store = RedisStore(redis_url, socket_timeout=5.0)
    pacers = [pacer(clock, shared=store, headroom=0.9) for _ in range(2)]
    for i in range(40):
        call(pacers[i % 2], server)
    store.close()
    interval = 1 / 9  # 90 % of 10/s, whichever process sends
    gaps = [b - a for a, b in zip(server.sent[4:], server.sent[5:], strict=False)]
    assert all(g >= interval - 1e-3 for g in gaps), gaps
    assert all(p.stats()["refused"] == 0 for p in pacers)
    assert sum(p.stats()["shared_hits"] for p in pacers) >= 38
    # alone, each would have sent at its own pace: twice as fast together
    alone = [pacer(clock, headroom=0.9) for _ in range(2)]
    server2 = _server(clock)
    for i in range(10):
        call(alone[i % 2], server2)
    assert (
        min(b - a for a, b in zip(server2.sent[3:], server2.sent[4:], strict=False)) < interval / 2
    )


def test_requests_sent_before_the_policy_was_known_are_booked(redis_url: str) -> None:
    clock = ManualClock(NOW)
    server = _server(clock, "100/1s")
    store = RedisStore(redis_url, socket_timeout=5.0)
    pacers = [pacer(clock, shared=store, headroom=1.0) for _ in range(5)]
    for p in pacers:  # five processes' first requests, all at once
        call(p, server)
    assert server.sent == [NOW] * 5
    call(pacers[0], server)  # the sixth's turn comes after the five booked late
    store.close()
    assert server.sent[5] >= NOW + 5 * 0.01 - 1e-3


def test_the_async_pacer_shares_the_same_pace(redis_url: str) -> None:
    clock = ManualClock(NOW)
    server = _server(clock)
    store = RedisStore(redis_url, socket_timeout=5.0)
    sync = pacer(clock, shared=store, headroom=0.9)

    async def sleep(seconds: float) -> None:
        clock.advance(seconds)

    async def main() -> None:
        apacer = AsyncPacer(
            clock=clock, sleep=sleep, random=lambda: 0.5, shared=store, headroom=0.9
        )
        request = outgoing("GET", URL, [])

        async def send() -> Answer:
            return server.send({})

        async def discard(answer: Answer) -> None:
            pass

        for _ in range(10):
            await apacer.run(request, send, lambda a: a, discard)
            call(sync, server)
        await store.aclose()

    asyncio.run(main())
    store.close()
    gaps = [b - a for a, b in zip(server.sent[4:], server.sent[5:], strict=False)]
    assert all(g >= 1 / 9 - 1e-3 for g in gaps), gaps


def test_an_unreachable_store_fails_open_to_the_local_pace() -> None:
    clock = ManualClock(NOW)
    server = _server(clock)
    store = RedisStore("redis://127.0.0.1:1/0", socket_timeout=0.2)
    p = pacer(clock, shared=store, headroom=0.9, burst=1)
    for _ in range(12):
        call(p, server)
    store.close()
    assert p.stats()["shared_degraded"] >= 10
    gaps = [b - a for a, b in zip(server.sent[2:], server.sent[3:], strict=False)]
    assert all(math.isclose(g, 1 / 9, rel_tol=1e-3) or g > 1 / 9 for g in gaps)


def test_a_request_may_wait_for_a_turn_beyond_the_pacers_max_wait(redis_url: str) -> None:
    # regression: the queue was sized by the pacer's max_wait, so a request allowed to wait
    # longer (Ratekeeper-Max-Wait) found it full and was refused at once
    clock = ManualClock(NOW)
    server = _server(clock, "10/1s")
    store = RedisStore(redis_url, socket_timeout=5.0)
    first = pacer(clock, shared=store, headroom=1.0, max_wait=1)
    call(first, server)  # learns 10/1s
    booked = Limiter(store, clock=clock)
    (ask,) = first.shared.asks(
        first.core.open(outgoing("GET", URL, [])),
        [(b, 1.0) for part in first.core._parts.values() for b in part.budgets.values()],
        1.0,
        1,
    )  # type: ignore[union-attr]
    for _ in range(30):  # thirty turns booked by other processes: three seconds ahead
        booked.hit(ask.key, ask.rate, algorithm="gcra", cost=1, burst=ask.queue)
    began = clock()
    call(first, server, headers={"Ratekeeper-Max-Wait": "10"})
    assert 2.9 <= clock() - began <= 3.2
    store.close()


def test_local_leases_are_refused_with_the_reason(redis_url: str) -> None:
    import pytest

    from ratekeeper import ConfigError, LocalBudget

    store = RedisStore(redis_url, socket_timeout=5.0)
    with pytest.raises(ConfigError, match="turn"):
        Pacer(shared=LocalBudget(store))
    store.close()
