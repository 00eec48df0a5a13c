"""``AsyncLimiter``: the asyncio face over the shared core (``await store.execute_async(plan)``),
and ``Pending``, a decision on its way from a batching store."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ..algorithms import Outcome
from ..breaker import Breaker
from ..clock import Clock
from ..decision import Decision
from ..errors import ConfigError
from ..metrics.core import Metrics
from ..nested import Level, NestedDecision, Reservation, Settlement
from ..plan import Op, Plan, Policy, decide
from ..quotas.calls import AsyncPlanCalls, quota_name
from ..stores.base import AsyncPingable, AsyncStore, QueuingStore
from ..stores.memory import MemoryStore
from .core import RateSpec, _Base, _Core
from .nesting import DEFAULT_TTL, NestedCall, NestedCore

if TYPE_CHECKING:
    from ..quotas.cache import Quotas

T = TypeVar("T")


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

    async def _op(
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
            return await self._quota(op, key, name, cost)
        return await self._run(
            core.plan(op, key, rate, algorithm, cost, burst, buckets, aligned, count_rejected)
        )

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
            decision = await self._op(
                "hit", key, rate, algorithm, cost, burst, buckets, aligned, count_rejected
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
        decision = await self._op(
            "peek", key, rate, algorithm, cost, burst, buckets, aligned, count_rejected
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
        await self._op(
            "refund", key, rate, algorithm, cost, burst, buckets, aligned, count_rejected
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
        await self._op("reset", key, rate, algorithm, 1, burst, buckets, aligned, count_rejected)

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
