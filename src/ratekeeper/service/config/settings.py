"""The settings sections of ratekeeper's config format, read into frozen settings: ``store:``
(which store runs the plans, and how) and ``auth:`` (bearer tokens, literal or from the
environment). Each reader records its problems in a ``Problems`` and goes on, so a refused
config names all of them; ``config`` calls these and owns the rest of the format.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ...errors import ConfigError
from ...stores.redis.layout import CompactLayout
from ...stores.redis.sentinel import SentinelShard
from ...stores.redis.urls import check_url, redact
from ...yaml_lines import (
    Map,
    Problem,
    Problems,
    need_bool,
    need_int,
    need_map,
    need_seq,
    no_unknown,
)


@dataclass(frozen=True, slots=True)
class AuthSettings:
    """Bearer tokens; an empty string means not configured."""

    token: str = ""
    admin_token: str = ""
    grpc: bool = False


@dataclass(frozen=True, slots=True)
class ShardSettings:
    """One shard of a sharded store: a primary URL, replica URLs and an optional name; or,
    with ``sentinels``, the primary Sentinel names ``service`` (``url``: the Redis servers'
    credentials and database, no host)."""

    url: str
    replicas: tuple[str, ...] = ()
    name: str = ""
    service: str = ""
    sentinels: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class StoreSettings:
    """Which store runs the plans: ``memory``, ``redis`` (one URL), ``sharded``, ``sentinel``
    (one ``shards`` entry, found through Sentinel) or ``cluster``; ``layout_buckets`` > 0 asks
    for the compact key layout."""

    kind: str = "memory"
    url: str = ""
    shards: tuple[ShardSettings, ...] = ()
    max_keys: int = 1_000_000
    prefix: str = "rk"
    socket_timeout: float = 0.05
    batch: bool = True
    batch_max_size: int = 128
    batch_max_wait_ms: float = 1.0
    batch_max_in_flight: int = 2
    layout_buckets: int = 0


_URL = ("redis://", "rediss://", "unix://")


def read_store(value: Any, line: int, problems: Problems) -> StoreSettings:
    """The ``store:`` section; its problems are recorded (then the result is not used)."""
    if isinstance(value, str):
        value = Map({"url": value})
        value.line, value.lines = line, {"url": line}
    body = need_map(value, line, "store")
    guard = problems.guard
    allowed = {"url", "shards", "cluster", "sentinel", "max_keys", "prefix", "socket_timeout"}
    allowed |= {"batch", "layout"}
    with guard():
        no_unknown(body, allowed, "store")
    at = body.lines.get
    common = StoreSettings()
    with guard():
        max_keys = need_int(
            body.get("max_keys", 1_000_000), at("max_keys", line), "max_keys", 1, 10**9
        )
        common = replace(common, max_keys=max_keys)
    prefix = body.get("prefix", "rk")
    if not isinstance(prefix, str) or not prefix or len(prefix) > 64:
        problems.add(
            Problem(at("prefix", line), f"store prefix {prefix!r} must be 1-64 characters")
        )
    else:
        common = replace(common, prefix=prefix)
    timeout = body.get("socket_timeout", 0.05)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= 60:
        problems.add(
            Problem(
                at("socket_timeout", line),
                f"socket_timeout {timeout!r} must be seconds, more than 0 and at most 60",
            )
        )
    else:
        common = replace(common, socket_timeout=float(timeout))
    with guard():
        batch, size, wait, flying = _batch(body.get("batch", True), at("batch", line))
        common = replace(
            common, batch=batch, batch_max_size=size, batch_max_wait_ms=wait,
            batch_max_in_flight=flying,
        )  # fmt: skip
    with guard():
        common = replace(common, layout_buckets=_layout(body.get("layout"), at("layout", line)))
    where = [k for k in ("url", "shards", "cluster", "sentinel") if k in body]
    if len(where) > 1:
        raise Problem(body.lines[where[1]], "store takes one of url, shards, cluster or sentinel")
    if "sentinel" in body:
        shard = _sentinel(body["sentinel"], body.lines["sentinel"], "store.sentinel", "")
        return replace(common, kind="sentinel", shards=(shard,))
    if "shards" in body:
        shards = need_seq(body["shards"], body.lines["shards"], "store.shards")
        if not shards:
            raise Problem(shards.line, "store.shards is empty; expected at least one shard")
        out = []
        for item, ln in zip(shards, shards.lines, strict=True):
            with guard():
                out.append(_shard(item, ln))
        return replace(common, kind="sharded", shards=tuple(out))
    kind = "cluster" if "cluster" in body else "redis"
    url = body.get("cluster", body.get("url", "memory"))
    url_line = at("cluster", at("url", line))
    if url == "memory":
        return common
    if not isinstance(url, str) or not url.startswith(_URL):
        raise Problem(
            url_line, f"store {redact(url)!r} is unknown; expected 'memory' or a redis:// URL"
        )
    _check(url_line, url, "cluster url" if kind == "cluster" else "url", kind == "cluster")
    return replace(common, kind=kind, url=url)


def _check(line: int, url: str, what: str, cluster: bool = False) -> None:
    """``url`` checked as the store will check it (``check_url``), its problem at ``line``."""
    try:
        check_url(url, what, cluster=cluster)
    except ConfigError as e:
        raise Problem(line, str(e)) from None


def _layout(value: Any, line: int) -> int:
    """``layout:``: ``default`` (one Redis key per state: 0), ``compact`` (4096 buckets) or
    ``{buckets: N}`` (compact, N buckets)."""
    if value is None or value == "default":
        return 0
    if value == "compact":
        return CompactLayout().buckets
    if isinstance(value, Mapping):
        body = need_map(value, line, "store.layout")
        no_unknown(body, {"buckets"}, "store.layout")
        buckets = body.get("buckets", CompactLayout().buckets)
        try:
            return CompactLayout(buckets).buckets
        except ConfigError as e:
            raise Problem(body.lines.get("buckets", line), str(e)) from None
    raise Problem(
        line, f"store layout {value!r} is unknown; expected default, compact or {{buckets: N}}"
    )


def _sentinel(value: Any, line: int, what: str, name: str) -> ShardSettings:
    """A ``sentinel:`` mapping: ``service``, ``sentinels`` and optionally ``url``."""
    body = need_map(value, line, what)
    no_unknown(body, {"service", "sentinels", "url"}, what)
    sentinels = body.get("sentinels")
    if not isinstance(sentinels, list):
        raise Problem(
            body.lines.get("sentinels", line),
            f"{what}.sentinels must be a list of Sentinel URLs like redis://10.0.0.1:26379",
        )
    service: Any = body.get("service")
    url: Any = body.get("url", "redis:///0")
    try:
        shard = SentinelShard(service, sentinels, url, name)
    except ConfigError as e:
        first = str(e).split(" ", 1)[0]  # the value the message names
        key = {"service": "service", "url": "url"}.get(first, "sentinels")
        raise Problem(body.lines.get(key, line), f"{what}: {e}") from None
    return ShardSettings(shard.url, (), name, shard.service, tuple(shard.sentinels))


def _batch(value: Any, line: int) -> tuple[bool, int, float, int]:
    if isinstance(value, bool):
        return value, 128, 1.0, 2
    body = need_map(value, line, "store.batch")
    no_unknown(body, {"max_size", "max_wait_ms", "max_in_flight"}, "store.batch")
    size = need_int(
        body.get("max_size", 128), body.lines.get("max_size", line), "max_size", 1, 10_000
    )
    wait = body.get("max_wait_ms", 1.0)
    if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait <= 100:
        raise Problem(body.lines.get("max_wait_ms", line), f"max_wait_ms {wait!r} must be 0-100")
    out = need_int(
        body.get("max_in_flight", 2), body.lines.get("max_in_flight", line), "max_in_flight",
        1, 64,
    )  # fmt: skip
    return True, size, float(wait), out


def _shard(value: Any, line: int) -> ShardSettings:
    if isinstance(value, str):
        value = Map({"url": value})
        value.line, value.lines = line, {"url": line}
    body = need_map(value, line, "a shard")
    name = body.get("name", "")
    if not isinstance(name, str):
        raise Problem(body.lines.get("name", line), f"shard name {name!r} must be a string")
    if "sentinel" in body:
        no_unknown(body, {"sentinel", "name"}, "a Sentinel shard")
        return _sentinel(body["sentinel"], body.lines["sentinel"], "a shard's sentinel", name)
    no_unknown(body, {"url", "replicas", "name", "sentinel"}, "a shard")
    url = body.get("url")
    if not isinstance(url, str) or not url.startswith(_URL):
        raise Problem(
            body.lines.get("url", line), f"shard url {redact(url)!r} must be a redis:// URL"
        )
    _check(body.lines.get("url", line), url, "shard url")
    replicas = body.get("replicas", [])
    if not isinstance(replicas, list) or not all(
        isinstance(r, str) and r.startswith(_URL) for r in replicas
    ):
        raise Problem(body.lines.get("replicas", line), "replicas must be a list of redis:// URLs")
    for replica in replicas:
        _check(body.lines.get("replicas", line), replica, "replica url")
    return ShardSettings(url, tuple(replicas), name)


def read_auth(
    body: Map, env: Mapping[str, str], current: AuthSettings, problems: Problems
) -> AuthSettings:
    """The ``auth:`` section over ``current`` (the tokens of the environment variables)."""
    with problems.guard():
        allowed = {"token", "token_env", "admin_token", "admin_token_env", "grpc"}
        no_unknown(body, allowed, "auth")
    tokens = {"token": current.token, "admin_token": current.admin_token}
    for name in ("token", "admin_token"):
        with problems.guard():
            if name in body and f"{name}_env" in body:
                raise Problem(body.lines[name], f"auth takes {name} or {name}_env, not both")
            if name in body:
                tokens[name] = check_token(body[name], body.lines[name], f"auth.{name}")
            elif f"{name}_env" in body:
                var = body[f"{name}_env"]
                line = body.lines[f"{name}_env"]
                if not isinstance(var, str) or var not in env:
                    raise Problem(line, f"auth.{name}_env names {var!r}, which is not set")
                tokens[name] = check_token(env[var], line, f"environment variable {var}")
    grpc = False
    with problems.guard():
        grpc = need_bool(body.get("grpc", False), body.lines.get("grpc", body.line), "auth.grpc")
    return AuthSettings(tokens["token"], tokens["admin_token"], grpc)


def check_token(value: Any, line: int, what: str) -> str:
    """A bearer token: at least 16 ASCII characters, no spaces."""
    if not isinstance(value, str) or len(value) < 16 or not value.isascii() or " " in value:
        raise Problem(line, f"{what} must be a string of at least 16 ASCII characters, no spaces")
    return value
