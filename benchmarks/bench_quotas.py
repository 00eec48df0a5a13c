"""What a plan lookup costs a decision: ``"plan:api"`` against a plain rate, same run, memory store.

Run ``python benchmarks/bench_quotas.py`` (the peers need the ``bench`` extra: ``pip install -e
".[bench]"``). ``--quick`` makes a short smoke run; ``--rounds``/``--calls`` tune the length.

1,000 tenants on three plans (free, pro, enterprise: 10,000, 20,000 and 50,000 per hour, so
every call is admitted) and ``--calls`` decisions over them in a fixed pseudo-random order,
single thread, memory store. Contestants:

- ``rate``: ``Limiter.hit(key, "10000/hour")``, one limit for everyone: the floor;
- ``plan``: ``Limiter.hit(key, "plan:api")`` with ``Quotas`` (the tenant's plan from the
  in-process cache, warmed first; the source is asked once per tenant, which the run checks);
- ``dict``: the do-it-yourself idiom, ``hit(key, RATES[plan_of[key]])``: a dict lookup per call
  and no cache, no overrides, no status, no invalidation;
- peers with the same idiom (none of them has plans): ``limits``' ``FixedWindowRateLimiter.hit``
  with a per-plan ``RateLimitItem`` from a dict (bool only), and with ``get_window_stats`` too
  (the remaining count); ``throttled-py``'s ``Throttled(using="fixed_window")`` per plan.

Contestants are timed in interleaved rounds (the order rotates every round) in process CPU time,
and the median round is reported. The summary gives what ``plan`` adds to ``rate`` and to
``dict``, in nanoseconds per decision, from the medians of the same run.
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

from ratekeeper import Limiter, MemoryStore
from ratekeeper.quotas import Plans, Quotas, StaticSource

Run = Callable[[list[str]], int]
"""Decide once per key in the list; return how many calls were admitted."""

TENANTS = 1_000
PLAN_RATES = {"free": 10_000, "pro": 20_000, "enterprise": 50_000}


def plan_of() -> dict[str, str]:
    """Every tenant's plan: most on free, some on pro, a few on enterprise."""
    names = list(PLAN_RATES)
    return {f"t{i}": names[0 if i % 10 < 7 else 1 if i % 10 < 9 else 2] for i in range(TENANTS)}


@dataclass(frozen=True, slots=True)
class Contestant:
    """One way to limit each tenant by its plan."""

    name: str
    detail: str
    build: Callable[[], Run]


def rk_rate() -> Run:
    hit = Limiter(MemoryStore()).hit

    def run(keys: list[str]) -> int:
        return sum(1 for key in keys if hit(key, "10000/hour").allowed)

    return run


QUOTAS: list[Quotas] = []
"""The ``plan`` contestants' caches, to read their lookup counts after the run."""


def rk_plan() -> Run:
    plans = Plans.from_dict(
        {"default": "free", "plans": {p: {"api": f"{n}/hour"} for p, n in PLAN_RATES.items()}}
    )
    quotas = Quotas(plans, StaticSource(plan_of()), ttl=86_400)
    QUOTAS.append(quotas)
    hit = Limiter(MemoryStore(), quotas=quotas).hit

    def run(keys: list[str]) -> int:
        return sum(1 for key in keys if hit(key, "plan:api").allowed)

    return run


def rk_dict() -> Run:
    hit = Limiter(MemoryStore()).hit
    plans = plan_of()
    rates = {p: f"{n}/hour" for p, n in PLAN_RATES.items()}

    def run(keys: list[str]) -> int:
        return sum(1 for key in keys if hit(key, rates[plans[key]]).allowed)

    return run


def limits_dict(with_stats: bool) -> Callable[[], Run]:
    def build() -> Run:
        import limits
        from limits import storage, strategies

        strategy = strategies.FixedWindowRateLimiter(storage.MemoryStorage())
        items = {p: limits.parse(f"{n}/hour") for p, n in PLAN_RATES.items()}
        plans = plan_of()
        hit, stats = strategy.hit, strategy.get_window_stats

        def run(keys: list[str]) -> int:
            return sum(1 for key in keys if hit(items[plans[key]], key))

        def run_with_stats(keys: list[str]) -> int:
            admitted = 0
            for key in keys:
                item = items[plans[key]]
                if hit(item, key):
                    admitted += 1
                stats(item, key)
            return admitted

        return run_with_stats if with_stats else run

    return build


