"""Shared fixtures: real Redis servers (skipped without redis-server, unless CI requires it)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from hypothesis import settings

from tests import redis_servers as rs

REQUIRE_REDIS = os.environ.get("RATEKEEPER_REQUIRE_REDIS") == "1"

# No per-example deadline: tests assert behaviour, never speed, and the machine is shared.
# HYPOTHESIS_PROFILE=deep runs 20x the examples (a search for rare cases, not for CI).
settings.register_profile("ratekeeper", deadline=None)
settings.register_profile("deep", parent=settings.get_profile("ratekeeper"), max_examples=2000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ratekeeper"))


# --- the quick tier ---------------------------------------------------------------------------

FULL_FIXTURES = {"sentinel_group", "fresh_redis", "fresh_cluster", "primary_replica",
                 "readme_env", "deploy_env"}  # fmt: skip
"""Fixtures of the full run only: servers a test kills, pauses or fails over; the docs'
freshly installed environments."""
FULL_PATHS = (
    "tests/reliability/", "tests/dashboard/", "tests/service/rlqs/test_envoy_quota.py",
    "tests/service/rlqs/test_shared.py", "tests/service/test_envoy_proxy.py",
    "tests/service/test_browser_rules.py", "tests/service/test_prometheus_alerts.py",
    "tests/service/test_upstream_env.py", "tests/service/test_workers.py",
    "tests/service/test_lifecycle.py", "tests/service/test_connections.py",
    "tests/test_local_budget_processes.py", "tests/quotas/test_processes.py",
    "tests/compat/", "tests/abuse/", "tests/test_compact_layout.py", "tests/test_url_redaction.py",
    "tests/test_scripts.py",
)  # fmt: skip
"""Modules of the full run only: a real Envoy, Chromium or Prometheus, several service
processes, timeouts waited out for real; the side-by-side runs of the peers, the fuzzers and
the long property searches (every layout on a Cluster, every character in a password);
``./scripts/test`` run by a test."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``full`` what ``./scripts/test --quick`` leaves out (docs/contributing.md)."""
    root = config.rootpath
    for item in items:
        path = item.path.relative_to(root).as_posix() if item.path.is_relative_to(root) else ""
        fixtures = set(getattr(item, "fixturenames", ()))
        if path.startswith(FULL_PATHS) or fixtures & FULL_FIXTURES:
            item.add_marker(pytest.mark.full)


def _need_redis() -> None:
    if not rs.available():
        if REQUIRE_REDIS:
            pytest.fail("redis-server is required (RATEKEEPER_REQUIRE_REDIS=1) but not installed")
        pytest.skip("redis-server not installed")


def _need_sentinel() -> None:
    _need_redis()
    if not rs.sentinel_available():
        if REQUIRE_REDIS:
            pytest.fail("redis-sentinel is required (RATEKEEPER_REQUIRE_REDIS=1) but not installed")
        pytest.skip("redis-sentinel not installed")


@pytest.fixture
def sentinel_group() -> Iterator[rs.SentinelGroup]:
    """A primary, one replica and three Sentinels of the test's own (tests kill the primary)."""
    _need_sentinel()
    group = rs.SentinelGroup()
    yield group
    group.stop()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[rs.RedisServer]:
    """One standalone Redis for the session; tests should use ``redis_url`` (flushed)."""
    _need_redis()
    server = rs.RedisServer()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: rs.RedisServer) -> str:
    """The session Redis, emptied (data and scripts) before the test."""
    client = redis_server.client()
    client.flushall()
    client.script_flush()
    return redis_server.url


@pytest.fixture
def fresh_redis() -> Iterator[rs.RedisServer]:
    """A Redis of the test's own, for tests that kill, pause or restart it."""
    _need_redis()
    server = rs.RedisServer()
    yield server
    server.stop()


@pytest.fixture
def primary_replica() -> Iterator[tuple[rs.RedisServer, rs.RedisServer]]:
    """A primary and one synced replica of it."""
    _need_redis()
    primary = rs.RedisServer()
    replica = rs.start_replica(primary)
    yield primary, replica
    replica.stop()
    primary.stop()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[rs.RedisCluster]:
    """A 3-primary Redis Cluster for the session."""
    _need_redis()
    cluster = rs.RedisCluster()
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def shard_servers() -> Iterator[list[rs.RedisServer]]:
    """Two standalone primaries for the session; tests should use ``shard_urls`` (flushed)."""
    _need_redis()
    servers = [rs.RedisServer(), rs.RedisServer()]
    yield servers
    for server in servers:
        server.stop()


