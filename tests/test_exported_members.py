"""The package root re-exports exactly the public names, and imports no optional dependency."""

import subprocess
import sys

import ratekeeper

EXPECTED = {
    "AdmissionQueue",
    "AsyncAdmissionQueue",
    "GradientLimit",
    "GradientSettings",
    "LoopLag",
    "Pressure",
    "ProcessCPU",
    "QueueDelay",
    "WorkerUtilizationShedder",
    "ShedderSettings",
    "FleetUsageShedder",
    "AsyncFleetUsageShedder",
    "Lease",
    "Level",
    "NestedDecision",
    "Reservation",
    "Settlement",
    "ConcurrencyLimiter",
    "AsyncConcurrencyLimiter",
    "AsyncLimiter",
    "Clock",
    "ConfigError",
    "Decision",
    "Limiter",
    "LocalBudget",
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
    # redis (a core dependency) is imported first: redis-py imports OpenTelemetry by itself
    # when the SDK is installed, which is not ratekeeper's doing
    code = (
        "import sys, redis; before = set(sys.modules); import ratekeeper; "
        "new = set(sys.modules) - before; "
        "bad = [m for m in ('starlette', 'fastapi', 'flask', 'grpc', 'yaml', 'prometheus_client', "
        "'uvicorn', 'opentelemetry', 'httpx', 'requests', 'aiohttp') if m in new]; print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    # and ratekeeper imports without OpenTelemetry at all (redis-py copes with its absence)
    blocked = "import sys; sys.modules['opentelemetry'] = None; import ratekeeper, ratekeeper.cli"
    subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True, check=True)
