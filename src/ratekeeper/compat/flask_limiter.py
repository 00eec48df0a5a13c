"""Flask-Limiter's names on ratekeeper's Flask integration: port an app by changing its imports.

    from ratekeeper.compat.flask_limiter import Limiter, get_remote_address

    limiter = Limiter(get_remote_address, app=app, default_limits=["200 per day"],
                      storage_uri="redis://127.0.0.1:6379")

    @app.route("/slow")
    @limiter.limit("1 per day")
    def slow(): ...

What maps onto what: ``Limiter`` holds a ``RouteLimits``; ``limit``, ``shared_limit`` and
``exempt`` are its decorators (views and blueprints); ``default_limits`` and
``application_limits`` (or ``RATELIMIT_DEFAULT`` / ``RATELIMIT_APPLICATION``) are its default
and application limits; ``init_app`` translates Flask-Limiter's ``RATELIMIT_*`` settings
(constructor arguments win, as in Flask-Limiter) into the integration's and hands them over in
place of ``app.config``, so ``RATELIMIT_TRUSTED_PROXIES``, ``RATELIMIT_MODE`` and
``RATELIMIT_ON_ERROR`` of ratekeeper's own work too. A refusal raises ``RateLimitExceeded``: a
429 ``HTTPException`` answered as Flask-Limiter's (werkzeug's page, the limit as limits prints
it or ``error_message`` as its description), so ``@app.errorhandler(429)`` sees what it saw.
Keys, dynamic limits, costs and ``exempt_when`` are Flask-Limiter's functions of nothing
(they read ``flask.request``); ``get_remote_address`` is ratekeeper's client address.

Refused, naming what to use instead: ``deduct_when``, ``on_breach``, meta limits, in-memory
fallback, custom header names, ``http-date`` ``Retry-After``, ``fail_on_first_breach=False``,
``request_identifier``, request filters, callable scopes and exemption flags other than the
default. See docs/migrating.md for the table of every option and setting.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from flask import Flask
from flask import request as flask_request
from werkzeug.exceptions import TooManyRequests

from ..errors import ConfigError
from ..integrations.flask import RateLimited, RouteLimits
from ..integrations.routes import Limit as OurLimit
from ..middleware.request import KeyFunc, RequestInfo
from ..middleware.responses import Rejection
from . import limits_syntax

__all__ = [
    "ApplicationLimit",
    "ExemptionScope",
    "Limit",
    "Limiter",
    "RateLimitExceeded",
    "get_remote_address",
]


def get_remote_address() -> str:
    """The client's address (Flask-Limiter's key): ``request.remote_addr``, or ``127.0.0.1``."""
    return flask_request.remote_addr or "127.0.0.1"


class RateLimitExceeded(RateLimited):
    """A refusal, as Flask-Limiter's exception: a 429 ``HTTPException`` whose ``description``
    is the limit as limits prints it (or its ``error_message``), rendered by werkzeug."""

    def __init__(self, rejection: Rejection) -> None:
        super().__init__(rejection)
        decision = rejection.decision
        if rejection.message is not None:
            self.description = rejection.message
        elif decision is not None:
            self.description = limits_syntax.describe(decision.rate)

    def get_body(self, environ: Any = None, scope: Any = None) -> str:
        return TooManyRequests.get_body(self, environ, scope)

    def get_headers(self, environ: Any = None, scope: Any = None) -> list[tuple[str, str]]:
        return TooManyRequests.get_headers(self, environ, scope)


class ExemptionScope(enum.Flag):
    """Flask-Limiter's exemption flags; only the default (all three) is supported."""

    NONE = 0
    APPLICATION = enum.auto()
    META = enum.auto()
    DEFAULT = enum.auto()
    DESCENDENTS = enum.auto()
    ANCESTORS = enum.auto()


_EXEMPT = ExemptionScope.APPLICATION | ExemptionScope.DEFAULT | ExemptionScope.META


@dataclass
class Limit:
    """Flask-Limiter's ``Limit`` for ``default_limits`` (its fields; ``key_function`` and
    ``cost`` are functions of nothing)."""

    limit_provider: str | Callable[[], str]
    key_function: Callable[[], str] | None = None
    scope: str | Callable[[str], str] | None = None
    cost: int | Callable[[], int] | None = None
    shared: bool = False
    methods: Iterable[str] | None = None
    per_method: bool = False
    error_message: str | Callable[[], str] | None = None
    meta_limits: Any = None
    exempt_when: Callable[[], bool] | None = None
    deduct_when: Any = None
    on_breach: Any = None


