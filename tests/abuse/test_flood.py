"""One client flooding one key costs Redis no more calls per request than a normal request:
through the library (one script call either way) and through the service (whose over-limit
cache answers the flood locally). Counted by redis-server's own ``INFO commandstats``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.abuse.flood import library_costs, service_config, service_costs
from tests.redis_servers import RedisServer
from tests.service.proc import ServiceProcess


def test_library_flood_costs_no_more_redis_calls_than_a_normal_request(
    fresh_redis: RedisServer,
) -> None:
    normal, flood = library_costs(fresh_redis.url, requests=100)
    assert normal.scripts == 1
    assert flood.scripts <= normal.scripts and flood.commands <= normal.commands


@pytest.mark.parametrize("local_cache", [True, False], ids=["cache-on", "cache-off"])
def test_service_flood_costs_no_more_redis_calls_than_a_normal_request(
    fresh_redis: RedisServer, tmp_path: Path, local_cache: bool
) -> None:
    path = tmp_path / "ratekeeper.yaml"
    path.write_text(service_config(fresh_redis.url, local_cache))
    proc = ServiceProcess(path, grpc=False)
    try:
        normal, flood = service_costs(fresh_redis.url, proc.url, requests=100)
    finally:
        proc.stop()
    assert normal.scripts == 1
    assert flood.scripts <= normal.scripts and flood.commands <= normal.commands
    if local_cache:  # 5 admitted + the first rejection reach Redis; the rest are local
        assert round(flood.scripts * flood.requests) == 6
