"""FastAPI: per-route limits as a decorator or a dependency, default and application limits,
exemptions, and the 429 shaped by an exception handler — over the ASGI middleware's gate.

    limits = RouteLimits(default="100/minute")
    app = FastAPI()
    limits.init_app(app)

    @app.get("/search")
    @limits.limit("10/minute", cost=2)
    async def search(q: str) -> dict[str, str]: ...

How it fits together: ``init_app`` adds ``RateLimitMiddleware`` (headers on every response,
refunds and releases when the response is done, the app-wide ``checks``), which leaves the
request's admission in the scope. After routing, the route's limits — its own, else the
default limits, and the application limits — are walked into that admission, each position
once per request: by the dependency ``init_app`` gives every route when there are default or
application limits (it takes no parameters: FastAPI resolves such a dependency at about half
the cost of one taking the request), and by the guard ``@limit`` and ``shared_limit`` wrap
around the endpoint, when FastAPI calls it (after FastAPI validated the request: a 422 is not
charged by a route's own limits). A rejection raises ``RateLimited``, answered by an exception
handler (``on_breach``, or one of your own). ``dependency()`` is a limit of its own, for a
route's ``dependencies=`` or a whole ``APIRouter``.

Without ``init_app`` (no middleware in front), a guarded endpoint that takes the request (a
parameter of type ``Request``, as slowapi asks for) still enforces its own limits: the guard
starts the admission itself and adds the rate-limit headers to a returned ``Response``, or to
the ``Response`` parameter FastAPI merges into its answer; default limits and ``checks`` need
the middleware. A guarded endpoint without either is loud (``RuntimeError``).

Plain Starlette apps have no dependencies: use ``RateLimitMiddleware`` with ``routes=``.
"""

import functools
import inspect
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.routing import APIRoute, APIWebSocketRoute
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Route, WebSocketRoute

from ..errors import ConfigError
from ..middleware.asgi import ASGIApp, RateLimitMiddleware, Receive, Scope, Send
from ..middleware.checks import RateFunc, RateSpec
from ..middleware.gate import SCOPE_KEY, Admission, added_header_lines, added_headers
from ..middleware.request import from_scope
from ..middleware.responses import Rejection
from .nested_routes import NestedLimit
from .routes import Limit, RouteLimit, Routes
from .settings import Settings
from .shell import F, Resolved, Shell

OnBreach = Callable[[Request, Rejection], Response | Awaitable[Response]]

_NO_INIT = (
    "ratekeeper's RouteLimits has no middleware in front of this app; call "
    "limits.init_app(app) where the app is created"
)


class RateLimited(HTTPException):
    """Raised by a route's limits; ``rejection`` holds the status, headers and JSON body. Its
    ``headers`` are the rejection's rate-limit headers, so even Starlette's own handler for
    ``HTTPException`` answers with ``Retry-After``."""

    def __init__(self, rejection: Rejection) -> None:
        headers = dict(added_headers(_rejected(rejection)))
        super().__init__(rejection.status, rejection.body.decode(), headers)
        self.rejection = rejection


def _rejected(rejection: Rejection) -> Admission:
    adm = Admission()
    adm.rejection = rejection
    return adm


def rejection_response(rejection: Rejection) -> Response:
    """The default answer: the rejection's status and JSON body. Whatever answers a rejection,
    the middleware adds its rate-limit headers (``Retry-After``, ``X-RateLimit-*``)."""
    return Response(rejection.body, rejection.status, media_type="application/json")