@dataclass
class ApplicationLimit(Limit):
    """Flask-Limiter's ``ApplicationLimit``: one counter for the whole app."""

    scope: str | Callable[[str], str] | None = field(default="global")
    shared: bool = True


def _refuse(what: str, instead: str) -> ConfigError:
    return ConfigError(f"Flask-Limiter's {what} is not supported: {instead}")


_NO_DEDUCT = (
    "a request is charged when admitted and refunded when charge_when(status) says no: use "
    "ratekeeper.integrations.flask.RouteLimits.limit(..., charge_when=lambda status: ...)"
)
_NO_BREACH = "shape the 429 with @app.errorhandler(429) (or RouteLimits(on_breach=...))"
_NO_META = "there are no meta limits; give the longer window a limit of its own"
_NO_FALLBACK = "store outages fail open (logged and counted); there is no fallback store"


class Limiter:
    """Flask-Limiter's ``Limiter`` (its arguments, settings and decorators) over a
    ``RouteLimits``."""

    def __init__(
        self,
        key_func: Callable[[], str],
        *,
        app: Flask | None = None,
        default_limits: Iterable[str | Callable[[], str] | Limit] | None = None,
        default_limits_per_method: bool | None = None,
        default_limits_exempt_when: Callable[[], bool] | None = None,
        default_limits_deduct_when: Any = None,
        default_limits_cost: int | Callable[[], int] | None = None,
        application_limits: Iterable[str | Callable[[], str] | Limit] | None = None,
        application_limits_per_method: bool | None = None,
        application_limits_exempt_when: Callable[[], bool] | None = None,
        application_limits_deduct_when: Any = None,
        application_limits_cost: int | Callable[[], int] | None = None,
        headers_enabled: bool | None = None,
        header_name_mapping: Mapping[Any, str] | None = None,
        strategy: str | None = None,
        storage_uri: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        swallow_errors: bool | None = None,
        fail_on_first_breach: bool | None = None,
        on_breach: Any = None,
        meta_limits: Any = None,
        on_meta_breach: Any = None,
        in_memory_fallback: Any = None,
        in_memory_fallback_enabled: bool | None = None,
        retry_after: str | None = None,
        key_prefix: str = "",
        request_identifier: Any = None,
        enabled: bool = True,
    ) -> None:
        refused = {
            "default_limits_deduct_when": (default_limits_deduct_when, _NO_DEDUCT),
            "application_limits_deduct_when": (application_limits_deduct_when, _NO_DEDUCT),
            "header_name_mapping": (header_name_mapping, "the headers keep their names"),
            "on_breach": (on_breach, _NO_BREACH),
            "meta_limits": (meta_limits, _NO_META),
            "on_meta_breach": (on_meta_breach, _NO_META),
            "in_memory_fallback": (in_memory_fallback, _NO_FALLBACK),
            "in_memory_fallback_enabled": (in_memory_fallback_enabled, _NO_FALLBACK),
            "request_identifier": (request_identifier, "limits are counted per endpoint"),
        }
        for name, (value, instead) in refused.items():
            if value:
                raise _refuse(f"Limiter({name}=...)", instead)
        self._key_func = key_func
        self._given = {
            "DEFAULT": None if default_limits is None else list(default_limits),
            "DEFAULTS_PER_METHOD": default_limits_per_method,
            "DEFAULTS_EXEMPT_WHEN": default_limits_exempt_when,
            "DEFAULTS_COST": default_limits_cost,
            "APPLICATION": None if application_limits is None else list(application_limits),
            "APPLICATION_PER_METHOD": application_limits_per_method,
            "APPLICATION_EXEMPT_WHEN": application_limits_exempt_when,
            "APPLICATION_COST": application_limits_cost,
            "HEADERS_ENABLED": headers_enabled,
            "STRATEGY": strategy,
            "STORAGE_URI": storage_uri,
            "STORAGE_OPTIONS": None if storage_options is None else dict(storage_options),
            "SWALLOW_ERRORS": swallow_errors,
            "FAIL_ON_FIRST_BREACH": fail_on_first_breach,
            "HEADER_RETRY_AFTER_VALUE": retry_after,
            "KEY_PREFIX": key_prefix or None,
            "ENABLED": enabled,
        }
        self._limits = RouteLimits(key=_key(key_func))
        self._limits.exception = RateLimitExceeded
        _settings(self._given, {}, _key(key_func))  # what can fail without an app fails now
        if app is not None:
            self.init_app(app)

    @property
    def routes(self) -> RouteLimits:
        """The ``RouteLimits`` this limiter maps onto (``stats(app)``, ``controls_of(app)``)."""
        return self._limits

    def init_app(self, app: Flask) -> None:
        """Translate Flask-Limiter's settings (arguments win over ``app.config``) and hand them
        to ``RouteLimits.init_app`` in place of ``app.config``."""
        config = _settings(self._given, app.config, _key(self._key_func))
        self._limits.init_app(app, config)

    def limit(
        self,
        limit_value: str | Callable[[], str],
        *,
        key_func: Callable[[], str] | None = None,
        per_method: bool = False,
        methods: Iterable[str] | None = None,
        error_message: str | Callable[[], str] | None = None,
        exempt_when: Callable[[], bool] | None = None,
        override_defaults: bool = True,
        deduct_when: Any = None,
        on_breach: Any = None,
        cost: int | Callable[[], int] = 1,
        scope: str | Callable[[str], str] | None = None,
        meta_limits: Any = None,
    ) -> _Decorator:
        """Flask-Limiter's per-view (or per-blueprint) limit."""
        _refuse_per_limit(deduct_when, on_breach, meta_limits, scope, shared=False)
        limit = _limit(
            limit_value, _key(key_func) if key_func else None, per_method, methods,
            error_message, exempt_when, cost, override_defaults, None,
        )  # fmt: skip
        return _Decorator(self._limits.table.mark(limit))

    def shared_limit(
        self,
        limit_value: str | Callable[[], str],
        scope: str | Callable[[str], str],
        *,
        key_func: Callable[[], str] | None = None,
        per_method: bool = False,
        methods: Iterable[str] | None = None,
        error_message: str | Callable[[], str] | None = None,
        exempt_when: Callable[[], bool] | None = None,
        override_defaults: bool = True,
        deduct_when: Any = None,
        on_breach: Any = None,
        cost: int | Callable[[], int] = 1,
        meta_limits: Any = None,
    ) -> _Decorator:
        """Flask-Limiter's limit shared by the views it decorates (one counter per scope)."""
        _refuse_per_limit(deduct_when, on_breach, meta_limits, scope, shared=True)
        assert isinstance(scope, str)  # checked just above
        limit = _limit(
            limit_value, _key(key_func) if key_func else None, per_method, methods,
            error_message, exempt_when, cost, override_defaults, scope,
        )  # fmt: skip
        return _Decorator(self._limits.table.mark(limit))

    def exempt(self, obj: Any = None, *, flags: ExemptionScope = _EXEMPT) -> Any:
        """Free a view or blueprint from the default and application limits."""
        if flags != _EXEMPT:
            raise _refuse(
                f"exempt(flags={flags!r})",
                "an exemption frees a view or blueprint from default and application limits "
                "together (the default flags)",
            )
        if obj is None:
            return self._limits.exempt
        return self._limits.exempt(obj)

    def request_filter(self, fn: Callable[[], bool]) -> Callable[[], bool]:
        """Refused: return None from a key function to skip a request, or ``exempt=[paths]``."""
        raise _refuse(
            "request_filter", "return None from a key function, or RouteLimits(exempt=[paths])"
        )

    def reset(self) -> None:
        """Refused: empty the store yourself."""
        raise _refuse("Limiter.reset()", "empty the store yourself (FLUSHDB on a Redis of its own)")

    @property
    def current_limit(self) -> Any:
        """Refused: the response's rate-limit headers say it."""
        raise _refuse("current_limit", "read the X-RateLimit-* headers of the response")


