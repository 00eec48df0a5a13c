"""In-memory decisions per second: ratekeeper's ``Limiter.hit`` against its peers, same run.

Run ``python benchmarks/bench_memory.py`` (needs the ``bench`` extra: ``pip install -e
".[bench]"``). ``--quick`` makes a short smoke run; ``--rounds``/``--calls`` tune the length.

For every ratekeeper algorithm, each contestant below gets a fresh in-memory limiter and the
same traffic: ``--calls`` decisions spread over 1,000 distinct keys in a fixed pseudo-random
order, single thread, each limiter on its own default clock. Two scenarios:

- ``admit``: 10,000 per hour per key, so every call is admitted (the common case);
- ``reject``: 10 per hour per key, so after the first ten calls on a key all are rejected.

Contestants are timed in interleaved rounds (the order rotates every round, so drift in the
machine's load hits all of them alike) and the median round is reported. Rounds are timed in
process CPU time (``time.process_time``), not wall time, so that other programs sharing the
CPUs inflate the figures less; a peer's background threads count against it. Each peer is
mapped to the ratekeeper algorithm with the same semantics; the table says which peer class was
used and notes any peer whose call does less than ratekeeper's (a ratekeeper ``Decision``
always carries ``remaining``, ``reset_at`` and ``retry_after``). The summary gives two ratios:
against the fastest peer of the same algorithm and scenario, whatever its call returns, and
against the fastest peer whose call also yields the remaining count. A peer that is not
installed is left out, and said so.

Peers are driven through their documented public APIs only:

- ``limits``: ``MemoryStorage`` + ``FixedWindowRateLimiter`` / ``SlidingWindowCounterRateLimiter``
  / ``MovingWindowRateLimiter``; ``hit(item, key)`` returns only a bool, so a second row also
  calls ``get_window_stats`` (the documented way to learn ``remaining``);
- ``throttled-py``: ``Throttled(using=..., quota=per_hour(n), store=MemoryStore(...))`` and
  ``limit(key)``, whose result carries the remaining count;
- ``pyrate-limiter``: a ``Limiter`` over a ``BucketFactory`` that keeps one bucket per key
  (``InMemoryBucket`` for the log/window algorithms, ``StateBucket`` for GCRA and the token
  bucket) and ``try_acquire(key, blocking=False)``, which returns only a bool.
"""

from __future__ import annotations

import argparse
import gc
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ratekeeper import Limiter, MemoryStore

Run = Callable[[list[str]], int]
"""Decide once per key in the list; return how many calls were admitted."""

PERIOD_S = 3600
SCENARIOS = {"admit": 10_000, "reject": 10}
KEYS = 1_000
ALGORITHMS = ("fixed_window", "sliding_window", "sliding_log", "token_bucket", "gcra")


@dataclass(frozen=True, slots=True)
class Contestant:
    """One limiter under test: how to build it for ``limit`` per hour, and what it is."""

    name: str
    algorithm: str
    detail: str
    build: Callable[[int], Run]
    note: str = ""
    full_answer: bool = True
    """False when the call does not give the remaining count (it does less than ratekeeper)."""


def ratekeeper_run(algorithm: str) -> Callable[[int], Run]:
    def build(limit: int) -> Run:
        hit = Limiter(store=MemoryStore()).hit
        spec = f"{limit}/hour"

        def run(keys: list[str]) -> int:
            admitted = 0
            for key in keys:
                if hit(key, spec, algorithm=algorithm).allowed:
                    admitted += 1
            return admitted

        return run

    return build


def limits_run(strategy_name: str, with_stats: bool) -> Callable[[int], Run]:
    def build(limit: int) -> Run:
        import limits
        from limits import storage, strategies

        strategy = getattr(strategies, strategy_name)(storage.MemoryStorage())
        item = limits.parse(f"{limit}/hour")
        hit, stats = strategy.hit, strategy.get_window_stats

        def run(keys: list[str]) -> int:
            admitted = 0
            for key in keys:
                if hit(item, key):
                    admitted += 1
            return admitted

        def run_with_stats(keys: list[str]) -> int:
            admitted = 0
            for key in keys:
                if hit(item, key):
                    admitted += 1
                stats(item, key)
            return admitted

        return run_with_stats if with_stats else run

    return build


def throttled_run(using: str) -> Callable[[int], Run]:
    def build(limit: int) -> Run:
        from throttled import MemoryStore as ThrottledStore
        from throttled import Throttled, per_hour

        throttle = Throttled(
            using=using,
            quota=per_hour(limit),
            store=ThrottledStore(options={"MAX_SIZE": 100_000}),
        )
        limit_call = throttle.limit

        def run(keys: list[str]) -> int:
            admitted = 0
            for key in keys:
                if not limit_call(key).limited:
                    admitted += 1
            return admitted

        return run

    return build


