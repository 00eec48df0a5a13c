"""Leases in Redis: ``RedisLeases`` (redis-py client) and ``AsyncRedisLeases`` (redis.asyncio).

Each caller key's leases are one sorted set, ``{prefix}{{tag}}c`` (``keys.redis_key``, so it
shares the caller key's hash tag and works on Cluster), scored by expiry in epoch ms by the
limiter's clock. ``lua/concurrency.lua`` sweeps, counts and adds in one script; the key's
Redis TTL (relative, ``lease TTL + margin``) only cleans up a set nobody touches any more.
The script is sent as ``EVALSHA`` and, after ``NOSCRIPT``, once as ``EVAL`` with its source,
as the plan scripts are (redis-py's ``register_script`` objects reload the script with a
separate ``SCRIPT LOAD``, which on the asyncio cluster client broke concurrent first calls).

``LeaseCall`` is one lease operation as plain data: what a batch (``batching``) sends for it
and how its reply reads. ``AsyncRedisLeases`` hands its calls to the store's batcher when the
store batches, so leases ride in the same pipelines as decisions.

Driver errors are wrapped in ``StoreUnavailable`` here, at the store edge.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

import redis
import redis.asyncio
from redis.exceptions import NoScriptError

from ...errors import StoreUnavailable
from .keys import check_prefix, redis_key

SLOT = "c"
TTL_MARGIN_MS = 1_000
SCRIPT = (resources.files("ratekeeper.algorithms") / "lua" / "concurrency.lua").read_text("utf-8")
SHA = hashlib.sha1(SCRIPT.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class LeaseCall:
    """One lease operation on caller key ``key``: the script's ARGV in ``args``."""

    key: str
    args: tuple[object, ...]

    def command(self, prefix: str) -> tuple[object, ...]:
        """The ``EVALSHA`` command for it."""
        return ("EVALSHA", SHA, 1, redis_key(prefix, self.key, SLOT), *self.args)

    def fallback(self, prefix: str) -> tuple[object, ...]:
        """The same as ``EVAL`` with the source, for after ``NOSCRIPT``."""
        return ("EVAL", SCRIPT, 1, redis_key(prefix, self.key, SLOT), *self.args)


def lease_reply(reply: Any) -> tuple[int, int]:
    """The script's two integers."""
    return int(reply[0]), int(reply[1])


Submit = Callable[[LeaseCall], Awaitable[Any]]
"""A batcher's ``submit``: sends a ``LeaseCall`` in a batch and returns its parsed reply."""


def _acquire_args(
    lease_id: str, capacity: int, now_ms: int, expires_ms: int
) -> tuple[str, int, str, int, int, int]:
    ttl_ms = max(1, expires_ms - now_ms) + TTL_MARGIN_MS
    return ("acquire", now_ms, lease_id, capacity, expires_ms, ttl_ms)


class RedisLeases:
    """``LeaseStore`` over a sync redis-py client (``Redis`` or ``RedisCluster``)."""

    def __init__(self, client: Any, prefix: str = "rk") -> None:
        self.client = client
        self.prefix = check_prefix(prefix)

    def _run(self, key: str, args: tuple[object, ...]) -> tuple[int, int]:
        call = LeaseCall(key, args)
        try:
            try:
                reply = self.client.execute_command(*call.command(self.prefix))
            except NoScriptError:
                reply = self.client.execute_command(*call.fallback(self.prefix))
        except (redis.RedisError, OSError) as exc:
            raise StoreUnavailable(f"redis lease store failed: {exc}") from exc
        return lease_reply(reply)

    def acquire_lease(
        self, key: str, lease_id: str, capacity: int, now_ms: int, expires_ms: int
    ) -> tuple[bool, int]:
        """Sweep, count and add in one script (see ``LeaseStore``)."""
        ok, count = self._run(key, _acquire_args(lease_id, capacity, now_ms, expires_ms))
        return bool(ok), count

    def release_lease(self, key: str, lease_id: str, now_ms: int) -> bool:
        """Remove one lease (see ``LeaseStore``)."""
        return bool(self._run(key, ("release", now_ms, lease_id))[0])

    def count_leases(self, key: str, now_ms: int) -> int:
        """Live leases of ``key`` (see ``LeaseStore``)."""
        return self._run(key, ("count", now_ms))[1]


class AsyncRedisLeases:
    """``AsyncLeaseStore`` over a ``redis.asyncio`` client, or the store's batcher (``submit``)."""

    def __init__(self, client: Any, prefix: str = "rk", submit: Submit | None = None) -> None:
        self.client = client
        self.prefix = check_prefix(prefix)
        self.submit = submit

    async def _run(self, key: str, args: tuple[object, ...]) -> tuple[int, int]:
        if self.submit is not None:  # the batcher wraps its errors in StoreUnavailable
            result: tuple[int, int] = await self.submit(LeaseCall(key, args))
            return result
        return await self.run(LeaseCall(key, args))

    async def run(self, call: LeaseCall) -> tuple[int, int]:
        """Send one lease call on the client (never batched)."""
        try:
            try:
                reply = await self.client.execute_command(*call.command(self.prefix))
            except NoScriptError:
                reply = await self.client.execute_command(*call.fallback(self.prefix))
        except (redis.asyncio.RedisError, OSError) as exc:
            raise StoreUnavailable(f"redis lease store failed: {exc}") from exc
        return lease_reply(reply)

    async def acquire_lease_async(
        self, key: str, lease_id: str, capacity: int, now_ms: int, expires_ms: int
    ) -> tuple[bool, int]:
        """Sweep, count and add in one script (see ``LeaseStore``)."""
        ok, count = await self._run(key, _acquire_args(lease_id, capacity, now_ms, expires_ms))
        return bool(ok), count

    async def release_lease_async(self, key: str, lease_id: str, now_ms: int) -> bool:
        """Remove one lease (see ``LeaseStore``)."""
        return bool((await self._run(key, ("release", now_ms, lease_id)))[0])

    async def count_leases_async(self, key: str, now_ms: int) -> int:
        """Live leases of ``key`` (see ``LeaseStore``)."""
        return (await self._run(key, ("count", now_ms)))[1]
