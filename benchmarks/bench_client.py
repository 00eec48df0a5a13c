"""Clients sharing one key of a real ``ratekeeper serve``: who gets the rate, who gets 429s.

The service (memory store, 127.0.0.1, ``over_limit_status: 429``) limits one key to
``--rate`` R requests a second, once per algorithm (fixed_window, token_bucket, gcra). For
each algorithm and client, ``--processes`` (8) processes of ``--callers`` (4) threads each
send ``POST /v1/hit`` for that one key as fast as their client lets them, for ``--seconds``
(10), all starting at one instant. The clients, one at a time on a fresh key, in an order
rotated per algorithm:

- ``ratekeeper``: httpx with ``ratekeeper.client``'s ``PacedTransport``, the pace shared
  through a private ``redis-server`` (``Pacer(shared=RedisStore(...))``), each request with
  an ``Idempotency-Key`` (so a 429 may be retried);
- ``ratekeeper local``: the same without ``shared`` (each process paces alone);
- ``urllib3 Retry``: requests with ``HTTPAdapter(max_retries=Retry(total=3,
  status_forcelist=[429], allowed_methods=None, respect_retry_after_header=True,
  backoff_factor=0.1))``;
- ``httpx-retries``: httpx with ``RetryTransport(retry=Retry(total=3, status_forcelist=[429],
  allowed_methods=["POST"], backoff_factor=0.1))``;
- ``botocore adaptive``: httpx behind botocore's ``ClientRateLimiter`` (``retries/adaptive.py``:
  CUBIC over a token bucket, one per process as in an SDK client) with botocore's standard
  backoff (``random * 2**attempt``, at most 20 s, 3 attempts). A 429 is its throttling
  signal (botocore's ``ThrottlingStatusCodeChecker`` reads the same status; without an AWS
  operation model the event plumbing is replaced by a one-line detector).

Per row: ``rate ratio`` (answers 200 within the run divided by R times the seconds), the 429s every
process received (retries included), the most 429s one process received after the first
window (the first second), and the p50/p99 of a caller's wait: from starting a request to
its final answer (pacing, retries and the round trip).

    flock /tmp/rk-bench.lock .venv/bin/python -m benchmarks.bench_client --rate 100 --seconds 10

Loopback only; every process it starts it stops by PID, and every run is bounded in time.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ALGORITHMS = ("fixed_window", "token_bucket", "gcra")
PEERS = ("ratekeeper", "ratekeeper local", "urllib3 Retry", "httpx-retries", "botocore adaptive")
CONFIG = """\
store: memory
limits:
  over_limit_status: 429
policies:
"""


class Tally:
    """One process's record: wire statuses with times, and each request's wait."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.wire: list[tuple[float, int]] = []
        self.waits: list[float] = []
        self.ok_times: list[float] = []

    def saw(self, status: int) -> None:
        with self.lock:
            self.wire.append((time.time(), status))

    def done(self, began: float, status: int) -> None:
        now = time.time()
        with self.lock:
            if status == 200:
                self.ok_times.append(now)
                self.waits.append(now - began)


# --- the clients, one request each -------------------------------------------------------------


def _counting_httpx(tally: Tally, callers: int) -> Any:
    import httpx

    class Counting(httpx.BaseTransport):
        def __init__(self) -> None:
            limits = httpx.Limits(max_connections=callers, max_keepalive_connections=callers)
            self.inner = httpx.HTTPTransport(limits=limits)

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            response = self.inner.handle_request(request)
            tally.saw(response.status_code)
            return response

    return Counting()


