"""Fail-local in one process: budgets decide at their share while a real Redis is stopped.

Two ``LocalBudget``s (two "processes") on one private ``redis-server``: with the server
stopped (SIGSTOP: it keeps its data but answers nothing) their decisions are degraded and
each admits at most its share; when it answers again their local admissions are charged
before anything else, so the window does not admit past the limit. Without a live count the
limiter's own fail_open decides. The shares per algorithm, and the seeding, are pure.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from ratekeeper import (
    AsyncLimiter,
    Limiter,
    LocalBudget,
    ManualClock,
    RedisStore,
    Shard,
    ShardedRedisStore,
)
from ratekeeper.algorithms import slices
from ratekeeper.errors import StoreUnavailable
from ratekeeper.plan import make_policy
from ratekeeper.stores.fail_local import seed, share_policy
from ratekeeper.stores.slice_calls import SliceCall
from tests.redis_servers import RedisServer

START = 1_700_000_000.0


def pair(
    server: RedisServer, clock: ManualClock, mono: ManualClock, **options: object
) -> list[Limiter]:
    store = RedisStore(server.url, socket_timeout=0.1)
    budgets = [LocalBudget(store, clock=clock, heartbeat=0.1, **options) for _ in range(2)]  # type: ignore[arg-type]
    return [Limiter(b, clock=clock, monotonic=mono) for b in budgets]


@pytest.mark.parametrize("key_sliced", [True, False])
def test_a_stopped_store_is_decided_at_each_share_and_charged_on_return(
    fresh_redis: RedisServer, key_sliced: bool
) -> None:
    clock, mono = ManualClock(START), ManualClock(0)
    rate = "100/minute"
    sliced = "all" if key_sliced else ["1/second"]
    limiters = pair(fresh_redis, clock, mono, sliced=sliced)
    for lim in limiters * 2:  # both register, then both see two live processes
        lim.hit("warm", rate)
        clock.advance(0.15)
    before = 0
    for i in range(20):
        before += limiters[i % 2].hit("k", rate).allowed
    assert before == 20
    books = [lim.store.book for lim in limiters]  # type: ignore[attr-defined]
    held = sum(h.unspent for book in books for h in book.held.values())
    known = sum(h.remaining // 2 for book in books for h in book.held.values() if h.key == "k")
    fresh_redis.pause()
    try:
        local, from_slices = [0, 0], 0
        for i in range(200):
            d = limiters[i % 2].hit("k", rate)
            if not d.degraded:  # what the slices still held, spent first
                assert d.allowed
                from_slices += 1
            local[i % 2] += d.allowed
            mono.advance(0.01)
    finally:
        fresh_redis.resume()
    assert from_slices == held
    if key_sliced:  # each its share of what it last heard was left, in the store's window
        assert sum(local) == held + known
    else:  # a full share each: the key was unknown to them
        assert local == [50, 50]
    assert before + sum(local) <= 2 * 100  # the slack of the window in which the store went
    assert all(lim.stats()["fail_local"] > 0 for lim in limiters)
    mono.advance(60)  # past the breakers' cool-down
    for lim in limiters:  # each process's first call to the store charges its debts first
        lim.store.maintain()  # type: ignore[attr-defined]
    after = 0
    for i in range(200):
        d = limiters[i % 2].hit("k", rate)
        assert not d.degraded
        after += d.allowed
    # no burst on return: the outage's admissions were charged before anything was decided
    assert after == max(0, 100 - before - sum(local))
    if key_sliced:
        assert sum(lim.store.stats()["debt_charged"] for lim in limiters) > 0  # type: ignore[attr-defined]


@pytest.mark.parametrize("key_sliced", [True, False])
def test_recovery_hands_out_no_second_share(fresh_redis: RedisServer, key_sliced: bool) -> None:
    """Redis back and ``maintain()`` called on both (as from a timer) while the limiters'
    breakers still cool down: their local decisions go on from what they admitted in the
    outage, not from a fresh share, so the window stays within the documented bound."""
    clock, mono = ManualClock(START), ManualClock(0)
    rate = "100/minute"
    limiters = pair(fresh_redis, clock, mono, sliced="all" if key_sliced else ["1/second"])
    for lim in limiters * 2:
        lim.hit("warm", rate)
        clock.advance(0.15)
    before = sum(limiters[i % 2].hit("k", rate).allowed for i in range(60))
    fresh_redis.pause()
    try:
        local = 0
        for i in range(200):
            local += limiters[i % 2].hit("k", rate).allowed
            mono.advance(0.01)
    finally:
        fresh_redis.resume()
    fresh_redis.client(socket_timeout=5).ping()
    for lim in limiters:
        lim.store.maintain()  # type: ignore[attr-defined]  # debts charged: the store answers
        assert lim.stats()["breaker"] == "open"  # still cooling down: decided locally
    cooling = [limiters[i % 2].hit("k", rate) for i in range(200)]
    assert all(d.degraded for d in cooling)
    mono.advance(60)
    after = sum(limiters[i % 2].hit("k", rate).allowed for i in range(200))
    window = before + local + sum(d.allowed for d in cooling) + after
    assert sum(d.allowed for d in cooling) == 0  # the shares were spent in the outage
    assert window <= 2 * 100  # the documented bound of the window the store was lost in
    assert window == before + local + max(0, 100 - before - local)


def test_a_second_outage_starts_from_what_the_store_said_last(fresh_redis: RedisServer) -> None:
    """The local state kept after an outage never gives more room than the store's last word:
    A admitted a little locally, the store came back and B spent the rest; in a second
    outage in the same window A starts from what the store then said was left (nothing),
    not from the room its first outage left it."""
    clock, mono = ManualClock(START), ManualClock(0)
    a, b = pair(fresh_redis, clock, mono)
    for lim in (a, b) * 2:
        lim.hit("warm", "100/minute")
        clock.advance(0.15)
    fresh_redis.pause()
    try:
        first = sum(a.hit("k", "100/minute").allowed for _ in range(10))
    finally:
        fresh_redis.resume()
    assert first == 10
    fresh_redis.client(socket_timeout=5).ping()
    mono.advance(60)
    a.store.maintain()  # type: ignore[attr-defined]
    while b.hit("k", "100/minute").allowed:
        pass
    assert not a.hit("k", "100/minute").allowed  # the store says: nothing left
    clock.advance(0.05)  # past the rejection's hold, in the same window
    fresh_redis.pause()
    try:
        second = sum(a.hit("k", "100/minute").allowed for _ in range(60))
    finally:
        fresh_redis.resume()
    assert second == 0
    assert a.stats()["fail_local"] > 0  # decided locally, not held from the rejection


def test_the_live_count_survives_an_outage(fresh_redis: RedisServer) -> None:
    """Nobody can beat while Redis is stopped, so every member expires there: the first beat
    after it is back counts one process. The count heard before stays the least for three
    beats (the time every live process takes to beat again), then a process gone drops out."""
    clock, mono = ManualClock(START), ManualClock(0)
    limiters = pair(fresh_redis, clock, mono)
    for lim in limiters * 2:  # both register, then both see two live processes
        lim.store.maintain()  # type: ignore[attr-defined]
        clock.advance(0.05)
    assert [lim.store.live for lim in limiters] == [2, 2]  # type: ignore[attr-defined]
    first = limiters[0].store
    fresh_redis.pause()
    try:
        clock.advance(1.0)  # ten beats: every member expires in the store
        with pytest.raises(StoreUnavailable):
            first.maintain()  # type: ignore[attr-defined]
    finally:
        fresh_redis.resume()
    first.maintain()  # type: ignore[attr-defined]  # the store counts one: itself
    assert first.live == 2  # type: ignore[attr-defined]  # not a share of the whole limit
    for _ in range(3):  # the other never beats again: it is gone
        clock.advance(0.1)
        first.maintain()  # type: ignore[attr-defined]
    assert first.live == 1  # type: ignore[attr-defined]


def test_without_a_live_count_the_limiter_fails_open_or_closed(fresh_redis: RedisServer) -> None:
    clock, mono = ManualClock(START), ManualClock(0)
    fresh_redis.pause()
    try:
        store = RedisStore(fresh_redis.url, socket_timeout=0.05)
        budget = LocalBudget(store, clock=clock)
        d = Limiter(budget, clock=clock, monotonic=mono).hit("k", "10/minute")
        assert d.degraded and d.allowed and d.remaining == 10  # fail open, as configured
        with pytest.raises(StoreUnavailable):
            Limiter(budget, clock=clock, monotonic=mono, fail_open=False).hit("k", "10/minute")
        assert budget.stats()["fail_local_unknown"] == 2
        assumed = LocalBudget(store, clock=clock, processes=5)
        limiter = Limiter(assumed, clock=clock, monotonic=mono, fail_open=False)
        admitted = sum(limiter.hit("k", "10/minute").allowed for _ in range(10))
        assert admitted == 2  # 10 // 5
    finally:
        fresh_redis.resume()


def test_async_fail_local(fresh_redis: RedisServer) -> None:
    clock, mono = ManualClock(START), ManualClock(0)

    async def main() -> tuple[int, int]:
        store = RedisStore(fresh_redis.url, socket_timeout=0.1)
        budgets = [LocalBudget(store, clock=clock, heartbeat=0.1) for _ in range(2)]
        limiters = [AsyncLimiter(b, clock=clock, monotonic=mono) for b in budgets]
        for lim in limiters * 2:
            await lim.hit("warm", "60/minute", algorithm="gcra")
            clock.advance(0.15)
        fresh_redis.pause()
        try:
            local = 0
            for i in range(100):
                d = await limiters[i % 2].hit("k", "60/minute", algorithm="gcra")
                assert d.degraded
                local += d.allowed
                mono.advance(0.01)
        finally:
            fresh_redis.resume()
        mono.advance(60)
        for b in budgets:
            await b.maintain_async()
        after = sum(
            [
                (await limiters[i % 2].hit("k", "60/minute", algorithm="gcra")).allowed
                for i in range(100)
            ]
        )
        await store.aclose()
        return local, after

    local, after = asyncio.run(main())
    assert local == 60  # two buckets of burst 30
    assert after == 0  # the whole burst was spent locally and charged back: no burst


def test_the_shares() -> None:
    def share(spec: str, algorithm: str, live: int, **options: object) -> tuple[int, int, int]:
        policy = make_policy(spec, algorithm, options.get("burst"), None)  # type: ignore[arg-type]
        limit = share_policy(policy, live).limits[0]
        return limit.count, limit.period_ms, limit.capacity

    assert share("100/minute", "fixed_window", 3) == (33, 60_000, 33)
    assert share("2/minute", "fixed_window", 3) == (1, 60_000, 1)  # at least one each
    assert share("100/minute", "token_bucket", 4, burst=10) == (100, 240_000, 2)
    assert share("10/second", "gcra", 3) == (10, 3000, 3)
    assert share("5/3650d", "gcra", 2)[1] == 3650 * 86_400_000  # past ten years: count // n


def test_the_seed_is_the_share_of_what_was_left() -> None:
    policy = share_policy(make_policy("100/minute", "fixed_window", None, None), 4)
    limit = policy.limits[0]
    assert seed("fixed_window", limit, 1000, 40, 50_000, 4) == (25 - 10, 50_000)
    assert seed("fixed_window", limit, 60_000, 40, 50_000, 4) is None  # that window ended
    bucket = share_policy(make_policy("100/minute", "token_bucket", None, None), 4).limits[0]
    assert seed("token_bucket", bucket, 1000, 400, 0, 4) == (0, 1000)  # full: lacks nothing
    assert seed("token_bucket", bucket, 1000, 40, 0, 4) == ((25 - 10) * bucket.period_ms, 1000)
    cell = share_policy(make_policy("100/minute", "gcra", None, None), 4).limits[0]
    assert seed("gcra", cell, 1000, 40, 0, 4) == (1000 * 1000 + 15 * cell.unit, cell.count)


def test_debts_are_charged_the_decided_key_first_then_in_batches(
    fresh_redis: RedisServer,
) -> None:
    clock, mono = ManualClock(START), ManualClock(0)
    store = RedisStore(fresh_redis.url, socket_timeout=0.1)
    budget = LocalBudget(store, clock=clock, sliced=[], processes=2)
    limiter = Limiter(budget, clock=clock, monotonic=mono)
    keys = [f"k{i}" for i in range(150)]
    fresh_redis.pause()
    try:
        for key in keys:  # each its share, 5 of 10, admitted locally
            assert sum(limiter.hit(key, "10/minute").degraded for _ in range(7)) == 7
    finally:
        fresh_redis.resume()
    fresh_redis.client(socket_timeout=5).ping()  # answering again
    mono.advance(60)
    plain = Limiter(RedisStore(fresh_redis.url), clock=clock)
    d = limiter.hit(keys[-1], "10/minute")  # its own debt first: 5 charged, then this hit
    assert not d.degraded and d.remaining == 4
    charged = sum(plain.peek(k, "10/minute").remaining == 5 for k in keys[:-1])
    assert charged == 63  # the batch of 64 it led
    budget.maintain()
    budget.maintain()
    assert all(plain.peek(k, "10/minute").remaining == 5 for k in keys[:-1])
    assert budget.fail is not None and not budget.fail.active


def test_a_take_that_timed_out_is_settled_later_and_nothing_is_lost(
    fresh_redis: RedisServer,
) -> None:
    """With Redis stopped the take is sent and times out, yet runs when Redis resumes: the
    grant nobody received is settled at the next call, so the window stays whole."""
    clock, mono = ManualClock(START), ManualClock(0)
    store = RedisStore(fresh_redis.url, socket_timeout=0.1)
    budget = LocalBudget(store, clock=clock, fail_local=False)
    limiter = Limiter(budget, clock=clock, monotonic=mono)
    admitted = 0
    for _ in range(30):  # slices grow with the demand
        admitted += limiter.hit("k", "1000/minute").allowed
        clock.advance(0.001)
    fresh_redis.pause()
    try:
        while True:
            d = limiter.hit("k", "1000/minute")
            if d.degraded:  # the take that timed out (failed open: not counted here)
                break
            admitted += d.allowed
    finally:
        fresh_redis.resume()
    plain = Limiter(RedisStore(fresh_redis.url), clock=clock)
    lost = 1000 - admitted - plain.peek("k", "1000/minute").remaining
    assert lost > 0  # the stopped Redis ran the take on resuming: a grant no one holds
    mono.advance(60)
    while (d := limiter.hit("k", "1000/minute")).allowed:
        admitted += 1
    assert admitted == 1000  # settled as unspent: every unit of the window was admitted
    assert budget.stats()["units_returned"] >= lost


def test_a_shard_down_under_the_heartbeat_degrades_only_its_own_keys() -> None:
    """The heartbeat's key lives on one shard: with that shard stopped, keys on the other
    shard are still decided by the store (the upkeep's failure is not theirs)."""
    servers = [RedisServer(), RedisServer()]
    try:
        store = ShardedRedisStore([Shard(s.url) for s in servers], socket_timeout=0.1)
        clock, mono = ManualClock(START), ManualClock(0)
        budget = LocalBudget(store, clock=clock, heartbeat=0.1)
        limiter = Limiter(budget, clock=clock, monotonic=mono)
        beat = store.partition_key("#live")
        key = next(k for k in (f"user:{i}" for i in range(100)) if store.partition_key(k) != beat)
        limiter.hit(key, "1000/minute")
        servers[beat].pause()
        try:
            decisions = []
            for _ in range(200):
                clock.advance(0.01)  # a heartbeat due every 10 hits
                decisions.append(limiter.hit(key, "1000/minute"))
        finally:
            servers[beat].resume()
        assert not any(d.degraded for d in decisions)
        assert sum(d.allowed for d in decisions) == 200
        assert budget.stats()["upkeep_errors"] > 0
    finally:
        for s in servers:
            s.stop()


def test_concurrent_calls_charge_a_debt_once(fresh_redis: RedisServer) -> None:
    clock, mono = ManualClock(START), ManualClock(0)

    async def main() -> int:
        store = RedisStore(fresh_redis.url, socket_timeout=0.1)
        budget = LocalBudget(store, clock=clock, sliced=[], processes=2)
        limiter = AsyncLimiter(budget, clock=clock, monotonic=mono)
        fresh_redis.pause()
        try:
            local = [await limiter.hit("k", "10/minute") for _ in range(8)]
        finally:
            fresh_redis.resume()
        assert sum(d.allowed for d in local) == 5 and all(d.degraded for d in local)
        fresh_redis.client(socket_timeout=5).ping()
        await asyncio.gather(*(budget.maintain_async() for _ in range(6)))  # all recovering
        plain = AsyncLimiter(RedisStore(fresh_redis.url), clock=clock)
        remaining = (await plain.peek("k", "10/minute")).remaining
        await store.aclose()
        return remaining

    assert asyncio.run(main()) == 5  # 10 - the 5 owed, charged once


def test_one_slow_reply_is_not_an_outage(fresh_redis: RedisServer) -> None:
    """A take whose reply is late (a loaded machine, a cold connection) is sent again at once:
    a slice call is safe to send twice (the second gives back what the first may have
    granted), so one slow reply costs that request a second wait, not a trip into fail-local
    at a share of the limit, and the breaker never hears of it."""
    clock = ManualClock(START)
    store = RedisStore(fresh_redis.url, socket_timeout=1.0)  # the second try's margin
    budget = LocalBudget(store, clock=clock)
    limiter = Limiter(budget, clock=clock, fail_open=False)
    assert limiter.hit("warm", "100/minute").allowed  # connected, scripts loaded, registered

    def resume_at_the_second_try() -> None:
        deadline = time.monotonic() + 30
        while budget.retries == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        fresh_redis.resume()

    fresh_redis.pause()
    helper = threading.Thread(target=resume_at_the_second_try)
    helper.start()
    try:
        d = limiter.hit("k", "100/minute")  # its take: the first try times out
    finally:
        helper.join()
        fresh_redis.resume()
    assert d.allowed and not d.degraded
    assert budget.stats()["retries"] == 1
    assert limiter.stats()["store_errors"] == 0 and limiter.stats()["fail_local"] == 0
    admitted = 1 + sum(limiter.hit("k", "100/minute").allowed for _ in range(200))
    assert admitted == 100  # whatever the first try did, the window is whole


def test_a_failed_take_that_runs_late_is_still_given_back(redis_url: str) -> None:
    """A failed call may run after the next one (left in a stalled server's buffer, it runs
    when the server resumes, in any order): its slice's id rides along with the key's calls,
    so a late grant is given back by the next call after it."""
    clock = ManualClock(START)
    budget = LocalBudget(RedisStore(redis_url, socket_timeout=5), clock=clock, fail_local=False)
    limiter = Limiter(budget, clock=clock, fail_open=False)
    take, late = budget.slicer.take, []

    def fail_twice(call: SliceCall) -> slices.Taken:
        if len(late) < 2 and call.key == "k":
            late.append(call)  # sent, not yet run
            raise StoreUnavailable("timed out")
        return take(call)

    budget.slicer.take = fail_twice  # type: ignore[method-assign]
    while len(late) < 2:  # two tries fail (one request, sent again at once)
        with pytest.raises(StoreUnavailable):
            limiter.hit("k", "100/minute")
    admitted = sum(limiter.hit("k", "100/minute").allowed for _ in range(10))
    for call in late:  # the stalled server resumes: the two tries run after the next call
        take(call)
    clock.advance(0.001)
    admitted += sum(limiter.hit("k", "100/minute").allowed for _ in range(300))
    assert admitted == 100  # their grants came back: the window is whole
