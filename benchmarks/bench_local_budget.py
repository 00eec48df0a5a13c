"""Local leases: ``LocalBudget`` on one Redis, four processes, a hot key and a Zipf mix.

Run: ``flock /tmp/rk-bench.lock .venv/bin/python -m benchmarks.bench_local_budget [--quick]``
(needs ``redis-server``). It starts its own ``redis-server`` on 127.0.0.1 and stops it by PID.
Bounded: about a minute (``--quick``: a few seconds).

- (a) one process, the same hot key and limit: ``Limiter.hit`` on a ``MemoryStore`` (the
  in-process ceiling), on a ``LocalBudget`` over a ``RedisStore``, and on the ``RedisStore``
  alone (a round trip per decision), in interleaved rounds; decisions/s of the median round,
  wall time and process CPU.
- (b) four processes (spawned, released together) on one Redis, each hitting as fast as it
  can for ``--seconds``: the hot key (fixed_window ``--limit`` per second, so every window
  runs out part-way: the traffic is over the limit), then a Zipf mix (s=1.1 over 10,000 keys,
  each ``--zipf-limit`` per second), then the hot key with one ``RedisStore`` call per decision
  (the same four processes without leases), then each process on a ``MemoryStore`` of its own
  (the ceiling of four processes on this machine; no shared limit). Every decision is logged
  (time, window, verdict) and merged afterwards:

  - decisions/s, all processes together and per process;
  - Redis calls per decision: ``EVALSHA`` + ``EVAL`` + ``DEL`` from ``INFO commandstats``
    before and after each part (the heartbeats and give-backs included);
  - admitted per window against the limit (fixed windows: the decisions' ``reset_at``);
  - false rejections, exactly: each decision is logged with the wall clock (µs) when its call
    returned; a rejection is false when fewer than ``limit`` units of its window had been
    admitted by all processes by then (an admission is counted once its call returned, so the
    figure leans high by what was in flight); the ratio is over the requests made while the
    window was under its limit by the same rule. Beside it, what the processes' own counter
    (``stats()["false_rejections"]``, an upper bound) said.

Figures on a shared 2-vCPU machine are noisy: four processes and Redis share two CPUs. Compare
the ratios within one run.
"""

from __future__ import annotations

import argparse
import bisect
import multiprocessing
import os
import pickle
import random
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import redis

from ratekeeper import Limiter, LocalBudget, MemoryStore, RedisStore
from tests.redis_servers import RedisServer

CTX = multiprocessing.get_context("spawn")
PROCESSES = 4
ZIPF_KEYS = 10_000
CALLS = ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_del")

Log = list[tuple[float, float, bool]]
"""(when the call returned, window end, allowed) of every decision, in epoch seconds."""


def zipf_keys(n: int, s: float, count: int, seed: int) -> list[str]:
    """``count`` keys drawn from a Zipf(s) law over ``n`` keys."""
    weights = [1 / (i + 1) ** s for i in range(n)]
    total = sum(weights)
    cumulative, acc = [], 0.0
    for w in weights:
        acc += w / total
        cumulative.append(acc)
    rng = random.Random(seed)
    return [f"user:{bisect.bisect_left(cumulative, rng.random())}" for _ in range(count)]


def worker(
    url: str, part: str, rate: str, seconds: float, seed: int, out: str, ready: Any, go: Any,
    horizon: float,
) -> None:  # fmt: skip
    """One process of (b): hit for ``seconds`` once released; log every decision."""
    timeout = float(os.environ.get("RK_BENCH_TIMEOUT", "0.05"))
    budget = (
        LocalBudget(RedisStore(url, socket_timeout=timeout), horizon=horizon)
        if part in ("hot", "zipf")
        else None
    )
    plain = RedisStore(url, socket_timeout=timeout)
    store: Any = {"plain": plain, "memory": MemoryStore()}.get(part, budget)
    limiter = Limiter(store)
    keys = zipf_keys(ZIPF_KEYS, 1.1, 200_000, seed) if part == "zipf" else ["hot"]
    hit = limiter.hit
    clock = time.time
    log: Log = []
    add = log.append
    ready.put(seed)
    go.wait(60)
    until = time.time() + seconds
    n, i = 0, 0
    nkeys = len(keys)
    while True:
        for _ in range(256):
            key = keys[i]
            i = i + 1 if i + 1 < nkeys else 0
            d = hit(key, rate)
            add((clock(), d.reset_at, d.allowed))
        n += 256
        if time.time() >= until:
            break
    stats = {**limiter.stats(), **({} if budget is None else budget.stats())}
    if budget is not None:
        budget.close()
    Path(out).write_bytes(pickle.dumps((keys if part == "zipf" else None, log, stats)))


