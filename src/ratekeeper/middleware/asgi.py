"""``RateLimitMiddleware``: pure ASGI (no framework imported), for Starlette, FastAPI & co.

Non-HTTP scopes pass straight through. The gate's flow runs with ``AsyncLimiter``,
``AsyncConcurrencyLimiter`` and ``AsyncFleetUsageShedder`` over one store; a rejection is sent
by the middleware itself, an allowed response gets its headers by wrapping ``send``. Leases are
released and 304s refunded when the app returns — after the last body chunk of a streaming
response, or when it raises or is cancelled because the client went away (shielded from that
cancellation on asyncio, so the release itself is not cancelled).

Cancelled during admission (client gone, an outer timeout, shutdown): on asyncio each store
call of the admission runs as a shielded task, so the call in flight completes; what it and the
earlier checks granted is then refunded and released (``Gate.abort``) before the cancellation
goes on. A store without I/O (``LocalStore``: the memory store) is never suspended mid-call,
so its calls run inline.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, MutableMapping
from typing import Any

from ..admission import AsyncAdmissionQueue
from ..clock import Clock
from ..concurrency import AsyncConcurrencyLimiter
from ..limiter import AsyncLimiter
from ..metrics.core import Metrics
from ..shedding import AsyncFleetUsageShedder
from ..stores.base import AsyncStore, LocalStore
from ..stores.memory import MemoryStore
from .checks import Check, Controls
from .gate import Admission, Failure, Gate, Op, run_async, split_checks
from .request import PriorityFunc, from_scope, trusted_networks

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


def _on_asyncio() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


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
        log_interval: float = 60.0,
        trusted_proxies: Iterable[str] = (),
        metrics: Metrics | None = None,
    ) -> None:
        self.app = app
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
            metrics,
            asgi=True,
        )
        self.controls = self.gate.controls
        self.gate.store_label = repr(self.store)
        self._admission = {i: AsyncAdmissionQueue(core) for i, core in self.gate.admissions.items()}
        self.limiter = AsyncLimiter(self.store, clock=clock, metrics=metrics, count_decisions=False)
        self._rates, self._leases, self._fleets = split_checks(
            self.gate.checks,
            self.store,
            clock,
            AsyncConcurrencyLimiter,
            AsyncFleetUsageShedder,
            metrics,
        )
        self._inline = isinstance(self.store, LocalStore)

    async def _execute(self, op: Op) -> Any:
        kind = op.kind
        if kind == "hit" or kind == "refund":
            c = self._rates[op.position]
            call = self.limiter.hit if kind == "hit" else self.limiter.refund
            return await call(
                op.key,
                c.rate,
                algorithm=c.algorithm,
                cost=op.cost,
                burst=c.burst,
                buckets=c.buckets,
            )
        if kind == "enter":
            return await self._admission[op.position].enter(op.key, op.wait)
        if kind == "leave":
            return self._admission[op.position].release(op.ticket)
        if kind == "acquire":
            return await self._leases[op.position].acquire(op.key)
        if kind == "admit":
            return await self._fleets[op.position].admit(op.critical)
        holder = self._leases.get(op.position) or self._fleets[op.position]
        return await holder.release(op.lease)

    async def execute(self, op: Op) -> Any:
        """Run one of the gate's store operations (the WSGI twin serves ``simulate``)."""
        return await self._execute(op)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        gate = self.gate
        adm = Admission()
        extra: list[tuple[bytes, bytes]] = []
        try:
            await self._admit(scope, adm)
            rejection = adm.rejection
            extra = _encode(adm.headers if rejection is None else rejection.headers)
        except Exception as exc:  # a bug in ratekeeper must not take the API down
            gate.failed_open("ratekeeper", exc)
            rejection = adm.rejection = None  # fail open: the request goes through
        if rejection is not None:
            await self._finish(adm, rejection.status)
            start = {"type": "http.response.start", "status": rejection.status}
            await send({**start, "headers": extra})
            body = b"" if scope.get("method") == "HEAD" else rejection.body
            await send({"type": "http.response.body", "body": body})
            return
        if not adm.entered:  # exempt
            await self.app(scope, receive, send)
            return
        status: int | None = None

        async def send_with_headers(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                if extra:
                    message = {**message, "headers": [*message.get("headers", ()), *extra]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        finally:
            await self._finish(adm, status)

    async def _admit(self, scope: Scope, adm: Admission) -> None:
        """Run the gate's flow; cancelled mid-way, give back what it was granted (module
        docstring) and let the cancellation go on."""
        flight: list[tuple[Op, asyncio.Future[Any]]] = []
        execute = self._execute
        if not self._inline and _on_asyncio():

            async def execute(op: Op) -> Any:
                if op.kind == "enter":  # no store call; a cancelled wait cleans up after itself
                    return await self._execute(op)
                task = asyncio.ensure_future(self._execute(op))
                flight.append((op, task))
                result = await asyncio.shield(task)
                flight.clear()
                return result

        try:
            await run_async(self.gate.admit(from_scope(scope, self.trusted_proxies), adm), execute)
        except Exception:
            raise
        except BaseException:  # cancelled: CancelledError, or another library's cancellation
            await self._shielded(self._abort(adm, flight))
            raise

    async def _abort(self, adm: Admission, flight: list[tuple[Op, asyncio.Future[Any]]]) -> None:
        op = result = None
        if flight:  # the store call in flight goes on: wait for what it granted
            op, task = flight[0]
            try:
                result = await task
            except Exception as exc:
                result = Failure(exc)
            except BaseException:  # the call itself was cancelled: it granted nothing we know
                result = None
        await self._run_ops(self.gate.abort(adm, op, result))

    async def _finish(self, adm: Admission, status: int | None) -> None:
        ops = self.gate.finish(adm, status)
        if ops:
            await self._shielded(self._run_ops(ops))

    @staticmethod
    async def _shielded(work: Coroutine[Any, Any, None]) -> None:
        """Await ``work`` shielded from cancellation: inside a cancelled task or anyio scope
        (client gone), an unshielded await would be cancelled again before the lease is
        released or the charge refunded. Not asyncio (trio): no shield to use."""
        if _on_asyncio():
            await asyncio.shield(work)
        else:
            await work

    async def _run_ops(self, ops: list[Op]) -> None:
        for op in ops:
            try:
                await self._execute(op)
            except Exception as exc:
                self.gate.finish_failed(op, exc)

    def stats(self) -> dict[str, Any]:
        """Counters per check, requests in flight, and the limiter's store failures."""
        return {
            "checks": self.controls.stats(),
            "in_flight": self.gate.in_flight,
            "shedding": self.gate.shedding_stats(),
            "store": self.limiter.stats(),
        }
