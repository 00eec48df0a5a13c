"""FastAPI: per-route limits as a decorator or a dependency, default limits, exemptions, and the
429 shaped by an exception handler — over the ASGI middleware's gate.

    limits = RouteLimits(default="100/minute")
    app = FastAPI()
    limits.init_app(app)

    @app.get("/search")
    @limits.limit("10/minute", cost=2)
    async def search(q: str) -> dict[str, str]: ...

How it fits together: ``init_app`` adds ``RateLimitMiddleware`` (headers on every response,
refunds and releases when the response is done, the app-wide ``checks``), which leaves the
request's admission in the scope. After routing, the route's limits — its own, else the
default limits — are walked into that admission once: by the dependency ``init_app`` gives
every route when there are default limits (the ``RouteLimits`` object itself), else by the
guard ``@limit`` and ``shared_limit`` wrap around the endpoint, when FastAPI calls it (a
FastAPI dependency costs about as much as the whole walk). A rejection raises ``RateLimited``,
answered by an exception handler (``on_breach``, or one of your own). ``dependency()`` is a
limit of its own, for a route's ``dependencies=`` or a whole ``APIRouter``.

Plain Starlette apps have no dependencies: use ``RateLimitMiddleware`` with ``routes=``.
"""

import functools
import inspect
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any

from fastapi import Depends, FastAPI
from fastapi.routing import APIRoute
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from ..errors import ConfigError
from ..middleware.asgi import ASGIApp, RateLimitMiddleware, Receive, Scope, Send
from ..middleware.checks import RateFunc, RateSpec
from ..middleware.gate import SCOPE_KEY, Admission
from ..middleware.responses import Rejection
from .nested_routes import NestedLimit
from .routes import Limit, RouteLimit, Routes
from .settings import Settings
from .shell import F, Resolved, Shell

OnBreach = Callable[[Request, Rejection], Response | Awaitable[Response]]


class RateLimited(HTTPException):
    """Raised by a route's limits; ``rejection`` holds the status, headers and JSON body."""

    def __init__(self, rejection: Rejection) -> None:
        super().__init__(rejection.status, rejection.body.decode())
        self.rejection = rejection


def rejection_response(rejection: Rejection) -> Response:
    """The default answer: the rejection's status and JSON body. Whatever answers a rejection,
    the middleware adds its rate-limit headers (``Retry-After``, ``X-RateLimit-*``)."""
    return Response(rejection.body, rejection.status, media_type="application/json")


class RouteLimits(Shell):
    """Limits per route for one FastAPI app (see the module docstring and ``Shell`` for the
    options). ``on_breach(request, rejection)`` returns the response to a rejection, sync or
    async (default: ``rejection_response``)."""

    _middleware: "_Middleware | None" = None

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
            adm, middleware = self._state(request)
            route = middleware.route_name(request.scope.get("route"))
            position = positions.get(route)
            if position is None:
                position = positions[route] = middleware.routes.position(limit, route, label)
            if await middleware.admit_route(adm, (position,)) is not None:
                raise RateLimited(adm.rejection)  # type: ignore[arg-type]  # just checked

        return ratekeeper_limit

    def decorator(self, mark: Callable[[F], F]) -> Callable[[F], F]:
        """``@limit`` and ``shared_limit`` also guard the endpoint: its route's limits are
        decided when it is called."""

        def decorate(endpoint: F) -> F:
            guarded: F = _guard(self, mark(endpoint))  # the same endpoint, wrapped
            return guarded

        return decorate

    async def __call__(self, request: Request) -> None:
        """The dependency ``init_app`` gives every route when there are default limits."""
        await self.walk(request.scope)

    async def walk(self, scope: Scope) -> None:
        """Walk the route's limits (its own, else the defaults) into the request's admission,
        once per request; raise ``RateLimited`` if one refuses."""
        if scope.get(_WALKED):
            return
        adm = scope.get(SCOPE_KEY)
        middleware = self._middleware
        if adm is None or middleware is None:
            raise RuntimeError(
                "ratekeeper's RouteLimits has no middleware in front of this app; call "
                "limits.init_app(app) where the app is created"
            )
        scope[_WALKED] = True
        positions = middleware.routes.positions(
            middleware.route_name(scope.get("route")), (scope.get("endpoint"),)
        )
        if positions and await middleware.admit_route(adm, positions) is not None:
            raise RateLimited(adm.rejection)

    def _state(self, request: Request) -> tuple[Admission, "_Middleware"]:
        adm = request.scope.get(SCOPE_KEY)
        middleware = self._middleware
        if adm is None or middleware is None:
            raise RuntimeError(
                "ratekeeper's RouteLimits has no middleware in front of this app; call "
                "limits.init_app(app) where the app is created"
            )
        return adm, middleware

    def init_app(self, app: FastAPI) -> None:
        """Install the middleware, the route dependency and the 429 exception handler."""
        if not isinstance(app, FastAPI):
            raise ConfigError(
                f"init_app({app!r}): expected a FastAPI app; for plain Starlette use "
                "ratekeeper.middleware.RateLimitMiddleware with routes="
            )
        options = self.resolve(Settings())
        dependencies = app.router.dependencies
        if options.default and not any(d.dependency is self for d in dependencies):
            if any(isinstance(r, APIRoute) for r in app.router.routes):
                raise ConfigError(
                    "init_app() was called after routes were declared, so they would have no "
                    "default limits; call it right after FastAPI(), or pass "
                    "dependencies=[Depends(limits)] to FastAPI()"
                )
            dependencies.append(Depends(self))
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
        if self._middleware is None:
            return {"checks": self.controls.stats(), "in_flight": 0, "store": {}}
        return self._middleware.stats()


