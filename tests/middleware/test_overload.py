"""Shedding in the middleware: default signals per server type, queue delay from arrival
stamps, admission control through real servers, and what a shed request does not cost."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from flask import Flask
from starlette.testclient import TestClient

from ratekeeper import (
    LoopLag,
    ManualClock,
    ProcessCPU,
    QueueDelay,
    ShedderSettings,
    WorkerUtilizationShedder,
)
from ratekeeper.middleware import (
    AdmissionCheck,
    RateLimitMiddleware,
    WorkerCheck,
    WSGIRateLimitMiddleware,
    priorities,
)
from ratekeeper.overload.signals import Worst
from tests.middleware.servers import uvicorn_server, wait_until, wsgi_server

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
PRIORITY = priorities(critical=["/charges"])


def asgi_app(release: asyncio.Event | None = None) -> FastAPI:
    """``/hold`` waits for ``release``, set from another thread through ``app.state.loop``."""
    app = FastAPI()

    @app.get("/items")
    async def items() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/hold")
    async def hold() -> dict[str, bool]:
        assert release is not None
        app.state.loop = asyncio.get_running_loop()
        await release.wait()
        return {"ok": True}

    @app.post("/charges")
    async def charge() -> dict[str, bool]:
        return {"charged": True}

    return app


def wsgi_app(release: threading.Event | None = None) -> Flask:
    app = Flask(__name__)

    @app.get("/items")
    def items() -> dict[str, bool]:
        return {"ok": True}

    @app.get("/hold")
    def hold() -> dict[str, bool]:
        assert release is not None
        release.wait(30)
        return {"ok": True}

    @app.post("/charges")
    def charge() -> dict[str, bool]:
        return {"charged": True}

    return app


def default_signals(middleware: Any) -> tuple[Any, ...]:
    shedder = middleware.gate._shedders[0]
    assert shedder.settings == ShedderSettings.fast()
    assert isinstance(shedder.utilization, Worst)
    return shedder.utilization.signals


def test_worker_check_default_signal_per_server_type() -> None:
    """CPU share on both; the event loop's lag (ASGI) or busy threads (WSGI) beside it."""
    cpu, lag = default_signals(RateLimitMiddleware(asgi_app(), [WorkerCheck()]))
    assert isinstance(cpu, ProcessCPU) and isinstance(lag, LoopLag)
    wsgi = WSGIRateLimitMiddleware(wsgi_app(), [WorkerCheck(max_in_flight=4)])
    cpu, busy = default_signals(wsgi)
    assert isinstance(cpu, ProcessCPU) and busy() == 0.0
    wsgi.gate.in_flight = 3  # three of four threads inside the app
    assert busy() == 0.75
    delay = QueueDelay()
    *_, joined = default_signals(
        WSGIRateLimitMiddleware(wsgi_app(), [WorkerCheck(queue_delay=delay)])
    )
    assert joined is delay


def test_asgi_default_shedder_sheds_low_tiers_while_the_loop_lags() -> None:
    clock = ManualClock()
    mw = RateLimitMiddleware(asgi_app(), [WorkerCheck()], clock=clock, priority=PRIORITY)
    _, lag = default_signals(mw)
    transport = httpx.ASGITransport(app=mw)

    async def main() -> list[int]:
        statuses = []
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            for _ in range(90):  # 9 s of a saturated loop, sampled every 0.1 s
                clock.advance(0.1)
                lag.record(1.0)  # the loop is saturated (the CPU share may say anything)
                statuses.append((await client.get("/items")).status_code)
                assert (await client.post("/charges")).status_code == 200
        lag.detach()
        return statuses

    statuses = asyncio.run(main())
    assert statuses[:5] == [200] * 5  # 1 s before shedding starts
    assert statuses[-10:] == [503] * 10  # get tier fully shed after 1 + 8 * 2/3 s
    assert mw.stats()["shedding"]["workers"]["drop_probability"]["critical"] == 0


