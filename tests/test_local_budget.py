"""``LocalBudget`` on every store, in one process: limiters sharing a store as processes would.

Several ``LocalBudget``s over one backend (each its own "process": its own slices and
heartbeat), driven with random traffic on a ``ManualClock``: together they never admit more
than the limit (fixed windows: per window, as the decisions' ``reset_at`` names it; buckets:
replayed through one exact bucket), sync and async; unspent slices go back at ``close`` and
when idle; what a slice's size follows; refunds, peeks and resets; config errors.
"""

from __future__ import annotations

import asyncio
import math
import random
import threading
from collections import Counter
from typing import Any

import pytest

from ratekeeper import AsyncLimiter, Decision, Limiter, LocalBudget, ManualClock, MemoryStore
from ratekeeper.metrics import Metrics
from ratekeeper.metrics.prometheus import MetricsCollector
from tests.conftest import Backend

START = 1_700_000_000.0
RATE = "50/second"
SLICED = ["fixed_window", "token_bucket", "gcra"]


def check_within(decisions: list[Decision], algorithm: str, burst: int | None) -> int:
    """What was admitted never exceeds the limit (see the module); returns how many were."""
    admitted = [d for d in decisions if d.allowed]
    if not admitted:
        return 0
    rate = admitted[0].rate
    if algorithm == "fixed_window":
        per_window = Counter(round(d.reset_at * 1000) for d in admitted)
        assert max(per_window.values()) <= rate.count, per_window.most_common(3)
        return len(admitted)
    full = (burst or rate.count) * rate.period_ms
    level, last = full, None
    for d in sorted(admitted, key=lambda d: d.now):
        t = round(d.now * 1000)
        if last is not None:
            level = min(full, level + (t - last) * rate.count)
        last = t
        level -= rate.period_ms
        assert level >= 0, (t, level)
    return len(admitted)


STEPS = [0, 0, 0, 0.001, 0.003, 0.02, 0.2, 1.0]


def traffic(seed: int, n: int, budgets: int) -> list[tuple[float, int, str]]:
    rng = random.Random(seed)
    keys = ["hot", "hot", "hot", "cold"]
    return [(rng.choice(STEPS), rng.randrange(budgets), rng.choice(keys)) for _ in range(n)]


def burst_of(algorithm: str, seed: int) -> int | None:
    return None if algorithm == "fixed_window" else random.Random(seed).choice([None, 10])


@pytest.mark.parametrize("algorithm", SLICED)
@pytest.mark.parametrize("seed", range(3))
def test_budgets_together_never_exceed_the_limit(
    backend: Backend, algorithm: str, seed: int
) -> None:
    backend.flush()
    clock = ManualClock(START)
    burst = burst_of(algorithm, seed)
    budgets = [LocalBudget(backend.store, clock=clock) for _ in range(3)]
    limiters = [Limiter(b, clock=clock, fail_open=False) for b in budgets]
    seen: dict[str, list[Decision]] = {"hot": [], "cold": []}
    for advance, who, key in traffic(seed, 3000, 3):
        clock.advance(advance)
        seen[key].append(limiters[who].hit(key, RATE, algorithm=algorithm, burst=burst))
    assert check_within(seen["hot"], algorithm, burst) > 0
    check_within(seen["cold"], algorithm, burst)
    assert [b.stats()["live"] for b in budgets] == [3, 3, 3]


@pytest.mark.parametrize("algorithm", SLICED)
def test_async_budgets_never_exceed_the_limit(backend: Backend, algorithm: str) -> None:
    backend.flush()
    clock = ManualClock(START)
    burst = burst_of(algorithm, 1)

    async def main() -> list[Decision]:
        budgets = [LocalBudget(backend.store, clock=clock) for _ in range(3)]
        limiters = [AsyncLimiter(b, clock=clock, fail_open=False) for b in budgets]
        out: list[Decision] = []
        for advance, who, key in traffic(7, 1500, 3):
            clock.advance(advance)
            if key == "hot":  # a few in flight together, as requests of one event loop
                batch = [
                    limiters[(who + i) % 3].hit("hot", RATE, algorithm=algorithm, burst=burst)
                    for i in range(3)
                ]
                out += await asyncio.gather(*batch)
        for b in budgets:
            await b.aclose()
        return out

    decisions = asyncio.run(main())
    assert check_within(decisions, algorithm, burst) > 0


