"""The checks a middleware runs, in order, and the controls an operator holds over them.

Checks are frozen configuration: each middleware builds the live limiters for its flavour (sync
for WSGI, async for ASGI) from them, over one store.

- ``RateCheck``: a request-rate rule — any algorithm, stacked rates, a key function, routes,
  methods and a cost (a number or a function of the request). The rate may be a function of the
  request too (a customer's plan; ``None``: no limit for this request), or ``"plan:<limit>"``:
  the key's tenant's limit in the middleware's ``quotas`` (the key is then the tenant's, and
  the limit's name owns the counters). ``charge_when`` decides from the response's status
  whether the request is charged at all. Over: 429, or ``status=403`` (a plan's limit says its
  own).
- ``NestedCheck``: several ``CheckLevel``s (org > user > key), each with its key function,
  rate and algorithm, decided all or nothing in one store call (``ratekeeper.nested``); with
  ``actual=`` the cost is reserved before the app runs and settled once the response has
  ended (``costs``: a response header, what the app reported, the body's bytes). Over: 429.
- ``ConcurrencyCheck``: at most ``capacity`` requests in progress per key. Over: 429.
- ``FleetCheck``: the fleet-usage shedder; requests of the first priority tier are critical.
  Over the non-critical share: 503.
- ``WorkerCheck``: the worker-utilization shedder, fed by default with the overload signal of
  the server type (event-loop lag for ASGI, busy threads for WSGI). Shed: 503.
- ``AdmissionCheck``: adaptive concurrency — at most ``limit`` requests in progress, found from
  latency, the rest queued by priority and shed when they wait too long. Shed: 503.

``Controls`` is the object the app keeps: a mode per check (``enforce``, ``shadow`` — decide and
count but let everything through — or ``off``), switchable at runtime, optionally refreshed from
flags in Redis (``redis_flags``), and the counters per check.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ..clock import Clock
from ..errors import ConfigError
from ..nested import MAX_COST, MAX_LEVELS, Level, check_ttl, compile_levels
from ..overload.adaptive import GradientLimit, GradientSettings
from ..overload.admission import AdmissionCore
from ..overload.concurrency import check_capacity
from ..overload.shedding import DEFAULT_TIERS, WorkerUtilizationShedder
from ..overload.signals import QueueDelay
from ..plan import make_policy
from ..rates import Rate
from .costs import Actual
from .functions import UserFunctionError, call
from .request import KeyFunc, PathMatcher, RequestInfo, client_ip

log = logging.getLogger("ratekeeper")

MODES = ("enforce", "shadow", "off")
COUNTERS = ("allowed", "rejected", "shadow_rejected", "failed_open", "skipped")
CostFunc = Callable[[RequestInfo], int]
RateSpec = str | Rate | tuple[Rate, ...]
RateFunc = Callable[[RequestInfo], RateSpec | None]
ChargeWhen = Callable[[int], bool]
"""A predicate on a response's status: True keeps the charge, False gives it back."""
UNITS = ("requests", "content-bytes")
"""Quota units a rate check may count in (draft-ietf-httpapi-ratelimit-headers' ``qu``)."""


def _check_unit(unit: object, rate: object = None, what: str = "") -> str | None:
    """A check's ``unit``: the quota unit (``Rate.unit``) of its rates that state none, sent as
    ``qu``; None for requests (the default, left out). A fixed rate that states another unit
    is refused: one rate, one unit."""
    if unit not in UNITS:
        raise ConfigError(f"unit={unit!r} is invalid; expected one of {', '.join(UNITS)}")
    if unit != "requests" and not callable(rate) and rate is not None:
        rates = rate if isinstance(rate, tuple) else (rate,)
        for r in rates:
            if isinstance(r, Rate) and r.unit is not None and r.unit != unit:
                raise ConfigError(
                    f"{what} has unit={unit!r} but its rate {r} counts {r.unit!r}; give the "
                    "unit once (on the check, or on the rate)"
                )
    return None if unit == "requests" else str(unit)


