"""``Limiter`` and ``AsyncLimiter``: the public facade over one shared core.

``_Core`` holds everything that is not I/O — rate parsing and caching, plan building, the clock,
fail-open policy, the circuit breaker and counters. The two limiters differ only where ``await``
appears: ``store.execute(plan)`` versus ``await store.execute_async(plan)``.

Failure policy: a store error or timeout gives an allowed ``Decision`` with ``degraded=True``
(``fail_open=True``, the default) or raises ``StoreUnavailable``; a store that can decide
without its backend (``FailLocalStore``: ``LocalBudget(fail_local=True)``) answers first,
its decision marked ``degraded``. After ``breaker_threshold``
failures in a row the breaker opens and the store is not called for a cool-down that starts at
``breaker_cooldown`` seconds and doubles on each failed trial up to ``breaker_max_cooldown``;
the first call after the cool-down is the one trial, and its success closes the breaker (see
``breaker``). A ``Partitioned`` store (sharded Redis) gets one breaker per partition.

Two clocks: ``clock`` (epoch seconds) decides limits; ``monotonic`` (``time.monotonic``) times
the breaker's cool-downs and the failure log's interval, so a frozen or replayed rate clock
never freezes recovery. Tests inject each separately.

Plans (``quotas=``, a ``ratekeeper.quotas.Quotas``): a rate ``"plan:<limit>"`` is the key's
tenant's limit of that name (``quotas.cache``), decided like any rate; ``status(key)`` lists
a tenant's limits without charging, ``administer`` is an admin's atomic reset, credit or debit
(``quotas.admin`` adds the audit log).

Metrics (``metrics=``, a ``ratekeeper.metrics.Metrics``): each decision is counted under its
rates (``policy="100/1m"``) unless ``count_decisions=False`` (the middleware and the service
count under their own names), store calls are timed and their errors counted (the in-process
fast path makes no store call), and the breakers' states are watched. Off, it costs nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from .algorithms import Outcome
from .breaker import Breaker
from .clock import Clock
from .decision import Decision
from .errors import ConfigError, StoreUnavailable
from .metrics.core import Metrics
from .nested import Level, NestedDecision
from .nested_core import DEFAULT_TTL, NestedCall, NestedCore
from .plan import (
    Op,
    Plan,
    Policy,
    _PlanFields,
    check_cost,
    check_key,
    decide,
    decide_one,
    degraded,
    make_policy,
)
from .quotas.calls import AsyncPlanCalls, PlanCalls, local_quota_hit, quota_name
from .rates import Rate
from .reservations import Reservation, Settlement
from .stores.base import (
    AsyncPingable,
    AsyncStore,
    FailLocalStore,
    LocalStore,
    Partitioned,
    Pingable,
    QueuingStore,
    SliceStore,
    Store,
)
from .stores.memory import MemoryStore

if TYPE_CHECKING:
    from .quotas.cache import Quotas

RateSpec = str | Rate | Sequence[Rate]
log = logging.getLogger("ratekeeper")
T = TypeVar("T")


class _Core:
    """Plans, decisions, fail-open policy, breaker and counters: shared by both limiters."""

    def __init__(
        self,
        clock: Clock,
        fail_open: bool,
        breaker_threshold: int,
        breaker_cooldown: float,
        breaker_max_cooldown: float,
        monotonic: Clock = time.monotonic,
    ) -> None:
        if not callable(clock):
            raise ConfigError(f"clock={clock!r} is not callable; expected e.g. time.time")
        if not callable(monotonic):
            raise ConfigError(f"monotonic={monotonic!r} is not callable; expected time.monotonic")
        self.monotonic = monotonic
        self._breaker_settings = (breaker_threshold, breaker_cooldown, breaker_max_cooldown)
        self._breakers: dict[int, Breaker] = {0: Breaker(*self._breaker_settings)}  # validates
        self.partition: Callable[[Plan], int] | None = None
        self.only: Breaker | None = self._breakers[0]
        """The one breaker of a store without partitions (None when there is one per part)."""
        self.clock = clock
        self.fail_open = fail_open
        self._policies: dict[tuple[Any, ...], Policy] = {}
        self._singles: dict[tuple[Any, ...], Policy] = {}
        """The cached policies of one rate: the ones ``local_hit`` may decide."""
        self.hit_one: Callable[..., Outcome | None] | None = None
        """Answers a one-rate hit in process: ``LocalStore.hit_one``, or ``SliceStore.spend_one``
        (None from it: take the plan path)."""
        self.local_one: Callable[..., Outcome] | None = None
        """``LocalStore.hit_one`` only (it always answers)."""
        self.fail_local: Callable[[Plan], tuple[Outcome, ...] | None] | None = None
        self._last_log = -1e18
        self.counts = {
            "degraded": 0, "store_errors": 0, "breaker_opened": 0, "breaker_skips": 0,
            "fail_local": 0,
        }  # fmt: skip
        self.metrics: Metrics | None = None
        """Set: store calls are timed and errors counted."""
        self.counting: Metrics | None = None
        """Set: every hit is counted as a decision (peeks, refunds and resets are not)."""
        self.quotas: Quotas | None = None
        """Set: rates ``"plan:<limit>"`` are the key's tenant's limits."""

    def count(self, d: Decision) -> None:
        """Count one decision under its rates (``counting`` is set)."""
        stack = d.stack
        label = stack[0].code if len(stack) == 1 else "; ".join(r.code for r in stack)
        outcome = "degraded" if d.degraded else "allowed" if d.allowed else "rejected"
        self.counting.decision(label, outcome)  # type: ignore[union-attr]  # callers check

    def watch(self, store: object) -> None:
        """Keep one breaker per partition if ``store`` declares partitions."""
        self.partition = store.partition if isinstance(store, Partitioned) else None
        self.only = None if self.partition is not None else self._breakers[0]
        self.local_one = store.hit_one if isinstance(store, LocalStore) else None
        self.hit_one = store.spend_one if isinstance(store, SliceStore) else self.local_one
        self.fail_local = store.fail_local if isinstance(store, FailLocalStore) else None

    def local_hit(
        self,
        key: str,
        rate: RateSpec,
        algorithm: str,
        cost: int,
        burst: int | None,
        buckets: int | None,
        aligned: bool = False,
        count_rejected: bool = False,
    ) -> Decision | None:
        """A hit decided by an in-process store without a ``Plan`` (the fast path), or None
        when the call needs the full path: another store, a policy not seen yet or of several
        rates, or a key or cost that needs checking. The same decision either way."""
        if self.hit_one is None or type(key) is not str or not key or type(cost) is not int:
            return None
        try:
            policy = self._singles.get(
                (rate, algorithm)  # the common call, without a function call
                if burst is None
                and buckets is None
                and aligned is False
                and count_rejected is False
                else _cache_key(rate, algorithm, burst, buckets, aligned, count_rejected)
            )
        except TypeError:  # an unhashable rate sequence: never cached
            return None
        if policy is None or cost < 1:
            quotas = self.quotas
            if (  # "plan:<limit>", default options
                policy is None
                and quotas is not None
                and cost >= 1
                and burst is None
                and buckets is None
                and aligned is False
                and count_rejected is False
            ):
                return local_quota_hit(self, quotas, key, rate, algorithm, cost)
            return None
        now = int(self.clock() * 1000 + 0.5)  # as in ``plan``
        outcome = self.hit_one(policy.slots[0], key, policy.algorithm, policy.limits[0], now, cost)
        return None if outcome is None else decide_one(policy, outcome, now)

    def now_ms(self) -> int:
        """The rate clock now, in whole ms (rounded as ``plan_of`` does)."""
        return int(self.clock() * 1000 + 0.5)

    def policy_hit(
        self, key: str, policy: Policy, cost: int, now: int | None = None
    ) -> Decision | None:
        """``local_hit`` for a policy already made by ``make_policy``: None unless the store is
        in-process, the policy has one rate, and key and cost need no checking."""
        if (
            self.hit_one is None
            or len(policy.limits) != 1
            or type(key) is not str
            or not key
            or type(cost) is not int
            or cost < 1
        ):
            return None
        if now is None:
            now = int(self.clock() * 1000 + 0.5)  # as in ``plan``
        outcome = self.hit_one(policy.slots[0], key, policy.algorithm, policy.limits[0], now, cost)
        return None if outcome is None else decide_one(policy, outcome, now)

    def plan(
        self,
        op: Op,
        key: str,
        rate: RateSpec,
        algorithm: str,
        cost: int,
        burst: int | None,
        buckets: int | None,
        aligned: bool = False,
        count_rejected: bool = False,
    ) -> Plan:
        """Validate the call and turn it into a plan (policies are cached per spelling)."""
        policy = self.policy(rate, algorithm, burst, buckets, aligned, count_rejected)
        return self.plan_of(op, key, policy, cost)

    def policy(
        self,
        rate: RateSpec,
        algorithm: str,
        burst: int | None,
        buckets: int | None,
        aligned: bool = False,
        count_rejected: bool = False,
    ) -> Policy:
        """The validated policy of a call's rates and options, cached per spelling."""
        cache_key = _cache_key(rate, algorithm, burst, buckets, aligned, count_rejected)
        try:
            policy = self._policies.get(cache_key)
        except TypeError:  # an unhashable rate sequence (a list): not cached
            policy = None
        if policy is None:
            policy = make_policy(rate, algorithm, burst, buckets, aligned, count_rejected)
            if len(self._policies) < 10_000:
                with contextlib.suppress(TypeError):
                    self._policies[cache_key] = policy
                    if len(policy.limits) == 1:
                        self._singles[cache_key] = policy
        return policy

    def plan_of(self, op: Op, key: str, policy: Policy, cost: int) -> Plan:
        """``plan`` for a policy already made by ``make_policy`` (key and cost still checked)."""
        if type(key) is not str or not key:
            check_key(key)
        if type(cost) is not int or cost < 1:
            check_cost(cost)
            if cost == 0 and op == "hit":  # a peek of one unit; peek(cost=0) stays 0
                op, cost = "peek", 1
        p = _PlanFields()  # make_plan's body, inlined (the hot path)
        p.op = op
        p.policy = policy
        p.key = key
        # round, not truncate: a float clock moved by ``retry_after`` lands a hair below the
        # intended millisecond about one time in ten, and truncating would then decide 1 ms early
        # (half up, as int(x + 0.5): measured ~120 ns cheaper than round(), an epoch is never < 0)
        p.now_ms = int(self.clock() * 1000 + 0.5)
        p.cost = cost
        p.__class__ = Plan  # type: ignore[assignment]  # same slots: see plan._PlanFields
        return p  # type: ignore[return-value]  # it is a Plan now; cast() would cost a call

    def breaker(self, plan: Plan) -> Breaker:
        """The breaker guarding ``plan``'s partition (``only``, for most stores)."""
        return self.breaker_of(0 if self.partition is None else self.partition(plan))

    def breaker_of(self, part: int) -> Breaker:
        """The breaker of store partition ``part`` (made on first use)."""
        breaker = self._breakers.get(part)
        if breaker is None:
            breaker = self._breakers.setdefault(part, Breaker(*self._breaker_settings))
        return breaker

    def admit(self, plan: Plan, breaker: Breaker) -> bool:
        """Whether ``plan`` may reach the store past an open ``breaker`` (counts the skips)."""
        if breaker.allow(self.monotonic()):
            return True
        self.counts["breaker_skips"] += 1
        return False

    def failed(
        self, plan: Plan, exc: BaseException | None, breaker: Breaker | None, start: float = 0.0
    ) -> Decision | None:
        """Record a failure (or a breaker skip if ``exc`` is None) and answer per policy;
        ``start`` is when the failed store call began (perf_counter; with metrics)."""
        self._record_failure(exc, breaker, start)
        if self.fail_local is not None:
            outcomes = self.fail_local(plan)
            if outcomes is not None:
                if not outcomes:  # a refund or a reset, done locally
                    return None
                self.counts["fail_local"] += 1
                return dataclasses.replace(decide(plan, outcomes), degraded=True)
        self._fail_closed(exc)
        if plan.op in ("refund", "reset"):
            return None
        self.counts["degraded"] += 1
        return degraded(plan)

    def note_failure(
        self, exc: BaseException | None, breaker: Breaker | None, start: float = 0.0
    ) -> None:
        """Count and log a store failure of a nested call (``exc``; None: a breaker skip) and
        tell its breaker; raise ``StoreUnavailable`` when failing closed (else the caller
        answers degraded). Nested calls do not fail local: open or closed."""
        self._record_failure(exc, breaker, start)
        self._fail_closed(exc)

    def _record_failure(
        self, exc: BaseException | None, breaker: Breaker | None, start: float
    ) -> None:
        if exc is not None:
            self.counts["store_errors"] += 1
            if self.metrics is not None:
                self.metrics.store_latency.observe(time.perf_counter() - start)
                self.metrics.store_errors.inc()
            now = self.monotonic()
            if breaker is not None and breaker.failed(now):
                self.counts["breaker_opened"] += 1
            if now - self._last_log >= 10.0:
                self._last_log = now
                log.warning(
                    "ratekeeper store failed (%s); failing %s",
                    exc,
                    "local" if self.fail_local else "open" if self.fail_open else "closed",
                )

    def _fail_closed(self, exc: BaseException | None) -> None:
        """Raise ``StoreUnavailable`` when the limiter fails closed."""
        if not self.fail_open:
            if exc is None:
                raise StoreUnavailable("store unavailable (circuit breaker open)")
            raise StoreUnavailable(f"store unavailable: {exc}") from exc

    def succeeded(self, breaker: Breaker, start: float) -> None:
        """A store call that answered: timed (``start``: when it began, perf_counter; with
        metrics), and its breaker told."""
        if self.metrics is not None:
            self.metrics.store_latency.observe(time.perf_counter() - start)
        if breaker.failures:
            breaker.succeeded()

    def breaker_states(self) -> dict[str, str]:
        """Each partition's breaker state (``"0"`` for a store without partitions)."""
        return {str(part): b.state for part, b in sorted(self._breakers.items())}

    def stats(self) -> dict[str, Any]:
        """Counters of failures and degraded decisions, and the breakers' state.

        ``breaker`` is the worst state over all partitions, ``breakers_open`` how many are open.
        """
        breakers = list(self._breakers.values())
        states = {b.state for b in breakers}
        state = "open" if "open" in states else "failing" if "failing" in states else "closed"
        return {
            **self.counts,
            "breaker": state,
            "breakers_open": sum(b.state == "open" for b in breakers),
            "consecutive_failures": max(b.failures for b in breakers),
        }