@pytest.mark.parametrize("server", ["asgi", "wsgi"])
def test_worker_check_feeds_queue_delay_from_arrival_stamps(server: str) -> None:
    clock = ManualClock()
    delay = QueueDelay(saturated_at=0.05, clock=clock)
    shedder = WorkerUtilizationShedder(
        delay, settings=ShedderSettings.fast(), clock=clock, random=lambda: 0.5
    )
    check = WorkerCheck(shedder, queue_delay=delay)
    statuses = []
    if server == "asgi":
        mw: Any = RateLimitMiddleware(asgi_app(), [check], clock=clock)
        client: Any = TestClient(mw)
    else:
        mw = WSGIRateLimitMiddleware(wsgi_app(), [check], clock=clock)
        client = httpx.Client(transport=httpx.WSGITransport(app=mw), base_url="http://t")
    for _ in range(60):  # 6 s
        clock.advance(0.1)
        stamp = {"X-Request-Start": f"t={round((clock() - 0.2) * 1e6)}"}  # Apache: µs, 200 ms ago
        statuses.append(client.get("/items", headers=stamp).status_code)
    assert delay.delay() == pytest.approx(0.2, abs=1e-5)
    assert statuses[0] == 200 and statuses[-1] == 503


def test_wsgi_arrival_from_mod_wsgi_environ() -> None:
    clock = ManualClock()
    delay = QueueDelay(clock=clock)
    mw = WSGIRateLimitMiddleware(wsgi_app(), [WorkerCheck(queue_delay=delay)], clock=clock)
    environ = {"mod_wsgi.request_start": str(int((clock() - 0.03) * 1e6))}
    with wsgi_app().test_client() as client:
        client.application.wsgi_app = mw  # type: ignore[method-assign]  # the middleware in front
        assert client.get("/items", environ_base=environ).status_code == 200
    assert delay.delay() == pytest.approx(0.03, abs=1e-5)


def test_a_shed_request_reads_no_body_and_runs_no_app_code() -> None:
    clock = ManualClock()
    shedder = WorkerUtilizationShedder(lambda: 1.0, clock=clock)
    for _ in range(8):  # long saturated: everything but the critical tier is shed
        shedder.update()
        clock.advance(100)
    assert shedder.shedding_amount == 1
    called: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        called.append("app")

    async def receive() -> dict[str, Any]:
        called.append("receive")
        return {"type": "http.request", "body": b"x" * 10, "more_body": False}

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    mw = RateLimitMiddleware(app, [WorkerCheck(shedder)], clock=clock)
    scope = {"type": "http", "method": "GET", "path": "/items", "headers": [], "client": None}
    asyncio.run(mw(scope, receive, send))
    asyncio.run(mw(scope, receive, send))
    assert called == [] and sent[-2]["status"] == 503

    def wsgi(environ: Any, start_response: Any) -> list[bytes]:
        called.append("app")
        return []

    class Unreadable:
        def read(self, *args: Any) -> bytes:
            called.append("read")
            return b""

    wmw = WSGIRateLimitMiddleware(wsgi, [WorkerCheck(shedder)], clock=clock)
    lines: list[str] = []
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/items", "wsgi.input": Unreadable()}
    wmw(environ, lambda line, headers: lines.append(line))
    assert called == [] and lines == ["503 Service Unavailable"]


def test_admission_check_over_uvicorn_queues_sheds_and_lets_critical_through() -> None:
    async def main() -> None:
        release = asyncio.Event()
        check = AdmissionCheck(limit=1, target_delay=0.05, interval=0.2)
        mw = RateLimitMiddleware(asgi_app(release), [check], priority=PRIORITY)
        core = mw.gate.admissions[0]
        with uvicorn_server(mw) as url:
            async with httpx.AsyncClient(base_url=url, timeout=30) as client:
                holder = asyncio.create_task(client.get("/hold"))
                assert await asyncio.to_thread(wait_until, lambda: core.in_flight == 1)
                shed = await client.get("/items")  # waits `interval`, then 503
                assert shed.status_code == 503 and shed.json()["error"] == "overloaded"
                assert shed.headers["Retry-After"] == "1"
                assert (await client.post("/charges")).status_code == 200  # never queued
                waiting = asyncio.create_task(client.get("/items"))
                assert await asyncio.to_thread(wait_until, lambda: core.waiting == 1)
                mw.app.state.loop.call_soon_threadsafe(release.set)  # the server's loop
                assert (await holder).status_code == 200
                assert (await waiting).status_code == 200  # got the freed slot
        assert core.in_flight == 0 and core.waiting == 0
        stats = mw.stats()["shedding"]["admission"]
        assert stats["tiers"]["get"] == {"admitted": 2, "queued": 2, "shed": 1}

    asyncio.run(main())


