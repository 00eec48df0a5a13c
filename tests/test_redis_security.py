"""Secured Redis: TLS (certificates made here with openssl), a password, and an ACL user with
exactly the rule of ``stores.redis.acl`` — every store operation works as that user, taking away any
one command of the rule breaks one, and the password never shows in errors, reprs, logs,
``stats()`` or the service's ``/metrics`` and ``/healthz``."""

from __future__ import annotations

import asyncio
import logging
import shlex
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
import redis

from ratekeeper import (
    AsyncConcurrencyLimiter,
    AsyncLimiter,
    ConcurrencyLimiter,
    Limiter,
    LocalBudget,
    ManualClock,
    RedisClusterStore,
    RedisStore,
    Shard,
    ShardedRedisStore,
    StoreUnavailable,
)
from ratekeeper.errors import ConfigError
from ratekeeper.stores.redis.acl import acl_commands, acl_rule
from ratekeeper.stores.redis.layout import CompactLayout
from tests import redis_servers as rs
from tests.conftest import REQUIRE_REDIS, _need_redis
from tests.redis_tls import OPENSSL, TLSRedisServer, make_certs
from tests.service.proc import ServiceProcess, run_serve

USER = "ratekeeper"
PASSWORD = "s3cr3t-p@ss:w/rd"  # characters that need percent-encoding in a URL
ALGORITHMS = ("fixed_window", "token_bucket", "gcra", "sliding_window", "sliding_log")


def set_user(client: redis.Redis, rule: str, *more: str) -> None:
    client.execute_command(
        "ACL", "SETUSER", USER, "reset", "on", f">{PASSWORD}", *rule.split(), *more
    )


def user_url(server: rs.RedisServer, password: str = PASSWORD) -> str:
    base = server.url.split("://", 1)[1]
    return f"{server.url.split('://')[0]}://{USER}:{quote(password, safe='')}@{base}"


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TLSRedisServer]:
    _need_redis()
    if OPENSSL is None:
        if REQUIRE_REDIS:
            pytest.fail("openssl is required (RATEKEEPER_REQUIRE_REDIS=1) but not installed")
        pytest.skip("openssl not installed")
    server = TLSRedisServer(make_certs(tmp_path_factory.mktemp("certs")))
    set_user(server.client(), acl_rule())
    yield server
    server.stop()


