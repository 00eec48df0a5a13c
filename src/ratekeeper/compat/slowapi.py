"""slowapi's names on ratekeeper's FastAPI integration: port an app by changing its imports.

    from ratekeeper.compat.slowapi import (
        Limiter, RateLimitExceeded, _rate_limit_exceeded_handler, get_remote_address,
    )

    limiter = Limiter(key_func=get_remote_address)
    app = FastAPI()
    app.state.limiter = limiter
    app.add_exception_handler(RateLimitExceeded, _rate_limit_exceeded_handler)

    @app.get("/home")
    @limiter.limit("5/minute")
    async def homepage(request: Request): ...

What maps onto what: ``Limiter`` holds a ``RouteLimits``; ``limit``, ``shared_limit`` and
``exempt`` are its decorators (the guard needs no middleware: it finds the endpoint's
``request``, as slowapi does); ``SlowAPIMiddleware`` and ``SlowAPIASGIMiddleware`` are its
``matching`` middleware, for default and application limits; a refusal raises
``RateLimitExceeded`` (a ``RateLimited`` whose ``detail`` is slowapi's: the limit as limits
prints it, or ``error_message``), and ``_rate_limit_exceeded_handler`` answers it as slowapi
does (429, ``{"error": "Rate limit exceeded: 5 per 1 minute"}``) with ratekeeper's headers.
Keys, rates and costs are slowapi's functions of the request, called with a Starlette
``Request``; ``get_remote_address`` is ratekeeper's client address. Counters are per path
unless ``key_style="endpoint"`` (slowapi's default ``"url"``).

Refused, naming what to use instead: options ratekeeper cannot honour as slowapi documents
them (``in_memory_fallback``, ``retry_after="http-date"``, ``auto_check=False``,
``config_filename``, a callable ``shared_limit`` scope or ``error_message``, unknown
strategies and storages). See docs/migrating.md for the table of every option.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from ..errors import ConfigError
from ..integrations.fastapi import RateLimited, RouteLimits
from ..integrations.routes import Limit
from ..integrations.settings import store_for
from ..middleware.asgi import ASGIApp, Receive, Scope, Send
from ..middleware.request import KeyFunc, RequestInfo
from ..middleware.responses import Rejection
from . import limits_syntax

__all__ = [
    "Limiter",
    "RateLimitExceeded",
    "SlowAPIASGIMiddleware",
    "SlowAPIMiddleware",
    "_rate_limit_exceeded_handler",
    "get_ipaddr",
    "get_remote_address",
]


def get_remote_address(request: Request) -> str:
    """The client's address (slowapi's key): the TCP peer, or ``127.0.0.1`` without one."""
    client = request.client
    return client.host if client is not None and client.host else "127.0.0.1"


def get_ipaddr(request: Request) -> str:
    """slowapi's ``get_ipaddr``: ``X_FORWARDED_FOR`` as sent, else the peer — any client can
    set it; prefer ratekeeper's ``trusted_proxies`` (``keys.client_ip``)."""
    return request.headers.get("X_FORWARDED_FOR") or get_remote_address(request)


class RateLimitExceeded(RateLimited):
    """A refusal, as slowapi's exception: ``detail`` is the limit as limits prints it (or the
    limit's ``error_message``); ``rejection`` is ratekeeper's."""

    def __init__(self, rejection: Rejection) -> None:
        super().__init__(rejection)
        decision = rejection.decision
        if rejection.message is not None:
            self.detail = rejection.message
        elif decision is not None:
            self.detail = limits_syntax.describe(decision.rate)


def _rate_limit_exceeded_handler(request: Request, exc: RateLimited) -> Response:
    """slowapi's answer: 429 with ``{"error": "Rate limit exceeded: <detail>"}`` (and the
    rate-limit headers)."""
    if isinstance(exc, RateLimitExceeded):
        detail = exc.detail
    else:
        detail = RateLimitExceeded(exc.rejection).detail
    headers = dict(exc.headers or {})
    return JSONResponse({"error": f"Rate limit exceeded: {detail}"}, 429, headers)


_REFUSED = {
    "in_memory_fallback": "store outages fail open (logged, counted); there is no fallback store",
    "in_memory_fallback_enabled": "store outages fail open (logged, counted)",
    "config_filename": "pass the options to Limiter() itself",
}


