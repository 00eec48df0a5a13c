"""The Lua twins decide exactly like the pure Python steps (the memory store), on every store.

A hypothesis property drives a ``MemoryStore`` limiter and a limiter on each Redis store
(``RedisStore``, ``ShardedRedisStore`` over two primaries, ``RedisClusterStore``; real
servers) with the same random sequence of (clock advance, key, cost, operation) for a random
algorithm, options and single or stacked rates, sharing one ``ManualClock``, and requires
identical decisions: allowed, remaining, reset_at, retry_after, deciding rate.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest
import redis
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st

from ratekeeper import Limiter, ManualClock, MemoryStore, RedisStore
from tests.conftest import Backend

RATES = ["1/second", "3/second", "5/10s", "7/minute", "10/minute", "100/hour", "2/day"]
STACKS = [*RATES, "3/second; 10/minute", "5/10s; 7/minute; 100/hour", "1/second; 2/day"]
KEYS = ["a", "b", "user:42", "ключ {x}", "}{", "#h", "%7B", "k" * 300]
ADVANCE_MS = [0, 1, 7, 250, 999, 1000, 1001, 5_000, 59_999, 60_000, 3_600_000, 90_000_000]
STARTS = [1_700_000_000.0, 12.345, 9_999_999_900.0]  # the last crosses 10**13 ms


@dataclass(frozen=True)
class Step:
    advance_ms: int
    key: str
    cost: int
    op: str


steps = st.builds(
    Step,
    advance_ms=st.one_of(
        st.just(0),
        st.integers(0, 60),
        st.sampled_from(ADVANCE_MS),
        st.integers(0, 2_000),
        st.integers(0, 200_000),
    ),
    key=st.one_of(st.just(KEYS[0]), st.sampled_from(KEYS)),
    cost=st.sampled_from([1, 1, 1, 1, 1, 2, 3, 5, 12]),
    op=st.sampled_from(["hit", "hit", "hit", "peek", "peek0", "refund", "reset"]),
)
"""``peek0`` is a peek of cost 0 (whether the key is within its limit)."""


ALGORITHMS = ["fixed_window", "token_bucket", "gcra", "sliding_window", "sliding_log"]


@st.composite
def scenarios(draw: st.DrawFn, algorithm: str) -> tuple[str, dict[str, int], float, list[Step]]:
    options: dict[str, int] = {}  # bool options are ints too
    if algorithm in ("token_bucket", "gcra") and draw(st.booleans()):
        options["burst"] = draw(st.integers(1, 12))
    if algorithm == "sliding_window" and draw(st.booleans()):
        options["buckets"] = draw(st.integers(1, 6))
    if algorithm == "fixed_window":  # envoyproxy/ratelimit's counting, as Envoy domains use
        for name in ("aligned", "count_rejected"):
            if draw(st.booleans()):
                options[name] = True
    # gcra works in epoch microseconds, which leave the exact range of a double after 2255
    start = draw(st.sampled_from(STARTS[:2] if algorithm == "gcra" else STARTS))
    return (
        draw(st.sampled_from(STACKS)),
        options,
        start,
        draw(st.lists(steps, min_size=10, max_size=60)),
    )


TTL_SLACK = 1.0
"""Seconds every Lua state outlives the moment it stops mattering (``ttl``: what remains + 1 s,
at least 1 s). Redis expires keys on its own clock, which a test's ``ManualClock`` does not
move: an example that took this long in real time may have lost a key the model still holds."""


def same_or_outran_ttl(got: object, want: object, started: float) -> bool:
    """True when ``got == want``; a difference once the example has run ``TTL_SLACK`` in real
    time (a loaded machine) is Redis' expiry, not the code under test: the example is
    discarded. On an idle machine an example takes milliseconds, so a real difference fails."""
    if got != want and time.monotonic() - started >= TTL_SLACK:
        reject()
    return got == want


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_redis_decides_exactly_like_memory(
    redis_backend: Backend, algorithm: str, data: st.DataObject
) -> None:
    rate, options, start, sequence = data.draw(scenarios(algorithm))
    redis_backend.flush()
    clock = ManualClock(start)
    memory = Limiter(MemoryStore(), clock=clock, fail_open=False)
    remote = Limiter(redis_backend.store, clock=clock, fail_open=False)
    started = time.monotonic()
    for step in sequence:
        clock.advance(step.advance_ms / 1000)
        if step.op in ("refund", "reset"):
            kwargs = {} if step.op == "reset" else {"cost": step.cost}
            getattr(memory, step.op)(step.key, rate, algorithm=algorithm, **kwargs, **options)
            getattr(remote, step.op)(step.key, rate, algorithm=algorithm, **kwargs, **options)
            continue
        op, cost = ("peek", 0) if step.op == "peek0" else (step.op, step.cost)
        want = getattr(memory, op)(step.key, rate, algorithm=algorithm, cost=cost, **options)
        got = getattr(remote, op)(step.key, rate, algorithm=algorithm, cost=cost, **options)
        assert same_or_outran_ttl(got, want, started), (got, want, step, algorithm, rate, options)


def test_peek_writes_nothing_and_runs_on_a_replica(
    primary_replica: tuple[object, object],
) -> None:
    primary, replica = primary_replica
    clock = ManualClock()
    writer = Limiter(RedisStore(primary.url, socket_timeout=5), clock=clock, fail_open=False)  # type: ignore[attr-defined]
    reader = Limiter(RedisStore(replica.url, socket_timeout=5), clock=clock, fail_open=False)  # type: ignore[attr-defined]
    primary_client = redis.Redis.from_url(primary.url)  # type: ignore[attr-defined]
    for algorithm in ("fixed_window", "token_bucket", "gcra", "sliding_window", "sliding_log"):
        writer.hit("k", "5/minute", algorithm=algorithm, cost=2)
        primary_client.wait(1, 2000)
        want = writer.peek("k", "5/minute", algorithm=algorithm)
        assert reader.peek("k", "5/minute", algorithm=algorithm) == want
        assert want.remaining == 3
    before = {k: primary_client.dump(k) for k in primary_client.scan_iter()}
    clock.advance(30)
    for algorithm in ("fixed_window", "token_bucket", "gcra", "sliding_window", "sliding_log"):
        writer.peek("k", "5/minute", algorithm=algorithm)
    assert {k: primary_client.dump(k) for k in primary_client.scan_iter()} == before


BIG_RATES = ["1000/minute", "150000/hour", "922340/day", "5/second; 1000000/hour"]
"""Counts past 99 and up to the integer encoding's edge (922336): the values of 16 to 20
digits the fixed window's Lua fast path reads apart, and the plain saves past its edge."""
big_steps = st.builds(
    Step,
    advance_ms=st.one_of(st.just(0), st.integers(0, 2_000), st.sampled_from(ADVANCE_MS)),
    key=st.sampled_from(KEYS[:3]),
    cost=st.sampled_from([1, 7, 99, 100, 901, 12_345, 100_000, 400_000, 922_336]),
    op=st.sampled_from(["hit", "hit", "hit", "hit", "peek", "refund"]),
)


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    rate=st.sampled_from(BIG_RATES),
    aligned=st.booleans(),
    count_rejected=st.booleans(),
    start=st.sampled_from(STARTS),
    sequence=st.lists(big_steps, min_size=10, max_size=60),
)
def test_fixed_window_with_large_counts_decides_like_memory(
    redis_backend: Backend,
    rate: str,
    aligned: bool,
    count_rejected: bool,
    start: float,
    sequence: list[Step],
) -> None:
    redis_backend.flush()
    clock = ManualClock(start)
    memory = Limiter(MemoryStore(), clock=clock, fail_open=False)
    remote = Limiter(redis_backend.store, clock=clock, fail_open=False)
    options = {"aligned": aligned, "count_rejected": count_rejected}
    started = time.monotonic()
    for step in sequence:
        clock.advance(step.advance_ms / 1000)
        if step.op == "refund":
            memory.refund(step.key, rate, cost=step.cost, **options)
            remote.refund(step.key, rate, cost=step.cost, **options)
            continue
        want = getattr(memory, step.op)(step.key, rate, cost=step.cost, **options)
        got = getattr(remote, step.op)(step.key, rate, cost=step.cost, **options)
        assert same_or_outran_ttl(got, want, started), (got, want, step, rate, options)
