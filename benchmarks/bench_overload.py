"""Load shedding under real overload: critical latency, goodput and the controllers over time.

The apps of ``benchmarks/overload_app.py`` — FastAPI under uvicorn (uvloop, httptools) and its
Flask twin under gunicorn (one gthread worker, 8 threads) — each served by one process pinned
to one CPU with ``taskset``; ``wrk`` (pinned to the other CPU with this script) sends ``GET /low``
(3 ms of CPU) at a fixed rate, a multiple of the capacity measured at the start of the run,
while a probe sends ``POST /charges`` (critical, 1 ms) every 50 ms. Each scenario::

    warm-up   3 s at 0.5x capacity
    overload 20 s at 1.5x or 3x capacity
    recovery 12 s at 0.5x capacity

for each shedding mode: ``none`` (no middleware), ``worker`` (``WorkerCheck()``: the server
type's default signal, Stripe's controller with ``ShedderSettings.fast()``) and ``adaptive``
(``AdmissionCheck()``: gradient limit and CoDel queue). ``--sweep`` adds
``AdmissionCheck(limit=N)`` for fixed N at 3x. Steady state is reached at the first second
from which the low tier's shed share stays within 0.1 of its median over the overload's second
half and the critical median latency per second within 3x of its own; figures are computed
from there to the end of the overload (a run that never settles is reported over the second
half, marked "not settled"). Prints a markdown report and
writes SVG figures (``--out``, default ``docs/figures``).

Install and run (Debian; ~10 minutes, ~15 with ``--sweep``)::

    apt-get install wrk
    .venv/bin/pip install -e ".[bench]"
    .venv/bin/python -m benchmarks.bench_overload [--apps asgi,wsgi] [--loads 1.5,3] [--sweep]

``wrk`` paces requests with a Lua ``delay()`` reading CLOCK_MONOTONIC through LuaJIT's FFI
(128 connections; a connection sends as soon as its slot comes, or at once when late, so the
offered rate holds while the server keeps up and falls to what 128 connections get otherwise).
Everything runs on loopback and stops by itself; the servers are stopped by PID.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.overload_report import Run, cpu_share, replot, summarize, table, write_figures

ROOT = Path(__file__).resolve().parent.parent
SERVER_CPU, CLIENT_CPU = 1, 0
THREADS = int(os.environ.get("RK_THREADS", "8"))
CONNECTIONS = 128
PROBE_EVERY = 0.05
PROBE_TIMEOUT = 5.0

WRK_SCRIPT = """\
-- paced GET /low: a schedule of slots RK_INTERVAL_MS apart, shared by this thread's connections
local ffi = require("ffi")
ffi.cdef[[
typedef struct { long tv_sec; long tv_nsec; } rk_timespec;
int clock_gettime(int clk_id, rk_timespec *tp);
]]
local ts = ffi.new("rk_timespec")
local function now_ms()
  ffi.C.clock_gettime(1, ts)  -- CLOCK_MONOTONIC
  return tonumber(ts.tv_sec) * 1000 + tonumber(ts.tv_nsec) / 1e6
end
local interval = tonumber(os.getenv("RK_INTERVAL_MS"))
local next_slot = nil
function delay()
  local now = now_ms()
  if next_slot == nil or next_slot < now - 1000 then next_slot = now end  -- at most 1 s behind
  next_slot = next_slot + interval
  local d = next_slot - now
  if d < 0 then return 0 end
  return d
