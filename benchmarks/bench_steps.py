"""What one ``Limiter.hit`` on the memory store spends, layer by layer.

Run: ``python benchmarks/bench_steps.py [--rounds 15] [--calls 20000]``. For fixed_window and
gcra, admitted hits over 1,000 keys: the whole ``Limiter.hit``; the store's ``hit_one`` (lock,
dict, step, write); the algorithm's ``step`` alone on a live key's state; ``decide_one`` (the
frozen ``Decision``); and the clock read with its rounding. Each piece is timed in process CPU
time over ``--calls`` calls, the pieces interleaved round by round in rotated order; the table
shows each piece's median over the rounds and its lowest and highest round. The machine may be
shared: compare the pieces of one run.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from ratekeeper import Limiter, MemoryStore
from ratekeeper.plan import decide_one

RATE = "100000/hour"  # above the load (600 hits a key at the defaults): every hit admitted
KEYS = 1000


def pieces(algorithm: str) -> dict[str, Callable[[int], object]]:
    """The layers of one hit, each a callable of the call number."""
    store = MemoryStore()
    limiter = Limiter(store, count_decisions=False)
    keys = [f"user:{i}" for i in range(KEYS)]
    for key in keys:
        limiter.hit(key, RATE, algorithm=algorithm)
    policy = limiter._core._singles[(RATE, algorithm)]  # what the fast path uses
    slot, algo, limit = policy.slots[0], policy.algorithm, policy.limits[0]
    now = int(time.time() * 1000 + 0.5)
    state = store._data[(slot, keys[0])][1]
    outcome = store.hit_one(slot, keys[0], algo, limit, now, 1)
    clock = time.time
    return {
        "Limiter.hit whole": lambda i: limiter.hit(keys[i % KEYS], RATE, algorithm=algorithm),
        "MemoryStore.hit_one (lock, dict, step, write)": lambda i: store.hit_one(
            slot, keys[i % KEYS], algo, limit, now, 1
        ),
        "the algorithm step": lambda i: algo.step(state, limit, now, 1, True),
        "decide_one (the frozen Decision)": lambda i: decide_one(policy, outcome, now),
        "clock read and rounding": lambda i: int(clock() * 1000 + 0.5),
    }


def time_piece(run: Callable[[int], object], calls: int) -> float:
    """Microseconds of process CPU time per call."""
    start = time.process_time()
    for i in range(calls):
        run(i)
    return (time.process_time() - start) * 1e6 / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds (default 15)")
    parser.add_argument("--calls", type=int, default=20_000, help="calls per piece and round")
    args = parser.parse_args()
    table: dict[str, dict[str, list[float]]] = {}
    for algorithm in ("fixed_window", "gcra"):
        runs = pieces(algorithm)
        names = list(runs)
        times: dict[str, list[float]] = {name: [] for name in names}
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                times[name].append(time_piece(runs[name], args.calls))
        table[algorithm] = times
    print(f"µs per call, median of {args.rounds} rounds (lowest-highest), {KEYS:,} keys")
    names = list(table["fixed_window"])
    width = max(len(n) for n in names)
    print(f"{'piece':<{width}}  {'fixed_window':>20}  {'gcra':>20}")
    for name in names:
        cells = []
        for algorithm in ("fixed_window", "gcra"):
            t = sorted(table[algorithm][name])
            cells.append(f"{t[len(t) // 2]:.2f} ({t[0]:.2f}-{t[-1]:.2f})")
        print(f"{name:<{width}}  {cells[0]:>20}  {cells[1]:>20}")


if __name__ == "__main__":
    main()
