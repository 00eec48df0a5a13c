"""A request cancelled or interrupted during admission leaks nothing: no slot, no lease, no
charge, no count in ``in_flight`` — whatever ends it, ASGI and WSGI, memory and real Redis."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from ratekeeper import MemoryStore, RedisStore
from ratekeeper.middleware import (
    ConcurrencyCheck,
    RateCheck,
    RateLimitMiddleware,
    WSGIRateLimitMiddleware,
)

SCOPE = {"type": "http", "method": "GET", "path": "/", "headers": [], "client": ("1.2.3.4", 1)}


class HeldReplies:
    """A memory store whose lease acquires are applied at once but answered only when the test
    lets them: the shape of a Redis call whose script ran while its reply is still on the way."""

    def __init__(self) -> None:
        self.memory = MemoryStore()
        self.acquiring = asyncio.Event()
        self.answer = asyncio.Event()

    async def execute_async(self, plan: Any) -> Any:
        return await self.memory.execute_async(plan)

    async def acquire_lease_async(self, *args: Any) -> tuple[bool, int]:
        granted = await self.memory.acquire_lease_async(*args)
        self.acquiring.set()
        await self.answer.wait()
        return granted

    async def release_lease_async(self, *args: Any) -> bool:
        return await self.memory.release_lease_async(*args)

    async def count_leases_async(self, *args: Any) -> int:
        return await self.memory.count_leases_async(*args)


async def _hang(scope: Any, receive: Any, send: Any) -> None:
    await asyncio.Event().wait()


async def _receive() -> dict[str, Any]:
    return {"type": "http.request", "body": b""}


async def _drop(message: Any) -> None:
    pass


def test_cancelled_while_a_lease_is_in_flight_gives_everything_back() -> None:
    store = HeldReplies()
    checks = [RateCheck("rate", "5/minute", key=lambda r: "k"), ConcurrencyCheck("conc", 3)]
    mw = RateLimitMiddleware(_hang, checks, store=store)

    async def main() -> None:
        for _ in range(3):  # three requests cancelled mid-acquire (client gone, timeout)
            store.acquiring.clear()
            store.answer.clear()
            task = asyncio.create_task(mw(SCOPE, _receive, _drop))
            await store.acquiring.wait()  # charged, and the lease is taken in the store
            task.cancel()
            await asyncio.sleep(0.01)
            store.answer.set()  # the reply arrives after the cancellation
            with pytest.raises(asyncio.CancelledError):
                await task
            for _ in range(100):
                if mw.gate.in_flight == 0 and store.memory.count_leases("conc:1.2.3.4", 0) == 0:
                    break
                await asyncio.sleep(0.01)
        assert mw.gate.in_flight == 0
        assert store.memory.count_leases("conc:1.2.3.4", 0) == 0
        peek = await mw.limiter.peek("rate:k", "5/minute")
        assert peek.remaining == 5  # every charge refunded: none of them was served

    asyncio.run(main())


def test_outer_timeout_during_admission_on_redis_leaks_no_slot(redis_url: str) -> None:
    """Cancel at many points of a real Redis admission (hit, then acquire): every slot comes
    back, and the cap of 3 still admits 3."""
    store = RedisStore(redis_url, socket_timeout=2.0, prefix="cancel")
    checks = [RateCheck("rate", "1000/hour", key=lambda r: "k"), ConcurrencyCheck("conc", 3)]
    mw = RateLimitMiddleware(_hang, checks, store=store)
    entered: list[bool] = []

    async def main() -> tuple[int, int]:
        await store.async_client.flushdb()  # type: ignore[union-attr]  # built from a url
        for i in range(40):
            task = asyncio.create_task(mw(SCOPE, _receive, _drop))
            for _ in range(i % 8):  # cancel after a different number of loop turns each time
                await asyncio.sleep(0)
            await _cancel(task)
        for _ in range(300):
            leases = await store.count_leases_async("conc:1.2.3.4", 0)
            if leases == 0 and mw.gate.in_flight == 0:
                break
            await asyncio.sleep(0.01)

        async def app(scope: Any, receive: Any, send: Any) -> None:
            entered.append(True)
            await asyncio.Event().wait()

        mw.app = app
        tasks = [asyncio.create_task(mw(SCOPE, _receive, _drop)) for _ in range(3)]
        for _ in range(300):
            if len(entered) == 3:
                break
            await asyncio.sleep(0.01)
        for t in tasks:
            await _cancel(t)
        await store.aclose()
        return leases, mw.gate.in_flight

    leases, in_flight = asyncio.run(main())
    assert (leases, in_flight) == (0, 0)
    assert len(entered) == 3  # all three slots were free again


async def _cancel(task: asyncio.Task[None]) -> None:
    """Cancel until done: a cancellation landing inside the Redis client can be swallowed
    there, and the request then goes on into the (hanging) app."""
    for _ in range(50):
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=0.1)
        if done:
            return
    raise AssertionError("the request could not be cancelled")


class Interrupt(BaseException):
    """What a gevent/eventlet timeout or a signal raises inside a worker: not an Exception."""


class InterruptingLeases(MemoryStore):
    """Interrupts the ``n``-th lease acquire, as a timeout firing in a store call would."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.calls = 0
        self.n = n

    def acquire_lease(self, *args: Any) -> tuple[bool, int]:
        self.calls += 1
        if self.calls == self.n:
            raise Interrupt
        return super().acquire_lease(*args)


def test_wsgi_admission_interrupted_gives_everything_back() -> None:
    store = InterruptingLeases(n=2)
    checks = [
        RateCheck("rate", "5/minute", key=lambda r: "k"),
        ConcurrencyCheck("first", 1, key=lambda r: "k"),
        ConcurrencyCheck("second", 1, key=lambda r: "k"),
    ]

    def app(environ: Any, start_response: Any) -> list[bytes]:
        start_response("200 OK", [])
        return [b"ok"]

    mw = WSGIRateLimitMiddleware(app, checks, store=store)
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/", "REMOTE_ADDR": "1.2.3.4"}
    with pytest.raises(Interrupt):
        mw(environ, lambda *a: None)
    assert mw.gate.in_flight == 0
    assert store.count_leases("first:k", 0) == 0  # granted before the interruption: released
    assert mw.limiter.peek("rate:k", "5/minute").remaining == 5  # and the charge refunded
    statuses: list[str] = []
    body = mw(environ, lambda status, headers: statuses.append(status))
    list(body)
    body.close()  # type: ignore[attr-defined]  # the middleware's iterable has close()
    assert statuses == ["200 OK"]