def _check_cost(cost: object, low: int = 1, high: int | None = None) -> None:
    if callable(cost):
        return
    if isinstance(cost, bool) or not isinstance(cost, int) or cost < low or cost > (high or cost):
        expected = f">= {low}" if high is None else f"from {low} to {high:_}"
        raise ConfigError(f"cost={cost!r} is invalid; expected a whole number {expected}")


def called_cost(function: CostFunc, request: RequestInfo) -> int:
    """A nested check's (or level's) cost function's answer: a whole number from 0 to
    10**12, else the function has erred (``UserFunctionError``)."""
    cost = call(function, request, "cost")
    if isinstance(cost, bool) or not isinstance(cost, int) or not 0 <= cost <= MAX_COST:
        error = ConfigError(f"cost {cost!r} is invalid; expected a whole number from 0 to "
                            f"{MAX_COST:_}")  # fmt: skip
        raise UserFunctionError(function, "cost", error) from error
    return cost


@lru_cache(maxsize=4096)
def _level_rate(rate: object, algorithm: str, burst: object, buckets: object, debt: object) -> None:
    """A level's rate (a rate function's answer too) with its algorithm, options and debt,
    refused as a nested call would refuse it (``ConfigError``); checked once per spelling."""
    if isinstance(rate, str) and rate.strip().startswith("plan:"):
        raise ConfigError(f"rate {rate!r} names a plan's limit; levels do not take one")
    level = Level("k", rate, algorithm, burst, buckets, debt=debt)  # type: ignore[arg-type]  # checked here
    compile_levels([level], 1, make_policy)


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not name or any(c in name for c in '\r\n"\\'):
        raise ConfigError(f"check name {name!r} is invalid; expected a short non-empty string")


@dataclass(frozen=True, slots=True)
class _Scope:
    """Where a check applies: routes (empty: everywhere) and methods (empty: all)."""

    routes: PathMatcher
    methods: frozenset[str]
    everywhere: bool

    def applies(self, request: RequestInfo) -> bool:
        if self.everywhere:  # the usual case, decided without a call
            return True
        if self.methods and request.method not in self.methods:
            return False
        return not self.routes or self.routes(request.path)


def _scope(routes: Iterable[str], methods: Iterable[str]) -> _Scope:
    matcher, verbs = PathMatcher(routes), frozenset(m.upper() for m in methods)
    return _Scope(matcher, verbs, not matcher and not verbs)


