"""Shared fixtures: real Redis servers (skipped without redis-server, unless CI requires it)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests import redis_servers as rs

REQUIRE_REDIS = os.environ.get("RATEKEEPER_REQUIRE_REDIS") == "1"


def _need_redis() -> None:
    if not rs.available():
        if REQUIRE_REDIS:
            pytest.fail("redis-server is required (RATEKEEPER_REQUIRE_REDIS=1) but not installed")
        pytest.skip("redis-server not installed")


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
def cluster_url(redis_cluster: rs.RedisCluster) -> str:
    """The session cluster, every node emptied (data and scripts) before the test."""
    for node in redis_cluster.nodes:
        client = node.client()
        client.flushall()
        client.script_flush()
        client.close()
    return redis_cluster.url


STORES = ("memory", "redis", "sharded", "cluster")


@pytest.fixture(params=STORES)
def make_store(request: pytest.FixtureRequest) -> Iterator[Callable[[], Any]]:
    """Every store, one per parameter: ``make_store()`` returns a store on the same backend.

    Stores made by one factory share their state (the memory store is one object), as the
    stores of several app servers would. Redis-backed stores are flushed before the test.
    """
    from ratekeeper import MemoryStore, RedisClusterStore, RedisStore, Shard, ShardedRedisStore

    made: list[Any] = []
    make: Callable[[], Any]
    if request.param == "memory":
        memory = MemoryStore()

        def make() -> Any:
            return memory

    elif request.param == "redis":
        url = request.getfixturevalue("redis_url")

        def make() -> Any:
            made.append(RedisStore(url))
            return made[-1]

    elif request.param == "sharded":
        urls = request.getfixturevalue("shard_urls")

        def make() -> Any:
            made.append(ShardedRedisStore([Shard(u) for u in urls]))
            return made[-1]

    else:
        url = request.getfixturevalue("cluster_url")

        def make() -> Any:
            made.append(RedisClusterStore(url))
            return made[-1]

    yield make
    for store in made:
        store.close()
