"""Slice and heartbeat calls on every store: the I/O half of ``local_budget``.

A ``Slicer`` runs one ``slices.take`` (``SliceCall``) or one ``heartbeat.beat`` on a store,
sync or async, and nothing else:

- ``MemorySlicer``: the pure steps on a ``MemoryStore``'s data under its lock
  (``MemoryStore.transact``): the reference semantics, and what limiters in one process share.
- ``RedisSlicer``: ``lua/slices.lua`` and ``lua/heartbeat.lua`` sent as ``EVALSHA`` (once as
  ``EVAL`` with the source after ``NOSCRIPT``) on the clients of a ``RedisStore``, of the shard
  that owns the caller key in a ``ShardedRedisStore`` (its primary), or of a
  ``RedisClusterStore`` (the cluster client routes by the keys' hash tag). Slice calls are never
  batched: a process makes few of them (one per slice), and a batch would only delay them.

Keys: a slice reads and writes the algorithm's own state key (``keys.redis_key``) and the key's
reservation, the same key with ``^`` after the slot (``rk{user:42}t:100/1m^``): one hash tag,
so one script on one Cluster slot. Heartbeats go to ``{prefix}{#live}`` (a tag no caller key
can have: caller tags never start with ``#`` unless hashed, and then 64 hex digits follow).
Only the default key layout is supported (``CompactLayout`` is refused by ``slicer_for``).

``slicer_for(store)`` picks the slicer of a store and refuses any other store, naming it.
Driver errors are raised as ``StoreUnavailable`` with the driver's exception as ``__cause__``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

from redis.exceptions import NoScriptError, RedisClusterException, RedisError

from ..algorithms import heartbeat, slices
from ..algorithms.base import INF, Limit
from ..errors import ConfigError, StoreUnavailable
from .memory import MemoryStore
from .redis.cluster import RedisClusterStore
from .redis.codec import VALUES
from .redis.keys import redis_key
from .redis.sharded import ShardedRedisStore
from .redis.single import RedisStore

RESERVED = "^"
"""Appended to a slot: the key of its reservation."""
LIVE_SLOT = ("#live", "")
"""The heartbeats' entry in a ``MemoryStore``."""
_ERRORS = (RedisError, RedisClusterException, OSError)


def _script(*names: str) -> tuple[str, str]:
    lua = resources.files("ratekeeper.algorithms").joinpath("lua")
    source = "".join(lua.joinpath(n).read_text("utf-8") for n in names)
    return source, hashlib.sha1(source.encode("utf-8")).hexdigest()


SLICES = _script("integer.lua", *(f"value_{name}.lua" for name in VALUES), "slices.lua")
HEARTBEAT = _script("heartbeat.lua")


@dataclass(frozen=True, slots=True)
class SliceCall:
    """One ``take`` on one caller key's limit (``slot``, as ``Policy.slots`` names it)."""

    key: str
    slot: str
    name: str
    limit: Limit
    now_ms: int
    ask: slices.Ask

    def argv(self) -> tuple[object, ...]:
        """The script's ARGV (see ``lua/slices.lua``)."""
        limit, a = self.limit, self.ask
        extra = limit.flags if self.name == "fixed_window" else limit.capacity
        settles = ",".join(f"{grant}:{used}" for grant, used in a.settles)
        return (
            self.name, self.now_ms, limit.count, limit.period_ms, extra, a.need, a.want,
            a.share, a.debt, settles, a.slice_id or "-", a.epoch_ms, 1 if a.reset else 0,
        )  # fmt: skip


def taken(reply: Any) -> slices.Taken:
    """The script's eight integers -> ``Taken`` (retry -1 is never)."""
    g, r, s, t, e, h, ret, c = (int(x) for x in reply)
    return slices.Taken(g, r, s, INF if t < 0 else float(t), e, h, ret, c)


class MemorySlicer:
    """Slices and heartbeats in a ``MemoryStore`` (the reference semantics)."""

    def __init__(self, store: MemoryStore) -> None:
        self.store = store

    def take(self, call: SliceCall) -> slices.Taken:
        """Run ``slices.take`` on the key's state and reservation, atomically."""
        name, limit, now = call.name, call.limit, call.now_ms

        def change(states: list[Any]) -> tuple[slices.Taken, list[Any] | None]:
            state, pairs = states
            answer, state, pairs, changed = slices.take(
                name, state, pairs or (), limit, now, call.ask
            )
            if not changed:
                return answer, None
            if state is None:  # a reset with nothing held: as a plain reset
                return answer, [None, None]
            keep = slices.expires_ms(name, state, pairs, limit)
            return answer, [(keep, state), (keep, pairs) if pairs else None]

        keys = [(call.slot, call.key), (call.slot + RESERVED, call.key)]
        return self.store.transact(keys, now, change)

    def beat(self, process: str, now_ms: int, expires_ms: int) -> int:
        """Register ``process`` (``heartbeat.beat``); the live count."""

        def change(states: list[Any]) -> tuple[int, list[Any]]:
            live, members = heartbeat.beat(states[0], now_ms, process, expires_ms)
            return live, [(heartbeat.expires(members), members) if members else None]

        return self.store.transact([LIVE_SLOT], now_ms, change)

    async def take_async(self, call: SliceCall) -> slices.Taken:
        """The same as ``take``: nothing in it blocks."""
        return self.take(call)

    async def beat_async(self, process: str, now_ms: int, expires_ms: int) -> int:
        """The same as ``beat``."""
        return self.beat(process, now_ms, expires_ms)


