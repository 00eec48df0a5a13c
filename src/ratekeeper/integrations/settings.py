"""Settings read from a framework's configuration: Flask's ``app.config`` (``RATELIMIT_*``) and
Django's ``RATEKEEPER`` dict share one reader, so the names and their checks are the same.

=================  =======================================================  ==================
setting            meaning                                                  default
=================  =======================================================  ==================
STORAGE_URI        ``memory://``, or a Redis URL (``redis://``,             ``memory://``
                   ``rediss://``, ``unix://``) shared by every process
STORAGE_OPTIONS    keyword arguments of the Redis store, such as            none
                   ``{"socket_timeout": 0.2}`` (seconds; default 0.05)
KEY_PREFIX         prefix of every Redis key                                ``rk``
DEFAULT            default limits: a rate (``"100/minute"``; a stack        none
                   ``"10/second; 500/hour"`` is one limit) or a list
STRATEGY           the algorithm of limits that name none                   ``fixed_window``
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
from ..middleware.request import trusted_networks
from ..stores.memory import MemoryStore
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
)


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

    def store(self) -> Any:
        """A store for ``storage_uri`` (Redis clients connect on first use)."""
        if self.storage_uri == "memory://":
            return MemoryStore()
        from ..stores.redis.single import RedisStore

        return RedisStore(self.storage_uri, prefix=self.key_prefix, **dict(self.storage_options))


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

    uri = get("STORAGE_URI", "memory://")
    if not isinstance(uri, str) or not (
        uri == "memory://" or uri.startswith(("redis://", "rediss://", "unix://"))
    ):
        raise ConfigError(
            f"{where}: {prefix}STORAGE_URI {uri!r} is invalid; expected 'memory://' or a Redis "
            "URL such as 'redis://127.0.0.1:6379/0'"
        )
    storage_options = _storage_options(
        get("STORAGE_OPTIONS", {}), f"{where}: {prefix}STORAGE_OPTIONS"
    )
    key_prefix = get("KEY_PREFIX", "rk")
    if not isinstance(key_prefix, str) or not key_prefix:
        raise ConfigError(f"{where}: {prefix}KEY_PREFIX {key_prefix!r} must be a non-empty string")
    strategy = get("STRATEGY", "fixed_window")
    try:
        default = as_limits(get("DEFAULT", None))
        for limit in default:
            limit.bind("default", lambda request: None, strategy)
    except ValueError as exc:
        raise ConfigError(f"{where}: {prefix}DEFAULT or {prefix}STRATEGY: {exc}") from None
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
    return Settings(uri, key_prefix, default, strategy, tuple(proxies), mode, storage_options)