class Limiter:
    """slowapi's ``Limiter`` (its arguments, its decorators) over a ``RouteLimits``."""

    def __init__(
        self,
        key_func: Callable[..., str],
        default_limits: Iterable[str | Callable[..., str]] = (),
        application_limits: Iterable[str | Callable[..., str]] = (),
        headers_enabled: bool = False,
        strategy: str | None = None,
        storage_uri: str | None = None,
        storage_options: dict[str, Any] | None = None,
        auto_check: bool = True,
        swallow_errors: bool = False,
        in_memory_fallback: Iterable[str] = (),
        in_memory_fallback_enabled: bool = False,
        retry_after: str | None = None,
        key_prefix: str = "",
        enabled: bool = True,
        config_filename: str | None = None,
        key_style: str = "url",
    ) -> None:
        given = {
            "in_memory_fallback": list(in_memory_fallback),
            "in_memory_fallback_enabled": in_memory_fallback_enabled,
            "config_filename": config_filename,
        }
        for name, value in given.items():
            if value:
                raise ConfigError(f"slowapi Limiter({name}=...) is not supported: {_REFUSED[name]}")
        if not auto_check:
            raise ConfigError(
                "slowapi Limiter(auto_check=False) is not supported: limits are checked when "
                "the route is called; to skip a limit for a request, return None from its key"
            )
        if retry_after not in (None, "delta-seconds"):
            raise ConfigError(
                f"slowapi Limiter(retry_after={retry_after!r}) is not supported: Retry-After "
                "is sent in seconds (delta-seconds)"
            )
        _refuse_dotenv()
        if key_style not in ("url", "endpoint"):
            raise ConfigError(f"key_style={key_style!r} is invalid; expected 'url' or 'endpoint'")
        self._key_func = key_func
        self._per_path = key_style == "url"
        uri, options = limits_syntax.storage(storage_uri, storage_options)
        algorithm = limits_syntax.strategy(strategy)
        self._limits = RouteLimits(
            default=[
                self._limit(v, None, False, None, 1, False, self._per_path) for v in default_limits
            ],
            application=[
                self._limit(v, None, False, None, 1, False, False) for v in application_limits
            ],
            key=self._key(key_func),
            algorithm=algorithm,
            store=store_for(uri, key_prefix or "rk", options),
        )
        self._limits.exception = RateLimitExceeded
        self.enabled = enabled
        self.headers_enabled = headers_enabled  # ratekeeper always sends the headers
        self.swallow_errors = swallow_errors  # store errors fail open either way

    @property
    def enabled(self) -> bool:
        """slowapi's switch: False lets every request through (``Controls``, mode ``off``)."""
        return self._limits.controls.default != "off"

    @enabled.setter
    def enabled(self, on: bool) -> None:
        self._limits.controls.default = "enforce" if on else "off"

    @property
    def routes(self) -> RouteLimits:
        """The ``RouteLimits`` this limiter maps onto (its ``stats()``, ``controls``)."""
        return self._limits

    def limit(
        self,
        limit_value: str | Callable[..., str],
        key_func: Callable[..., str] | None = None,
        per_method: bool = False,
        methods: Iterable[str] | None = None,
        error_message: str | None = None,
        exempt_when: Callable[..., bool] | None = None,
        cost: int | Callable[..., int] = 1,
        override_defaults: bool = True,
    ) -> Callable[[Any], Any]:
        """slowapi's per-route limit (counted per path, or per endpoint)."""
        limit = self._limit(
            limit_value, key_func, per_method, exempt_when, cost, override_defaults, self._per_path,
            methods, error_message,
        )  # fmt: skip
        return self._limits.decorator(self._limits.table.mark(limit))

    def shared_limit(
        self,
        limit_value: str | Callable[..., str],
        scope: str | Callable[..., str],
        key_func: Callable[..., str] | None = None,
        error_message: str | None = None,
        exempt_when: Callable[..., bool] | None = None,
        cost: int | Callable[..., int] = 1,
        override_defaults: bool = True,
    ) -> Callable[[Any], Any]:
        """slowapi's limit shared by every route it decorates (one counter per ``scope``)."""
        if not isinstance(scope, str) or not scope:
            raise ConfigError(
                f"shared_limit scope {scope!r} is not supported: give a string, the shared "
                "limit's name"
            )
        limit = self._limit(
            limit_value, key_func, False, exempt_when, cost, override_defaults, False, None,
            error_message, scope,
        )  # fmt: skip
        return self._limits.decorator(self._limits.table.mark(limit))

    def exempt(self, obj: Any) -> Any:
        """Free an endpoint from the default and application limits."""
        return self._limits.exempt(obj)

    def reset(self) -> None:
        """Refused: clear the store itself (``FLUSHDB``, or a new ``MemoryStore``)."""
        raise ConfigError(
            "slowapi Limiter.reset() is not supported: ratekeeper does not clear a store for "
            "you; empty it yourself (a new MemoryStore, or FLUSHDB on a Redis of its own)"
        )

    def _key(self, key_func: Callable[..., Any]) -> KeyFunc:
        """slowapi's key function (of the request, or of nothing) as a key of ``RequestInfo``;
        an empty key skips the limit, as slowapi does."""
        if key_func is get_remote_address:
            return RequestInfo.client  # the same address, without a Request
        takes_request = "request" in inspect.signature(key_func).parameters

        def key(info: RequestInfo) -> str | None:
            found = key_func(Request(info.raw)) if takes_request else key_func()
            return str(found) if found else None

        return key

    def _limit(
        self,
        value: str | Callable[..., str],
        key_func: Callable[..., str] | None,
        per_method: bool,
        exempt_when: Callable[..., bool] | None,
        cost: int | Callable[..., int],
        override_defaults: bool,
        per_path: bool,
        methods: Iterable[str] | None = None,
        error_message: object = None,
        name: str | None = None,
    ) -> Limit:
        if error_message is not None and not isinstance(error_message, str):
            raise ConfigError("error_message must be a string (a function is not supported)")
        base = self._key(key_func or self._key_func)
        key = _scoped(base, per_method, per_path, exempt_when)
        rate: Any = limits_syntax.rates(value) if isinstance(value, str) else _dynamic(value, base)
        spent: Any = cost if not callable(cost) else (lambda info: cost(Request(info.raw)))
        return Limit(
            rate, key, name, None, None, None, spent, tuple(methods or ()), None,
            override_defaults, error_message,
        )  # fmt: skip

    def middleware(self, app: ASGIApp) -> ASGIApp:
        """ratekeeper's middleware for this limiter (what ``SlowAPIMiddleware`` builds)."""
        return self._limits.matching(app)


