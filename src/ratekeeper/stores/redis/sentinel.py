"""Redis Sentinel: a shard whose primary and replicas are found, and followed, through Sentinel.

``SentinelShard(service, sentinels, url=...)`` names a primary that Sentinel monitors as
``service``; ``sentinels`` are the Sentinels' URLs (their credentials and TLS options, the same
for all), ``url`` carries the credentials, database and TLS options of the Redis servers
themselves, with no host (Sentinel names the hosts): ``redis://:secret@/0``,
``rediss://user:secret@/0?ssl_ca_certs=/etc/redis/ca.crt``. It is a shard of
``ShardedRedisStore`` like ``Shard`` (``SentinelStore`` is the one-shard case).

How it follows a failover: every new connection asks a Sentinel for the current primary
(redis-py's Sentinel connection pools). When the primary dies its connections fail, the calls
on them fail open and the shard's circuit breaker opens; each trial connects to whatever
Sentinel names, so once a replica is promoted the next trial reaches it and decisions resume.
A connection still open to a primary that was demoted (it came back, or was partitioned) meets
``READONLY`` on its next write, is dropped, and the next one asks Sentinel again. Peeks go to a
replica Sentinel lists (round robin, skipping replicas Sentinel thinks are down), falling back
to the primary, as for ``Shard``.

Connections get the store's ``socket_timeout`` (Sentinels too) and at most one immediate retry
of a dropped connection, as ``RedisStore`` gives clients it builds. The asyncio clients, and the
Sentinel manager each is found through, are built once per event loop (``stores.loops``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import redis
import redis.asyncio
import redis.asyncio.sentinel
import redis.sentinel
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.connection import parse_url
from redis.retry import Retry

from ...errors import ConfigError
from .urls import check_url, redact

_DROPPED = (redis.ConnectionError,)


@dataclass(frozen=True, slots=True)
class SentinelShard:
    """A primary and its replicas as Sentinel knows them under ``service``.

    ``name`` places keys (rendezvous hashing); it defaults to ``sentinel:<service>``.
    """

    service: str
    sentinels: Sequence[str]
    url: str = "redis:///0"
    name: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.service, str) or not self.service:
            raise ConfigError(
                f"service {self.service!r} is invalid; expected the name Sentinel monitors, "
                "e.g. 'mymaster'"
            )
        if isinstance(self.sentinels, str) or not isinstance(self.sentinels, Sequence):
            raise ConfigError(
                f"sentinels={self.sentinels!r} is invalid; expected a list of URLs like "
                "['redis://10.0.0.1:26379', 'redis://10.0.0.2:26379']"
            )
        sentinels = tuple(check_url(s, "sentinel url") for s in self.sentinels)
        if not sentinels or any(urlsplit(s).scheme == "unix" for s in sentinels):
            raise ConfigError(
                f"sentinels={[redact(s) for s in sentinels]!r} is invalid; expected one or "
                "more redis:// or rediss:// URLs"
            )
        object.__setattr__(self, "sentinels", sentinels)
        check_url(self.url, "url", host=False)
        if not isinstance(self.name, str):
            raise ConfigError(f"shard name {self.name!r} is invalid; expected a string")
        if not self.name:
            object.__setattr__(self, "name", f"sentinel:{self.service}")

    def __repr__(self) -> str:  # URLs may hold passwords: never shown
        sentinels = [redact(url) for url in self.sentinels]
        return (
            f"SentinelShard({self.service!r}, sentinels={sentinels!r}, url={redact(self.url)!r}, "
            f"name={self.name!r})"
        )


def _options(url: str) -> dict[str, Any]:
    """redis-py connection options from a URL, without its host (``ssl`` for ``rediss``)."""
    options: dict[str, Any] = parse_url(url)  # type: ignore[no-untyped-call, unused-ignore]  # untyped in redis-py
    for key in ("host", "port", "connection_class"):
        options.pop(key, None)
    if urlsplit(url).scheme == "rediss":
        options["ssl"] = True
    return options


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "", parts.port or 26379


@dataclass(slots=True)
class SentinelClients:
    """The sync clients of one Sentinel shard (primary, replicas, Sentinels), and functions
    building its asyncio ones: ``async_primary()``/``async_replicas()`` each make a client on
    a Sentinel manager of its own, once per event loop (see ``stores.loops``)."""

    primary: redis.Redis
    replicas: redis.Redis
    sentinel: redis.sentinel.Sentinel
    async_primary: Callable[[], redis.asyncio.Redis]
    async_replicas: Callable[[], redis.asyncio.Redis]

    def close(self) -> None:
        """Close the sync connections to the Sentinels (the stores close their own)."""
        for client in self.sentinel.sentinels:
            client.close()


async def aclose_manager(client: redis.asyncio.Redis | None) -> None:
    """Close the connections to the Sentinels of the manager behind an asyncio client made by
    ``SentinelClients`` (the client's own connections are its store's to close)."""
    pool = None if client is None else client.connection_pool
    if isinstance(pool, redis.asyncio.sentinel.SentinelConnectionPool):
        await pool.sentinel_manager.aclose()


def sentinel_clients(shard: SentinelShard, socket_timeout: float) -> SentinelClients:
    """Clients that find ``shard``'s primary and replicas through its Sentinels."""
    timeouts = {"socket_timeout": socket_timeout, "socket_connect_timeout": socket_timeout}
    addresses = [_address(url) for url in shard.sentinels]
    on_sentinels = {**_options(shard.sentinels[0]), **timeouts}
    on_servers = {**_options(shard.url), **timeouts}
    # one immediate retry of a dropped connection, never of a timeout (as RedisStore's clients)
    retry = Retry(NoBackoff(), 1, supported_errors=_DROPPED)
    # redis-py before 8 has untyped Sentinel classes (8.x types them)
    sentinel = redis.sentinel.Sentinel(  # type: ignore[no-untyped-call, unused-ignore]
        addresses, sentinel_kwargs={**on_sentinels, "retry": retry}, **on_servers
    )
    service = shard.service

    def manager() -> redis.asyncio.sentinel.Sentinel:
        async_retry = AsyncRetry(NoBackoff(), 1, supported_errors=_DROPPED)
        return redis.asyncio.sentinel.Sentinel(  # type: ignore[no-untyped-call, unused-ignore]
            addresses, sentinel_kwargs={**on_sentinels, "retry": async_retry}, **on_servers
        )

    def async_primary() -> redis.asyncio.Redis:
        async_retry = AsyncRetry(NoBackoff(), 1, supported_errors=_DROPPED)
        client: redis.asyncio.Redis = manager().master_for(service, retry=async_retry)
        return client

    def async_replicas() -> redis.asyncio.Redis:
        async_retry = AsyncRetry(NoBackoff(), 1, supported_errors=_DROPPED)
        client: redis.asyncio.Redis = manager().slave_for(service, retry=async_retry)
        return client

    return SentinelClients(
        sentinel.master_for(service, retry=retry),  # type: ignore[no-untyped-call, unused-ignore]
        sentinel.slave_for(service, retry=retry),  # type: ignore[no-untyped-call, unused-ignore]
        sentinel,
        async_primary,
        async_replicas,
    )