def store_name(store: object) -> str:
    """A store's label in metrics: its kind (a name from the code, never from a caller)."""
    name = type(store).__name__
    return _STORE_NAMES.get(name, name)


_STORE_NAMES = {
    "MemoryStore": "memory",
    "RedisStore": "redis",
    "ShardedRedisStore": "sharded",
    "RedisClusterStore": "cluster",
}


def _cache_key(
    rate: RateSpec,
    algorithm: str,
    burst: int | None,
    buckets: int | None,
    aligned: bool,
    count_rejected: bool,
) -> tuple[Any, ...]:
    """The policy cache key of a call. With options their types are part of it (burst=5.0
    equals burst=5, aligned=1 equals True, and neither is valid); the common spellings get
    short keys, built without type() calls (this runs on every call)."""
    if burst is None and buckets is None:
        if aligned is False and count_rejected is False:
            return (rate, algorithm)
        if (aligned is True or aligned is False) and (
            count_rejected is True or count_rejected is False
        ):
            return (rate, algorithm, aligned, count_rejected)
    options = (burst, buckets, aligned, count_rejected)
    return (rate, algorithm, *options, *(type(o) for o in options))


class _Base:
    """Constructor and plan helpers common to both limiters."""

    _core: _Core

    def __init__(
        self,
        clock: Clock = time.time,
        fail_open: bool = True,
        breaker_threshold: int = 3,
        breaker_cooldown: float = 0.5,
        breaker_max_cooldown: float = 30.0,
        monotonic: Clock = time.monotonic,
    ) -> None:
        self._core = _Core(
            clock, fail_open, breaker_threshold, breaker_cooldown, breaker_max_cooldown, monotonic
        )

    def _observe(self, store: object, metrics: Metrics | None, count_decisions: bool) -> None:
        if metrics is None:
            return
        if not isinstance(metrics, Metrics):
            raise ConfigError(
                f"metrics={metrics!r} is invalid; expected ratekeeper.metrics.Metrics"
            )
        self._core.metrics = metrics
        self._core.counting = metrics if count_decisions else None
        metrics.watch_breakers(self.breaker_states, store_name(store))

    def breaker_states(self) -> dict[str, str]:
        """Each store partition's breaker: ``closed``, ``failing`` or ``open``."""
        return self._core.breaker_states()

    @property
    def clock(self) -> Clock:
        """The clock every decision is timed by."""
        return self._core.clock

    def hit_now(
        self,
        key: str,
        rate: RateSpec,
        algorithm: str = "fixed_window",
        cost: int = 1,
        burst: int | None = None,
        buckets: int | None = None,
    ) -> Decision | None:
        """``hit`` decided at once by an in-process store (``LocalStore``: no plan, no I/O,
        no coroutine), or None when it needs ``hit``'s full path (another store, a policy not
        seen yet, a stack). The same decision ``hit`` gives; for callers on a hot path."""
        core = self._core
        decision = core.local_hit(key, rate, algorithm, cost, burst, buckets)
        if decision is not None and core.counting is not None:
            core.count(decision)
        return decision

    @property
    def local_hit_one(self) -> Callable[..., Outcome] | None:
        """The in-process store's ``hit_one`` (``LocalStore``), None for other stores: what
        ``decide_local`` calls, for callers that keep a policy's slot, algorithm and limit."""
        return self._core.local_one

    def stats(self) -> dict[str, Any]:
        """Failure counters: ``degraded`` (fail-open answers), ``fail_local`` (answers decided
        without the store by a ``FailLocalStore``), ``store_errors``, ``breaker_opened``,
        ``breaker_skips``, ``breaker`` (worst state), ``breakers_open`` and
        ``consecutive_failures``."""
        return self._core.stats()


