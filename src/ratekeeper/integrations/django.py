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
ASGI (sync and async, the same gate). ``@ratelimit`` marks the view for the middleware, and
its wrapper walks whatever of the view's limits no walk of the request has walked yet — all of
them where the middleware is not installed, and those of a method decorated with Django's
``method_decorator`` (which applies the decorator anew on every call, to a bound method the
middleware never sees). The limits of a class-based view's method are found by the middleware
too: ``process_view`` looks at the handler for the request's method. Whoever walks first starts
the request's admission; every later walk joins it, and a position is walked once per request.

``block=False`` on ``@ratelimit`` refuses nothing: the view runs with ``request.limited`` True
when one of the decorator's limits would have refused (django-ratelimit's idiom). ``usage``
reads (or charges) a limit for a request without a view.

``RATEKEEPER`` takes ``settings.read``'s table (``STORAGE_URI``, ``DEFAULT``, ``STRATEGY``,
``KEY_PREFIX``, ``TRUSTED_PROXIES``, ``ENABLED``, ``MODE``, ``APPLICATION``, ``ON_ERROR``) and
``KEY`` (the default key:
``"ip"``, ``"user"``, ``"user_or_ip"``, ``"header:<name>"``, ``"get:<param>"``,
``"post:<param>"``, a function of ``RequestInfo`` — whose ``raw`` is the ``HttpRequest`` — or
its dotted path), ``CHECKS`` (app-wide checks), ``EXEMPT_PATHS``, ``ON_BREACH`` (``(request,
rejection) -> HttpResponse``), ``CHARGE_WHEN`` (``status -> bool``) and ``CLOCK`` (for tests).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings
from django.core.signals import setting_changed
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.utils.module_loading import import_string

from ..decision import Decision
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


def _user_key(request: RequestInfo) -> str | None:
    return request.user


_NAMED: dict[str, KeyFunc] = {
    "ip": client_ip(),  # behind RATEKEEPER["TRUSTED_PROXIES"]
    "user": _user_key,
    "user_or_ip": first(_user_key, client_ip()),
}


def key_function(spec: str | KeyFunc | None) -> KeyFunc:
    """A key function from a django-ratelimit style name, a dotted path, or a function. The
    same name gives the same function every time, so two views sharing a ``group`` with the
    same ``key`` share one limit."""
    if callable(spec):
        return spec
    if spec is None:
        return _NAMED["ip"]
    if not isinstance(spec, str):
        raise ConfigError(f"key {spec!r} is invalid; expected 'ip', 'user', a function, ...")
    return _named_key(spec)


@functools.lru_cache(maxsize=1024)
def _named_key(spec: str) -> KeyFunc:
    if spec in _NAMED:
        return _NAMED[spec]
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
            on_error=found.on_error,
        )
        store = found.store()
        self.sync = Runner(self.gate, store, self.clock)
        self.aio = AsyncRunner(self.gate, store, self.clock)
        self.routes = Routes(
            TABLE, self.gate, found.default, self.key, found.strategy, found.application
        )
        self.throttles: dict[tuple[str, str, str], int] = {}
        """Positions of DRF throttles' checks by (name, rate, algorithm)."""

    def info(self, request: HttpRequest) -> RequestInfo:
        """What checks see of ``request`` (``raw`` is the ``HttpRequest``)."""
        info = from_environ(request.META, self.trusted)
        return dataclasses.replace(info, user=_user(request), raw=request)

    def route(self, request: HttpRequest, view: Any) -> str:
        """The name of ``request``'s route: the URL's view name, else the view's dotted path."""
        match = getattr(request, "resolver_match", None)
        return match.view_name if match is not None else _dotted(view)

    def positions(self, request: HttpRequest, view: Callable[..., Any]) -> tuple[int, ...]:
        """The checks a request to ``view`` walks: its own limits (a class-based view's: the
        class's and those of the method that handles the request), else the default limits."""
        return self.routes.positions(self.route(request, view), (view, *_handler(request, view)))

    def usage(
        self, request: HttpRequest, limit: Limit, route: str, charge: bool
    ) -> Decision | None:
        """``limit``'s decision for ``request`` on ``route`` — peeked, or charged when
        ``charge`` (never refusing the request) — or None where it does not apply (no key, no
        rate) or could not be decided (fail open)."""
        position = self.routes.bind(limit, route)
        info = self.info(request)
        if not charge:
            return self.sync.peek(info, position)
        adm = Admission(info)
        rejection = self.sync.admit(info, adm, (position,))
        self.sync.finish(adm, None)
        if rejection is not None:
            return rejection.decision
        return None if adm.best is None else adm.best[1]

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


def _dotted(view: Any) -> str:
    if isinstance(view, tuple):  # a method's (class, function)
        return f"{view[0].__module__}.{view[0].__qualname__}.{view[1].__name__}"
    return f"{view.__module__}.{getattr(view, '__qualname__', type(view).__name__)}"