def test_admission_check_over_a_threaded_wsgi_server() -> None:
    release = threading.Event()
    check = AdmissionCheck(limit=1, target_delay=0.05, interval=0.2)
    mw = WSGIRateLimitMiddleware(wsgi_app(release), [check], priority=PRIORITY)
    core = mw.gate.admissions[0]
    with wsgi_server(mw) as url, httpx.Client(base_url=url, timeout=30) as client:
        holder = threading.Thread(target=client.get, args=("/hold",))
        holder.start()
        assert wait_until(lambda: core.in_flight == 1)
        assert client.get("/items").status_code == 503  # waited `interval` in its thread
        assert client.post("/charges").status_code == 200
        release.set()
        holder.join(30)
        assert client.get("/items").status_code == 200
    assert wait_until(lambda: core.in_flight == 0)
    assert mw.stats()["shedding"]["admission"]["tiers"]["get"]["shed"] == 1


def test_admission_check_in_shadow_mode_never_waits_and_counts() -> None:
    async def main() -> None:
        release = asyncio.Event()
        mw = RateLimitMiddleware(
            asgi_app(release), [AdmissionCheck(limit=1, interval=5.0, target_delay=5.0)]
        )
        mw.controls.shadow("admission")
        transport = httpx.ASGITransport(app=mw)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            holder = asyncio.create_task(client.get("/hold"))
            while mw.gate.admissions[0].in_flight == 0:
                await asyncio.sleep(0.001)
            assert (await client.get("/items")).status_code == 200  # at once, not after 5 s
            release.set()
            await holder
        assert mw.stats()["checks"]["admission"]["shadow_rejected"] == 1
        assert mw.gate.admissions[0].in_flight == 0

    asyncio.run(asyncio.wait_for(main(), 4))


def test_admission_waiter_cancelled_when_the_client_goes_away() -> None:
    async def main() -> None:
        release = asyncio.Event()
        mw = RateLimitMiddleware(
            asgi_app(release), [AdmissionCheck(limit=1, interval=5.0, target_delay=5.0)]
        )
        core = mw.gate.admissions[0]
        transport = httpx.ASGITransport(app=mw)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            holder = asyncio.create_task(client.get("/hold"))
            while core.in_flight == 0:
                await asyncio.sleep(0.001)
            gone = asyncio.create_task(client.get("/items"))
            while core.waiting == 0:
                await asyncio.sleep(0.001)
            gone.cancel()
            with pytest.raises(asyncio.CancelledError):
                await gone
            assert core.waiting == 0
            release.set()
            await holder
        assert core.in_flight == 0

    asyncio.run(asyncio.wait_for(main(), 10))


def test_an_aborted_admission_gives_its_ticket_back() -> None:
    """Cut short while the ``enter`` call was in flight: the ticket it granted is released."""
    from ratekeeper.middleware.gate import Admission, Op

    mw = WSGIRateLimitMiddleware(wsgi_app(), [AdmissionCheck(limit=1)])
    core = mw.gate.admissions[0]
    ticket = mw.execute(Op("enter", 0, "get"))
    assert ticket is not None and core.in_flight == 1
    adm = Admission()
    adm.entered = True
    mw.gate.in_flight = 1
    for op in mw.gate.abort(adm, Op("enter", 0, "get"), ticket):
        mw.execute(op)
    assert core.in_flight == 0 and mw.gate.in_flight == 0