class Limiter(_Base, PlanCalls):
    """Synchronous rate limiter. ``Limiter()`` uses an in-memory store and ``time.time``.

    Options of the algorithms: ``burst`` (token_bucket, gcra), ``buckets`` (sliding_window),
    ``aligned`` and ``count_rejected`` (fixed_window; see ``algorithms.fixed_window``).
    """

    def __init__(
        self,
        store: Store | None = None,
        clock: Clock = time.time,
        fail_open: bool = True,
        metrics: Metrics | None = None,
        count_decisions: bool = True,
        quotas: Quotas | None = None,
        **breaker: Any,
    ) -> None:
        super().__init__(clock, fail_open, **breaker)
        self._plans(quotas)
        store = MemoryStore() if store is None else store
        if not isinstance(store, Store):
            raise ConfigError(f"store {store!r} cannot be used by Limiter; it has no execute()")
        self.store = store
        self._core.watch(store)
        self._observe(store, metrics, count_decisions)
        self._nesting = NestedCore(self._core, store)

    def check(self) -> None:
        """Check the store answers — at startup: building a Redis store connects to nothing,
        so a wrong address would otherwise only show as degraded decisions. Raises
        ``StoreUnavailable`` naming the store's address (never its password)."""
        if isinstance(self.store, Pingable):
            self.store.ping()

    def _run(self, plan: Plan) -> Decision | None:
        core = self._core
        breaker = core.only or core.breaker(plan)
        if breaker.open_until and not core.admit(plan, breaker):
            return core.failed(plan, None, None)
        start = 0.0 if core.metrics is None else time.perf_counter()
        try:
            outcomes: tuple[Outcome, ...] = self.store.execute(plan)
        except Exception as exc:
            return core.failed(plan, exc, breaker, start)
        core.succeeded(breaker, start)
        return decide(plan, outcomes) if outcomes else None

    def hit(
        self,
        key: str,
        rate: RateSpec,
        *,
        algorithm: str = "fixed_window",
        cost: int = 1,
        burst: int | None = None,
        buckets: int | None = None,
        aligned: bool = False,
        count_rejected: bool = False,
    ) -> Decision:
        """Consume ``cost`` units if every rate admits them; a rejection consumes nothing."""
        core = self._core
        decision = core.local_hit(
            key, rate, algorithm, cost, burst, buckets, aligned, count_rejected
        )
        if decision is None:
            name = quota_name(core, rate, algorithm, burst, buckets, aligned, count_rejected)
            decision = (
                self._run(
                    core.plan(
                        "hit", key, rate, algorithm, cost, burst, buckets, aligned, count_rejected
                    )
                )
                if name is None
                else self._quota("hit", key, name, cost)
            )
        assert decision is not None  # hit and peek always produce a decision
        if core.counting is not None:
            core.count(decision)
        return decision

    def decide_local(self, op: Op, key: str, policy: Policy, cost: int = 1) -> Decision | None:
        """``decide`` when an in-process store answers it at once (a cached one-rate hit on
        the memory store), else None: callers on a hot path skip a coroutine."""
        return self._core.policy_hit(key, policy, cost) if op == "hit" else None

    def decide(self, op: Op, key: str, policy: Policy, cost: int = 1) -> Decision:
        """``hit`` or ``peek`` (``op``) under a policy made once by ``make_policy`` (a service's
        configured policies): the same decision, without parsing rates or a cache lookup."""
        if op != "hit" and op != "peek":
            raise ConfigError(f"op {op!r} is invalid; expected 'hit' or 'peek'")
        decision = self._core.policy_hit(key, policy, cost) if op == "hit" else None
        if decision is None:
            decision = self._run(self._core.plan_of(op, key, policy, cost))
        assert decision is not None
        return decision

    def peek(
        self,
        key: str,
        rate: RateSpec,
        *,
        algorithm: str = "fixed_window",
        cost: int = 1,
        burst: int | None = None,
        buckets: int | None = None,
        aligned: bool = False,
        count_rejected: bool = False,
    ) -> Decision:
        """The decision a ``hit`` of ``cost`` would get now, consuming nothing (``cost=0``:
        whether the key is within its limit now; only a ``count_rejected`` window can be over)."""
        core = self._core
        name = quota_name(core, rate, algorithm, burst, buckets, aligned, count_rejected)
        if name is not None:
            decision = self._quota("peek", key, name, cost)
        else:
            decision = self._run(
                core.plan(
                    "peek", key, rate, algorithm, cost, burst, buckets, aligned, count_rejected
                )
            )
        assert decision is not None
        return decision

    def refund(
        self,
        key: str,
        rate: RateSpec,
        *,
        algorithm: str = "fixed_window",
        cost: int = 1,
        burst: int | None = None,
        buckets: int | None = None,
        aligned: bool = False,
        count_rejected: bool = False,
    ) -> None:
        """Give back ``cost`` units (e.g. for a 304), never below zero or above capacity."""
        core = self._core
        name = quota_name(core, rate, algorithm, burst, buckets, aligned, count_rejected)
        if name is not None:
            self._quota("refund", key, name, cost)
            return
        self._run(
            core.plan("refund", key, rate, algorithm, cost, burst, buckets, aligned, count_rejected)
        )

    def reset(
        self,
        key: str,
        rate: RateSpec,
        *,
        algorithm: str = "fixed_window",
        burst: int | None = None,
        buckets: int | None = None,
        aligned: bool = False,
        count_rejected: bool = False,
    ) -> None:
        """Forget all state of ``key`` under these rates."""
        core = self._core
        name = quota_name(core, rate, algorithm, burst, buckets, aligned, count_rejected)
        if name is not None:
            self._quota("reset", key, name, 1)
            return
        self._run(
            core.plan("reset", key, rate, algorithm, 1, burst, buckets, aligned, count_rejected)
        )

    def nested(self, levels: Sequence[Level], *, cost: int = 1) -> NestedDecision:
        """Decide several levels (outermost first: org, user, key) in one atomic store call:
        each level charged ``cost`` (or its own) only if every level admits (``nested``)."""
        return self._nested(self._nesting.decide(levels, cost))

    def refund_nested(self, levels: Sequence[Level], *, cost: int = 1) -> None:
        """Give back what ``nested(levels, cost=cost)`` charged (e.g. for a 304): each level's
        cost, never below empty or above full, in one store call."""
        self._nested(self._nesting.refund(levels, cost))

    def reserve(
        self, levels: Sequence[Level], estimate: int, *, ttl: float = DEFAULT_TTL
    ) -> Reservation:
        """Admit ``estimate`` units on the levels, to ``settle`` with the actual cost later
        (or ``cancel``); given back by the store if neither comes within ``ttl`` seconds."""
        return self._nested(self._nesting.reserve(levels, estimate, ttl))

    def settle(self, reservation: Reservation, actual: int) -> Settlement:
        """Charge what ``reservation`` really cost: the difference from its estimate is given
        back, or charged now (into a bounded debt); once per reservation (``reservations``)."""
        return self._nested(self._nesting.settle(reservation, "settle", actual))

    def cancel(self, reservation: Reservation) -> Settlement:
        """Give ``reservation``'s whole estimate back (the work never ran)."""
        return self._nested(self._nesting.settle(reservation, "cancel"))

    def _nested(self, call: NestedCall[T]) -> T:
        store = self._nesting.sync_store()
        if not call.admitted():
            return call.finish(None)
        try:
            reply = store.execute_nested(call.plan)
        except Exception as exc:
            return call.finish(exc)
        return call.finish(reply)