def client_for(peer: str, tally: Tally, callers: int, redis_url: str, url: str) -> Any:
    """A function(body) -> final status, made for ``peer``."""
    if peer.startswith("ratekeeper"):
        import httpx

        from ratekeeper import RedisStore
        from ratekeeper.client import Pacer
        from ratekeeper.client.httpx import PacedTransport

        shared = RedisStore(redis_url) if peer == "ratekeeper" else None
        pacer = Pacer(shared=shared, max_wait=10.0)
        client = httpx.Client(transport=PacedTransport(pacer, _counting_httpx(tally, callers)))

        def send_rk(body: dict[str, str]) -> int:
            headers = {"Idempotency-Key": uuid.uuid4().hex}
            return client.post(url, json=body, headers=headers).status_code

        return send_rk
    if peer == "urllib3 Retry":
        import requests
        from requests.adapters import HTTPAdapter
        from urllib3.util.retry import Retry

        session = requests.Session()
        retry = Retry(total=3, status_forcelist=[429], allowed_methods=None,
                      respect_retry_after_header=True, backoff_factor=0.1,
                      raise_on_status=False)  # fmt: skip
        adapter = HTTPAdapter(max_retries=retry, pool_maxsize=callers)
        session.mount("http://", adapter)

        def send_urllib3(body: dict[str, str]) -> int:
            response = session.post(url, json=body)
            history = response.raw.retries.history if response.raw.retries else ()
            for attempt in history:
                tally.saw(attempt.status or 0)
            tally.saw(response.status_code)
            return response.status_code

        return send_urllib3
    if peer == "httpx-retries":
        import httpx
        from httpx_retries import Retry as HttpxRetry
        from httpx_retries import RetryTransport

        hretry = HttpxRetry(total=3, status_forcelist=[429], allowed_methods=["POST"],
                            backoff_factor=0.1)  # fmt: skip
        client = httpx.Client(transport=RetryTransport(_counting_httpx(tally, callers), hretry))

        def send_hr(body: dict[str, str]) -> int:
            return client.post(url, json=body).status_code

        return send_hr
    if peer == "botocore adaptive":
        import httpx
        from botocore.retries import adaptive, bucket, throttling

        class Detector:  # the needs-retry event's plumbing, for a plain HTTP call
            def is_throttling_error(self, **kwargs: Any) -> bool:
                return bool(kwargs["status"] == 429)

        clock = bucket.Clock()
        limiter = adaptive.ClientRateLimiter(
            rate_adjustor=throttling.CubicCalculator(
                starting_max_rate=0, start_time=clock.current_time()
            ),
            rate_clocker=adaptive.RateClocker(clock),
            token_bucket=bucket.TokenBucket(max_rate=1, clock=clock),
            throttling_detector=Detector(),
            clock=clock,
        )
        client = httpx.Client(transport=_counting_httpx(tally, callers))

        def send_boto(body: dict[str, str]) -> int:
            for attempt in range(1, 4):
                limiter.on_sending_request(request=None)
                status = client.post(url, json=body).status_code
                limiter.on_receiving_response(status=status)
                if status != 429 or attempt == 3:
                    return status
                time.sleep(random.random() * min(20, 2**attempt))
            return status

        return send_boto
    raise SystemExit(f"unknown client {peer!r}")


