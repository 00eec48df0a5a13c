"""Nested decisions, proven twice: against deciding the levels one by one, and Lua against
Python, on every store.

1. A nested decision equals deciding its levels in order on their own counters, each level
   charged in turn and every charge undone when one rejects (``in_order`` below, on a plain
   ``MemoryStore`` through ``Limiter.hit``): the same verdict, the first level that rejects
   among the levels the nested call names as rejecting, and the same ``Decision`` for every
   level (when rejected, what a peek of each level says: nothing was charged). Random levels
   (1-4, any algorithm, options, own costs), random keys and costs, random clock jumps.
2. No level is charged when another rejects: after a rejected call, every level's counter
   reads as before (peeked on the store under test).
3. Reservations: the Redis stores (both key layouts, sharded, Cluster, a rollout) answer
   random nested calls, reserves, settles, cancels and expiries exactly as the memory store.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ratekeeper import Limiter, ManualClock, MemoryStore
from ratekeeper.nested import Level, Reservation
from tests.nested_stores import NESTED_STORES, REDIS_NESTED_STORES, close, nested_store

ALGORITHMS = ["fixed_window", "token_bucket", "gcra", "sliding_window", "sliding_log"]
RATES = ["2/second", "3/10s", "5/minute", "7/minute; 20/hour", "10/hour", "4/day"]
RESERVE_RATES = ["20/minute", "7/minute; 60/hour", "100/hour", "50/10s", "999/day", "300/hour"]
"""Larger than the estimates mostly, so reservations are admitted and settles move counts."""
OUTERS = ["acme", "beta", "{o}"]
ADVANCE_MS = [0, 0, 1, 250, 999, 1000, 5_000, 30_000, 59_999, 60_000, 3_600_000]
START = 1_700_000_000.0


@dataclass(frozen=True)
class Shape:
    """One level's settings; its key is drawn per call from its own pool."""

    algorithm: str
    rate: str
    options: tuple[tuple[str, Any], ...]
    cost: int | None
    pool: tuple[str, ...]

    def level(self, key: str, debt: int | None = None) -> Level:
        return Level(
            key, self.rate, self.algorithm, cost=self.cost, debt=debt, **dict(self.options)
        )


@st.composite
def shapes(draw: st.DrawFn, rates: list[str] = RATES) -> list[Shape]:
    out = []
    for index in range(draw(st.integers(1, 4))):
        algorithm = draw(st.sampled_from(ALGORITHMS))
        options: dict[str, Any] = {}
        if algorithm in ("token_bucket", "gcra") and draw(st.booleans()):
            options["burst"] = draw(st.integers(1, 9))
        if algorithm == "sliding_window" and draw(st.booleans()):
            options["buckets"] = draw(st.integers(1, 4))
        if algorithm == "fixed_window" and draw(st.booleans()):
            options["aligned"] = True
        cost = draw(st.one_of(st.none(), st.integers(1, 3))) if index else None
        pool = tuple(OUTERS) if index == 0 else (f"u{index}:1", "ключ }{", "acme")
        out.append(
            Shape(algorithm, draw(st.sampled_from(RATES)), tuple(options.items()), cost, pool)
        )
    return out


def ref_key(levels: list[Level], index: int) -> str:
    """The reference counter's key: the outer key, or (outer, level, key) for a level below
    (the levels are unnamed: each is told apart by its place)."""
    return levels[0].key if index == 0 else f"§{levels[0].key}§{index}§{levels[index].key}"


def in_order(ref: Limiter, levels: list[Level], cost: int) -> tuple[bool, list[Any]]:
    """Decide the levels one by one, each charged in turn; when one rejects, undo every
    charge (the reference store's entries put back exactly). The verdict and the decisions."""
    store: MemoryStore = ref.store  # type: ignore[assignment]
    saved: dict[Any, Any] = {}
    out = []
    for index, level in enumerate(levels):
        key = ref_key(levels, index)
        policy = ref._core.policy(
            level.rate, level.algorithm, level.burst, level.buckets, level.aligned
        )
        for slot in policy.slots:
            saved.setdefault((slot, key), store._data.get((slot, key)))
        own = cost if level.cost is None else level.cost
        kwargs = dict(
            algorithm=level.algorithm,
            burst=level.burst,
            buckets=level.buckets,
            aligned=level.aligned,
        )
        if own == 0:
            d = ref.peek(key, level.rate, cost=0, **kwargs)
        else:
            d = ref.hit(key, level.rate, cost=own, **kwargs)
        out.append(d)
        if not d.allowed:
            for k, entry in saved.items():
                if entry is None:
                    store._data.pop(k, None)
                else:
                    store._data[k] = entry
            return False, out
    return True, out


def looks(ref: Limiter, levels: list[Level], cost: int) -> list[Any]:
    """What a peek of each level's cost says on the reference (nothing charged)."""
    out = []
    for index, level in enumerate(levels):
        own = cost if level.cost is None else level.cost
        out.append(
            ref.peek(
                ref_key(levels, index), level.rate, algorithm=level.algorithm, cost=own,
                burst=level.burst, buckets=level.buckets, aligned=level.aligned,
            )
        )  # fmt: skip
    return out


