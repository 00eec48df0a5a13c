"""Load generator for the service's concurrency leases on 127.0.0.1 (bounded count and time).

For each store (memory; a private ``redis-server``) it starts ``ratekeeper serve`` as a real
process with one concurrency policy, then ``--clients`` keep-alive HTTP clients loop on one
shared key: ``POST /v1/concurrency/acquire``, and when granted, ``.../release``. It prints
acquire+release pairs per second, p50/p99 of one acquire, how many acquires were refused
(429), and the most leases the clients held at once (must never exceed ``--capacity``).
Figures are noisy on a shared machine; compare rows of one run, not runs.

    python -m benchmarks.bench_leases --clients 32 --capacity 8 --requests 20000 --seconds 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_service import Redis, Server

POLICY = "policies:\n  slots:\n    kind: concurrency\n    capacity: {capacity}\n"


async def post(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str, body: object
) -> tuple[int, Any]:
    """One keep-alive HTTP/1.1 POST (raw streams: an HTTP client library costs more than the
    service here)."""
    raw = json.dumps(body).encode()
    writer.write(
        f"POST {path} HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
        f"content-length: {len(raw)}\r\n\r\n".encode()
        + raw
    )
    head = await reader.readuntil(b"\r\n\r\n")
    m = re.search(rb"content-length: (\d+)", head, re.I)
    assert m is not None, head
    return int(head[9:12]), json.loads(await reader.readexactly(int(m.group(1))))


def pct(seconds: list[float], p: float) -> float:
    """The ``p`` quantile of latencies in seconds, in milliseconds."""
    ordered = sorted(seconds)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))] * 1000 if ordered else math.nan


async def run(port: int, clients: int, requests: int, seconds: float) -> dict[str, float]:
    """Drive the service; return counts, latencies (ms) and the peak of leases held."""
    held = peak = done = refused = degraded = 0
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    body = {"policy": "slots", "key": "shared"}

    async def loop() -> None:
        nonlocal held, peak, done, refused, degraded
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while done < requests and time.perf_counter() < deadline:
            done += 1
            start = time.perf_counter()
            status, answer = await post(reader, writer, "/v1/concurrency/acquire", body)
            latencies.append(time.perf_counter() - start)
            if status == 429:
                refused += 1
                continue
            if status != 200:
                raise SystemExit(f"unexpected answer {status}: {answer}")
            if answer["degraded"]:  # granted without the store (fail open): not counted
                degraded += 1
                continue
            held += 1
            peak = max(peak, held)
            await asyncio.sleep(0)  # hold the lease while other clients run
            held -= 1  # before the release is sent: the store may free it any moment now
            await post(reader, writer, "/v1/concurrency/release", {"lease": answer["lease"]})
        writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(clients)))
    elapsed = time.perf_counter() - start
    return {
        "acquires": len(latencies),
        "granted": len(latencies) - refused - degraded,
        "elapsed": elapsed,
        "p50": pct(latencies, 0.5),
        "p99": pct(latencies, 0.99),
        "refused": refused,
        "degraded": degraded,
        "peak": peak,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--capacity", type=int, default=8)
    parser.add_argument("--requests", type=int, default=20_000, help="acquires per store")
    parser.add_argument("--seconds", type=float, default=5.0, help="time limit per store")
    args = parser.parse_args()
    policy = POLICY.format(capacity=args.capacity)
    work = Path(tempfile.mkdtemp(prefix="rk-leases-"))
    redis_server = Redis(work)
    serve = [sys.executable, "-m", "ratekeeper.cli", "serve", "--port", "0", "--grpc-port", "0"]
    try:
        for name, config in (
            ("memory", "store: memory\n" + policy),
            ("redis", f"store:\n  url: {redis_server.url}\n  socket_timeout: 1\n" + policy),
        ):
            (work / f"{name}.yaml").write_text(config)
            service = Server(name, [*serve, "--config", f"{name}.yaml"], work)
            try:
                r = asyncio.run(run(service.port, args.clients, args.requests, args.seconds))
            finally:
                service.stop()
            print(
                f"{name:<8} {r['granted'] / r['elapsed']:>8,.0f} pairs/s  acquire p50 "
                f"{r['p50']:6.2f} ms  p99 {r['p99']:6.2f} ms  acquires={r['acquires']:.0f} "
                f"refused={r['refused']:.0f} degraded={r['degraded']:.0f}  "
                f"peak held={r['peak']:.0f} (capacity {args.capacity})",
                flush=True,
            )
            if r["peak"] > args.capacity:
                raise SystemExit(f"{name}: {r['peak']:.0f} leases held at once > capacity")
    finally:
        redis_server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
