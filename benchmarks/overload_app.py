"""The apps ``bench_overload`` drives: a FastAPI app (uvicorn) and its Flask twin (gunicorn).

``GET /low`` spends 3 ms of CPU, ``POST /charges`` (critical) 1 ms. The shedding configuration
comes from the environment, so that the server process builds it at import:

- ``RK_SHED=none``: no middleware;
- ``RK_SHED=worker``: ``WorkerCheck()`` — the default signal of the server type (event-loop lag
  under uvicorn; busy threads under gunicorn, ``max_in_flight`` = ``RK_THREADS``);
- ``RK_SHED=adaptive``: ``AdmissionCheck()`` (gradient limit, CoDel queue);
- ``RK_SHED=fixed:N``: ``AdmissionCheck(limit=N)``;
- ``RK_SHED=always``: a worker shedder held at full shedding (the cost of a shed request);
- ``RK_SHED=raw503``: no middleware; ``/low`` answers 503 at once (the server's ceiling).

An outer meter counts responses per tier and status in 0.25 s buckets (monotonic clock, the
same on every process of the host) with the controller's state at each bucket, and serves them
as JSON at ``GET /__bench/series``, outside the middleware.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from fastapi import FastAPI
from flask import Flask

from ratekeeper import (
    LoopLag,
    ManualClock,
    ProcessCPU,
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

BUCKET = 0.25
LOW_MS = 3.0
CRITICAL_MS = 1.0
SERIES_PATH = "/__bench/series"


def burn(ms: float) -> None:
    """Spend ``ms`` milliseconds of this thread's CPU (not wall time: a busy neighbour does not
    shorten the work)."""
    end = time.thread_time() + ms / 1000
    while time.thread_time() < end:
        pass


def checks() -> list[Any]:
    """The checks ``RK_SHED`` asks for (``RK_TARGET``/``RK_INTERVAL`` override the queue's
    delays, ``RK_SWITCH`` the interpreter's switch interval: tuning knobs)."""
    mode = os.environ.get("RK_SHED", "none")
    if "RK_SWITCH" in os.environ:
        sys.setswitchinterval(float(os.environ["RK_SWITCH"]))
    target = float(os.environ["RK_TARGET"]) if "RK_TARGET" in os.environ else None
    interval = float(os.environ["RK_INTERVAL"]) if "RK_INTERVAL" in os.environ else None
    if mode in ("none", "raw503"):
        return []
    if mode == "always":
        return [WorkerCheck(pinned_shedder())]
    if mode == "worker":
        threads = int(os.environ.get("RK_THREADS", "8"))
        if "RK_WORKER" not in os.environ:
            return [WorkerCheck(max_in_flight=threads)]
        # tuning: RK_WORKER="signal,good_below,bad_above,before,all" (signal: lag:<s> or cpu)
        kind, *numbers = os.environ["RK_WORKER"].split(",")
        good, bad, before, total = (float(x) for x in numbers)
        settings = ShedderSettings(good, bad, before, total, sample_every=0.1)
        signal: Any = None
        if kind.startswith("lag:"):
            signal = LoopLag(float(kind[4:]))
        elif kind == "cpu":
            signal = ProcessCPU(every=0.25)
        shedder = WorkerUtilizationShedder(signal, settings=settings)
        return [WorkerCheck(shedder, max_in_flight=threads)]
    if mode == "adaptive":
        return [AdmissionCheck(target_delay=target, interval=interval)]
    if mode.startswith("fixed:"):
        return [AdmissionCheck(limit=int(mode[6:]), target_delay=target, interval=interval)]
    raise SystemExit(f"RK_SHED={mode!r} is invalid; expected none, worker, adaptive or fixed:N")


PRIORITY = priorities(critical=["/charges"])
REJECTION = b'{"error":"overloaded"}'


def pinned_shedder() -> WorkerUtilizationShedder:
    """A worker shedder held at full shedding: every request but a critical one is shed."""
    clock = ManualClock()
    shedder = WorkerUtilizationShedder(lambda: 1.0, clock=clock)
    while shedder.shedding_amount < 1:
        shedder.update()
        clock.advance(100)
    return shedder


class Meter:
    """Responses per (tier, status) per bucket, and the controller's state per bucket."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.buckets: dict[int, dict[str, Any]] = {}
        self.state: Callable[[], dict[str, Any]] = dict

    def count(self, path: str, status: int) -> None:
        index = int(time.monotonic() / BUCKET)
        tier = "critical" if path == "/charges" else "low"
        with self.lock:
            bucket = self.buckets.get(index)
            if bucket is None:
                bucket = self.buckets[index] = {
                    "t": index * BUCKET,
                    "cpu": time.process_time(),
                    **self.state(),
                }
            key = f"{tier}_{status}"
            bucket[key] = bucket.get(key, 0) + 1

    def dump(self) -> bytes:
        with self.lock:
            rows = [self.buckets[i] for i in sorted(self.buckets)]
        return json.dumps(rows).encode()


def controller_state(middleware: Any) -> Callable[[], dict[str, Any]]:
    """A snapshot of the shedding controller: the admission limit, or the worker shedder's
    shedding amount, drop probability of the low tier and loop lag."""

    def state() -> dict[str, Any]:
        if middleware is None:
            return {}
        out: dict[str, Any] = {}
        for check in middleware.gate.checks:
            stats = middleware.gate.shedding_stats().get(check.name)
            if stats is None:
                continue
            if "limit" in stats:
                out["limit"] = stats["limit"]
                out["waiting"] = stats["waiting"]
            else:
                out["shedding_amount"] = stats["shedding_amount"]
                out["utilization"] = stats["utilization"]
                out["drop_get"] = stats["drop_probability"]["get"]
        return out

    return state


# -- ASGI: FastAPI under uvicorn ------------------------------------------------------------

fastapi_app = FastAPI()


@fastapi_app.get("/low")
async def low() -> dict[str, bool]:
    burn(LOW_MS)
    return {"ok": True}


@fastapi_app.post("/charges")
async def charges() -> dict[str, bool]:
    burn(CRITICAL_MS)
    return {"charged": True}


def _asgi() -> Any:
    shed = checks()
    inner: Any = fastapi_app
    middleware = None
    if shed:
        middleware = inner = RateLimitMiddleware(fastapi_app, shed, priority=PRIORITY)
    meter = Meter()
    meter.state = controller_state(middleware)
    raw503 = os.environ.get("RK_SHED") == "raw503"

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await inner(scope, receive, send)
            return
        path = scope["path"]
        if path == SERIES_PATH:
            body = meter.dump()
            headers = [(b"content-type", b"application/json")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return

        if raw503 and path == "/low":
            meter.count(path, 503)
            headers = [(b"content-type", b"application/json")]
            await send({"type": "http.response.start", "status": 503, "headers": headers})
            await send({"type": "http.response.body", "body": REJECTION})
            return

        async def counting_send(message: Any) -> None:
            if message["type"] == "http.response.start":
                meter.count(path, message["status"])
            await send(message)

        await inner(scope, receive, counting_send)

    return app


asgi_app = _asgi()


# -- WSGI: the Flask twin under gunicorn (gthread) ------------------------------------------

flask_app = Flask(__name__)


@flask_app.get("/low")
def flask_low() -> dict[str, bool]:
    burn(LOW_MS)
    return {"ok": True}


@flask_app.post("/charges")
def flask_charges() -> dict[str, bool]:
    burn(CRITICAL_MS)
    return {"charged": True}


def _wsgi() -> Any:
    shed = checks()
    inner: Any = flask_app.wsgi_app
    middleware = None
    if shed:
        middleware = inner = WSGIRateLimitMiddleware(flask_app.wsgi_app, shed, priority=PRIORITY)
    meter = Meter()
    meter.state = controller_state(middleware)
    raw503 = os.environ.get("RK_SHED") == "raw503"

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == SERIES_PATH:
            start_response("200 OK", [("Content-Type", "application/json")])
            return [meter.dump()]

        if raw503 and path == "/low":
            meter.count(path, 503)
            start_response("503 Service Unavailable", [("Content-Type", "application/json")])
            return [REJECTION]

        def counting_start(status: str, headers: Any, *exc_info: Any) -> Any:
            meter.count(path, int(status[:3]))
            return start_response(status, headers, *exc_info)

        return inner(environ, counting_start)  # type: ignore[no-any-return]  # the WSGI app's iterable

    return app


wsgi_app = _wsgi()
