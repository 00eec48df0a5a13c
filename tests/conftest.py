"""Shared fixtures: real Redis servers (skipped without redis-server, unless CI requires it)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import settings

from tests import redis_servers as rs

REQUIRE_REDIS = os.environ.get("RATEKEEPER_REQUIRE_REDIS") == "1"

# No per-example deadline: tests assert behaviour, never speed, and the machine is shared.
# HYPOTHESIS_PROFILE=deep runs 20x the examples (a search for rare cases, not for CI).
settings.register_profile("ratekeeper", deadline=None)
settings.register_profile("deep", parent=settings.get_profile("ratekeeper"), max_examples=2000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ratekeeper"))


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


STORES = ("memory",)


@pytest.fixture(params=STORES)
def make_store(request: pytest.FixtureRequest) -> Iterator[Callable[[], Any]]:
    """Every store, one per parameter: ``make_store()`` returns a store on the same backend.

    Only the memory store on this branch; the Redis stores' branch defines the same fixture
    over every store, and the tests that take it then run on each.
    """
    from ratekeeper import MemoryStore

    memory = MemoryStore()

    def make() -> Any:
        return memory

    yield make
