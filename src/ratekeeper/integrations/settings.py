"""Settings read from a framework's configuration: Flask's ``app.config`` (``RATELIMIT_*``) and
Django's ``RATEKEEPER`` dict share one reader, so the names and their checks are the same.

=================  =======================================================  ==================
setting            meaning                                                  default
=================  =======================================================  ==================
STORAGE_URI        ``memory://``; a Redis URL (``redis://``, ``rediss://``,   ``memory://``
                   ``unix://``); ``redis+cluster://host:port[,host:port]``
                   (a Cluster); ``redis+sentinel://host:port[,...]/service``
                   (Sentinel; credentials before the hosts serve both the
                   Sentinels and the servers); the Redis ones shared by
                   every process
STORAGE_OPTIONS    keyword arguments of the Redis store, such as            none
                   ``{"socket_timeout": 0.2}`` (seconds; default 0.05)
KEY_PREFIX         prefix of every Redis key                                ``rk``
DEFAULT            default limits: a rate (``"100/minute"``; a stack        none
                   ``"10/second; 500/hour"`` is one limit) or a list
STRATEGY           the algorithm of limits that name none (checked even     ``fixed_window``
                   when no limit uses it yet)
APPLICATION        limits every route walks besides its own: one counter    none
                   for the whole app per key
ON_ERROR           ``open`` (an error in the application's key, rate or     ``open``
                   cost function lets the request through, logged and
                   counted) or ``raise`` (tests)
TRUSTED_PROXIES    proxies whose ``X-Forwarded-For`` is believed            none
ENABLED            False switches every check off (the kill switch)         True
MODE               ``enforce``, ``shadow`` (decide and count, never         ``enforce``
                   reject) or ``off``
=================  =======================================================  ==================

A setting under the prefix that is not in this table is an error naming it (a typo never goes
unnoticed); arguments given in code win over settings.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError
from ..middleware.checks import check_mode
from ..middleware.gate import check_on_error
from ..middleware.request import trusted_networks
from ..plan import make_policy
from ..stores.memory import MemoryStore
from ..stores.redis.urls import redact
from .routes import Limit, as_limits

NAMES = (
    "STORAGE_URI",
    "STORAGE_OPTIONS",
    "KEY_PREFIX",
    "DEFAULT",
    "STRATEGY",
    "TRUSTED_PROXIES",
    "ENABLED",
    "MODE",
    "APPLICATION",
    "ON_ERROR",
)
PEER_STRATEGIES = {
    "fixed-window": "fixed_window",
    "moving-window": "sliding_log",
    "sliding-window-counter": "sliding_window",
}
"""The limits library's strategy names (Flask-Limiter's, slowapi's) -> ratekeeper's algorithm."""
SCHEMES = ("redis://", "rediss://", "unix://")
CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")
SENTINEL_SCHEMES = ("redis+sentinel://", "rediss+sentinel://")


@dataclass(frozen=True, slots=True)
class Settings:
    """What the table above says, checked."""

    storage_uri: str = "memory://"
    key_prefix: str = "rk"
    default: tuple[Limit, ...] = ()
    strategy: str = "fixed_window"
    trusted_proxies: tuple[str, ...] = ()
    mode: str = "enforce"
    storage_options: tuple[tuple[str, Any], ...] = ()
    application: tuple[Limit, ...] = ()
    on_error: str = "open"

    def store(self) -> Any:
        """A store for ``storage_uri`` (Redis clients connect on first use)."""
        return store_for(self.storage_uri, self.key_prefix, dict(self.storage_options))


def store_for(uri: str, prefix: str = "rk", options: Mapping[str, Any] | None = None) -> Any:
    """The store a ``STORAGE_URI`` names (see the table above), built with ``options``."""
    options = dict(options or {})
    if uri == "memory://":
        return MemoryStore()
    scheme, _, rest = uri.partition("://")
    plain = scheme.split("+")[0]
    credentials, _, where = rest.rpartition("@")
    login = f"{credentials}@" if credentials else ""
    hosts, _, path = where.partition("/")
    if uri.startswith(CLUSTER_SCHEMES):
        from ..stores.redis.cluster import RedisClusterStore

        first = hosts.split(",")[0]
        return RedisClusterStore(f"{plain}://{login}{first}", prefix=prefix, **options)
    if uri.startswith(SENTINEL_SCHEMES):
        from ..stores.redis.sharded import SentinelStore

        service = path.strip("/")
        sentinels = [f"{plain}://{login}{host}" for host in hosts.split(",")]
        return SentinelStore(
            service, sentinels, url=f"{plain}://{login}/0", prefix=prefix, **options
        )
    from ..stores.redis.single import RedisStore

    return RedisStore(uri, prefix=prefix, **options)


def check_uri(uri: object, where: str) -> str:
    """A ``STORAGE_URI`` of a form the table accepts, its parts checked."""
    expected = (
        "expected 'memory://', a Redis URL such as 'redis://127.0.0.1:6379/0', "
        "'redis+cluster://host:port,host:port' or 'redis+sentinel://host:port/service'"
    )
    if not isinstance(uri, str):
        raise ConfigError(f"{where} {uri!r} is invalid; {expected}")
    shown = repr(redact(uri))
    if uri == "memory://" or uri.startswith(SCHEMES):
        return uri
    if not uri.startswith((*CLUSTER_SCHEMES, *SENTINEL_SCHEMES)):
        if uri.startswith(("memcached://", "mongodb://", "etcd://", "valkey")):
            raise ConfigError(
                f"{where} {shown} is not supported: ratekeeper keeps its counters in memory or "
                f"on Redis; {expected}"
            )
        raise ConfigError(f"{where} {shown} is invalid; {expected}")
    rest = uri.partition("://")[2].rpartition("@")[2]
    hosts, _, path = rest.partition("/")
    for host in hosts.split(","):
        name, _, port = host.rpartition(":")
        if not name or not port.isdigit():
            raise ConfigError(
                f"{where} {shown} names host {host!r}; expected host:port, e.g. 10.0.0.1:26379"
            )
    if uri.startswith(SENTINEL_SCHEMES) and not path.strip("/"):
        raise ConfigError(
            f"{where} {shown} names no service; expected e.g. "
            "'redis+sentinel://10.0.0.1:26379,10.0.0.2:26379/mymaster'"
        )
    if uri.startswith(CLUSTER_SCHEMES) and path.strip("/"):
        raise ConfigError(f"{where} {shown} names a database; a Cluster has only database 0")
    return uri


def _storage_options(options: Any, name: str) -> tuple[tuple[str, Any], ...]:
    """The Redis store's keyword arguments a setting may give (not its clients or prefix)."""
    from ..stores.redis.single import RedisStore

    params = inspect.signature(RedisStore).parameters.values()
    allowed = sorted(
        p.name
        for p in params
        if p.kind is p.KEYWORD_ONLY and p.name not in {"client", "async_client", "prefix"}
    )
    if not isinstance(options, Mapping):
        raise ConfigError(f"{name} {options!r} must be a dict such as {{'socket_timeout': 0.2}}")
    bad = sorted(str(k) for k in options if k not in allowed)
    if bad:
        raise ConfigError(
            f"{name}: option {bad[0]!r} is unknown; expected one of {', '.join(allowed)}"
        )
    return tuple(sorted(options.items()))