def _handler(request: HttpRequest, view: Any) -> tuple[Any, ...]:
    """For a class-based view: the (class, function) pairs of the method that handles
    ``request`` (through every ``method_decorator`` wrapper), as ``@ratelimit`` marks them."""
    view_class = getattr(view, "view_class", None)
    if view_class is None:
        return ()
    name = request.method.lower() if request.method else "get"
    if name not in getattr(view_class, "http_method_names", ()):
        return ()
    handler = getattr(view_class, name, None)
    if handler is None and name == "head":  # Django's View answers HEAD with get
        handler = getattr(view_class, "get", None)
    out = []
    for method in (handler, getattr(view_class, "dispatch", None)):
        for function in _chain(method):
            out.append((view_class, function))
            limits = function.__dict__.get(LIMITS_ATTR, ()) if hasattr(function, "__dict__") else ()
            inner = getattr(function, "__wrapped__", None)
            for limit in limits if inner is not None else ():
                # method_decorator copied our wrapper's limits onto its own wrapper: they belong
                # to the method it wraps, where the decorator marks them on every call
                TABLE.mark(limit)((view_class, inner))
    return tuple(out)


def _chain(function: Any) -> Iterator[Any]:
    seen = 0
    while function is not None and seen < 32:
        yield function
        function = getattr(function, "__wrapped__", None)
        seen += 1


def _target(view: Any) -> Any:
    """What ``@ratelimit`` marks: the view itself; or, for a bound method — what
    ``method_decorator`` hands the decorator, anew on every call — its (class, function), the
    same on every call, as ``_handler`` finds it."""
    function = view.func if isinstance(view, functools.partial) else view
    if inspect.ismethod(function):
        return (type(function.__self__), function.__func__)
    return view


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


LIMITS_ATTR = "__ratekeeper_limits__"
"""The limits a ``@ratelimit`` wrapper carries: ``method_decorator`` copies them onto the
method's wrapper, so the middleware finds a class-based view's limits before its first call."""


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
    block: bool = True,
) -> Callable[[V], V]:
    """Limit a view, django-ratelimit style: ``key`` (default: ``RATEKEEPER["KEY"]``) as in
    the module docstring; views with the same ``group`` share one counter (default: each view
    its own); only requests with ``methods`` (default: all) count. A rejection is answered
    with ``ON_BREACH``; ``rate`` may be a function of the request (None: no limit). With
    ``block=False`` nothing is refused: the view runs, with ``request.limited`` True when the
    limit would have refused (such a limit does not replace the default limits)."""
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
        target = _target(view)
        if block:  # the middleware walks blocking limits; the wrapper walks what it missed
            TABLE.mark(limit)(target)
        own = _own(target) if block else _side(limit, target)
        if iscoroutinefunction(view):

            @functools.wraps(view)
            async def async_wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
                owner, limits, info, adm = _join(request)
                positions = own(request, limits)
                rejection = None
                if positions and block:
                    rejection = await limits.aio.admit(info, adm, positions)
                elif positions:
                    _limited(request, await _watch_async(limits, info, positions))
                if rejection is not None:
                    response = limits.respond(request, rejection)
                else:
                    response = await view(request, *args, **kwargs)
                return await limits.acomplete(adm, response) if owner else response

            if block:
                setattr(async_wrapper, LIMITS_ATTR, (limit,))
            return async_wrapper  # type: ignore[return-value]  # the same view, wrapped

        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            owner, limits, info, adm = _join(request)
            positions = own(request, limits)
            rejection = None
            if positions and block:
                rejection = limits.sync.admit(info, adm, positions)
            elif positions:
                _limited(request, _watch(limits, info, positions))
            if rejection is not None:
                response = limits.respond(request, rejection)
            else:
                response = view(request, *args, **kwargs)
            return limits.complete(adm, response) if owner else response

        if block:
            setattr(wrapper, LIMITS_ATTR, (limit,))
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


def _join(request: HttpRequest) -> tuple[bool, Limits, RequestInfo, Admission]:
    """The request's admission, started here (``owner``: this wrapper finishes it) unless the
    middleware or an outer decorator started it."""
    started = _started(request)
    if started is not None:
        adm, limits = started
        return False, limits, adm.request or limits.info(request), adm
    limits = request.META[LIMITS_KEY] = current()
    info = limits.info(request)
    adm = request.META[SCOPE_KEY] = limits.admission(request, info)
    return True, limits, info, adm


def _own(target: Any) -> Callable[[HttpRequest, Limits], tuple[int, ...]]:
    """The positions of a view's blocking limits (``target``: what ``@ratelimit`` marked)."""

    def positions(request: HttpRequest, limits: Limits) -> tuple[int, ...]:
        return limits.positions(request, target)

    return positions


def _side(limit: Limit, target: Any) -> Callable[[HttpRequest, Limits], tuple[int, ...]]:
    """The position of a ``block=False`` limit, walked apart from the request's admission."""

    def positions(request: HttpRequest, limits: Limits) -> tuple[int, ...]:
        return (limits.routes.bind(limit, limits.route(request, target)),)

    return positions


def _watch(limits: Limits, info: RequestInfo, positions: tuple[int, ...]) -> bool:
    """Walk ``positions`` in an admission of their own (charged, never refusing the request);
    True if one of them would have refused."""
    side = Admission(info)
    rejection = limits.sync.admit(info, side, positions)
    limits.sync.finish(side, None)
    return rejection is not None


async def _watch_async(limits: Limits, info: RequestInfo, positions: tuple[int, ...]) -> bool:
    side = Admission(info)
    rejection = await limits.aio.admit(info, side, positions)
    await limits.aio.finish(side, None)
    return rejection is not None


def _limited(request: HttpRequest, limited: bool) -> None:
    request.limited = getattr(request, "limited", False) or limited  # type: ignore[attr-defined]  # django-ratelimit's attribute


def exempt(view: V) -> V:
    """Free a view (function, or class-based view's class) from the default limits."""
    return TABLE.exempt(view)
