"""The engine's fast hit: a hit of a one-rate policy on an in-process store, the store called
directly with what the policy's plan fixes (``HitPlan``), the admitted answer counted and handed
back as the store's ``Outcome`` (a protocol renders its response from it without building a
``Decision``).

Per policy, what does not change between requests is worked out once: the rate's store slot,
algorithm and limit, the ``allowed`` counter series. Plans are tied to the policy object they
were made from and forgotten when the engine's generation changes (a reload or a toggle), so
none outlives its config. ``HitPlan.view`` is the protocol's own per-policy state (its response
templates), kept beside the plan so that both live and die together.

The common case is an enabled, non-blocking policy of one rate, no over-limit cache entry, and
a hit the store admits. Anything else (a rejection too) goes the general way: a rejection is
made into a ``Decision`` and settled by the engine, exactly as ``Engine.decide_now`` does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ...algorithms import Outcome
from ...decision import Decision
from ...limiter import AsyncLimiter
from ...plan import decide_one
from ..config.loader import ServiceConfig
from ..config.policies import PolicySpec
from ..metrics import Metrics
from .cache import OverLimitCache
from .results import Result

Admitted = tuple["HitPlan", Outcome, int]
"""An admitted fast hit (counted): its policy's plan, the store's outcome and the plan's time
(epoch ms)."""


class Engine(Protocol):
    """What the fast hits use of their ``Engine`` (``core`` imports this module)."""

    limiter: AsyncLimiter
    metrics: Metrics
    cache: OverLimitCache
    config: ServiceConfig
    generation: int

    def settle(self, spec: PolicySpec, key: str, cost: int, decision: Decision) -> Result: ...


class HitPlan:
    """What a policy's admitted hits share (see the module docstring)."""

    __slots__ = (
        "algorithm", "capacity", "cell", "clock", "hit_one", "limit", "policy", "prefix",
        "rate", "slot", "spec", "view",
    )  # fmt: skip

    def __init__(
        self, spec: PolicySpec, engine: Engine, hit_one: Callable[..., Outcome] | None
    ) -> None:
        policy = spec.policy
        self.hit_one = hit_one
        """The in-process store's ``hit_one``; None when the store must be asked."""
        self.spec = spec
        self.policy = policy
        self.rate = policy.rates[0]
        self.clock = engine.limiter.clock
        limit = policy.limits[0]
        self.slot = policy.slots[0]
        self.prefix = f"{len(spec.name)}:{spec.name}:"  # store_key's, before the key
        self.algorithm = policy.algorithm
        self.limit = limit
        self.capacity = limit.capacity
        self.cell = engine.metrics.decision_cell(spec.label or spec.name, "allowed")
        self.view: Any = None
        """A protocol's per-policy state (its response templates); None until it sets one."""


class FastHits:
    """An engine's fast hits: ``hit`` decides one, or says to take the general path."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._generation = engine.generation
        self._plans: dict[str, HitPlan] = {}

    def hit(self, spec: PolicySpec, key: str, cost: int) -> Admitted | Result | None:
        """An admitted hit (counted); a ``Result`` when the store rejected it (settled: counted
        and cached as ``decide_now`` does); None when the common case does not apply (nothing
        done)."""
        engine = self.engine
        plan = self.plan(spec)
        if plan is None:
            return None
        if plan.hit_one is None or (engine.cache._entries and engine.config.local_cache):
            return None  # a store to ask, or decide_now's cache check
        now = int(plan.clock() * 1000 + 0.5)  # as the limiter's ``plan``
        o = plan.hit_one(plan.slot, plan.prefix + key, plan.algorithm, plan.limit, now, cost)
        if not o[0]:
            return engine.settle(spec, key, cost, decide_one(plan.policy, o, now))
        plan.cell.inc()
        return plan, o, now

    def stored(
        self, spec: PolicySpec, key: str, cost: int, outcomes: tuple[Outcome, ...], now: int
    ) -> Admitted | Result | None:
        """``hit`` for a hit or peek the store answered (``outcomes``, of a plan made at ``now``
        ms; the over-limit cache was asked before): None when the policy has no plan (nothing
        done), as the general path would answer it otherwise."""
        plan = self.plan(spec)
        if plan is None:
            return None
        o = outcomes[0]
        if not o[0]:
            return self.engine.settle(spec, key, cost, decide_one(plan.policy, o, now))
        plan.cell.inc()
        return plan, o, now

    def plan(self, spec: PolicySpec) -> HitPlan | None:
        """The policy's plan (made now if this config has none yet); None when its hits take
        the general way."""
        engine = self.engine
        plan = self._plans.get(spec.name)
        if plan is not None and plan.spec is spec and engine.generation == self._generation:
            return plan
        if engine.generation != self._generation:
            self._generation = engine.generation
            self._plans.clear()
        if (
            not spec.enabled
            or spec.block
            or spec.plan
            or len(spec.policy.limits) != 1
            or engine.config.policies.get(spec.name) is not spec  # toggled: a copy
        ):
            return None
        plan = self._plans[spec.name] = HitPlan(spec, engine, engine.limiter.local_hit_one)
        return plan