@pytest.mark.parametrize("kind", NESTED_STORES)
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_a_nested_decision_is_the_levels_in_order_with_refunds(
    kind: str, request: pytest.FixtureRequest, data: st.DataObject
) -> None:
    shape = data.draw(shapes())
    store = nested_store(kind, request)
    clock = ManualClock(START)
    limiter = Limiter(store, clock=clock, fail_open=False)
    ref = Limiter(MemoryStore(), clock=clock, fail_open=False)
    try:
        for _ in range(data.draw(st.integers(5, 40))):
            clock.advance(data.draw(st.sampled_from(ADVANCE_MS)) / 1000)
            levels = [s.level(data.draw(st.sampled_from(s.pool))) for s in shape]
            cost = data.draw(st.sampled_from([1, 1, 1, 2, 3, 6]))
            got = limiter.nested(levels, cost=cost)  # the same key twice: two levels, two counters
            seen = looks(ref, levels, cost)
            allowed, want = in_order(ref, levels, cost)
            assert got.allowed == allowed == all(d.allowed for d in seen)
            if allowed:
                assert list(got.levels) == want
                continue
            assert list(got.levels) == seen  # every level decided, none charged
            rejecting = [i for i, d in enumerate(seen) if not d.allowed]
            assert rejecting[0] == len(want) - 1  # in order, the first rejecting level stops
            assert got.rejected_by in rejecting
            assert got.retry_after == max(seen[i].retry_after for i in rejecting)
            probe = [replace(lv, cost=0) for lv in levels]  # a look at every level
            assert list(limiter.nested(probe, cost=0).levels) == looks(ref, probe, 0)
    finally:
        close(store)


@dataclass(frozen=True)
class Step:
    kind: str  # nested | reserve | settle | cancel
    advance_ms: int
    keys: tuple[int, ...]
    amount: int
    actual: int
    pick: int
    ttl: float


steps = st.builds(
    Step,
    kind=st.sampled_from(["nested", "reserve", "reserve", "settle", "settle", "settle", "cancel"]),
    advance_ms=st.sampled_from([0, 0, 0, 10, 500, 1_000, 4_000, 15_000, 61_000]),
    keys=st.tuples(st.integers(0, 2), st.integers(0, 2), st.integers(0, 2), st.integers(0, 2)),
    amount=st.sampled_from([0, 1, 2, 5, 8, 13, 20]),
    actual=st.sampled_from([0, 1, 3, 8, 21, 40, 120]),
    pick=st.integers(0, 30),
    ttl=st.sampled_from([1.0, 5.0, 30.0, 300.0, 300.0]),
)


@pytest.mark.parametrize("kind", REDIS_NESTED_STORES)
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    shape=shapes(RESERVE_RATES),
    sequence=st.lists(steps, min_size=5, max_size=50),
    debt=st.sampled_from([None, 0, 3, 50]),
)
def test_reservations_on_redis_decide_exactly_like_memory(
    kind: str,
    request: pytest.FixtureRequest,
    shape: list[Shape],
    sequence: list[Step],
    debt: int | None,
) -> None:
    store = nested_store(kind, request)
    clock = ManualClock(START)
    memory = Limiter(MemoryStore(), clock=clock, fail_open=False)
    remote = Limiter(store, clock=clock, fail_open=False)
    held: list[tuple[Reservation, Reservation, list[Level]]] = []

    def same_counts(levels: list[Level]) -> None:
        """Every level's counter reads the same on both stores (a look: cost 0)."""
        probe = [replace(lv, cost=0) for lv in levels]
        assert remote.nested(probe, cost=0) == memory.nested(probe, cost=0)

    try:
        for step in sequence:
            clock.advance(step.advance_ms / 1000)
            levels = [
                s.level(s.pool[k % len(s.pool)], debt)
                for s, k in zip(shape, step.keys, strict=False)
            ]
            if step.kind == "nested":
                got_d = remote.nested(levels, cost=step.amount)
                assert got_d == memory.nested(levels, cost=step.amount)
            elif step.kind == "reserve":
                want = memory.reserve(levels, step.amount, ttl=step.ttl)
                got = remote.reserve(levels, step.amount, ttl=step.ttl)
                assert got.decision == want.decision, step
                if want.allowed:
                    held.append((want, got, levels))
            elif held:
                want_r, got_r, levels = held[step.pick % len(held)]
                if step.kind == "settle":
                    assert remote.settle(got_r, step.actual) == memory.settle(want_r, step.actual)
                else:
                    assert remote.cancel(got_r) == memory.cancel(want_r)
                same_counts(levels)  # exact after every settle
        for index, s in enumerate(shape):  # every counter ends where the memory store's does
            for key in s.pool:
                # at its own place (an unnamed level is known by it), under the first outer key
                levels = [t.level(key if i == index else t.pool[0]) for i, t in enumerate(shape)]
                same_counts(levels[: index + 1])
    finally:
        close(store)
