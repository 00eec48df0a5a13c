"""The fixtures start real servers: a replica follows its primary, a cluster answers."""

from __future__ import annotations

import redis

from tests import redis_servers as rs


def test_replica_follows_primary(primary_replica: tuple[rs.RedisServer, rs.RedisServer]) -> None:
    primary, replica = primary_replica
    primary.client().set("k", "v")
    rs.wait_replicated(primary)
    assert replica.client().get("k") == b"v"


def test_cluster_routes_keys(redis_cluster: rs.RedisCluster) -> None:
    client = redis.RedisCluster.from_url(redis_cluster.url)
    for i in range(20):
        client.set(f"key{i}", i)
    assert int(client.get("key7")) == 7
    client.close()


def test_restart_empties_the_server(fresh_redis: rs.RedisServer) -> None:
    fresh_redis.client().set("k", "v")
    fresh_redis.restart()
    assert fresh_redis.client().get("k") is None
