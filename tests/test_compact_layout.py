"""The compact key layout: the same decisions as the default layout on every Redis store, states
packed into small listpack hashes with a TTL, stale fields swept, Cluster-safe hash tags."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ratekeeper import (
    AsyncLimiter,
    Limiter,
    ManualClock,
    RedisStore,
    Shard,
    ShardedRedisStore,
)
from ratekeeper.errors import ConfigError
from ratekeeper.stores.redis.layout import CompactLayout, bucket_tag, compact_field
from tests import redis_servers as rs
from tests.conftest import redis_store
from tests.test_redis_parity import ALGORITHMS, same_or_outran_ttl, scenarios


def make(kind: str, request: pytest.FixtureRequest, prefix: str, layout: Any) -> Any:
    return redis_store(kind, request, prefix=prefix, layout=layout)


@pytest.mark.parametrize("kind", ["redis", "sharded", "cluster"])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_compact_decides_exactly_like_the_default_layout(
    kind: str, algorithm: str, request: pytest.FixtureRequest, data: st.DataObject
) -> None:
    """Random traffic (keys with braces, unicode, 300 characters; stacks; options, Envoy's
    fixed-window counting included; refunds, resets, peeks; clock jumps) on both layouts; two
    buckets, so callers share hashes and new fields sweep each other's."""
    rate, options, start, sequence = data.draw(scenarios(algorithm))
    prefix = f"c{os.urandom(6).hex()}"  # fresh keys without a flush (not drawn: replays differ)
    clock = ManualClock(start)
    default = Limiter(make(kind, request, prefix + "d", None), clock=clock, fail_open=False)
    compact = Limiter(
        make(kind, request, prefix + "c", CompactLayout(buckets=2)), clock=clock, fail_open=False
    )
    started = time.monotonic()
    for step in sequence:
        clock.advance(step.advance_ms / 1000)
        kwargs: dict[str, Any] = dict(options, algorithm=algorithm)
        op, cost = ("peek", 0) if step.op == "peek0" else (step.op, step.cost)
        if op != "reset":
            kwargs["cost"] = cost
        want = getattr(default, op)(step.key, rate, **kwargs)
        got = getattr(compact, op)(step.key, rate, **kwargs)
        assert same_or_outran_ttl(got, want, started), (got, want, step, algorithm, rate, options)
    for limiter in (default, compact):
        limiter.store.close()


def hashes(client: redis.Redis, prefix: str) -> dict[bytes, dict[bytes, bytes]]:
    return {k: client.hgetall(k) for k in client.scan_iter(match=f"{prefix}*")}


