"""The limiters' calls on plans: ``"plan:<limit>"`` decisions, ``status`` and ``administer``.

``Limiter`` and ``AsyncLimiter`` inherit ``PlanCalls`` and ``AsyncPlanCalls``, which differ only
where ``await`` appears; the logic they share is the functions here (``quota_name``,
``quota_answer``, ``admin_plan``) and ``status`` (``status_plans``, ``status_rows``).

- A decision on a plan's limit reads the key's tenant's limits from the cache (or asks the
  source: sync in ``Limiter``, without blocking the loop in ``AsyncLimiter``) and decides with
  the limit's policy like any other: the memory store's one-rate fast path, else a ``Plan``.
- ``status(key)`` peeks every limit of the tenant with a cost of nothing, in one store call
  where the store can (``ManyStore``), and charges nothing.
- ``administer(op, key, rate, units)`` is one atomic store step (``AdminStore``) that also
  reads the state before and after; it never fails open: an admin learns that it failed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..algorithms import Outcome
from ..decision import Decision
from ..errors import ConfigError, StoreUnavailable
from ..plan import Op, Plan, Policy, decide_one, degraded, make_policy
from ..rates import Rate
from ..stores.base import AdminStore, AsyncAdminStore, AsyncManyStore, ManyStore
from .status import QuotaStatus, status_plans, status_rows

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .cache import Quotas, Resolved
    from .core import LimiterCore

    RateSpec = str | Rate | Sequence[Rate]

MAX_UNITS = 10**12
"""The most units one credit or debit moves (a rate's count is at most this too)."""


def quota_name(
    core: LimiterCore,
    rate: object,
    algorithm: str,
    burst: int | None,
    buckets: int | None,
    aligned: bool = False,
    count_rejected: bool = False,
) -> str | None:
    """The plans' limit ``rate`` names (``"plan:api"`` -> ``"api"``), None for any other rate;
    ``ConfigError`` for a plan's limit given options (the plan sets them)."""
    quotas = core.quotas
    name = None if quotas is None else quotas.limit_name(rate)
    if name is not None and (
        algorithm != "fixed_window" or burst or buckets or aligned or count_rejected
    ):
        raise ConfigError(
            f"rate {rate!r} is a plan's limit, which sets its own algorithm and options; give "
            "none with it"
        )
    return name


def local_quota_hit(
    core: LimiterCore, quotas: Quotas, key: str, rate: object, algorithm: str, cost: int
) -> Decision | None:
    """A hit on a plan's limit decided by an in-process store from a fresh cached answer,
    without a ``Plan`` (the fast path of ``limiter.core._Core.local_hit`` for
    ``"plan:<limit>"``, called with default options, an in-process store and a checked key
    and cost), or None when the call needs the full path (``PlanCalls._quota``). The same
    decision either way."""
    tenant_of = quotas.tenant_of
    r = quotas._cache.get(key if tenant_of is None else tenant_of(key))
    if r is None:
        return None
    policy = r.fast.get(rate)  # type: ignore[call-overload]  # any hashable rate: None
    if policy is None or algorithm != "fixed_window":
        return None
    now = int(core.clock() * 1000 + 0.5)  # as in ``plan``
    if now >= r.until_ms or quotas.monotonic() >= r.fresh_until:
        return None
    outcome = core.hit_one(policy.slots[0], key, policy.algorithm, policy.limits[0], now, cost)  # type: ignore[misc]  # the caller checked hit_one
    return None if outcome is None else decide_one(policy, outcome, now)


def quota_answer(
    core: LimiterCore, op: Op, key: str, resolved: Resolved, name: str, cost: int, now: int
) -> tuple[bool, Decision | None]:
    """What a call on a plan's limit needs no store call for: ``(True, answer)`` for a tenant
    let through while its source fails (``on_error="allow"``: a degraded decision; refunds
    and resets do nothing) or a hit an in-process store decides; else ``(False, None)``."""
    policy = resolved.policies[name]
    if resolved.open:
        if op != "hit" and op != "peek":
            return True, None
        core.counts["degraded"] += 1
        return True, degraded(core.plan_of(op, key, policy, cost))
    if op == "hit":
        decision = core.policy_hit(key, policy, cost, now)
        if decision is not None:
            return True, decision
    return False, None


def admin_plan(
    core: LimiterCore, op: str, key: str, rate: RateSpec | Policy, units: int, **options: Any
) -> Plan:
    """The plan of an admin's ``reset``, ``credit`` or ``debit`` of ``units`` (1 to
    ``MAX_UNITS``; a reset none) under a rate (and its ``options``) or a resolved policy."""
    if op not in ("reset", "credit", "debit"):
        raise ConfigError(f"admin op {op!r} is unknown; expected reset, credit or debit")
    if op != "reset" and (
        isinstance(units, bool) or not isinstance(units, int) or not 1 <= units <= MAX_UNITS
    ):
        raise ConfigError(
            f"units {units!r} is invalid; expected a whole number from 1 to {MAX_UNITS:_}"
        )
    if isinstance(rate, Policy):
        policy = rate
    else:
        unknown = sorted(set(options) - {"algorithm", "burst", "buckets", "aligned"})
        if unknown:
            raise ConfigError(f"option {unknown[0]!r} is unknown for an admin's change")
        policy = make_policy(
            rate,
            options.get("algorithm", "fixed_window"),
            options.get("burst"),
            options.get("buckets"),
            options.get("aligned", False),
        )
    return core.plan_of(op, key, policy, 0 if op == "reset" else units)  # type: ignore[arg-type]  # an admin op: the stores' administer takes it


class _PlanBase:
    """What both faces share: the plans and their checking."""

    if TYPE_CHECKING:

        @property
        def _core(self) -> LimiterCore:
            """The limiter's core (``_Base`` sets it)."""

    def _plans(self, quotas: Quotas | None) -> None:
        if quotas is not None:
            from .cache import Quotas

            if not isinstance(quotas, Quotas):
                raise ConfigError(
                    f"quotas={quotas!r} is invalid; expected ratekeeper.quotas.Quotas"
                )
        self._core.quotas = quotas
        self._core.quota_hit = None if quotas is None else local_quota_hit

    @property
    def quotas(self) -> Quotas:
        """The plans ``"plan:<limit>"`` is resolved with (``ConfigError`` when there are none)."""
        if self._core.quotas is None:
            raise ConfigError("this limiter has no plans; give it quotas=Quotas(plans, ...)")
        return self._core.quotas


class PlanCalls(_PlanBase):
    """``Limiter``'s calls on plans (module docstring)."""

    store: Any

    def _run(self, plan: Plan) -> Decision | None:
        raise NotImplementedError  # Limiter's

    def _quota(self, op: Op, key: str, name: str, cost: int) -> Decision | None:
        """``op`` on the key's tenant's plan limit ``name``."""
        core = self._core
        now = core.now_ms()
        quotas = self.quotas
        resolved = quotas.cached(key, now) or quotas.fetch(key, now)
        done, decision = quota_answer(core, op, key, resolved, name, cost, now)
        if done:
            return decision
        return self._run(core.plan_of(op, key, resolved.policies[name], cost))

    def status(self, key: str) -> tuple[QuotaStatus, ...]:
        """Every plan limit of the key's tenant as it stands (``QuotaStatus``: name, limit,
        used, remaining, reset, plan, source), charging nothing; ``StoreUnavailable`` if the
        store does not answer."""
        core = self._core
        now = core.now_ms()
        quotas = self.quotas
        resolved = quotas.cached(key, now) or quotas.fetch(key, now)
        plans = status_plans(core, key, resolved)
        store = self.store
        try:
            if isinstance(store, ManyStore):
                found = store.execute_many(plans)
            else:
                found = [store.execute(plan) for plan in plans]
        except Exception as exc:
            raise StoreUnavailable(f"status of {key[:100]!r}: {exc}") from exc
        return status_rows(resolved, plans, found)

    def administer(
        self, op: str, key: str, rate: RateSpec | Policy, units: int = 0, **options: Any
    ) -> tuple[Plan, tuple[Outcome, ...], tuple[Outcome, ...]]:
        """An admin's ``reset``, ``credit`` or ``debit`` of ``units`` on ``key`` under a rate
        (or a resolved ``Policy``), atomic with the traffic in flight: the plan, and the
        outcomes of a peek of nothing before and after it. Never fails open."""
        plan = admin_plan(self._core, op, key, rate, units, **options)
        store = self.store
        if not isinstance(store, AdminStore):
            raise ConfigError(f"store {store!r} has no administer(); it cannot reset or credit")
        try:
            before, after = store.administer(plan)
        except Exception as exc:
            raise StoreUnavailable(f"{op} of {key[:100]!r}: {exc}") from exc
        return plan, before, after


class AsyncPlanCalls(_PlanBase):
    """``AsyncLimiter``'s calls on plans: ``PlanCalls`` with ``await``."""

    store: Any

    async def _run(self, plan: Plan) -> Decision | None:
        raise NotImplementedError  # AsyncLimiter's

    async def _quota(self, op: Op, key: str, name: str, cost: int) -> Decision | None:
        """See ``PlanCalls._quota``."""
        core = self._core
        now = core.now_ms()
        quotas = self.quotas
        resolved = quotas.cached(key, now) or await quotas.fetch_async(key, now)
        done, decision = quota_answer(core, op, key, resolved, name, cost, now)
        if done:
            return decision
        return await self._run(core.plan_of(op, key, resolved.policies[name], cost))

    async def status(self, key: str) -> tuple[QuotaStatus, ...]:
        """See ``PlanCalls.status``."""
        core = self._core
        now = core.now_ms()
        quotas = self.quotas
        resolved = quotas.cached(key, now) or await quotas.fetch_async(key, now)
        plans = status_plans(core, key, resolved)
        store = self.store
        try:
            if isinstance(store, AsyncManyStore):
                found = await store.execute_many_async(plans)
            else:
                found = [await store.execute_async(plan) for plan in plans]
        except Exception as exc:
            raise StoreUnavailable(f"status of {key[:100]!r}: {exc}") from exc
        return status_rows(resolved, plans, found)

    async def administer(
        self, op: str, key: str, rate: RateSpec | Policy, units: int = 0, **options: Any
    ) -> tuple[Plan, tuple[Outcome, ...], tuple[Outcome, ...]]:
        """See ``PlanCalls.administer``."""
        plan = admin_plan(self._core, op, key, rate, units, **options)
        store = self.store
        if not isinstance(store, AsyncAdminStore):
            raise ConfigError(f"store {store!r} has no administer(); it cannot reset or credit")
        try:
            before, after = await store.administer_async(plan)
        except Exception as exc:
            raise StoreUnavailable(f"{op} of {key[:100]!r}: {exc}") from exc
        return plan, before, after
