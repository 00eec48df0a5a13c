"""Stores execute plans. Each is small; capabilities are separate protocols (see ``base``).

- ``base``: the store protocols; ``leases``: the lease-store protocols and ``MemoryLeases``;
- ``memory``: ``MemoryStore``, the plain-Python reference of every algorithm (``nested_memory``:
  its nested calls and reservations);
- ``redis/``: the Redis family (one server, pipelining and batching, the codec and key
  layouts, sharded with replicas, Sentinel, Cluster); ``loops``: a value per event loop (their
  asyncio clients);
- ``rollout``: ``RolloutStore``, limits moved between two stores a share of keys at a time;
- ``local_budget``: ``LocalBudget``, decisions in process from slices of a shared budget
  (``slice_book``, ``slice_calls``), ``fail_local`` when the store cannot be asked.

The stores are offered here too: ``from ratekeeper.stores import RedisStore``.
"""

from .local_budget import LocalBudget as LocalBudget
from .memory import MemoryStore as MemoryStore
from .redis import Batching as Batching
from .redis import CompactLayout as CompactLayout
from .redis import RedisClusterStore as RedisClusterStore
from .redis import RedisStore as RedisStore
from .redis import SentinelShard as SentinelShard
from .redis import SentinelStore as SentinelStore
from .redis import Shard as Shard
from .redis import ShardedRedisStore as ShardedRedisStore
from .rollout import RolloutStore as RolloutStore
