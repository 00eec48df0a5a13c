"""``ratekeeper serve`` on real Redis servers: batching, the over-limit cache sparing Redis,
fail-open when Redis dies, sharded and cluster stores."""

from __future__ import annotations

import re
import time
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
    cfg = write(tmp_path, f"store:\n  url: {redis_url}\n  batch: {batch}\n")
    proc = ServiceProcess(cfg, grpc=False)
    try:
        with httpx.Client(base_url=proc.url, timeout=10) as http:
            body = {"policy": "three", "key": "flood"}
            answers = [http.post("/v1/hit", json=body).json() for _ in range(4)]
            assert [a["allowed"] for a in answers] == [True, True, True, False]
            assert not any(a["degraded"] for a in answers)
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
                for i in range(8):
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
    proc = ServiceProcess(write(tmp_path, f"store:\n  cluster: {redis_cluster.url}\n"), grpc=False)
    try:
        with httpx.Client(base_url=proc.url, timeout=10) as http:
            for i in range(4):
                body = {"policy": "three", "key": f"c{i}"}
                got = [http.post("/v1/hit", json=body).json() for _ in range(4)]
                assert [g["allowed"] for g in got] == [True, True, True, False]
                assert not any(g["degraded"] for g in got)
    finally:
        proc.stop()
