"""The HTTP JSON API as a plain ASGI application (served by uvicorn; no web framework).

Routes (names fixed; see docs/service.md and the OpenAPI document at ``/openapi.json``)::

    POST /v1/hit                          {"policy", "key", "cost"?, "over_limit_status"?}
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
import hmac
import json
import logging
import math
from collections.abc import Awaitable, Callable, Coroutine, MutableMapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from ...decision import Decision
from ...errors import BadRequest
from ...limiter import Pending
from ...plan import Op, decide
from ..config.loader import OVER_LIMIT_STATUSES, PolicySpec
from ..engine import Engine, LeaseResult, Result
from . import dashboard
from .guard import BrowserRules, Head
from .hit import HttpHits

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Headers = dict[str, str] | list[tuple[bytes, bytes]]
Response = tuple[int, bytes, list[tuple[bytes, bytes]]]
"""A response: status, body and headers (``content-type`` and ``content-length`` too)."""
Answer = tuple[int, bytes, list[tuple[bytes, bytes]] | bytes]
"""A ``Response``, or one whose headers are the lines HTTP sends (``decide_now``'s ``block``)."""

MAX_BODY = 64 * 1024
CONCURRENCY_RETRY_AFTER = 1
"""``Retry-After`` seconds of a full concurrency policy's 429: a slot frees when any request of
the key ends, which no one can predict; one second keeps retrying clients from spinning."""
MAX_COST = 2**31 - 1
OPENAPI = Path(__file__).with_name("openapi.json")
log = logging.getLogger("ratekeeper.service")

_JSON = (b"content-type", b"application/json")
LOOPBACK = BrowserRules()
"""The browser rules of a service on a loopback address (``HttpApi``'s default)."""


@dataclass(frozen=True, slots=True)
class Route:
    """One route: its method, its path (``{name}`` matches the rest of the path) and who may
    call it: ``public`` (no token), ``client`` (either token) or ``admin`` (the admin token)."""

    method: str
    path: str
    access: str


ROUTES: tuple[Route, ...] = (
    Route("POST", "/v1/hit", "client"),
    Route("POST", "/v1/peek", "client"),
    Route("POST", "/v1/refund", "client"),
    Route("POST", "/v1/reset", "admin"),
    Route("GET", "/v1/policies", "client"),
    Route("POST", "/v1/concurrency/acquire", "client"),
    Route("POST", "/v1/concurrency/release", "client"),
    Route("POST", "/v1/admin/reload", "admin"),
    Route("POST", "/v1/admin/policies/{name}", "admin"),
    Route("GET", "/healthz", "public"),
    Route("GET", "/metrics", "public"),
    Route("GET", "/openapi.json", "public"),
    Route("GET", "/dashboard", "public"),
    Route("GET", "/dashboard/data", "client"),
    Route("POST", "/dashboard/modes", "admin"),
)
"""Every route the API serves, the one place that says who may call what (tests read it)."""

_EXACT = {r.path: r for r in ROUTES if "{" not in r.path}
_DECIDE = {"/v1/hit": "hit", "/v1/peek": "peek", "/v1/refund": "refund"}
"""The client routes that decide, served before the router (``ROUTES`` says the same)."""
_FIELDS = {
    "hit": {"policy", "key", "cost", "over_limit_status"},
    "peek": {"policy", "key", "cost"},
    "refund": {"policy", "key", "cost"},
    "reset": {"policy", "key"},
}
"""The body fields each decision route takes."""
_TEMPLATED = [(r.path[: r.path.index("{")], r) for r in ROUTES if "{" in r.path]


def find_route(path: str) -> Route | None:
    """The route serving ``path``, or None."""
    route = _EXACT.get(path)
    if route is not None:
        return route
    for head, templated in _TEMPLATED:
        if path.startswith(head) and len(path) > len(head):
            return templated
    return None


def _access_of_unknown(path: str) -> str:
    """Unknown paths under ``/v1/`` still need a token, so they reveal nothing."""
    if path.startswith("/v1/admin/"):
        return "admin"
    return "client" if path.startswith("/v1/") else "public"


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
        self.hits = HttpHits(engine)
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
            if op == "refund":
                later = True
                return self._later(path, self._refunded(req))
            spec, key, cost = self._checked(req)
            over = 200
            if op == "hit":
                over = engine.config.over_limit_status
                if "over_limit_status" in req:
                    over = _over_limit_status(req, over)
            result = self.hits.answer(spec, key, cost, block) if op == "hit" else None
            if result is None:
                stored = f"{len(spec.name)}:{spec.name}:{key}"  # store_key, inlined
                result = engine.decide_now(op, spec, key, cost, stored)
                if result is None:
                    later = True
                    if soon:
                        kind: Op = "hit" if op == "hit" else "peek"
                        pending = engine.limiter.decide_soon(kind, stored, spec.policy, cost)
                        if pending is not None:  # in the store's next batch
                            return Soon(self, path, pending, spec, key, cost, over, block)
                    return self._later(path, self._asked(op, spec, key, cost, stored, over))
            if isinstance(result, Result):
                return _decision_response(result, over)
            payload, raw = result  # admitted, its response made
            return 200, payload, raw
        except Exception as exc:
            return self._failed(exc, "POST", path)
        finally:
            if not later:
                self.in_flight -= 1

    async def _asked(
        self, op: str, spec: PolicySpec, key: str, cost: int, stored: str, over: int
    ) -> Response:
        """The response when the store must be asked."""
        return _decision_response(await self.engine.ask(op, spec, key, cost, stored), over)

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
        if route.path == "/healthz":
            info = await self.health()
            return (200 if info["store"] == "ok" else 503), info, {}
        if route.path == "/metrics":
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
        op = route.path[4:]  # hit, peek, refund, reset
        req = _object(await _body(scope, receive), _FIELDS[op])
        return await self._decide(op, req)

    async def _decide(self, op: str, req: dict[str, Any]) -> tuple[int, Any, Headers]:
        engine = self.engine
        spec, key, cost = self._checked(req)
        if op == "hit" or op == "peek":
            over = 200 if op == "peek" else _over_limit_status(req, engine.config.over_limit_status)
            result = await engine.decide(op, spec, key, cost, f"{len(spec.name)}:{spec.name}:{key}")
            status = 200 if result.decision.allowed else over
            return status, _result_body(result), result.decision.header_lines(result.policy)
        if op == "refund":
            await engine.refund(spec, key, cost)
            return 200, {"refunded": cost, "policy": spec.name}, {}
        await engine.reset(spec, key)
        return 200, {"reset": True, "policy": spec.name}, {}

    def _checked(self, req: dict[str, Any]) -> tuple[PolicySpec, str, int]:
        """A decision request's policy, key and cost (1 when absent), or ``BadRequest``."""
        engine = self.engine
        config = engine.config
        name = req.get("policy")
        spec = None
        if type(name) is str and name not in engine.overrides:  # engine.spec's common case
            spec = config.policies.get(name)
        if spec is None:
            spec = engine.spec(name)
        key = req.get("key")
        if type(key) is not str or not key.isascii() or not 0 < len(key) <= config.max_key_length:
            if "key" not in req:
                raise BadRequest("key", "key is missing; expected a non-empty string")
            key = engine.check_key(key)  # the checks with their messages
        cost = req.get("cost", 1)
        if type(cost) is not int or not 1 <= cost <= MAX_COST:
            if isinstance(cost, float) and cost.is_integer():  # JSON Schema's integer: 2.0 is 2
                cost = int(cost)
            if isinstance(cost, bool) or not isinstance(cost, int) or not 1 <= cost <= MAX_COST:
                raise BadRequest("cost", f"cost {cost!r} is invalid; expected a whole number >= 1")
        return spec, key, cost

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


_PROM = "text/plain; version=0.0.4; charset=utf-8"


def openapi_document(max_key_length: int) -> bytes:
    """The OpenAPI document with this config's key length limit as ``maxLength`` on every
    ``key``, so a request valid by the document is one the service accepts."""
    doc = json.loads(OPENAPI.read_text())
    for schema in doc["components"]["schemas"].values():
        key = schema.get("properties", {}).get("key")
        if key is not None:
            key["maxLength"] = max_key_length
    return json.dumps(doc, indent=1, ensure_ascii=False).encode()


def check_bearer(given: str, expected: str) -> bool:
    """Constant-time token check (shared with the gRPC API)."""
    return _same(given.encode("latin-1", "replace"), expected)


def _same(given: bytes, expected: str) -> bool:
    return bool(expected) and hmac.compare_digest(given, expected.encode())


def _encode(status: int, body: Any, headers: Headers) -> Response:
    """A response: its body as bytes (JSON unless bytes already) and its header lines, with
    ``content-type`` (JSON unless given) and ``content-length``; names lower case."""
    payload = body if isinstance(body, bytes) else _dumps(body)
    if isinstance(headers, list):  # a decision's, encoded already
        raw = headers
        raw.append(_JSON)
    elif headers:
        raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        if "content-type" not in headers:
            raw.append(_JSON)
    else:
        raw = [_JSON]
    raw.append((b"content-length", b"%d" % len(payload)))
    return status, payload, raw


def _dumps(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":"), allow_nan=False).encode()


