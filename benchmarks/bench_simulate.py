"""``ratekeeper simulate`` speed: log lines per second for a one-rate limit, beside its floors.

A generated combined-format log (``--lines`` lines, 200 a second, about 10,000 client IPs and
three heavy hitters) is replayed in one process, in one run:

- ``read + parse, every field``: ``LogReader.read``, the entries every general replay reads;
- ``read + parse, one field``: ``LogReader.runs`` for ``ip``, what ``--limit`` reads;
- ``Limiter.hit loop``: the parsed (time, ip) pairs through ``Limiter.hit`` with a
  ManualClock, no reading and no stats;
- ``MemoryStore.hit_one loop``: the same through the store call that ``Limiter.hit`` makes
  for one rate;
- ``OneRate loop``: the same pairs, grouped in runs of one time, through ``OneRate``, the
  steps of that store call in the replay's own dict, which ``--limit`` runs on every line;
- ``simulate --limit``: one candidate limit, the whole replay (reading, clock, decision,
  stats, demand spooling), without and with the suggested-limit search afterwards;
- ``simulate --checks``: the same limit as a middleware ``RateCheck`` through the WSGI
  middleware's gate (key function, modes, headers, refunds);
- ``simulate --limit, rotated newest first``: the same log as rotated files of five
  minutes each in one stream, newest first (``zcat access.log.3.gz ... |``): the first
  reading stops at the second file's first line, and the log is read again, every line
  sorted (with ``--lines`` over 1,000,000, through temporary files);
- ``suggestions + --reject-share``: the suggestions and the one rejecting at most 1 % of
  the requests.

With ``--baseline DIR`` (another checkout, e.g. ``git archive main | tar -x -C DIR``), the
whole-replay rows and the hostile-input rows run again as child processes, alternately from
this checkout and from ``DIR`` (its ``src`` first on ``PYTHONPATH``), in the same run: the
before/after of a change, side by side. The hostile rows read one 50 MB line (``--huge``
MB, between two ordinary lines) and the same size of ordinary lines: reading must stay
linear.

Run::

    .venv/bin/python -m benchmarks.bench_simulate [--lines 500000] [--rounds 3] \
        [--baseline DIR] [--huge 50]

Rows run in interleaved rounds (the order rotates every round, so drift in the machine's
load hits them alike). Each row prints its median round's lines per second by process CPU
time (``time.process_time``, so other programs on a shared machine count less) and by wall
time, and its ratio to ``read + parse, every field``. The last lines put ``--limit`` beside
its floors: a one-field parse and a ``OneRate`` step per line, their costs added, and the
same with a ``hit_one`` per line (the store's call) instead.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime

from ratekeeper import Limiter, ManualClock, MemoryStore
from ratekeeper.middleware import RateCheck, keys
from ratekeeper.plan import make_policy
from ratekeeper.simulate.onerate import OneRate
from ratekeeper.simulate.reading.lines import open_log
from ratekeeper.simulate.reading.logs import LogReader
from ratekeeper.simulate.replay import Options, replay
from ratekeeper.simulate.targets import CandidatesTarget, ChecksTarget

RATE = "100/minute"


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
    gc.collect()
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    return time.process_time() - cpu, time.perf_counter() - wall


def rows(path: str) -> list[tuple[str, Callable[[], object]]]:
    pairs: list[tuple[float, str]] = []
    with open_log(path) as stream:
        pairs.extend((e.time, e.fields["ip"]) for e in LogReader("combined").read(stream))

    def parse() -> None:
        with open_log(path) as stream:
            for _ in LogReader("combined").read(stream):
                pass

    def parse_one_field() -> None:
        with open_log(path) as stream:
            for _ in LogReader("combined").runs(stream, "ip"):
                pass

    def hit_loop() -> None:
        clock = ManualClock(0)
        hit = Limiter(MemoryStore(max_keys=sys.maxsize), clock=clock).hit
        for t, ip in pairs:
            clock._now = t
            hit(ip, RATE)

    def hit_one_loop() -> None:
        policy = make_policy(RATE, "fixed_window", None, None)
        hit_one = MemoryStore(max_keys=sys.maxsize).hit_one
        slot, algorithm, limit = policy.slots[0], policy.algorithm, policy.limits[0]
        for t, ip in pairs:
            hit_one(slot, ip, algorithm, limit, int(t * 1000 + 0.5), 1)

    runs: list[tuple[float, int, list[str]]] = []
    for t, ip in pairs:
        if not runs or runs[-1][0] != t:
            runs.append((t, int(t * 1000 + 0.5), []))
        runs[-1][2].append(ip)

    def one_rate_loop() -> None:
        policy = make_policy(RATE, "fixed_window", None, None)
        OneRate(policy.algorithm, policy.limits[0]).hit_runs(runs)

    def candidates(
        suggest: bool, log: str = path, reject_share: float | None = None
    ) -> Callable[[], object]:
        def run() -> object:
            target = CandidatesTarget({"per-ip": RATE}, "ip", "fixed_window", ManualClock(0))
            options = Options([log], "combined", suggest=suggest, reject_share=reject_share)
            return replay(target, options, "candidates")

        return run

    rotated_log = path + ".rotated"
    with open(path) as f, open(rotated_log, "w") as out:
        lines = f.readlines()
        size = 60_000  # five minutes of the log, longer than the default --skew
        for end in range(len(lines), 0, -size):  # rotated, newest first
            out.writelines(lines[max(0, end - size) : end])

    def checks() -> object:
        check = RateCheck("per-ip", RATE, key=keys.client_ip())
        target = ChecksTarget([check], ManualClock(0), "enforce")
        return replay(target, Options([path], "combined", suggest=False), "enforce")

    return [
        ("read + parse, every field", parse),
        ("read + parse, one field (--limit reads this)", parse_one_field),
        ("Limiter.hit loop over parsed lines", hit_loop),
        ("MemoryStore.hit_one loop (the store's call)", hit_one_loop),
        ("OneRate loop over runs (--limit calls this)", one_rate_loop),
        ("simulate --limit, no suggestions", candidates(False)),
        ("simulate --limit, with suggestions", candidates(True)),
        ("simulate --checks (WSGI gate), no suggestions", checks),
        ("simulate --limit, rotated newest first", candidates(False, rotated_log)),
        ("simulate --limit, suggestions + --reject-share", candidates(True, path, 0.01)),
    ]


CHILD = """
import sys, time
from ratekeeper import ManualClock
from ratekeeper.simulate.replay import Options, replay
from ratekeeper.simulate.targets import CandidatesTarget
try:
    from ratekeeper.simulate.reading.lines import open_log