def worker(args: argparse.Namespace) -> None:
    """One process of one trial: ``--callers`` threads until the end; its tally as JSON."""
    tally = Tally()
    send = client_for(args.peer, tally, args.callers, args.redis, args.url + "/v1/hit")
    body = {"policy": f"bench.{args.algorithm}", "key": args.key}
    print("ready", flush=True)  # imports done: the parent sends the common start time
    start = float(sys.stdin.readline())
    end = start + args.seconds

    def caller() -> None:
        time.sleep(max(0.0, start - time.time()))
        while time.time() < end:
            began = time.time()
            try:
                status = send(body)
            except Exception as exc:  # a wait past max_wait, a connection error: counted
                status = -1
                print(f"{args.peer}: {exc!r}", file=sys.stderr)
            tally.done(began, status)

    threads = [threading.Thread(target=caller) for _ in range(args.callers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=args.seconds + 60)
    first_window_end = start + 1.0
    print(json.dumps({
        "ok": sum(1 for t in tally.ok_times if t <= end),
        "refused": sum(1 for _, s in tally.wire if s == 429),
        "refused_later": sum(1 for t, s in tally.wire if s == 429 and t > first_window_end),
        "waits": [w for w, t in zip(tally.waits, tally.ok_times, strict=True) if t <= end],
    }))  # fmt: skip


# --- the run ------------------------------------------------------------------------------------


def trial(
    peer: str, algorithm: str, url: str, redis_url: str, opts: argparse.Namespace
) -> dict[str, float]:
    key = f"{peer.replace(' ', '-')}-{algorithm}-{uuid.uuid4().hex[:8]}"
    command = [sys.executable, "-m", "benchmarks.bench_client", "--worker", "--peer", peer,
               "--algorithm", algorithm, "--url", url, "--redis", redis_url, "--key", key,
               "--seconds", str(opts.seconds),
               "--callers", str(opts.callers)]  # fmt: skip
    procs = [
        subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(opts.processes)
    ]
    for proc in procs:  # every process has imported its client and made it
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != "ready":
            raise SystemExit(f"{peer} worker failed to start: {proc.communicate()[1][-2000:]}")
    start = time.time() + 0.5
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(f"{start!r}\n")
        proc.stdin.flush()
    results = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=opts.seconds + 90)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        if proc.returncode != 0 or not out.strip():
            raise SystemExit(f"{peer} worker failed: {err[-2000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    waits = sorted(w for r in results for w in r["waits"])
    return {
        "ratio": sum(r["ok"] for r in results) / (opts.rate * opts.seconds),
        "refused": sum(r["refused"] for r in results),
        "later_max": max(r["refused_later"] for r in results),
        "p50": statistics.median(waits) if waits else math.nan,
        "p99": waits[min(len(waits) - 1, int(len(waits) * 0.99))] if waits else math.nan,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=100, help="R: requests a second of the key")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--callers", type=int, default=4)
    parser.add_argument("--peers", default=",".join(PEERS))
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS))
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for name in ("--peer", "--algorithm", "--url", "--redis", "--key"):
        parser.add_argument(name, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.worker:
        worker(opts)
        return
    from tests.redis_servers import RedisServer
    from tests.service.proc import ServiceProcess

    peers = opts.peers.split(",")
    algorithms = opts.algorithms.split(",")
    config = CONFIG + "".join(
        f"  bench.{a}:\n    rate: {opts.rate}/second\n    algorithm: {a}\n" for a in ALGORITHMS
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.yaml"
        path.write_text(config)
        redis = RedisServer()
        service = ServiceProcess(path, grpc=False)
        try:
            print(f"ratekeeper serve on {service.url}, one key at {opts.rate}/second; "
                  f"{opts.processes} processes x {opts.callers} callers, {opts.seconds:g} s "
                  f"each; {os.cpu_count()} CPUs")  # fmt: skip
            rows: list[tuple[str, str, dict[str, float]]] = []
            for i, algorithm in enumerate(algorithms):
                order = peers[i % len(peers) :] + peers[: i % len(peers)]
                for peer in order:
                    rows.append((algorithm, peer, trial(peer, algorithm, service.url,
                                                        redis.url, opts)))  # fmt: skip
                    time.sleep(1.5)  # the key's window ends before the next client starts
        finally:
            service.stop()
            redis.stop()
    print()
    print("| algorithm | client | throughput ÷ R | 429s | most 429s of one process after "
          "the first second | p50 wait | p99 wait |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|")
    for algorithm, peer in ((a, p) for a in algorithms for p in peers):
        r = next(row for a, p, row in rows if a == algorithm and p == peer)
        print(
            f"| {algorithm} | {peer} | {r['ratio']:.3f} | {r['refused']:.0f} | "
            f"{r['later_max']:.0f} | {r['p50'] * 1000:.0f} ms | {r['p99'] * 1000:.0f} ms |"
        )


if __name__ == "__main__":
    main()