def _refuse_dotenv() -> None:
    """slowapi reads ``RATELIMIT_*`` from a ``.env`` file in the working directory; this map
    does not, so such settings are refused rather than ignored."""
    env = Path(".env")
    try:
        lines = env.read_text().splitlines() if env.is_file() else []
    except OSError:
        return
    found = [line.split("=")[0].strip() for line in lines if line.strip().startswith("RATELIMIT_")]
    if found:
        raise ConfigError(
            f"slowapi reads {found[0]} from .env; ratekeeper.compat.slowapi does not: pass the "
            "option to Limiter() instead"
        )


def _scoped(
    base: KeyFunc, per_method: bool, per_path: bool, exempt_when: Callable[..., bool] | None
) -> KeyFunc:
    """The key slowapi counts under: per path (``key_style="url"``) and per method if asked;
    None (the limit skipped) when ``exempt_when`` says so."""
    takes_request = exempt_when is not None and len(inspect.signature(exempt_when).parameters) == 1

    def key(info: RequestInfo) -> str | None:
        if exempt_when is not None:
            exempt = exempt_when(Request(info.raw)) if takes_request else exempt_when()
            if exempt:
                return None
        found = base(info)
        if found is None:
            return None
        if per_path:
            found = f"{found}\x00{info.path}"
        return f"{found}\x00{info.method}" if per_method else found

    if not (per_method or per_path or exempt_when is not None):
        return base
    if per_path and not per_method and exempt_when is None and base is RequestInfo.client:
        return _client_per_path  # the usual one, in one call
    return key


def _client_per_path(info: RequestInfo) -> str:
    return f"{info.client()}\x00{info.path}"


def _dynamic(provider: Callable[..., str], key: KeyFunc) -> Callable[[RequestInfo], str]:
    """slowapi's dynamic limit: a function of nothing, or of the request's key."""
    takes_key = "key" in inspect.signature(provider).parameters

    def rate(info: RequestInfo) -> str:
        found = provider(key(info)) if takes_key else provider()
        return limits_syntax.rates(found, "the limit function's value")

    return rate


class SlowAPIMiddleware:
    """slowapi's middleware: the default and application limits of the app's
    ``state.limiter``, on ratekeeper's middleware (``RouteLimits.matching``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._inner: ASGIApp | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        inner = self._inner
        if inner is None:
            limiter = getattr(getattr(scope.get("app"), "state", None), "limiter", None)
            if not isinstance(limiter, Limiter):
                raise ConfigError(
                    "SlowAPIMiddleware needs app.state.limiter = Limiter(...) from "
                    "ratekeeper.compat.slowapi"
                )
            inner = self._inner = limiter.middleware(self.app)
        await inner(scope, receive, send)


SlowAPIASGIMiddleware = SlowAPIMiddleware
"""slowapi's pure-ASGI middleware: the same (ratekeeper's middleware is pure ASGI)."""
