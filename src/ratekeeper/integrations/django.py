"""Django: ``RateLimitMiddleware`` for ``MIDDLEWARE``, configured by ``settings.RATEKEEPER``;
the ``@ratelimit`` view decorator and ``@exempt`` — over the middleware's gate.

    MIDDLEWARE = [..., "ratekeeper.integrations.django.RateLimitMiddleware"]
    RATEKEEPER = {"STORAGE_URI": "redis://127.0.0.1:6379/0", "DEFAULT": "100/minute"}

    @ratelimit("5/minute", key="user_or_ip")
    def login(request): ...

How it fits together: the middleware runs the app-wide ``CHECKS`` for every request, then (in
``process_view``, after URL resolution) the view's limits — or the default limits if it has
none and is not exempt — into the same admission; it answers a rejection with ``ON_BREACH``
(default: the JSON 429), adds the rate-limit headers to every response and refunds and releases
when the response is done (after the last chunk of a streaming one). It works under WSGI and
ASGI (sync and async, the same gate). ``@ratelimit`` marks the view for the middleware and,
where the middleware is not installed, enforces the limit itself.

``RATEKEEPER`` takes ``settings.read``'s table (``STORAGE_URI``, ``DEFAULT``, ``STRATEGY``,
``KEY_PREFIX``, ``TRUSTED_PROXIES``, ``ENABLED``, ``MODE``) and ``KEY`` (the default key:
``"ip"``, ``"user"``, ``"user_or_ip"``, ``"header:<name>"``, ``"get:<param>"``,
``"post:<param>"``, a function of ``RequestInfo`` — whose ``raw`` is the ``HttpRequest`` — or
its dotted path), ``CHECKS`` (app-wide checks), ``EXEMPT_PATHS``, ``ON_BREACH`` (``(request,
rejection) -> HttpResponse``), ``CHARGE_WHEN`` (``status -> bool``) and ``CLOCK`` (for tests).
"""

from __future__ import annotations

import dataclasses
import functools
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.core.signals import setting_changed
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.utils.module_loading import import_string

from ..errors import ConfigError
from ..middleware.checks import (
    ChargeWhen,
    CheckLevel,
    Controls,
    CostFunc,
    RateFunc,
    RateSpec,
)
from ..middleware.costs import USAGE_KEY, Usage
from ..middleware.gate import SCOPE_KEY, Admission, Gate, added_headers
from ..middleware.request import (
    KeyFunc,
    RequestInfo,
    client_ip,
    first,
    from_environ,
    header,
    trusted_networks,
)
from ..middleware.responses import Rejection
from ..middleware.runner import AsyncRunner, Runner
from .nested_routes import nested_limit
from .routes import Limit, Routes, RouteTable
from .settings import read

V = TypeVar("V", bound=Callable[..., Any])
TABLE = RouteTable()
"""The limits and exemptions ``@ratelimit`` and ``@exempt`` put on views."""
EXTRA = ("KEY", "CHECKS", "EXEMPT_PATHS", "ON_BREACH", "CHARGE_WHEN", "CLOCK")
UNSAFE = ("DELETE", "PATCH", "POST", "PUT")
"""The methods that change state, for ``@ratelimit(methods=UNSAFE)``."""


def rejection_response(request: HttpRequest, rejection: Rejection) -> HttpResponse:
    """The default answer: the rejection's status and JSON body (the middleware adds the
    rate-limit headers to whatever answers)."""
    return HttpResponse(rejection.body, status=rejection.status, content_type="application/json")


def _user(request: HttpRequest) -> str | None:
    user = getattr(request, "user", None)
    if user is None or not getattr(user, "is_authenticated", False):
        return None
    return str(getattr(user, "pk", None) or user)


def _field(source: str, name: str) -> KeyFunc:
    def key(request: RequestInfo) -> str | None:
        return getattr(request.raw, source).get(name) or None

    return key