class Soon:
    """``decide_now``'s answer while the store's batch is out: once ``pending.future`` is done,
    ``answer()`` makes the response, as the coroutine ``decide_now`` returns otherwise would
    (an admitted decision's from the policy's plan, ``HttpHits.stored``). No task and no
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
            plan = self.pending.plan
            stored = self.pending.result()
            if isinstance(stored, Decision):  # the failure policy's
                result = api.engine.settle(spec, key, cost, stored)
            else:
                made = api.hits.stored(spec, key, cost, stored, plan.now_ms, self.block)
                if made is None:  # no plan: the general way
                    result = api.engine.settle(spec, key, cost, decide(plan, stored))
                elif isinstance(made, Result):
                    result = made
                else:
                    return 200, made[0], made[1]
            return _decision_response(result, self.over)
        except asyncio.CancelledError:
            return None
        except Exception as exc:
            return api._failed(exc, "POST", self.path)
        finally:
            api.in_flight -= 1


def _decision_response(result: Result, over: int) -> Response:
    """A decision's response: 200, or ``over`` when it is a rejection."""
    decision = result.decision
    raw = decision.header_lines(result.policy)
    raw.append(_JSON)
    payload = _result_body(result)
    raw.append((b"content-length", b"%d" % len(payload)))
    return (200 if decision.allowed else over), payload, raw


