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
from .nested import Level as Level
from .nested import NestedDecision as NestedDecision
from .nested import Reservation as Reservation
from .nested import Settlement as Settlement
from .overload.adaptive import GradientLimit as GradientLimit
from .overload.adaptive import GradientSettings as GradientSettings
from .overload.admission import AdmissionQueue as AdmissionQueue
from .overload.admission import AsyncAdmissionQueue as AsyncAdmissionQueue
from .overload.concurrency import AsyncConcurrencyLimiter as AsyncConcurrencyLimiter
from .overload.concurrency import ConcurrencyLimiter as ConcurrencyLimiter
from .overload.concurrency import Lease as Lease
from .overload.shedding import AsyncFleetUsageShedder as AsyncFleetUsageShedder
from .overload.shedding import FleetUsageShedder as FleetUsageShedder
from .overload.shedding import ShedderSettings as ShedderSettings
from .overload.shedding import WorkerUtilizationShedder as WorkerUtilizationShedder
from .overload.signals import LoopLag as LoopLag
from .overload.signals import Pressure as Pressure
from .overload.signals import ProcessCPU as ProcessCPU
from .overload.signals import QueueDelay as QueueDelay
from .rates import Rate as Rate
from .stores.local_budget import LocalBudget as LocalBudget
from .stores.memory import MemoryStore as MemoryStore
from .stores.redis.batching import Batching as Batching
from .stores.redis.cluster import RedisClusterStore as RedisClusterStore
from .stores.redis.layout import CompactLayout as CompactLayout
from .stores.redis.sentinel import SentinelShard as SentinelShard
from .stores.redis.sharded import SentinelStore as SentinelStore
from .stores.redis.sharded import Shard as Shard
from .stores.redis.sharded import ShardedRedisStore as ShardedRedisStore
from .stores.redis.single import RedisStore as RedisStore
from .stores.rollout import RolloutStore as RolloutStore

__all__ = [
    "AdmissionQueue",
    "AsyncAdmissionQueue",
    "AsyncConcurrencyLimiter",
    "AsyncFleetUsageShedder",
    "AsyncLimiter",
    "Batching",
    "Clock",
    "CompactLayout",
    "ConcurrencyLimiter",
    "ConfigError",
    "Decision",
    "FleetUsageShedder",
    "GradientLimit",
    "GradientSettings",
    "Lease",
    "Level",
    "Limiter",
    "LocalBudget",
    "LoopLag",
    "ManualClock",
    "MemoryStore",
    "NestedDecision",
    "Pressure",
    "ProcessCPU",
    "QueueDelay",
    "Rate",
    "RateSpecError",
    "RatekeeperError",
    "RedisClusterStore",
    "RedisStore",
    "Reservation",
    "RolloutStore",
    "SentinelShard",
    "SentinelStore",
    "Settlement",
    "Shard",
    "ShardedRedisStore",
    "ShedderSettings",
    "StoreUnavailable",
    "WorkerUtilizationShedder",
    "__version__",
]
