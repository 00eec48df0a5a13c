"""``ClusterBatcher``: request coalescing on a Redis Cluster, one batch per primary.

A plan goes to the primary that owns its slot in the cluster client's slot map and rides in
that node's batch: a ``Batcher`` over a ``RedisPipeline`` on a plain connection to the node
(same scheme and credentials as the cluster URL), so many decisions cost one round trip per
node, as on a single Redis. Each plan's keys share one hash tag, so one node holds them all.

The slot map can be stale (a resharded slot, a failover). A plan the node refuses with
``MOVED`` or ``ASK``, or whose node connection was refused or dropped before any reply, is
sent again through the cluster client, which follows the redirect and refreshes its map; the
next plans of that slot then go to the new owner's batch. A timeout is never re-sent (the
script may have run): that plan fails, and the limiter fails open. The cluster is one failure
domain, as for ``RedisClusterStore`` (one circuit breaker).
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import redis.asyncio
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException

from ..algorithms import Outcome
from ..errors import ConfigError, NotSent
from ..plan import Plan
from ..stores.cluster import RedisClusterStore
from ..stores.keys import encode_tag
from ..stores.redis import client_options
from .batching import Batcher, RedisPipeline, check_batch
from .metrics import Metrics


class ClusterBatcher:
    """Batches plans per cluster primary; an ``AsyncStore`` like ``Batcher``."""

    def __init__(
        self,
        store: RedisClusterStore,
        socket_timeout: float,
        metrics: Metrics | None = None,
        max_size: int = 128,
        max_wait: float = 0.001,
    ) -> None:
        if store.async_client is None or store.url is None:
            raise ConfigError("ClusterBatcher needs a RedisClusterStore built from a url")
        check_batch(max_size, max_wait)
        self.store = store
        self.socket_timeout = socket_timeout
        self.metrics = metrics
        self.max_size = max_size
        self.max_wait = max_wait
        self._batchers: dict[tuple[str, int], Batcher] = {}
        self.resent = 0
        """Plans sent again through the cluster client (a redirect or a lost node)."""

    async def execute_async(self, plan: Plan) -> tuple[Outcome, ...]:
        """Run ``plan`` in its primary's batch; through the cluster client if that fails."""
        client = self.store.async_client
        assert client is not None  # checked in __init__
        try:
            await self.store.ready()
            # every key of the plan is hash-tagged ``{tag}``: the tag alone gives their slot
            slot = client.keyslot(encode_tag(plan.key))
            node = client.nodes_manager.get_node_from_slot(slot)
        except (RedisClusterException, RedisConnectionError, OSError):
            # no slot map (the cluster is down or changing): the cluster client's own path
            # fails or recovers exactly as unbatched
            return await self.store.execute_async(plan)
        try:
            return await self._batcher(node.host, int(node.port)).execute_async(plan)
        except NotSent:  # a redirect, or the node is gone: the cluster client knows better
            pass
        self.resent += 1
        return await self.store.execute_async(plan)

    def _batcher(self, host: str, port: int) -> Batcher:
        batcher = self._batchers.get((host, port))
        if batcher is None:
            client = redis.asyncio.Redis.from_url(
                node_url(self.store.url or "", host, port), **client_options(self.socket_timeout)
            )
            pipeline = RedisPipeline(client, self.store.prefix)
            batcher = Batcher(pipeline, self.metrics, self.max_size, self.max_wait)
            self._batchers[(host, port)] = batcher
        return batcher

    async def aclose(self) -> None:
        """Close the per-node connections."""
        for batcher in self._batchers.values():
            pipeline = batcher.execute_many
            if isinstance(pipeline, RedisPipeline):
                await pipeline.client.aclose()


def node_url(url: str, host: str, port: int) -> str:
    """``url`` (scheme, credentials, options) pointed at one node."""
    parts = urlsplit(url)
    credentials = parts.netloc.rpartition("@")[0]
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    netloc = f"{credentials}@{where}" if credentials else where
    return urlunsplit((parts.scheme, netloc, "", parts.query, ""))
