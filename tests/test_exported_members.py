"""The package root re-exports exactly the public names, and imports no optional dependency."""

import subprocess
import sys

import ratekeeper

EXPECTED = {
    "WorkerUtilizationShedder",
    "ShedderSettings",
    "FleetUsageShedder",
    "AsyncFleetUsageShedder",
    "Lease",
    "ConcurrencyLimiter",
    "AsyncConcurrencyLimiter",
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
    "SentinelShard",
    "RolloutStore",
    "SentinelStore",
    "CompactLayout",
    "Batching",
    "StoreUnavailable",
    "__version__",
}


def test_all_is_the_public_surface() -> None:
    assert set(ratekeeper.__all__) == EXPECTED
    for name in EXPECTED:
        assert hasattr(ratekeeper, name), name


def test_import_pulls_in_no_optional_dependency() -> None:
    code = (
        "import sys, ratekeeper; "
        "bad = [m for m in ('starlette', 'fastapi', 'flask', 'grpc', 'yaml', 'prometheus_client', "
        "'uvicorn') if m in sys.modules]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
