"""A fleet on local leases, everything at once: forks, rate changes, resets, Redis stopped.

Two spawned processes, each of which forks a child after its first decisions (four processes
on one key), hit one aligned fixed window, each switching at random between three rates every
few hundred ms (a rolling reload that processes see at different times); one resets the key
twice; each calls ``maintain()`` from a timer thread, as the docs recommend; Redis is stopped
(SIGSTOP) for a whole window and more in the middle of the run. Every process records each
decision with when its call returned, so what the checks allow for calls in flight is what
was measured. Per window (``docs/local_budget.md``):

- at most the highest rate any process used in it, and at most that again after each reset
  (a decision in flight while the reset ran may count on either side of it);
- in a window where some process decided without the store, at most twice that (the
  documented slack); in a window wholly inside the outage, at most each process's share of
  the live count it last heard, summed over the processes: here the limit itself.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import multiprocessing
import os
import random
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from ratekeeper import Limiter, LocalBudget, RedisStore
from ratekeeper.errors import StoreUnavailable
from tests.redis_servers import RedisServer
from tests.test_local_budget_processes import until

CTX = multiprocessing.get_context("spawn")
PHASES = [(0.0, "3000/second"), (1.0, "1500/second"), (3.0, "4500/second"), (5.0, "3000/second")]
"""When each rate comes into force (s after the start): a process switches at a random
moment within 150 ms of it, as a rolling reload reaches processes at different times."""
Record = tuple[int, int, bool, bool, int, int]
"""(now ms, done ms, allowed, degraded, the rate's count, live count heard)."""


def ms() -> int:
    return round(time.time() * 1000)


def fleet_worker(
    url: str, out: str, seed: int, resetter: bool, ready: Any, starts: Any, halt: Any
) -> None:
    """One process of the fleet (see the module): it forks its child 100 ms in."""
    budget = LocalBudget(RedisStore(url, socket_timeout=0.25), heartbeat=0.2)
    limiter = Limiter(budget, breaker_cooldown=0.2, breaker_max_cooldown=0.4)
    ready.put(os.getpid())
    start = starts.get(timeout=60)
    until(start)
    rng = random.Random(seed)
    records: list[Record] = []
    resets: list[tuple[int, int]] = []
    planned = [start + 1.05, start + 5.3] if resetter else []
    child, n, rate = None, 0, PHASES[0][1]
    switches = [(start + at + rng.uniform(-0.15, 0.15), r) for at, r in PHASES[1:]]
    stop = threading.Event()
    while not (n % 16 == 0 and halt.is_set()) and time.time() < start + 60:
        n += 1
        now = time.time()
        if child is None and now >= start + 0.1:  # after first use: the child inherits slices
            child = os.fork()
            if child == 0:
                rng, out, planned = random.Random(seed + 1), out + ".child", []
                records, resets = [], []
                switches = [(start + at + rng.uniform(-0.15, 0.15), r) for at, r in PHASES[1:]]
            threading.Thread(target=keep_up, args=(budget, stop), daemon=True).start()
        while switches and now >= switches[0][0]:
            rate = switches.pop(0)[1]
        if planned and now >= planned[0]:
            planned.pop(0)
            began = ms()
            limiter.reset("k", rate, aligned=True)
            resets.append((began, ms()))
        d = limiter.hit("k", rate, aligned=True)
        records.append(
            (round(d.now * 1000), ms(), d.allowed, d.degraded, d.limit, budget.live or 0)
        )
        if n % 10 == 0:
            time.sleep(0.002)
    stop.set()
    try:
        budget.close()
        Path(out).write_text(json.dumps({"records": records, "resets": resets}))
    finally:
        if child == 0:
            os._exit(0)
    if child:
        os.waitpid(child, 0)


def keep_up(budget: LocalBudget, stop: threading.Event) -> None:
    """``maintain()`` every 250 ms, as from an application's timer."""
    while not stop.wait(0.25):
        with contextlib.suppress(StoreUnavailable):
            budget.maintain()


def test_a_fleet_forking_changing_rates_resetting_through_an_outage(
    fresh_redis: RedisServer, tmp_path: Path
) -> None:
    ready, starts, halt = CTX.Queue(), CTX.Queue(), CTX.Event()
    outs = [str(tmp_path / f"p{i}.json") for i in range(2)]
    procs = []
    for i in range(2):
        args = (fresh_redis.url, outs[i], 7 + i, i == 0, ready, starts, halt)
        procs.append(CTX.Process(target=fleet_worker, args=args))
        procs[-1].start()
    for _ in procs:
        ready.get(timeout=60)
    start = math.floor(time.time()) + 1.0  # on a whole second: windows are whole seconds
    for _ in procs:
        starts.put(start)
    until(start + 2.3)
    stopped = time.time()
    fresh_redis.pause()
    until(math.floor(stopped) + 2.6)  # past a whole window, however late the stop came
    fresh_redis.resume()
    resumed = time.time()
    until(max(math.floor(resumed) + 3.0, start + 6.5))
    halt.set()
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    runs = [json.loads(Path(o + suffix).read_text()) for o in outs for suffix in ("", ".child")]
    check(runs, stopped * 1000, resumed * 1000)


def check(runs: list[dict[str, Any]], stop_ms: float, resume_ms: float) -> None:
    """The per-window bounds of the module, from the processes' records."""
    assert len(runs) == 4 and all(run["records"] for run in runs)  # four processes decided
    resets = sorted(tuple(r) for run in runs for r in run["resets"])
    assert len(resets) == 2
    decisions = [(p, *r) for p, run in enumerate(runs) for r in run["records"]]
    assert len({d[5] for d in decisions}) >= 2  # the rate changed
    windows: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
    for d in decisions:
        windows[d[1] // 1000].append(d)
    local_windows = {w for w, ds in windows.items() if any(d[4] for d in ds)}
    assert local_windows, "no decision was made without the store"
    inside = [  # no call of the window could reach the store: all ended before it was back
        w for w, ds in windows.items() if w * 1000 >= stop_ms and max(d[2] for d in ds) < resume_ms
    ]
    assert inside
    for w, ds in sorted(windows.items()):
        top = max(d[5] for d in ds)  # the highest rate in force in the window
        admitted = [d for d in ds if d[3]]
        if w in inside:  # each process its share of the live count it heard: the limit here
            assert all(d[4] for d in ds)
            shares = sum(
                max((max(1, d[5] // max(1, d[6])) for d in ds if d[0] == p), default=0)
                for p in range(4)
            )
            assert len(admitted) <= shares, (w, len(admitted), shares)
            if all(d[6] == 4 for d in ds):  # the count was right: the shares are the limit
                assert shares <= top, (w, shares, top)
            continue
        factor = 2 if w in local_windows else 1  # the documented slack
        cuts = [r for r in resets if w * 1000 <= r[0] < (w + 1) * 1000]
        edges = [w * 1000, *(r[0] for r in cuts), (w + 1) * 1000]
        either = sum(1 for d in admitted if any(d[1] <= r[1] and d[2] >= r[0] for r in cuts))
        for lo, hi in itertools.pairwise(edges):  # each part between resets
            part = sum(1 for d in admitted if lo <= d[1] < hi)
            assert part <= factor * top + either, (w, lo, hi, part, top, factor, either)
