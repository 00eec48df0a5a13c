"""Slices: the pure rules (``algorithms/slices.py``) and their Lua twin decide alike.

The parity property drives a ``MemoryStore`` (the pure steps) and each Redis store (the Lua
twin) with the same random takes (settles, debts, grants, peeks) of three simulated
processes, interleaved with plain peeks (and, for fixed windows, plain hits) of the same keys,
and requires identical answers.
The bucket properties check the point of the reservation: what processes spend from slices
(whenever they spend it) is always what one exact bucket admits.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ratekeeper import CompactLayout, Limiter, ManualClock, MemoryStore, RedisStore
from ratekeeper.algorithms import ALGORITHMS, heartbeat, slices
from ratekeeper.algorithms.slices import SLICED, Ask
from ratekeeper.errors import ConfigError
from ratekeeper.plan import make_policy
from ratekeeper.stores.slice_calls import SliceCall, slicer_for
from tests.conftest import Backend

RATES = ["3/second", "10/minute", "7/10s", "100/hour", "2/day"]
KEYS = ["a", "user:42", "ключ {x}", "#h"]
STARTS = [1_700_000_000.0, 12.345]


@dataclass(frozen=True)
class Step:
    advance_ms: int
    key: str
    op: str
    process: int
    need: int
    want: int
    share: int
    debt: int
    settle: str


steps = st.builds(
    Step,
    advance_ms=st.one_of(st.just(0), st.integers(0, 50), st.integers(0, 3_000)),
    key=st.sampled_from(KEYS),
    op=st.sampled_from(
        ["take", "take", "take", "take", "hit", "peek", "give", "reset", "plain_reset"]
    ),
    process=st.integers(0, 2),
    need=st.sampled_from([0, 1, 1, 1, 2, 5]),
    want=st.integers(0, 40),
    share=st.sampled_from([0, 1, 2, 3, 8]),
    debt=st.sampled_from([0, 0, 0, 1, 3, 50]),
    settle=st.sampled_from(["all", "all", "again", "unknown", "none"]),
)


@pytest.mark.parametrize("algorithm", sorted(SLICED))
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_lua_takes_like_python(redis_backend: Backend, algorithm: str, data: st.DataObject) -> None:
    redis_backend.flush()
    rate = data.draw(st.sampled_from(RATES))
    burst = data.draw(st.one_of(st.none(), st.integers(1, 12)))
    aligned = data.draw(st.booleans()) if algorithm == "fixed_window" else False
    burst = burst if algorithm != "fixed_window" else None
    epoch_ms = data.draw(st.sampled_from([100, 1000, 60_000]))
    sequence = data.draw(st.lists(steps, min_size=10, max_size=50))
    clock = ManualClock(data.draw(st.sampled_from(STARTS)))
    memory = MemoryStore()
    pairs = [(slicer_for(memory), Limiter(memory, clock=clock, fail_open=False))]
    remote = redis_backend.store
    pairs.append((slicer_for(remote), Limiter(remote, clock=clock, fail_open=False)))
    policy = make_policy(rate, algorithm, burst, None, aligned)
    options = {"algorithm": algorithm, "burst": burst, "aligned": aligned}
    grants: dict[tuple[int, str], list[tuple[str, int]]] = {}  # (process, key) -> grants
    ids = iter(range(1, 10**6))
    for step in sequence:
        clock.advance(step.advance_ms / 1000)
        now = int(clock() * 1000 + 0.5)
        if step.op == "plain_reset":  # the state deleted, the reservation kept
            for _, lim in pairs:
                lim.reset(step.key, rate, **options)
            continue
        if step.op in ("hit", "peek"):
            # a plain hit on a sliced bucket ignores the reservation (docs/local_budget.md):
            # only fixed windows mix; the others are peeked
            op = step.op if algorithm == "fixed_window" else "peek"
            answers = [getattr(lim, op)(step.key, rate, **options) for _, lim in pairs]
            assert answers[0] == answers[1], (step, algorithm, rate)
            continue
        mine = grants.setdefault((step.process, step.key), [])
        settles: tuple[tuple[str, int], ...] = ()
        if step.settle == "all" and mine:  # each grant with some spent of it
            settles = tuple((g, step.want % (units + 2)) for g, units in mine)
            mine.clear()
        elif step.settle == "again" and mine:  # settled twice: the second finds nothing
            settles = tuple((g, 0) for g, _ in mine) * 2
        elif step.settle == "unknown":  # a grant the store never saw (a failed call's)
            settles = (("ffff", 0),)
        need = 0 if step.op in ("give", "reset") else step.need
        slice_id = f"{next(ids):x}"
        ask = Ask(need, max(need, step.want), step.share, step.debt, settles, slice_id, epoch_ms)
        if step.op == "reset":  # this process's slices forgotten, the key started over
            ask = ask._replace(reset=True)
            mine.clear()
        call = SliceCall(step.key, policy.slots[0], algorithm, policy.limits[0], now, ask)
        answers = [slicer.take(call) for slicer, _ in pairs]
        assert answers[0] == answers[1], (step, algorithm, rate, ask)
        if answers[0].granted:
            mine.append((slice_id, answers[0].granted))


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    beats=st.lists(
        st.tuples(st.integers(0, 3000), st.integers(0, 3), st.sampled_from([0, 500, 3000])),
        min_size=1,
        max_size=30,
    )
)
def test_heartbeats_count_alike(redis_backend: Backend, beats: list[tuple[int, int, int]]) -> None:
    redis_backend.flush()
    slicers = [slicer_for(MemoryStore()), slicer_for(redis_backend.store)]
    now = 1_700_000_000_000
    for advance, process, ttl in beats:
        now += advance
        expires = now + ttl if ttl else 0
        answers = [s.beat(f"p{process}", now, expires) for s in slicers]
        assert answers[0] == answers[1]


def test_heartbeat_counts_live_processes() -> None:
    members = None
    for process, now in (("a", 0), ("b", 10), ("c", 20)):
        live, members = heartbeat.beat(members, now, process, now + 100)
    assert live == 3
    assert heartbeat.beat(members, 105, "b", 205)[0] == 2  # a's expiry passed
    assert heartbeat.beat(members, 30, "c", 0)[0] == 2  # c leaves


def test_the_worked_timeline_of_a_window() -> None:
    policy = make_policy("10/minute", "fixed_window", None, None)
    limit = policy.limits[0]
    t0 = 1_700_000_000_000

    def take(state: object, pairs: slices.Pairs, t: int, ask: Ask) -> tuple[Any, Any, Any]:
        answer, state, pairs, _ = slices.take("fixed_window", state, pairs, limit, t0 + t, ask)
        return answer, state, pairs

    a, state, pairs = take(None, (), 0, Ask(1, 4, 2, slice_id="a1"))
    assert (a.granted, state[0], a.expires_ms) == (4, 4, t0 + 60_000)
    b, state, pairs = take(state, pairs, 1000, Ask(1, 3, 2, slice_id="b1"))
    assert (b.granted, state[0], b.held) == (3, 7, 7)
    a2, state, pairs = take(state, pairs, 20_000, Ask(1, 5, 2, settles=(("a1", 4),), slice_id="a2"))
    assert (a2.granted, state[0], a2.held) == (1, 8, 4)  # at most half of the 3 left, >= need
    back, state, pairs = take(state, pairs, 59_000, Ask(0, 0, 1, settles=(("b1", 2),)))
    assert (back.returned, state[0], back.remaining) == (1, 7, 3)
    again, state, pairs = take(state, pairs, 59_500, Ask(0, 0, 1, settles=(("b1", 0),)))
    assert (again.returned, state[0]) == (0, 7)  # a settle counts once
    late, state, pairs = take(state, pairs, 60_000, Ask(0, 0, 1, settles=(("a2", 0),)))
    assert late.returned == 0 and late.remaining == 10  # a window's units never reach the next


def _exact_bucket(admissions: list[tuple[int, int]], rate: int, period: int, burst: int) -> None:
    """Replay admissions (time ms, units) through one exact token bucket: it never goes below 0."""
    level, last = burst * period, None
    for t, units in sorted(admissions):
        if last is not None:
            level = min(burst * period, level + (t - last) * rate)
        last = t
        level -= units * period
        assert level >= 0, (t, units, level)


@pytest.mark.parametrize("algorithm", ["token_bucket", "gcra"])
@pytest.mark.parametrize("seed", range(40))
def test_what_slices_admit_an_exact_bucket_admits(algorithm: str, seed: int) -> None:
    """Processes take slices, spend them late or give them back; their admissions, at the
    times they were spent, are always within one exact bucket (the reservation's point)."""
    rng = random.Random(seed)
    count, period = rng.choice([(10, 1000), (5, 1000), (60, 60_000), (3, 100)])
    burst = rng.choice([None, 1, 3, 20])
    policy = make_policy(f"{count}/{period}ms", algorithm, burst, None)
    limit = policy.limits[0]
    epoch = rng.choice([50, 500, 5000])
    state: object = None
    pairs: slices.Pairs = ()
    now = 1_700_000_000_000
    slices_: dict[int, list[Any]] = {}  # process -> [until, id, granted, unspent]
    admitted: list[tuple[int, int]] = []
    for n in range(400):
        now += rng.choice([0, 1, 5, 37, 250, 1200])
        p = rng.randrange(4)
        s = slices_.get(p)
        if s and s[0] > now and s[3] and rng.random() < 0.7:  # spend from the slice
            units = rng.randint(1, s[3])
            s[3] -= units
            admitted.append((now, units))
            continue
        need = rng.choice([1, 1, 2])
        settles = ((s[1], s[2] - s[3]),) if s and s[0] > now else ()
        want, share = rng.randint(need, 30), rng.randint(1, 6)
        ask = Ask(need, want, share, 0, settles, f"{n:x}", epoch)
        answer, state, pairs, changed = slices.take(algorithm, state, pairs, limit, now, ask)
        if changed and slices.expires_ms(algorithm, state, pairs, limit) <= now:
            state, pairs = None, ()  # what a store drops: it must mean the same as no state
        slices_.pop(p, None)
        if answer.granted:
            admitted.append((now, need))
            slices_[p] = [answer.expires_ms, f"{n:x}", answer.granted, answer.granted - need]
    _exact_bucket(admitted, limit.count, limit.period_ms, limit.capacity)


def test_a_full_bucket_slice_keeps_its_tokens_while_the_bucket_would_refill() -> None:
    """The double spend a reservation prevents: slice a full bucket, wait a full refill."""
    policy = make_policy("10/second", "token_bucket", None, None)
    limit, now = policy.limits[0], 1_700_000_000_000
    a, state, pairs, _ = slices.take(
        "token_bucket", None, (), limit, now, Ask(1, 10, 1, slice_id="a")
    )
    assert a.granted == 10
    b, state, pairs, _ = slices.take(
        "token_bucket", state, pairs, limit, now + 999, Ask(1, 10, 1, slice_id="b")
    )
    assert b.granted == 0  # a's 10 are still held: the bucket may not refill past burst - 10
    c, state, pairs, _ = slices.take(
        "token_bucket", state, pairs, limit, now + 999, Ask(0, 0, 1, settles=(("a", 0),))
    )
    assert c.returned == 10 and c.remaining == 10  # given back unspent: the bucket is full


def test_only_three_algorithms_take_slices() -> None:
    assert set(ALGORITHMS) - SLICED == {"sliding_window", "sliding_log"}
    policy = make_policy("10/minute", "sliding_log", None, None)
    with pytest.raises(ValueError, match="cannot be sliced"):
        slices.take("sliding_log", None, (), policy.limits[0], 0, Ask(1, 1, 1))


def test_stores_without_slices_are_refused(redis_url: str) -> None:
    with pytest.raises(ConfigError, match="CompactLayout"):
        slicer_for(RedisStore(redis_url, layout=CompactLayout(64)))
    with pytest.raises(ConfigError, match="cannot hold slices"):
        slicer_for(object())