except ImportError:  # before lines.py
    from ratekeeper.simulate.reading.logs import open_log
from ratekeeper.simulate.reading.logs import LogReader
row, path = sys.argv[1], sys.argv[2]
started = time.process_time()
if row == "read":
    with open_log(path) as stream:
        for _ in LogReader("combined").runs(stream, "ip"):
            pass
else:
    target = CandidatesTarget({"per-ip": "100/minute"}, "ip", "fixed_window", ManualClock(0))
    replay(target, Options([path], "combined", suggest=row == "suggest"), "candidates")
print(time.process_time() - started)
"""
"""One row timed in a child process: ``read`` (a one-field parse), ``limit`` or ``suggest``
(the whole --limit replay without or with the suggestions)."""


def child(checkout: str, row: str, path: str) -> float:
    """CPU seconds of ``row`` over ``path`` with ``checkout``'s ratekeeper."""
    env = {**os.environ, "PYTHONPATH": os.path.join(checkout, "src")}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, row, path], env=env, capture_output=True, text=True,
        check=True, timeout=3600,
    )  # fmt: skip
    return float(done.stdout.strip().splitlines()[-1])


def write_huge(path: str, megabytes: int, one_line: bool) -> None:
    """``megabytes`` MB of ordinary lines, or of one combined line (a path that long)
    between two ordinary ones (a first line is read whole by other means: not the case to
    measure)."""
    size = megabytes << 20
    line = '10.0.0.1 - - [14/Nov/2023:22:13:20 +0000] "GET /api/items HTTP/1.1" 200 512\n'
    with open(path, "w") as f:
        if one_line:
            head = '10.0.0.1 - - [14/Nov/2023:22:13:20 +0000] "GET /'
            f.write(line + head + "a" * (size - len(head) - 2 * len(line) - 30))
            f.write(' HTTP/1.1" 200 512 "-" "x"\n' + line)
        else:
            f.write(line * (size // len(line)))


def compare(args: argparse.Namespace, path: str) -> None:
    """Rows of this checkout and of ``--baseline``, alternately in child processes."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sides = {"this checkout": here, "baseline": args.baseline}
    huge = {}
    for name, one in (("one long line", True), ("ordinary lines", False)):
        fd, huge[name] = tempfile.mkstemp(suffix=".log")
        os.close(fd)
        write_huge(huge[name], args.huge, one)
    jobs = [
        (f"simulate --limit, no suggestions ({args.lines:,} lines)", "limit", path, args.lines),
        (f"simulate --limit, with suggestions ({args.lines:,} lines)", "suggest", path, args.lines),
        (f"read + parse one field: {args.huge} MB of ordinary lines", "read",
         huge["ordinary lines"], args.huge << 20),
        (f"read + parse one field: one {args.huge} MB line", "read", huge["one long line"],
         args.huge << 20),
    ]  # fmt: skip
    try:
        seconds: dict[tuple[str, str], list[float]] = {}
        for r in range(args.rounds):
            order = list(sides.items()) if r % 2 == 0 else list(sides.items())[::-1]
            for label, row, file, _ in jobs:
                for side, checkout in order:
                    seconds.setdefault((label, side), []).append(child(checkout, row, file))
        print(f"\nbefore/after, child processes alternately, median of {args.rounds} rounds "
              "(CPU seconds; lines/s or MB/s)")  # fmt: skip
        for label, _, _, amount in jobs:
            cells = []
            for side in sides:
                cpu = statistics.median(seconds[(label, side)])
                per = f"{amount / cpu:,.0f} lines/s" if "MB" not in label else (
                    f"{amount / cpu / 2**20:,.1f} MB/s")  # fmt: skip
                cells.append(f"{side}: {cpu:7.2f} s ({per})")
            print(f"  {label:58s} " + "   ".join(cells))
    finally:
        for file in huge.values():
            os.unlink(file)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=500_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", metavar="DIR", help="another checkout to compare with")
    parser.add_argument("--huge", type=int, default=50, metavar="MB",
                        help="size of the hostile rows' files (with --baseline)")  # fmt: skip
    args = parser.parse_args()
    fd, path = tempfile.mkstemp(suffix=".log")
    os.close(fd)
    try:
        write_log(path, args.lines)
        table = rows(path)
        times: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in table}
        for r in range(args.rounds):
            shift = r % len(table)
            for name, fn in table[shift:] + table[:shift]:
                times[name].append(timed(fn))
        print(
            f"{args.lines:,} lines; lines/s by CPU time (wall time), median of {args.rounds} "
            "rounds; ratio to read + parse, every field"
        )
        rate: dict[str, float] = {}
        for name, _ in table:
            cpu, wall = sorted(times[name])[len(times[name]) // 2]
            rate[name] = args.lines / cpu
            floor = rate[table[0][0]]
            print(
                f"  {name:46s} {rate[name]:>10,.0f} ({args.lines / wall:>9,.0f})  "
                f"{rate[name] / floor:4.2f}"
            )
        parse_one, hit_one, one_rate, limit = (rate[table[i][0]] for i in (1, 3, 4, 5))
        for what, step in (("OneRate", one_rate), ("hit_one", hit_one)):
            bound = 1 / (1 / parse_one + 1 / step)
            print(
                f"--limit's floor (one-field parse + {what} per line): {bound:,.0f} lines/s; "
                f"--limit reaches {limit / bound:.2f} of it"
            )
        spread = max(
            (max(c for c, _ in v) - min(c for c, _ in v)) / statistics.median(c for c, _ in v)
            for v in times.values()
        )
        print(f"largest spread of a row's CPU times between rounds: {spread:.0%}")
        if args.baseline:
            compare(args, path)
    finally:
        os.unlink(path)
        if os.path.exists(path + ".rotated"):
            os.unlink(path + ".rotated")


if __name__ == "__main__":
    main()