end
"""


NICE = 0


def pinned(cpu: int, argv: list[str]) -> list[str]:
    """``argv`` under ``taskset -c cpu`` where taskset exists (Linux), at niceness ``NICE``."""
    if NICE:
        argv = ["nice", "-n", str(NICE), *argv]
    return ["taskset", "-c", str(cpu), *argv] if shutil.which("taskset") else argv


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """One server process (uvicorn or gunicorn) for one shedding mode, pinned to SERVER_CPU."""

    def __init__(self, app: str, mode: str) -> None:
        self.app, self.mode, self.port = app, mode, free_port()
        py = sys.executable
        if app == "asgi":
            argv = [py, "-m", "uvicorn", "benchmarks.overload_app:asgi_app", "--host",
                    "127.0.0.1", "--port", str(self.port), "--loop", "uvloop", "--http",
                    "httptools", "--no-access-log", "--log-level", "warning", "--backlog", "4096",
                    "--timeout-keep-alive", "60"]  # fmt: skip
        else:
            argv = [py, "-m", "gunicorn", "-k", "gthread", "--threads", str(THREADS), "-w", "1",
                    "-b", f"127.0.0.1:{self.port}", "--backlog", "4096", "--keep-alive", "60",
                    "--graceful-timeout", "3", "--log-level", "warning",
                    "benchmarks.overload_app:wsgi_app"]  # fmt: skip
        env = {**os.environ, "RK_SHED": mode, "RK_THREADS": str(THREADS), "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen(pinned(SERVER_CPU, argv), cwd=ROOT, env=env)
        deadline = time.monotonic() + 30
        while True:
            try:
                self.series()
                return
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"{app} server ({mode}) did not start") from None
                time.sleep(0.1)

    def series(self) -> list[dict[str, Any]]:
        url = f"http://127.0.0.1:{self.port}/__bench/series"
        with urllib.request.urlopen(url, timeout=10) as reply:
            rows: list[dict[str, Any]] = json.loads(reply.read())
            return rows

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def wrk(port: int, seconds: int, rate: float | None, script: Path, conns: int) -> dict[str, float]:
    """``GET /low`` from wrk (one thread) at ``rate`` per second (None: as fast as it can)."""
    argv = ["wrk", "-t1", f"-c{conns}", f"-d{seconds}s", "--timeout", "5s"]
    env = dict(os.environ)
    if rate is not None:
        argv += ["-s", str(script)]
        env["RK_INTERVAL_MS"] = repr(1000.0 / rate)
    argv.append(f"http://127.0.0.1:{port}/low")
    out = subprocess.run(pinned(CLIENT_CPU, argv), capture_output=True, text=True, env=env)
    text = out.stdout
    total = re.search(r"(\d+) requests in", text)
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    rps = re.search(r"Requests/sec:\s+([\d.]+)", text)
    if total is None or rps is None:
        raise RuntimeError(f"wrk failed: {out.stderr or text}")
    return {
        "requests": float(total.group(1)),
        "non_2xx": float(bad.group(1)) if bad else 0.0,
        "rps": float(rps.group(1)),
    }


REQUEST = b"POST /charges HTTP/1.1\r\nHost: bench\r\nContent-Length: 0\r\n\r\n"


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    await reader.readexactly(length)
    return status


async def _probe(port: int, until: float, samples: list[tuple[float, float, int]]) -> None:
    """``POST /charges`` every PROBE_EVERY seconds on its own schedule (not after the previous
    answer), over a pool of keep-alive connections; (sent at, latency, status; 0 = timeout)."""
    idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    for _ in range(4):
        idle.append(await asyncio.open_connection("127.0.0.1", port))

    async def one() -> None:
        start = time.monotonic()
        conn = None
        try:
            async with asyncio.timeout(PROBE_TIMEOUT):
                conn = idle.pop() if idle else await asyncio.open_connection("127.0.0.1", port)
                conn[1].write(REQUEST)
                status = await _read_response(conn[0])
            samples.append((start, time.monotonic() - start, status))
            idle.append(conn)
        except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError):
            samples.append((start, PROBE_TIMEOUT, 0))
            if conn is not None:
                conn[1].close()

    tasks = []
    slot = time.monotonic()
    while slot < until:
        await asyncio.sleep(max(0.0, slot - time.monotonic()))
        tasks.append(asyncio.create_task(one()))
        slot += PROBE_EVERY
    await asyncio.gather(*tasks)
    for _, writer in idle:
        writer.close()


def run_scenario(
    app: str, mode: str, load: float, capacity: float, script: Path, phases: tuple[int, int, int]
) -> Run:
    warm, over, rec = phases
    server = Server(app, mode)
    try:
        start = time.monotonic() + 0.5
        overload = (start + warm, start + warm + over)
        end = overload[1] + rec
        results: list[dict[str, float]] = []

        def load_phases() -> None:
            time.sleep(max(0.0, start - time.monotonic()))
            for seconds, rate in ((warm, 0.5), (over, load), (rec, 0.5)):
                results.append(wrk(server.port, seconds, rate * capacity, script, CONNECTIONS))

        thread = threading.Thread(target=load_phases)
        thread.start()
        samples: list[tuple[float, float, int]] = []
        time.sleep(max(0.0, start - time.monotonic()))
        asyncio.run(_probe(server.port, end, samples))
        thread.join()
        rows = server.series()
    finally:
        server.stop()
    return Run(app, mode, load, capacity, start, overload, end, rows, samples, results)


def measure_capacity(app: str) -> tuple[float, float]:
    """Requests per second of ``GET /low`` with no shedding, closed loop, 16 connections, and
    the server's CPU share meanwhile (below 100 %: a neighbour took some of its core)."""
    server = Server(app, "none")
    try:
        wrk(server.port, 2, None, Path(), 16)  # warm up
        start = time.monotonic()
        rps = wrk(server.port, 5, None, Path(), 16)["rps"]
        rows = server.series()
    finally:
        server.stop()
    run = Run(app, "none", 0, rps, start, (start, start + 5), start + 5, rows, [])
    return rps, cpu_share(run, start + 0.5, start + 4.5)