def pyrate_run(algorithm: str) -> Callable[[int], Run]:
    def build(limit: int) -> Run:
        import pyrate_limiter as pl

        rates = [pl.Rate(limit, pl.Duration.HOUR)]

        class PerKeyFactory(pl.BucketFactory):  # type: ignore[misc, unused-ignore]  # pyrate-limiter: Any when not installed
            """One bucket per key, created on first use (the documented routing hook)."""

            def __init__(self) -> None:
                self.clock = pl.MonotonicClock()  # the buckets' own default clock
                self.buckets: dict[str, Any] = {}

            def wrap_item(self, name: str, weight: int = 1) -> Any:
                return pl.RateItem(name, self.clock.now(), weight=weight)

            def get(self, item: Any) -> Any:
                bucket = self.buckets.get(item.name)
                if bucket is None:
                    algo: Any
                    if algorithm in ("gcra", "token_bucket"):
                        algo = pl.GCRA() if algorithm == "gcra" else pl.TokenBucket()
                        bucket = pl.StateBucket(rates, algorithm=algo)
                    else:
                        algo = pl.FixedWindow() if algorithm == "fixed_window" else None
                        bucket = self.create(pl.InMemoryBucket, rates, algo)
                    self.buckets[item.name] = bucket
                return bucket

        limiter = pl.Limiter(PerKeyFactory())
        acquire = limiter.try_acquire

        def run(keys: list[str]) -> int:
            admitted = 0
            for key in keys:
                if acquire(key, blocking=False):
                    admitted += 1
            return admitted

        return run

    return build


def contestants() -> list[Contestant]:
    """Everyone, grouped by the ratekeeper algorithm whose semantics they share."""
    out = [
        Contestant("ratekeeper", a, f"Limiter.hit(key, rate, algorithm={a!r})", ratekeeper_run(a))
        for a in ALGORITHMS
    ]
    bool_only = "bool only, no remaining"
    limits_map = {
        "fixed_window": ("FixedWindowRateLimiter", "; counts rejected hits too"),
        "sliding_window": ("SlidingWindowCounterRateLimiter", ""),
        "sliding_log": ("MovingWindowRateLimiter", ""),
    }
    for algorithm, (strategy, quirk) in limits_map.items():
        out.append(
            Contestant(
                "limits",
                algorithm,
                f"{strategy}.hit",
                limits_run(strategy, False),
                bool_only + quirk,
                full_answer=False,
            )
        )
        out.append(
            Contestant(
                "limits+stats",
                algorithm,
                f"{strategy}.hit + get_window_stats",
                limits_run(strategy, True),
                "two calls to learn remaining" + quirk,
            )
        )
    for algorithm in ("fixed_window", "sliding_window", "token_bucket", "gcra"):
        out.append(
            Contestant(
                "throttled-py",
                algorithm,
                f"Throttled(using={algorithm!r}).limit",
                throttled_run(algorithm),
            )
        )
    pyrate_map = {
        "fixed_window": ("InMemoryBucket + FixedWindow", "; a log of hits, epoch-aligned windows"),
        "sliding_log": ("InMemoryBucket + SlidingWindowLog", ""),
        "token_bucket": ("StateBucket + TokenBucket", ""),
        "gcra": ("StateBucket + GCRA", ""),
    }
    for algorithm, (detail, quirk) in pyrate_map.items():
        out.append(
            Contestant(
                "pyrate-limiter",
                algorithm,
                f"{detail}, try_acquire",
                pyrate_run(algorithm),
                bool_only + quirk,
                full_answer=False,
            )
        )
    return out


@dataclass(frozen=True, slots=True)
class Result:
    """The median rate of one contestant in one scenario, and its admitted share."""

    contestant: Contestant
    scenario: str
    per_second: float
    rounds: list[float]
    admitted: float


def traffic(calls: int, seed: int = 42) -> list[str]:
    """``calls`` keys drawn from 1,000 distinct ones in a fixed pseudo-random order."""
    rng = random.Random(seed)
    names = [f"user:{i}" for i in range(KEYS)]
    return [rng.choice(names) for _ in range(calls)]


