"""Request coalescing: concurrent calls share store calls, each gets its own answer; on a real
Redis the pipeline decides exactly as one EVALSHA per plan does."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
import redis
import redis.asyncio

from ratekeeper import AsyncLimiter, ManualClock, MemoryStore, RedisStore, StoreUnavailable
from ratekeeper.algorithms import ALGORITHMS, Outcome
from ratekeeper.errors import ConfigError
from ratekeeper.plan import Plan
from ratekeeper.stores.redis.batching import Batcher, Batching
from ratekeeper.stores.redis.keys import redis_key
from ratekeeper.stores.redis.pipeline import RedisPipeline, Reply
from tests import redis_servers as rs


class Batched:
    """An ``AsyncStore`` over a bare ``Batcher`` (the Redis stores hold theirs inside)."""

    def __init__(self, batcher: Batcher[Plan, tuple[Outcome, ...]]) -> None:
        self.batcher = batcher

    async def execute_async(self, plan: Plan) -> tuple[Outcome, ...]:
        return await self.batcher.submit(plan)


class Observed:
    """A ``BatchObserver`` that keeps what it is told."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.errors = 0

    def batch(self, size: int, seconds: float) -> None:
        assert seconds >= 0
        self.sizes.append(size)

    def error(self) -> None:
        self.errors += 1


class MemoryMany:
    """``execute_many`` over a memory store, recording batch sizes; can fail chosen keys."""

    def __init__(self, fail_keys: frozenset[str] = frozenset()) -> None:
        self.store = MemoryStore()
        self.sizes: list[int] = []
        self.fail_keys = fail_keys

    async def __call__(self, plans: Sequence[Plan]) -> list[Reply]:
        self.sizes.append(len(plans))
        await asyncio.sleep(0.002)  # a round trip: later arrivals queue meanwhile
        return [
            StoreUnavailable(f"down for {p.key}")
            if p.key in self.fail_keys
            else self.store.execute(p)
            for p in plans
        ]


async def turns(n: int) -> None:
    """Let the event loop run ``n`` turns."""
    for _ in range(n):
        await asyncio.sleep(0)


async def flood(limiter: AsyncLimiter, keys: list[str]) -> list[bool]:
    decisions = await asyncio.gather(*(limiter.hit(k, "3/minute") for k in keys))
    return [d.allowed for d in decisions]


def test_concurrent_plans_share_batches_and_keep_their_own_results() -> None:
    many = MemoryMany()
    observed = Observed()
    batcher = Batcher(many, Batching(max_size=16, observer=observed))
    limiter = AsyncLimiter(Batched(batcher), clock=ManualClock())
    keys = [f"k{i % 10}" for i in range(100)]  # ten keys, ten hits each
    allowed = asyncio.run(flood(limiter, keys))
    for i in range(10):
        mine = [a for k, a in zip(keys, allowed, strict=True) if k == f"k{i}"]
        assert mine == [True] * 3 + [False] * 7
    assert sum(many.sizes) == 100
    assert max(many.sizes) <= 16 and len(many.sizes) < 100
    assert observed.sizes == many.sizes


def test_one_failing_plan_fails_no_other() -> None:
    many = MemoryMany(frozenset({"bad"}))
    observed = Observed()
    limiter = AsyncLimiter(Batched(Batcher(many, Batching(observer=observed))), clock=ManualClock())

    async def go() -> list[bool]:
        ds = await asyncio.gather(*(limiter.hit(k, "3/minute") for k in ["a", "bad", "b"]))
        return [d.degraded for d in ds]

    assert asyncio.run(go()) == [False, True, False]
    assert observed.errors == 1


def test_an_idle_batcher_sends_at_once() -> None:
    many = MemoryMany()
    limiter = AsyncLimiter(Batched(Batcher(many, Batching(max_wait=0.05))), clock=ManualClock())

    async def go() -> None:
        for _ in range(3):
            await limiter.hit("solo", "3/minute")

    asyncio.run(go())
    assert many.sizes == [1, 1, 1]


