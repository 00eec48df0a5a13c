"""Envoy's two global rate-limit paths through real Envoys, in one run on 127.0.0.1: the
classic one (the ``ratelimit`` filter calls ``ShouldRateLimit`` for every request) and the
Rate Limit Quota Service (the ``rate_limit_quota`` filter enforces a token bucket itself and
reports each bucket's usage every 5 s), both served by ``ratekeeper serve`` (memory store).

1. Ceilings (closed loop): ``h2load`` over HTTP/2 (``--clients`` streams on 4 connections)
   through one Envoy (``--concurrency 1``) whose limit admits 100 requests a second; the
   rest are answered 429. Classic: the service decides every request; RLQS: Envoy decides.
   Per path: requests/s through Envoy, the service's RPCs/s (decisions; for RLQS, report
   messages and bucket reports) and its CPU.
2. Independence of the request rate: RLQS at fixed rates (open loop), from a tenth of the
   classic path's ceiling to ``--times`` (default 10) times it: the service's RPCs/s must
   not move.
3. Scale: ``--envoys`` real Envoys, each sending ``--buckets`` buckets (the request path is
   the bucket: ``h2load -i``), and simulated Envoys (protocol clients, reporting every
   bucket every 5 s as Envoy 1.40 does) in the hundreds: RPCs/s against Envoys x buckets / 5.

    flock /tmp/rk-bench.lock python -m benchmarks.bench_rlqs

The machine's load average is printed before and after: on a shared machine compare the
figures of one run.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx

from benchmarks.bench_service import Server
from tests.service.envoy_proxy import EnvoyProxy, Listener
from tests.service.rlqs.client import QuotaClient
from tests.service.rlqs.envoys import QuotaEnvoy

CONFIG = """\
policies:
  quota: {rate: 100/second}
  path: {rate: 5/second}
domains:
  - domain: bench
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 100}
rlqs:
  max_buckets: 100000
  buckets:
    - domain: edge
      bucket: {name: tenant, tenant: "*"}
      policy: quota
    - domain: edge
      bucket: {name: tenant, tenant: "/b*"}
      policy: path