class _Decorator:
    """What ``limit`` returns: a decorator for views and blueprints (not a context manager)."""

    def __init__(self, mark: Callable[[Any], Any]) -> None:
        self._mark = mark

    def __call__(self, target: Any) -> Any:
        return self._mark(target)

    def __enter__(self) -> None:
        raise _refuse("limit(...) as a context manager", "put the limit on a view or blueprint")

    def __exit__(self, *exc: object) -> None:
        return None


def _refuse_per_limit(
    deduct_when: Any, on_breach: Any, meta_limits: Any, scope: Any, shared: bool
) -> None:
    if deduct_when is not None:
        raise _refuse("limit(deduct_when=...)", _NO_DEDUCT)
    if on_breach is not None:
        raise _refuse("limit(on_breach=...)", _NO_BREACH)
    if meta_limits:
        raise _refuse("limit(meta_limits=...)", _NO_META)
    if scope is not None and not isinstance(scope, str):
        raise _refuse("a callable scope", "give a string")
    if shared and not scope:
        raise ConfigError("shared_limit needs a scope: the shared limit's name")


def _key(key_func: Callable[[], Any]) -> KeyFunc:
    """Flask-Limiter's key function (of nothing: it reads ``flask.request``) as a key of
    ``RequestInfo``; an empty key skips the limit, as Flask-Limiter does."""
    if key_func is get_remote_address:
        return RequestInfo.client  # the same address (the peer), without flask.request

    def key(info: RequestInfo) -> str | None:
        found = key_func()
        return str(found) if found else None

    return key