@dataclass(frozen=True, slots=True)
class RateCheck:
    """Requests per key under a rate (or stack), e.g. ``RateCheck("api", "10/s; 500/h")``.

    ``rate`` may be a function of the request returning the rate, or None for no limit (it is
    then parsed per request; a bad one fails open and is logged), or ``"plan:<limit>"`` (the
    middleware's ``quotas``; no algorithm or options here: the plan sets them).
    ``charge_when`` (default: the middleware's) is asked with the response's status; False
    refunds the charge. ``status`` answers a rejection: 429, or 403 for an exhausted quota.
    ``unit`` (``content-bytes`` for a byte budget) is the quota unit of the check's rates that
    state none (``Rate.unit``), sent as ``RateLimit-Policy``'s ``qu``.
    ``message`` replaces the rejection body's message (default: the check, its rate and when
    to retry).
    """

    name: str
    rate: RateSpec | RateFunc
    key: KeyFunc = field(default_factory=client_ip)
    algorithm: str = "fixed_window"
    burst: int | None = None
    buckets: int | None = None
    routes: tuple[str, ...] = ()
    methods: tuple[str, ...] = ()
    cost: int | CostFunc = 1
    charge_when: ChargeWhen | None = None
    unit: str = "requests"
    message: str | None = None
    status: int = 429
    where: _Scope = field(init=False, repr=False, compare=False)
    qu: str | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_name(self.name)
        if self.message is not None and not isinstance(self.message, str):
            raise ConfigError(f"message={self.message!r} is invalid; expected a string")
        if self.status not in (429, 403) or isinstance(self.status, bool):
            raise ConfigError(f"status={self.status!r} is invalid; expected 429 or 403")
        if callable(self.rate):
            make_policy("1/1ms", self.algorithm, self.burst, self.buckets)  # the options
        elif isinstance(self.rate, str) and self.rate.startswith("plan:"):
            given = (self.algorithm, self.burst, self.buckets, self.unit)
            if given != ("fixed_window", None, None, "requests"):
                raise ConfigError(
                    f"check {self.name!r} counts {self.rate!r}, a plan's limit: the plan sets "
                    "its algorithm, options and unit, give none here"
                )
        else:
            make_policy(self.rate, self.algorithm, self.burst, self.buckets)  # fail at startup
        _check_charge_when(self.charge_when)
        _check_cost(self.cost)
        object.__setattr__(self, "qu", _check_unit(self.unit, self.rate, f"check {self.name!r}"))
        object.__setattr__(self, "where", _scope(self.routes, self.methods))

    def cost_of(self, request: RequestInfo) -> int:
        """The units this request costs."""
        return self.cost(request) if callable(self.cost) else self.cost

    def rate_of(self, request: RequestInfo) -> RateSpec | None:
        """The rate for this request (None: no limit)."""
        return self.rate(request) if callable(self.rate) else self.rate

    @property
    def plan_limit(self) -> str:
        """The plan limit a fixed ``"plan:<limit>"`` rate names, else ``""``."""
        rate = self.rate
        return rate[5:] if isinstance(rate, str) and rate.startswith("plan:") else ""


def _check_charge_when(charge_when: object) -> None:
    if charge_when is not None and not callable(charge_when):
        raise ConfigError(
            f"charge_when={charge_when!r} is invalid; expected a function of the response "
            "status returning True to charge"
        )