def throttled_dict() -> Run:
    from throttled import MemoryStore as ThrottledStore
    from throttled import Throttled, per_hour

    store = ThrottledStore(options={"MAX_SIZE": 100_000})
    throttles = {
        p: Throttled(using="fixed_window", quota=per_hour(n), store=store).limit
        for p, n in PLAN_RATES.items()
    }
    plans = plan_of()

    def run(keys: list[str]) -> int:
        return sum(1 for key in keys if not throttles[plans[key]](key).limited)

    return run


def contestants() -> tuple[list[Contestant], list[str]]:
    """Everyone installed, and a note per peer that is not."""
    out = [
        Contestant("rate", 'Limiter.hit(key, "10000/hour"): one limit for all', rk_rate),
        Contestant("plan", 'Limiter.hit(key, "plan:api"), Quotas cached', rk_plan),
        Contestant("dict", "Limiter.hit(key, RATES[plan_of[key]])", rk_dict),
    ]
    missing = []
    peers = [
        ("limits", "limits", "FixedWindowRateLimiter.hit(ITEMS[plan_of[key]], key)", False),
        ("limits+stats", "limits", "... + get_window_stats (remaining)", True),
    ]
    for name, module, detail, stats in peers:
        try:
            __import__(module)
        except ImportError:
            missing.append(f"{name}: not installed")
            continue
        out.append(Contestant(name, detail, limits_dict(stats)))
    try:
        __import__("throttled")
        out.append(Contestant("throttled-py", "THROTTLES[plan_of[key]].limit(key)", throttled_dict))
    except ImportError:
        missing.append("throttled-py: not installed")
    return out, missing


def measure(group: list[Contestant], keys: list[str], rounds: int) -> list[list[float]]:
    """Each contestant's seconds per round, in interleaved rounds."""
    runs = [c.build() for c in group]
    for run in runs:  # warm-up: every tenant once (the plan cache fills here)
        run(sorted(set(keys)))
    times: list[list[float]] = [[] for _ in group]
    for r in range(rounds):
        order = list(range(len(group)))
        order = order[r % len(order) :] + order[: r % len(order)]
        for i in order:
            gc.collect()
            start = time.process_time()
            admitted = runs[i](keys)
            times[i].append(time.process_time() - start)
            if admitted != len(keys):
                raise SystemExit(f"{group[i].name} admitted {admitted} of {len(keys)}")
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    args = parser.parse_args(argv)
    calls, rounds = (5_000, 3) if args.quick else (args.calls, args.rounds)
    rng = random.Random(42)
    names = list(plan_of())
    keys = [rng.choice(names) for _ in range(calls)]
    group, missing = contestants()
    times = measure(group, keys, rounds)
    ns = {c.name: statistics.median(t) / calls * 1e9 for c, t in zip(group, times, strict=True)}
    print(f"# plan lookups per decision, memory store ({platform.python_version()}, {calls:,}")
    print(f"# calls x {rounds} rounds, median round, process CPU time)\n")
    print("| contestant | call | ns/decision | decisions/s |")
    print("|---|---|---:|---:|")
    for c in sorted(group, key=lambda c: ns[c.name]):
        print(f"| {c.name} | `{c.detail}` | {ns[c.name]:,.0f} | {1e9 / ns[c.name]:,.0f} |")
    for note in missing:
        print(f"\n{note}")
    lookups = sum(q.stats()["lookups"] for q in QUOTAS)
    print(f"\nplan source asked {lookups:,} times for {len(set(keys)):,} tenants")
    print(f"plan adds {ns['plan'] - ns['rate']:+,.0f} ns per decision to rate")
    print(f"plan adds {ns['plan'] - ns['dict']:+,.0f} ns per decision to dict")
    peers = [n for n in ns if n not in ("rate", "plan", "dict")]
    if peers:
        best = min(peers, key=lambda n: ns[n])
        print(f"plan vs fastest peer ({best}): {ns[best] / ns['plan']:.2f}x its decisions/s")
    return 0 if lookups == len(set(keys)) else 1


if __name__ == "__main__":
    sys.exit(main())