_INTERNAL = {"error": "internal error", "field": None}


def _over_limit_status(req: dict[str, Any], default: int) -> int:
    """The status a hit over its limit answers with: the request's ``over_limit_status`` or
    the config's ``limits.over_limit_status``. 200 by default: the call itself succeeded, and
    its answer is "no" (see docs/service.md, "Why over the limit is a 200")."""
    status = req.get("over_limit_status", default)
    if isinstance(status, bool) or status not in OVER_LIMIT_STATUSES:
        raise BadRequest(
            "over_limit_status", f"over_limit_status {status!r} is invalid; expected 200 or 429"
        )
    return int(status)


def _result_json(result: Result) -> dict[str, Any]:
    d = result.decision
    return {
        "allowed": d.allowed,
        "limit": d.limit,
        "remaining": d.remaining,
        "reset_at": d.reset_at,
        "retry_after": d.retry_after if math.isfinite(d.retry_after) else None,
        "policy": result.policy,
        "degraded": d.degraded,
        "shadow": result.shadow,
    }


def _result_body(result: Result) -> bytes:
    """``_result_json`` encoded as ``json.dumps`` would (compact), without building the dict:
    the body of every decision."""
    d = result.decision
    if not math.isfinite(d.reset_at):  # never from a store; json.dumps refuses it, as before
        return json.dumps(_result_json(result), separators=(",", ":"), allow_nan=False).encode()
    retry = d.retry_after
    return _RESULT % (
        b"true" if d.allowed else b"false",
        d.limit,
        d.remaining,
        float.__repr__(d.reset_at).encode(),
        float.__repr__(retry).encode() if math.isfinite(retry) else b"null",
        _json_string(result.policy),
        b"true" if d.degraded else b"false",
        b"true" if result.shadow else b"false",
    )


