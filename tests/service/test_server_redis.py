"""``ratekeeper serve`` on real Redis servers: batching, the over-limit cache sparing Redis,
fail-open when Redis dies, sharded and cluster stores."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import redis

from tests import redis_servers as rs
from tests.service.proc import ServiceProcess

POLICIES = """
policies:
  three:
    rate: 3/hour
  bucket:
    rate: 5/hour
    algorithm: token_bucket
  slots:
    kind: concurrency
    capacity: 5
    lease_ttl: 30
"""


def evalsha_calls(server_url: str) -> int:
    stats = redis.Redis.from_url(server_url).info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k.startswith("cmdstat_eval"))


def write(tmp_path: Path, store: str) -> Path:
    path = tmp_path / "redis.yaml"
    path.write_text(store + POLICIES)
    return path


@pytest.mark.parametrize("batch", ["true", "false"])
def test_decisions_on_redis_and_over_limit_cache(tmp_path: Path, redis_url: str, batch: str):
    store = f"store:\n  url: {redis_url}\n  batch: {batch}\n  socket_timeout: 5\n"
    cfg = write(tmp_path, store)
    proc = ServiceProcess(cfg, grpc=False)
    try:
        with httpx.Client(base_url=proc.url, timeout=10) as http:
            body = {"policy": "three", "key": "flood"}
            answers = [http.post("/v1/hit", json=body).json() for _ in range(4)]
            assert not any(a["degraded"] for a in answers)
            assert [a["allowed"] for a in answers] == [True, True, True, False]
            before = evalsha_calls(redis_url)
            flood = [http.post("/v1/hit", json=body).json() for _ in range(50)]
            assert evalsha_calls(redis_url) == before  # answered locally: Redis saw nothing
            assert all(not a["allowed"] and a["remaining"] == 0 for a in flood)
            assert flood[-1]["retry_after"] <= answers[-1]["retry_after"]
            assert flood[-1]["reset_at"] == answers[-1]["reset_at"]
            metrics = http.get("/metrics").text
            assert 'outcome="local_rejected",policy="three"} 50.0' in metrics
            assert http.get("/healthz").json()["store_kind"] == "redis"
    finally:
        proc.stop()


def test_redis_down_fails_open_and_health_says_so(tmp_path: Path, fresh_redis: rs.RedisServer):
    cfg = write(tmp_path, f"store: {fresh_redis.url}\n")
    proc = ServiceProcess(cfg, grpc=False)
    try:
        with httpx.Client(base_url=proc.url, timeout=10) as http:
            body = {"policy": "bucket", "key": "k"}
            assert http.get("/healthz").json()["store"] == "ok"
            assert not http.post("/v1/hit", json=body).json()["degraded"]
            fresh_redis.kill()
            first = http.get("/healthz")  # a real probe: no decision needed to notice
            assert first.status_code == 503 and first.json()["store"] == "unavailable"
            answers = [http.post("/v1/hit", json=body) for _ in range(5)]
            assert all(r.status_code == 200 for r in answers)
            assert all(r.json()["allowed"] and r.json()["degraded"] for r in answers)
            health = http.get("/healthz")
            assert health.status_code == 503 and health.json()["store"] == "unavailable"
            metrics = http.get("/metrics").text
            assert 'outcome="degraded",policy="bucket"' in metrics
            assert "ratekeeper_store_errors_total 0.0" not in metrics
            fresh_redis.restart()
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                if not http.post("/v1/hit", json=body).json()["degraded"]:
                    break
                time.sleep(0.1)
            assert http.get("/healthz").json()["store"] == "ok"
    finally:
        proc.stop()


@pytest.mark.parametrize("batch", ["true", "false"])
def test_sharded_store(
    tmp_path: Path, primary_replica: tuple[rs.RedisServer, rs.RedisServer], batch: str
) -> None:
    primary, replica = primary_replica
    other = rs.RedisServer()
    try:
        store = (
            f"store:\n  batch: {batch}\n  shards:\n"
            f"    - url: {primary.url}\n      replicas: [{replica.url}]\n"
            f"    - url: {other.url}\n"
        )
        proc = ServiceProcess(write(tmp_path, store), grpc=False)
        try:
            with httpx.Client(base_url=proc.url, timeout=10) as http:
                for i in range(16):  # 16 keys: all on one of 2 shards has odds 2**-15
                    body = {"policy": "three", "key": f"user{i}"}
                    got = [http.post("/v1/hit", json=body).json()["allowed"] for _ in range(4)]
                    assert got == [True, True, True, False]
                batches = re.search(
                    r"^ratekeeper_batch_size_count (\S+)$", http.get("/metrics").text, re.M
                )
                assert (batches is not None and float(batches.group(1)) > 0) == (batch == "true")
            used = [s.client().dbsize() for s in (primary, other)]
            assert all(n > 0 for n in used)  # keys spread over both shards
        finally:
            proc.stop()
    finally:
        other.stop()


def test_cluster_store(tmp_path: Path, redis_cluster: rs.RedisCluster) -> None:
    # a generous timeout: on a loaded machine a 50 ms one fails open, which is not under test
    store = f"store:\n  cluster: {redis_cluster.url}\n  socket_timeout: 5\n"
    proc = ServiceProcess(write(tmp_path, store), grpc=False)
    try:
        with httpx.Client(base_url=proc.url, timeout=10) as http:
            for i in range(4):
                body = {"policy": "three", "key": f"c{i}"}
                got = [http.post("/v1/hit", json=body).json() for _ in range(4)]
                assert not any(g["degraded"] for g in got)
                assert [g["allowed"] for g in got] == [True, True, True, False]
    finally:
        proc.stop()


@pytest.mark.parametrize("kind", ["redis", "sharded", "cluster"])
def test_concurrency_on_every_redis_store(
    tmp_path: Path, request: pytest.FixtureRequest, kind: str
) -> None:
    """20 concurrent acquires of capacity 5 through the service: exactly 5 leases, in Redis."""
    # a generous timeout: 20 concurrent calls on a loaded machine must not fail open
    if kind == "redis":
        urls = [request.getfixturevalue("redis_url")]
        store = f"store:\n  url: {urls[0]}\n  socket_timeout: 5\n"
    elif kind == "sharded":
        urls = request.getfixturevalue("shard_urls")
        shards = "".join(f"    - url: {u}\n" for u in urls)
        store = "store:\n  socket_timeout: 5\n  shards:\n" + shards
    else:
        url = request.getfixturevalue("cluster_url")
        urls = [n.url for n in request.getfixturevalue("redis_cluster").nodes]
        store = f"store:\n  cluster: {url}\n  socket_timeout: 5\n"
    proc = ServiceProcess(write(tmp_path, store), grpc=False)
    try:
        with httpx.Client(base_url=proc.url, timeout=10) as http:
            for user in ("u1", "u2", "u3"):
                body = {"policy": "slots", "key": user}

                def one(_: int, body: dict[str, str] = body) -> httpx.Response:
                    return http.post("/v1/concurrency/acquire", json=body)

                with ThreadPoolExecutor(max_workers=10) as pool:
                    answers = list(pool.map(one, range(20)))
                granted = [r.json() for r in answers if r.status_code == 200]
                assert len(granted) == 5 and not any(g["degraded"] for g in granted)
                assert sum(r.status_code == 429 for r in answers) == 15
                for g in granted:
                    lease = {"lease": g["lease"]}
                    assert http.post("/v1/concurrency/release", json=lease).json()["released"]
            held = http.post("/v1/concurrency/acquire", json={"policy": "slots", "key": "u1"})
            assert held.json()["in_use"] == 1
        lease_sets = 0
        for u in urls:
            client = redis.Redis.from_url(u)
            lease_sets += sum(1 for k in client.scan_iter("rk{*}c") if client.type(k) == b"zset")
            client.close()
        assert lease_sets == 1  # the one lease still held lives in Redis
    finally:
        proc.stop()


def test_concurrency_fails_open_when_redis_dies(tmp_path: Path, fresh_redis: rs.RedisServer):
    proc = ServiceProcess(write(tmp_path, f"store: {fresh_redis.url}\n"), grpc=False)
    try:
        with httpx.Client(base_url=proc.url, timeout=10) as http:
            body = {"policy": "slots", "key": "k"}
            assert not http.post("/v1/concurrency/acquire", json=body).json()["degraded"]
            fresh_redis.kill()
            answers = [http.post("/v1/concurrency/acquire", json=body) for _ in range(8)]
            assert all(r.status_code == 200 and r.json()["degraded"] for r in answers)
            lease = {"lease": answers[0].json()["lease"]}
            assert http.post("/v1/concurrency/release", json=lease).json() == {"released": False}
            assert 'outcome="degraded",policy="slots"} 8.0' in http.get("/metrics").text
    finally:
        proc.stop()


def test_sentinel_store_with_the_compact_layout_follows_a_failover(
    tmp_path: Path, sentinel_group: rs.SentinelGroup
) -> None:
    sentinels = ", ".join(sentinel_group.urls)
    store = (
        "store:\n  socket_timeout: 5\n  layout: {buckets: 64}\n"
        f"  sentinel:\n    service: {sentinel_group.service}\n    sentinels: [{sentinels}]\n"
    )
    proc = ServiceProcess(write(tmp_path, store), grpc=False)
    try:
        with httpx.Client(base_url=proc.url, timeout=10) as http:
            for i in range(4):
                body = {"policy": "three", "key": f"s{i}"}
                got = [http.post("/v1/hit", json=body).json() for _ in range(4)]
                assert not any(g["degraded"] for g in got)
                assert [g["allowed"] for g in got] == [True, True, True, False]
            primary = sentinel_group.primary()
            keys = [k.decode() for k in primary.client().keys("rk*")]
            assert keys and all(k.startswith("rk{#:") for k in keys)  # packed into hashes
            assert {primary.client().type(k) for k in keys} == {b"hash"}
            old = primary.port
            primary.kill()
            sentinel_group.wait_promoted(old)
            deadline = time.monotonic() + 60
            answer: dict[str, object] = {"degraded": True}
            while answer["degraded"] and time.monotonic() < deadline:
                answer = http.post("/v1/hit", json={"policy": "three", "key": "after"}).json()
                time.sleep(0.2)
            assert answer == answer | {"degraded": False, "allowed": True}
    finally:
        proc.stop()