class Pending:
    """A decision on its way from a batching store (``AsyncLimiter.decide_soon``): when
    ``future`` is done, ``result()`` is the store's outcomes (``decide(plan, outcomes)`` is
    what ``decide`` would have returned), or the failure policy's decision."""

    __slots__ = ("breaker", "core", "future", "plan", "start")

    def __init__(
        self,
        core: _Core,
        plan: Plan,
        breaker: Breaker,
        start: float,
        future: asyncio.Future[tuple[Outcome, ...]],
    ) -> None:
        self.core = core
        self.plan = plan
        self.breaker = breaker
        self.start = start
        self.future = future

    def result(self) -> tuple[Outcome, ...] | Decision:
        """The store's outcomes (the call timed, its breaker told); when the call failed, the
        failure policy's decision (degraded, failing open) or ``StoreUnavailable`` raised
        (failing closed). Call it once."""
        try:
            outcomes = self.future.result()
        except Exception as exc:
            decision = self.core.failed(self.plan, exc, self.breaker, self.start)
            assert decision is not None  # a hit or a peek: never None
            return decision
        self.core.succeeded(self.breaker, self.start)
        return outcomes


class AsyncLimiter(_Base, AsyncPlanCalls):
    """The same limiter for asyncio: every method is a coroutine."""

    def __init__(
        self,
        store: AsyncStore | None = None,
        clock: Clock = time.time,
        fail_open: bool = True,
        metrics: Metrics | None = None,
        count_decisions: bool = True,
        quotas: Quotas | None = None,
        **breaker: Any,
    ) -> None:
        super().__init__(clock, fail_open, **breaker)
        self._plans(quotas)
        store = MemoryStore() if store is None else store
        if not isinstance(store, AsyncStore):
            raise ConfigError(
                f"store {store!r} cannot be used by AsyncLimiter; it has no execute_async()"
            )
        self.store = store
        self._queue = store.execute_soon if isinstance(store, QueuingStore) else None
        self._core.watch(store)
        self._observe(store, metrics, count_decisions)
        self._nesting = NestedCore(self._core, store)

    async def check(self) -> None:
        """See ``Limiter.check``."""
        if isinstance(self.store, AsyncPingable):
            await self.store.ping_async()

    async def _run(self, plan: Plan) -> Decision | None:
        core = self._core
        breaker = core.only or core.breaker(plan)
        if breaker.open_until and not core.admit(plan, breaker):
            return core.failed(plan, None, None)
        start = 0.0 if core.metrics is None else time.perf_counter()
        try:
            outcomes: tuple[Outcome, ...] = await self.store.execute_async(plan)
        except Exception as exc:
            return core.failed(plan, exc, breaker, start)
        core.succeeded(breaker, start)
        return decide(plan, outcomes) if outcomes else None

    async def hit(
        self,
        key: str,
        rate: RateSpec,
        *,
        algorithm: str = "fixed_window",
        cost: int = 1,
        burst: int | None = None,
        buckets: int | None = None,
        aligned: bool = False,
        count_rejected: bool = False,
    ) -> Decision:
        """Consume ``cost`` units if every rate admits them; a rejection consumes nothing."""
        core = self._core
        decision = core.local_hit(
            key, rate, algorithm, cost, burst, buckets, aligned, count_rejected
        )
        if decision is None:
            name = quota_name(core, rate, algorithm, burst, buckets, aligned, count_rejected)
            decision = (
                await self._run(
                    core.plan(
                        "hit", key, rate, algorithm, cost, burst, buckets, aligned, count_rejected
                    )
                )
                if name is None
                else await self._quota("hit", key, name, cost)
            )
        assert decision is not None
        if core.counting is not None:
            core.count(decision)
        return decision

    def decide_local(self, op: Op, key: str, policy: Policy, cost: int = 1) -> Decision | None:
        """``decide`` when an in-process store answers it at once (a cached one-rate hit on
        the memory store), else None: callers on a hot path skip a coroutine."""
        return self._core.policy_hit(key, policy, cost) if op == "hit" else None

    def decide_soon(self, op: Op, key: str, policy: Policy, cost: int = 1) -> Pending | None:
        """``decide`` through a batching store (``QueuingStore``) without a coroutine: the plan
        is queued in the store's next batch now, and the ``Pending`` gives the same decision
        once its future is done. None when the store does not batch, or its breaker is open
        (then await ``decide``). For callers that answer from a callback (the HTTP service)."""
        queue = self._queue
        if queue is None or (op != "hit" and op != "peek"):
            return None
        core = self._core
        plan = core.plan_of(op, key, policy, cost)
        breaker = core.only or core.breaker(plan)
        if breaker.open_until:  # a skip or the one trial: ``_run``'s rules apply
            return None
        start = 0.0 if core.metrics is None else time.perf_counter()
        future = queue(plan)
        return None if future is None else Pending(core, plan, breaker, start, future)

    async def decide(self, op: Op, key: str, policy: Policy, cost: int = 1) -> Decision:
        """``hit`` or ``peek`` (``op``) under a policy made once by ``make_policy`` (a service's
        configured policies): the same decision, without parsing rates or a cache lookup."""
        if op != "hit" and op != "peek":
            raise ConfigError(f"op {op!r} is invalid; expected 'hit' or 'peek'")
        decision = self._core.policy_hit(key, policy, cost) if op == "hit" else None
        if decision is None:
            decision = await self._run(self._core.plan_of(op, key, policy, cost))
        assert decision is not None
        return decision

    async def peek(
        self,
        key: str,
        rate: RateSpec,
        *,
        algorithm: str = "fixed_window",
        cost: int = 1,
        burst: int | None = None,
        buckets: int | None = None,
        aligned: bool = False,
        count_rejected: bool = False,
    ) -> Decision:
        """The decision a ``hit`` of ``cost`` would get now, consuming nothing (``cost=0``:
        whether the key is within its limit now; only a ``count_rejected`` window can be over)."""
        core = self._core
        name = quota_name(core, rate, algorithm, burst, buckets, aligned, count_rejected)
        if name is not None:
            decision = await self._quota("peek", key, name, cost)
        else:
            decision = await self._run(
                core.plan(
                    "peek", key, rate, algorithm, cost, burst, buckets, aligned, count_rejected
                )
            )
        assert decision is not None
        return decision

    async def refund(
        self,
        key: str,
        rate: RateSpec,
        *,
        algorithm: str = "fixed_window",
        cost: int = 1,
        burst: int | None = None,
        buckets: int | None = None,
        aligned: bool = False,
        count_rejected: bool = False,
    ) -> None:
        """Give back ``cost`` units (e.g. for a 304), never below zero or above capacity."""
        core = self._core
        name = quota_name(core, rate, algorithm, burst, buckets, aligned, count_rejected)
        if name is not None:
            await self._quota("refund", key, name, cost)
            return
        await self._run(
            core.plan("refund", key, rate, algorithm, cost, burst, buckets, aligned, count_rejected)
        )

    async def reset(
        self,
        key: str,
        rate: RateSpec,
        *,
        algorithm: str = "fixed_window",
        burst: int | None = None,
        buckets: int | None = None,
        aligned: bool = False,
        count_rejected: bool = False,
    ) -> None:
        """Forget all state of ``key`` under these rates."""
        core = self._core
        name = quota_name(core, rate, algorithm, burst, buckets, aligned, count_rejected)
        if name is not None:
            await self._quota("reset", key, name, 1)
            return
        await self._run(
            core.plan("reset", key, rate, algorithm, 1, burst, buckets, aligned, count_rejected)
        )

    async def nested(self, levels: Sequence[Level], *, cost: int = 1) -> NestedDecision:
        """See ``Limiter.nested``."""
        return await self._nested(self._nesting.decide(levels, cost))

    async def refund_nested(self, levels: Sequence[Level], *, cost: int = 1) -> None:
        """See ``Limiter.refund_nested``."""
        await self._nested(self._nesting.refund(levels, cost))

    async def reserve(
        self, levels: Sequence[Level], estimate: int, *, ttl: float = DEFAULT_TTL
    ) -> Reservation:
        """See ``Limiter.reserve``."""
        return await self._nested(self._nesting.reserve(levels, estimate, ttl))

    async def settle(self, reservation: Reservation, actual: int) -> Settlement:
        """See ``Limiter.settle``."""
        return await self._nested(self._nesting.settle(reservation, "settle", actual))

    async def cancel(self, reservation: Reservation) -> Settlement:
        """See ``Limiter.cancel``."""
        return await self._nested(self._nesting.settle(reservation, "cancel"))

    async def _nested(self, call: NestedCall[T]) -> T:
        store = self._nesting.async_store()
        if not call.admitted():
            return call.finish(None)
        try:
            reply = await store.execute_nested_async(call.plan)
        except Exception as exc:
            return call.finish(exc)
        return call.finish(reply)