def _limit(
    value: str | Callable[[], str],
    key: KeyFunc | None,
    per_method: bool,
    methods: Iterable[str] | None,
    error_message: object,
    exempt_when: Callable[[], bool] | None,
    cost: int | Callable[[], int] | None,
    override_defaults: bool,
    name: str | None,
    default_key: KeyFunc | None = None,
) -> OurLimit:
    if error_message is not None and not isinstance(error_message, str):
        raise _refuse("a callable error_message", "give a string")
    rate: Any = limits_syntax.rates(value) if isinstance(value, str) else _dynamic(value)
    base = key or default_key
    if per_method or exempt_when is not None:
        base = _scoped(base, per_method, exempt_when)
    spent: Any = 1 if cost is None else cost if not callable(cost) else (lambda info: cost())
    return OurLimit(
        rate, base, name, None, None, None, spent, tuple(methods or ()), None,
        override_defaults, error_message,
    )  # fmt: skip


def _scoped(
    base: KeyFunc | None, per_method: bool, exempt_when: Callable[[], bool] | None
) -> KeyFunc:
    """A key counting per method when asked, None (the limit skipped) when exempt. ``base``
    None is the integration's default key (the client's address)."""
    inner = base or RequestInfo.client

    def key(info: RequestInfo) -> str | None:
        if exempt_when is not None and exempt_when():
            return None
        found = inner(info)
        return None if found is None else f"{found}\x00{info.method}" if per_method else found

    return key


def _dynamic(provider: Callable[[], str]) -> Callable[[RequestInfo], str]:
    def rate(info: RequestInfo) -> str:
        return limits_syntax.rates(provider(), "the limit function's value")

    return rate


_PASSED = ("TRUSTED_PROXIES", "MODE", "ON_ERROR")
"""ratekeeper's own settings, passed through as they are."""
_REFUSED = {
    "DEFAULTS_DEDUCT_WHEN": _NO_DEDUCT,
    "APPLICATION_DEDUCT_WHEN": _NO_DEDUCT,
    "ON_BREACH_CALLBACK": _NO_BREACH,
    "META": _NO_META,
    "ON_META_BREACH_CALLBACK": _NO_META,
    "IN_MEMORY_FALLBACK": _NO_FALLBACK,
    "IN_MEMORY_FALLBACK_ENABLED": _NO_FALLBACK,
    "REQUEST_IDENTIFIER": "limits are counted per endpoint",
    "KEY_FUNC": "pass the key function to Limiter()",
    "HEADER_LIMIT": "the headers keep their names",
    "HEADER_REMAINING": "the headers keep their names",
    "HEADER_RESET": "the headers keep their names",
    "HEADER_RETRY_AFTER": "the headers keep their names",
}
_KNOWN = (
    "ENABLED", "DEFAULT", "DEFAULTS_PER_METHOD", "DEFAULTS_EXEMPT_WHEN", "DEFAULTS_COST",
    "APPLICATION", "APPLICATION_PER_METHOD", "APPLICATION_EXEMPT_WHEN", "APPLICATION_COST",
    "STRATEGY", "STORAGE_URI", "STORAGE_OPTIONS", "HEADERS_ENABLED", "HEADER_RETRY_AFTER_VALUE",
    "SWALLOW_ERRORS", "FAIL_ON_FIRST_BREACH", "KEY_PREFIX", *_PASSED, *_REFUSED,
)  # fmt: skip