class RouteLimits(Shell):
    """Limits per route for one FastAPI app (see the module docstring and ``Shell`` for the
    options). ``on_breach(request, rejection)`` returns the response to a rejection, sync or
    async (default: ``rejection_response``)."""

    _middleware: "_Middleware | None" = None
    _standalone: "_Middleware | None" = None
    exception: type[RateLimited] = RateLimited
    """What a rejection raises (a subclass of ``RateLimited``, built from the rejection)."""

    def dependency(
        self, rate: RateSpec | RateFunc | NestedLimit, *, name: str | None = None, **options: Any
    ) -> Callable[[Request], Awaitable[None]]:
        """A limit as a dependency, e.g. ``APIRouter(dependencies=[Depends(limits.dependency(
        "100/minute"))])``: counted per route (named ``route@dN``) unless given a ``name``;
        the options of ``limit``. ``rate`` may be a ``NestedLimit`` (``nested_routes``), its
        options its own."""
        limit: RouteLimit
        if isinstance(rate, NestedLimit):
            if options or name is not None:
                raise ConfigError("dependency(NestedLimit(...)) takes no options: give them to it")
            limit = rate
            self.table.note(limit)
        else:
            limit = Limit(rate, name=name, **options)
        label = f"d{next(self.serial)}"
        positions: dict[str, int] = {}

        async def ratekeeper_limit(request: Request) -> None:
            scope = request.scope
            adm = scope.get(SCOPE_KEY)
            middleware = self._middleware
            if adm is None or middleware is None:
                raise RuntimeError(_NO_INIT)
            route = middleware.route_name(scope.get("route"))
            position = positions.get(route)
            if position is None:
                position = positions[route] = middleware.routes.position(limit, route, label)
            if await middleware.admit_route(adm, (position,)) is not None:
                raise self.exception(adm.rejection)  # type: ignore[arg-type, unused-ignore]  # just checked

        return ratekeeper_limit

    def decorator(self, mark: Callable[[F], F]) -> Callable[[F], F]:
        """``@limit`` and ``shared_limit`` also guard the endpoint: its route's limits are
        decided when it is called."""

        def decorate(endpoint: F) -> F:
            guarded: F = _guard(self, mark(endpoint))  # the same endpoint, wrapped
            return guarded

        return decorate

    async def __call__(self, request: Request) -> None:
        """A dependency walking the route's limits (for apps that pass
        ``dependencies=[Depends(limits)]`` themselves)."""
        await self.walk(request.scope)

    async def _walk_current(self) -> None:
        """The dependency ``init_app`` gives the routes of included routers: no parameters
        (see the module docstring); the scope comes from the middleware."""
        await self.walk_rest(_current())

    async def walk(self, scope: Scope) -> None:
        """Walk the route's limits (its own, else the defaults, and the application limits)
        into the request's admission, each once; raise ``RateLimited`` if one refuses."""
        adm = scope.get(SCOPE_KEY)
        middleware = self._middleware
        if adm is None or middleware is None:
            raise RuntimeError(_NO_INIT)
        positions = middleware.positions_of(scope.get("route"), scope.get("endpoint"))
        if positions and await middleware.admit_route(adm, positions) is not None:
            raise self.exception(adm.rejection)  # type: ignore[arg-type, unused-ignore]  # just checked

    async def walk_rest(self, scope: Scope) -> None:
        """Walk the route's default and application limits (its own are its guard's)."""
        adm = scope.get(SCOPE_KEY)
        middleware = self._middleware
        if adm is None or middleware is None:
            raise RuntimeError(_NO_INIT)
        positions = middleware.rest_of(scope.get("route"), scope.get("endpoint"))
        if positions and await middleware.admit_route(adm, positions) is not None:
            raise self.exception(adm.rejection)  # type: ignore[arg-type, unused-ignore]  # just checked

    def init_app(self, app: FastAPI) -> None:
        """Install the middleware, the walk of default and application limits (when there are
        any) and the 429 exception handler."""
        if not isinstance(app, FastAPI):
            raise ConfigError(
                f"init_app({app!r}): expected a FastAPI app; for plain Starlette use "
                "ratekeeper.middleware.RateLimitMiddleware with routes="
            )
        options = self.resolve(Settings())
        router = app.router
        given = (self, self._walk_current)
        walks_all = options.default or options.application
        if walks_all and not any(d.dependency in given for d in router.dependencies):
            if any(not isinstance(r, Route) or isinstance(r, APIRoute) for r in router.routes):
                raise ConfigError(
                    "init_app() was called after routes were declared, so they would have no "
                    "default limits; call it right after FastAPI(), or pass "
                    "dependencies=[Depends(limits)] to FastAPI()"
                )
            router.add_api_route = _adding(self, router)  # type: ignore[method-assign]  # the router's own, with a walking route class
            router.include_router = _including(self, router.include_router)  # type: ignore[method-assign]  # the router's own, with our dependency first
        app.add_middleware(_Middleware, limits=self, options=options)
        if RateLimited not in app.exception_handlers:
            app.add_exception_handler(RateLimited, self._handle)  # type: ignore[arg-type]  # narrower exception type

    async def _handle(self, request: Request, exc: RateLimited) -> Response:
        if self.on_breach is None:
            return rejection_response(exc.rejection)
        response = self.on_breach(request, exc.rejection)
        if inspect.isawaitable(response):
            response = await response
        if not isinstance(response, Response):
            raise TypeError(f"on_breach returned {response!r}; expected a Response")
        return response

    def stats(self) -> dict[str, Any]:
        """Counters per check, requests in flight and store failures (after the first request)."""
        middleware = self._middleware or self._standalone
        if middleware is None:
            return {"checks": self.controls.stats(), "in_flight": 0, "store": {}}
        return middleware.stats()

    def matching(self, app: ASGIApp) -> ASGIApp:
        """The middleware for an app that cannot take the route dependency (its routes were
        declared before it could be given): it matches the route itself among the app's
        top-level routes, with Starlette's ``route.matches``, and walks the default and
        application limits before calling the app; a rejection is answered by the app's
        exception handler for ``RateLimited`` (what slowapi's middleware does). A route it
        cannot see into (a router FastAPI includes without copying its routes, a mount)
        walks the default limits under the name ``(included routes)``: one limit, whatever
        the route's own limits or exemption — more limiting, never less."""
        return _Middleware(app, self, self.resolve(Settings()), match=True)

    def standalone(self) -> "_Middleware":
        """The gate a guarded endpoint uses when no middleware is in front (built once)."""
        found = self._standalone
        if found is None:
            found = self._standalone = _Middleware(_no_app, self, self.resolve(Settings()), False)
        return found


