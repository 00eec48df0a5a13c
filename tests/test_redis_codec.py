"""The codec's pre-encoded requests (``Codec.packed``) are byte for byte the generic encoding of
the full command, for every algorithm, op, stack shape and caller key; and Redis reads them."""

from __future__ import annotations

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st

from ratekeeper.algorithms import ALGORITHMS
from ratekeeper.clock import ManualClock
from ratekeeper.limiter import _Core
from ratekeeper.plan import Op
from ratekeeper.stores.redis.codec import Codec, outcomes, pack, script

RATES = ["5/minute", "2/second; 100/minute", "10/30s; 500/hour; 9000/day"]
OPS: list[Op] = ["hit", "peek", "refund"]


def core(now: float = 1_800_000_000.123) -> _Core:
    return _Core(ManualClock(now), True, 3, 0.5, 30.0)


@settings(max_examples=300, deadline=None)
@given(
    algorithm=st.sampled_from(sorted(ALGORITHMS)),
    rate=st.sampled_from(RATES),
    op=st.sampled_from(OPS),
    key=st.text(min_size=1, max_size=300),
    cost=st.integers(1, 2**31),
    prefix=st.sampled_from(["rk", "", "é:x"]),
)
def test_packed_is_the_generic_encoding_of_the_command(
    algorithm: str, rate: str, op: Op, key: str, cost: int, prefix: str
) -> None:
    codec = Codec(prefix)
    plan = core().plan(op, key, rate, algorithm, cost, None, None)
    assert codec.packed(plan) == pack(codec.command(plan))
    assert codec.packed(plan) == codec.packed(plan)  # the cached pieces give the same bytes


def test_a_policy_rebuilt_at_the_same_address_gets_its_own_pieces() -> None:
    codec = Codec()
    for rate in ("5/minute", "7/minute", "5/minute"):  # each call builds a fresh Policy
        plan = _Core(ManualClock(1.0), True, 3, 0.5, 30.0).plan(
            "hit", "k", rate, "fixed_window", 1, None, None
        )
        assert codec.packed(plan) == pack(codec.command(plan))


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_redis_answers_packed_requests_like_the_client_does(redis_url: str, algorithm: str) -> None:
    client = redis.Redis.from_url(redis_url)
    client.flushall()
    codec = Codec("pk")
    c = core()
    plans = [
        c.plan("hit", f"u{i % 3}", "2/second; 4/minute", algorithm, 1, None, None) for i in range(9)
    ]
    client.script_load(script(algorithm).source)
    expected = []
    control = Codec("ck")
    for plan in plans:
        expected.append(outcomes(client.execute_command(*control.command(plan))))
    conn = client.connection_pool.get_connection()
    try:
        conn.send_packed_command([b"".join(codec.packed(p) for p in plans)])
        got = [outcomes(conn.read_response()) for _ in plans]
    finally:
        client.connection_pool.release(conn)
    client.close()
    assert got == expected