@pytest.mark.parametrize("seed", range(4))
def test_false_rejections_only_while_others_hold_slices(backend: Backend, seed: int) -> None:
    """Per window: before any rejection, at least limit - (N - 1) x the largest slice."""
    backend.flush()
    clock = ManualClock(START)
    budgets = [LocalBudget(backend.store, clock=clock) for _ in range(3)]
    largest: Counter[int] = Counter()
    for b in budgets:
        take = b.slicer.take

        def record(call: Any, take: Any = take) -> Any:
            taken = take(call)
            largest[taken.expires_ms] = max(largest[taken.expires_ms], taken.granted)
            return taken

        b.slicer.take = record  # type: ignore[method-assign]
    limiters = [Limiter(b, clock=clock, fail_open=False) for b in budgets]
    rng = random.Random(seed)
    first: dict[int, int] = {}  # window end -> admitted before its first rejection
    admitted: Counter[int] = Counter()
    for _ in range(6000):
        clock.advance(rng.choice([0, 0, 0.001, 0.002, 0.05]))
        d = limiters[rng.randrange(3)].hit("k", "200/10s")
        end = round(d.reset_at * 1000)
        if d.allowed:
            admitted[end] += 1
        elif end not in first:
            first[end] = admitted[end]
    assert len(first) >= 5  # windows that ran out
    for end, before in first.items():
        assert before >= 200 - 2 * largest[end], (end, before, largest[end])
        assert admitted[end] <= 200


@pytest.mark.parametrize("algorithm", SLICED)
def test_threads_sharing_one_budget_never_exceed_the_limit(
    backend: Backend, algorithm: str
) -> None:
    """Threads of one process race on its slices (detach, take, install, join) beside
    another process."""
    backend.flush()
    clock = ManualClock(START)
    mine, other = (LocalBudget(backend.store, clock=clock, horizon=0.005) for _ in range(2))
    limiters = [Limiter(mine, clock=clock), Limiter(mine, clock=clock), Limiter(other, clock=clock)]
    out: list[list[Decision]] = [[] for _ in range(6)]

    def run(i: int) -> None:
        rng = random.Random(i)
        for _ in range(1500):
            if i == 0 and rng.random() < 0.05:
                clock.advance(0.01)
            out[i].append(limiters[i % 3].hit("k", RATE, algorithm=algorithm))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert check_within([d for ds in out for d in ds], algorithm, None) > 0


def test_unspent_slices_go_back_at_close(backend: Backend) -> None:
    backend.flush()
    clock = ManualClock(START)
    budgets = [LocalBudget(backend.store, clock=clock) for _ in range(3)]
    limiters = [Limiter(b, clock=clock) for b in budgets]
    admitted = 0
    for i in range(60):  # rising demand: slices grow
        admitted += limiters[i % 3].hit("k", "1000/minute").allowed
        clock.advance(0.001)
    held = sum(b.book.held[next(iter(b.book.held))].unspent for b in budgets)
    assert held > 0
    plain = Limiter(backend.store, clock=clock)
    assert plain.peek("k", "1000/minute").remaining == 1000 - admitted - held
    for b in budgets:
        b.close()
    assert plain.peek("k", "1000/minute").remaining == 1000 - admitted
    assert sum(b.stats()["units_returned"] for b in budgets) == held


