"""Every Redis store decides from any event loop: several loops in turn (``asyncio.run`` per
job), threads running loops of their own at once, FastAPI's ``TestClient`` (a loop per client),
and a loop closed while a batch is in flight — on real Redis servers (standalone, a primary with
a replica, Sentinel, Cluster) and a ``RolloutStore`` over two of them. Plus ``PerLoop`` itself.

The limit is the evidence: each test counts exactly the admitted requests, and a store call
that failed on a foreign loop would show as an over-admission (fail open) or a degraded answer.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from ratekeeper import (
    AsyncConcurrencyLimiter,
    AsyncLimiter,
    RedisClusterStore,
    RedisStore,
    RolloutStore,
    SentinelStore,
    Shard,
    ShardedRedisStore,
)
from ratekeeper.errors import ConfigError
from ratekeeper.stores.loops import PerLoop
from ratekeeper.stores.redis.batching import Batcher
from tests import redis_servers as rs

LIMIT = 5
RATE = f"{LIMIT}/hour"

# ---------------------------------------------------------------------------------- PerLoop


def test_per_loop_gives_the_first_value_to_the_first_loop_and_builds_for_others() -> None:
    built: list[int] = []

    def build() -> int:
        built.append(len(built) + 100)
        return built[-1]

    per = PerLoop(build, first=7)

    async def get() -> int:
        return per.get() + 0 * per.get()  # twice: the fast path gives the same

    assert asyncio.run(get()) == 7
    assert asyncio.run(get()) == 100  # a new loop (the first has closed)
    assert per.loops() == 1  # the closed loop was forgotten when the second asked
    assert per.current() == 100 and built == [100]


def test_per_loop_serves_threads_with_loops_of_their_own_at_once() -> None:
    per: PerLoop[object] = PerLoop(object)
    seen: dict[int, set[object]] = {}  # the values themselves: a freed one's id comes back
    barrier = threading.Barrier(4)

    def worker(i: int) -> None:
        async def go() -> None:
            barrier.wait()  # all four loops alive together
            values = set()
            for _ in range(200):
                values.add(per.get())
                await asyncio.sleep(0)
            seen[i] = values

        asyncio.run(go())

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert all(len(ids) == 1 for ids in seen.values())  # one value per loop, always the same
    assert len(set.union(*seen.values())) == 4  # and none shared


def test_per_loop_tells_what_it_drops() -> None:
    dropped: list[object] = []
    per: PerLoop[object] = PerLoop(object, drop=dropped.append)

    async def get() -> object:
        return per.get()

    first = asyncio.run(get())
    asyncio.run(get())
    assert dropped == [first]


def test_a_batcher_refuses_a_second_running_loop_instead_of_losing_calls() -> None:
    release = threading.Event()

    async def slow(calls: Any) -> list[Any]:
        await asyncio.get_running_loop().run_in_executor(None, release.wait, 10)
        return list(calls)

    batcher: Batcher[int, int] = Batcher(slow)
    started = threading.Event()
    result: list[int] = []

    def first_loop() -> None:
        async def go() -> None:
            future = batcher.submit(1)
            started.set()
            result.append(await future)

        asyncio.run(go())

    thread = threading.Thread(target=first_loop)
    thread.start()
    assert started.wait(10)
    time.sleep(0.05)  # the batch is in flight on the first loop

    async def second() -> int:
        return await batcher.submit(2)

    with pytest.raises(RuntimeError, match="another running event loop"):
        asyncio.run(second())
    release.set()
    thread.join(timeout=10)
    assert result == [1]  # the first loop's call was not lost
    assert asyncio.run(second()) == 2  # the first loop has ended: the batcher moves


# ---------------------------------------------------------------------------------- stores

KINDS = ("redis", "redis-unbatched", "replicas", "sharded", "cluster", "rollout")


@pytest.fixture(params=KINDS)
def store_factory(request: pytest.FixtureRequest) -> Iterator[Callable[[], Any]]:
    """A function making stores of one kind on real servers (flushed before the test)."""
    kind = request.param
    made: list[Any] = []

    def keep(store: Any) -> Any:
        made.append(store)
        return store

    if kind in ("redis", "redis-unbatched"):
        url = request.getfixturevalue("redis_url")
        batching = {} if kind == "redis" else {"batching": None}
        make: Callable[[], Any] = lambda: keep(RedisStore(url, socket_timeout=5, **batching))  # noqa: E731
    elif kind == "replicas":
        primary, replica = request.getfixturevalue("primary_replica")
        shard = Shard(primary.url, replicas=[replica.url])
        make = lambda: keep(ShardedRedisStore([shard], socket_timeout=5))  # noqa: E731
    elif kind == "sharded":
        urls = request.getfixturevalue("shard_urls")
        make = lambda: keep(ShardedRedisStore([Shard(u) for u in urls], socket_timeout=5))  # noqa: E731
    elif kind == "cluster":
        url = request.getfixturevalue("cluster_url")
        make = lambda: keep(RedisClusterStore(url, socket_timeout=5))  # noqa: E731
    else:
        url = request.getfixturevalue("redis_url")
        urls = request.getfixturevalue("shard_urls")
        make = lambda: keep(  # noqa: E731
            RolloutStore(
                RedisStore(url, socket_timeout=5),
                ShardedRedisStore([Shard(u) for u in urls], socket_timeout=5),
                share=50,
            )
        )
    yield make
    for store in made:
        store.close()


def admitted(decisions: list[Any]) -> int:
    assert not any(d.degraded for d in decisions), "a store call failed: it failed open"
    return sum(d.allowed for d in decisions)


def test_deciding_from_one_loop_after_another(store_factory: Callable[[], Any]) -> None:
    store = store_factory()
    limiter = AsyncLimiter(store, fail_open=True)

    async def one(key: str) -> Any:
        return await limiter.hit(key, RATE)

    for key in ("a", "b"):
        decisions = [asyncio.run(one(key)) for _ in range(LIMIT + 3)]  # a new loop each time
        assert admitted(decisions) == LIMIT
    assert limiter.stats()["store_errors"] == 0


def test_deciding_from_threads_each_running_its_own_loop(store_factory: Callable[[], Any]) -> None:
    store = store_factory()
    limiter = AsyncLimiter(store, fail_open=True)
    leases = AsyncConcurrencyLimiter(store, 3, 30.0, fail_open=True)
    barrier = threading.Barrier(6)
    decisions: list[Any] = []
    held: list[Any] = []
    lock = threading.Lock()

    def worker() -> None:
        async def go() -> None:
            barrier.wait()
            got = await asyncio.gather(*(limiter.hit("shared", RATE) for _ in range(4)))
            lease = await leases.acquire("slots")
            with lock:
                decisions.extend(got)
                held.append(lease)

        asyncio.run(go())

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(decisions) == 24
    assert admitted(decisions) == LIMIT
    granted = [lease for lease in held if lease is not None]
    assert len(granted) == 3 and not any(lease.degraded for lease in granted)


def test_a_dead_loop_leaves_no_connections_behind(fresh_redis: rs.RedisServer) -> None:
    store = RedisStore(fresh_redis.url, socket_timeout=5)  # a server of its own: counted alone
    limiter = AsyncLimiter(store)
    watcher = redis.Redis.from_url(fresh_redis.url)

    async def burst() -> None:
        await asyncio.gather(*(limiter.hit(f"k{i}", "100/hour") for i in range(20)))

    for _ in range(30):
        asyncio.run(burst())
    assert store.loops() == 1  # every loop that closed was forgotten
    gc.collect()  # a dead loop's sockets close when collected
    deadline = time.monotonic() + 10
    while len(watcher.client_list()) > 6 and time.monotonic() < deadline:
        time.sleep(0.05)
        gc.collect()
    assert len(watcher.client_list()) <= 6  # the watcher and one loop's few, not 30 loops'
    watcher.close()
    store.close()


def test_a_loop_closed_while_its_batch_is_in_flight(fresh_redis: rs.RedisServer) -> None:
    store = RedisStore(fresh_redis.url, socket_timeout=5)
    limiter = AsyncLimiter(store, fail_open=True)
    loop = asyncio.new_event_loop()
    task = loop.create_task(limiter.hit("k", RATE))
    fresh_redis.pause()  # the batch is written and waits for its reply
    try:
        loop.run_until_complete(asyncio.sleep(0.2))
        assert not task.done()
        loop.close()  # abandoned with the batch in flight (no cancellation ran)
    finally:
        fresh_redis.resume()

    async def count() -> list[Any]:
        return [await limiter.hit("k", RATE) for _ in range(LIMIT + 2)]

    decisions = asyncio.run(count())  # a new loop: fresh clients, nothing waits on the dead one
    assert admitted(decisions) in (LIMIT, LIMIT - 1)  # the abandoned hit may have run
    assert [d.allowed for d in decisions][-2:] == [False, False]
    assert store.loops() == 1
    store.close()
    # the dead loop's task and its batch are destroyed here, not in whichever test the garbage
    # collector happens to run next: closing them raises nothing ("Event loop is closed")
    raised: list[str] = []
    previous, sys.unraisablehook = sys.unraisablehook, lambda u: raised.append(repr(u.exc_value))
    try:
        del task, loop
        asyncio.run(_collect())  # as a later test's loop would, with a loop running
    finally:
        sys.unraisablehook = previous
    assert raised == []


async def _collect() -> None:
    gc.collect()


def test_sentinel_store_decides_from_one_loop_after_another(
    sentinel_group: rs.SentinelGroup,
) -> None:
    store = SentinelStore(sentinel_group.service, sentinel_group.urls, socket_timeout=5)
    limiter = AsyncLimiter(store, fail_open=True)

    async def one() -> Any:
        return await limiter.hit("k", RATE)

    decisions = [asyncio.run(one()) for _ in range(LIMIT + 3)]
    assert admitted(decisions) == LIMIT

    async def peek() -> Any:
        decision = await limiter.peek("k", RATE)
        await store.aclose()
        return decision

    assert asyncio.run(peek()).remaining == 0
    store.close()


def test_a_client_given_is_twinned_for_other_loops(redis_url: str) -> None:
    import redis.asyncio

    given = redis.asyncio.Redis.from_url(redis_url, socket_timeout=5)
    store = RedisStore(async_client=given)
    limiter = AsyncLimiter(store, fail_open=True)

    async def one() -> Any:
        return await limiter.hit("k", RATE)

    decisions = [asyncio.run(one()) for _ in range(LIMIT + 2)]
    assert admitted(decisions) == LIMIT
    sentinel_pool = redis.asyncio.sentinel.SentinelConnectionPool(
        "mymaster", redis.asyncio.sentinel.Sentinel([("127.0.0.1", 1)])
    )
    with pytest.raises(ConfigError, match="function that builds the client"):
        RedisStore(async_client=redis.asyncio.Redis(connection_pool=sentinel_pool))


def test_fastapi_testclient_on_redis_admits_exactly_the_limit(redis_url: str) -> None:
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from ratekeeper.integrations.fastapi import RouteLimits

    limits = RouteLimits(store=RedisStore(redis_url, socket_timeout=5))
    app = FastAPI()
    limits.init_app(app)

    @app.get("/items")
    @limits.limit("5/minute")
    async def items() -> dict[str, bool]:
        return {"ok": True}

    client = TestClient(app)  # runs each request on a loop of its own (anyio's portal)
    assert [client.get("/items").status_code for _ in range(8)] == [200] * 5 + [429] * 3
    assert limits.stats()["store"]["store_errors"] == 0


@pytest.mark.parametrize("given", ["url", "client", "function"])
def test_a_redis_plan_source_reads_from_loop_after_loop_and_from_threads(
    redis_url: str, given: str
) -> None:
    import redis.asyncio

    from ratekeeper.quotas import RedisSource

    sync = redis.Redis.from_url(redis_url)
    prefix = f"loops-{given}:"
    if given == "url":
        source = RedisSource(redis_url, prefix=prefix, socket_timeout=5)
    elif given == "client":
        aio = redis.asyncio.Redis.from_url(redis_url, socket_timeout=5)
        source = RedisSource(client=sync, async_client=aio, prefix=prefix)
    else:
        source = RedisSource(
            client=sync,
            async_client=lambda: redis.asyncio.Redis.from_url(redis_url, socket_timeout=5),
            prefix=prefix,
        )
    source.set_plan("acme", "pro")

    async def read() -> Any:
        return await source.lookup_async("acme")

    for _ in range(3):  # a new loop each time: a client bound to the first fails on the next
        assert asyncio.run(read()).plan == "pro"
    plans: list[Any] = []

    def worker() -> None:
        plans.append(asyncio.run(read()).plan)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert plans == ["pro"] * 4
    with pytest.raises(ConfigError, match="async_client=1 is invalid"):
        RedisSource(client=sync, async_client=1)