async def _no_app(scope: Scope, receive: Receive, send: Send) -> None:
    raise RuntimeError("the standalone gate of RouteLimits serves no requests")


class _Middleware(RateLimitMiddleware):
    """``RateLimitMiddleware`` built from a ``RouteLimits``, which it binds to its gate."""

    def __init__(
        self,
        app: ASGIApp,
        limits: RouteLimits,
        options: Resolved,
        bind: bool = True,
        match: bool = False,
    ) -> None:
        super().__init__(app, **options.middleware)
        self.limits = limits
        if match:
            self.app = _Matching(self, self.app)
        self.routes = Routes(
            limits.table, self.gate, options.default, options.key, options.algorithm,
            options.application,
        )  # fmt: skip
        self._names: dict[int, str] = {}
        self._positions: dict[tuple[int, int], tuple[int, ...]] = {}
        self._rest: dict[tuple[int, int], tuple[int, ...]] = {}
        if bind:
            limits._middleware = self

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        token = _SCOPE.set(scope)  # for the endpoints' guards and the route dependency
        try:
            await super().__call__(scope, receive, send)
        finally:
            _SCOPE.reset(token)

    def route_name(self, route: Any) -> str:
        """``"GET /items/{item_id}"``: a route's methods and path, the name of its checks
        (cached by the route's identity: the app's routes live as long as this middleware)."""
        name = self._names.get(id(route))
        if name is None:
            path = getattr(route, "path", None) or "/"
            methods = sorted(m for m in getattr(route, "methods", None) or () if m != "HEAD")
            name = self._names[id(route)] = f"{','.join(methods)} {path}" if methods else path
        return name

    def rest_of(self, route: Any, endpoint: Any) -> tuple[int, ...]:
        """The default and application positions a request to ``route`` walks (cached)."""
        key = (id(route), id(endpoint))
        found = self._rest.get(key)
        if found is None:
            name = self.route_name(route)
            found = self._rest[key] = self.routes.parts(name, (endpoint,))[1]
        return found

    def positions_of(self, route: Any, endpoint: Any) -> tuple[int, ...]:
        """Every position a request to ``route`` walks (cached per route and endpoint, which
        live as long as the app)."""
        key = (id(route), id(endpoint))
        found = self._positions.get(key)
        if found is None:
            found = self._positions[key] = self.routes.positions(
                self.route_name(route), (endpoint,)
            )
        return found


