"""Reservations on every store: each algorithm's settle as documented, expiry, once-only
settles, the debt bound, and bad input refused with a clear error."""

from __future__ import annotations

import math
import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import redis

from ratekeeper import ConfigError, Limiter, ManualClock, MemoryStore, RedisStore
from ratekeeper.nested import Level
from tests.nested_stores import NESTED_STORES, close, nested_store

START = 1_699_999_990.0  # 10 s past a minute of the epoch


@pytest.fixture(params=NESTED_STORES)
def limiter(request: pytest.FixtureRequest) -> Iterator[Limiter]:
    store = nested_store(request.param, request)
    yield Limiter(store, clock=ManualClock(START), fail_open=False)
    close(store)


def clock(limiter: Limiter) -> ManualClock:
    assert isinstance(limiter.clock, ManualClock)
    return limiter.clock


def left(limiter: Limiter, *levels: Level) -> list[int]:
    """Each level's remaining now (a look at cost 0: nothing written)."""
    probe = [replace(lv, cost=0) for lv in levels]
    return [d.remaining for d in limiter.nested(probe, cost=0).levels]


def test_settle_charges_the_difference_on_the_estimate_levels_only(limiter: Limiter) -> None:
    org = Level("org:acme", "1000/hour")
    requests = Level("key:k1", "10/minute", cost=1)  # a request counter: never settled
    tokens = Level("key:k1", "500/hour")
    r = limiter.reserve([org, requests, tokens], 100)
    assert r.allowed and left(limiter, org, requests, tokens) == [900, 9, 400]
    assert limiter.settle(r, 30).status == "settled"
    assert left(limiter, org, requests, tokens) == [970, 9, 470]
    r = limiter.reserve([org, requests, tokens], 100)
    assert limiter.settle(r, 250).status == "settled"  # 150 more than the estimate
    assert left(limiter, org, requests, tokens) == [720, 8, 220]


def test_cancel_gives_the_estimate_back_and_a_reservation_settles_once(limiter: Limiter) -> None:
    org = Level("org", "100/minute")
    r = limiter.reserve([org], 40)
    assert left(limiter, org) == [60]
    assert limiter.cancel(r).status == "settled"
    assert left(limiter, org) == [100]
    assert limiter.settle(r, 10).status == "already_settled"  # after cancel: nothing
    assert limiter.cancel(r).status == "already_settled"
    r = limiter.reserve([org], 40)
    assert limiter.settle(r, 10).status == "settled"
    assert limiter.settle(r, 10).status == "already_settled"  # twice: charged once
    assert limiter.cancel(r).status == "already_settled"  # cancel after settle: nothing
    assert left(limiter, org) == [90]


def test_an_expired_reservation_gives_its_estimate_back(limiter: Limiter) -> None:
    org, user = Level("org", "100/hour"), Level("user:1", "50/hour")
    r = limiter.reserve([org, user], 30, ttl=5)
    assert left(limiter, org, user) == [70, 20]
    clock(limiter).advance(4.999)
    assert left(limiter, org, user) == [70, 20]  # still live
    clock(limiter).advance(0.001)
    assert left(limiter, org, user) == [100, 50]  # expired: given back by this very call
    # a settle after expiry charges the actual cost now: the estimate came back already
    assert limiter.settle(r, 12).status == "expired"
    assert left(limiter, org, user) == [88, 38]
    assert limiter.settle(r, 12).status == "already_settled"


def test_a_keys_expired_reservations_come_back_on_its_first_call(limiter: Limiter) -> None:
    """Issue 36, 4: on the memory store, key b's expired reservation waited behind key a's 40
    (one sweep heap over every key, 32 per call); as on Redis, b's own call gives it back."""
    a, b = Level("a", "100/minute"), Level("b", "10/minute")
    for _ in range(40):
        assert limiter.reserve([a], 1, ttl=1).allowed
    assert limiter.reserve([b], 6, ttl=1).allowed
    clock(limiter).advance(1)
    assert left(limiter, b) == [10]  # b's own first call: its estimate is back
    assert left(limiter, a) == [92]  # a's first call: 32 of its 40 (32 per call)
    assert left(limiter, a) == [100]


def test_a_crashed_process_leaks_nothing(limiter: Limiter) -> None:
    """Reservations never settled (their process died) come back once they expire."""
    org = Level("org", "10/minute")
    for _ in range(5):
        assert limiter.reserve([org], 2, ttl=1).allowed
    assert not limiter.reserve([org], 1).allowed
    clock(limiter).advance(1)
    assert limiter.reserve([org], 10).allowed