# -- the cost of a shed request ----------------------------------------------------------------


def in_process_cost(calls: int = 20000) -> dict[str, float]:
    """Microseconds per request answered 503 in-process: ratekeeper's shed path (worker shedder
    held at full shedding) against a bare app that answers 503 itself, ASGI and WSGI."""
    from benchmarks.overload_app import REJECTION, pinned_shedder
    from ratekeeper.middleware import RateLimitMiddleware, WorkerCheck, WSGIRateLimitMiddleware

    async def bare(scope: Any, receive: Any, send: Any) -> None:
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": REJECTION})

    async def never(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("a shed request reached the app")

    async def send(message: Any) -> None:
        pass

    async def receive() -> Any:
        raise AssertionError("a shed request read its body")

    scope: dict[str, Any] = {"type": "http", "method": "GET", "path": "/low", "headers": []}
    shedding = RateLimitMiddleware(never, [WorkerCheck(pinned_shedder())])

    async def loop(app: Any) -> float:
        start = time.process_time()  # CPU time: a busy neighbour does not inflate it
        for _ in range(calls):
            await app(scope, receive, send)
        return (time.process_time() - start) / calls * 1e6

    out = {}
    for name, app in (("asgi bare 503", bare), ("asgi ratekeeper shed", shedding)):
        out[name] = min(asyncio.run(loop(app)) for _ in range(3))

    def wsgi_bare(environ: Any, start_response: Any) -> list[bytes]:
        start_response("503 Service Unavailable", [("Content-Type", "application/json")])
        return [REJECTION]

    def wsgi_never(environ: Any, start_response: Any) -> list[bytes]:
        raise AssertionError("a shed request reached the app")

    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/low"}
    wsgi_shed = WSGIRateLimitMiddleware(wsgi_never, [WorkerCheck(pinned_shedder())])
    for name, wapp in (("wsgi bare 503", wsgi_bare), ("wsgi ratekeeper shed", wsgi_shed)):
        best = float("inf")
        for _ in range(3):
            start = time.process_time()
            for _ in range(calls):
                wapp(environ, lambda *a: None)
            best = min(best, (time.process_time() - start) / calls * 1e6)
        out[name] = best
    return out


def server_cost(app: str, script: Path) -> dict[str, float]:
    """Requests per second the server answers with 503, closed loop: the bare app's own 503
    (the server's ceiling) and ratekeeper's shed path."""
    out = {}
    for mode in ("raw503", "always"):
        server = Server(app, mode)
        try:
            wrk(server.port, 1, None, script, CONNECTIONS)
            out[mode] = wrk(server.port, 4, None, script, CONNECTIONS)["rps"]
        finally:
            server.stop()
    return out


# -- main ------------------------------------------------------------------------------------


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "uptime unavailable"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--apps", default="asgi,wsgi")
    parser.add_argument("--loads", default="1.5,3")
    parser.add_argument("--modes", default="none,worker,adaptive")
    parser.add_argument("--sweep", action="store_true", help="fixed limits at 3x as well")
    parser.add_argument("--limits", default="1,2,4,8,16,32")
    parser.add_argument("--phases", default="3,20,12", help="warm-up,overload,recovery seconds")
    parser.add_argument("--out", default=str(ROOT / "docs" / "figures"))
    parser.add_argument("--json", help="write every run's figures here")
    parser.add_argument("--raw", help="write every run's raw series and probe samples here")
    parser.add_argument("--replot", help="only redraw figures and the table from a --raw file")
    parser.add_argument("--no-cost", action="store_true", help="skip the cost of a shed request")
    parser.add_argument(
        "--nice",
        type=int,
        default=0,
        help="niceness of servers and wrk, and of this session's autogroup (negative: root)",
    )
    args = parser.parse_args()
    global NICE
    NICE = args.nice
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # stop the servers on the way out
    autogroup = Path("/proc/self/autogroup")
    if args.nice and autogroup.exists():
        # with autogroup scheduling, niceness only ranks processes within one session: raise
        # this session's group (the servers and wrk are in it) against other sessions
        autogroup.write_text(str(args.nice))
    try:
        run_all(args)
    finally:
        if args.nice and autogroup.exists():
            autogroup.write_text("0")


def run_all(args: argparse.Namespace) -> None:
    """Every section the arguments ask for; prints the report, writes the figures."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.replot:
        replot(Path(args.replot), out)
        return
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is not installed (Debian: apt-get install wrk)")
    if shutil.which("taskset"):
        os.sched_setaffinity(0, {CLIENT_CPU})  # this script and the probe share wrk's CPU
    phases = tuple(int(x) for x in args.phases.split(","))
    assert len(phases) == 3, "--phases takes three numbers"
    results: list[dict[str, Any]] = []
    raw: list[dict[str, Any]] = []
    runs: list[Run] = []
    print(f"# bench_overload\n\n{uptime()}\n")
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "paced.lua"
        script.write_text(WRK_SCRIPT)
        if not args.no_cost:
            print("## The cost of a shed request\n")
            for name, micros in in_process_cost().items():
                print(f"- in-process, {name}: {micros:.1f} µs per request")
            for app in args.apps.split(","):
                rates = server_cost(app, script)
                print(
                    f"- {app} server, wrk closed loop ({CONNECTIONS} connections): bare 503 "
                    f"{rates['raw503']:.0f}/s, ratekeeper shed {rates['always']:.0f}/s "
                    f"({rates['always'] / rates['raw503']:.2f}x)"
                )
            print(f"\n{uptime()}\n\n## Overload\n")
        for app in args.apps.split(","):
            measured, cpu = measure_capacity(app)
            # a neighbour on the server's core lowers the measured rate: count per CPU-second
            capacity = measured / min(1.0, max(0.25, cpu))
            print(
                f"{app}: capacity {capacity:.0f} requests/s of GET /low on a whole core "
                f"(measured {measured:.0f}/s with {100 * cpu:.0f} % of a core; {uptime()})"
            )
            for load in (float(x) for x in args.loads.split(",")):
                for mode in args.modes.split(","):
                    run = run_scenario(app, mode, load, capacity, script, phases)
                    runs.append(run)
                    raw.append(asdict(run))
                    results.append(summarize(run))
                    print(table([results[-1]]).splitlines()[-1], f"  [{uptime()}]", flush=True)
            if args.sweep:
                for limit in (int(x) for x in args.limits.split(",")):
                    run = run_scenario(app, f"fixed:{limit}", 3.0, capacity, script, phases)
                    runs.append(run)
                    raw.append(asdict(run))
                    results.append(summarize(run))
                    print(table([results[-1]]).splitlines()[-1], f"  [{uptime()}]", flush=True)
        write_figures(runs, out)
    print("\n" + table(results))
    print(f"\n{uptime()}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    if args.raw:
        Path(args.raw).write_text(json.dumps(raw))


if __name__ == "__main__":
    main()