def test_plans_queued_during_a_round_trip_go_when_it_returns() -> None:
    """Self-clocking: a batch coming back sends what queued meanwhile at once; the
    ``max_wait`` timer (100 ms here) only bounds the wait behind a slow round trip."""
    store = MemoryStore()
    gate = asyncio.Event()
    sizes: list[int] = []

    async def many(plans: Sequence[Plan]) -> list[Reply]:
        sizes.append(len(plans))
        await gate.wait()
        return [store.execute(p) for p in plans]

    async def go() -> None:
        one_out = Batching(max_wait=0.1, max_in_flight=1)
        limiter = AsyncLimiter(Batched(Batcher(many, one_out)), clock=ManualClock())
        first = asyncio.ensure_future(limiter.hit("a", "3/minute"))
        await turns(3)
        later = [asyncio.ensure_future(limiter.hit(k, "3/minute")) for k in ("b", "c")]
        await turns(3)
        assert sizes == [1]  # b and c queue while a's batch is out
        gate.set()
        await first
        await turns(3)
        assert sizes == [1, 2]  # sent as a's batch came back, not at the timer
        assert all(d.allowed for d in await asyncio.gather(*later))

    asyncio.run(go())


def test_a_second_batch_goes_while_one_is_out_and_a_third_waits() -> None:
    """``max_in_flight`` (2 by default): with one batch out the next goes at once; with two
    out, what arrives waits for one to come back (or for ``max_wait``, 100 ms here)."""
    store = MemoryStore()
    gates = [asyncio.Event() for _ in range(3)]
    sizes: list[int] = []

    async def many(plans: Sequence[Plan]) -> list[Reply]:
        gate = gates[len(sizes)]
        sizes.append(len(plans))
        await gate.wait()
        return [store.execute(p) for p in plans]

    async def go() -> None:
        limiter = AsyncLimiter(Batched(Batcher(many, Batching(max_wait=0.1))), clock=ManualClock())
        a = asyncio.ensure_future(limiter.hit("a", "3/minute"))
        await turns(3)
        b = asyncio.ensure_future(limiter.hit("b", "3/minute"))
        await turns(3)
        assert sizes == [1, 1]  # b did not wait for a's batch
        later = [asyncio.ensure_future(limiter.hit(k, "3/minute")) for k in ("c", "d")]
        await turns(3)
        assert sizes == [1, 1]  # two out: c and d queue
        gates[1].set()
        await b
        await turns(3)
        assert sizes == [1, 1, 2]  # sent as b's batch came back
        gates[0].set()
        gates[2].set()
        assert all(d.allowed for d in await asyncio.gather(a, *later))

    asyncio.run(go())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_size": 0}, "max_size=0"),
        ({"max_wait": 1.0}, "max_wait=1.0"),
        ({"max_in_flight": 0}, "max_in_flight=0"),
        ({"max_in_flight": True}, "max_in_flight=True"),
    ],
)
def test_bad_settings(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Batching(**kwargs)  # type: ignore[arg-type]


def pipelined(url: str) -> tuple[RedisStore, RedisPipeline]:
    """A batching ``RedisStore`` (5 s timeout: behaviour, not latency) and its pipeline."""
    store = RedisStore(url, socket_timeout=5)
    assert store.batcher is not None and isinstance(store.batcher.execute_many, RedisPipeline)
    return store, store.batcher.execute_many


def commandstats(url: str) -> dict[str, int]:
    info = redis.Redis.from_url(url).info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in info.items()}


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_pipeline_decides_like_one_evalsha_per_plan(redis_url: str, algorithm: str) -> None:
    Answers = list[list[tuple[str, bool, int, float]]]

    async def run(store: object) -> Answers:
        clock = ManualClock(1_800_000_000.0)
        limiter = AsyncLimiter(store, clock=clock)  # type: ignore[arg-type]
        out = []
        for step in range(3):
            keys = [f"k{i % 3}" for i in range(12)]
            ds = await asyncio.gather(
                *(limiter.hit(k, "5/minute", algorithm=algorithm) for k in keys)
            )
            # concurrent hits on one key may land in any order: compare each key's answers as a set
            out.append(
                sorted(
                    (k, d.allowed, d.remaining, d.retry_after)
                    for k, d in zip(keys, ds, strict=True)
                )
            )
            # the other ops go through the same path: refund one key, reset another, peek all
            rates = "5/minute; 8/hour"
            await limiter.hit("m", rates, algorithm=algorithm, cost=2)
            await limiter.refund("m", rates, algorithm=algorithm, cost=1)
            await limiter.refund(f"k{step}", "5/minute", algorithm=algorithm)
            await limiter.reset(f"k{(step + 1) % 3}", "5/minute", algorithm=algorithm)
            peeks = await asyncio.gather(
                limiter.peek("m", rates, algorithm=algorithm),
                *(limiter.peek(f"k{i}", "5/minute", algorithm=algorithm) for i in range(3)),
            )
            out.append([("peek", d.allowed, d.remaining, d.retry_after) for d in peeks])
            clock.advance(7 + step)
        return out

    async def both() -> tuple[Answers, Answers]:
        store = RedisStore(redis_url, prefix="b", socket_timeout=5)
        batched = await run(store)
        single = await run(RedisStore(redis_url, prefix="s", socket_timeout=5, batching=None))
        assert store.batcher is not None and store.batcher.batches < store.batcher.calls
        return batched, single

    batched, single = asyncio.run(both())
    assert batched == single


