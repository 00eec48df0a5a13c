"""Flask: the ``RouteLimits`` extension — ``init_app``, ``RATELIMIT_*`` settings, ``@limit``,
``shared_limit`` and ``@exempt`` on views and blueprints, default limits — over the WSGI
middleware's gate.

    limits = RouteLimits()                      # options in code win over app.config
    app = Flask(__name__)
    app.config["RATELIMIT_DEFAULT"] = "100/minute"
    limits.init_app(app)

    @app.get("/search")
    @limits.limit("10/minute")
    def search(): ...

How it fits together: ``init_app`` wraps ``app.wsgi_app`` in ``WSGIRateLimitMiddleware``
(headers on every response, refunds and releases when the response is closed, the app-wide
``checks``) and adds a ``before_request`` hook. After routing, the hook walks the view's limits,
its blueprints' limits and the default limits into the request's admission; a rejection raises
``RateLimited`` (a 429 ``HTTPException``), so ``@app.errorhandler(429)`` shapes the answer as
for any other error; or ``on_breach(rejection)`` returns the answer (anything a view may).
The settings are read by ``settings.read`` (see there for the table).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flask import Flask, current_app, request
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import TooManyRequests

from ..middleware.checks import Controls
from ..middleware.gate import SCOPE_KEY
from ..middleware.responses import Rejection
from ..middleware.wsgi import WSGIRateLimitMiddleware
from .routes import Routes
from .settings import read
from .shell import Shell

EXTENSION = "ratekeeper"


class RateLimited(TooManyRequests):
    """Raised by a route's limits: a 429 whose body is the rejection's JSON (``rejection``
    holds status, headers and body); the middleware adds the rate-limit headers."""

    def __init__(self, rejection: Rejection) -> None:
        super().__init__(rejection.body.decode())
        self.rejection = rejection

    def get_body(self, environ: Any = None, scope: Any = None) -> str:
        return self.rejection.body.decode()

    def get_headers(self, environ: Any = None, scope: Any = None) -> list[tuple[str, str]]:
        return [("Content-Type", "application/json")]


@dataclass(frozen=True, slots=True)
class _State:
    """What ``init_app`` left on one app: its middleware and its routes."""

    middleware: WSGIRateLimitMiddleware
    routes: Routes


class RouteLimits(Shell):
    """Limits per route for Flask apps (see the module docstring and ``Shell`` for the options;
    one object can serve several apps). ``on_breach(rejection)`` returns anything a view may."""

    exception: type[RateLimited] = RateLimited
    """What a rejection raises (a subclass of ``RateLimited``, built from the rejection)."""

    def init_app(self, app: Flask, config: Mapping[str, Any] | None = None) -> None:
        """Read ``RATELIMIT_*`` from ``app.config`` (or ``config``, read in its place), wrap
        ``app.wsgi_app``, add the hook."""
        where = f"Flask app {app.name!r} config"
        options = self.resolve(read(app.config if config is None else config, "RATELIMIT_", where))
        middleware = WSGIRateLimitMiddleware(app.wsgi_app, **options.middleware)
        app.wsgi_app = middleware  # type: ignore[method-assign]  # Flask's documented way
        routes = Routes(
            self.table, middleware.gate, options.default, options.key, options.algorithm,
            options.application,
        )  # fmt: skip
        app.extensions[EXTENSION] = _State(middleware, routes)
        app.before_request(self._before_request)

    def _before_request(self) -> ResponseReturnValue | None:
        state: _State = current_app.extensions[EXTENSION]
        adm = request.environ.get(SCOPE_KEY)
        endpoint = request.endpoint
        if adm is None or endpoint is None:  # not through our middleware, or not routed
            return None
        app = current_app
        groups = [app.blueprints[name] for name in request.blueprints if name in app.blueprints]
        positions = state.routes.positions(endpoint, (app.view_functions.get(endpoint), *groups))
        rejection = state.middleware.admit_route(adm, positions) if positions else None
        if rejection is None:
            return None
        if self.on_breach is not None:
            return self.on_breach(rejection)  # type: ignore[no-any-return]  # a view's value
        raise self.exception(rejection)

    def stats(self, app: Flask | None = None) -> dict[str, Any]:
        """Counters per check, requests in flight and store failures of ``app`` (default:
        the current app)."""
        return self._state(app).middleware.stats()

    def controls_of(self, app: Flask | None = None) -> Controls:
        """The modes and counters of ``app`` (default: the current app): each app has its own
        unless ``RouteLimits(controls=...)`` was given."""
        return self._state(app).middleware.controls

    def _state(self, app: Flask | None) -> _State:
        found = (app or current_app).extensions.get(EXTENSION)
        if not isinstance(found, _State):
            raise RuntimeError("ratekeeper's RouteLimits has not been initialized on this app")
        return found