def test_states_are_fields_of_small_listpack_hashes_with_a_ttl(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    clock = ManualClock(1_800_000_000.0)
    layout = CompactLayout(buckets=4)
    limiter = Limiter(RedisStore(redis_url, layout=layout, socket_timeout=5), clock=clock)
    keys = [f"user:{i}" for i in range(40)] + ["{x}", "ключ", "#h", "k" * 300]
    for algorithm in ("fixed_window", "token_bucket", "gcra", "sliding_window"):
        for key in keys:
            limiter.hit(key, "10/hour; 100/day", algorithm=algorithm)
    found = hashes(client, "rk")
    assert len(found) == 4 * 2 * 4  # buckets x rates x algorithms: one key per hash, no more
    for name, fields in found.items():
        assert client.object("encoding", name) == b"listpack"
        if b"}f:1h" in name:  # the TTL covers the longest state it holds: a window's end
            assert client.pttl(name) > 3_600_000
        if b"}f:1d" in name:
            assert client.pttl(name) > 86_400_000
        assert max(len(f) for f in fields) <= 64
        bucket = name.decode().split("{")[1].split("}")[0]
        assert all(bucket_tag(f.decode(), 4) == bucket for f in fields)
    fields = {f for fs in found.values() for f in fs}
    assert len(fields) == len(keys)  # one field per caller key, the same in every hash
    assert compact_field("k" * 300).startswith("#") and compact_field("#h") == "%23h"
    # a caller's hashes (every rate of a stack, every algorithm) share one hash tag: one
    # Cluster slot, one script
    tags = {n.split(b"}")[0] for n, fs in found.items() if b"user:3" in fs}
    assert tags == {b"rk{" + bucket_tag("user:3", 4).encode()}
    limiter.reset("user:1", "10/hour; 100/day", algorithm="gcra")
    assert not any(
        b"user:1" in fs for n, fs in hashes(client, "rk").items() if b"}g:" in n
    )  # reset takes the field out of each rate's hash
    assert limiter.peek("user:1", "10/hour; 100/day", algorithm="gcra").remaining == 10


def test_new_fields_sweep_stale_ones(redis_url: str) -> None:
    """200 callers' windows end; 200 new callers arrive: their first writes sample the hash
    and delete ended windows, so the hash does not keep growing with callers gone."""
    client = redis.Redis.from_url(redis_url)
    clock = ManualClock(1_800_000_000.0)
    limiter = Limiter(
        RedisStore(redis_url, layout=CompactLayout(buckets=1), socket_timeout=5), clock=clock
    )
    for i in range(200):
        limiter.hit(f"old:{i}", "3/minute")
    clock.advance(61)  # every old window has ended
    for i in range(200):
        limiter.hit(f"new:{i}", "3/minute")
    (name,) = list(client.scan_iter(match="rk*"))
    fields = client.hkeys(name)
    stale = sum(f.startswith(b"old:") for f in fields)
    # each new field samples 3 random fields: most ended ones go (a simulation of this process,
    # 20,000 seeds, never left more than 13 of 200; the bound is loose on purpose)
    assert stale < 100, stale
    assert sum(f.startswith(b"new:") for f in fields) == 200  # live ones are never swept


def test_a_replica_serves_compact_peeks(primary_replica: tuple[Any, Any]) -> None:
    primary, replica = primary_replica
    layout = CompactLayout(buckets=8)
    clock = ManualClock()
    store = ShardedRedisStore(
        [Shard(primary.url, replicas=[replica.url])], layout=layout, socket_timeout=5
    )
    limiter = Limiter(store, clock=clock, fail_open=False)
    for algorithm in ("fixed_window", "token_bucket", "gcra", "sliding_window"):
        limiter.hit("k", "5/minute", algorithm=algorithm, cost=2)
    rs.wait_replicated(primary)
    replica.client().config_resetstat()
    for algorithm in ("fixed_window", "token_bucket", "gcra", "sliding_window"):
        assert limiter.peek("k", "5/minute", algorithm=algorithm).remaining == 3
    calls = replica.client().info("commandstats")
    assert calls["cmdstat_evalsha_ro"]["calls"] == 4


def test_batched_compact_calls_decide_like_single_ones(redis_url: str) -> None:
    async def run(batched: bool) -> list[tuple[bool, int]]:
        store = RedisStore(
            redis_url,
            prefix="b" if batched else "s",
            layout=CompactLayout(buckets=3),
            socket_timeout=5,
            **({} if batched else {"batching": None}),
        )
        limiter = AsyncLimiter(store, clock=ManualClock(1_800_000_000.0))
        out = []
        for algorithm in ("fixed_window", "token_bucket", "gcra", "sliding_window"):
            keys = [f"u{i % 7}" for i in range(40)]
            calls = [limiter.hit(k, "4/minute", algorithm=algorithm) for k in keys]
            if batched:
                ds = await asyncio.gather(*calls)
            else:
                ds = [await c for c in calls]
            out += [(d.allowed, d.remaining) for d in ds]
        await store.aclose()
        return out

    assert asyncio.run(run(True)) == asyncio.run(run(False))


@pytest.mark.parametrize("buckets", [0, -1, 2**25, 1.5, True, "8"])
def test_bad_buckets_name_the_value(buckets: Any) -> None:
    with pytest.raises(ConfigError, match=f"buckets={buckets!r}"):
        CompactLayout(buckets=buckets)


def test_a_bad_layout_names_the_value() -> None:
    with pytest.raises(ConfigError, match="layout='compact'"):
        RedisStore("redis://127.0.0.1:1", layout="compact")  # type: ignore[arg-type]


def test_the_hash_ttl_is_rewritten_only_when_a_save_outruns_it(redis_url: str) -> None:
    """A save the hash's TTL already covers rewrites no TTL; one beyond it raises the TTL to
    cover it, with room to spare."""
    client = redis.Redis.from_url(redis_url)
    clock = ManualClock(1_800_000_000.0)
    limiter = Limiter(
        RedisStore(redis_url, layout=CompactLayout(buckets=1), socket_timeout=5), clock=clock
    )
    client.config_resetstat()
    for i in range(200):  # gcra 1000/hour: each hit's state matters 3.6 s more
        limiter.hit(f"k{i % 20}", "1000/hour", algorithm="gcra")
    before = client.info("commandstats")["cmdstat_pexpire"]["calls"]
    assert before <= 3  # 200 saves: a TTL command only when the states outgrew the cover
    (name,) = list(client.scan_iter(match="rk*"))
    clock.advance(3600)  # past the cover: the next save must raise the TTL
    limiter.hit("k0", "1000/hour", algorithm="gcra", cost=900)
    assert client.info("commandstats")["cmdstat_pexpire"]["calls"] == before + 1
    assert client.pttl(name) > 900 * 3600  # covers the 900 units' 54 minutes
