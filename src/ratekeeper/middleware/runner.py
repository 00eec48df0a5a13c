"""A gate's store operations carried out: ``Runner`` (sync limiters) and ``AsyncRunner`` (async).

What the ASGI and WSGI middleware and the framework integrations drive: ``admit`` walks a
request's checks (all of the gate's, or a route's positions) into its admission, failing open
on any error; ``finish`` runs the refunds and releases that end it.

Cut short (a ``BaseException``: asyncio or anyio cancellation when the client goes away, an
outer timeout, shutdown; a gevent timeout, ``KeyboardInterrupt``), ``admit`` ends the admission
with ``Gate.abort`` — what it was granted is refunded and released — before the exception goes
on. On asyncio each store call of the admission runs as a shielded task, so the call in flight
completes and what it granted is given back too; a store without I/O (``LocalStore``: the
memory store) is never suspended mid-call, so its calls run inline. A sync store call
interrupted mid-flight cannot say what it granted: such a lease expires after its
``lease_ttl``. An ``AdmissionCheck``'s ``enter`` is no store call: its queue
cleans up a cancelled wait itself, so it is never shielded. One ``_dispatch`` maps an
``Op`` to a limiter call for both: the sync runner returns its result, the async one awaits it,
so the two differ only where ``await`` appears. Several runners may share one gate (Django
serves sync and async requests in one process); each builds its limiters on first use.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, TypeVar

from ..clock import Clock
from ..decision import Decision
from ..errors import StoreUnavailable
from ..limiter import AsyncLimiter, Limiter, store_name
from ..metrics.core import Metrics
from ..overload.admission import AdmissionQueue, AsyncAdmissionQueue
from ..overload.concurrency import AsyncConcurrencyLimiter, ConcurrencyLimiter
from ..overload.shedding import AsyncFleetUsageShedder, FleetUsageShedder
from ..stores.base import LocalStore
from . import status as status_route
from .checks import Check, ConcurrencyCheck, FleetCheck, RateCheck
from .gate import Admission, Failure, Gate, Op, UserFunctionError, run, run_async
from .ops import Flow
from .request import RequestInfo
from .responses import Rejection

_Lease = TypeVar("_Lease")
_Fleet = TypeVar("_Fleet")


_NESTED = frozenset({"nest", "unnest", "reserve", "settle", "cancel"})


class _ByPosition(dict[int, Any]):
    """Live objects per check position, built on first use (checks can be added later)."""

    def __init__(self, build: Callable[[int], Any]) -> None:
        super().__init__()
        self._build = build

    def __missing__(self, position: int) -> Any:
        value = self[position] = self._build(position)
        return value


def split_checks(
    checks: Sequence[Check],
    store: Any,
    clock: Clock,
    lease_class: Callable[..., _Lease],
    fleet_class: Callable[..., _Fleet],
    metrics: Metrics | None = None,
) -> tuple[dict[int, RateCheck], dict[int, _Lease], dict[int, _Fleet]]:
    """Index checks by position: rate configs, and one limiter per lease-based check, built on
    ``store`` (also a lease store when such checks exist; the limiters check that).

    ``checks`` is the gate's live list: the maps look a position up there on first use, so a
    check added after the middleware was built works too. The checks present now are built at
    once, so a store that cannot hold leases fails at startup. The two runners pass their
    async or sync classes, whose constructors match. ``metrics`` watches the lease limiters'
    breakers.
    """

    def watch(limiter: Any) -> None:
        if metrics is not None:
            metrics.watch_breakers(limiter.breaker_states, store_name(store), "lease")

    def rate(position: int) -> RateCheck:
        c = checks[position]
        if not isinstance(c, RateCheck):
            raise KeyError(position)
        return c

    def lease(position: int) -> _Lease:
        c = checks[position]
        if not isinstance(c, ConcurrencyCheck):
            raise KeyError(position)
        limiter = lease_class(store, c.capacity, c.lease_ttl, clock=clock)
        watch(limiter)
        return limiter

    def fleet(position: int) -> _Fleet:
        c = checks[position]
        if not isinstance(c, FleetCheck):
            raise KeyError(position)
        shedder = fleet_class(
            store, c.capacity, c.reserved_for_critical, c.lease_ttl, key=c.name, clock=clock
        )
        watch(getattr(shedder, "limiter", None))  # both shedder classes have one
        return shedder

    rates, leases, fleets = _ByPosition(rate), _ByPosition(lease), _ByPosition(fleet)
    for i, c in enumerate(checks):  # now: a store that cannot hold leases fails at startup
        if isinstance(c, ConcurrencyCheck):
            leases[i] = lease(i)
        elif isinstance(c, FleetCheck):
            fleets[i] = fleet(i)
    return rates, leases, fleets


class _Base:
    """The limiters of one runner and the mapping from operations to their calls."""

    def __init__(
        self,
        gate: Gate,
        store: Any,
        clock: Clock,
        limiter_class: Callable[..., Any],
        lease_class: Callable[..., Any],
        fleet_class: Callable[..., Any],
        queue_class: Callable[..., Any],
    ) -> None:
        self.gate = gate
        self.store = store
        metrics = gate.metrics  # the gate counts decisions: the limiter only times store calls
        self.limiter = limiter_class(
            store, clock=clock, metrics=metrics, count_decisions=False, quotas=gate.quotas
        )
        self._rates, self._leases, self._fleets = split_checks(
            gate.checks, store, clock, lease_class, fleet_class, metrics
        )
        # admission queues over the gate's queue states (shared by the runners of one gate)
        self._queues = _ByPosition(lambda position: queue_class(gate.admissions[position]))

    def _ending(self, adm: Admission, status: int | None) -> list[Op]:
        """The gate's refunds and releases for ``adm``; an error (a bug, a charge predicate
        that raised) is logged and ends nothing: the response is already on its way."""
        try:
            return self.gate.finish(adm, status)
        except Exception as exc:
            if self.gate.on_error == "raise":
                raise
            self.gate.failed_open("ratekeeper", exc, count=False)
            return []

    def _settling(self, adm: Admission, status: int | None) -> list[Op]:
        """The gate's settles for ``adm``; an error is logged and settles nothing (the
        reservations then expire: their estimates come back)."""
        try:
            return self.gate.settle(adm, status)
        except Exception as exc:
            self.gate.failed_open("ratekeeper", exc, count=False)
            return []

    def _dispatch(self, op: Op) -> Any:
        """The limiter call for ``op``: its result (sync) or an awaitable of it (async)."""
        kind = op.kind
        if kind == "hit" or kind == "refund":
            c = self._rates[op.position]
            call = self.limiter.hit if kind == "hit" else self.limiter.refund
            return call(
                op.key, op.rate, algorithm=c.algorithm, cost=op.cost, burst=c.burst,
                buckets=c.buckets,
            )  # fmt: skip
        if kind in _NESTED:
            return self._nested(op)
        if kind == "enter":
            return self._queues[op.position].enter(op.key, op.wait)
        if kind == "leave":
            return self._queues[op.position].leave(op.ticket)
        if kind == "acquire":  # the lease and the requests in progress (for the headers)
            return self._leases[op.position].acquire_counted(op.key)
        if kind == "admit":
            return self._fleets[op.position].admit(op.critical)
        holder = self._leases.get(op.position) or self._fleets[op.position]
        return holder.release(op.lease)

    def _nested(self, op: Op) -> Any:
        """A ``NestedCheck``'s call (``op.rate`` holds the request's levels)."""
        limiter, kind = self.limiter, op.kind
        if kind == "nest":
            return limiter.nested(op.rate, cost=op.cost)
        if kind == "unnest":
            return limiter.refund_nested(op.rate, cost=op.cost)
        if kind == "reserve":
            check = self.gate.checks[op.position]
            return limiter.reserve(op.rate, op.cost, ttl=check.ttl)  # type: ignore[union-attr]  # a NestedCheck's op
        if kind == "settle":
            return limiter.settle(op.reservation, op.actual)
        return limiter.cancel(op.reservation)


class Runner(_Base):
    """Sync: ``Limiter``, ``ConcurrencyLimiter`` and ``FleetUsageShedder`` over ``store``."""

    def status(self, request: RequestInfo) -> status_route.Response:
        """The status route's answer for ``request`` (``middleware.status``)."""
        rows: list[dict[str, Any]] = []
        tenants: dict[str, Any] = {}
        try:
            for t in status_route.targets(self.gate, request):
                if t.limit:
                    if t.key not in tenants:
                        tenants[t.key] = self.limiter.status(t.key)
                    rows += status_route.plan_rows(t, tenants[t.key])
                else:
                    c = t.check
                    d = self.limiter.peek(
                        t.key, t.rate, algorithm=c.algorithm, burst=c.burst,
                        buckets=c.buckets, cost=0,
                    )  # fmt: skip
                    rows.append(status_route.decision_row(t, d))
        except StoreUnavailable:
            return status_route.unavailable()
        return status_route.render(rows)

    def __init__(self, gate: Gate, store: Any, clock: Clock) -> None:
        super().__init__(
            gate, store, clock, Limiter, ConcurrencyLimiter, FleetUsageShedder, AdmissionQueue
        )

    def execute(self, op: Op) -> Any:
        """Carry out one operation."""
        return self._dispatch(op)

    def admit(
        self, request: RequestInfo, adm: Admission, positions: Sequence[int] | None = None
    ) -> Rejection | None:
        """Walk the checks (``positions``, default the gate's ``every``) into ``adm``; return
        the rejection, if any. An error lets the request through (counted, logged)."""
        if adm.rejection is not None:
            return adm.rejection
        if not (self.gate.every if positions is None else positions):
            self.gate.enter(request, adm)  # nothing to walk: no flow to run
            return None
        try:
            run(self.gate.admit(request, adm, positions), self._dispatch)
        except Exception as exc:  # a bug in ratekeeper must not take the API down
            if self.gate.on_error == "raise":  # tests: see it
                raise
            self.gate.failed_open("ratekeeper", exc)
        except BaseException:  # interrupted (module docstring): give back what was granted
            self._run_ops(self.gate.abort(adm))
            raise
        return adm.rejection

    def finish(self, adm: Admission, status: int | None) -> None:
        """Refund and release what ends the request (once); failures are logged."""
        self._run_ops(self._ending(adm, status))

    def settle(self, adm: Admission, status: int | None) -> None:
        """Settle the request's reservations now (the response has ended; once)."""
        self._run_ops(self._settling(adm, status))

    def peek(self, request: RequestInfo, position: int) -> Decision | None:
        """The rate check at ``position``'s decision for ``request`` without charging it;
        None where it does not apply or could not be asked (an error: see ``Gate``)."""
        check = self._rates[position]
        try:
            op = self.gate.rate_op(position, check, request)
            if op is None:
                return None
            decision: Decision = self.limiter.peek(
                op.key, op.rate, algorithm=check.algorithm, cost=op.cost, burst=check.burst,
                buckets=check.buckets,
            )  # fmt: skip
        except UserFunctionError as err:
            self.gate.user_failed(check.name, err, count=False)
            return None
        return None if decision.degraded else decision

    def _run_ops(self, ops: list[Op]) -> None:
        for op in ops:
            try:
                self._dispatch(op)
            except Exception as exc:
                self.gate.finish_failed(op, exc)


