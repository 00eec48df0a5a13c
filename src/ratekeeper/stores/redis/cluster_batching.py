"""``ClusterBatcher``: request coalescing on a Redis Cluster, one batch per primary.

A call (plan, nested plan or lease call) goes to the primary that owns its slot in the
cluster client's slot map and rides in that node's batch: a ``Batcher`` over a
``RedisPipeline`` on a plain connection to the node (same scheme, credentials and options
as the cluster URL), so many decisions cost one round trip per node, as on a single Redis.
Each call's keys share one hash tag, so one node holds them all.

The slot map can be stale (a resharded slot, a failover). A call the node refuses with
``MOVED`` or ``ASK``, or whose node connection was refused or dropped before any reply, is sent
again through the cluster client (``direct``), which follows the redirect and refreshes its
map; the next calls of that slot then go to the new owner's batch. A timeout is never re-sent
(the script may have run): that call fails, and the limiter fails open. The cluster is one
failure domain, as for ``RedisClusterStore`` (one circuit breaker). A ``ClusterBatcher`` serves
one event loop: the store keeps one per loop with its cluster client (``loops.PerLoop``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import redis.asyncio
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException

from ...errors import NotSent
from ...nested import NestedPlan
from ...plan import Plan
from .batching import Batcher, Batching
from .codec import Codec
from .keys import encode_tag
from .nested_codec import nested_tag
from .pipeline import Call, RedisPipeline

Direct = Callable[[Call], Awaitable[tuple[Any, ...]]]


class ClusterBatcher:
    """Batches calls per cluster primary; ``submit`` is the same as ``Batcher.submit``."""

    def __init__(
        self,
        client: redis.asyncio.RedisCluster,
        url: str,
        codec: Codec,
        options: dict[str, Any],
        settings: Batching,
        ready: Callable[[], Awaitable[None]],
        direct: Direct,
    ) -> None:
        self.client = client
        self.url = url
        self.codec = codec
        self.options = options
        self.settings = settings
        self.ready = ready
        self.direct = direct
        self.batchers: dict[tuple[str, int], Batcher[Call, tuple[Any, ...]]] = {}
        self.resent = 0
        """Calls sent again through the cluster client (a redirect or a lost node)."""

    async def submit(self, call: Call) -> tuple[Any, ...]:
        """Run ``call`` in its primary's batch; through the cluster client if that fails."""
        client = self.client
        try:
            await self.ready()
            # every key of a call is hash-tagged ``{tag}``: the tag alone gives their slot
            if type(call) is Plan:
                tag = self.codec.tag(call)
            elif type(call) is NestedPlan:
                tag = nested_tag(self.codec, call)
            else:
                tag = encode_tag(call.key)
            slot = client.keyslot(tag)
            node = client.nodes_manager.get_node_from_slot(slot)
        except (RedisClusterException, RedisConnectionError, OSError):
            # no slot map (the cluster is down or changing): the cluster client's own path
            # fails or recovers exactly as unbatched
            return await self.direct(call)
        try:
            return await self._batcher(node.host, int(node.port)).submit(call)
        except NotSent:  # a redirect, or the node is gone: the cluster client knows better
            pass
        self.resent += 1
        return await self.direct(call)

    def _batcher(self, host: str, port: int) -> Batcher[Call, tuple[Any, ...]]:
        batcher = self.batchers.get((host, port))
        if batcher is None:
            client = redis.asyncio.Redis.from_url(node_url(self.url, host, port), **self.options)
            batcher = Batcher(RedisPipeline(client, self.codec), self.settings)
            self.batchers[(host, port)] = batcher
        return batcher

    def pipelines(self) -> list[RedisPipeline]:
        """The per-node pipelines made so far."""
        out = []
        for batcher in self.batchers.values():
            assert isinstance(batcher.execute_many, RedisPipeline)
            out.append(batcher.execute_many)
        return out

    async def aclose(self) -> None:
        """Close the per-node connections."""
        for pipeline in self.pipelines():
            await pipeline.client.aclose()


def node_url(url: str, host: str, port: int) -> str:
    """``url`` (scheme, credentials, options) pointed at one node."""
    parts = urlsplit(url)
    credentials = parts.netloc.rpartition("@")[0]
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    netloc = f"{credentials}@{where}" if credentials else where
    return urlunsplit((parts.scheme, netloc, "", parts.query, ""))
