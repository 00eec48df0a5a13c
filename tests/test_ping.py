"""Checking a store at startup: ``ping``/``ping_async`` on every store and ``check`` on the
limiters answer when the store does, and name the address (never the password) when not."""

from __future__ import annotations

import asyncio
import logging

import pytest
from starlette.testclient import TestClient

from ratekeeper import (
    AsyncLimiter,
    Limiter,
    MemoryStore,
    RedisClusterStore,
    RedisStore,
    Shard,
    ShardedRedisStore,
)
from ratekeeper.errors import StoreUnavailable
from ratekeeper.middleware import RateCheck, RateLimitMiddleware, WSGIRateLimitMiddleware
from tests import redis_servers as rs
from tests.service.proc import ServiceProcess, run_serve


def _dead_url(password: str = "") -> tuple[str, str]:
    """A URL nobody listens on (with a password, when given) and its ``host:port``."""
    port = rs.free_port()
    auth = f"user:{password}@" if password else ""
    return f"redis://{auth}127.0.0.1:{port}/0", f"127.0.0.1:{port}"


def test_every_live_store_answers(redis_url: str, shard_urls: list[str], cluster_url: str) -> None:
    stores = [
        MemoryStore(),
        RedisStore(redis_url, socket_timeout=2),
        ShardedRedisStore([Shard(u) for u in shard_urls], socket_timeout=2),
        RedisClusterStore(cluster_url, socket_timeout=2),
    ]
    for store in stores:
        Limiter(store).check()
        store.ping()

    async def main() -> None:
        for store in stores:
            await AsyncLimiter(store).check()
            await store.ping_async()
            if not isinstance(store, MemoryStore):
                await store.aclose()

    asyncio.run(main())


@pytest.mark.parametrize("kind", ["redis", "sharded", "cluster"])
def test_a_wrong_address_is_named_without_its_password(kind: str) -> None:
    url, where = _dead_url(password="s3cret-pw")
    if kind == "redis":
        store: RedisStore | ShardedRedisStore | RedisClusterStore = RedisStore(url)
    elif kind == "sharded":
        store = ShardedRedisStore([Shard(url)])
    else:
        store = RedisClusterStore(url)
    assert "s3cret" not in repr(store)
    with pytest.raises(StoreUnavailable) as sync_error:
        Limiter(store).check()

    async def main() -> StoreUnavailable:
        with pytest.raises(StoreUnavailable) as error:
            await AsyncLimiter(store).check()
        return error.value

    async_error = asyncio.run(main())
    for exc in (sync_error.value, async_error):
        assert where in str(exc) and "s3cret" not in str(exc)


def test_middleware_logs_the_first_store_failure_at_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    url, where = _dead_url(password="s3cret-pw")
    app = RateLimitMiddleware(_ok, [RateCheck("api", "5/minute")], store=RedisStore(url))
    wsgi = WSGIRateLimitMiddleware(_wsgi_ok, [RateCheck("api", "5/minute")], store=RedisStore(url))
    with caplog.at_level(logging.WARNING, logger="ratekeeper"):
        client = TestClient(app)  # no lifespan: the app below only speaks HTTP
        assert [client.get("/").status_code for _ in range(3)] == [200] * 3  # fail open
        environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/", "REMOTE_ADDR": "1.2.3.4"}
        for _ in range(3):
            list(wsgi(environ, lambda s, h: None))
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 2  # one per middleware: the first failure, not every request
    for message in errors:
        assert where in message and "does not answer" in message
    assert all("s3cret" not in r.getMessage() for r in caplog.records)


async def _ok(scope: object, receive: object, send: object) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[operator]
    await send({"type": "http.response.body", "body": b"ok"})  # type: ignore[operator]


def _wsgi_ok(environ: object, start_response: object) -> list[bytes]:
    start_response("200 OK", [])  # type: ignore[operator]
    return [b"ok"]


def test_service_exits_naming_a_store_that_does_not_answer(tmp_path: object) -> None:
    from pathlib import Path

    url, where = _dead_url(password="s3cret-pw")
    config = Path(str(tmp_path)) / "dead.yaml"
    config.write_text(f"store: {url}\npolicies:\n  p:\n    rate: 1/second\n")
    done = run_serve("--config", str(config), "--port", "0", "--no-grpc", "--store-wait", "0")
    assert done.returncode == 2
    assert where in done.stderr and "does not answer" in done.stderr
    assert "s3cret" not in done.stderr + done.stdout
    assert "--start-degraded" in done.stderr


def test_service_started_degraded_says_so_on_healthz(tmp_path: object) -> None:
    from pathlib import Path

    import httpx

    url, where = _dead_url()
    config = Path(str(tmp_path)) / "dead.yaml"
    config.write_text(f"store: {url}\npolicies:\n  p:\n    rate: 1/second\n")
    service = ServiceProcess(config, grpc=False, extra=("--store-wait", "0", "--start-degraded"))
    try:
        health = httpx.get(f"{service.url}/healthz", timeout=10)
        assert health.status_code == 503 and health.json()["store"] == "unavailable"
        hit = httpx.post(f"{service.url}/v1/hit", json={"policy": "p", "key": "k"}, timeout=10)
        assert hit.status_code == 200 and hit.json()["degraded"] is True
    finally:
        stderr = service.stop()
    assert where in stderr and "serving degraded" in stderr
