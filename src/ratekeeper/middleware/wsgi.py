"""``WSGIRateLimitMiddleware``: pure WSGI (PEP 3333), for Flask, Django & co.

The gate's flow runs with ``Limiter``, ``ConcurrencyLimiter`` and ``FleetUsageShedder`` over one
store. A rejection is answered by the middleware; an allowed response gets its headers through a
wrapped ``start_response``. The app's iterable is wrapped so that leases are released and 304s
refunded when the server calls ``close()`` — after a streamed body, or when the client went away
— and at once if the app raises. An admission interrupted by a ``BaseException`` (a gevent or
eventlet timeout, ``KeyboardInterrupt``, ``SystemExit``) is ended with ``Gate.abort``: what it
was granted is refunded and released before the exception goes on. (A store call interrupted
mid-flight cannot say what it granted: such a lease expires after its ``lease_ttl``.)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..admission import AdmissionQueue
from ..clock import Clock
from ..concurrency import ConcurrencyLimiter
from ..limiter import Limiter
from ..metrics.core import Metrics
from ..shedding import FleetUsageShedder
from ..stores.base import Store
from ..stores.memory import MemoryStore
from .checks import Check, Controls
from .gate import Admission, Gate, Op, run, split_checks
from .request import PriorityFunc, from_environ, trusted_networks

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


def _latin1(headers: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """Header pairs checked to be what PEP 3333 allows (latin-1 text): a value that is not
    raises here, inside the fail-open guard, rather than in the server."""
    out = list(headers)
    for name, value in out:
        name.encode("latin-1")
        value.encode("latin-1")
    return out


class WSGIRateLimitMiddleware:
    """WSGI middleware running ``checks`` in order before the app (see ``ratekeeper.middleware``).

    ``store`` (default: a new ``MemoryStore``) must be a ``Store``, and a ``LeaseStore`` too
    when there are concurrency or fleet checks. ``trusted_proxies`` (addresses or CIDR ranges
    of your load balancers, set once) is what every ``keys.client_ip()`` — the default key of
    every check — applies to ``X-Forwarded-For``.
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
        trusted_proxies: Iterable[str] = (),
        metrics: Metrics | None = None,
    ) -> None:
        self.app = app
        self.trusted_proxies = trusted_networks(trusted_proxies)
        self.store: Store = MemoryStore() if store is None else store
        self.gate = Gate(
            checks, controls, exempt, priority, refund_statuses, clock, log_interval, metrics
        )
        self.controls = self.gate.controls
        self.gate.store_label = repr(self.store)
        self._admission = {i: AdmissionQueue(core) for i, core in self.gate.admissions.items()}
        self.limiter = Limiter(self.store, clock=clock, metrics=metrics, count_decisions=False)
        self._rates, self._leases, self._fleets = split_checks(
            self.gate.checks, self.store, clock, ConcurrencyLimiter, FleetUsageShedder, metrics
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

    def execute(self, op: Op) -> Any:
        """Run one of the gate's store operations (``ratekeeper simulate`` drives the gate)."""
        return self._execute(op)

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        gate = self.gate
        adm = Admission()
        extra: list[tuple[str, str]] = []
        try:
            run(gate.admit(from_environ(environ, self.trusted_proxies), adm), self._execute)
            rejection = adm.rejection
            extra = _latin1(adm.headers if rejection is None else rejection.headers)
        except Exception as exc:  # a bug in ratekeeper must not take the API down
            gate.failed_open("ratekeeper", exc)
            rejection = adm.rejection = None  # fail open: the request goes through
        except BaseException:  # interrupted (module docstring): give back what was granted
            self._run_ops(gate.abort(adm))
            raise
        if rejection is not None:
            self._finish(adm, rejection.status)
            start_response(rejection.status_line, extra)
            return [b"" if environ.get("REQUEST_METHOD") == "HEAD" else rejection.body]
        if not adm.entered:  # exempt
            return self.app(environ, start_response)
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
        self._run_ops(self.gate.finish(adm, status))

    def _run_ops(self, ops: list[Op]) -> None:
        for op in ops:
            try:
                self._execute(op)
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
