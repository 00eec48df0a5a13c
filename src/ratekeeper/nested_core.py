"""The limiters' nested calls and reservations: calls in, answers out, the failure policy.

``Limiter`` and ``AsyncLimiter`` each add four thin methods (``nested``, ``reserve``,
``settle``, ``cancel``) that build a ``NestedCall`` here, run its plan on the store
(``store.execute_nested(plan)`` or ``await store.execute_nested_async(plan)``: the only
difference) and hand the reply back to ``NestedCall.finish``, which turns it into the answer:

- the plan: levels validated (``nested.compile_levels``, policies from the limiter's cache),
  amounts and ttl checked, the clock read once;
- the breaker of the outermost key's part (``KeyPartitioned`` stores: a shard, a rollout side),
  skipped while open; a store error or skip counted and logged by the limiter's core, then
  failing open (a degraded ``NestedDecision``, an unrecorded ``Reservation``, a ``degraded``
  ``Settlement``) or raising ``StoreUnavailable``;
- the answer: a ``NestedDecision`` (counted under the deciding level's rates when the
  limiter counts decisions), a ``Reservation`` or a ``Settlement``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Generic, Literal, TypeVar

from .breaker import Breaker
from .errors import ConfigError, RatekeeperError
from .nested import (
    NestedDecision,
    NestedOp,
    NestedPlan,
    NestedReply,
    RateSpec,
    Tier,
    compile_levels,
    decide_nested,
    degraded_nested,
)
from .plan import Policy, check_cost
from .reservations import (
    STATUSES,
    Reservation,
    Settlement,
    check_amount,
    check_ttl,
    new_id,
    reserve_plan,
    settle_plan,
)
from .stores.base import AsyncNestedStore, KeyPartitioned, NestedStore

if TYPE_CHECKING:
    from .limiter import _Core

T = TypeVar("T")
DEFAULT_TTL = 300.0
"""Seconds a reservation lives unless told otherwise: a long streamed completion fits."""


class NestedCall(Generic[T]):
    """One nested plan on its way: the store call to make and how its reply is answered."""

    __slots__ = ("breaker", "build", "core", "fallback", "plan", "start")

    def __init__(
        self,
        core: _Core,
        plan: NestedPlan,
        breaker: Breaker,
        build: Callable[[NestedReply], T],
        fallback: Callable[[], T],
    ) -> None:
        self.core = core
        self.plan = plan
        self.breaker = breaker
        self.build = build
        self.fallback = fallback
        self.start = 0.0

    def admitted(self) -> bool:
        """Whether the store may be called (its breaker closed, or this is the one trial)."""
        breaker = self.breaker
        if breaker.open_until and not breaker.allow(self.core.monotonic()):
            self.core.counts["breaker_skips"] += 1
            return False
        if self.core.metrics is not None:
            self.start = time.perf_counter()
        return True

    def finish(self, reply: NestedReply | Exception | None) -> T:
        """The answer to the store's ``reply``; an exception (or None: not called, the
        breaker open) is a failure: counted, then degraded or ``StoreUnavailable``."""
        if reply is None or isinstance(reply, Exception):
            self.core.note_failure(reply, None if reply is None else self.breaker, self.start)
            return self.fallback()
        self.core.succeeded(self.breaker, self.start)
        return self.build(reply)


class NestedCore:
    """Builds the nested calls of one limiter over its core (see the module docstring)."""

    def __init__(self, core: _Core, store: object) -> None:
        self.core = core
        self.store = store
        self.part: Callable[[str], int] | None = (
            store.partition_key if isinstance(store, KeyPartitioned) else None
        )

    def sync_store(self) -> NestedStore:
        """The store, if it runs nested plans synchronously; else ``ConfigError`` naming it."""
        if not isinstance(self.store, NestedStore):
            raise self._cannot()
        return self.store

    def async_store(self) -> AsyncNestedStore:
        """The store, if it runs nested plans on an event loop; else ``ConfigError``."""
        if not isinstance(self.store, AsyncNestedStore):
            raise self._cannot()
        return self.store

    def _cannot(self) -> ConfigError:
        return ConfigError(
            f"store {self.store!r} cannot run nested calls or reservations; every built-in "
            "store can (MemoryStore, RedisStore, ShardedRedisStore, RedisClusterStore, "
            "RolloutStore over two of them)"
        )

    def levels(self, levels: object, cost: int) -> tuple[Tier, ...]:
        """A caller's levels, validated, with the limiter's cached policies."""
        return compile_levels(levels, cost, self._policy)

    def _policy(
        self, rate: RateSpec, algorithm: str, burst: int | None, buckets: int | None, aligned: bool
    ) -> Policy:
        return self.core.policy(rate, algorithm, burst, buckets, aligned)

    def now_ms(self) -> int:
        """The limiter's clock in whole ms (rounded half up, as ``_Core.plan_of``)."""
        return int(self.core.clock() * 1000 + 0.5)

    def _call(
        self, plan: NestedPlan, build: Callable[[NestedReply], T], fallback: Callable[[], T]
    ) -> NestedCall[T]:
        part = 0 if self.part is None else self.part(plan.key)
        return NestedCall(self.core, plan, self.core.breaker_of(part), build, fallback)

    def decide(self, levels: object, cost: int, op: NestedOp = "hit") -> NestedCall[NestedDecision]:
        """A nested hit (or peek) of ``cost``."""
        check_cost(cost)
        tiers = self.levels(levels, cost)
        plan = NestedPlan(op, tiers[0].key, tiers, self.now_ms())
        return self._call(
            plan,
            lambda reply: self._decided(plan, reply),
            lambda: self._counted(degraded_nested(plan)),
        )

    def refund(self, levels: object, cost: int) -> NestedCall[None]:
        """Each level's cost given back (a nested hit the request turned out not to owe)."""
        check_cost(cost)
        tiers = self.levels(levels, cost)
        plan = NestedPlan("refund", tiers[0].key, tiers, self.now_ms())
        return self._call(plan, lambda reply: None, lambda: None)

    def _decided(self, plan: NestedPlan, reply: NestedReply) -> NestedDecision:
        return self._counted(decide_nested(plan, reply[0] == 1, reply[1]))

    def _counted(self, decision: NestedDecision) -> NestedDecision:
        core = self.core
        if core.counting is not None:
            core.count(decision.decision)
        if decision.degraded:
            core.counts["degraded"] += 1
        return decision

    def reserve(self, levels: object, estimate: int, ttl: float) -> NestedCall[Reservation]:
        """A reservation of ``estimate`` on the levels without a cost of their own."""
        check_amount(estimate, "estimate")
        ttl_ms = check_ttl(ttl)
        tiers = self.levels(levels, estimate)
        plan = reserve_plan(tiers, self.now_ms(), new_id(), ttl_ms)

        def made(decision: NestedDecision) -> Reservation:
            seconds = ttl_ms / 1000
            return Reservation(
                plan.rid, plan.key, tiers, estimate, seconds, plan.now_ms / 1000, decision
            )

        def answered(reply: NestedReply) -> Reservation:
            if reply[0] == -1:  # a random 128-bit id is never in use: a store out of step
                raise RatekeeperError(f"reservation id {plan.rid!r} is already in use")
            return made(self._decided(plan, reply))

        return self._call(plan, answered, lambda: made(self._counted(degraded_nested(plan))))

    def settle(
        self, reservation: Reservation, op: Literal["settle", "cancel"], actual: int = 0
    ) -> NestedCall[Settlement]:
        """A settle with ``actual`` (or a cancel) of an admitted reservation."""
        check_amount(actual, "actual")
        plan = settle_plan(reservation, op, actual, self.now_ms())
        return self._call(
            plan,
            lambda reply: Settlement(STATUSES[reply[0]], actual),
            lambda: Settlement("degraded", actual),
        )
