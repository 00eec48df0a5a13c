"""The admission logic both middlewares share, written once as generators (sans-I/O).

``Gate.admit(request, admission)`` walks the checks in order and *yields* each store operation
(``Op``) it needs — a rate ``hit``, a lease ``acquire``, a fleet ``admit`` — receiving the
result (or a ``Failure``) back; ``Gate.finish(admission, status)`` returns the ``refund`` and
``release`` operations that end a request, as a list. ``runner.Runner`` drives the flow with
``run`` and sync limiters, ``runner.AsyncRunner`` with ``run_async`` and async ones: the two
differ only where ``await`` appears (the pattern of httpx's ``auth_flow``).

Rules:
- a check in mode ``off`` is skipped; in ``shadow`` it decides and is counted, but never rejects
  and never adds headers;
- any exception — in a key function, the store, or a degraded (fail-open) answer — lets the
  request through that check, counted as ``failed_open`` and logged once per ``log_interval``;
  the first store failure of the process is logged at ERROR, naming the store's address
  (``store_label``, never a password);
- an error in one of the application's functions — a check's key, rate or cost function, the
  priority function, a ``charge_when`` — is a bug, not an outage: the first from each function
  is logged at ERROR with its traceback, every one is counted (``user_errors``, and
  ``ratekeeper_user_function_errors`` with ``metrics``), and the request goes through that
  check as for any error; with ``on_error="raise"`` (for tests) the exception is raised out of
  the middleware instead. A rate function that returns something that is not a rate, or a cost
  function something that is not a whole number >= 1, has erred too;
- the first enforced rejection stops the walk; charges already made are refunded and leases
  released, so a rejected request consumes nothing;
- an allowed response carries the headers of the enforced rate decision with least remaining
  (a ``NestedCheck``'s: its deciding level's), and a ``ConcurrencyCheck``'s quota as
  ``RateLimit-Policy``/``RateLimit`` items in ``qu="concurrent-requests"``;
- a ``NestedCheck`` charges all its levels or none (``hit``-like ``nest`` operations); one
  with ``actual`` reserves its estimate (``reserve``) and ``settle`` ends it with the actual
  cost once the response has ended (``settle`` may run before ``finish``: the ASGI middleware
  settles on the last body chunk); a refund of a nested charge is ``unnest``, of a
  reservation ``cancel``;
- a charge stays only if the check's ``charge_when`` (else the gate's) says so for the
  response's status; by default every status but those in ``refund_statuses`` (304) is charged;
- the checks given to the constructor run for every request; checks registered later with
  ``add`` (a framework's per-route limits) run only where a caller names their positions, in
  the same admission, so one request has one set of headers and one rule for giving back; a
  position named again for the same admission is walked once (``Admission.walked``), whoever
  names it (a route's step, an endpoint's guard, a decorator's wrapper).
- an ``AdmissionCheck`` takes a slot (``enter``: the runner may wait in its queue) and the
  request gives it back first when it ends (``leave``); a ``WorkerCheck`` without a shedder
  gets one on its server type's signal (``asgi``);
- an admission cut short (the request cancelled or interrupted mid-walk: client gone, timeout,
  shutdown) ends with ``abort``: what was granted so far, and what the store call in flight
  granted when the driver could wait for it, is refunded and released;
- with ``metrics``, every count above is also a decision of the check's name in
  ``ratekeeper_decisions`` (``failed_open`` as ``degraded``, ``skipped`` as ``disabled``), a
  rejection's key feeds the top-keys sketch, and requests in flight and the worker shedders'
  drop probabilities are watched.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Generator, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ..clock import Clock
from ..decision import Decision
from ..errors import ConfigError, StoreUnavailable
from ..metrics.core import Metrics
from ..overload.admission import AdmissionCore
from ..overload.concurrency import Lease
from ..overload.shedding import ShedderSettings, WorkerUtilizationShedder
from ..overload.signals import LoopLag, ProcessCPU, Signal, parse_request_start, worst
from ..rates import to_rates
from .admission import SCOPE_KEY as SCOPE_KEY
from .admission import Admission as Admission
from .admission import added_header_lines as added_header_lines
from .admission import added_headers as added_headers
from .checks import (
    CHECK_TYPES,
    AdmissionCheck,
    ChargeWhen,
    Check,
    ConcurrencyCheck,
    Controls,
    FleetCheck,
    NestedCheck,
    RateCheck,
    WorkerCheck,
)
from .ending import Ending
from .functions import ON_ERROR as ON_ERROR
from .functions import UserFunctionError as UserFunctionError
from .functions import call as call
from .functions import check_on_error as check_on_error
from .nested_checks import nested_walk
from .ops import Degraded, Flow, unwrap
from .ops import Failure as Failure
from .ops import Op as Op
from .ops import run as run
from .ops import run_async as run_async
from .request import PathMatcher, PriorityFunc, RequestInfo, priorities
from .responses import (
    Rejection,
    concurrency_rejection,
    rate_rejection,
    shed_rejection,
    wants_problem,
)

if TYPE_CHECKING:
    from ..quotas.cache import Quotas

log = logging.getLogger("ratekeeper")

OUTCOME = {
    "allowed": "allowed",
    "rejected": "rejected",
    "shadow_rejected": "shadow_rejected",
    "failed_open": "degraded",
    "skipped": "disabled",
}
"""A ``Controls`` counter -> its ``ratekeeper_decisions`` outcome."""


class Gate(Ending):
    """Checks, controls, exemptions, priorities and refund rules of one middleware."""

    def __init__(
        self,
        checks: Iterable[Check],
        controls: Controls | None,
        exempt: Iterable[str],
        priority: PriorityFunc | None,
        refund_statuses: Iterable[int],
        clock: Clock,
        log_interval: float,
        charge_when: ChargeWhen | None = None,
        metrics: Metrics | None = None,
        *,
        asgi: bool = False,
        on_error: str = "open",
        quotas: Quotas | None = None,
        problem_details: bool = False,
    ) -> None:
        if isinstance(checks, CHECK_TYPES):
            checks = [checks]
        checks = list(checks)
        names = [getattr(c, "name", None) for c in checks]
        dupes = sorted({n for n in names if names.count(n) > 1 and isinstance(n, str)})
        if dupes:
            raise ConfigError(f"check names {dupes} are used twice; each check needs its own")
        self.checks: list[Check] = []
        """Every check by position; grows (``add``), so executors look positions up here."""
        self.controls = Controls() if controls is None else controls
        self.exempt = PathMatcher(exempt)
        self._exempting = bool(self.exempt)
        self.priority = priorities() if priority is None else priority
        self.refund_statuses = frozenset(refund_statuses)
        if charge_when is not None and not callable(charge_when):
            raise ConfigError(
                f"charge_when={charge_when!r} is invalid; expected a function of the response "
                "status returning True to charge"
            )
        self.charge_when = charge_when
        self.on_error = check_on_error(on_error)
        self.user_errors: dict[tuple[str, str], int] = {}
        """Errors of the application's functions by (check name, function kind)."""
        self._reported: set[int] = set()
        """``id`` of each function whose first error was logged (with the function kept in
        ``_reported_functions``, so an id is never reused while it is here)."""
        self._reported_functions: list[object] = []
        self.clock = clock
        self.log_interval = log_interval
        self.in_flight = 0
        self._lock = threading.Lock()
        self._shedders: dict[int, WorkerUtilizationShedder] = {}
        self.admissions: dict[int, AdmissionCore] = {}
        """Each ``AdmissionCheck``'s queue state by position; the runners drive it."""
        self._shed: dict[int, Rejection] = {}  # built once: a shed costs next to nothing
        self._asgi = asgi  # which default signal a WorkerCheck gets
        self.metrics = metrics
        self.quotas = quotas
        """The plans ``"plan:<limit>"`` rates name (the runners' limiters resolve them)."""
        self.problem_details = bool(problem_details)
        """Rate rejections as problem details (``quota-exceeded``) even when not asked."""
        self.settling = False
        """Whether a check settles after the response (a ``NestedCheck`` with ``actual``): the
        middleware then keeps each request's ``costs.Usage``. Set by ``add``, and by a
        framework integration as soon as a route may get such a check (``routes``)."""
        for c in checks:
            self.add(c)
        self.every: tuple[int, ...] = tuple(range(len(self.checks)))
        """The positions walked for every request: the checks given to the constructor."""
        self._last_log = -1e18
        self._unlogged = 0
        self.store_label = "(the store)"
        """How the first store failure's ERROR names the store: the middleware sets its repr."""
        self._store_reported = False
        if metrics is not None:
            metrics.watch_in_flight(self.requests_in_flight)

    def requests_in_flight(self) -> int:
        """Requests between ``admit`` and ``finish`` now."""
        return self.in_flight

    def count(self, name: str, what: str, key: str | None = None) -> None:
        """Count one verdict of check ``name`` in the controls and the metrics."""
        self.controls.count(name, what)
        if self.metrics is not None:
            self.metrics.decision(name, OUTCOME[what], key)

    def add(self, check: Check) -> int:
        """Register ``check`` and return its position; the same check again keeps its position
        (a limit shared by several routes), another check under a name in use is an error."""
        if not isinstance(check, CHECK_TYPES):
            raise ConfigError(
                f"check {check!r} is invalid; expected RateCheck, NestedCheck, "
                "ConcurrencyCheck, FleetCheck, WorkerCheck or AdmissionCheck"
            )
        with self._lock:
            for position, known in enumerate(self.checks):
                if known.name == check.name:
                    if known == check:
                        return position
                    raise ConfigError(
                        f"check name {check.name!r} is used twice with different settings; "
                        "each check needs its own name"
                    )
            position = len(self.checks)
            if isinstance(check, NestedCheck) and check.actual is not None:
                self.settling = True
            if isinstance(check, RateCheck) and check.plan_limit:
                if self.quotas is None:
                    raise ConfigError(
                        f"check {check.name!r} counts {check.rate!r}, a plan's limit, but the "
                        "middleware has no plans; give it quotas=Quotas(plans, ...)"
                    )
                self.quotas.limit_name(check.rate)  # an unknown limit: refused, named
            if isinstance(check, WorkerCheck):
                shedder = check.shedder or self._default_shedder(check)
                self._shedders[position] = shedder
                if self.metrics is not None:
                    self.metrics.watch_shedder(check.name, shedder)
            if isinstance(check, AdmissionCheck):
                self.admissions[position] = check.core(self._asgi)
            if isinstance(check, WorkerCheck | AdmissionCheck):
                self._shed[position] = shed_rejection(check.name, check.retry_after)
            self.checks.append(check)
            return len(self.checks) - 1

    def _default_shedder(self, check: WorkerCheck) -> WorkerUtilizationShedder:
        """``ShedderSettings.fast()`` on the worst of: this process's CPU share (the smooth
        signal the controller settles on) and the server type's queue signal, which catches
        what CPU misses (a neighbour taking the core, a handler blocking): the event loop's lag
        (ASGI) or busy threads, requests in flight / ``max_in_flight`` (WSGI); and the check's
        queue delay if any."""
        queue: Signal = (
            LoopLag(saturated_at=0.1)
            if self._asgi
            else lambda: self.in_flight / check.max_in_flight
        )
        signals: list[Signal] = [ProcessCPU(every=0.25), queue]
        if check.queue_delay is not None:
            signals.append(check.queue_delay)
        return WorkerUtilizationShedder(
            worst(*signals), settings=ShedderSettings.fast(), clock=self.clock
        )

    def enter(self, request: RequestInfo, adm: Admission) -> bool:
        """Count the request in flight (once); False if its path is exempt. What ``admit``
        does first, and all it does when there is nothing to walk."""
        if self._exempting and self.exempt(request.path):
            return False
        if not adm.entered:
            adm.entered = True
            lock = self._lock
            lock.acquire()  # not ``with``: cheaper, and every request starts here
            self.in_flight += 1
            lock.release()
        return True

    def admit(
        self, request: RequestInfo, adm: Admission, positions: Sequence[int] | None = None
    ) -> Flow:
        """Walk the checks at ``positions`` (default: ``every``) for one request, filling
        ``adm``; called again on the same admission (a route's limits after the app-wide
        checks), it goes on where the first walk left off (see the module docstring)."""
        if not self.enter(request, adm):
            return
        if positions is not None:  # a route's: each position once per request, whoever walks
            walked = adm.walked
            if walked is None:
                walked = adm.walked = set(positions)
            else:
                positions = [p for p in positions if p not in walked]
                walked.update(positions)
        controls = self.controls
        checks = self.checks
        for index in self.every if positions is None else positions:
            check = checks[index]
            name = check.name
            mode = controls.mode(name)
            if mode == "off":
                self.count(name, "skipped")
                continue
            adm.key = None
            try:
                if type(check) is RateCheck:  # the usual check, without a generator of its own
                    op = self.rate_op(index, check, request, adm)
                    if op is None:
                        continue
                    verdict = self._rated(check, adm, op, unwrap((yield op)), mode, request)
                else:
                    verdict = yield from self._check(index, check, request, adm, mode)
            except UserFunctionError as err:
                self.user_failed(name, err)
                continue
            except Exception as exc:
                self.failed_open(name, exc)
                continue
            if verdict is True:
                self.count(name, "allowed")
            elif verdict is False:
                continue
            elif mode == "shadow":
                self.count(name, "shadow_rejected", adm.key)
            else:
                self.count(name, "rejected", adm.key)
                adm.rejection = verdict
                return

    def _check(
        self, index: int, check: Check, request: RequestInfo, adm: Admission, mode: str
    ) -> Generator[Op, Any, Rejection | bool]:
        """One check: True if allowed, False if it does not apply, else the rejection."""
        if isinstance(check, NestedCheck):
            result = yield from nested_walk(index, check, request, adm, mode, self.problem_details)
            return result
        if isinstance(check, ConcurrencyCheck):
            if not check.where.applies(request):
                return False
            key = call(check.key, request, "key")
            if key is None:
                return False
            adm.key = key
            lease, busy = unwrap((yield Op("acquire", index, f"{check.name}:{key}")))
            if not self._keep(adm, index, lease):
                return concurrency_rejection(check.name, check.capacity)
            if mode == "enforce" and busy is not None:
                adm.busy = [*(adm.busy or ()), (check.name, check.capacity, busy)]
            return True
        if isinstance(check, RateCheck):
            op = self.rate_op(index, check, request, adm)
            if op is None:
                return False
            return self._rated(check, adm, op, unwrap((yield op)), mode, request)
        if adm.tier is None:
            adm.tier = call(self.priority, request, "priority")
        if isinstance(check, FleetCheck):
            critical = adm.tier == check.critical_tier
            lease = unwrap((yield Op("admit", index, critical=critical)))
            return self._keep(adm, index, lease) or shed_rejection(
                check.name, check.retry_after, check.capacity
            )
        if isinstance(check, AdmissionCheck):
            ticket = unwrap((yield Op("enter", index, adm.tier, wait=mode == "enforce")))
            if ticket is None:
                return self._shed[index]
            adm.tickets.append((index, ticket))
            return True
        return self._worker(index, check, request, adm.tier)

    def _rated(
        self,
        check: RateCheck,
        adm: Admission,
        op: Op,
        decision: Decision,
        mode: str,
        request: RequestInfo,
    ) -> Rejection | bool:
        """A rate check's verdict on its decision: True (charged), or the rejection."""
        if decision.degraded:
            raise Degraded
        if not decision.allowed:
            return self._rate_rejection(check, op, decision, request)
        adm.charged.append(op)
        if mode == "enforce":
            best = adm.best
            if best is None or decision.remaining < best[1].remaining:
                adm.best = (check.name, decision, check.qu, check.name)
        return True

    def _rate_rejection(
        self, check: RateCheck, op: Op, decision: Decision, request: RequestInfo
    ) -> Rejection:
        """The answer to a rate check's refusal: 429, or 403 where the check or the tenant's
        plan says so (an exhausted quota); problem details when configured or asked for."""
        status = check.status
        rate = op.rate
        if self.quotas is not None and type(rate) is str and rate[:5] == "plan:":
            status = self.quotas.status_of(op.key, rate[5:], status)
        problem = self.problem_details or wants_problem(request.header("accept"))
        return rate_rejection(
            check.name, decision, status, problem, unit=check.qu, own=check.message
        )

    def rate_op(
        self, index: int, check: RateCheck, request: RequestInfo, adm: Admission | None = None
    ) -> Op | None:
        """The ``hit`` the rate check at ``index`` charges ``request`` with; None where it does
        not apply (a route or method it does not cover, a key or rate of None). Its key is
        ``<check>:<key>``, or the caller's key itself for a plan's limit (the tenant's, whose
        counters the limit's name owns); the caller's key is left in ``adm.key``. The check's
        functions are called here: one that raises, or returns what is no rate (nor a limit of
        the plans) or cost, raises ``UserFunctionError``."""
        if not check.where.everywhere and not check.where.applies(request):
            return None
        try:
            key = check.key(request)
        except Exception as exc:
            raise UserFunctionError(check.key, "key", exc) from exc
        if key is None:
            return None
        if adm is not None:
            adm.key = key
        rate = check.rate
        if callable(rate):
            rate = call(rate, request, "rate")
            if rate is None:
                return None
            try:
                self.check_rate(rate)
            except Exception as exc:
                raise UserFunctionError(check.rate, "rate", exc) from exc
        cost = check.cost
        if callable(cost):
            cost = call(cost, request, "cost")
            if isinstance(cost, bool) or not isinstance(cost, int) or cost < 1:
                error = ConfigError(f"cost {cost!r} is invalid; expected a whole number >= 1")
                raise UserFunctionError(check.cost, "cost", error) from error
        if type(rate) is str and rate[:5] == "plan:":  # a plan's limit: the tenant's key
            return Op("hit", index, key, cost, rate=rate)
        return Op("hit", index, f"{check.name}:{key}", cost, rate=rate)

    def check_rate(self, rate: object) -> None:
        """A rate function's answer is a rate, or a plan's limit the middleware's plans name."""
        if type(rate) is str and rate[:5] == "plan:":
            if self.quotas is None:
                raise ConfigError(
                    f"rate {rate!r} is a plan's limit, but the middleware has no plans; "
                    "give it quotas=Quotas(plans, ...)"
                )
            self.quotas.limit_name(rate)  # an unknown limit: refused, named
        else:
            to_rates(rate)  # type: ignore[arg-type]  # refused unless a rate

    @staticmethod
    def _keep(adm: Admission, index: int, lease: Lease | None) -> bool:
        """Keep a granted lease for release; False when none was granted."""
        if lease is None:
            return False
        if lease.degraded:
            raise Degraded
        adm.leases.append((index, lease))
        return True

    def _worker(
        self, index: int, check: WorkerCheck, request: RequestInfo, tier: str
    ) -> Rejection | bool:
        shedder = self._shedders[index]
        if check.queue_delay is not None:
            arrived = arrival(request)
            if arrived is not None:
                check.queue_delay.record(arrived)
        utilization = None
        if shedder.utilization is None:
            utilization = self.in_flight / check.max_in_flight
        if shedder.shed(tier, utilization):
            return self._shed[index]
        return True

    def shedding_stats(self) -> dict[str, Any]:
        """Per shedding check: the worker shedder's state or the admission queue's."""
        out: dict[str, Any] = {}
        for i, shedder in self._shedders.items():
            out[self.checks[i].name] = shedder.stats()
        for i, core in self.admissions.items():
            out[self.checks[i].name] = core.stats()
        return out

    def user_failed(self, name: str, err: UserFunctionError, count: bool = True) -> None:
        """An application function of check ``name`` erred: count it (and the check as failed
        open), log the first error of each function at ERROR with its traceback, and raise the
        function's exception when ``on_error`` is ``"raise"``."""
        if count:
            self.count(name, "failed_open")
        with self._lock:
            found = (name, err.kind)
            self.user_errors[found] = self.user_errors.get(found, 0) + 1
            first = id(err.function) not in self._reported
            if first:
                self._reported.add(id(err.function))
                self._reported_functions.append(err.function)
        if self.metrics is not None:
            self.metrics.user_errors.labels(name, err.kind).inc()
        if first:
            log.error(
                "ratekeeper check %r: its %s function %r raised %s: %s; requests go through "
                "this check unchecked until it is fixed (counted in user_errors; logged once "
                "per function)",
                name,
                err.kind,
                err.function,
                type(err.exc).__name__,
                err.exc,
                exc_info=err.exc,
            )
        if self.on_error == "raise":
            raise err.exc

    def user_error_stats(self) -> dict[str, dict[str, int]]:
        """Errors of the application's functions per check and function kind."""
        out: dict[str, dict[str, int]] = {}
        with self._lock:
            for (name, kind), n in self.user_errors.items():
                out.setdefault(name, {})[kind] = n
        return out

    def finish_failed(self, op: Op, exc: Exception) -> None:
        """Log a failed refund or release (the request has already been answered)."""
        self.failed_open(self.checks[op.position].name, exc, count=False)

    def failed_open(self, name: str, exc: BaseException, count: bool = True) -> None:
        """Count a failure and log it at most once per ``log_interval`` seconds."""
        if count:
            self.count(name, "failed_open")
        if not self._store_reported and isinstance(exc, Degraded | StoreUnavailable):
            self._store_reported = True
            log.error(
                "ratekeeper check %r: store %s does not answer (%s); requests go through "
                "unchecked (fail open) until it does, later failures are logged as warnings",
                name,
                self.store_label,
                "a degraded answer" if isinstance(exc, Degraded) else exc,
            )
        if isinstance(exc, Degraded):
            return
        self._unlogged += 1
        now = self.clock()
        if now - self._last_log >= self.log_interval:
            log.warning(
                "ratekeeper check %r failed (%r); letting requests through "
                "(%d failures since the last report)",
                name,
                exc,
                self._unlogged,
            )
            self._last_log = now
            self._unlogged = 0


def arrival(request: RequestInfo) -> float | None:
    """When the request arrived, if something stamped it: mod_wsgi's ``mod_wsgi.request_start``
    or a proxy's ``X-Request-Start`` / ``X-Queue-Start`` (epoch seconds)."""
    raw = request.raw
    stamp = raw.get("mod_wsgi.request_start") if isinstance(raw, dict) else None
    if stamp is None:
        stamp = request.header("x-request-start") or request.header("x-queue-start")
    return None if stamp is None else parse_request_start(stamp)
