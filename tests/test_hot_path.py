"""The hot path's shortcuts build exactly what the plain constructors and general paths build.

``make_decision``/``make_plan``/``new_outcome`` skip the frozen ``__init__``s for speed, and
``MemoryStore.execute`` takes a shortcut for one-rate hits; each must be indistinguishable from
the slow way.
"""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Any

import pytest

from ratekeeper import Decision, Limiter, ManualClock, MemoryStore, Rate
from ratekeeper.algorithms import ALGORITHMS, Limit, Outcome
from ratekeeper.algorithms.base import new_outcome
from ratekeeper.decision import make_decision
from ratekeeper.plan import Plan, make_plan, make_policy


def test_make_decision_is_a_frozen_decision_equal_to_the_constructed_one() -> None:
    rate = Rate(5, 60.0)
    args = (False, 5, 0, 1_700_000_060.0, 12.5, rate, (rate,), 1_700_000_047.5)
    fast, slow = make_decision(*args), Decision(*args)
    assert type(fast) is Decision
    assert fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
    assert fast.headers() == slow.headers()
    assert dataclasses.asdict(fast) == dataclasses.asdict(slow)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.allowed = True  # type: ignore[misc]  # the point: it must refuse
    assert make_decision(*args, degraded=True) == Decision(*args, degraded=True)
    assert make_decision(*args, degraded=True) != slow


def test_make_plan_is_a_frozen_plan_equal_to_the_constructed_one() -> None:
    policy = make_policy("2/second; 100/minute", "sliding_window", None, 2)
    fast = make_plan("hit", policy, "user:1", 1_700_000_000_000, 3)
    slow = Plan("hit", policy, "user:1", 1_700_000_000_000, 3)
    assert type(fast) is Plan and fast == slow and repr(fast) == repr(slow)
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.cost = 1  # type: ignore[misc]  # the point: it must refuse


def test_new_outcome_is_an_outcome() -> None:
    out = new_outcome((False, 0, 1_000, math.inf))
    assert type(out) is Outcome and out == Outcome(False, 0, 1_000, math.inf)
    assert (out.allowed, out.remaining, out.reset_ms, out.retry_ms) == (False, 0, 1_000, math.inf)


def test_limit_capacity_is_burst_when_set_else_count_and_not_part_of_equality() -> None:
    rate = Rate(10, 1.0)
    assert Limit(rate, 10, 1000).capacity == 10
    assert Limit(rate, 10, 1000, burst=25).capacity == 25
    assert Limit(rate, 10, 1000) == Limit(rate, 10, 1000)
    assert "capacity" not in repr(Limit(rate, 10, 1000))


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_memory_shortcut_matches_the_general_path(algorithm: str) -> None:
    """One-rate hits go through the shortcut; driving ``_execute`` instead changes nothing."""
    fast, general = MemoryStore(max_keys=3, sweep_every=5), MemoryStore(max_keys=3, sweep_every=5)
    policy = make_policy("3/second", algorithm, None, None)
    now = 1_700_000_000_000
    for i in range(200):
        now += (0, 0, 1, 90, 400, 1_100)[i % 6]
        plan = make_plan("hit", policy, "abacadbeab"[i % 10], now, 1 + i % 3)
        assert fast.execute(plan) == general._execute(plan)
        assert list(fast._data.items()) == list(general._data.items())
    assert len(fast) <= 3


def test_limiter_decisions_are_real_decisions() -> None:
    limiter = Limiter(store=MemoryStore(), clock=ManualClock(1_700_000_000.0))
    for algorithm in sorted(ALGORITHMS):
        d = limiter.hit("k", "1/minute", algorithm=algorithm)
        assert type(d) is Decision and d.allowed and d.remaining == 0
        again = limiter.hit("k", "1/minute", algorithm=algorithm)
        assert type(again) is Decision and not again.allowed and again.retry_after > 0