class AsyncRunner(_Base):
    """Async: ``AsyncLimiter``, ``AsyncConcurrencyLimiter`` and ``AsyncFleetUsageShedder``."""

    def __init__(self, gate: Gate, store: Any, clock: Clock) -> None:
        super().__init__(
            gate,
            store,
            clock,
            AsyncLimiter,
            AsyncConcurrencyLimiter,
            AsyncFleetUsageShedder,
            AsyncAdmissionQueue,
        )
        self._inline = isinstance(store, LocalStore)

    async def execute(self, op: Op) -> Any:
        """Carry out one operation."""
        return await self._dispatch(op)

    async def status(self, request: RequestInfo) -> status_route.Response:
        """See ``Runner.status``."""
        rows: list[dict[str, Any]] = []
        tenants: dict[str, Any] = {}
        try:
            for t in status_route.targets(self.gate, request):
                if t.limit:
                    if t.key not in tenants:
                        tenants[t.key] = await self.limiter.status(t.key)
                    rows += status_route.plan_rows(t, tenants[t.key])
                else:
                    c = t.check
                    d = await self.limiter.peek(
                        t.key, t.rate, algorithm=c.algorithm, burst=c.burst,
                        buckets=c.buckets, cost=0,
                    )  # fmt: skip
                    rows.append(status_route.decision_row(t, d))
        except StoreUnavailable:
            return status_route.unavailable()
        return status_route.render(rows)

    async def admit(
        self, request: RequestInfo, adm: Admission, positions: Sequence[int] | None = None
    ) -> Rejection | None:
        """Walk the checks (``positions``, default the gate's ``every``) into ``adm``; return
        the rejection, if any. An error lets the request through (counted, logged)."""
        if adm.rejection is not None:
            return adm.rejection
        if not (self.gate.every if positions is None else positions):
            self.gate.enter(request, adm)  # nothing to walk: no flow to run
            return None
        flight: list[tuple[Op, asyncio.Future[Any]]] = []
        execute: Callable[[Op], Awaitable[Any]] = self._dispatch
        if not self._inline and _on_asyncio():

            async def execute(op: Op) -> Any:
                if op.kind == "enter":  # no store call; a cancelled wait cleans up after itself
                    return await self._dispatch(op)
                task = asyncio.ensure_future(self._dispatch(op))
                flight.append((op, task))
                result = await asyncio.shield(task)
                flight.clear()
                return result

        try:
            if self._inline:
                await self._run_inline(self.gate.admit(request, adm, positions))
            else:
                await run_async(self.gate.admit(request, adm, positions), execute)
        except Exception as exc:  # a bug in ratekeeper must not take the API down
            if self.gate.on_error == "raise":  # tests: see it
                raise
            self.gate.failed_open("ratekeeper", exc)
        except BaseException:  # cancelled (module docstring): give back what was granted
            await _shielded(self._abort(adm, flight))
            raise
        return adm.rejection

    async def _run_inline(self, flow: Flow) -> None:
        """Drive ``flow`` on an in-process store: a rate ``hit`` is decided at once
        (``AsyncLimiter.hit_now``: the same decision, without a coroutine), anything else is
        awaited as ``run_async`` would."""
        hit_now = self.limiter.hit_now
        rates = self._rates
        try:
            op = next(flow)
            while True:
                try:
                    result = None
                    if op.kind == "hit":
                        c = rates[op.position]
                        result = hit_now(op.key, op.rate, c.algorithm, op.cost, c.burst, c.buckets)
                    if result is None:
                        result = await self._dispatch(op)
                except Exception as exc:
                    result = Failure(exc)
                op = flow.send(result)
        except StopIteration:
            return

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

    async def finish(self, adm: Admission, status: int | None) -> None:
        """Refund and release what ends the request (once); failures are logged. Shielded on
        asyncio: inside a cancelled task or anyio scope (client gone), an unshielded await
        would be cancelled again before the lease is released or the charge refunded."""
        ops = self._ending(adm, status)
        if ops:
            await _shielded(self._run_ops(ops))

    async def settle(self, adm: Admission, status: int | None) -> None:
        """Settle the request's reservations now (the response has ended; once), shielded as
        ``finish`` is."""
        ops = self._settling(adm, status)
        if ops:
            await _shielded(self._run_ops(ops))

    async def _run_ops(self, ops: list[Op]) -> None:
        for op in ops:
            try:
                await self._dispatch(op)
            except Exception as exc:
                self.gate.finish_failed(op, exc)


def _on_asyncio() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


async def _shielded(work: Coroutine[Any, Any, None]) -> None:
    """Await ``work`` shielded from cancellation: inside a cancelled task or anyio scope (client
    gone), an unshielded await would be cancelled again before the lease is released or the
    charge refunded. Not asyncio (trio): no shield to use."""
    if _on_asyncio():
        await asyncio.shield(work)
    else:
        await work
