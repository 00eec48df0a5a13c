"""The examples of docs/redis.md run as written, pointed at test servers (addresses, ports,
certificate paths and passwords swapped for the test's), and its ACL rule is ``acl_rule()``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from ratekeeper import Limiter
from ratekeeper.stores.redis.acl import acl_commands, acl_rule
from tests import redis_servers as rs
from tests.redis_tls import OPENSSL, TLSRedisServer, make_certs

DOC = (Path(__file__).resolve().parents[1] / "docs" / "redis.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", DOC, flags=re.S)


def block(first_line_part: str) -> str:
    (found,) = [b for b in BLOCKS if first_line_part in b]
    return found


def run(source: str, **replace: str) -> dict[str, Any]:
    for old, new in replace.items():
        assert old in source, old
        source = source.replace(old, new)
    namespace: dict[str, Any] = {}
    exec(compile(source, "docs/redis.md", "exec"), namespace)
    return namespace


def test_the_acl_rule_is_the_code_s() -> None:
    assert f"ACL SETUSER ratekeeper reset on >CHANGE-ME {acl_rule()}\n" in DOC
    extra = set(acl_commands(cluster=True)) - set(acl_commands())
    assert "Redis Cluster: add `" + " ".join(f"+{c}" for c in sorted(extra)) + "`" in DOC


def test_the_local_examples(redis_url: str) -> None:
    url = "redis://127.0.0.1:6379/0"
    first = run(BLOCKS[0], **{url: redis_url})
    assert first["limiter"].peek("user:42", "10/second; 1000/hour", algorithm="gcra").limit == 10
    batching = run(block("batching=None"), **{url: redis_url})
    assert batching["single"].batcher is None and batching["tuned"].batcher.max_size == 64
    compact = run(block("CompactLayout(buckets=4096)"), **{url: redis_url})
    assert compact["store"].codec.layout.buckets == 4096


def test_the_sentinel_example(sentinel_group: rs.SentinelGroup) -> None:
    source = block("SentinelStore(")
    sentinels = '["redis://10.0.0.1:26379", "redis://10.0.0.2:26379", "redis://10.0.0.3:26379"]'
    namespace = run(
        source,
        **{
            '"mymaster"': repr(sentinel_group.service),
            sentinels: repr(sentinel_group.urls),
            "redis://:data-password@/0": "redis:///0",
        },
    )
    limiter: Limiter = namespace["limiter"]
    assert not limiter.hit("k", "5/minute").degraded
    namespace["store"].close()


def test_the_tls_example(tmp_path: Path) -> None:
    if OPENSSL is None or not rs.available():
        pytest.skip("openssl or redis-server not installed")
    certs = make_certs(tmp_path)
    server = TLSRedisServer(certs)
    try:
        server.client().execute_command(
            "ACL", "SETUSER", "ratekeeper", "reset", "on", ">CHANGE-ME", *acl_rule().split()
        )
        namespace = run(
            block("rediss://"),
            **{
                "redis.internal:6380": f"127.0.0.1:{server.port}",
                "/etc/ratekeeper/ca.crt": str(certs.ca),
                "/etc/ratekeeper/client.crt": str(certs.client_cert),
                "/etc/ratekeeper/client.key": str(certs.client_key),
            },
        )
        limiter = Limiter(namespace["store"], fail_open=False)
        assert limiter.hit("k", "5/minute").remaining == 4
    finally:
        server.stop()


def test_the_rollout_example(redis_url: str, cluster_url: str) -> None:
    namespace = run(
        block("RolloutStore(old, new"),
        **{"redis://10.0.0.1:6379/0": redis_url, "redis://10.0.0.7:7000": cluster_url},
    )
    namespace["flags"].hset("ratekeeper:rollout", "share", "100")
    store = namespace["store"]
    store._next_refresh = 0  # do not wait for refresh_every (5 s)
    assert not namespace["limiter"].hit("k", "5/minute").degraded
    assert store.share == 100 and store.stats()["to_new"] == 1
