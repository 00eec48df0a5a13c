"""Leases in Redis: ``RedisLeases`` (redis-py client) and ``AsyncRedisLeases`` (redis.asyncio).

Each caller key's leases are one sorted set, ``{prefix}{{tag}}c`` (``keys.redis_key``, so it
shares the caller key's hash tag and works on Cluster), scored by expiry in epoch ms by the
limiter's clock. ``lua/concurrency.lua`` sweeps, counts and adds in one script; the key's
Redis TTL (relative, ``lease TTL + margin``) only cleans up a set nobody touches any more.
The script is sent as ``EVALSHA`` and, after ``NOSCRIPT``, once as ``EVAL`` with its source,
as the plan scripts are (redis-py's ``register_script`` objects reload the script with a
separate ``SCRIPT LOAD``, which on the asyncio cluster client broke concurrent first calls).

Driver errors are wrapped in ``StoreUnavailable`` here, at the store edge.
"""

from __future__ import annotations

import hashlib
from importlib import resources
from typing import Any

import redis
import redis.asyncio
from redis.exceptions import NoScriptError

from ..errors import StoreUnavailable
from .keys import check_prefix, redis_key

SLOT = "c"
TTL_MARGIN_MS = 1_000
SCRIPT = (resources.files("ratekeeper.algorithms") / "lua" / "concurrency.lua").read_text("utf-8")
SHA = hashlib.sha1(SCRIPT.encode("utf-8")).hexdigest()


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
        name = redis_key(self.prefix, key, SLOT)
        try:
            try:
                reply = self.client.execute_command("EVALSHA", SHA, 1, name, *args)
            except NoScriptError:
                reply = self.client.execute_command("EVAL", SCRIPT, 1, name, *args)
        except (redis.RedisError, OSError) as exc:
            raise StoreUnavailable(f"redis lease store failed: {exc}") from exc
        return int(reply[0]), int(reply[1])

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
    """``AsyncLeaseStore`` over a ``redis.asyncio`` client."""

    def __init__(self, client: Any, prefix: str = "rk") -> None:
        self.client = client
        self.prefix = check_prefix(prefix)

    async def _run(self, key: str, args: tuple[object, ...]) -> tuple[int, int]:
        name = redis_key(self.prefix, key, SLOT)
        try:
            try:
                reply = await self.client.execute_command("EVALSHA", SHA, 1, name, *args)
            except NoScriptError:
                reply = await self.client.execute_command("EVAL", SCRIPT, 1, name, *args)
        except (redis.asyncio.RedisError, OSError) as exc:
            raise StoreUnavailable(f"redis lease store failed: {exc}") from exc
        return int(reply[0]), int(reply[1])

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
