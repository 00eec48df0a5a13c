"""``Limiter``: the synchronous face over the shared core (``store.execute(plan)``)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ..algorithms import Outcome
from ..clock import Clock
from ..decision import Decision
from ..errors import ConfigError
from ..metrics.core import Metrics
from ..nested import Level, NestedDecision, Reservation, Settlement
from ..plan import Op, Plan, Policy, decide
from ..quotas.calls import PlanCalls, quota_name
from ..stores.base import Pingable, Store
from ..stores.memory import MemoryStore
from .core import RateSpec, _Base
from .nesting import DEFAULT_TTL, NestedCall, NestedCore

if TYPE_CHECKING:
    from ..quotas.cache import Quotas

T = TypeVar("T")


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

    def _op(
        self,
        op: Op,
        key: str,
        rate: RateSpec,
        algorithm: str,
        cost: int,
        burst: int | None,
        buckets: int | None,
        aligned: bool,
        count_rejected: bool,
    ) -> Decision | None:
        """One operation on a rate: on a plan's limit (``_quota``), else as a ``Plan``."""
        core = self._core
        name = quota_name(core, rate, algorithm, burst, buckets, aligned, count_rejected)
        if name is not None:
            return self._quota(op, key, name, cost)
        return self._run(
            core.plan(op, key, rate, algorithm, cost, burst, buckets, aligned, count_rejected)
        )

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
            decision = self._op(
                "hit", key, rate, algorithm, cost, burst, buckets, aligned, count_rejected
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
        decision = self._op(
            "peek", key, rate, algorithm, cost, burst, buckets, aligned, count_rejected
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
        self._op("refund", key, rate, algorithm, cost, burst, buckets, aligned, count_rejected)

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
        self._op("reset", key, rate, algorithm, 1, burst, buckets, aligned, count_rejected)

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
