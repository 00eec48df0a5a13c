"""Every store a nested call can run on, for the nested and reservation tests.

``nested_store(kind, request)`` builds one on the session's real servers (flushed by their
fixtures): the memory store, a Redis store in both key layouts, a sharded store over two
primaries (both layouts), a Redis Cluster (both layouts) and a rollout sending half the keys
from the memory store to a Redis store. Sentinel, a sharded store of one Sentinel shard, has
tests of its own (it needs a Sentinel group per test).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from ratekeeper import CompactLayout, MemoryStore, RolloutStore
from tests.conftest import redis_store

NESTED_STORES = (
    "memory",
    "redis",
    "redis-compact",
    "sharded",
    "sharded-compact",
    "cluster",
    "cluster-compact",
    "rollout",
)
REDIS_NESTED_STORES = NESTED_STORES[1:]


def nested_store(kind: str, request: pytest.FixtureRequest, **options: Any) -> Any:
    """A fresh store of ``kind`` (a new key prefix, so examples never see each other's keys)."""
    if kind == "memory":
        return MemoryStore()
    options.setdefault("prefix", f"n{os.urandom(5).hex()}")
    if kind == "rollout":
        return RolloutStore(MemoryStore(), redis_store("redis", request, **options), share=50)
    base, _, layout = kind.partition("-")
    if layout:
        options["layout"] = CompactLayout(buckets=4)
    return redis_store(base, request, **options)


def close(store: Any) -> None:
    """Close a store's sync connections, if it has any."""
    closer = getattr(store, "close", None)
    if closer is not None:
        closer()