"""
"""One bucket of 100/s per tenant header; a bucket of 5/s per request path (section 3: the
upstream sees at most 5/s per bucket)."""
REPORT_SECONDS = 5


@dataclass
class Run:
    """One load's outcome: requests/s through Envoy, the service's counts and CPU."""

    rps: float
    decisions: float
    reports: float
    bucket_reports: float
    cpu: float
    """Service CPU seconds per second."""


def counters(server: Server) -> dict[str, float]:
    text = httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=10).text
    out = {"decisions": 0.0, "reports": 0.0, "bucket_reports": 0.0}
    for line in text.splitlines():
        if line.startswith("ratekeeper_decisions_total{"):
            out["decisions"] += float(line.rsplit(" ", 1)[1])
        elif line.startswith("ratekeeper_rlqs_reports_total "):
            out["reports"] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("ratekeeper_rlqs_bucket_reports_total "):
            out["bucket_reports"] = float(line.rsplit(" ", 1)[1])
    return out


def h2load(port: int, seconds: float, clients: int, header: str | None,
           rps: float | None = None, paths: Path | None = None) -> float:  # fmt: skip
    """Requests/s h2load completed through an Envoy over HTTP/2 (h2c; any status: 429s are
    answers too): closed loop on ``clients`` streams (4 connections), or ``rps`` in all
    (open loop, 8 connections)."""
    exe = shutil.which("h2load")
    if exe is None:
        raise SystemExit("h2load is not installed (Debian: apt-get install nghttp2-client)")
    args = [exe, "-t", "1"]
    if header:
        args += ["-H", header]
    if rps:
        conns = 8
        args += ["-c", str(conns), "-m", str(2 + math.ceil(rps / conns / 100)),
                 "-n", str(round(rps * seconds)), "-r", "1", "--rate-period", "1ms",
                 f"--rps={rps / conns:.3f}"]  # fmt: skip
    else:
        args += ["-c", "4", "-m", str(max(1, clients // 4)), "-D", str(max(1, round(seconds)))]
    args += ["-i", str(paths)] if paths else [f"http://127.0.0.1:{port}/"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=600).stdout
    done = re.search(r"requests: \d+ total, \d+ started, (\d+) done", out)
    took = re.search(r"finished in ([\d.]+)s", out)
    if done is None or took is None:
        raise SystemExit(f"h2load failed:\n{out}")
    return int(done.group(1)) / float(took.group(1))


def measure(server: Server, load: Callable[[], float], seconds: float) -> Run:
    """Run ``load`` and count what the service did meanwhile, per second of it."""
    before, cpu0, t0 = counters(server), server.cpu(), time.monotonic()
    rps = load()
    elapsed = time.monotonic() - t0
    after = counters(server)
    per = {k: (after[k] - before[k]) / elapsed for k in after}
    return Run(rps, per["decisions"], per["reports"], per["bucket_reports"],
               (server.cpu() - cpu0) / elapsed)  # fmt: skip


def simulated(server: Server, envoys: int, buckets: int, seconds: float) -> Run:
    """``envoys`` protocol clients, each reporting ``buckets`` buckets every 5 s (their
    ticks spread over the period), for ``seconds``."""
    assert server.grpc_port is not None
    stop = threading.Event()
    clients = [QuotaClient(server.grpc_port) for _ in range(envoys)]

    def drain() -> None:
        while not stop.is_set():
            for c in clients:
                while not c.responses.empty():
                    c.responses.get_nowait()
            time.sleep(0.2)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    before = counters(server)["reports"]
    for i, c in enumerate(clients):  # each bucket's first report, alone, as Envoy sends it
        for b in range(buckets):
            c.send("edge", ({"name": "tenant", "tenant": f"e{i}b{b}"}, 0, 1, 0))
    deadline = time.monotonic() + 120
    while counters(server)["reports"] < before + envoys * buckets:  # all answered first
        if time.monotonic() > deadline:
            raise SystemExit("the service did not answer every first report in 2 minutes")
        time.sleep(0.5)
    time.sleep(1.5)  # more than hub.MIN_STEP_MS since the last first report

    def load() -> float:
        start = time.monotonic()
        periods = max(1, round(seconds / REPORT_SECONDS))
        for tick in range(periods):
            for i, c in enumerate(clients):  # client i reports at i/envoys of each period
                due = start + REPORT_SECONDS * (tick + i / envoys)
                time.sleep(max(0.0, due - time.monotonic()))
                usages = [({"name": "tenant", "tenant": f"e{i}b{b}"}, 5, 100, 400)
                          for b in range(buckets)]  # fmt: skip
                c.send("edge", *usages)
        time.sleep(max(0.0, start + REPORT_SECONDS * periods - time.monotonic()))
        return 0.0

    try:
        return measure(server, load, seconds)
    finally:
        stop.set()
        for c in clients:
            c.close()


def paced(fleet: list[QuotaEnvoy], buckets: int, work: Path, seconds: float,
          clients: int) -> float:  # fmt: skip
    """Closed-loop load on every Envoy of ``fleet`` at once, its requests spread over
    ``buckets`` paths (one bucket each); requests/s through all of them."""
    rates: list[float] = []

    def one(envoy: QuotaEnvoy) -> None:
        file = work / f"paths{envoy.port}.txt"
        file.write_text("".join(f"http://127.0.0.1:{envoy.port}/b{b}\n" for b in range(buckets)))
        rates.append(h2load(envoy.port, seconds, max(4, clients // len(fleet)), None, paths=file))

    threads = [threading.Thread(target=one, args=(e,)) for e in fleet]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(rates)


def warm(ports: list[int], headers: list[str | None], work: Path, buckets: int = 0) -> None:
    """A second of load on each bucket, then a report period and a second: the buckets'
    first reports (one message each) fall before what is measured next."""
    for port in ports:
        for header in headers:
            if buckets:
                file = work / f"paths{port}.txt"
                file.write_text("".join(f"http://127.0.0.1:{port}/b{b}\n" for b in range(buckets)))
                h2load(port, 1, 4, None, paths=file)
            else:
                h2load(port, 1, 4, header)
    time.sleep(REPORT_SECONDS + 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--times", type=float, default=10.0)
    parser.add_argument("--envoys", type=int, default=2)
    parser.add_argument("--buckets", type=int, default=20)
    parser.add_argument("--simulated", type=int, nargs="*", default=[100, 500])
    args = parser.parse_args()
    print("load average before:", os.getloadavg())
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "rk.yaml").write_text(CONFIG)
        server = Server("memory", [sys.executable, "-m", "ratekeeper.cli", "serve", "--port",
                                   "0", "--grpc-port", "0", "--config", str(work / "rk.yaml")],
                        work)  # fmt: skip
        made: list[QuotaEnvoy | EnvoyProxy] = []
        try:
            report(server, work, made, args)
        finally:
            for envoy in made:
                envoy.stop()
            server.stop()
    print("load average after:", os.getloadavg())


def report(server: Server, work: Path, made: list[QuotaEnvoy | EnvoyProxy],
           args: argparse.Namespace) -> None:  # fmt: skip
    seconds, clients = args.seconds, args.clients
    assert server.grpc_port is not None
    classic = EnvoyProxy([Listener("bench")], server.grpc_port, work)
    made.append(classic)
    quota = QuotaEnvoy(server.grpc_port, work, "quota")
    made.append(quota)
    warm([quota.port], ["x-tenant:t1", "x-tenant:t2"], work)
    rows: list[tuple[str, Run]] = []
    port = classic.ports[0]
    rows.append(
        (
            "classic, closed loop",
            measure(server, lambda: h2load(port, seconds, clients, "x-user:u1"), seconds),
        )
    )
    rows.append(
        (
            "RLQS, closed loop",
            measure(server, lambda: h2load(quota.port, seconds, clients, "x-tenant:t1"), seconds),
        )
    )
    ceiling = rows[0][1].rps
    for factor in (0.1, 1.0, args.times):
        rate = ceiling * factor
        fixed = partial(h2load, quota.port, seconds, clients, "x-tenant:t2", rate)
        rows.append((f"RLQS at {factor:g}x classic ({rate:,.0f}/s asked)",
                     measure(server, fixed, seconds)))  # fmt: skip
    print(f"\n1-2. one Envoy, {clients} streams, {seconds:g} s each (limit 100/s, the rest 429)\n")
    print(
        "| path | requests/s through Envoy | service RPCs/s | report messages/s | "
        "bucket reports/s | service CPU |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, run in rows:
        rpcs = run.decisions if name.startswith("classic") else run.reports
        print(
            f"| {name} | {run.rps:,.0f} | {rpcs:,.1f} | {run.reports:,.2f} | "
            f"{run.bucket_reports:,.2f} | {100 * run.cpu:.0f} % |"
        )
    best = max(run.rps for name, run in rows if name.startswith("RLQS"))
    print(f"\nRLQS requests/s through Envoy: {best / ceiling:.1f}x the classic path's ceiling")
    for envoy in made:  # section 3 counts only its own fleet's reports
        envoy.stop()
    made.clear()

    scale: list[tuple[str, float, Run]] = []
    window = max(30.0, seconds)  # reports are 5 s apart: long windows count them well
    for count in sorted({1, args.envoys}):
        for buckets in sorted({1, args.buckets}):
            fleet = [QuotaEnvoy(server.grpc_port, work, f"s{count}x{buckets}_{i}", header=":path")
                     for i in range(count)]  # fmt: skip
            made.extend(fleet)
            warm([e.port for e in fleet], [None], work, buckets)
            run = measure(server, partial(paced, fleet, buckets, work, window, clients), window)
            for envoy in fleet:
                envoy.stop()
                made.remove(envoy)
            scale.append((f"{count} Envoy(s) x {buckets} bucket(s)", count * buckets / 5, run))
    for n in args.simulated:
        for buckets in (1, 10):
            run = simulated(server, n, buckets, window)
            scale.append((f"{n} simulated Envoys x {buckets} bucket(s)", n * buckets / 5, run))
    print(
        "\n3. Envoys x buckets (real Envoys under closed-loop load; simulated Envoys: "
        "protocol clients)\n"
    )
    print(
        "| fleet | Envoys x buckets / 5 s | bucket reports/s | report messages/s | "
        "requests/s through Envoy | service CPU |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, expected, run in scale:
        print(
            f"| {name} | {expected:,.1f} | {run.bucket_reports:,.1f} | {run.reports:,.2f} | "
            f"{run.rps:,.0f} | {100 * run.cpu:.1f} % |"
        )


if __name__ == "__main__":
    main()