def _settings(given: Mapping[str, Any], config: Mapping[str, Any], key: KeyFunc) -> dict[str, Any]:
    """Flask-Limiter's settings (``given`` in code, else ``config``'s ``RATELIMIT_*``) as the
    integration's ``RATELIMIT_*``."""
    unknown = sorted(k for k in config if k.startswith("RATELIMIT_") and k[10:] not in _KNOWN)
    if unknown:
        raise ConfigError(
            f"setting {unknown[0]!r} is unknown to Flask-Limiter and to ratekeeper; expected one "
            f"of {', '.join('RATELIMIT_' + k for k in sorted(_KNOWN))}"
        )

    def get(name: str, default: Any = None) -> Any:
        value = given.get(name)
        return config.get("RATELIMIT_" + name, default) if value is None else value

    for name, instead in _REFUSED.items():
        value = config.get("RATELIMIT_" + name)
        if value and not (name.startswith("HEADER_") and value in _HEADER_NAMES.values()):
            raise _refuse(f"setting RATELIMIT_{name}", instead)
    if get("FAIL_ON_FIRST_BREACH", True) is False:
        raise _refuse("fail_on_first_breach=False", "a route's limits are decided all-or-nothing")
    if get("HEADER_RETRY_AFTER_VALUE") not in (None, "delta-seconds"):
        raise _refuse("http-date Retry-After", "Retry-After is sent in seconds (delta-seconds)")
    uri, options = limits_syntax.storage(get("STORAGE_URI"), get("STORAGE_OPTIONS"))
    out: dict[str, Any] = {"RATELIMIT_STORAGE_URI": uri, "RATELIMIT_STORAGE_OPTIONS": options}
    out["RATELIMIT_ENABLED"] = bool(get("ENABLED", True))
    algorithm = limits_syntax.strategy(get("STRATEGY"))
    if algorithm is not None:
        out["RATELIMIT_STRATEGY"] = algorithm
    if get("KEY_PREFIX"):
        out["RATELIMIT_KEY_PREFIX"] = get("KEY_PREFIX")
    for ours, prefix in (("DEFAULT", "DEFAULTS"), ("APPLICATION", "APPLICATION")):
        limits = get(ours)
        if limits is None:
            continue
        options_of = (get(f"{prefix}_PER_METHOD", False), get(f"{prefix}_EXEMPT_WHEN"))
        cost = get(f"{prefix}_COST")
        items = [limits] if isinstance(limits, str) or callable(limits) else list(limits)
        out["RATELIMIT_" + ours] = [
            _group(item, key, *options_of, cost, _app_name(i) if ours == "APPLICATION" else None)
            for i, item in enumerate(items)
        ]
    for name in _PASSED:
        if "RATELIMIT_" + name in config:
            out["RATELIMIT_" + name] = config["RATELIMIT_" + name]
    return out


_HEADER_NAMES = {
    "HEADER_LIMIT": "X-RateLimit-Limit",
    "HEADER_REMAINING": "X-RateLimit-Remaining",
    "HEADER_RESET": "X-RateLimit-Reset",
    "HEADER_RETRY_AFTER": "Retry-After",
}


def _app_name(index: int) -> str:
    return "global" if index == 0 else f"global#{index + 1}"


def _group(
    item: str | Callable[[], str] | Limit,
    key: KeyFunc,
    per_method: bool,
    exempt_when: Callable[[], bool] | None,
    cost: int | Callable[[], int] | None,
    name: str | None,
) -> OurLimit:
    """A default or application limit (a string, a function, or Flask-Limiter's ``Limit``)."""
    if isinstance(item, Limit):
        _refuse_per_limit(item.deduct_when, item.on_breach, item.meta_limits, item.scope, False)
        own_key = _key(item.key_function) if item.key_function else None
        return _limit(
            item.limit_provider, own_key, item.per_method, item.methods, item.error_message,
            item.exempt_when, item.cost, True, name, key,
        )  # fmt: skip
    return _limit(item, None, per_method, None, None, exempt_when, cost, True, name, key)
