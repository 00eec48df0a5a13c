"""Where the quota service keeps its records: in the process (``MemoryQuotaState``, over a
memory store) or in Redis (``RedisQuotaState``, beside the counters of the configured Redis
store), so that several ratekeeper processes serving one fleet of Envoys share one view.

Both run ``allocator.step`` on one bucket atomically: the memory state in the event loop's
thread (a step never waits), Redis with ``lua/allocate.lua`` (one ``EVALSHA``; ``EVAL`` after
``NOSCRIPT``). A bucket's records are one hash, ``{prefix}{<bucket key>}q``, on the shard
that owns the bucket key (``ShardedRedisStore``, Sentinel) or its Cluster slot; its Redis TTL
only cleans up a bucket nobody reports any more, after every record in it has expired.

Consistency: every step reads and writes a bucket's records in one atomic call, so the sum
of assigned rates never exceeds the global rate, whichever process runs which step and in
what order. What a process does not see at once is the others' demand changes: each stream
is re-assigned on its own reports, so a change elsewhere in the fleet reaches a stream at its
next report (at most one report period, 5 s); within one process, a stream short of its
share has the others re-stepped at once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any, Protocol

from redis.exceptions import NoScriptError, RedisError

from ....errors import StoreUnavailable
from ....stores.memory import MemoryStore
from ....stores.redis.cluster import RedisClusterStore
from ....stores.redis.keys import redis_key
from ....stores.redis.sharded import ShardedRedisStore
from ....stores.redis.single import RedisStore
from . import allocator
from .allocator import Grant, Record, Step

SCRIPT = (resources.files(__package__) / "lua" / "allocate.lua").read_text("utf-8")
SHA = hashlib.sha1(SCRIPT.encode("utf-8")).hexdigest()
SLOT = "q"
KEY_TTL_MARGIN_MS = 5_000


class QuotaState(Protocol):
    """A bucket's records, stepped atomically."""

    async def step(self, bucket: str, s: Step) -> Grant:
        """Run ``allocator.step`` for one stream's report of ``bucket``."""
        ...

    async def leave(self, bucket: str, stream: str, now_ms: int, keep: bool) -> None:
        """The stream has ended: drop its record, or (``keep``) mark it orphan."""
        ...


class MemoryQuotaState:
    """Records in a dict, for one process (the memory store)."""

    def __init__(self) -> None:
        self.buckets: dict[str, dict[str, Record]] = {}

    async def step(self, bucket: str, s: Step) -> Grant:
        grant, records = allocator.step(self.buckets.get(bucket, {}), s)
        self.buckets[bucket] = records
        return grant

    async def leave(self, bucket: str, stream: str, now_ms: int, keep: bool) -> None:
        records = self.buckets.get(bucket)
        if records is None:
            return
        records = allocator.orphan(records, stream) if keep else allocator.drop(records, stream)
        live = {k: r for k, r in records.items() if r.expires_ms > now_ms}
        if live:
            self.buckets[bucket] = live
        else:
            self.buckets.pop(bucket, None)


Client = Callable[[str], Any]
"""The asyncio redis-py client that holds a Redis key."""


@dataclass(frozen=True, slots=True)
class RedisQuotaState:
    """Records in Redis hashes, shared by every process on the same store."""

    client: Client
    prefix: str
    ready: Callable[[], Awaitable[None]] | None = None
    """Called before each call (a cluster client loads its slot map once)."""
    address: str = "redis"

    def key(self, bucket: str) -> str:
        return redis_key(self.prefix, bucket, SLOT)

    async def _run(self, bucket: str, args: tuple[object, ...]) -> Any:
        key = self.key(bucket)
        client = self.client(bucket)
        try:
            if self.ready is not None:
                await self.ready()
            try:
                return await client.execute_command("EVALSHA", SHA, 1, key, *args)
            except NoScriptError:
                return await client.execute_command("EVAL", SCRIPT, 1, key, *args)
        except (RedisError, OSError) as exc:
            raise StoreUnavailable(
                f"quota state on {self.address} failed: {type(exc).__name__}: {exc}"
            ) from exc

    async def step(self, bucket: str, s: Step) -> Grant:
        reply = await self._run(
            bucket,
            (
                "step", s.now_ms, s.stream, s.demand, s.limit, s.hold_ms, s.cap,
                1 if s.adopt else 0, s.hold_ms + KEY_TTL_MARGIN_MS,
                allocator.HEADROOM_PCT, allocator.BAND_PCT, allocator.STALE_MS,
            ),
        )  # fmt: skip
        return Grant(int(reply[0]), int(reply[1]), int(reply[2]), int(reply[3]))

    async def leave(self, bucket: str, stream: str, now_ms: int, keep: bool) -> None:
        await self._run(bucket, ("orphan" if keep else "drop", now_ms, stream))

    async def records(self, bucket: str) -> dict[str, Record]:
        """The bucket's records as stored (tests compare them with the memory state's)."""
        client = self.client(bucket)
        raw = await client.hgetall(self.key(bucket))
        out = {}
        for field, value in raw.items():
            d, a, last, e, o = (value.decode() if isinstance(value, bytes) else value).split(":")
            name = field.decode() if isinstance(field, bytes) else field
            out[name] = Record(int(d), int(a), int(last), int(e), o == "1")
        return out


def quota_state(store: object) -> QuotaState:
    """The state for the service's store (the raw store, under its metrics wrapper)."""
    if isinstance(store, MemoryStore):
        return MemoryQuotaState()
    if isinstance(store, ShardedRedisStore):  # Sentinel too
        sharded = store
        return RedisQuotaState(
            lambda key: sharded.primary_of(key).async_client, store.prefix, address=repr(store)
        )
    if isinstance(store, RedisClusterStore):
        cluster = store
        return RedisQuotaState(
            lambda key: cluster.async_client, store.prefix, cluster.ready, repr(store)
        )
    if isinstance(store, RedisStore):
        single = store
        return RedisQuotaState(lambda key: single.async_client, store.prefix, address=repr(store))
    raise TypeError(f"no quota state for store {store!r}")
