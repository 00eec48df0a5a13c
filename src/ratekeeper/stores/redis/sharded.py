"""``ShardedRedisStore``: client-side sharding over Redis primaries, replicas serving reads.

GitHub's layout: each ``Shard`` is one primary (writes) with optional replicas (reads). What
belongs here is routing only; each server is driven by a ``RedisStore``, so scripts, ``NOSCRIPT``
handling and error wrapping are the same as on a single Redis.

- **Placement**: a caller key lives on the shard that wins its hash tag (``keys.encode_tag``)
  under rendezvous hashing of the shards' names (``rendezvous``), so every rate of a stack is
  on one shard and one script decides it. A shard's name is its primary's ``host:port/db``
  unless given: name shards explicitly to move a shard to a new address without moving keys.
- **Writes** (``hit``, ``refund``, ``reset``) go to the owning shard's primary. A rejected
  ``hit`` is that one script call; its reply fills the whole decision.
- **Reads** (``peek``) go to one of the shard's replicas, in turn, falling back to the primary
  when the shard has none or the replica fails; a failed replica is skipped for
  ``REPLICA_COOLDOWN_MS`` of the plan's clock. A lagging replica can only be out of date, never
  wrong about an ended window: windows end by their stored end, which every script compares
  with the caller's ``now``, so a replica still holding an ended window reports it as ended.
- **Failure domains**: the store is ``Partitioned`` by shard, so a limiter keeps one circuit
  breaker per shard and a dead shard degrades only the keys it owns.
- **Batching**: each server's ``RedisStore`` coalesces the async calls in flight to it
  (``batching``), so writes ride in one pipeline per primary and peeks one per replica.
- **Nested calls** (``NestedStore``) go to the primary of the outermost key's shard, where
  every level's counter lives (``nested_codec``): one script, all or nothing.
- **Leases** (``LeaseStore``/``AsyncLeaseStore``, for the concurrency limiter and the fleet
  shedder): every lease call goes to the primary of the shard that owns the caller key, like a
  ``hit``; ``partition_key`` names that shard, so the concurrency limiter keeps one breaker
  per shard too. A fleet shedder's single key lands on one shard.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import redis
import redis.asyncio

from ...algorithms import Outcome
from ...errors import ConfigError, StoreUnavailable
from ...nested import NestedPlan, NestedReply
from ...plan import Plan
from .batching import DEFAULT_BATCHING, Batching
from .keys import check_prefix, encode_tag
from .layout import CompactLayout, check_layout
from .rendezvous import Rendezvous
from .sentinel import SentinelClients, SentinelShard, sentinel_clients
from .single import AsyncClientSource, RedisStore
from .urls import address, check_url, redact

REPLICA_COOLDOWN_MS = 1000
"""How long a replica that failed a read is skipped (reads go to the primary meanwhile)."""


@dataclass(frozen=True, slots=True)
class Shard:
    """One primary (``url``) and the replicas that serve its reads.

    ``name`` places keys (rendezvous hashing); it defaults to the primary's ``host:port/db``.
    """

    url: str
    replicas: Sequence[str] = ()
    name: str = ""

    def __post_init__(self) -> None:
        check_url(self.url, "shard url")
        if isinstance(self.replicas, str) or not isinstance(self.replicas, Sequence):
            raise ConfigError(
                f"replicas={self.replicas!r} is invalid; expected a list of URLs "
                "like ['redis://replica:6379/0']"
            )
        replicas = tuple(check_url(r, "replica url") for r in self.replicas)
        object.__setattr__(self, "replicas", replicas)
        if not isinstance(self.name, str):
            raise ConfigError(f"shard name {self.name!r} is invalid; expected a string")
        if not self.name:
            object.__setattr__(self, "name", address(self.url))

    def __repr__(self) -> str:  # URLs may hold passwords: never shown
        replicas = [redact(url) for url in self.replicas]
        return f"Shard({redact(self.url)!r}, replicas={replicas!r}, name={self.name!r})"


class _Node:
    """One shard's servers as stores, and when each replica may be tried again."""

    __slots__ = ("down_until_ms", "name", "primary", "replicas", "sentinel", "turn")

    def __init__(
        self,
        shard: Shard | SentinelShard,
        prefix: str,
        socket_timeout: float,
        batching: Batching | None,
        layout: CompactLayout | None,
        legacy_keys: bool = False,
    ) -> None:
        self.name = shard.name

        def store(
            url: str | None = None,
            client: redis.Redis | None = None,
            async_client: AsyncClientSource | None = None,
        ) -> RedisStore:
            return RedisStore(
                url, client=client, async_client=async_client, prefix=prefix,
                socket_timeout=socket_timeout, batching=batching, layout=layout,
                legacy_keys=legacy_keys,
            )  # fmt: skip

        self.sentinel: SentinelClients | None = None
        if isinstance(shard, SentinelShard):
            clients = self.sentinel = sentinel_clients(shard, socket_timeout)
            self.primary = store(client=clients.primary, async_client=clients.async_primary)
            # one store over Sentinel's replicas: redis-py picks one per connection
            replicas = store(client=clients.replicas, async_client=clients.async_replicas)
            self.primary.address = f"{shard.name} primary"  # Sentinel names the server
            replicas.address = f"{shard.name} replicas"
            self.replicas: tuple[RedisStore, ...] = (replicas,)
        else:
            self.primary = store(shard.url)
            self.replicas = tuple(store(url) for url in shard.replicas)
        self.down_until_ms = [0] * len(self.replicas)
        self.turn = itertools.count()

    def route(self, plan: Plan) -> tuple[RedisStore, ...]:
        """The stores to try in order: a healthy replica then the primary for peek."""
        replicas = self.replicas
        if plan.op != "peek" or not replicas:
            return (self.primary,)
        start = next(self.turn)
        for i in range(len(replicas)):
            index = (start + i) % len(replicas)
            if self.down_until_ms[index] <= plan.now_ms:
                return (replicas[index], self.primary)
        return (self.primary,)

    def replica_failed(self, store: RedisStore, plan: Plan) -> None:
        """Skip ``store`` (a replica) for the cool-down."""
        self.down_until_ms[self.replicas.index(store)] = plan.now_ms + REPLICA_COOLDOWN_MS


