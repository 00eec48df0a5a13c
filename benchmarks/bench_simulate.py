"""``ratekeeper simulate`` speed: log lines per second for a one-rate limit, beside its ceilings.

A generated combined-format log (``--lines`` lines, 10,000 client IPs, a few heavy hitters)
is replayed in one process, in one run:

- ``read + parse``: ``LogReader`` alone (the floor every replay pays);
- ``Limiter.hit loop``: the parsed entries through ``Limiter.hit`` with a ManualClock, no
  reading and no stats (the floor of deciding);
- ``simulate --limit``: one candidate limit, the whole replay (reading, clock, decision,
  stats, demand spooling), without and with the suggested-limit search afterwards;
- ``simulate --checks``: the same limit as a middleware ``RateCheck`` through the WSGI
  middleware's gate (key function, modes, headers, refunds).

Run::

    .venv/bin/python -m benchmarks.bench_simulate [--lines 500000]

Prints lines per second by process CPU time (``time.process_time``, so other programs on a
shared machine count less) and by wall time, and each row's ratio to the parse floor.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime

from ratekeeper import Limiter, ManualClock
from ratekeeper.middleware import RateCheck, keys
from ratekeeper.simulate.logs import LogReader, open_log
from ratekeeper.simulate.replay import Options, replay
from ratekeeper.simulate.targets import CandidatesTarget, ChecksTarget


def write_log(path: str, lines: int, seed: int = 1) -> None:
    rng = random.Random(seed)
    start = 1_700_000_000
    with open(path, "w") as f:
        for i in range(lines):
            t = start + i // 200  # 200 requests a second
            when = datetime.fromtimestamp(t, UTC).strftime("%d/%b/%Y:%H:%M:%S +0000")
            ip = (
                f"203.0.113.{rng.randrange(3)}"
                if rng.random() < 0.05
                else (f"10.{rng.randrange(40)}.{rng.randrange(250)}.1")
            )
            f.write(f'{ip} - - [{when}] "GET /api/items HTTP/1.1" 200 512 "-" "bench/1"\n')


def timed(fn: Callable[[], object]) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - cpu, time.perf_counter() - wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=500_000)
    args = parser.parse_args()
    fd, path = tempfile.mkstemp(suffix=".log")
    os.close(fd)
    try:
        write_log(path, args.lines)
        entries: list[tuple[float, str]] = []

        def parse() -> None:
            with open_log(path) as stream:
                entries.extend((e.time, e.fields["ip"]) for e in LogReader("combined").read(stream))

        def hit_loop() -> None:
            clock = ManualClock(0)
            hit = Limiter(clock=clock).hit
            for t, ip in entries:
                clock._now = t
                hit(ip, "100/minute")

        def candidates(suggest: bool) -> Callable[[], object]:
            def run() -> object:
                target = CandidatesTarget({"per-ip": "100/minute"}, "ip", "fixed_window",
                                          ManualClock(0))  # fmt: skip
                return replay(target, Options([path], "combined", suggest=suggest), "candidates")

            return run

        def checks() -> object:
            check = RateCheck("per-ip", "100/minute", key=keys.client_ip())
            target = ChecksTarget([check], ManualClock(0), "enforce")
            return replay(target, Options([path], "combined", suggest=False), "enforce")

        rows = [
            ("read + parse", parse),
            ("Limiter.hit loop (parsed entries)", hit_loop),
            ("simulate --limit, no suggestions", candidates(False)),
            ("simulate --limit, with suggestions", candidates(True)),
            ("simulate --checks (WSGI gate), no suggestions", checks),
        ]
        print(f"{args.lines:,} lines; lines/s by CPU time (by wall time); ratio to the parse floor")
        floor = None
        for name, fn in rows:
            cpu, wall = timed(fn)
            rate = args.lines / cpu
            floor = floor or rate
            print(f"  {name:46s} {rate:>10,.0f} ({args.lines / wall:>9,.0f})  {rate / floor:4.2f}")
    finally:
        os.unlink(path)


if __name__ == "__main__":
    main()
