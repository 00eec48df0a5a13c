"""SentinelStore on real redis-sentinel processes (three Sentinels, a primary and a replica):
discovery, peeks on the replica, a primary killed under traffic, a primary demoted alive.

The limiters here run on the real clock: their circuit breakers must see real time pass while
Sentinel promotes the replica. Nothing asserts speed; waits are bounded and generous.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from ratekeeper import (
    AsyncLimiter,
    Limiter,
    RedisStore,
    SentinelShard,
    SentinelStore,
    Shard,
    ShardedRedisStore,
)
from ratekeeper.errors import ConfigError
from tests import redis_servers as rs

RATE = "1000000/day"  # never rejects: every answer is either exact or fail-open
TIMEOUT = 0.25  # short, so a dead primary costs little; not flaky on a loaded machine
PATIENCE = 60.0  # the longest a failover may take here before the test gives up


def calls(server: rs.RedisServer, command: str) -> int:
    stats = server.client().info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


def test_discovers_the_primary_and_peeks_on_the_replica(sentinel_group: rs.SentinelGroup) -> None:
    primary = sentinel_group.primary()
    (replica,) = (s for s in sentinel_group.servers if s is not primary)
    store = SentinelStore(sentinel_group.service, sentinel_group.urls, socket_timeout=5)
    limiter = Limiter(store, fail_open=False)
    assert [limiter.hit("k", "5/minute").remaining for _ in range(3)] == [4, 3, 2]
    primary.client().execute_command("WAIT", 1, 5000)
    assert limiter.peek("k", "5/minute").remaining == 2
    assert calls(primary, "evalsha") >= 3 and calls(replica, "evalsha_ro") == 1

    async def batched() -> list[int]:
        limiter = AsyncLimiter(store, fail_open=False)
        ds = await asyncio.gather(*(limiter.hit(f"a{i}", "5/minute") for i in range(20)))
        await store.aclose()
        return [d.remaining for d in ds]

    assert asyncio.run(batched()) == [4] * 20
    store.close()


class Traffic:
    """Threads hitting keys in turn through one limiter until stopped; every answer kept."""

    def __init__(self, limiter: Limiter, threads: int = 4) -> None:
        self.limiter = limiter
        self.records: list[tuple[float, bool]] = []  # (monotonic time, degraded)
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(t,)) for t in range(threads)]
        for thread in self._threads:
            thread.start()

    def _run(self, offset: int) -> None:
        i = offset
        while not self._stop.is_set():
            try:
                d = self.limiter.hit(f"user:{i % 32}", RATE)
            except BaseException as exc:  # what would reach the app
                self.errors.append(exc)
            else:
                self.records.append((time.monotonic(), d.degraded))
            i += 1
            time.sleep(0.002)

    def healthy_since(self, since: float) -> float | None:
        """When answers became exact again for good after ``since`` (None: not yet)."""
        after = [r for r in list(self.records) if r[0] >= since]
        last_degraded = max((t for t, degraded in after if degraded), default=since)
        settled = [t for t, degraded in after if t > last_degraded and not degraded]
        return last_degraded if len(settled) >= 50 else None

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)


def test_a_killed_primary_is_replaced_under_traffic(sentinel_group: rs.SentinelGroup) -> None:
    store = SentinelStore(sentinel_group.service, sentinel_group.urls, socket_timeout=TIMEOUT)
    traffic = Traffic(Limiter(store))
    try:
        time.sleep(0.5)
        old = sentinel_group.primary()
        killed_at = time.monotonic()
        old.kill()
        new = sentinel_group.wait_promoted(old.port, timeout=PATIENCE)
        deadline = time.monotonic() + PATIENCE
        while traffic.healthy_since(killed_at) is None and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        traffic.stop()
    assert not traffic.errors, traffic.errors[:3]  # nothing raised, ever
    before = [d for t, d in traffic.records if t < killed_at]
    assert before and not any(before)  # exact until the kill
    recovered = traffic.healthy_since(killed_at)
    assert recovered is not None, "decisions did not resume on the promoted replica"
    assert any(d for t, d in traffic.records if t >= killed_at)  # fail-open during the switch
    limiter = Limiter(store, fail_open=False)
    remaining = [limiter.hit("after", "5/minute").remaining for _ in range(3)]
    assert remaining == [4, 3, 2]  # exact, on the new primary
    assert new.client().exists("rk{after}f:1m") == 1
    store.close()


def test_a_demoted_primary_is_left_for_the_new_one(sentinel_group: rs.SentinelGroup) -> None:
    """``SENTINEL FAILOVER`` demotes the primary while it runs; Sentinel closes its clients'
    connections as it reconfigures it, and the stores' next connections (pooled sync ones and
    the batches' alike) ask Sentinel for the new primary. (A connection left open to a
    demoted primary meets READONLY and is dropped: tests/test_batching.py.)"""
    old = sentinel_group.primary()
    store = SentinelStore(sentinel_group.service, sentinel_group.urls, socket_timeout=5)
    sync = Limiter(store)

    async def run() -> tuple[list[bool], list[bool]]:
        limiter = AsyncLimiter(store)
        warm = await asyncio.gather(*(limiter.hit(f"w{i}", RATE) for i in range(8)))
        assert not any(d.degraded for d in warm)  # pooled connections to the old primary
        assert not sync.hit("sync", RATE).degraded
        sentinel_group.sentinels[0].client().execute_command(
            "SENTINEL", "FAILOVER", sentinel_group.service
        )
        await asyncio.to_thread(sentinel_group.wait_promoted, old.port, PATIENCE)
        deadline = time.monotonic() + PATIENCE
        while old.client().info("replication")["role"] != "slave":
            assert time.monotonic() < deadline, "the old primary was not demoted"
            await asyncio.sleep(0.05)
        answers = []
        for _ in range(10):
            ds = await asyncio.gather(*(limiter.hit(f"w{i}", RATE) for i in range(8)))
            answers.append(any(d.degraded for d in ds))
        await store.aclose()
        sync_answers = [sync.hit("sync", RATE).degraded for _ in range(5)]
        return answers, sync_answers

    batched, one_by_one = asyncio.run(run())
    assert not any(batched[3:]), batched  # at most the batches that met READONLY failed open
    assert not any(one_by_one[1:]), one_by_one
    store.close()


def test_sentinel_shards_in_a_sharded_store(sentinel_group: rs.SentinelGroup) -> None:
    """A ``SentinelShard`` is a shard like ``Shard``: mixed with plain shards, keys spread."""
    plain = rs.RedisServer()
    try:
        shards: list[Any] = [
            SentinelShard(sentinel_group.service, sentinel_group.urls, name="s1"),
            Shard(plain.url, name="plain"),
        ]
        store = ShardedRedisStore(shards, socket_timeout=5)
        limiter = Limiter(store, fail_open=False)
        owners = {store.shard_of(f"k{i}").name for i in range(40)}
        assert owners == {"s1", "plain"}
        assert all(limiter.hit(f"k{i}", "5/minute").remaining == 4 for i in range(40))
        store.close()
    finally:
        plain.stop()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"service": "", "sentinels": ["redis://h:26379"]}, "service ''"),
        ({"service": "m", "sentinels": "redis://h:26379"}, "sentinels='redis://h:26379'"),
        ({"service": "m", "sentinels": []}, "sentinels=\\[\\]"),
        ({"service": "m", "sentinels": ["http://h"]}, "scheme 'http'"),
        ({"service": "m", "sentinels": ["redis://h"], "url": "redis://h:1/0"}, "without a host"),
        ({"service": "m", "sentinels": ["redis://:pw@h"], "url": "ftp://"}, "url 'ftp://'"),
    ],
)
def test_bad_settings_name_the_value(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        SentinelShard(**kwargs)


def test_passwords_stay_out_of_reprs() -> None:
    shard = SentinelShard("m", ["redis://:sentinel-pw@h:26379"], url="redis://u:server-pw@/0")
    store = SentinelStore("m", ["redis://:sentinel-pw@h:26379"], url="redis://u:server-pw@/0")
    for text in (repr(shard), repr(store), str(shard)):
        assert "pw" not in text.replace("***", ""), text
    assert isinstance(store._nodes[0].primary, RedisStore)
