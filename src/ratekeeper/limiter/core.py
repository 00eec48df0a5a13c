"""The core both limiters share: ``_Core`` (everything that is not I/O) and ``_Base``.

``_Core`` holds rate parsing and caching, plan building, the clock, fail-open policy, the
circuit breakers and counters; ``_Base`` is the constructor and the methods both faces have
(``hit_now``, ``stats``, ``breaker_states``, ``clock``). The faces (``sync.Limiter``,
``asyncio.AsyncLimiter``) add only the store calls. The failure policy, the two clocks and the
metrics are described in the package's docstring.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..algorithms import Outcome
from ..breaker import Breaker
from ..clock import Clock
from ..decision import Decision
from ..errors import ConfigError, StoreUnavailable
from ..metrics.core import Metrics
from ..plan import (
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
from ..rates import Rate
from ..stores.base import FailLocalStore, LocalStore, Partitioned, SliceStore

if TYPE_CHECKING:
    from ..quotas.cache import Quotas
    from ..quotas.core import QuotaHit

RateSpec = str | Rate | Sequence[Rate]
log = logging.getLogger("ratekeeper")


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
        self.quota_hit: QuotaHit | None = None
        """Set with ``quotas`` (by the faces' ``_plans``): ``quotas.calls.local_quota_hit``, a
        plan's limit on the fast path. Handed in, so the core imports nothing above it."""

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
            quota_hit = self.quota_hit
            if (  # "plan:<limit>", default options
                policy is None
                and quotas is not None
                and quota_hit is not None
                and cost >= 1
                and burst is None
                and buckets is None
                and aligned is False
                and count_rejected is False
            ):
                return quota_hit(self, quotas, key, rate, algorithm, cost)
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