def test_idle_slices_go_back_on_the_next_calls(backend: Backend) -> None:
    backend.flush()
    clock = ManualClock(START)
    budget = LocalBudget(backend.store, clock=clock, idle=0.5, heartbeat=0.2)
    limiter = Limiter(budget, clock=clock)
    for _ in range(20):
        limiter.hit("idle", "1000/minute")
        clock.advance(0.001)
    unspent = budget.book.held[("f:1m", "idle")].unspent
    assert unspent > 0
    clock.advance(0.6)
    limiter.hit("other", "1000/minute")  # maintenance is due: the idle slice goes back
    assert budget.stats()["units_returned"] == unspent
    assert Limiter(backend.store, clock=clock).peek("idle", "1000/minute").remaining == 980


def test_maintain_gives_back_without_traffic(backend: Backend) -> None:
    backend.flush()
    clock = ManualClock(START)
    budget = LocalBudget(backend.store, clock=clock, idle=0.5)
    limiter = Limiter(budget, clock=clock)
    for _ in range(20):
        limiter.hit("k", "1000/minute")
        clock.advance(0.001)
    clock.advance(1)
    budget.maintain()
    assert Limiter(backend.store, clock=clock).peek("k", "1000/minute").remaining == 980


def test_a_slice_follows_the_process_rate_and_shrinks_near_the_limit() -> None:
    clock = ManualClock(START)
    budget = LocalBudget(MemoryStore(), clock=clock, horizon=0.05)
    limiter = Limiter(budget, clock=clock)
    sizes = []
    last = 0
    for i in range(10_000):
        if not limiter.hit("k", "10000/hour").allowed:
            break
        taken = budget.stats()["units_taken"]
        if taken != last:
            sizes.append(taken - last)
            last = taken
        clock.advance(0.0005 if i < 5000 else 0.005)  # 2 per ms, then 0.2 per ms
    assert sizes[0] == 1  # no rate known yet: the request alone
    assert max(sizes) >= 80  # ~2 per ms x 50 ms
    assert sizes[-1] < 5  # near the limit: small


def test_a_refund_goes_into_the_slice_and_a_peek_counts_it(backend: Backend) -> None:
    backend.flush()
    clock = ManualClock(START)
    budget = LocalBudget(backend.store, clock=clock)
    limiter = Limiter(budget, clock=clock)
    for _ in range(10):
        limiter.hit("k", "100/minute")
        clock.advance(0.001)
    unspent = budget.book.held[("f:1m", "k")].unspent
    peek = limiter.peek("k", "100/minute")
    assert peek.remaining == 90  # the store's remaining plus this process's unspent slice
    limiter.refund("k", "100/minute", cost=2)
    assert budget.book.held[("f:1m", "k")].unspent == unspent + 2
    assert limiter.peek("k", "100/minute").remaining == 92
    limiter.reset("k", "100/minute")
    assert ("f:1m", "k") not in budget.book.held
    assert Limiter(backend.store, clock=clock).peek("k", "100/minute").remaining == 100


def test_a_rejection_holds_only_costs_that_cannot_fit() -> None:
    clock = ManualClock(START)
    limiter = Limiter(LocalBudget(MemoryStore(), clock=clock), clock=clock)
    never = limiter.hit("k", "100/minute", cost=200)
    assert not never.allowed and never.retry_after == math.inf
    assert limiter.hit("k", "100/minute", cost=100).allowed  # fits: not held by the 200
    held = limiter.hit("k", "100/minute")
    assert not held.allowed and held.retry_after == pytest.approx(60)


def test_limits_not_named_decide_exactly_with_one_call_each(backend: Backend) -> None:
    backend.flush()
    clock = ManualClock(START)
    budget = LocalBudget(backend.store, clock=clock, sliced=["1000/minute"])
    limiter = Limiter(budget, clock=clock)
    plain = Limiter(MemoryStore(), clock=clock)
    for algorithm in ("fixed_window", "sliding_window", "sliding_log", "gcra"):
        for _ in range(7):
            got = limiter.hit("k", "5/minute; 100/hour", algorithm=algorithm)
            assert got == plain.hit("k", "5/minute; 100/hour", algorithm=algorithm)
            got = limiter.hit("j", "5/minute", algorithm=algorithm)
            assert got == plain.hit("j", "5/minute", algorithm=algorithm)
    assert budget.stats()["slices_taken"] == 0
    limiter.hit("k", "1000/minute")
    assert budget.stats()["slices_taken"] == 1