@pytest.mark.parametrize("seed", range(4))
def test_sliding_window_unrolled_step_matches_the_general_one(seed: int) -> None:
    """``sliding_window.step`` unrolls buckets=1; ``_step_buckets`` is the general code."""
    from ratekeeper.algorithms import sliding_window

    rng = random.Random(seed)
    for count, period_ms in ((1, 1000), (3, 1000), (10, 60_000), (7, 1500)):
        limit = sliding_window.make_limit(Rate(count, period_ms / 1000), {})
        fast_state: Any = None
        slow_state: Any = None
        now = 1_700_000_000_000
        for _ in range(400):
            now += rng.choice((0, 0, 1, 5, period_ms // 4, period_ms // 2, period_ms, -3))
            cost, charge = rng.choice((1, 1, 2, count, count + 1)), rng.random() < 0.9
            fast, fast_state = sliding_window.step(fast_state, limit, now, cost, charge)
            slow, slow_state = sliding_window._step_buckets(slow_state, limit, now, cost, charge)
            assert fast == slow and fast_state == slow_state


def test_fast_builders_set_every_field() -> None:
    """A field added to Decision or Plan must be added to the fast builders too."""
    limiter = Limiter(store=MemoryStore(), clock=ManualClock(1_700_000_000.0))
    rate = Rate(5, 60.0)
    decisions = [
        make_decision(True, 5, 4, 1.0, 0.0, rate, (rate,), 0.5),
        limiter.hit("k", "5/minute"),
        limiter.hit("k", "5/minute; 9/hour", algorithm="gcra", burst=2),
    ]
    for d in decisions:
        assert {f.name: getattr(d, f.name) for f in dataclasses.fields(Decision)}
    policy = make_policy("5/minute", "fixed_window", None, None)
    plans = [
        make_plan("hit", policy, "k", 1, 1),
        limiter._core.plan("hit", "k", "5/minute", "fixed_window", 1, None, None),
    ]
    for p in plans:
        assert {f.name: getattr(p, f.name) for f in dataclasses.fields(Plan)}


class _PlanOnly:
    """A MemoryStore seen only through ``execute``: the limiters cannot take their fast path."""

    def __init__(self) -> None:
        self.inner = MemoryStore()

    def execute(self, plan: Plan) -> tuple[Outcome, ...]:
        return self.inner.execute(plan)

    async def execute_async(self, plan: Plan) -> tuple[Outcome, ...]:
        return self.inner.execute(plan)


class _CountingStore(MemoryStore):
    """A MemoryStore that counts the hits its ``hit_one`` answered for a limiter."""

    direct = 0

    def execute(self, plan: Plan) -> tuple[Outcome, ...]:
        if plan.op == "hit" and len(plan.policy.slots) == 1:
            self.direct -= 1  # execute's own call to hit_one is not a direct one
        return super().execute(plan)

    def hit_one(self, *args: Any) -> Outcome:
        self.direct += 1
        return super().hit_one(*args)


CALLS: list[dict[str, Any]] = [
    {"rate": "5/second"},
    {"rate": "5/second", "algorithm": "gcra", "burst": 2},
    {"rate": "5/second", "algorithm": "token_bucket", "burst": 8},
    {"rate": "5/second", "algorithm": "sliding_window", "buckets": 3},
    {"rate": "5/second", "algorithm": "sliding_window"},
    {"rate": "5/second", "algorithm": "sliding_log"},
    {"rate": "2/second; 7/minute", "algorithm": "token_bucket"},  # a stack: the plan path
    {"rate": Rate.parse("3/second")},
    {"rate": [Rate(4, 1.0)]},  # unhashable: never cached, the plan path every time
]


@pytest.mark.parametrize("seed", range(3))
def test_limiter_fast_path_decides_like_the_plan_path(seed: int) -> None:
    """``Limiter.hit`` on a ``LocalStore`` skips the Plan; every field must come out the same."""
    rng = random.Random(seed)
    clock = ManualClock(1_700_000_000.0)
    counting = _CountingStore(max_keys=50)
    fast, slow = Limiter(store=counting, clock=clock), Limiter(store=_PlanOnly(), clock=clock)
    for _ in range(1500):
        clock.advance(rng.choice((0.0, 0.0, 0.001, 0.05, 0.3, 1.2)))
        call = rng.choice(CALLS)
        key = rng.choice(("a", "b", "ü", "x" * 300))
        cost = rng.choice((1, 1, 1, 2, 5, 9))
        op = rng.choice(("hit", "hit", "hit", "peek", "refund"))
        rate, options = call["rate"], {k: v for k, v in call.items() if k != "rate"}
        a = getattr(fast, op)(key, rate, cost=cost, **options)
        b = getattr(slow, op)(key, rate, cost=cost, **options)
        assert a == b
    assert counting.direct > 500  # the fast path was really taken


def test_async_limiter_takes_the_same_fast_path() -> None:
    import asyncio

    from ratekeeper import AsyncLimiter

    clock = ManualClock(1_700_000_000.0)
    counting = _CountingStore()
    fast, slow = AsyncLimiter(store=counting, clock=clock), Limiter(store=_PlanOnly(), clock=clock)

    async def drive() -> None:
        for i in range(40):
            clock.advance(0.05 * (i % 3))
            assert await fast.hit("k", "5/second", algorithm="gcra") == slow.hit(
                "k", "5/second", algorithm="gcra"
            )

    asyncio.run(drive())
    assert counting.direct == 39  # all but the first call, which built and cached the policy


@pytest.mark.parametrize("bad", [{"cost": -1}, {"cost": 1.0}, {"cost": True}, {"key": ""}])
def test_fast_path_leaves_bad_input_to_the_checks(bad: dict[str, Any]) -> None:
    limiter = Limiter(clock=ManualClock(1_700_000_000.0))
    limiter.hit("k", "5/second")  # the policy is cached: the next call could go fast
    args: dict[str, Any] = {"key": "k", "cost": 1, **bad}
    with pytest.raises(ValueError, match="invalid"):
        limiter.hit(args["key"], "5/second", cost=args["cost"])


@pytest.mark.parametrize(
    ("algorithm", "options"),
    [(name, {}) for name in sorted(ALGORITHMS)]
    + [(name, {"burst": 3}) for name in sorted(ALGORITHMS) if "burst" in ALGORITHMS[name].OPTIONS]
    + [("sliding_window", {"buckets": 4})],
)
def test_an_admitted_charged_step_resets_when_its_state_expires(
    algorithm: str, options: dict[str, int]
) -> None:
    """The contract ``MemoryStore.hit_one`` relies on: ``reset_ms == expires_ms(new_state)``."""
    module = ALGORITHMS[algorithm]
    rng = random.Random(algorithm)
    for count, period_ms in ((1, 1000), (3, 1000), (10, 60_000), (7, 1500), (1000, 3_600_000)):
        limit = module.make_limit(Rate(count, period_ms / 1000), dict(options))
        state: Any = None
        now = 1_700_000_000_000
        admitted = 0
        for _ in range(300):
            # -3 and -period/4: a caller whose clock is behind the last writer's
            now += rng.choice(
                (0, 1, 7, -3, -period_ms // 4, period_ms // 2, period_ms, 3 * period_ms)
            )
            cost = rng.choice((1, 1, 2, 3, count))
            outcome, new = module.step(state, limit, now, cost, True)
            if outcome.allowed:
                admitted += 1
                assert outcome.reset_ms == module.expires_ms(new, limit), (state, now, cost)
                state = new
        assert admitted > 30


@pytest.mark.parametrize("seed", range(2))
def test_decide_with_a_made_policy_decides_like_hit_and_peek(seed: int) -> None:
    """``Limiter.decide(op, key, policy)`` (the service's path: a policy made once) gives the
    decisions ``hit``/``peek`` give, on the in-process shortcut and on the plan path."""
    rng = random.Random(seed)
    clock = ManualClock(1_700_000_000.0)
    counting = _CountingStore(max_keys=50)
    made, named = Limiter(store=counting, clock=clock), Limiter(store=_PlanOnly(), clock=clock)
    calls = [c for c in CALLS if isinstance(c["rate"], str)]
    for _ in range(800):
        clock.advance(rng.choice((0.0, 0.001, 0.05, 0.3, 1.2)))
        call = rng.choice(calls)
        options = {k: v for k, v in call.items() if k != "rate"}
        policy = make_policy(
            call["rate"], options.get("algorithm", "fixed_window"),
            options.get("burst"), options.get("buckets"),
        )  # fmt: skip
        key, cost = rng.choice(("a", "b", "ü")), rng.choice((1, 1, 2, 5))
        op = rng.choice(("hit", "hit", "peek"))
        a = made.decide(op, key, policy, cost)
        assert a == getattr(named, op)(key, call["rate"], cost=cost, **options)
    assert counting.direct > 200
    with pytest.raises(ValueError, match="op 'refund' is invalid"):
        made.decide("refund", "a", make_policy("5/second", "fixed_window", None, None))