@pytest.fixture
def shard_urls(shard_servers: list[rs.RedisServer]) -> list[str]:
    """The session's two shard primaries, emptied (data and scripts) before the test."""
    for server in shard_servers:
        client = server.client()
        client.flushall()
        client.script_flush()
        client.close()
    return [server.url for server in shard_servers]


@pytest.fixture
def fresh_cluster() -> Iterator[rs.RedisCluster]:
    """A 3-primary cluster of the test's own, for tests that kill a node."""
    _need_redis()
    cluster = rs.RedisCluster()
    yield cluster
    cluster.stop()


@pytest.fixture
def cluster_url(redis_cluster: rs.RedisCluster) -> str:
    """The session cluster, every node emptied (data and scripts) before the test."""
    for node in redis_cluster.nodes:
        client = node.client()
        client.flushall()
        client.script_flush()
        client.close()
    return redis_cluster.url


REDIS_STORES = ("redis", "sharded", "cluster")
STORES = ("memory", *REDIS_STORES)


@dataclass(frozen=True)
class Backend:
    """One kind of store: ``make()`` builds a store on it, ``flush()`` empties it.

    Stores made by one backend share their state (the memory store is one object), as the
    stores of several app servers would. Their socket timeout is 5 s: tests on a shared
    machine check decisions here, not latency (the failure tests set their own).
    """

    kind: str
    make: Callable[[], Any]
    flush: Callable[[], None]

    @property
    def store(self) -> Any:
        """One store on this backend, made on first use and shared by the test."""
        if not self._made:
            self._made.append(self.make())
        return self._made[0]

    _made: list[Any] = field(default_factory=list, repr=False, compare=False)


def _backend(request: pytest.FixtureRequest, kind: str) -> Iterator[Backend]:
    from ratekeeper import MemoryStore, RedisClusterStore, RedisStore, Shard, ShardedRedisStore

    made: list[Any] = []

    def keep(store: Any) -> Any:
        made.append(store)
        return store

    if kind == "memory":
        memory = MemoryStore()
        yield Backend(kind, lambda: memory, lambda: memory.sweep(1e12) and None)
        return
    if kind == "redis":
        url = request.getfixturevalue("redis_url")
        urls = [url]
        make: Callable[[], Any] = lambda: keep(RedisStore(url, socket_timeout=5))  # noqa: E731
    elif kind == "sharded":
        urls = request.getfixturevalue("shard_urls")
        make = lambda: keep(ShardedRedisStore([Shard(u) for u in urls], socket_timeout=5))  # noqa: E731
    else:
        url = request.getfixturevalue("cluster_url")
        urls = [n.url for n in request.getfixturevalue("redis_cluster").nodes]
        make = lambda: keep(RedisClusterStore(url, socket_timeout=5))  # noqa: E731
    clients = [redis.Redis.from_url(u) for u in urls]

    def flush() -> None:
        for client in clients:
            client.flushall()

    yield Backend(kind, make, flush)
    for store in made:
        store.close()
    for client in clients:
        client.close()


def redis_store(kind: str, request: pytest.FixtureRequest, **options: Any) -> Any:
    """A ``RedisStore``, ``ShardedRedisStore`` (two primaries) or ``RedisClusterStore`` on the
    session's servers, built with ``options`` (5 s timeout unless given)."""
    from ratekeeper import RedisClusterStore, RedisStore, Shard, ShardedRedisStore

    options.setdefault("socket_timeout", 5)
    if kind == "redis":
        return RedisStore(request.getfixturevalue("redis_url"), **options)
    if kind == "sharded":
        shards = [Shard(u) for u in request.getfixturevalue("shard_urls")]
        return ShardedRedisStore(shards, **options)
    return RedisClusterStore(request.getfixturevalue("cluster_url"), **options)


@pytest.fixture(params=STORES)
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """Every store: memory, Redis, sharded Redis, Redis Cluster (Redis ones flushed first)."""
    yield from _backend(request, request.param)


@pytest.fixture(params=REDIS_STORES)
def redis_backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """Every Redis-backed store (flushed first)."""
    yield from _backend(request, request.param)


@pytest.fixture(params=STORES)
def make_store(request: pytest.FixtureRequest) -> Iterator[Callable[[], Any]]:
    """Every store, one per parameter: ``make_store()`` returns a store on the same backend.

    Stores from one ``make_store`` share state, like the stores of several app servers.
    """
    backends = _backend(request, request.param)
    backend = next(backends)
    yield backend.make
    for _ in backends:
        pass