def key_function(spec: str | KeyFunc | None) -> KeyFunc:
    """A key function from a django-ratelimit style name, a dotted path, or a function."""
    if callable(spec):
        return spec
    ip = client_ip()  # behind RATEKEEPER["TRUSTED_PROXIES"]
    named: dict[str, KeyFunc] = {
        "ip": ip,
        "user": lambda request: request.user,
        "user_or_ip": first(lambda request: request.user, ip),
    }
    if spec is None:
        return ip
    if not isinstance(spec, str):
        raise ConfigError(f"key {spec!r} is invalid; expected 'ip', 'user', a function, ...")
    if spec in named:
        return named[spec]
    kind, _, name = spec.partition(":")
    if kind == "header" and name:
        return header(name)
    if kind in ("get", "post") and name:
        return _field(kind.upper(), name)
    try:
        found = import_string(spec)
    except ImportError:
        found = None
    if not callable(found):
        raise ConfigError(
            f"key {spec!r} is invalid; expected 'ip', 'user', 'user_or_ip', 'header:<name>', "
            "'get:<param>', 'post:<param>', a function of the request or its dotted path"
        )
    return found  # type: ignore[no-any-return]  # a key function by the user's word


def _function(value: Any, name: str) -> Any:
    if isinstance(value, str):
        value = import_string(value)
    if value is not None and not callable(value):
        raise ConfigError(f"settings.RATEKEEPER[{name!r}] {value!r} is not a function")
    return value


class Limits:
    """Everything ``settings.RATEKEEPER`` describes, built once per process (and again when a
    test changes the setting): the gate, a sync and an async runner over one store, routes."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        found = read(config, "", "settings.RATEKEEPER", EXTRA)
        self.clock = _function(config.get("CLOCK"), "CLOCK") or time.time
        self.trusted = trusted_networks(found.trusted_proxies)
        self.key = key_function(config.get("KEY"))
        self.on_breach = _function(config.get("ON_BREACH"), "ON_BREACH") or rejection_response
        charge_when: ChargeWhen | None = _function(config.get("CHARGE_WHEN"), "CHARGE_WHEN")
        controls = Controls(default=found.mode)
        self.gate = Gate(
            config.get("CHECKS", ()),
            controls,
            config.get("EXEMPT_PATHS", ()),
            None,
            (304,),
            self.clock,
            60.0,
            charge_when,
        )
        store = found.store()
        self.sync = Runner(self.gate, store, self.clock)
        self.aio = AsyncRunner(self.gate, store, self.clock)
        self.routes = Routes(TABLE, self.gate, found.default, self.key, found.strategy)
        self.throttles: dict[tuple[str, str, str], int] = {}
        """Positions of DRF throttles' checks by (name, rate, algorithm)."""

    def info(self, request: HttpRequest) -> RequestInfo:
        """What checks see of ``request`` (``raw`` is the ``HttpRequest``)."""
        info = from_environ(request.META, self.trusted)
        return dataclasses.replace(info, user=_user(request), raw=request)

    def positions(self, request: HttpRequest, view: Callable[..., Any]) -> tuple[int, ...]:
        """The checks a request to ``view`` walks: its own limits, else the default limits."""
        match = getattr(request, "resolver_match", None)
        route = match.view_name if match is not None else _dotted(view)
        return self.routes.positions(route, (view,))

    def admission(self, request: HttpRequest, info: RequestInfo) -> Admission:
        """A new admission for ``request``, with a ``costs.Usage`` (in ``request.META``, where
        ``costs.report(request.META, n)`` finds it) for a check that settles after the
        response: always, since Django imports the views, and so learns of their limits, on
        the first request."""
        usage = request.META[USAGE_KEY] = Usage()
        length = str(request.META.get("CONTENT_LENGTH") or "")
        # the body Django reads is at most Content-Length (its LimitedStream): the bytes
        usage.request_bytes = int(length) if length.isascii() and length.isdigit() else 0
        return Admission(info, usage)

    def respond(self, request: HttpRequest, rejection: Rejection) -> HttpResponseBase:
        """The answer to a rejection (``ON_BREACH``)."""
        return self.on_breach(request, rejection)

    def complete(self, adm: Admission, response: HttpResponseBase) -> HttpResponseBase:
        """Add the headers; finish when the response is done (sync)."""
        _add_headers(adm, response)
        usage = _record(adm, response)
        if not getattr(response, "streaming", False):
            self.sync.finish(adm, response.status_code)
        elif getattr(response, "is_async", False):
            response.streaming_content = _finish_after_async(  # type: ignore[attr-defined]
                response.streaming_content,  # type: ignore[attr-defined]
                lambda: self.aio.finish(adm, response.status_code),
                usage,
            )
        else:
            response.streaming_content = _finish_after(  # type: ignore[attr-defined]
                response.streaming_content,  # type: ignore[attr-defined]
                lambda: self.sync.finish(adm, response.status_code),
                usage,
            )
        return response

    async def acomplete(self, adm: Admission, response: HttpResponseBase) -> HttpResponseBase:
        """``complete`` for async requests."""
        if getattr(response, "streaming", False):
            return self.complete(adm, response)
        _add_headers(adm, response)
        _record(adm, response)
        await self.aio.finish(adm, response.status_code)
        return response