def test_pipeline_round_trips_and_noscript(redis_url: str) -> None:
    """After a script flush (a restarted Redis) a batch sends the first plan that missed the
    script as EVAL (which loads it) and re-sends the rest as one batch: a few round trips, no
    EVAL per plan."""

    async def go() -> tuple[int, int, int]:
        store, pipeline = pipelined(redis_url)
        client = pipeline.client
        limiter = AsyncLimiter(store, clock=ManualClock())
        first = await asyncio.gather(*(limiter.hit(f"u{i}", "2/minute") for i in range(64)))
        assert all(d.allowed and not d.degraded for d in first)
        warm = pipeline.round_trips
        await client.script_flush()
        await client.config_resetstat()
        before = pipeline.round_trips
        second = await asyncio.gather(*(limiter.hit(f"u{i}", "2/minute") for i in range(64)))
        assert all(d.allowed and d.remaining == 0 and not d.degraded for d in second)
        reload = pipeline.round_trips - before
        third = await asyncio.gather(*(limiter.hit(f"u{i}", "2/minute") for i in range(64)))
        assert not any(d.allowed for d in third)
        await client.aclose()
        return warm, reload, pipeline.round_trips

    warm, reload, trips = asyncio.run(go())
    assert trips < 3 * 64
    # the missed batch, one EVAL, the re-sent batch (per batch the Batcher made)
    assert reload <= 3 * warm, (warm, reload)
    stats = commandstats(redis_url)
    assert 1 <= stats.get("eval", 0) <= warm and stats.get("script|load", 0) == 0, stats


def test_a_plan_whose_script_fails_fails_alone(redis_url: str) -> None:
    """A key of the wrong type makes that plan's script fail; the batch's others go on.
    (A lone surrogate in a key used to be the unsendable plan here; keys.encode_tag escapes
    it now, so every caller key can be sent.)"""
    setup = redis.Redis.from_url(redis_url)
    setup.flushall()
    setup.rpush(redis_key("rk", "bad", "f:1m"), "not a counter")
    setup.close()

    async def go() -> list[bool]:
        store, _ = pipelined(redis_url)
        limiter = AsyncLimiter(store, clock=ManualClock())
        keys = ["fine", "bad", "also fine", "bad\ud800"]
        hits = (limiter.hit(k, "3/minute", algorithm="fixed_window") for k in keys)
        ds = await asyncio.gather(*hits)
        await store.aclose()
        return [d.degraded for d in ds]

    assert asyncio.run(go()) == [False, True, False, False]


def test_a_connection_pooled_before_a_restart_is_retried_once(fresh_redis: rs.RedisServer) -> None:
    """Found by the reliability suite: after a Redis restart every idle pooled connection
    failed its next batch (no retry), so the breaker reopened seconds after Redis was back."""

    async def go() -> list[tuple[bool, int]]:
        store, pipeline = pipelined(fresh_redis.url)
        client = pipeline.client
        limiter = AsyncLimiter(store, clock=ManualClock())
        # several connections in the pool, all connected before the restart
        await asyncio.gather(*(client.ping() for _ in range(8)))
        assert (await limiter.hit("k", "5/minute")).remaining == 4
        fresh_redis.restart()  # same port, empty: every pooled connection is now dead
        out = []
        for _ in range(4):
            d = await limiter.hit("k", "5/minute")
            out.append((d.degraded, d.remaining))
        assert limiter.stats()["store_errors"] == 0
        await client.aclose()
        return out

    assert asyncio.run(go()) == [(False, 4), (False, 3), (False, 2), (False, 1)]


