"""``WSGIRateLimitMiddleware``: pure WSGI (PEP 3333), for Flask, Django & co.

The gate's flow runs with ``Limiter``, ``ConcurrencyLimiter`` and ``FleetUsageShedder`` over one
store. A rejection is answered by the middleware; an allowed response gets its headers through a
wrapped ``start_response``. The app's iterable is wrapped so that leases are released and 304s
refunded when the server calls ``close()`` — after a streamed body, or when the client went away
— and at once if the app raises.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..admission import AdmissionQueue
from ..clock import Clock
from ..concurrency import ConcurrencyLimiter
from ..limiter import Limiter
from ..shedding import FleetUsageShedder
from ..stores.base import Store
from ..stores.memory import MemoryStore
from .checks import Check, Controls
from .gate import Admission, Gate, Op, run, split_checks
from .request import PriorityFunc, from_environ

StartResponse = Callable[..., Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


class _Finishing:
    """The app's response iterable, calling ``on_close`` once when the server closes it."""

    __slots__ = ("_on_close", "_result")

    def __init__(self, result: Iterable[bytes], on_close: Callable[[], None]) -> None:
        self._result = result
        self._on_close = on_close

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._result)

    def close(self) -> None:
        try:
            close = getattr(self._result, "close", None)
            if close is not None:
                close()
        finally:
            self._on_close()


class WSGIRateLimitMiddleware:
    """WSGI middleware running ``checks`` in order before the app (see ``ratekeeper.middleware``).

    ``store`` (default: a new ``MemoryStore``) must be a ``Store``, and a ``LeaseStore`` too
    when there are concurrency or fleet checks.
    """

    def __init__(
        self,
        app: WSGIApp,
        checks: Iterable[Check] = (),
        *,
        store: Any = None,
        clock: Clock = time.time,
        controls: Controls | None = None,
        exempt: Iterable[str] = (),
        priority: PriorityFunc | None = None,
        refund_statuses: Iterable[int] = (304,),
        log_interval: float = 60.0,
    ) -> None:
        self.app = app
        self.store: Store = MemoryStore() if store is None else store
        self.gate = Gate(checks, controls, exempt, priority, refund_statuses, clock, log_interval)
        self.controls = self.gate.controls
        self._admission = {i: AdmissionQueue(core) for i, core in self.gate.admissions.items()}
        self.limiter = Limiter(self.store, clock=clock)
        self._rates, self._leases, self._fleets = split_checks(
            self.gate.checks, self.store, clock, ConcurrencyLimiter, FleetUsageShedder
        )

    def _execute(self, op: Op) -> Any:
        kind = op.kind
        if kind == "hit" or kind == "refund":
            c = self._rates[op.position]
            call = self.limiter.hit if kind == "hit" else self.limiter.refund
            return call(
                op.key,
                c.rate,
                algorithm=c.algorithm,
                cost=op.cost,
                burst=c.burst,
                buckets=c.buckets,
            )
        if kind == "enter":
            return self._admission[op.position].enter(op.key, op.wait)
        if kind == "leave":
            return self._admission[op.position].release(op.ticket)
        if kind == "acquire":
            return self._leases[op.position].acquire(op.key)
        if kind == "admit":
            return self._fleets[op.position].admit(op.critical)
        holder = self._leases.get(op.position) or self._fleets[op.position]
        return holder.release(op.lease)

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        gate = self.gate
        adm = Admission()
        try:
            run(gate.admit(from_environ(environ), adm), self._execute)
        except Exception as exc:  # a bug in ratekeeper must not take the API down
            gate.failed_open("ratekeeper", exc)
        rejection = adm.rejection
        if rejection is not None:
            self._finish(adm, rejection.status)
            start_response(rejection.status_line, list(rejection.headers))
            return [b"" if environ.get("REQUEST_METHOD") == "HEAD" else rejection.body]
        if not adm.entered:  # exempt
            return self.app(environ, start_response)
        extra = list(adm.headers)
        status: list[int | None] = [None]

        def start_with_headers(line: str, headers: list[tuple[str, str]], *exc_info: Any) -> Any:
            try:
                status[0] = int(line[:3])
            except ValueError:
                status[0] = None
            return start_response(line, [*headers, *extra] if extra else headers, *exc_info)

        try:
            result = self.app(environ, start_with_headers)
        except BaseException:
            self._finish(adm, None)
            raise
        return _Finishing(result, lambda: self._finish(adm, status[0]))

    def _finish(self, adm: Admission, status: int | None) -> None:
        gate = self.gate
        for op in gate.finish(adm, status):
            try:
                self._execute(op)
            except Exception as exc:
                gate.finish_failed(op, exc)

    def stats(self) -> dict[str, Any]:
        """Counters per check, requests in flight, and the limiter's store failures."""
        return {
            "checks": self.controls.stats(),
            "in_flight": self.gate.in_flight,
            "shedding": self.gate.shedding_stats(),
            "store": self.limiter.stats(),
        }