def read(config: Mapping[str, Any], prefix: str, where: str, extra: Iterable[str] = ()) -> Settings:
    """Read the settings under ``prefix`` from ``config`` (``where`` names it in errors);
    names in ``extra`` are the framework's own and are left to it."""
    known = {prefix + name for name in (*NAMES, *extra)}
    ours = [k for k in config if str(k).startswith(prefix)] if prefix else list(config)
    bad = sorted(str(k) for k in ours if k not in known)
    if bad:
        raise ConfigError(
            f"{where}: setting {bad[0]!r} is unknown; expected one of {', '.join(sorted(known))}"
        )

    def get(name: str, default: Any) -> Any:
        return config.get(prefix + name, default)

    uri = check_uri(get("STORAGE_URI", "memory://"), f"{where}: {prefix}STORAGE_URI")
    storage_options = _storage_options(
        get("STORAGE_OPTIONS", {}), f"{where}: {prefix}STORAGE_OPTIONS"
    )
    key_prefix = get("KEY_PREFIX", "rk")
    if not isinstance(key_prefix, str) or not key_prefix:
        raise ConfigError(f"{where}: {prefix}KEY_PREFIX {key_prefix!r} must be a non-empty string")
    strategy = get("STRATEGY", "fixed_window")
    try:
        make_policy("1/1s", strategy, None, None)  # even when no limit uses it yet
    except ValueError as exc:
        equivalent = PEER_STRATEGIES.get(strategy) if isinstance(strategy, str) else None
        hint = f" ({strategy!r} is the limits library's name: ratekeeper's is {equivalent!r})"
        raise ConfigError(f"{where}: {prefix}STRATEGY: {exc}{hint if equivalent else ''}") from None
    try:
        default = as_limits(get("DEFAULT", None))
        application = as_limits(get("APPLICATION", None))
        for limit in (*default, *application):
            limit.bind("default", lambda request: None, strategy)
    except ValueError as exc:
        raise ConfigError(f"{where}: {prefix}DEFAULT or {prefix}APPLICATION: {exc}") from None
    on_error = check_on_error(get("ON_ERROR", "open"), f"{where}: {prefix}ON_ERROR")
    proxies = get("TRUSTED_PROXIES", ())
    if isinstance(proxies, str):
        proxies = (proxies,)
    try:
        if not isinstance(proxies, list | tuple):
            raise ConfigError(f"{proxies!r} is not a list")
        trusted_networks(proxies)
    except ConfigError as exc:
        raise ConfigError(
            f"{where}: {prefix}TRUSTED_PROXIES {proxies!r} is invalid ({exc}); expected a list "
            "of addresses or CIDR ranges such as ['10.0.0.0/8']"
        ) from None
    enabled = get("ENABLED", True)
    if not isinstance(enabled, bool):
        raise ConfigError(f"{where}: {prefix}ENABLED {enabled!r} must be True or False")
    mode = check_mode(get("MODE", "enforce"), f"{where}: {prefix}MODE")
    mode = mode if enabled else "off"
    return Settings(
        uri, key_prefix, default, strategy, tuple(proxies), mode, storage_options, application,
        on_error,
    )  # fmt: skip