def test_a_forged_or_unknown_reservation_settles_as_an_expired_one(limiter: Limiter) -> None:
    org = Level("org", "100/minute", debt=5)
    r = limiter.reserve([org], 10)
    forged = replace(r, id="not-a-reservation")
    assert limiter.settle(forged, 7).status == "expired"  # charged, like a late settle
    assert left(limiter, org) == [83]
    assert limiter.settle(forged, 7).status == "already_settled"
    huge = replace(r, id="another")
    assert limiter.settle(huge, 10**12).status == "expired"
    assert left(limiter, org) == [0]  # at most the debt past the limit: 105 used
    assert limiter.nested([replace(org, debt=None)], cost=0).retry_after > 0
    assert limiter.cancel(replace(r, id="third")).status == "expired"  # nothing to give back


def test_concurrent_settles_of_one_reservation_settle_it_once(limiter: Limiter) -> None:
    org = Level("org", "1000/minute")
    r = limiter.reserve([org], 100)
    statuses: list[str] = []
    lock = threading.Lock()

    def settle() -> None:
        status = limiter.settle(r, 30).status
        with lock:
            statuses.append(status)

    threads = [threading.Thread(target=settle) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(statuses) == ["already_settled"] * 7 + ["settled"]
    assert left(limiter, org) == [970]


# ---------------------------------------------------------------- each algorithm's settle


def test_fixed_window_settles_into_the_window_it_was_counted_in(limiter: Limiter) -> None:
    """A refund goes back only while the reservation's window is the live one; an extra goes
    into the live window, whichever it is."""
    org = Level("org", "100/minute")
    r = limiter.reserve([org], 30)  # window [10, 70)
    clock(limiter).advance(20)
    limiter.settle(r, 10)
    assert left(limiter, org) == [90]
    late = limiter.reserve([org], 30)
    clock(limiter).advance(45)  # t=75: the window [10, 70) has ended
    assert limiter.nested([replace(org, cost=5)]).allowed  # opens [75, 135)
    assert limiter.settle(late, 0).status == "settled"  # the old window: nothing to refund
    assert left(limiter, org) == [95]
    extra = limiter.reserve([org], 5)
    clock(limiter).advance(70)  # t=145: [75, 135) ended too
    assert limiter.settle(extra, 25).status == "settled"  # 20 more: into a new live window
    assert left(limiter, org) == [80]


def test_token_bucket_settles_into_tokens_and_debt(limiter: Limiter) -> None:
    bucket = Level("org", "60/minute", algorithm="token_bucket", debt=30)
    r = limiter.reserve([bucket], 60)  # empty now
    assert limiter.settle(r, 150).status == "settled"  # 90 more: 30 fit the debt
    d = limiter.nested([bucket], cost=1)
    assert not d.allowed and d.remaining == 0
    assert d.retry_after == pytest.approx(31)  # from -30 tokens back to 1, at 1 a second
    clock(limiter).advance(31)
    assert limiter.nested([bucket], cost=1).allowed
    clock(limiter).advance(60)  # full again
    r = limiter.reserve([replace(bucket, debt=0)], 50)
    clock(limiter).advance(10)  # 10 refilled: 20 left
    limiter.settle(r, 20)  # 30 back: 50, never above the burst of 60
    assert left(limiter, bucket) == [50]


def test_gcra_settles_into_its_arrival_time(limiter: Limiter) -> None:
    g = Level("org", "10/second", algorithm="gcra", debt=5)
    r = limiter.reserve([g], 10)
    limiter.settle(r, 100)  # 90 more: at most 5 past the burst
    d = limiter.nested([g], cost=1)
    assert not d.allowed and d.retry_after == pytest.approx(0.6)  # 15 units of 100 ms - 10 + 1
    clock(limiter).advance(1.5)  # fully idle again: tat = now
    r = limiter.reserve([g], 8)
    limiter.settle(r, 3)  # 5 back: tat moves back 500 ms
    assert left(limiter, g) == [7]


def test_sliding_window_refunds_the_bucket_it_was_counted_in(limiter: Limiter) -> None:
    """A minute in two 30 s buckets: a refund settled after the next bucket began comes out of
    the reservation's bucket, not the newer one's (other requests')."""
    w = Level("org", "100/minute", algorithm="sliding_window", buckets=2, debt=0)
    r = limiter.reserve([w], 40)  # t=10: bucket [0, 30)
    clock(limiter).advance(25)  # t=35: bucket [30, 60)
    assert limiter.nested([replace(w, cost=20)]).allowed
    limiter.settle(r, 10)  # 30 back into [0, 30): 10 + 20 = 30 used
    assert left(limiter, w) == [70]
    limiter.settle(limiter.reserve([w], 1), 500)  # debt 0: the extra stops at the limit
    assert left(limiter, w) == [0]


def test_sliding_log_removes_the_reservations_entries(limiter: Limiter) -> None:
    log = Level("org", "10/minute", algorithm="sliding_log", debt=2)
    r = limiter.reserve([log], 6)
    clock(limiter).advance(1)
    assert limiter.nested([replace(log, cost=2)]).allowed
    limiter.settle(r, 1)  # 5 of the 6 entries stamped at the reserve go
    assert left(limiter, log) == [7]
    limiter.settle(limiter.reserve([log], 1), 40)  # 12 in the window at most: 10 + 2 debt
    clock(limiter).advance(59)  # t=70: the entry of t=10 left the window, 11 of t=11 remain
    assert left(limiter, log) == [0]
    clock(limiter).advance(1.001)
    assert left(limiter, log) == [10]


@pytest.mark.parametrize(
    "algorithm", ["fixed_window", "token_bucket", "gcra", "sliding_window", "sliding_log"]
)
def test_an_extra_takes_a_level_past_its_limit_by_its_debt_at_most(
    limiter: Limiter, algorithm: str
) -> None:
    """20/hour with a debt of 7: an extra of 100 leaves 27 used (the rest is forgiven). Seen
    from outside: 7 units given back bring the level exactly to its limit."""
    level = Level("org", "20/hour", algorithm=algorithm, debt=7)
    seven = limiter.reserve([level], 7)
    r = limiter.reserve([level], 0)
    assert limiter.settle(r, 100).status == "settled"
    assert not limiter.nested([level], cost=0).allowed  # over the limit: in debt
    assert not limiter.reserve([level], 0).allowed  # no new work until it is paid
    limiter.settle(seven, 0)  # 7 back
    d = limiter.nested([level], cost=0)
    assert d.allowed and d.remaining == 0  # exactly at the limit: 27 - 7 = 20


# ---------------------------------------------------------------- bad input


BAD_AMOUNTS = [-1, 1.5, math.nan, math.inf, True, "3", None, 10**12 + 1]


@pytest.mark.parametrize("value", BAD_AMOUNTS)
def test_bad_estimates_and_actual_costs_are_refused(value: Any) -> None:
    limiter = Limiter(clock=ManualClock(START))
    with pytest.raises(ConfigError, match="estimate="):
        limiter.reserve([Level("a", "1/s")], value)
    r = limiter.reserve([Level("a", "10/s")], 1)
    with pytest.raises(ConfigError, match="actual="):
        limiter.settle(r, value)
    assert limiter.settle(r, 1).status == "settled"  # nothing was lost


@pytest.mark.parametrize("ttl", [0, -1, 0.0001, math.nan, math.inf, 86_401, "5", True])
def test_bad_ttls_are_refused(ttl: Any) -> None:
    with pytest.raises(ConfigError, match="ttl="):
        Limiter().reserve([Level("a", "1/s")], 1, ttl=ttl)


def test_a_rejected_or_foreign_reservation_cannot_be_settled() -> None:
    limiter = Limiter(clock=ManualClock(START))
    r = limiter.reserve([Level("a", "1/minute")], 5)  # more than the limit
    assert not r.allowed
    with pytest.raises(ConfigError, match="was not admitted"):
        limiter.settle(r, 1)
    with pytest.raises(ConfigError, match="not a Reservation"):
        limiter.settle("r-123", 1)  # type: ignore[arg-type]


def test_a_keys_reservations_are_forgotten_when_redis_would_drop_them(redis_url: str) -> None:
    """The memory store keeps an outer key's reservations exactly as long as ``nested.lua``
    keeps R and Z (bounded memory, and the same decisions): the book's time equals the
    keys' TTL after each reserve and settle, and past it the book is gone whole."""
    org = Level("org", "10/minute")
    memory_store = MemoryStore()
    memory = Limiter(memory_store, clock=ManualClock(START))
    remote = Limiter(RedisStore(redis_url, socket_timeout=5), clock=ManualClock(START))
    client = redis.Redis.from_url(redis_url)

    def lives() -> tuple[int, int]:
        book = memory_store._nested.books["org"]
        return book.expires_ms - round(clock(memory)() * 1000), client.pttl("rk{org}>R")

    reservations = []
    for ttl in (5.0, 200.0, 1.0):
        reservations.append((memory.reserve([org], 1, ttl=ttl), remote.reserve([org], 1, ttl=ttl)))
        book_ms, redis_ms = lives()
        assert 0 <= book_ms - redis_ms < 2_000, (ttl, book_ms, redis_ms)  # Redis' clock ran on
    for clocked in (memory, remote):
        clock(clocked).advance(100)
    mine, theirs = reservations[1]
    assert memory.settle(mine, 1) == remote.settle(theirs, 1)
    book_ms, redis_ms = lives()
    assert 0 <= book_ms - redis_ms < 2_000
    clock(memory).advance(book_ms / 1000)
    memory.nested([Level("elsewhere", "1/minute")], cost=0)
    assert "org" not in memory_store._nested.books and len(memory_store._nested) == 0