_RESULT = (
    b'{"allowed":%s,"limit":%d,"remaining":%d,"reset_at":%s,"retry_after":%s,'
    b'"policy":%s,"degraded":%s,"shadow":%s}'
)


@lru_cache(maxsize=1024)
def _json_string(text: str) -> bytes:
    return json.dumps(text).encode()


def _lease_json(lease: LeaseResult) -> dict[str, Any]:
    out: dict[str, Any] = {
        "acquired": lease.acquired,
        "lease": lease.lease,
        "limit": lease.limit,
        "in_use": lease.in_use,
        "expires_at": lease.expires_at,
        "policy": lease.policy,
        "degraded": lease.degraded,
        "shadow": lease.shadow,
    }
    if not lease.acquired:
        out["error"] = "concurrency_limited"
        out["message"] = (  # "secondary rate limit": GitHub's clients back off on it
            f"You have exceeded a secondary rate limit: {lease.limit} requests of this key are "
            f"already in progress under {lease.policy!r}; retry when one of them has finished"
        )
    return out


def _method(method: str, expected: str) -> None:
    if method != expected:
        raise BadRequest("method", f"method {method} is not allowed here; use {expected}", 405)


async def _body(scope: Scope, receive: Receive) -> bytes:
    message = await receive()
    if message["type"] == "http.request" and not message.get("more_body", False):
        body: bytes = message.get("body", b"")
        if len(body) <= MAX_BODY:  # the whole body, small: its length needs no other check
            return body
    return await _rest(scope, receive, message)


async def _rest(scope: Scope, receive: Receive, message: Message) -> bytes:
    """The body after its first message (its announced length was checked with the head)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        if message["type"] == "http.disconnect":
            raise BadRequest("body", "the client went away before sending the body")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            raise BadRequest("body", f"body is over the limit of {MAX_BODY} bytes", 413)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)
        message = await receive()


def _object(raw: bytes, fields: set[str]) -> dict[str, Any]:
    """The body as a JSON object of known fields, or ``BadRequest`` saying what is wrong."""
    value: Any = None
    if raw[:1] == b"{" and raw[-1:] == b"}" and len(raw) <= MAX_BODY:
        try:  # a UTF-8 object, read by the C scanner (json.loads builds a decoder per call)
            text = raw.decode()
            value, end = _SCAN(text, 0)
            if end != len(text):
                value = None
        except (ValueError, StopIteration, RecursionError):
            value = None
    if value is None:  # anything else through json.loads, so its messages stay the same
        value = _slow_object(raw)
    if not isinstance(value, dict):
        raise BadRequest("body", f"the body is a JSON {type(value).__name__}; expected an object")
    if value.keys() <= fields:  # the usual case, checked in C
        return value
    for name in value:
        if name not in fields:  # field "body": the client's text must not become a metric label
            shown = repr(name) if len(name) <= 60 else f"{name[:60]!r}... ({len(name)} chars)"
            expected = ", ".join(sorted(fields))
            raise BadRequest("body", f"unknown field {shown}; expected {expected}")
    return value


def _slow_object(raw: bytes) -> Any:
    if len(raw) > MAX_BODY:
        raise BadRequest("body", f"body is {len(raw)} bytes; the limit is {MAX_BODY}", 413)
    if not raw.strip():
        raise BadRequest("body", "the body is empty; expected a JSON object")
    try:
        return json.loads(raw, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise BadRequest("body", f"the body is not valid JSON: {exc}") from None


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number JSON allows")


_SCAN: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder(
    parse_constant=_no_constant
).scan_once  # type: ignore[attr-defined]  # set by JSONDecoder.__init__, missing in typeshed


def _optional_bool(req: dict[str, Any], name: str) -> bool | None:
    """An optional boolean field: absent is None; present, it must be true or false."""
    if name not in req:
        return None
    value = req[name]
    if not isinstance(value, bool):
        raise BadRequest(name, f"{name} {value!r} is invalid; expected true or false")
    return value


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