def test_a_named_limit_that_cannot_take_slices_is_logged(
    backend: Backend, caplog: pytest.LogCaptureFixture
) -> None:
    backend.flush()
    budget = LocalBudget(backend.store, sliced=["10/minute"])
    limiter = Limiter(budget)
    for _ in range(3):
        limiter.hit("k", "10/minute", algorithm="sliding_log")
    assert "10/minute with sliding_log cannot take slices" in caplog.text
    assert budget.stats()["unsliced"] == 1
    limiter.hit("k", "10/minute", algorithm="fixed_window", count_rejected=True)
    assert budget.stats()["unsliced"] == 2


def test_a_sliced_function_that_raises_is_logged_and_decides_exactly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(policy: Any) -> bool:
        raise KeyError("oops")

    budget = LocalBudget(MemoryStore(), sliced=broken)
    limiter = Limiter(budget, fail_open=False)
    decisions = [limiter.hit("k", "3/minute") for _ in range(5)]
    assert [d.allowed for d in decisions] == [True] * 3 + [False] * 2
    assert not any(d.degraded for d in decisions)
    assert "sliced=" in caplog.text and "raised" in caplog.text
    assert budget.stats()["unsliced"] == 1 and budget.stats()["slices_taken"] == 0


def test_counters_reach_the_metrics(backend: Backend) -> None:
    backend.flush()
    clock = ManualClock(START)
    metrics = Metrics()
    budgets = [LocalBudget(backend.store, clock=clock, metrics=metrics) for _ in range(2)]
    limiters = [Limiter(b, clock=clock) for b in budgets]
    for i in range(400):
        limiters[i % 2].hit("k", "100/minute")
        limiters[i % 2].hit("j", "10000/minute")  # never spent out: something to give back
        clock.advance(0.001)
    budgets[0].close()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for m in MetricsCollector(metrics).collect()
        for s in m.samples
    }
    taken = sum(b.stats()["slices_taken"] for b in budgets)
    assert samples[("ratekeeper_slices_total", (("event", "taken"),))] == taken
    units = sum(b.stats()["units_taken"] for b in budgets)
    assert samples[("ratekeeper_slice_units_total", (("event", "taken"),))] == units
    assert samples[("ratekeeper_slices_total", (("event", "returned"),))] >= 1
    assert samples[("ratekeeper_false_rejections_total", ())] == sum(
        b.stats()["false_rejections"] for b in budgets
    )
    assert ("ratekeeper_fail_local_decisions_total", (("outcome", "allowed"),)) in samples


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"horizon": 0}, "horizon=0 is invalid"),
        ({"horizon": float("nan")}, "horizon=nan is invalid"),
        ({"idle": -1}, "idle=-1 is invalid"),
        ({"max_slice": 0}, "max_slice=0 is invalid"),
        ({"processes": 0}, "processes=0 is invalid"),
        ({"heartbeat": "1"}, "heartbeat='1' is invalid"),
        ({"sliced": 5}, "sliced=5 is invalid"),
        ({"sliced": ["ten per minute"]}, "rate count 'ten'"),
        ({"max_keys": 0}, "max_keys=0 is invalid"),
        ({"clock": 5}, "clock=5 is not callable"),
        ({"fail_local": "yes"}, "fail_local='yes' is invalid"),
    ],
)
def test_bad_options_are_refused_by_name(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):  # ConfigError, or RateSpecError for a rate
        LocalBudget(MemoryStore(), **options)
