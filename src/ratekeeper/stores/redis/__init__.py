"""The Redis family: every algorithm's Lua script run on Redis, from one server to a cluster.

- ``single``: ``RedisStore``, one server (or a client you built), every plan one script call;
- ``codec``: plans -> script calls, replies -> outcomes (no I/O), ``nested_codec`` the same for
  nested calls and reservations; ``keys`` and ``layout``:
  where a caller key's state lives; ``leases``: leases in Redis;
- ``pipeline``, ``batching``, ``cluster_batching``: calls in flight together sent as one batch;
- ``sharded`` (with ``rendezvous`` placement): client-side sharding over primaries with read
  replicas; ``sentinel``: shards found through Sentinel; ``cluster``: Redis Cluster;
- ``urls``: checking Redis URLs and keeping their secrets out of messages; ``acl``: the ACL
  rule for ratekeeper's user.
"""

from .batching import Batching as Batching
from .cluster import RedisClusterStore as RedisClusterStore
from .layout import CompactLayout as CompactLayout
from .sentinel import SentinelShard as SentinelShard
from .sharded import SentinelStore as SentinelStore
from .sharded import Shard as Shard
from .sharded import ShardedRedisStore as ShardedRedisStore
from .single import RedisStore as RedisStore