class _Matching:
    """The app behind a matching ``_Middleware`` (see ``RouteLimits.matching``)."""

    def __init__(self, middleware: _Middleware, app: ASGIApp) -> None:
        self.middleware = middleware
        self.app = app
        self._routes: tuple[int, int] | None = None
        self._plain = False
        self._found: dict[tuple[Any, Any, Any], tuple[Any, Any]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        adm = scope.get(SCOPE_KEY)
        app = scope.get("app") or self.app  # wrapped around the app: not set yet, the app is ours
        if adm is not None:
            route, endpoint = self._match(app, scope)
            middleware = self.middleware
            if route is not None:
                name = middleware.route_name(route) if endpoint is not None else _INCLUDED
                _, rest = middleware.routes.parts(name, (endpoint,))
                if rest and await middleware.admit_route(adm, rest) is not None:
                    exc = middleware.limits.exception(adm.rejection)  # type: ignore[arg-type, unused-ignore]  # just checked
                    await _answer(app, scope, receive, send, exc)
                    return
        await self.app(scope, receive, send)

    def _match(self, app: Any, scope: Scope) -> tuple[Any, Any]:
        """``_match``, remembered by method and path while the app's routes all match by
        nothing else (plain routes: no hosts, mounts or included routers) and do not change;
        at most ``_MATCHES`` paths (paths with parameters are many)."""
        routes = getattr(app, "routes", ())
        marker = (id(routes), len(routes))
        if marker != self._routes:
            self._routes = marker
            self._found.clear()
            self._plain = all(type(route).matches in _PLAIN for route in routes)
        if not self._plain:
            return _match(app, scope)
        key = (scope.get("method"), scope.get("root_path"), scope.get("path"))
        found = self._found.get(key)
        if found is None:
            found = _match(app, scope)
            if len(self._found) < _MATCHES:
                self._found[key] = found
        return found


_PLAIN = (Route.matches, APIRoute.matches, WebSocketRoute.matches, APIWebSocketRoute.matches)
"""The ``matches`` of routes that match by the scope's type, method and path alone."""
_MATCHES = 4096
_INCLUDED = "(included routes)"


def _match(app: Any, scope: Scope) -> tuple[Any, Any]:
    """The top-level route of ``app`` that fully matches ``scope``, and its endpoint (None
    for a route that routes further itself)."""
    for route in getattr(app, "routes", ()):
        found, child = route.matches(scope)
        if found is Match.FULL:
            return child.get("route", route), child.get(
                "endpoint", getattr(route, "endpoint", None)
            )
    return None, None


async def _answer(app: Any, scope: Scope, receive: Receive, send: Send, exc: RateLimited) -> None:
    """Answer ``exc`` with the app's exception handler for it (or ``rejection_response``)."""
    handlers = getattr(app, "exception_handlers", {})
    handler = next((handlers[k] for k in type(exc).__mro__ if k in handlers), None)
    request = Request(scope, receive)
    response = rejection_response(exc.rejection) if handler is None else handler(request, exc)
    if inspect.isawaitable(response):
        response = await response
    await response(scope, receive, send)


def _adding(limits: RouteLimits, router: Any) -> Callable[..., Any]:
    """``APIRouter.add_api_route`` (what ``app.get`` and the like call) building each route
    with a walking subclass of the route class it would use: the router's ``route_class`` as
    it is when the route is added (so one set after ``init_app`` keeps the limits), or the
    route's ``route_class_override``."""
    add = router.add_api_route
    made: dict[type[APIRoute], type[APIRoute]] = {}

    @functools.wraps(add)
    def add_api_route(*args: Any, route_class_override: Any = None, **options: Any) -> Any:
        base = route_class_override or router.route_class
        walking = made.get(base)
        if walking is None:
            walking = made[base] = _walking_routes(limits, base)
        return add(*args, route_class_override=walking, **options)

    return add_api_route


def _walking_routes(limits: RouteLimits, base: type[APIRoute]) -> type[APIRoute]:
    """A subclass of ``base`` (FastAPI's customization point for routes) whose handler walks
    the route's default and application limits first: what a route dependency does, without
    FastAPI solving a dependency for it on every request."""
    if getattr(base, "__ratekeeper_limits__", None) is limits:
        return base

    class RatekeeperRoute(base):  # type: ignore[valid-type, misc]  # a class given at run time
        __ratekeeper_limits__ = limits

        def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
            handler = super().get_route_handler()

            async def walking(request: Request) -> Response:
                await limits.walk_rest(request.scope)
                response: Response = await handler(request)
                return response

            return walking

    return RatekeeperRoute


def _including(limits: RouteLimits, include: Callable[..., Any]) -> Callable[..., Any]:
    """``APIRouter.include_router`` giving the included routes (which keep their own route
    class) a dependency that walks their default and application limits."""

    @functools.wraps(include)
    def include_router(router: Any, *args: Any, dependencies: Any = None, **options: Any) -> Any:
        walking = [Depends(limits._walk_current), *(dependencies or ())]
        return include(router, *args, dependencies=walking, **options)

    return include_router


_SCOPE: ContextVar[Scope | None] = ContextVar("ratekeeper_scope", default=None)
"""The scope of the request in progress, set by the middleware for the guards and the route
dependency."""


def _current() -> Scope:
    scope = _SCOPE.get()
    if scope is None:
        raise RuntimeError(_NO_INIT)
    return scope


def _guard(limits: RouteLimits, endpoint: Any) -> Any:
    """``endpoint``, wrapped to walk its route's limits when called (once: a second decorator
    finds it guarded). FastAPI reads the signature through ``__wrapped__``; a sync endpoint
    runs in the thread pool, as FastAPI would run it."""
    if getattr(endpoint, "__ratekeeper_guard__", False):
        return endpoint
    if inspect.isgeneratorfunction(endpoint):
        raise ConfigError(
            f"@limit on {endpoint.__qualname__}: a sync generator endpoint cannot be guarded; "
            "make it async, or use dependencies=[Depends(limits.dependency(...))]"
        )
    names = _typed_parameters(endpoint)
    if inspect.isasyncgenfunction(endpoint):

        @functools.wraps(endpoint)
        async def stream(*args: Any, **kwargs: Any) -> Any:
            own = await _enter(limits, kwargs, names)
            try:
                async for item in endpoint(*args, **kwargs):
                    yield item
            finally:
                if own is not None:
                    await _leave(limits, own, None, kwargs, names)

        guarded: Any = stream
    else:
        call_sync = not inspect.iscoroutinefunction(endpoint)

        @functools.wraps(endpoint)
        async def guarded(*args: Any, **kwargs: Any) -> Any:
            own = await _enter(limits, kwargs, names)
            if own is None:  # the middleware finishes the request
                if call_sync:
                    return await run_in_threadpool(endpoint, *args, **kwargs)
                return await endpoint(*args, **kwargs)
            result: Any = None
            try:
                if call_sync:
                    result = await run_in_threadpool(endpoint, *args, **kwargs)
                else:
                    result = await endpoint(*args, **kwargs)
                return result
            finally:
                await _leave(limits, own, result, kwargs, names)

    guarded.__ratekeeper_guard__ = True
    return guarded


def _typed_parameters(endpoint: Any) -> tuple[str | None, str | None]:
    """The names of ``endpoint``'s parameters of type ``Request`` and ``Response`` (what
    FastAPI passes the request and the response to merge as), if it has them."""
    try:
        params = inspect.signature(endpoint, eval_str=True).parameters.values()
    except Exception:  # annotations that do not evaluate here: look at the values instead
        return None, None
    request = next((p.name for p in params if _is(p.annotation, Request)), None)
    response = next((p.name for p in params if _is(p.annotation, Response)), None)
    return request, response


def _is(annotation: Any, kind: type) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, kind)