def run_part(
    server: RedisServer, part: str, rate: str, seconds: float, tmp: Path, horizon: float
) -> dict[str, Any]:
    """Part (b) once: four processes released together; merged logs and Redis calls."""
    client = redis.Redis(port=server.port)
    ready, go = CTX.Queue(), CTX.Event()
    procs = []
    for i in range(PROCESSES):
        out = tmp / f"{part}-{i}.pickle"
        args = (server.url, part, rate, seconds, i, str(out), ready, go, horizon)
        p = CTX.Process(target=worker, args=args)
        p.start()
        procs.append((p, out))
    for _ in procs:
        ready.get(timeout=120)
    before = calls(client)
    go.set()
    results = []
    for p, out in procs:
        p.join(300)
        results.append(pickle.loads(out.read_bytes()))
    used = calls(client) - before
    client.flushall()
    logs = [r[1] for r in results]
    decisions = sum(len(log) for log in logs)
    return {
        "decisions": decisions,
        "per_second": decisions / seconds,
        "per_process": [len(log) / seconds for log in logs],
        "calls_per_decision": used / decisions,
        "logs": logs,
        "keys": [r[0] for r in results],
        "stats": [r[2] for r in results],
    }


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median decisions/s."""
    return sorted(runs, key=lambda r: r["per_second"])[len(runs) // 2]


def calls(client: redis.Redis) -> int:
    """Top-level script and DEL calls Redis has run (``INFO commandstats``)."""
    info = client.info("commandstats")
    return sum(int(info[c]["calls"]) for c in CALLS if c in info)


def windows(logs: list[Log], keys: list[list[str] | None], limit: int) -> dict[str, int]:
    """Admitted per window (and key), false rejections by the exact rule (see the module)."""
    per: dict[tuple[str, int], list[tuple[int, bool]]] = defaultdict(list)
    for log, names in zip(logs, keys, strict=True):
        for j, (now, end, allowed) in enumerate(log):
            key = "hot" if names is None else names[j % len(names)]
            per[(key, round(end * 1000))].append((round(now * 1e6), allowed))
    most = false = under = over = 0
    for events in per.values():
        admitted = sorted(t for t, ok in events if ok)
        most = max(most, len(admitted))
        over += len(admitted) > limit
        for t, ok in events:
            if bisect.bisect_left(admitted, t) < limit:  # admitted strictly before this µs
                under += 1
                false += not ok
    return {"windows": len(per), "most": most, "over": over, "false": false, "under": under}


def single(
    url: str, rate: str, rounds: int, calls_per_round: int, horizon: float
) -> dict[str, dict[str, float]]:
    """Part (a): decisions/s of one process, interleaved rounds (see the module)."""
    contestants: dict[str, Any] = {
        "MemoryStore": Limiter(MemoryStore()),
        "LocalBudget(RedisStore)": Limiter(LocalBudget(RedisStore(url), horizon=horizon)),
        "RedisStore": Limiter(RedisStore(url)),
    }
    wall: dict[str, list[float]] = defaultdict(list)
    cpu: dict[str, list[float]] = defaultdict(list)
    for r in range(rounds):
        names = list(contestants)
        names = names[r % len(names) :] + names[: r % len(names)]
        for name in names:
            hit = contestants[name].hit
            n = calls_per_round if name != "RedisStore" else calls_per_round // 50
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(n):
                hit("hot", rate)
            wall[name].append(n / (time.perf_counter() - t0))
            cpu[name].append(n / max(1e-9, time.process_time() - c0))
    return {
        name: {"wall": statistics.median(wall[name]), "cpu": statistics.median(cpu[name])}
        for name in contestants
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each part of (b)")
    parser.add_argument("--limit", type=int, default=100_000, help="hot key, per second")
    parser.add_argument("--zipf-limit", type=int, default=1000, help="each Zipf key, per second")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds of (a)")
    parser.add_argument("--calls", type=int, default=200_000, help="decisions per round of (a)")
    parser.add_argument("--horizon", type=float, default=0.02, help="LocalBudget(horizon=)")
    parser.add_argument("--pairs", type=int, default=3, help="alternating runs in (b)")
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.rounds, args.calls, args.pairs = 1.0, 3, 20_000, 1
    server = RedisServer()
    try:
        report(server, args)
    finally:
        server.stop()


def report(server: RedisServer, args: argparse.Namespace) -> None:
    rate = f"{args.limit}/second"
    print(f"## (a) one process, the hot key at {rate}\n")
    a = single(server.url, rate, args.rounds, args.calls, args.horizon)
    redis.Redis(port=server.port).flushall()
    memory = a["MemoryStore"]["wall"]
    print("| store | decisions/s (wall) | vs MemoryStore | decisions/s (process CPU) |")
    print("|---|---:|---:|---:|")
    for name, r in a.items():
        print(f"| {name} | {r['wall']:,.0f} | {r['wall'] / memory:.2f} | {r['cpu']:,.0f} |")
    with tempfile.TemporaryDirectory() as tmp:
        parts = [
            ("hot key", "hot", rate, args.limit),
            ("Zipf mix", "zipf", f"{args.zipf_limit}/second", args.zipf_limit),
            ("hot key, no leases (RedisStore)", "plain", rate, args.limit),
            ("hot key, each process its own MemoryStore", "memory", rate, 0),
        ]
        runs: dict[str, list[dict[str, Any]]] = defaultdict(list)
        # the hot key with leases and the memory ceiling alternate (A B B A ...), so the
        # machine's load moves both alike; the median run of each is shown
        order = ["hot", "memory", "memory", "hot"] * ((args.pairs + 1) // 2)
        for part in [*order[: 2 * args.pairs], "zipf", "plain"]:
            title, _, spec, limit = next(p for p in parts if p[1] == part)
            runs[part].append(run_part(server, part, spec, args.seconds, Path(tmp), args.horizon))
    done = [(title, limit, median_run(runs[part])) for title, part, _, limit in parts]
    ceiling = statistics.mean(done[-1][2]["per_process"])
    print(
        f"\n## (b) {PROCESSES} processes on one Redis, {args.seconds:g} s each "
        f"(hot key and MemoryStore: median of {args.pairs} alternating runs)\n"
    )
    print(
        "| part | decisions/s | per process | per process vs one process on MemoryStore (a) | "
        "vs each of 4 on MemoryStore | Redis calls per decision | windows | most admitted in "
        "one (limit) | windows over | requests while under the limit | false rejections "
        "(exact) | counted by the processes (upper bound) | store errors | fail-local |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for title, limit, b in done:
        per = statistics.mean(b["per_process"])
        row = (
            f"| {title} | {b['per_second']:,.0f} | {per:,.0f} | {per / memory:.2f} | "
            f"{per / ceiling:.2f} | {b['calls_per_decision']:.4f} |"
        )
        errors = sum(s.get("store_errors", 0) for s in b["stats"])
        local = sum(s.get("fail_local", 0) for s in b["stats"])
        if not limit:  # no shared limit: nothing to check
            print(row + " | | | | | | | |")
            continue
        w = windows(b["logs"], b["keys"], limit)
        counted = sum(s.get("false_rejections", 0) for s in b["stats"])
        share = w["false"] / w["under"] if w["under"] else 0.0
        print(
            f"{row} {w['windows']:,} | {w['most']:,} ({limit:,}) | {w['over']} | "
            f"{w['under']:,} | {w['false']:,} ({share:.2%}) | {counted:,} | {errors} | {local} |"
        )
    print(
        "\nMachine: shared, 2 vCPUs; four processes and Redis share them. Compare ratios "
        "within this run."
    )


if __name__ == "__main__":
    main()