Clients = tuple[Callable[[], Any], Callable[[], Any]]
"""How to get the (sync, async) clients that own a caller key (None when absent)."""


class RedisSlicer:
    """Slices and heartbeats on Redis (one server, a shard's primary, or a Cluster)."""

    def __init__(
        self,
        prefix: str,
        route: Callable[[str], Clients],
        name: str,
        ready: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.prefix = prefix
        self.route = route
        self.name = name
        self.ready = ready
        """Awaited before an async call (a cluster client loads its slot map)."""
        self.live_key = f"{prefix}{{#live}}"

    def _command(self, call: SliceCall) -> tuple[object, ...]:
        state = redis_key(self.prefix, call.key, call.slot)
        return ("EVALSHA", SLICES[1], 2, state, state + RESERVED, *call.argv())

    def _beat(self, process: str, now_ms: int, expires_ms: int) -> tuple[object, ...]:
        return ("EVALSHA", HEARTBEAT[1], 1, self.live_key, now_ms, process, expires_ms)

    def _client(self, key: str, which: int) -> Any:
        client = self.route(key)[which]()
        if client is None:
            kind = "an async" if which else "a sync"
            raise ConfigError(f"{self.name} has no {kind} client for this call")
        return client

    def _run(self, key: str, command: tuple[object, ...], source: str) -> Any:
        client = self._client(key, 0)
        try:
            try:
                return client.execute_command(*command)
            except NoScriptError:
                return client.execute_command("EVAL", source, *command[2:])
        except _ERRORS as exc:
            raise StoreUnavailable(f"{self.name} could not run a slice call: {exc}") from exc

    async def _run_async(self, key: str, command: tuple[object, ...], source: str) -> Any:
        client = self._client(key, 1)
        try:
            if self.ready is not None:
                await self.ready()
            try:
                return await client.execute_command(*command)
            except NoScriptError:
                return await client.execute_command("EVAL", source, *command[2:])
        except _ERRORS as exc:
            raise StoreUnavailable(f"{self.name} could not run a slice call: {exc}") from exc

    def take(self, call: SliceCall) -> slices.Taken:
        """One ``slices.lua`` call on the key's server."""
        return taken(self._run(call.key, self._command(call), SLICES[0]))

    async def take_async(self, call: SliceCall) -> slices.Taken:
        """The same as ``take``, on the asyncio client."""
        return taken(await self._run_async(call.key, self._command(call), SLICES[0]))

    def beat(self, process: str, now_ms: int, expires_ms: int) -> int:
        """One ``heartbeat.lua`` call; the live count."""
        command = self._beat(process, now_ms, expires_ms)
        return int(self._run("#live", command, HEARTBEAT[0]))

    async def beat_async(self, process: str, now_ms: int, expires_ms: int) -> int:
        """The same as ``beat``, on the asyncio client."""
        command = self._beat(process, now_ms, expires_ms)
        return int(await self._run_async("#live", command, HEARTBEAT[0]))


Slicer = MemorySlicer | RedisSlicer


def slicer_for(store: object) -> Slicer:
    """The slicer of ``store``; a ``ConfigError`` naming it for any other store."""
    if isinstance(store, MemoryStore):
        return MemorySlicer(store)
    if isinstance(store, RedisStore):
        _default_layout(store, store.codec.layout)
        one = store
        return RedisSlicer(
            store.prefix, lambda key: (lambda: one.client, lambda: one.async_client), repr(store)
        )
    if isinstance(store, ShardedRedisStore):
        # the owning shard's primary (``_nodes`` is private to sharded.py: the routing it does)
        nodes = store._nodes
        _default_layout(store, nodes[0].primary.codec.layout)
        place = store.partition_key

        def route(key: str) -> Clients:
            primary = nodes[place(key)].primary
            return (lambda: primary.client, lambda: primary.async_client)

        return RedisSlicer(store.prefix, route, repr(store))
    if isinstance(store, RedisClusterStore):
        _default_layout(store, store.codec.layout)
        # ``_sync_client`` builds the sync cluster client on first use, as ``execute`` does
        clients: Clients = (store._sync_client, lambda: cluster.async_client)
        cluster = store
        return RedisSlicer(store.prefix, lambda key: clients, repr(store), cluster.ready)
    raise ConfigError(
        f"store {store!r} cannot hold slices; expected a MemoryStore, RedisStore, "
        "ShardedRedisStore or RedisClusterStore"
    )


def _default_layout(store: object, layout: object) -> None:
    if layout is not None:
        raise ConfigError(
            f"store {store!r} uses CompactLayout; slices need the default key layout (layout=None)"
        )