@dataclass(frozen=True, slots=True)
class CheckLevel:
    """One level of a ``NestedCheck``: ``name`` (in headers: ``check.level``), a rate (or a
    function of the request; None: the whole check does not apply), the key function (None
    from it: the check does not apply) and the algorithm and options. ``cost`` None charges
    the check's cost (its estimate, when it settles); a number or a function of the request
    is the level's own, never settled (a request counter beside a token budget). ``debt``:
    how far a settled extra may take the level past its limit (``ratekeeper.Level``)."""

    name: str
    rate: RateSpec | RateFunc
    key: KeyFunc = field(default_factory=client_ip)
    algorithm: str = "fixed_window"
    burst: int | None = None
    buckets: int | None = None
    cost: int | CostFunc | None = None
    debt: int | None = None

    def __post_init__(self) -> None:
        _check_name(self.name)
        if "." in self.name:
            raise ConfigError(f"level name {self.name!r} is invalid; expected no '.'")
        rate = "1/1ms" if callable(self.rate) else self.rate
        if self.cost is not None:
            _check_cost(self.cost, 0, MAX_COST)
        level = Level("k", rate, self.algorithm, self.burst, self.buckets, debt=self.debt)
        compile_levels([level], 1, make_policy)  # rate, options and debt: fail at startup

    def level(self, check: str, request: RequestInfo) -> Level | None:
        """This level for ``request`` (None: a key or rate function said it does not apply).
        A function that raises, or answers what is no rate (or one this level's algorithm,
        options or debt refuse) or cost, raises ``UserFunctionError`` (as a ``RateCheck``'s
        do, ``gate.rate_op``): never a failure of the nested call after it."""
        key = call(self.key, request, "key")
        if key is None:
            return None
        rate = self.rate
        if callable(rate):
            rate = call(rate, request, "rate")
            if rate is None:
                return None
            try:
                try:
                    _level_rate(rate, self.algorithm, self.burst, self.buckets, self.debt)
                except TypeError:  # unhashable (a list of rates): checked uncached
                    _level_rate.__wrapped__(
                        rate, self.algorithm, self.burst, self.buckets, self.debt
                    )
            except Exception as exc:
                raise UserFunctionError(self.rate, "rate", exc) from exc
        cost = self.cost
        if callable(cost):
            cost = called_cost(cost, request)
        return Level(
            f"{check}:{key}", rate, self.algorithm, self.burst, self.buckets,
            cost=cost, debt=self.debt, name=f"{check}.{self.name}",
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class NestedCheck:
    """Several levels, outermost first (org, user, key), decided all or nothing: a request is
    charged on every level only if every level admits it (``ratekeeper.nested``).

    ``cost`` (a number or a function of the request) is charged on each level without a cost
    of its own. With ``actual`` (``costs.header(...)``, ``costs.reported()``,
    ``costs.response_bytes()``, any function of the request and its ``costs.Usage``) the cost
    is an estimate: reserved before the app runs (living ``ttl`` seconds) and settled with the
    actual cost once the response has ended (``ratekeeper.nested.reservations``). ``unit`` is the
    quota unit of the levels' rates that state none (``Rate.unit``; ``content-bytes`` for a
    byte budget), which the headers name. A rejection by a later
    check, an interrupted request or ``charge_when`` False gives everything back.
    """

    name: str
    levels: Sequence[CheckLevel]
    cost: int | CostFunc = 1
    actual: Actual | None = None
    ttl: float = 300.0
    unit: str = "requests"
    routes: tuple[str, ...] = ()
    methods: tuple[str, ...] = ()
    charge_when: ChargeWhen | None = None
    where: _Scope = field(init=False, repr=False, compare=False)
    qu: str | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_name(self.name)
        levels = self.levels
        if isinstance(levels, CheckLevel) or not isinstance(levels, list | tuple):
            raise ConfigError(
                f"levels={levels!r} is invalid; expected a list of CheckLevel, outermost first"
            )
        object.__setattr__(self, "levels", tuple(levels))
        if not 1 <= len(levels) <= MAX_LEVELS:
            raise ConfigError(
                f"check {self.name!r} has {len(levels)} levels; expected 1 to {MAX_LEVELS}"
            )
        names = [lv.name if isinstance(lv, CheckLevel) else lv for lv in levels]
        for i, level in enumerate(levels):
            if not isinstance(level, CheckLevel):
                raise ConfigError(f"level {i} of {self.name!r} is {level!r}; expected CheckLevel")
            if names.index(level.name) != i:
                raise ConfigError(f"level name {level.name!r} is used twice in {self.name!r}")
        _check_cost(self.cost, 0, MAX_COST)
        if self.actual is not None and not callable(self.actual):
            raise ConfigError(
                f"actual={self.actual!r} is invalid; expected a function of the request and its "
                "usage, such as costs.header('x-usage-tokens') or costs.reported()"
            )
        check_ttl(self.ttl)
        _check_charge_when(self.charge_when)
        for level in self.levels:  # a level's rate may not contradict the check's unit
            _check_unit(self.unit, level.rate, f"level {level.name!r} of check {self.name!r}")
        object.__setattr__(self, "qu", _check_unit(self.unit))
        object.__setattr__(self, "where", _scope(self.routes, self.methods))

    def cost_of(self, request: RequestInfo) -> int:
        """The units this request costs (its estimate, when the check settles); a cost
        function that raises or answers no whole number >= 0 raises ``UserFunctionError``."""
        return called_cost(self.cost, request) if callable(self.cost) else self.cost

    def levels_of(self, request: RequestInfo) -> list[Level] | None:
        """The levels for ``request``; None when one of them does not apply to it."""
        out = []
        for check_level in self.levels:
            level = check_level.level(self.name, request)
            if level is None:
                return None
            out.append(level)
        return out


@dataclass(frozen=True, slots=True)
class ConcurrencyCheck:
    """At most ``capacity`` requests in progress per key."""

    name: str
    capacity: int
    key: KeyFunc = field(default_factory=client_ip)
    lease_ttl: float = 60.0
    routes: tuple[str, ...] = ()
    methods: tuple[str, ...] = ()
    where: _Scope = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_name(self.name)
        check_capacity(self.capacity)
        object.__setattr__(self, "where", _scope(self.routes, self.methods))


@dataclass(frozen=True, slots=True)
class FleetCheck:
    """Stripe's fleet-usage shedder over ``capacity`` requests in progress fleet-wide."""

    capacity: int
    reserved_for_critical: float = 0.2
    name: str = "fleet"
    lease_ttl: float = 60.0
    retry_after: int = 5
    critical_tier: str = "critical"

    def __post_init__(self) -> None:
        _check_name(self.name)
        check_capacity(self.capacity)
        check_capacity(self.retry_after, "retry_after")


@dataclass(frozen=True, slots=True)
class WorkerCheck:
    """Stripe's worker-utilization shedder.

    With ``shedder`` None the middleware builds one with ``ShedderSettings.fast()`` on the signal
    of its server type: the event loop's lag (ASGI) or busy threads, requests in flight /
    ``max_in_flight`` (WSGI: set it to the thread count). A shedder without a ``utilization``
    callable is fed requests in flight / ``max_in_flight``. ``queue_delay`` is fed each
    request's arrival stamp (``X-Request-Start``, ``mod_wsgi.request_start``) and joins the
    default signal.
    """

    shedder: WorkerUtilizationShedder | None = None
    max_in_flight: int = 64
    name: str = "workers"
    retry_after: int = 5
    queue_delay: QueueDelay | None = None

    def __post_init__(self) -> None:
        _check_name(self.name)
        check_capacity(self.max_in_flight, "max_in_flight")
        check_capacity(self.retry_after, "retry_after")


QUEUE_DELAYS = {"asgi": (0.01, 0.1), "wsgi": (0.001, 0.001)}
"""(target_delay, interval) per server type. A waiting asyncio request costs a future; a
waiting WSGI request holds a thread that the server's own queue (in front of its thread pool,
where critical requests wait too) needs to be drained, so threads wait 1 ms at most."""


@dataclass(frozen=True, slots=True)
class AdmissionCheck:
    """At most ``limit`` requests in progress in this process, the rest queued by priority tier
    and shed (503) after waiting ``target_delay`` under a standing queue, ``interval`` otherwise
    (None: the server type's defaults, ``QUEUE_DELAYS``).

    ``limit`` None (the default) finds the limit from latency with a ``GradientLimit`` (its
    ``GradientSettings`` may be given instead); a number fixes it. The first tier is never
    queued nor shed. See ``ratekeeper.overload.admission``.
    """

    limit: int | GradientSettings | GradientLimit | None = None
    target_delay: float | None = None
    interval: float | None = None
    tiers: tuple[str, ...] = DEFAULT_TIERS
    name: str = "admission"
    retry_after: int = 1
    clock: Clock = time.monotonic

    def __post_init__(self) -> None:
        _check_name(self.name)
        check_capacity(self.retry_after, "retry_after")
        self.core(asgi=True)  # fail at startup
        self.core(asgi=False)

    def core(self, asgi: bool) -> AdmissionCore:
        """The live queue state this configuration describes (one per middleware); delays left
        None take the server type's defaults (``QUEUE_DELAYS``)."""
        limit = self.limit
        if limit is None or isinstance(limit, GradientSettings):
            limit = GradientLimit(limit, clock=self.clock)
        target, interval = QUEUE_DELAYS["asgi" if asgi else "wsgi"]
        return AdmissionCore(
            limit,
            self.tiers,
            target_delay=target if self.target_delay is None else self.target_delay,
            interval=interval if self.interval is None else self.interval,
            clock=self.clock,
        )


Check = RateCheck | NestedCheck | ConcurrencyCheck | FleetCheck | WorkerCheck | AdmissionCheck
CHECK_TYPES = (RateCheck, NestedCheck, ConcurrencyCheck, FleetCheck, WorkerCheck, AdmissionCheck)


def redis_flags(client: Any, key: str = "ratekeeper:modes") -> Callable[[], dict[str, str]]:
    """A flag source for ``Controls``: the Redis hash ``key`` mapping check name (or ``*`` for
    every check) to a mode, e.g. ``HSET ratekeeper:modes api shadow``."""

    def read() -> dict[str, str]:
        raw = client.hgetall(key)
        return {
            (k.decode() if isinstance(k, bytes) else str(k)): (
                v.decode() if isinstance(v, bytes) else str(v)
            )
            for k, v in raw.items()
        }

    return read


def check_mode(mode: object, where: str = "mode") -> str:
    """A mode is one of ``enforce``, ``shadow``, ``off``."""
    if mode not in MODES:
        raise ConfigError(f"{where} {mode!r} is invalid; expected one of {', '.join(MODES)}")
    return str(mode)


class Controls:
    """Kill switches, shadow mode and counters per check, for the app to hold and flip.

    Precedence: a flag from ``source`` (per check, then ``*``) beats a mode set here, which
    beats ``default``. The source is polled at most every ``refresh_every`` seconds of the
    ``monotonic`` clock (not the rate clock: a wall clock set back must not stop the polling);
    when it fails, the last flags read stay in force and the failure is logged once a minute.
    """

    def __init__(
        self,
        modes: Mapping[str, str] | None = None,
        *,
        default: str = "enforce",
        source: Callable[[], Mapping[str, str]] | None = None,
        refresh_every: float = 5.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.default = check_mode(default, "default mode")
        self._modes = {
            name: check_mode(m, f"mode for {name!r}") for name, m in (modes or {}).items()
        }
        self._source = source
        self._flags: dict[str, str] = {}
        self._refresh_every = refresh_every
        self._next_refresh = -1e18
        self._last_log = -1e18
        self.monotonic = monotonic
        self._lock = threading.Lock()
        self._counts: dict[str, dict[str, int]] = {}

    def set(self, check: str, mode: str) -> None:
        """Switch one check (or ``*``: every check without its own mode) now."""
        self._modes[check] = check_mode(mode)

    def clear(self, check: str) -> None:
        """Forget the mode set here for ``check`` (it follows ``*``, then the default)."""
        self._modes.pop(check, None)

    def enforce(self, check: str) -> None:
        """Reject over-limit requests."""
        self.set(check, "enforce")

    def shadow(self, check: str) -> None:
        """Dark launch: decide and count, but let every request through."""
        self.set(check, "shadow")

    def kill(self, check: str) -> None:
        """The kill switch: skip the check entirely."""
        self.set(check, "off")

    def mode(self, check: str) -> str:
        """The mode in force for ``check`` now."""
        if self._source is not None:
            now = self.monotonic()
            if now >= self._next_refresh:
                self._refresh(now)
            flags = self._flags
            if flags:
                flag = flags.get(check)
                if flag not in MODES:
                    flag = flags.get("*")
                if flag in MODES:
                    return flag
        modes = self._modes
        return modes.get(check) or modes.get("*") or self.default

    def _refresh(self, now: float) -> None:
        self._next_refresh = now + self._refresh_every
        assert self._source is not None  # only called when a source is configured
        try:
            self._flags = dict(self._source())
        except Exception as exc:
            if now - self._last_log >= 60.0:
                self._last_log = now
                log.warning("ratekeeper could not read mode flags (%s); keeping the last", exc)

    def count(self, check: str, what: str) -> None:
        """Add one to a counter of ``check`` (see ``COUNTERS``)."""
        lock = self._lock
        lock.acquire()  # not ``with``: cheaper, and every decision counts one
        try:
            counts = self._counts.get(check)
            if counts is None:
                counts = self._counts[check] = dict.fromkeys(COUNTERS, 0)
            counts[what] += 1
        finally:
            lock.release()

    def stats(self) -> dict[str, dict[str, int]]:
        """Counters per check: allowed, rejected, shadow_rejected, failed_open, skipped."""
        return {name: dict(c) for name, c in self._counts.items()}