def measure(group: list[Contestant], scenario: str, keys: list[str], rounds: int) -> list[Result]:
    """Time every contestant of one algorithm in interleaved rounds; keep the medians."""
    limit = SCENARIOS[scenario]
    runs = [c.build(limit) for c in group]
    for run in runs:  # warm-up: first touch of every key, caches, lazy imports
        run(keys[: len(keys) // 4])
    times: list[list[float]] = [[] for _ in group]
    admitted = [0] * len(group)
    for r in range(rounds):
        order = list(range(len(group)))
        order = order[r % len(order) :] + order[: r % len(order)]
        for i in order:
            gc.collect()
            start = time.process_time()
            admitted[i] += runs[i](keys)
            times[i].append(time.process_time() - start)
    return [
        Result(
            c,
            scenario,
            len(keys) / statistics.median(t),
            [len(keys) / x for x in t],
            admitted[i] / (len(keys) * rounds),
        )
        for i, (c, t) in enumerate(zip(group, times, strict=True))
    ]


def _groups(results: list[Result]) -> dict[tuple[str, str], list[Result]]:
    keyed: dict[tuple[str, str], list[Result]] = {}
    for res in results:
        keyed.setdefault((res.contestant.algorithm, res.scenario), []).append(res)
    return keyed


def table(results: list[Result]) -> str:
    """Every contestant: median decisions/s, admitted share, what its call does."""
    lines = [
        "| algorithm | scenario | contestant | call | decisions/s | admitted | note |",
        "|---|---|---|---|---:|---:|---|",
    ]
    for (algorithm, scenario), group in _groups(results).items():
        for res in sorted(group, key=lambda r: -r.per_second):
            c = res.contestant
            lines.append(
                f"| {algorithm} | {scenario} | {c.name} | `{c.detail}` | {res.per_second:,.0f} |"
                f" {res.admitted:.0%} | {c.note} |"
            )
    return "\n".join(lines)


def summary(results: list[Result]) -> str:
    """ratekeeper against the fastest peer, and against the fastest peer giving a full answer."""
    lines = [
        "| algorithm | scenario | ratekeeper/s | fastest peer | its /s | ratio |"
        " fastest full-answer peer | its /s | ratio |",
        "|---|---|---:|---|---:|---:|---|---:|---:|",
    ]
    for (algorithm, scenario), group in _groups(results).items():
        ours = [r for r in group if r.contestant.name == "ratekeeper"]
        if not ours:
            continue
        mine = ours[0].per_second
        cells = [algorithm, scenario, f"{mine:,.0f}"]
        peers = [r for r in group if r.contestant.name != "ratekeeper"]
        for pool in (peers, [r for r in peers if r.contestant.full_answer]):
            if pool:
                best = max(pool, key=lambda r: r.per_second)
                cells += [best.contestant.name, f"{best.per_second:,.0f}"]
                cells.append(f"**{mine / best.per_second:.2f}x**")
            else:
                cells += ["(none)", "", ""]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


_DISTS = {"limits": "limits", "throttled-py": "throttled", "pyrate-limiter": "pyrate_limiter"}


def _installed(contestant: Contestant) -> bool:
    """False (and a note on stderr) for a peer whose package is not importable."""
    package = _DISTS.get(contestant.name.removesuffix("+stats"))
    if package is None:
        return True
    import importlib.util

    if importlib.util.find_spec(package) is not None:
        return True
    print(f"# left out: {contestant.name} ({package} is not installed)", file=sys.stderr)
    return False


def versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    found = []
    for dist in ("ratekeeper", "limits", "throttled-py", "pyrate-limiter"):
        try:
            found.append(f"{dist} {version(dist)}")
        except PackageNotFoundError:
            found.append(f"{dist} (not installed)")
    return ", ".join(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=10_000, help="decisions per round")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (median)")
    parser.add_argument("--quick", action="store_true", help="short smoke run")
    parser.add_argument(
        "--algorithm", action="append", choices=ALGORITHMS, help="only these (repeatable)"
    )
    args = parser.parse_args(argv)
    if args.calls < 1 or args.rounds < 1:
        parser.error(f"--calls={args.calls} and --rounds={args.rounds} must both be >= 1")
    calls, rounds = (2_000, 3) if args.quick else (args.calls, args.rounds)
    keys = traffic(calls)
    print(
        f"# {platform.python_implementation()} {platform.python_version()} on "
        f"{platform.machine()}, {versions()}"
    )
    print(
        f"# {calls:,} decisions x {rounds} rounds per contestant, {KEYS:,} keys, single thread;"
        f" scenarios: {', '.join(f'{s}={n}/hour' for s, n in SCENARIOS.items())}"
    )
    results: list[Result] = []
    wanted = args.algorithm or ALGORITHMS
    everyone = [c for c in contestants() if _installed(c)]
    for algorithm in wanted:
        group = [c for c in everyone if c.algorithm == algorithm]
        for scenario in SCENARIOS:
            results.extend(measure(group, scenario, keys, rounds))
            print(f"# done: {algorithm} {scenario}", file=sys.stderr)
    print("\n## Summary: ratekeeper vs the fastest peer (median round)\n")
    print(summary(results))
    print("\n## Every contestant\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
