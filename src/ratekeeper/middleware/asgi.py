"""``RateLimitMiddleware``: pure ASGI (no framework imported), for Starlette, FastAPI & co.

Non-HTTP scopes pass straight through. The gate's flow runs with ``AsyncLimiter``,
``AsyncConcurrencyLimiter`` and ``AsyncFleetUsageShedder`` over one store; a rejection is sent
by the middleware itself, an allowed response gets its headers by wrapping ``send``. Leases are
released and 304s refunded when the app returns — after the last body chunk of a streaming
response, or when it raises or is cancelled because the client went away (shielded from that
cancellation on asyncio, so the release itself is not cancelled).

Cancelled during admission (client gone, an outer timeout, shutdown): see ``AsyncRunner``;
what was granted is refunded and released before the cancellation goes on.

A ``NestedCheck`` with ``actual`` settles as soon as the response has ended: once the last
body chunk (``more_body=False``) has been sent, else (the client went away, the app raised or
was cancelled) when the app returns, shielded like every refund. Its ``costs.Usage`` (in the
scope under ``costs.USAGE_KEY``, where ``costs.report`` finds it) counts the body bytes each
way and keeps the response's status and headers.

The request's ``Admission`` is left in the scope (``gate.SCOPE_KEY``): a framework integration
walks a route's limits into it after routing (``admit_route``), and the headers are read when
the response starts, so they include those limits'.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping, Sequence
from typing import Any

from ..clock import Clock
from ..limiter import AsyncLimiter
from ..metrics.core import Metrics
from ..quotas.cache import Quotas
from ..stores.base import AsyncStore
from ..stores.memory import MemoryStore
from . import status as status_route
from .checks import ChargeWhen, Check, Controls
from .costs import USAGE_KEY, Usage
from .gate import SCOPE_KEY, Admission, Gate, Op, added_header_lines
from .request import PriorityFunc, RequestInfo, from_scope, trusted_networks, user_of
from .responses import Rejection
from .runner import AsyncRunner
from .status import check_status_path

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


_NAMES: dict[str, bytes] = {}


def _encode(headers: Iterable[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    out = []
    for name, value in headers:
        raw = _NAMES.get(name)
        if raw is None:
            raw = _NAMES[name] = name.lower().encode("latin-1")
        out.append((raw, value.encode("latin-1")))
    return out


class RateLimitMiddleware:
    """ASGI middleware running ``checks`` in order before the app (see ``ratekeeper.middleware``).

    ``store`` (default: a new ``MemoryStore``) must be an ``AsyncStore``, and an
    ``AsyncLeaseStore`` too when there are concurrency or fleet checks. ``trusted_proxies``
    (addresses or CIDR ranges of your load balancers, set once) is what every
    ``keys.client_ip()`` — the default key of every check — applies to ``X-Forwarded-For``.
    """

    def __init__(
        self,
        app: ASGIApp,
        checks: Iterable[Check] = (),
        *,
        store: Any = None,
        clock: Clock = time.time,
        controls: Controls | None = None,
        exempt: Iterable[str] = (),
        priority: PriorityFunc | None = None,
        refund_statuses: Iterable[int] = (304,),
        charge_when: ChargeWhen | None = None,
        log_interval: float = 60.0,
        trusted_proxies: Iterable[str] = (),
        metrics: Metrics | None = None,
        on_error: str = "open",
        quotas: Quotas | None = None,
        status_path: str | None = None,
        problem_details: bool = False,
    ) -> None:
        self.app = app
        self.status_path = check_status_path(status_path)
        self.trusted_proxies = trusted_networks(trusted_proxies)
        self.store: AsyncStore = MemoryStore() if store is None else store
        self.gate = Gate(
            checks,
            controls,
            exempt,
            priority,
            refund_statuses,
            clock,
            log_interval,
            charge_when=charge_when,
            metrics=metrics,
            on_error=on_error,
            quotas=quotas,
            problem_details=problem_details,
            asgi=True,
        )
        self.controls = self.gate.controls
        self.gate.store_label = repr(self.store)
        self.runner = AsyncRunner(self.gate, self.store, clock)
        self.limiter: AsyncLimiter = self.runner.limiter

    async def execute(self, op: Op) -> Any:
        """Run one of the gate's store operations (the WSGI twin serves ``simulate``)."""
        return await self.runner.execute(op)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        gate = self.gate
        request = from_scope(scope, self.trusted_proxies)
        if self.status_path is not None and request.path == self.status_path:
            await self._status(scope, send, request)
            return
        usage = None
        if gate.settling:
            usage = scope[USAGE_KEY] = Usage()
            receive = _counting(receive, usage)
        adm = scope[SCOPE_KEY] = Admission(request, usage)
        extra: list[tuple[bytes, bytes]] = []
        try:
            rejection = await self.runner.admit(request, adm)
            if rejection is not None:
                extra = _encode(rejection.headers)
        except Exception as exc:  # a bug in ratekeeper must not take the API down
            if gate.on_error == "raise":  # tests: see it
                raise
            gate.failed_open("ratekeeper", exc)
            rejection = adm.rejection = None  # fail open: the request goes through
        if rejection is not None:
            adm.request = None  # see the end
            await self.runner.finish(adm, rejection.status)
            start = {"type": "http.response.start", "status": rejection.status}
            await send({**start, "headers": extra})
            body = b"" if scope.get("method") == "HEAD" else rejection.body
            await send({"type": "http.response.body", "body": body})
            return
        if not adm.entered:  # exempt
            try:
                await self.app(scope, receive, send)
            finally:
                adm.request = None  # see the end
            return
        status: int | None = None

        async def send_with_headers(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                if usage is not None:
                    usage.status = status
                    usage.headers = _decoded(message.get("headers", ()))
                # read now: a route's limits may have joined the admission after routing
                if adm.best is not None or adm.rejection is not None or adm.busy:
                    try:
                        more = added_header_lines(adm)
                        headers = message.get("headers", ())
                        if adm.rejection is not None:  # the app answered it: keep what it sent
                            sent = {name.lower() for name, _ in headers}
                            more = [line for line in more if line[0] not in sent]
                    except Exception as exc:  # never break the app's response
                        gate.failed_open("ratekeeper", exc)
                    else:
                        message = {**message, "headers": [*headers, *more]}
            elif usage is not None and message["type"] == "http.response.body":
                usage.response_bytes += len(message.get("body", b""))
                if not message.get("more_body", False):
                    await send(message)
                    usage.completed = True
                    await self.runner.settle(adm, status)  # the response has ended
                    return
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        finally:
            # the scope holds the admission, which holds the request, which holds the scope:
            # broken here, so the request's objects go by reference counting rather than
            # as garbage for the cycle collector (which costs every request a share of it);
            # after finish, whose settles ask a check's ``actual`` about the request
            try:
                await self.runner.finish(adm, status)
            finally:
                adm.request = None

    async def _status(self, scope: Scope, send: Send, request: RequestInfo) -> None:
        """Answer the status route (``middleware.status``): GET or HEAD only, never charged."""
        if request.method not in ("GET", "HEAD"):
            status, headers, body = status_route.not_allowed()
        else:
            try:
                status, headers, body = await self.runner.status(request)
            except Exception as exc:  # a bug or a plan source's garbage: 503, logged
                if self.gate.on_error == "raise":  # tests: see it
                    raise
                self.gate.failed_open("ratekeeper", exc, count=False)
                status, headers, body = status_route.unavailable()
        start = {"type": "http.response.start", "status": status}
        await send({**start, "headers": _encode(headers)})
        body = b"" if request.method == "HEAD" else body
        await send({"type": "http.response.body", "body": body})

    async def admit_route(self, adm: Admission, positions: Sequence[int]) -> Rejection | None:
        """Walk a route's checks (``positions``, registered with ``gate.add``) into a request's
        admission after routing; return the rejection to answer with, if any. The hook of the
        framework integrations; this middleware adds the headers and finishes the request.
        The route's checks see the request as it is now: a user that an authentication
        middleware inside this one has put in the scope since is the request's user."""
        request = adm.request
        if request is None or not positions:
            return adm.rejection
        if request.user is None and "user" in request.raw:  # set inside us since: see it
            request = adm.request = dataclasses.replace(request, user=user_of(request.raw))
        return await self.runner.admit(request, adm, positions)

    def stats(self) -> dict[str, Any]:
        """Counters per check, requests in flight, the shedding checks' state (``shedding``),
        the limiter's store failures and the errors of the application's functions
        (``user_errors``: per check, per function kind)."""
        return {
            "checks": self.controls.stats(),
            "in_flight": self.gate.in_flight,
            "shedding": self.gate.shedding_stats(),
            "store": self.limiter.stats(),
            "user_errors": self.gate.user_error_stats(),
        }


def _counting(receive: Receive, usage: Usage) -> Receive:
    """``receive``, adding each request body chunk's bytes to ``usage``."""

    async def counted() -> Message:
        message = await receive()
        if message.get("type") == "http.request":
            usage.request_bytes += len(message.get("body", b""))
        return message

    return counted


def _decoded(headers: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """Response headers as ``Usage`` keeps them: lower-case names, latin-1 text, the last of a
    repeated name."""
    return {bytes(k).decode("latin-1").lower(): bytes(v).decode("latin-1") for k, v in headers}
