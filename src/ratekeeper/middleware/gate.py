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
- the first enforced rejection stops the walk; charges already made are refunded and leases
  released, so a rejected request consumes nothing;
- an allowed response carries the headers of the enforced rate decision with least remaining;
- a charge stays only if the check's ``charge_when`` (else the gate's) says so for the
  response's status; by default every status but those in ``refund_statuses`` (304) is charged;
- the checks given to the constructor run for every request; checks registered later with
  ``add`` (a framework's per-route limits) run only where a caller names their positions, in
  the same admission, so one request has one set of headers and one rule for giving back.
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
from collections.abc import Awaitable, Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from ..admission import AdmissionCore, Ticket
from ..clock import Clock
from ..concurrency import Lease
from ..decision import Decision
from ..errors import ConfigError, StoreUnavailable
from ..metrics.core import Metrics
from ..shedding import ShedderSettings, WorkerUtilizationShedder
from ..signals import LoopLag, ProcessCPU, Signal, parse_request_start, worst
from .checks import (
    CHECK_TYPES,
    AdmissionCheck,
    ChargeWhen,
    Check,
    ConcurrencyCheck,
    Controls,
    FleetCheck,
    RateCheck,
    WorkerCheck,
)
from .request import PathMatcher, PriorityFunc, RequestInfo, priorities
from .responses import (
    Headers,
    Rejection,
    concurrency_rejection,
    decision_headers,
    rate_rejection,
    shed_rejection,
    wants_problem,
)

if TYPE_CHECKING:
    from ..quotas.cache import Quotas

log = logging.getLogger("ratekeeper")

Kind = Literal["hit", "refund", "acquire", "admit", "release", "enter", "leave"]
OUTCOME = {
    "allowed": "allowed",
    "rejected": "rejected",
    "shadow_rejected": "shadow_rejected",
    "failed_open": "degraded",
    "skipped": "disabled",
}
"""A ``Controls`` counter -> its ``ratekeeper_decisions`` outcome."""


class Op(NamedTuple):
    """One store operation for the check at ``position`` (a tuple: built on every request).

    ``rate`` is the rate a ``hit`` is charged under (the check's, or the one its rate function
    gave for this request); the refund of that hit carries it too. An ``AdmissionCheck``'s
    ``enter`` carries the tier in ``key`` (``wait`` False in shadow mode) and gets a ``Ticket``
    or None back; its ``leave`` carries the ``ticket``.
    """

    kind: Kind
    position: int
    key: str = ""
    cost: int = 1
    critical: bool = False
    lease: Lease | None = None
    rate: Any = None
    wait: bool = True
    ticket: Ticket | None = None


@dataclass(frozen=True, slots=True)
class Failure:
    """What the executor sends back when an operation raised."""

    exc: Exception


SCOPE_KEY = "ratekeeper.admission"
"""Where the middleware leaves a request's ``Admission`` (ASGI scope, WSGI environ), for a
framework integration to walk a route's checks into after routing."""


class Admission:
    """What one request was granted: charges, leases, headers, or the rejection."""

    __slots__ = (
        "aborted",
        "best",
        "charged",
        "done",
        "entered",
        "headers",
        "key",
        "leases",
        "rejection",
        "request",
        "tickets",
        "tier",
    )

    def __init__(self, request: RequestInfo | None = None) -> None:
        self.request = request
        self.tier: str | None = None
        self.best: tuple[str, Decision] | None = None
        self.charged: list[Op] = []
        self.leases: list[tuple[int, Lease]] = []
        self.tickets: list[tuple[int, Ticket]] = []
        self.headers: Headers = ()
        self.rejection: Rejection | None = None
        self.entered = False
        self.done = False
        self.aborted = False
        self.key: str | None = None
        """The caller key of the check being walked (for the top-keys sketch)."""


_BODY_HEADERS = frozenset({"Content-Type", "Content-Length"})


def added_headers(adm: Admission) -> Headers:
    """The headers a middleware adds to the app's response: the admission's; or, when a route's
    limit rejected the request and the app answered it (a framework's error handler shapes the
    429), the rejection's rate-limit headers, so every 429 carries them whoever wrote it."""
    rejection = adm.rejection
    if rejection is None:
        return adm.headers
    return tuple(h for h in rejection.headers if h[0] not in _BODY_HEADERS)


class _Degraded(Exception):
    """A check answered without its store (it already logged): count as failed open."""


Flow = Generator[Op, Any, None]


class Gate:
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
                f"check {check!r} is invalid; expected RateCheck, ConcurrencyCheck, "
                "FleetCheck, WorkerCheck or AdmissionCheck"
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
            with self._lock:
                self.in_flight += 1
        return True

    def admit(
        self, request: RequestInfo, adm: Admission, positions: Sequence[int] | None = None
    ) -> Flow:
        """Walk the checks at ``positions`` (default: ``every``) for one request, filling
        ``adm``; called again on the same admission (a route's limits after the app-wide
        checks), it goes on where the first walk left off (see the module docstring)."""
        if not self.enter(request, adm):
            return
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
                verdict = yield from self._check(index, check, request, adm, mode)
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
        if adm.best is not None:
            adm.headers = decision_headers(*adm.best)

    def _check(
        self, index: int, check: Check, request: RequestInfo, adm: Admission, mode: str
    ) -> Generator[Op, Any, Rejection | bool]:
        """One check: True if allowed, False if it does not apply, else the rejection."""
        if isinstance(check, RateCheck | ConcurrencyCheck):
            if not check.where.applies(request):
                return False
            key = check.key(request)
            if key is None:
                return False
            adm.key = key
            if isinstance(check, ConcurrencyCheck):
                key = f"{check.name}:{key}"
                lease = _unwrap((yield Op("acquire", index, key)))
                return self._keep(adm, index, lease) or concurrency_rejection(
                    check.name, check.capacity
                )
            rate = check.rate_of(request)
            if rate is None:
                return False
            plan = type(rate) is str and rate[:5] == "plan:"  # a plan's limit: the tenant's key
            if not plan:
                key = f"{check.name}:{key}"
            op = Op("hit", index, key, check.cost_of(request), rate=rate)
            decision: Decision = _unwrap((yield op))
            if decision.degraded:
                raise _Degraded
            if not decision.allowed:
                status = check.status
                if plan and self.quotas is not None:
                    status = self.quotas.status_of(key, str(rate)[5:], status)
                problem = self.problem_details or wants_problem(request.header("accept"))
                return rate_rejection(check.name, decision, status, problem)
            adm.charged.append(op)
            if mode == "enforce" and (
                adm.best is None or decision.remaining < adm.best[1].remaining
            ):
                adm.best = (check.name, decision)
            return True
        if adm.tier is None:
            adm.tier = self.priority(request)
        if isinstance(check, FleetCheck):
            critical = adm.tier == check.critical_tier
            lease = _unwrap((yield Op("admit", index, critical=critical)))
            return self._keep(adm, index, lease) or shed_rejection(
                check.name, check.retry_after, check.capacity
            )
        if isinstance(check, AdmissionCheck):
            ticket = _unwrap((yield Op("enter", index, adm.tier, wait=mode == "enforce")))
            if ticket is None:
                return self._shed[index]
            adm.tickets.append((index, ticket))
            return True
        return self._worker(index, check, request, adm.tier)

    @staticmethod
    def _keep(adm: Admission, index: int, lease: Lease | None) -> bool:
        """Keep a granted lease for release; False when none was granted."""
        if lease is None:
            return False
        if lease.degraded:
            raise _Degraded
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

    def finish(self, adm: Admission, status: int | None) -> list[Op]:
        """The refunds and releases that end a request, once (``status`` None: the app raised).

        The executor runs each and reports a failure to ``finish_failed``; none depends on
        another's result, so this is a plain list (usually empty) rather than a flow.
        """
        if adm.done:
            return []
        adm.done = True
        if adm.entered:
            with self._lock:
                self.in_flight -= 1
        ops = [Op("leave", index, ticket=ticket) for index, ticket in adm.tickets]
        if adm.charged:
            if adm.rejection is not None or adm.aborted:
                ops += [op._replace(kind="refund") for op in adm.charged]
            elif status is not None:
                ops += [
                    op._replace(kind="refund") for op in adm.charged if not self._keeps(op, status)
                ]
        for index, lease in adm.leases:
            ops.append(Op("release", index, lease=lease))
        return ops

    def _keeps(self, op: Op, status: int) -> bool:
        """Whether the charge ``op`` stands for a response with ``status``."""
        return self.keeps(op.position, status)

    def keeps(self, position: int, status: int) -> bool:
        """Whether the rate check at ``position`` keeps its charge for a response with
        ``status`` (``simulate`` asks it too, to replay refunds as they happen)."""
        check = self.checks[position]
        predicate = check.charge_when or self.charge_when  # type: ignore[union-attr]  # a rate check's op
        if predicate is None:
            return status not in self.refund_statuses
        try:
            return bool(predicate(status))
        except Exception as exc:  # the response is sent: keep the charge, say why once
            self.failed_open(check.name, exc, count=False)
            return True

    def abort(self, adm: Admission, op: Op | None = None, result: Any = None) -> list[Op]:
        """``finish`` for an admission cut short, refunding every charge. ``op`` is the store
        call that was in flight and ``result`` what it returned (a ``Failure``, or None if
        unknown): a charge, lease or admission ticket it granted is given back too."""
        if op is not None and result is not None and not isinstance(result, Failure):
            if op.kind == "hit" and isinstance(result, Decision):
                if result.allowed and not result.degraded:
                    adm.charged.append(op)
            elif isinstance(result, Lease) and not result.degraded:  # acquire, admit
                adm.leases.append((op.position, result))
            elif isinstance(result, Ticket):  # enter
                adm.tickets.append((op.position, result))
        adm.aborted = True
        return self.finish(adm, None)

    def shedding_stats(self) -> dict[str, Any]:
        """Per shedding check: the worker shedder's state or the admission queue's."""
        out: dict[str, Any] = {}
        for i, shedder in self._shedders.items():
            out[self.checks[i].name] = shedder.stats()
        for i, core in self.admissions.items():
            out[self.checks[i].name] = core.stats()
        return out

    def finish_failed(self, op: Op, exc: Exception) -> None:
        """Log a failed refund or release (the request has already been answered)."""
        self.failed_open(self.checks[op.position].name, exc, count=False)

    def failed_open(self, name: str, exc: BaseException, count: bool = True) -> None:
        """Count a failure and log it at most once per ``log_interval`` seconds."""
        if count:
            self.count(name, "failed_open")
        if not self._store_reported and isinstance(exc, _Degraded | StoreUnavailable):
            self._store_reported = True
            log.error(
                "ratekeeper check %r: store %s does not answer (%s); requests go through "
                "unchecked (fail open) until it does, later failures are logged as warnings",
                name,
                self.store_label,
                "a degraded answer" if isinstance(exc, _Degraded) else exc,
            )
        if isinstance(exc, _Degraded):
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


def _unwrap(result: Any) -> Any:
    if isinstance(result, Failure):
        raise result.exc
    return result


def run(flow: Flow, execute: Callable[[Op], Any]) -> None:
    """Drive a gate flow with a sync executor."""
    try:
        op = next(flow)
        while True:
            try:
                result = execute(op)
            except Exception as exc:
                result = Failure(exc)
            op = flow.send(result)
    except StopIteration:
        return


async def run_async(flow: Flow, execute: Callable[[Op], Awaitable[Any]]) -> None:
    """Drive a gate flow with an async executor."""
    try:
        op = next(flow)
        while True:
            try:
                result = await execute(op)
            except Exception as exc:
                result = Failure(exc)
            op = flow.send(result)
    except StopIteration:
        return
