"""django-ratelimit's names on ratekeeper's Django integration: port an app by changing imports.

    from ratekeeper.compat.django_ratelimit import ratelimit

    @ratelimit(key="ip", rate="5/m", method="POST")
    def login(request): ...

What maps onto what: each ``(group, key, rate, method)`` is one limit of the integration,
named after its group (and rate and methods, which django-ratelimit counts apart), decided by
``Limits.usage`` — the check the middleware's own limits go through, on
``settings.RATEKEEPER``'s store. ``ratelimit`` charges it and sets ``request.limited``; with
``block=True`` (the default) a limited request raises ``Ratelimited`` (a ``PermissionDenied``:
403), or ``RATELIMIT_EXCEPTION_CLASS``; ``RatelimitMiddleware`` is ratekeeper's middleware and
answers ``Ratelimited`` with ``RATELIMIT_VIEW``. ``is_ratelimited`` and ``get_usage`` read (or
charge, ``increment=True``) the same counters. Keys are django-ratelimit's (``ip`` masked as it
does, ``user`` — every anonymous request one bucket — ``user_or_ip``, ``header:``, ``get:``,
``post:``, a function of ``(group, request)`` or its dotted path), rates too (``"5/m"``,
``"100/15m"``, a function of ``(group, request)``, its dotted path; None: no limit).

The differences (docs/migrating.md): windows start with a key's first request instead of at an
epoch-aligned, per-key jittered edge; a refused request is not counted; store outages fail open.
Refused when a view is decorated, naming what to use instead: a missing key,
``RATELIMIT_USE_CACHE``, ``RATELIMIT_IP_META_KEY``, ``RATELIMIT_CACHE_PREFIX``,
``RATELIMIT_HASH_ALGORITHM`` and ``RATELIMIT_FAIL_OPEN = False``.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponseBase
from django.utils.module_loading import import_string

from ..decision import Decision
from ..errors import ConfigError
from ..integrations import django as integration
from ..integrations.routes import Limit
from ..middleware.request import RequestInfo

__all__ = [
    "ALL",
    "UNSAFE",
    "RatelimitMiddleware",
    "Ratelimited",
    "get_usage",
    "is_ratelimited",
    "ratelimit",
]

ALL = (None,)
"""Every HTTP method (django-ratelimit's sentinel)."""
UNSAFE = ["DELETE", "PATCH", "POST", "PUT"]
"""The methods that change state."""

V = TypeVar("V", bound=Callable[..., Any])


class Ratelimited(PermissionDenied):
    """Raised for a limited request by ``@ratelimit(block=True)`` (Django answers 403)."""


_PERIODS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
_REFUSED = {
    "RATELIMIT_USE_CACHE": "counters live in the store of settings.RATEKEEPER['STORAGE_URI']",
    "RATELIMIT_IP_META_KEY": "set settings.RATEKEEPER['TRUSTED_PROXIES'] to your proxies",
    "RATELIMIT_CACHE_PREFIX": "set settings.RATEKEEPER['KEY_PREFIX']",
    "RATELIMIT_HASH_ALGORITHM": "keys are encoded, not hashed: nothing to choose",
}


def _check_settings() -> None:
    for name, instead in _REFUSED.items():
        if getattr(settings, name, None) is not None:
            raise ConfigError(f"django-ratelimit's {name} is not supported: {instead}")
    if getattr(settings, "RATELIMIT_FAIL_OPEN", None) is False:
        raise ConfigError(
            "django-ratelimit's RATELIMIT_FAIL_OPEN = False is not supported: a store outage "
            "fails open (logged, counted); remove the setting"
        )


def _rate(rate: Any, group: str) -> Callable[[RequestInfo], str | None] | str | None:
    """A django-ratelimit rate (``"5/m"``, ``"100/15m"``, a function of ``(group, request)``,
    its dotted path, or None) as a rate or rate function of ratekeeper's."""
    if rate is None:
        return None
    if isinstance(rate, str) and "." in rate and "/" not in rate:
        rate = import_string(rate)
    if callable(rate):
        found = rate

        def dynamic(info: RequestInfo) -> str | None:
            value = found(group, info.raw)
            return None if value is None else _rate_text(value)

        return dynamic
    return _rate_text(rate)


def _rate_text(rate: Any) -> str:
    if isinstance(rate, tuple) and len(rate) == 2:
        return f"{int(rate[0])}/{int(rate[1])}s"
    parts = rate.split("/") if isinstance(rate, str) else []
    unit = parts[1][-1:].lower() if len(parts) == 2 else ""
    multiple = parts[1][:-1] if unit in _PERIODS else parts[1] if len(parts) == 2 else ""
    if len(parts) != 2 or not parts[0].isdigit() or not (multiple == "" or multiple.isdigit()):
        raise ConfigError(
            f"rate {rate!r} is invalid; expected django-ratelimit's form, e.g. '5/m', '100/h', "
            "'10/15m' (units s, m, h, d)"
        )
    seconds = _PERIODS.get(unit, 1) * int(multiple or 1)
    return f"{int(parts[0])}/{seconds}s"


def _ip(info: RequestInfo) -> str:
    """The client's address masked as django-ratelimit does (``RATELIMIT_IPV4_MASK``, 32;
    ``RATELIMIT_IPV6_MASK``, 64), behind ``RATEKEEPER['TRUSTED_PROXIES']``."""
    ip = info.client()
    six = ":" in ip
    mask = getattr(
        settings, "RATELIMIT_IPV6_MASK" if six else "RATELIMIT_IPV4_MASK", 64 if six else 32
    )
    try:
        return str(ipaddress.ip_network(f"{ip}/{mask}", strict=False).network_address)
    except ValueError:
        return ip  # a Unix socket's "unix"


def _user(info: RequestInfo) -> str:
    return str(info.raw.user.pk)  # "None" for an anonymous user: one bucket, as in django-ratelimit


def _user_or_ip(info: RequestInfo) -> str:
    user = info.raw.user
    return str(user.pk) if user.is_authenticated else _ip(info)


_SIMPLE = {"ip": _ip, "user": _user, "user_or_ip": _user_or_ip}
_SOURCES = {"get": "GET", "post": "POST"}


@functools.lru_cache(maxsize=4096)
def _key(key: Any, group: str) -> Callable[[RequestInfo], str | None]:
    """A django-ratelimit key as ratekeeper's (one function per key and group: the same limit
    everywhere it is named)."""
    if isinstance(key, str) and key in _SIMPLE:
        return _SIMPLE[key]
    if isinstance(key, str) and ":" in key:
        kind, _, name = key.partition(":")
        if kind == "header":
            meta = "HTTP_" + name.replace("-", "_").upper()
            return lambda info: str(info.raw.META.get(meta, ""))
        if kind in _SOURCES:
            source = _SOURCES[kind]
            return lambda info: str(getattr(info.raw, source).get(name, ""))
        raise ConfigError(f"ratelimit key {key!r} is unknown; expected header:, get: or post:")
    if isinstance(key, str) and "." in key:
        key = import_string(key)
    if not callable(key):
        raise ConfigError(
            f"ratelimit key {key!r} is invalid; expected 'ip', 'user', 'user_or_ip', "
            "'header:<name>', 'get:<param>', 'post:<param>', a function of (group, request) "
            "or its dotted path"
        )
    function = key
    return lambda info: str(function(group, info.raw))


def _methods(method: Any) -> tuple[str, ...]:
    if method == ALL or method is None:
        return ()
    if isinstance(method, str):
        method = [method]
    return tuple(str(m).upper() for m in method)


@functools.lru_cache(maxsize=4096)
def _limit(group: str, key: Any, rate: Any, methods: tuple[str, ...]) -> Limit | None:
    """The integration's limit for one ``(group, key, rate, methods)`` (cached: the same
    object, the same check and counters, wherever it is named)."""
    ours = _rate(rate, group)
    if ours is None:
        return None
    name = group if callable(ours) else f"{group}@{ours}"
    if methods:
        name += f"[{','.join(sorted(methods))}]"
    return Limit(ours, _key(key, group), name, methods=methods)


def _group(group: str | None, fn: Any) -> str:
    """django-ratelimit's group: given, or the view's module, class and qualified name."""
    if group is not None:
        return group
    if fn is None:
        raise ConfigError("get_usage must be called with either `group` or `fn` arguments")
    if isinstance(fn, functools.partial):
        fn = fn.func
    parts = [getattr(fn, "__module__", "")]
    if hasattr(fn, "__self__"):
        parts.append(type(fn.__self__).__name__)
    parts.append(fn.__qualname__)
    return ".".join(p for p in parts if p)


def get_usage(
    request: HttpRequest,
    group: str | None = None,
    fn: Any = None,
    key: Any = None,
    rate: Any = None,
    method: Any = ALL,
    increment: bool = False,
) -> dict[str, Any] | None:
    """django-ratelimit's usage of a limit for ``request`` (``count``, ``limit``,
    ``should_limit``, ``time_left``), charging it when ``increment``; None where no limit
    applies (another method, no rate, ``RATELIMIT_ENABLE = False``)."""
    decision = _decide(request, group, fn, key, rate, method, increment)
    if decision is None:
        return None
    count = decision.limit - decision.remaining + (0 if decision.allowed or not increment else 1)
    return {
        "count": count,
        "limit": decision.limit,
        "should_limit": not decision.allowed if increment else count > decision.limit,
        "time_left": int(decision.reset_at - decision.now),
    }


def is_ratelimited(
    request: HttpRequest,
    group: str | None = None,
    fn: Any = None,
    key: Any = None,
    rate: Any = None,
    method: Any = ALL,
    increment: bool = False,
) -> bool:
    """Whether ``request`` is over the limit (charging it when ``increment``)."""
    usage = get_usage(request, group, fn, key, rate, method, increment)
    return bool(usage and usage["should_limit"])


def _decide(
    request: HttpRequest, group: str | None, fn: Any, key: Any, rate: Any, method: Any, charge: bool
) -> Decision | None:
    if not getattr(settings, "RATELIMIT_ENABLE", True):
        return None
    methods = _methods(method)
    if methods and request.method not in methods:
        return None
    if not key:
        raise ConfigError("ratelimit needs a key, e.g. key='ip' (django-ratelimit's rule too)")
    name = _group(group, fn)
    limit = _limit(name, key, rate, methods)
    if limit is None:
        return None
    decision: Decision | None = integration.current().usage(request, limit, name, charge)
    return decision


def ratelimit(
    group: str | None = None,
    key: Any = None,
    rate: Any = None,
    method: Any = ALL,
    block: bool = True,
) -> Callable[[V], V]:
    """django-ratelimit's decorator: charge the view's limit; ``request.limited`` says whether
    the request is over it, and with ``block`` a limited request raises ``Ratelimited``."""
    _check_settings()
    if not key:
        raise ConfigError("ratelimit needs a key, e.g. key='ip' (django-ratelimit's rule too)")
    _methods(method)
    if group is not None:
        _limit(group, key, rate, _methods(method))  # a bad key or rate fails here

    def decorator(fn: V) -> V:
        def check(request: HttpRequest) -> None:
            limited = is_ratelimited(request, group, fn, key, rate, method, increment=True)
            request.limited = getattr(request, "limited", False) or limited  # type: ignore[attr-defined]  # django-ratelimit's attribute
            if limited and block:
                cls = getattr(settings, "RATELIMIT_EXCEPTION_CLASS", Ratelimited)
                raise (import_string(cls) if isinstance(cls, str) else cls)()

        if iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapped(request: HttpRequest, *args: Any, **kw: Any) -> Any:
                check(request)
                return await fn(request, *args, **kw)

            return async_wrapped  # type: ignore[return-value]  # the same view, wrapped

        @functools.wraps(fn)
        def wrapped(request: HttpRequest, *args: Any, **kw: Any) -> Any:
            check(request)
            return fn(request, *args, **kw)

        return wrapped  # type: ignore[return-value]  # the same view, wrapped

    return decorator


ratelimit.ALL = ALL  # type: ignore[attr-defined]  # django-ratelimit's attributes
ratelimit.UNSAFE = UNSAFE  # type: ignore[attr-defined]


class RatelimitMiddleware(integration.RateLimitMiddleware):
    """django-ratelimit's middleware: ratekeeper's (``settings.RATEKEEPER``'s checks and
    default limits, the headers), which answers ``Ratelimited`` with ``RATELIMIT_VIEW``."""

    def process_exception(
        self, request: HttpRequest, exception: Exception
    ) -> HttpResponseBase | None:
        if not isinstance(exception, Ratelimited):
            return None
        view = import_string(settings.RATELIMIT_VIEW)
        response: HttpResponseBase = view(request, exception)
        return response