def _add_headers(adm: Admission, response: HttpResponseBase) -> None:
    for name, value in added_headers(adm):
        if name not in response:  # the app's own (DRF's Retry-After) stay
            response[name] = value


def _record(adm: Admission, response: HttpResponseBase) -> Usage | None:
    """Put the response's status, headers and (when not streamed) body bytes in the request's
    usage, for a check that settles; the usage, or None when none settles."""
    usage = adm.usage
    if usage is None or not any(op.kind == "reserve" for op in adm.charged):
        return None
    usage.status = response.status_code
    usage.headers = {k.lower(): v for k, v in response.items()}
    if not getattr(response, "streaming", False):
        usage.response_bytes = len(getattr(response, "content", b""))
        usage.completed = True
    return usage


def _finish_after(
    content: Iterable[bytes], finish: Callable[[], None], usage: Usage | None = None
) -> Iterator[bytes]:
    try:
        for chunk in content:
            if usage is not None:
                usage.response_bytes += len(chunk)
            yield chunk
        if usage is not None:
            usage.completed = True
    finally:
        finish()


async def _finish_after_async(
    content: Any, finish: Callable[[], Any], usage: Usage | None = None
) -> AsyncIterator[bytes]:
    try:
        async for chunk in content:
            if usage is not None:
                usage.response_bytes += len(chunk)
            yield chunk
        if usage is not None:
            usage.completed = True
    finally:
        await finish()


def _dotted(view: Callable[..., Any]) -> str:
    return f"{view.__module__}.{getattr(view, '__qualname__', type(view).__name__)}"


_current: Limits | None = None
_building = threading.Lock()


def current() -> Limits:
    """The ``Limits`` of ``settings.RATEKEEPER``, built on first use (once: the first requests
    of a threaded server arrive together)."""
    global _current
    found = _current
    if found is None:
        with _building:
            found = _current
            if found is None:
                found = _current = Limits(getattr(settings, "RATEKEEPER", {}))
    return found


def _reset(setting: str, **kwargs: Any) -> None:
    global _current
    if setting == "RATEKEEPER":
        with _building:
            _current = None


LIMITS_KEY = "ratekeeper.limits"
"""Where the middleware leaves the ``Limits`` a request started with (``request.META``): the
whole request uses one, even if the settings change meanwhile."""


def _started(request: HttpRequest) -> tuple[Admission, Limits] | None:
    adm = request.META.get(SCOPE_KEY)
    return None if adm is None else (adm, request.META[LIMITS_KEY])


setting_changed.connect(_reset)