def test_a_cancelled_batch_never_leaves_its_replies_for_the_next(
    fresh_redis: rs.RedisServer,
) -> None:
    """A batch cancelled while Redis is slow (service shutdown, a caller's timeout) must not
    put its connection back with replies still to come: the next batch would read them."""

    async def go() -> tuple[bool, int, int]:
        store, pipeline = pipelined(fresh_redis.url)
        client = pipeline.client
        batcher = store.batcher
        assert batcher is not None
        limiter = AsyncLimiter(store, clock=ManualClock())
        await limiter.hit("warm", "5/minute")  # connected, script cached
        fresh_redis.pause()
        try:
            stuck = asyncio.gather(*(limiter.hit(f"c{i}", "5/minute") for i in range(8)))
            await asyncio.sleep(0.1)  # the batch is written; its replies cannot come yet
            for task in list(batcher._tasks):
                task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await stuck
        finally:
            fresh_redis.resume()
        await asyncio.sleep(0.1)  # the cancelled batch's replies arrive now, if anyone listens
        d = await limiter.hit("fresh", "9/minute")
        await client.aclose()
        return d.degraded, d.limit, d.remaining

    assert asyncio.run(go()) == (False, 9, 8)


def test_a_reset_never_overtakes_a_call_that_missed_its_script(redis_url: str) -> None:
    """Found by the batching property test: in a batch (hit, reset, hit) sent to a Redis without
    the script, the reset's DEL ran while both hits met NOSCRIPT, and the re-sent hits then ran
    after it: the key kept both hits. A reset now starts a round trip of its own."""

    async def go() -> list[int]:
        store = RedisStore(redis_url, socket_timeout=5)
        limiter = AsyncLimiter(store, clock=ManualClock(1e9))
        out = []
        for key in ("a", "b"):
            if key == "b":
                await asyncio.sleep(0)
                redis.Redis.from_url(redis_url).script_flush()
            first, _, last = await asyncio.gather(
                limiter.hit(key, "7/minute", cost=2),
                limiter.reset(key, "7/minute"),
                limiter.hit(key, "7/minute", cost=3),
            )
            out += [first.remaining, last.remaining]
        await store.aclose()
        return out

    assert asyncio.run(go()) == [5, 4, 5, 4]


def test_a_readonly_reply_drops_the_connection(
    primary_replica: tuple[rs.RedisServer, rs.RedisServer],
) -> None:
    """A primary demoted to a replica (a failover the clients were not told about) answers
    writes with READONLY: the batch fails open and its connection is dropped, so the next one
    connects again (through Sentinel, for a Sentinel shard) instead of meeting READONLY for
    good on a pooled connection."""
    primary, replica = primary_replica
    admin = primary.client()

    def ours() -> set[int]:  # the batches' connections (EVALSHA; a NOSCRIPT's EVAL goes
        # through the client's pool, on another connection than the one the pipeline keeps)
        return {c["id"] for c in admin.client_list() if c["cmd"] == "evalsha"}

    async def go() -> tuple[set[int], bool, set[int]]:
        store = RedisStore(primary.url, socket_timeout=5)
        limiter = AsyncLimiter(store, clock=ManualClock())
        assert not (await limiter.hit("k", "5/minute")).degraded
        before = ours()
        replica.client().replicaof("NO", "ONE")
        admin.replicaof("127.0.0.1", replica.port)  # demoted, its clients left connected
        demoted = (await limiter.hit("k", "5/minute")).degraded
        await asyncio.sleep(0.1)
        after = ours()
        await store.aclose()
        return before, demoted, after

    before, demoted, after = asyncio.run(go())
    assert before and demoted
    assert not before & after  # the connection that met READONLY is gone
