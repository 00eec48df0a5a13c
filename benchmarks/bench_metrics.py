"""Cost of metrics per decision: the same calls with ``metrics=`` off and on, in one run.

Variants (memory store, 1,000 keys, a rate no call reaches, so every decision is allowed):

- ``Limiter.hit``: without metrics; with ``Metrics()``; with ``Metrics()`` exported through
  both the Prometheus and the OpenTelemetry adapters (nothing of theirs runs per decision);
- the WSGI middleware, one ``RateCheck``, a plain WSGI call per request: without and with
  ``metrics=`` (decisions by check name, requests in flight, breakers watched).

Run::

    .venv/bin/python -m benchmarks.bench_metrics [--calls 200000] [--rounds 7]

Prints microseconds per decision (process CPU time, median of rounds, so other programs on a
shared machine count less) and the overhead of metrics in microseconds and as a ratio.
"""

from __future__ import annotations

import argparse
import io
import statistics
import time
from collections.abc import Callable
from typing import Any

from ratekeeper import Limiter, ManualClock
from ratekeeper.metrics import Metrics
from ratekeeper.middleware import RateCheck, WSGIRateLimitMiddleware, keys

RATE = "1000000000/hour"


def limiter_run(metrics: Metrics | None) -> Callable[[list[str]], None]:
    limiter = Limiter(clock=ManualClock(), metrics=metrics)
    hit = limiter.hit

    def run(ks: list[str]) -> None:
        for k in ks:
            hit(k, RATE)

    run.limiter = limiter  # type: ignore[attr-defined]  # keep it alive (its breakers are watched)
    return run


def exported() -> Metrics:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from prometheus_client import CollectorRegistry

    from ratekeeper.metrics.otel import instrument
    from ratekeeper.metrics.prometheus import register

    m = Metrics()
    register(m, CollectorRegistry())
    instrument(m, MeterProvider(metric_readers=[InMemoryMetricReader()]))
    return m


def middleware_run(metrics: Metrics | None) -> Callable[[list[str]], None]:
    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        start_response("200 OK", [])
        return [b"ok"]

    check = RateCheck("api", RATE, key=keys.header("x-user"))
    mw = WSGIRateLimitMiddleware(app, [check], clock=ManualClock(), metrics=metrics)

    def start_response(status: str, headers: list[tuple[str, str]], *exc: Any) -> None:
        return None

    def run(ks: list[str]) -> None:
        for k in ks:
            environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/", "HTTP_X_USER": k,
                       "REMOTE_ADDR": "127.0.0.1", "wsgi.input": io.BytesIO()}  # fmt: skip
            result = mw(environ, start_response)
            result.close()  # type: ignore[attr-defined]  # the middleware's wrapper has close

    return run


def per_call(run: Callable[[list[str]], None], ks: list[str], rounds: int) -> float:
    run(ks[:1000])  # warm the policy cache
    samples = []
    for _ in range(rounds):
        start = time.process_time()
        run(ks)
        samples.append((time.process_time() - start) / len(ks) * 1e6)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    ks = [f"user:{i % 1000}" for i in range(args.calls)]
    groups = [
        ("Limiter.hit", [("off", limiter_run(None)), ("Metrics()", limiter_run(Metrics())),
                         ("Metrics() + Prometheus + OTel", limiter_run(exported()))]),
        ("WSGI middleware", [("off", middleware_run(None)),
                             ("Metrics()", middleware_run(Metrics()))]),
    ]  # fmt: skip
    middleware_calls = ks[: max(1000, args.calls // 4)]
    for title, variants in groups:
        print(f"\n{title} (µs per decision, process CPU, median of {args.rounds})")
        calls = middleware_calls if title.startswith("WSGI") else ks
        base = None
        for name, run in variants:
            us = per_call(run, calls, args.rounds)
            if base is None:
                base = us
                print(f"  {name:34s} {us:7.3f}")
            else:
                print(f"  {name:34s} {us:7.3f}   +{us - base:5.3f} µs  ({us / base:4.2f}x off)")


if __name__ == "__main__":
    main()