def exercise(url: str, admin: redis.Redis, prefix: str = "rk") -> list[str]:
    """Every kind of call a store makes, as the user of ``url``, on an empty Redis; the errors
    met."""
    admin.flushall()
    errors: list[str] = []

    def run(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        try:
            return call(*args, **kwargs)
        except StoreUnavailable as exc:
            errors.append(str(exc))
            return None

    clock = ManualClock(1_800_000_000.0)
    behind = ManualClock(1_800_000_000.0 - 5)  # a writer whose clock is behind: LINSERT
    stack = "5/minute; 9/hour"
    for layout in (None, CompactLayout(buckets=1)):
        store = RedisStore(url, prefix=prefix, socket_timeout=5, layout=layout)
        limiter = Limiter(store, clock=clock, fail_open=False)
        late = Limiter(store, clock=behind, fail_open=False)
        for algorithm in ALGORITHMS:
            for key in ("a", "b", "c"):
                run(limiter.hit, key, stack, algorithm=algorithm, cost=2)
                run(limiter.hit, key, stack, algorithm=algorithm)  # in a live window: INCRBY
            run(late.hit, "a", "5/minute", algorithm=algorithm)
            run(limiter.peek, "a", "5/minute", algorithm=algorithm)
            run(limiter.refund, "a", "5/minute", algorithm=algorithm)
            run(limiter.reset, "b", "5/minute", algorithm=algorithm)
        clock.advance(120)  # windows end: sliding_log trims, new compact fields sweep stale ones
        for algorithm in ALGORITHMS:
            for i in range(12):
                run(limiter.hit, f"new{i}", "5/minute", algorithm=algorithm)
            run(limiter.hit, "a", "5/minute", algorithm=algorithm)
        admin.script_flush()  # NOSCRIPT: EVAL_RO and EVAL in the same call
        run(limiter.peek, "a", "5/minute")
        run(limiter.hit, "a", "5/minute", algorithm="gcra")
        store.close()
    run(RedisStore(url, prefix=prefix, socket_timeout=5).ping)
    budget = LocalBudget(
        RedisStore(url, prefix=prefix, socket_timeout=5), clock=clock, fail_local=False
    )
    sliced = Limiter(budget, clock=clock, fail_open=False)
    for algorithm in ("fixed_window", "token_bucket", "gcra"):  # slices and heartbeats
        for _ in range(3):
            run(sliced.hit, "s", "50/minute", algorithm=algorithm)
        run(sliced.peek, "s", "50/minute", algorithm=algorithm)
        run(sliced.reset, "s", "50/minute", algorithm=algorithm)
        run(sliced.hit, "s", "50/minute", algorithm=algorithm)
    clock.advance(5)
    run(budget.maintain)
    budget.close()
    leases = ConcurrencyLimiter(RedisStore(url, prefix=prefix, socket_timeout=5), 2, clock=clock)
    lease = leases.acquire("a")
    if lease is None or lease.degraded or not leases.release(lease):
        errors.append("a lease call failed")
    run(leases.in_use, "a")

    async def batched() -> None:
        store = RedisStore(url, prefix=prefix, socket_timeout=5)
        limiter = AsyncLimiter(store, clock=clock, fail_open=False)
        admin.script_flush()  # a batch meets NOSCRIPT: SCRIPT LOAD, then the batch again
        hits = (limiter.hit(f"x{i}", "5/minute") for i in range(8))
        for d in await asyncio.gather(*hits, return_exceptions=True):
            if isinstance(d, BaseException):
                errors.append(str(d))
        slots = AsyncConcurrencyLimiter(store, 2, clock=clock)
        held = await asyncio.gather(*(slots.acquire(f"x{i}") for i in range(4)))
        released = await asyncio.gather(*(slots.release(h) for h in held))
        if not all(h is not None and not h.degraded for h in held) or not all(released):
            errors.append("an async lease call failed")
        await store.aclose()

    asyncio.run(batched())
    return errors


def test_every_store_operation_runs_as_the_acl_user_over_tls(tls_server: TLSRedisServer) -> None:
    admin = tls_server.client()
    assert exercise(user_url(tls_server), admin) == []
    used = admin.info("commandstats")
    for command in acl_commands():  # the exercise really sends every command of the rule
        assert f"cmdstat_{command}" in used, command


def test_the_rule_has_no_command_to_spare(tls_server: TLSRedisServer) -> None:
    admin = tls_server.client()
    try:
        for command in acl_commands():
            set_user(admin, acl_rule(), f"-{command}")
            errors = exercise(user_url(tls_server), admin)
            assert errors, f"nothing needed {command}"
    finally:
        set_user(admin, acl_rule())


def test_keys_outside_the_prefix_and_plain_connections_are_refused(
    tls_server: TLSRedisServer,
) -> None:
    admin = tls_server.client()
    assert exercise(user_url(tls_server), admin, prefix="other")  # ~rk{* only
    tls = user_url(tls_server)
    with pytest.raises(ConfigError, match="ssl_cert_reqs"):  # TLS options on a plain URL
        RedisStore(tls.replace("rediss://", "redis://"))
    plain = tls.replace("rediss://", "redis://").split("?")[0]  # TLS is required
    limiter = Limiter(RedisStore(plain, socket_timeout=2), fail_open=False)
    with pytest.raises(StoreUnavailable):
        limiter.hit("a", "5/minute")


def secret_free(text: str) -> bool:
    return PASSWORD not in text and quote(PASSWORD, safe="") not in text


def test_the_password_never_shows(
    tls_server: TLSRedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = user_url(tls_server, PASSWORD + "x")  # a wrong password contains the right one
    right = user_url(tls_server)
    texts: list[str] = []
    for url in (wrong, right.replace(str(tls_server.port), str(rs.free_port()))):  # refused; down
        limiter = Limiter(RedisStore(url, socket_timeout=1), clock=ManualClock())
        for _ in range(4):  # fail open, open the breaker, log
            assert limiter.hit("a", "5/minute").degraded
        texts.append(repr(limiter.stats()))
        with pytest.raises(StoreUnavailable) as failed:
            Limiter(RedisStore(url, socket_timeout=1), fail_open=False).hit("a", "5/minute")
        cause: BaseException | None = failed.value
        while cause is not None:
            texts.append(f"{cause!r} {cause}")
            cause = cause.__cause__ or cause.__context__
        leases = ConcurrencyLimiter(RedisStore(url, socket_timeout=1), 2, clock=ManualClock())
        assert leases.acquire("a") is not None
        texts.append(repr(leases.stats()))
    for bad in (right.replace("/0?", "/x?"), right.replace(f":{tls_server.port}", ":99999")):
        with pytest.raises(ConfigError) as refused:
            RedisStore(bad)
        texts.append(str(refused.value))
        with pytest.raises(ConfigError) as refused:
            ShardedRedisStore([Shard(bad)])
        texts.append(str(refused.value))
    texts += [
        repr(RedisStore(right)),
        repr(ShardedRedisStore([Shard(right)])),
        repr(RedisClusterStore(right)),
        str(Shard(right)),
    ]
    texts += [r.getMessage() for r in caplog.records]
    assert any("store failed" in t for t in texts)  # the failures were logged
    bad = [t for t in texts if not secret_free(t)]
    assert not bad, bad


def test_the_service_never_shows_the_password(tls_server: TLSRedisServer, tmp_path: Path) -> None:
    wrong = user_url(tls_server, PASSWORD + "x")
    config = tmp_path / "secured.yaml"
    config.write_text(
        f"store:\n  url: {shlex.quote(wrong)}\n  socket_timeout: 1\n"
        "policies:\n  api:\n    rate: 5/minute\n"
    )
    refused = run_serve("--config", str(config), "--no-grpc", "--port", "0", "--store-wait", "0.5")
    assert refused.returncode != 0 and "does not answer" in refused.stderr  # checked at start
    proc = ServiceProcess(config, grpc=False, extra=("--start-degraded", "--store-wait", "0.5"))
    try:
        with httpx.Client(base_url=proc.url, timeout=10) as http:
            hits = [http.post("/v1/hit", json={"policy": "api", "key": "k"}) for _ in range(5)]
            assert all(h.json()["degraded"] for h in hits)
            health = http.get("/healthz")
            metrics = http.get("/metrics").text
    finally:
        logs = proc.stop()
    assert health.status_code == 503
    assert "store" in logs and "failed" in logs  # the failure was logged
    for text in (health.text, metrics, logs, proc.banner, refused.stderr, refused.stdout):
        assert secret_free(text), text


@pytest.fixture
def cluster_user(redis_cluster: rs.RedisCluster) -> Iterator[str]:
    """The session cluster with the user on every node (the cluster rule); its URL."""
    admins = [node.client() for node in redis_cluster.nodes]
    for admin in admins:
        admin.flushall()
        set_user(admin, acl_rule(cluster=True))
    yield user_url(redis_cluster.nodes[0])
    for admin in admins:
        admin.execute_command("ACL", "DELUSER", USER)


def cluster_errors(url: str) -> list[str]:
    errors = []
    clock = ManualClock(1_800_000_000.0)
    store = RedisClusterStore(url, socket_timeout=5)
    limiter = Limiter(store, clock=clock, fail_open=False)
    for key in ("a", "b", "c", "d"):
        try:
            limiter.hit(key, "5/minute; 9/hour", algorithm="gcra")
            limiter.reset(key, "5/minute")
        except StoreUnavailable as exc:
            errors.append(str(exc))

    async def batched() -> None:
        limiter = AsyncLimiter(store, clock=clock, fail_open=False)
        hits = (limiter.hit(f"k{i}", "5/minute") for i in range(12))
        for d in await asyncio.gather(*hits, return_exceptions=True):
            if isinstance(d, BaseException):
                errors.append(str(d))
        await store.aclose()

    asyncio.run(batched())
    store.close()
    return errors


def test_a_cluster_store_runs_as_the_acl_user(
    cluster_user: str, redis_cluster: rs.RedisCluster
) -> None:
    assert cluster_errors(cluster_user) == []
    admins = [node.client() for node in redis_cluster.nodes]
    for command in ("cluster|slots", "command"):  # what the cluster rule adds is needed
        for admin in admins:
            set_user(admin, acl_rule(cluster=True), f"-{command}")
        assert cluster_errors(cluster_user), command
        for admin in admins:
            set_user(admin, acl_rule(cluster=True))