class _Middleware(RateLimitMiddleware):
    """``RateLimitMiddleware`` built from a ``RouteLimits``, which it binds to its gate."""

    def __init__(self, app: ASGIApp, limits: RouteLimits, options: Resolved) -> None:
        super().__init__(app, **options.middleware)
        self.routes = Routes(
            limits.table, self.gate, options.default, options.key, options.algorithm
        )
        self._names: dict[int, str] = {}
        limits._middleware = self

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        token = _SCOPE.set(scope)  # for the endpoints' guards
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


_SCOPE: ContextVar[Scope | None] = ContextVar("ratekeeper_scope", default=None)
"""The scope of the request in progress, set by the middleware for the endpoints' guards."""
_WALKED = "ratekeeper.route_walked"


def _guard(limits: RouteLimits, endpoint: Any) -> Any:
    """``endpoint``, wrapped to walk its route's limits when called (once: a second decorator
    finds it guarded). FastAPI reads the signature through ``__wrapped__``; a sync endpoint
    runs in the thread pool, as FastAPI would run it."""
    if getattr(endpoint, "__ratekeeper_guard__", False):
        return endpoint
    if inspect.isasyncgenfunction(endpoint):

        @functools.wraps(endpoint)
        async def stream(*args: Any, **kwargs: Any) -> Any:
            await limits.walk(_current())
            async for item in endpoint(*args, **kwargs):
                yield item

        guarded: Any = stream
    elif inspect.isgeneratorfunction(endpoint):
        raise ConfigError(
            f"@limit on {endpoint.__qualname__}: a sync generator endpoint cannot be guarded; "
            "make it async, or use dependencies=[Depends(limits.dependency(...))]"
        )
    elif inspect.iscoroutinefunction(endpoint):

        @functools.wraps(endpoint)
        async def guarded(*args: Any, **kwargs: Any) -> Any:
            await limits.walk(_current())
            return await endpoint(*args, **kwargs)

    else:

        @functools.wraps(endpoint)
        async def guarded(*args: Any, **kwargs: Any) -> Any:
            await limits.walk(_current())
            return await run_in_threadpool(endpoint, *args, **kwargs)

    guarded.__ratekeeper_guard__ = True
    return guarded


def _current() -> Scope:
    scope = _SCOPE.get()
    if scope is None:
        raise RuntimeError(
            "ratekeeper's RouteLimits has no middleware in front of this app; call "
            "limits.init_app(app) where the app is created"
        )
    return scope