class ShardedRedisStore:
    """Runs each plan on the shard that owns its caller key (see the module docstring)."""

    def __init__(
        self,
        shards: Sequence[Shard | SentinelShard],
        *,
        prefix: str = "rk",
        socket_timeout: float = 0.05,
        batching: Batching | None = DEFAULT_BATCHING,
        layout: CompactLayout | None = None,
        legacy_keys: bool = False,
    ) -> None:
        if isinstance(shards, Shard) or not isinstance(shards, Sequence):
            raise ConfigError(f"shards={shards!r} is invalid; expected a list of Shard(...)")
        for shard in shards:
            if not isinstance(shard, Shard | SentinelShard):
                raise ConfigError(
                    f"shard {shard!r} is invalid; expected Shard(url, replicas=[...]) or "
                    "SentinelShard(service, sentinels=[...])"
                )
        self.shards = tuple(shards)
        self.prefix = check_prefix(prefix)
        self.placement = Rendezvous([s.name for s in self.shards])
        check_layout(layout)
        self._nodes = tuple(
            _Node(s, prefix, socket_timeout, batching, layout, legacy_keys) for s in self.shards
        )

    def __repr__(self) -> str:
        return f"ShardedRedisStore({list(self.placement.names)!r}, prefix={self.prefix!r})"

    def shard_of(self, key: str) -> Shard | SentinelShard:
        """The shard that holds ``key``'s state."""
        return self.shards[self.placement.owner(encode_tag(key))]

    def partition(self, plan: Plan) -> int:
        """The index of the shard that runs ``plan`` (one circuit breaker per shard)."""
        return self.placement.owner(encode_tag(plan.key))

    def partition_key(self, key: str) -> int:
        """The index of the shard that owns caller key ``key`` (``KeyPartitioned``)."""
        return self.placement.owner(encode_tag(key))

    def primary_of(self, key: str) -> RedisStore:
        """The primary of the shard that owns ``key`` (for state kept beside the counters)."""
        return self._nodes[self.partition_key(key)].primary

    def execute(self, plan: Plan) -> tuple[Outcome, ...]:
        """Run one plan on its shard: writes on the primary, ``peek`` on a replica if any."""
        node = self._nodes[self.partition(plan)]
        *replica, primary = node.route(plan)
        for store in replica:
            try:
                return store.execute(plan)
            except StoreUnavailable:
                node.replica_failed(store, plan)
        try:
            return primary.execute(plan)
        except StoreUnavailable as exc:
            raise _unavailable(node, exc) from exc

    async def execute_async(self, plan: Plan) -> tuple[Outcome, ...]:
        """The same as ``execute``, on the asyncio clients."""
        node = self._nodes[self.partition(plan)]
        *replica, primary = node.route(plan)
        for store in replica:
            try:
                return await store.execute_async(plan)
            except StoreUnavailable:
                node.replica_failed(store, plan)
        try:
            return await primary.execute_async(plan)
        except StoreUnavailable as exc:
            raise _unavailable(node, exc) from exc

    def execute_nested(self, plan: NestedPlan) -> NestedReply:
        """Run one nested plan on the primary of its outermost key's shard (``NestedStore``)."""
        node = self._nodes[self.partition_key(plan.key)]
        try:
            return node.primary.execute_nested(plan)
        except StoreUnavailable as exc:
            raise _unavailable(node, exc) from exc

    async def execute_nested_async(self, plan: NestedPlan) -> NestedReply:
        """The same as ``execute_nested``, on the asyncio clients."""
        node = self._nodes[self.partition_key(plan.key)]
        try:
            return await node.primary.execute_nested_async(plan)
        except StoreUnavailable as exc:
            raise _unavailable(node, exc) from exc

    def administer(self, plan: Plan) -> tuple[tuple[Outcome, ...], tuple[Outcome, ...]]:
        """An admin's change on the owning shard's primary (``AdminStore``)."""
        node = self._nodes[self.partition(plan)]
        try:
            return node.primary.administer(plan)
        except StoreUnavailable as exc:
            raise _unavailable(node, exc) from exc

    async def administer_async(self, plan: Plan) -> tuple[tuple[Outcome, ...], tuple[Outcome, ...]]:
        """The same as ``administer``, on the asyncio clients."""
        node = self._nodes[self.partition(plan)]
        try:
            return await node.primary.administer_async(plan)
        except StoreUnavailable as exc:
            raise _unavailable(node, exc) from exc

    def execute_many(self, plans: list[Plan]) -> list[tuple[Outcome, ...]]:
        """Plans of one caller key in one round trip to its shard (peeks on a replica if it
        has one, else the primary); plans of several keys one by one (``ManyStore``)."""
        if not plans or any(plan.key != plans[0].key for plan in plans):
            return [self.execute(plan) for plan in plans]
        node = self._nodes[self.partition(plans[0])]
        reads = all(plan.op == "peek" for plan in plans)
        *replica, primary = node.route(plans[0]) if reads else (node.primary,)
        for store in replica:
            try:
                return store.execute_many(plans)
            except StoreUnavailable:
                node.replica_failed(store, plans[0])
        try:
            return primary.execute_many(plans)
        except StoreUnavailable as exc:
            raise _unavailable(node, exc) from exc

    async def execute_many_async(self, plans: list[Plan]) -> list[tuple[Outcome, ...]]:
        """The same as ``execute_many``: the calls ride in their server's batch."""
        return list(await asyncio.gather(*(self.execute_async(plan) for plan in plans)))

    def acquire_lease(
        self, key: str, lease_id: str, capacity: int, now_ms: int, expires_ms: int
    ) -> tuple[bool, int]:
        """Sweep, count and add one lease on the owning shard's primary (``LeaseStore``)."""
        node = self._nodes[self.partition_key(key)]
        try:
            return node.primary.acquire_lease(key, lease_id, capacity, now_ms, expires_ms)
        except StoreUnavailable as exc:
            raise _unavailable(node, exc) from exc

    def release_lease(self, key: str, lease_id: str, now_ms: int) -> bool:
        """Remove one lease on the owning shard's primary (``LeaseStore``)."""
        node = self._nodes[self.partition_key(key)]
        try:
            return node.primary.release_lease(key, lease_id, now_ms)
        except StoreUnavailable as exc:
            raise _unavailable(node, exc) from exc

    def count_leases(self, key: str, now_ms: int) -> int:
        """Live leases of ``key``, from the owning shard's primary (``LeaseStore``)."""
        node = self._nodes[self.partition_key(key)]
        try:
            return node.primary.count_leases(key, now_ms)
        except StoreUnavailable as exc:
            raise _unavailable(node, exc) from exc

    async def acquire_lease_async(
        self, key: str, lease_id: str, capacity: int, now_ms: int, expires_ms: int
    ) -> tuple[bool, int]:
        """The same as ``acquire_lease``, on the asyncio clients."""
        node = self._nodes[self.partition_key(key)]
        try:
            return await node.primary.acquire_lease_async(
                key, lease_id, capacity, now_ms, expires_ms
            )
        except StoreUnavailable as exc:
            raise _unavailable(node, exc) from exc

    async def release_lease_async(self, key: str, lease_id: str, now_ms: int) -> bool:
        """The same as ``release_lease``, on the asyncio clients."""
        node = self._nodes[self.partition_key(key)]
        try:
            return await node.primary.release_lease_async(key, lease_id, now_ms)
        except StoreUnavailable as exc:
            raise _unavailable(node, exc) from exc

    async def count_leases_async(self, key: str, now_ms: int) -> int:
        """The same as ``count_leases``, on the asyncio clients."""
        node = self._nodes[self.partition_key(key)]
        try:
            return await node.primary.count_leases_async(key, now_ms)
        except StoreUnavailable as exc:
            raise _unavailable(node, exc) from exc

    def ping(self) -> None:
        """Check every server (primaries and replicas) answers; ``StoreUnavailable`` naming
        the shard and server that does not."""
        for node in self._nodes:
            for store in (node.primary, *node.replicas):
                try:
                    store.ping()
                except StoreUnavailable as exc:
                    raise _unavailable(node, exc) from exc

    async def ping_async(self) -> None:
        """``ping`` on the asyncio clients."""
        for node in self._nodes:
            for store in (node.primary, *node.replicas):
                try:
                    await store.ping_async()
                except StoreUnavailable as exc:
                    raise _unavailable(node, exc) from exc

    def close(self) -> None:
        """Close every sync client's connections."""
        for node in self._nodes:
            for store in (node.primary, *node.replicas):
                store.close()
            if node.sentinel is not None:
                node.sentinel.close()

    async def aclose(self) -> None:
        """Close the running event loop's async connections (see ``RedisStore.aclose``)."""
        for node in self._nodes:
            for store in (node.primary, *node.replicas):
                await store.aclose()


def _unavailable(node: _Node, exc: StoreUnavailable) -> StoreUnavailable:
    return StoreUnavailable(f"shard {node.name}: {exc}")


class SentinelStore(ShardedRedisStore):
    """One primary and its replicas found through Redis Sentinel (see ``sentinel``): a
    ``ShardedRedisStore`` of one ``SentinelShard``."""

    def __init__(
        self,
        service: str,
        sentinels: Sequence[str],
        *,
        url: str = "redis:///0",
        prefix: str = "rk",
        socket_timeout: float = 0.05,
        batching: Batching | None = DEFAULT_BATCHING,
        layout: CompactLayout | None = None,
        legacy_keys: bool = False,
    ) -> None:
        shard = SentinelShard(service, sentinels, url)
        super().__init__(
            [shard],
            prefix=prefix,
            socket_timeout=socket_timeout,
            batching=batching,
            layout=layout,
            legacy_keys=legacy_keys,
        )

    def __repr__(self) -> str:
        return f"SentinelStore({self.shards[0]!r}, prefix={self.prefix!r})"