class RateLimitMiddleware:
    """Django middleware (sync and async) running ``settings.RATEKEEPER``'s checks."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        self.is_async = iscoroutinefunction(get_response)
        if self.is_async:
            markcoroutinefunction(self)
            self.process_view = self._process_view_async  # type: ignore[method-assign,assignment]  # Django picks the mode per method

    def __call__(self, request: HttpRequest) -> Any:
        if self.is_async:
            return self._call_async(request)
        limits = request.META[LIMITS_KEY] = current()
        info = limits.info(request)
        adm = request.META[SCOPE_KEY] = limits.admission(request, info)
        rejection = limits.sync.admit(info, adm)
        if rejection is not None:
            return limits.complete(adm, limits.respond(request, rejection))
        return limits.complete(adm, self.get_response(request))

    async def _call_async(self, request: HttpRequest) -> HttpResponseBase:
        limits = request.META[LIMITS_KEY] = current()
        info = limits.info(request)
        adm = request.META[SCOPE_KEY] = limits.admission(request, info)
        rejection = await limits.aio.admit(info, adm)
        if rejection is not None:
            return await limits.acomplete(adm, limits.respond(request, rejection))
        return await limits.acomplete(adm, await self.get_response(request))

    def process_view(
        self, request: HttpRequest, view: Callable[..., Any], args: Any, kwargs: Any
    ) -> HttpResponseBase | None:
        walk = _route_walk(request, view)
        if walk is None:
            return None
        limits, info, adm, positions = walk
        rejection = limits.sync.admit(info, adm, positions)
        return None if rejection is None else limits.respond(request, rejection)

    async def _process_view_async(
        self, request: HttpRequest, view: Callable[..., Any], args: Any, kwargs: Any
    ) -> HttpResponseBase | None:
        walk = _route_walk(request, view)
        if walk is None:
            return None
        limits, info, adm, positions = walk
        rejection = await limits.aio.admit(info, adm, positions)
        return None if rejection is None else limits.respond(request, rejection)


def _route_walk(
    request: HttpRequest, view: Callable[..., Any]
) -> tuple[Limits, RequestInfo, Admission, tuple[int, ...]] | None:
    """What ``process_view`` walks: the request's limits, admission and the view's positions;
    None when the middleware did not start the request or the view has no limits."""
    started = _started(request)
    if started is None:
        return None
    adm, limits = started
    positions = limits.positions(request, view)
    if not positions:
        return None
    return limits, adm.request or limits.info(request), adm, positions


def ratelimit(
    rate: RateSpec | RateFunc,
    *,
    key: str | KeyFunc | None = None,
    group: str | None = None,
    methods: Iterable[str] = (),
    cost: int | CostFunc = 1,
    algorithm: str | None = None,
    charge_when: ChargeWhen | None = None,
    override_defaults: bool = True,
) -> Callable[[V], V]:
    """Limit a view, django-ratelimit style: ``key`` (default: ``RATEKEEPER["KEY"]``) as in
    the module docstring; views with the same ``group`` share one counter (default: each view
    its own); only requests with ``methods`` (default: all) count. A rejection is answered
    with ``ON_BREACH``; ``rate`` may be a function of the request (None: no limit)."""
    limit = Limit(
        rate,
        None if key is None else key_function(key),
        group,
        algorithm,
        None,
        None,
        cost,
        tuple(methods),
        charge_when,
        override_defaults,
    )

    def decorate(view: V) -> V:
        TABLE.mark(limit)(view)
        if iscoroutinefunction(view):

            @functools.wraps(view)
            async def async_wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
                if SCOPE_KEY in request.META:  # the middleware walked this view's limits
                    return await view(request, *args, **kwargs)
                limits = current()
                info = limits.info(request)
                adm = limits.admission(request, info)
                rejection = await limits.aio.admit(info, adm, limits.positions(request, view))
                if rejection is not None:
                    return await limits.acomplete(adm, limits.respond(request, rejection))
                return await limits.acomplete(adm, await view(request, *args, **kwargs))

            return async_wrapper  # type: ignore[return-value]  # the same view, wrapped

        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            if SCOPE_KEY in request.META:  # the middleware walked this view's limits
                return view(request, *args, **kwargs)
            limits = current()
            info = limits.info(request)
            adm = limits.admission(request, info)
            rejection = limits.sync.admit(info, adm, limits.positions(request, view))
            if rejection is not None:
                return limits.complete(adm, limits.respond(request, rejection))
            return limits.complete(adm, view(request, *args, **kwargs))

        return wrapper  # type: ignore[return-value]  # the same view, wrapped

    return decorate


def nested_ratelimit(levels: Iterable[CheckLevel], **options: Any) -> Callable[[V], V]:
    """Nested limits on a view (``RouteLimits.nested_limit``'s, for Django): ``levels``
    outermost first, each with its own key and rate, charged all or nothing; with ``actual=``
    the ``cost`` is an estimate settled when the response has ended (``costs.report(
    request.META, n)`` from the view). Needs the middleware in ``MIDDLEWARE``."""
    limit = nested_limit(list(levels), **options)

    def decorate(view: V) -> V:
        TABLE.mark(limit)(view)
        return view

    return decorate


def exempt(view: V) -> V:
    """Free a view (function, or class-based view's class) from the default limits."""
    return TABLE.exempt(view)
