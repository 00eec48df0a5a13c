"""ratekeeper: distributed rate limiting and load shedding for APIs.

This module only re-exports the public names; importing it never imports an optional
dependency (server, gRPC, Prometheus, web frameworks).
"""

from ._version import __version__ as __version__
from .clock import Clock as Clock
from .clock import ManualClock as ManualClock
from .decision import Decision as Decision
from .errors import ConfigError as ConfigError
from .errors import RatekeeperError as RatekeeperError
from .errors import RateSpecError as RateSpecError
from .errors import StoreUnavailable as StoreUnavailable
from .limiter import AsyncLimiter as AsyncLimiter
from .limiter import Limiter as Limiter
from .rates import Rate as Rate
from .stores.cluster import RedisClusterStore as RedisClusterStore
from .stores.memory import MemoryStore as MemoryStore
from .stores.redis import RedisStore as RedisStore
from .stores.sharded import Shard as Shard
from .stores.sharded import ShardedRedisStore as ShardedRedisStore

__all__ = [
    "AsyncLimiter",
    "Clock",
    "ConfigError",
    "Decision",
    "Limiter",
    "ManualClock",
    "MemoryStore",
    "Rate",
    "RateSpecError",
    "RatekeeperError",
    "RedisClusterStore",
    "RedisStore",
    "Shard",
    "ShardedRedisStore",
    "StoreUnavailable",
    "__version__",
]
