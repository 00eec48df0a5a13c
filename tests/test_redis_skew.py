"""Two app servers whose clocks differ by 2 s share one key on one Redis.

For every algorithm: ``reset_at`` never wobbles (it is read from stored state, so the answers
of both servers, in true-time order, never move it backwards), and over-admission stays within
the bound documented in docs/redis.md ("Clock skew").
"""

from __future__ import annotations

import math

import pytest

from ratekeeper import Limiter, ManualClock, RedisStore

SKEW = 2.0
LIMIT, PERIOD = 30, 60.0
TRUE_SPAN = 600.0  # ten periods of true time
STEP = 0.25


def bound(algorithm: str) -> int:
    """The most a pair of servers skewed by SKEW may admit over TRUE_SPAN (docs/redis.md)."""
    rate = LIMIT / PERIOD
    if algorithm in ("token_bucket", "gcra"):  # capacity + rate x (span + skew), once
        return math.floor(LIMIT + rate * (TRUE_SPAN + SKEW))
    if algorithm == "sliding_window":  # the oldest bucket weighs skew/period less
        return math.floor((LIMIT * (TRUE_SPAN / PERIOD + 1)) * (1 + SKEW / PERIOD))
    # fixed_window, sliding_log: every reader counts all of the last (period - skew) true seconds
    return LIMIT * math.ceil(TRUE_SPAN / (PERIOD - SKEW) + 1)


@pytest.mark.parametrize(
    "algorithm", ["fixed_window", "token_bucket", "gcra", "sliding_window", "sliding_log"]
)
def test_two_clocks_two_seconds_apart(redis_url: str, algorithm: str) -> None:
    behind = ManualClock(1_700_000_000.0)
    ahead = ManualClock(1_700_000_000.0 + SKEW)
    store = RedisStore(redis_url, socket_timeout=5)
    servers = [Limiter(store, clock=behind, fail_open=False), Limiter(store, clock=ahead)]
    admitted, last_reset, steps = 0, 0.0, int(TRUE_SPAN / STEP)
    for i in range(steps):
        decision = servers[i % 2].hit("shared", f"{LIMIT}/minute", algorithm=algorithm)
        assert not decision.degraded
        admitted += decision.allowed
        # no wobble: whichever clock asks, the reset time never moves backwards
        assert decision.reset_at >= last_reset - 1e-9, (i, decision)
        last_reset = decision.reset_at
        behind.advance(STEP)
        ahead.advance(STEP)
    assert admitted <= bound(algorithm)
    # and the skew does not stop traffic either: at least the limit per period got through
    assert admitted >= LIMIT * int(TRUE_SPAN / PERIOD)


@pytest.mark.parametrize(
    "algorithm", ["fixed_window", "token_bucket", "gcra", "sliding_window", "sliding_log"]
)
def test_skewed_writers_decide_like_the_memory_store(redis_url: str, algorithm: str) -> None:
    # the Lua twins' "clock behind the writer" paths (token_bucket's now <= updated,
    # sliding_window's index behind the stored one, sliding_log's insert before newer entries,
    # gcra's tat ahead) give exactly the Python step's answers
    from ratekeeper import MemoryStore

    behind = ManualClock(1_700_000_000.0)
    ahead = ManualClock(1_700_000_000.0 + SKEW)
    redis_store, memory_store = RedisStore(redis_url, socket_timeout=5), MemoryStore()
    pairs = [
        (Limiter(redis_store, clock=c, fail_open=False), Limiter(memory_store, clock=c))
        for c in (behind, ahead)
    ]
    rate = "5/10s; 12/minute"
    for i in range(int(120 / 0.35)):
        remote, local = pairs[(i * 7 // 3) % 2]
        cost = 1 + (i % 5 == 0)
        assert remote.hit("k", rate, algorithm=algorithm, cost=cost) == local.hit(
            "k", rate, algorithm=algorithm, cost=cost
        ), i
        behind.advance(0.35)
        ahead.advance(0.35)