def _find(kwargs: dict[str, Any], name: str | None, kind: type) -> Any:
    found = kwargs.get(name) if name is not None else None
    if found is None:
        found = next((v for v in kwargs.values() if isinstance(v, kind)), None)
    return found


async def _enter(
    limits: RouteLimits, kwargs: dict[str, Any], names: tuple[str | None, str | None]
) -> tuple[Admission, Request] | None:
    """Walk the route's limits into the middleware's admission (None: the middleware finishes
    the request); without a middleware, into an admission of the guard's own, over the
    endpoint's ``Request`` parameter (returned: the guard finishes it)."""
    scope = _SCOPE.get()
    middleware = limits._middleware
    if scope is not None and middleware is not None:
        adm = scope.get(SCOPE_KEY)
        if adm is not None:
            positions = middleware.positions_of(scope.get("route"), scope.get("endpoint"))
            if positions and await middleware.admit_route(adm, positions) is not None:
                raise limits.exception(adm.rejection)
            return None
    request = _find(kwargs, names[0], Request)
    if request is None:
        raise RuntimeError(_NO_INIT)
    scope = request.scope
    gate = limits._standalone or limits.standalone()
    info = from_scope(scope, gate.trusted_proxies)
    own = scope[SCOPE_KEY] = Admission(info)
    positions = gate.positions_of(scope.get("route"), scope.get("endpoint"))
    rejection = await gate.runner.admit(info, own, positions)
    if rejection is not None:
        own.request = None  # see _leave
        await gate.runner.finish(own, rejection.status)
        raise limits.exception(rejection)
    return own, request


async def _leave(
    limits: RouteLimits,
    own: tuple[Admission, Request],
    result: Any,
    kwargs: dict[str, Any],
    names: tuple[str | None, str | None],
) -> None:
    """Without a middleware: the rate-limit headers on the endpoint's response (or on its
    ``Response`` parameter, which FastAPI merges into its answer), then finish."""
    adm, request = own
    adm.request = None  # a cycle through the scope otherwise (see RateLimitMiddleware)
    target = result if isinstance(result, Response) else _find(kwargs, names[1], Response)
    status = None
    if target is not None:
        raw = target.raw_headers  # the headers as sent: bytes, lower-case names
        sent = {name for name, _ in raw}
        raw.extend(line for line in added_header_lines(adm) if line[0] not in sent)
        status = target.status_code
    if status is None:
        status = getattr(request.scope.get("route"), "status_code", None) or 200
    await (limits._standalone or limits.standalone()).runner.finish(adm, status)
