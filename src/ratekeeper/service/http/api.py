"""The HTTP JSON API as a plain ASGI application (served by uvicorn; no web framework).

Routes (names fixed; see docs/service.md and the OpenAPI document at ``/openapi.json``)::

    POST /v1/hit                          {"policy", "key", "cost"?, "over_limit_status"?}
                                          or {"levels", "cost"?, "over_limit_status"?}
    POST /v1/reserve                      {"levels", "estimate", "ttl"?, "over_limit_status"?}
    POST /v1/settle  /v1/cancel           {"reservation", "actual"}  /  {"reservation"}
    POST /v1/peek /v1/refund              {"policy", "key", "cost"?}
    POST /v1/reset                        {"policy", "key"}                    admin
    POST /v1/concurrency/acquire          {"policy", "key"}    200 lease / 429 full
    POST /v1/concurrency/release          {"lease"}
    POST /v1/admin/reload                                                       admin
    POST /v1/admin/policies/{name}        {"enabled"?, "shadow"?, "block"?}    admin
    GET  /v1/policies   /healthz   /metrics   /openapi.json
    GET  /dashboard (page)   GET /dashboard/data (client)   POST /dashboard/modes (admin)

``ROUTES`` is the one table of routes and who may call them (the router dispatches from it,
tests/abuse/test_auth.py checks every entry and that it matches the OpenAPI document).

Rules: a request's head is checked before its body is read (``check_head``): the Host and
browser rules (``http.guard``), then the token, then the body's announced size. Every
``/v1/`` route needs ``Authorization: Bearer <token>`` when a token is configured (the admin
token is accepted too); admin routes need the admin token, and are refused when a token but
no admin token is configured; an unknown ``/v1/`` path asks for a token before it answers
404. Tokens are compared in constant time.
A request is validated whole before anything is counted: malformed JSON, unknown fields,
wrong types, an unknown policy, a key too long or a body over 64 kB get a 4xx JSON
``{"error", "field"}`` and change no counter. No client mistake answers 500.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from ...errors import BadRequest
from ..auth import _same
from ..config.loader import PolicySpec
from ..engine import Engine, Pending, Result, store_key
from ..metrics import OPENMETRICS_TEXT, wants_openmetrics
from . import dashboard
from . import quotas as quota_routes
from .body import (
    MAX_BODY,
    Receive,
    Scope,
    Send,
    _body,
    _lifespan,
    _method,
    _object,
    _optional_bool,
    _over_limit_status,
    _rest,
)
from .guard import BrowserRules, Head
from .hit import rendered
from .nested import NestedAPI
from .render import (
    _INTERNAL,
    _PROM,
    Answer,
    Headers,
    Response,
    _decision_response,
    _encode,
    _lease_json,
    _result_body,
    openapi_document,
)
from .routes import _DECIDE, _FIELDS, _NESTED, _access_of_unknown, find_route

CONCURRENCY_RETRY_AFTER = 1
"""``Retry-After`` seconds of a full concurrency policy's 429: a slot frees when any request of
the key ends, which no one can predict; one second keeps retrying clients from spinning."""
MAX_COST = 2**31 - 1
log = logging.getLogger("ratekeeper.service")

LOOPBACK = BrowserRules()
"""The browser rules of a service on a loopback address (``HttpApi``'s default)."""


class HttpApi:
    """The ASGI callable. ``reload`` is called by ``POST /v1/admin/reload``; ``rules``: the
    browser rules (the hosts served and the origins allowed)."""

    inline_paths = frozenset(_DECIDE)
    """The routes the HTTP protocol may answer through ``decide_now`` (``http.connection``)."""

    def __init__(
        self,
        engine: Engine,
        reload: Callable[[], Awaitable[str | None]],
        health: Callable[[], Awaitable[dict[str, Any]]],
        rules: BrowserRules = LOOPBACK,
    ) -> None:
        self.engine = engine
        self.rules = rules
        self.reload = reload
        self.health = health
        self._openapi: tuple[int, bytes] = (-1, b"")
        self.in_flight = 0
        self.nested = NestedAPI(engine)
        engine.metrics.watch_in_flight(self.requests_in_flight)

    def requests_in_flight(self) -> int:
        """HTTP requests being served now."""
        return self.in_flight

    def _openapi_for(self, max_key_length: int) -> bytes:
        """The document for the running config's key length (rebuilt after a reload)."""
        if self._openapi[0] != max_key_length:
            self._openapi = (max_key_length, openapi_document(max_key_length))
        return self._openapi[1]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await _lifespan(receive, send)
            return
        path: str = scope["path"]
        method: str = scope["method"]
        refusal = self.check_head(method, path, Head.of(scope["headers"]))
        if refusal is not None:
            status, payload, raw = refusal
        elif path in _DECIDE and method == "POST":  # the hot routes, without the router
            status, payload, raw = await self._decision_route(scope, receive, path)
        else:
            status, payload, raw = await self._general(scope, receive, path, method)
        await send({"type": "http.response.start", "status": status, "headers": raw})
        await send({"type": "http.response.body", "body": payload})

    def check_head(self, method: str, path: str, head: Head) -> Response | None:
        """The refusal of a request by its head alone (counted), or None: the Host and origin
        rules, the token its route needs, the content type (``http.guard``), a
        Content-Length over ``MAX_BODY``.
        Before the body is read: the HTTP server calls it once the head is complete (on
        every route), and ``__call__`` for any other ASGI server."""
        try:
            self.rules.check(method, head)
            auth = self.engine.config.auth
            if auth.token or auth.admin_token:
                if path in _DECIDE:
                    access = "client"
                else:
                    route = find_route(path)
                    access = route.access if route is not None else _access_of_unknown(path)
                if access != "public":  # no route reveals itself without a token
                    self._authorize(head.authorization, access == "admin")
            self.rules.check_content(method, head)
            length = head.content_length
            if length is not None:
                if not length.isdigit():
                    raise BadRequest("body", f"content-length {length!r} is invalid", 400)
                if int(length) > MAX_BODY:
                    size = f"body is {int(length)} bytes; the limit is {MAX_BODY}"
                    raise BadRequest("body", size, 413)
        except BadRequest as exc:
            return self._refused(exc, path)
        return None

    def refuse(self, exc: BadRequest) -> Response:
        """The answer to a request the HTTP server refused itself (framing, size, time)."""
        return self._refused(exc, "")

    async def _decision_route(self, scope: Scope, receive: Receive, path: str) -> Response:
        """A decision route through ASGI (its head checked): its body, then ``decide_now``."""
        try:
            message = await receive()  # _body's common case, inlined
            body = message.get("body", b"")
            if message.get("more_body", False) or message["type"] != "http.request":
                body = await _rest(scope, receive, message)
        except BadRequest as exc:
            return self._refused(exc, path)
        answer = self.decide_now(path, None, body)
        if isinstance(answer, tuple):
            return answer  # type: ignore[return-value]  # headers a list: block not asked
        assert not isinstance(answer, Soon)  # not asked for
        return await answer

    def decide_now(
        self,
        path: str,
        headers: list[tuple[bytes, bytes]] | None,
        body: bytes,
        block: bool = False,
        soon: bool = False,
    ) -> Answer | Soon | Coroutine[Any, Any, Response]:
        """``POST`` to a decision route (``/v1/hit``, ``/v1/peek``, ``/v1/refund``) with its
        whole ``body``: the response, made now when the store is in-process (or the over-limit
        cache answers); else, when ``soon`` is asked and a batching store has the call
        queued, a ``Soon`` that makes it once the store's batch has answered (for a caller
        that waits by callback); else a coroutine that asks the store and makes it.
        ``headers``: the request's, to check (``check_head``); None when they were checked.
        Never raises: a client mistake is its 4xx, a bug of ours a 500 (logged). Used by the
        ASGI app and by the HTTP protocol itself (``http.connection``), so both answer byte for
        byte the same. ``block``: an admitted hit's headers may come as the lines HTTP sends
        (bytes)."""
        if headers is not None:
            refusal = self.check_head("POST", path, Head.of(headers))
            if refusal is not None:
                return refusal
        self.in_flight += 1
        later = False
        try:
            engine = self.engine
            op = _DECIDE[path]
            req = _object(body, _FIELDS[op])
            if "levels" in req:  # a nested decision (http.nested)
                later = True
                return self._later(path, self._nested_hit(req))
            if op == "refund":
                later = True
                return self._later(path, self._refunded(req))
            spec, key, cost = engine.checked(req)
            over = 200
            if op == "hit":
                over = engine.config.over_limit_status
                if "over_limit_status" in req:
                    over = _over_limit_status(req, over)
            made = engine.answer_now(op, spec, key, cost, soon)
            if isinstance(made, Result):
                return _decision_response(made, over)
            if made is None:
                later = True
                return self._later(path, self._asked(op, spec, key, cost, over))
            if isinstance(made, Pending):  # in the store's next batch
                later = True
                return Soon(self, path, made, spec, key, cost, over, block)
            payload, raw = rendered(made, block)  # an admitted fast hit
            return 200, payload, raw
        except Exception as exc:
            return self._failed(exc, "POST", path)
        finally:
            if not later:
                self.in_flight -= 1

    async def _asked(self, op: str, spec: PolicySpec, key: str, cost: int, over: int) -> Response:
        """The response when the store must be asked."""
        return _decision_response(await self.engine.answer(op, spec, key, cost), over)

    async def _nested_hit(self, req: dict[str, Any]) -> Response:
        return _encode(*await self.nested.hit(req))

    async def _refunded(self, req: dict[str, Any]) -> Response:
        return _encode(*await self._decide("refund", req))

    async def _later(self, path: str, pending: Awaitable[Response]) -> Response:
        """``decide_now``'s answer when it must wait (``pending``), as ``decide_now``'s own."""
        try:
            return await pending
        except Exception as exc:
            return self._failed(exc, "POST", path)
        finally:
            self.in_flight -= 1

    async def _general(self, scope: Scope, receive: Receive, path: str, method: str) -> Response:
        """Every route but the decision routes."""
        self.in_flight += 1
        try:
            return _encode(*await self._route(scope, receive, path, method))
        except Exception as exc:
            return self._failed(exc, method, path)
        finally:
            self.in_flight -= 1

    def _failed(self, exc: Exception, method: str, path: str) -> Response:
        """The response to a request that raised: its 4xx for a client mistake, else a 500
        without details (a bug of ours: logged with its traceback; call it in ``except``)."""
        if isinstance(exc, BadRequest):
            return self._refused(exc, path)
        log.exception("unexpected error serving %s %s", method, path)
        return _encode(500, _INTERNAL, {})

    def _refused(self, exc: BadRequest, path: str) -> Response:
        """A client mistake's response: its status and ``{"error", "field"}``, counted."""
        self.engine.metrics.refused.labels(exc.field).inc()
        headers: dict[str, str] = {}
        route = find_route(path) if exc.status == 405 else None
        if route is not None:  # RFC 9110: a 405 names the methods that are allowed
            headers = {"allow": route.method}
        return _encode(exc.status, {"error": str(exc), "field": exc.field}, headers)

    async def _route(
        self, scope: Scope, receive: Receive, path: str, method: str
    ) -> tuple[int, Any, Headers]:
        route = find_route(path)  # its token was checked with the head (check_head)
        if route is None:
            raise BadRequest("path", f"no route {path!r}; see /openapi.json", 404)
        _method(method, route.method)
        if route.path == "/healthcheck":  # envoyproxy/ratelimit's: the process serves
            return 200, {"status": "ok"}, {}
        if route.path == "/healthz":
            info = await self.health()
            return (200 if info["store"] == "ok" else 503), info, {}
        if route.path == "/metrics":  # OpenMetrics when the scraper asks for it
            accept = next((v for k, v in scope["headers"] if k == b"accept"), b"")
            if wants_openmetrics(accept.decode("latin-1")):
                body = self.engine.metrics.exposition(openmetrics=True)
                return 200, body, {"content-type": OPENMETRICS_TEXT}
            return 200, self.engine.metrics.exposition(), {"content-type": _PROM}
        if route.path == "/openapi.json":
            return 200, self._openapi_for(self.engine.config.max_key_length), {}
        if route.path == "/dashboard":
            return 200, dashboard.PAGE, {"content-type": "text/html; charset=utf-8"}
        if route.path == "/dashboard/data":
            return 200, dashboard.data(self.engine), {"cache-control": "no-store"}
        if route.path == "/dashboard/modes":
            req = _object(await _body(scope, receive), {"name", "mode"})
            return 200, dashboard.set_mode(self.engine, req), {}
        if route.path == "/v1/policies":
            config = self.engine.config
            names = [*config.policies, *config.concurrency]
            return 200, {"policies": [self._describe(n) for n in names]}, {}
        if route.path == "/v1/concurrency/acquire":
            req = _object(await _body(scope, receive), {"policy", "key"})
            spec = self.engine.concurrency_spec(req.get("policy"))
            if "key" not in req:
                raise BadRequest("key", "key is missing; expected a non-empty string")
            lease = await self.engine.acquire(spec, self.engine.check_key(req["key"]))
            if lease.acquired:
                return 200, _lease_json(lease), {}
            return 429, _lease_json(lease), {"Retry-After": str(CONCURRENCY_RETRY_AFTER)}
        if route.path == "/v1/concurrency/release":
            req = _object(await _body(scope, receive), {"lease"})
            if "lease" not in req:
                raise BadRequest("lease", "lease is missing; expected the token from acquire")
            return 200, {"released": await self.engine.release(req["lease"])}, {}
        if route.path.startswith(("/v1/status", quota_routes.ADMIN)):
            fields = quota_routes.FIELDS.get(route.path[len(quota_routes.ADMIN) :])
            given = None if fields is None else _object(await _body(scope, receive), fields)
            status, body = await quota_routes.answer(self.engine, route.path, scope, given)
            return status, body, {"cache-control": "no-store"}
        if route.path == "/v1/admin/reload":
            await _body(scope, receive)
            error = await self.reload()
            if error is not None:
                return 422, {"reloaded": False, "error": error, "field": "config"}, {}
            return 200, {"reloaded": True, "files": list(self.engine.config.files)}, {}
        if route.path == "/v1/admin/policies/{name}":
            req = _object(await _body(scope, receive), {"enabled", "shadow", "block"})
            name = path[len("/v1/admin/policies/") :]
            toggles = [_optional_bool(req, f) for f in ("enabled", "shadow", "block")]
            self._describe(name)  # 404 for an unknown policy, before anything changes
            self.engine.toggle(name, toggles[0], toggles[1], toggles[2])
            return 200, self._describe(name), {}
        if route.path in _NESTED:  # reserve, settle, cancel (http.nested)
            req = _object(await _body(scope, receive), _NESTED[route.path])
            if route.path == "/v1/reserve":
                return await self.nested.reserve(req)
            return await self.nested.settle(req, cancel=route.path == "/v1/cancel")
        op = route.path[4:]  # hit, peek, refund, reset
        req = _object(await _body(scope, receive), _FIELDS[op])
        return await self._decide(op, req)

    async def _decide(self, op: str, req: dict[str, Any]) -> tuple[int, Any, Headers]:
        engine = self.engine
        spec, key, cost = engine.checked(req)
        if op == "hit" or op == "peek":
            over = 200 if op == "peek" else _over_limit_status(req, engine.config.over_limit_status)
            result = await engine.decide(op, spec, key, cost, store_key(spec.name, key))
            status = 200 if result.decision.allowed else over
            return status, _result_body(result), result.decision.header_lines(result.policy)
        if op == "refund":
            await engine.refund(spec, key, cost)
            return 200, {"refunded": cost, "policy": spec.name}, {}
        await engine.reset(spec, key)
        return 200, {"reset": True, "policy": spec.name}, {}

    def _describe(self, name: str) -> dict[str, Any]:
        if name in self.engine.config.concurrency:
            lease = self.engine.concurrency_spec(name)
            return {
                "name": lease.name,
                "kind": "concurrency",
                "capacity": lease.capacity,
                "lease_ttl": lease.lease_ttl,
                "shadow": lease.shadow,
                "enabled": lease.enabled,
            }
        spec = self.engine.spec(name)
        return {
            "name": spec.name,
            "kind": "rate",
            "rate": spec.rate_text,
            "rates": [r.code for r in spec.policy.rates],
            "algorithm": spec.algorithm,
            "burst": spec.burst,
            "buckets": spec.buckets,
            "shadow": spec.shadow,
            "enabled": spec.enabled,
            "blocked": spec.block,
        }

    def _authorize(self, given: bytes | None, admin: bool) -> None:
        """Raises ``BadRequest`` (401/403) unless the request's bearer token (``given``: its
        ``Authorization`` header) may call a route (the admin token for an admin route)."""
        auth = self.engine.config.auth
        if not auth.token and not auth.admin_token:
            return
        scheme, _, token = (given or b"").partition(b" ")
        token = token.strip() if scheme.lower() == b"bearer" else b""
        if admin:
            if not auth.admin_token:
                raise BadRequest("authorization", "admin routes are off: no admin token set", 403)
            if not _same(token, auth.admin_token):
                status = 401 if not token else 403
                raise BadRequest("authorization", "this route needs the admin bearer token", status)
            return
        if not (_same(token, auth.token) or _same(token, auth.admin_token)):
            raise BadRequest("authorization", "missing or wrong bearer token", 401)


class Soon:
    """``decide_now``'s answer while the store's batch is out: once ``pending.future`` is done,
    ``answer()`` makes the response, as the coroutine ``decide_now`` returns otherwise would
    (``Engine.answered``). No task and no
    coroutine per request: the HTTP protocol waits with ``future.add_done_callback``."""

    __slots__ = ("api", "block", "cost", "key", "over", "path", "pending", "spec")

    def __init__(
        self,
        api: HttpApi,
        path: str,
        pending: Pending,
        spec: PolicySpec,
        key: str,
        cost: int,
        over: int,
        block: bool,
    ) -> None:
        self.api = api
        self.path = path
        self.pending = pending
        self.spec = spec
        self.key = key
        self.cost = cost
        self.over = over
        self.block = block

    def answer(self) -> Answer | None:
        """The response, made once the batch has answered (call it exactly once: it counts the
        decision and ends the request's time in flight); None when the batch was cancelled
        (the server is stopping: nothing to send)."""
        api = self.api
        spec, key, cost = self.spec, self.key, self.cost
        try:
            made = api.engine.answered(spec, key, cost, self.pending)
            if isinstance(made, Result):
                return _decision_response(made, self.over)
            payload, raw = rendered(made, self.block)  # an admitted fast hit
            return 200, payload, raw
        except asyncio.CancelledError:
            return None
        except Exception as exc:
            return api._failed(exc, "POST", self.path)
        finally:
            api.in_flight -= 1
