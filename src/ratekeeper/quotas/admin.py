"""Support's tools: reset, credit or debit a key's limit, override a tenant's limit, move a
tenant to another plan — each written to the audit log (``audit``).

``Admin(limiter)`` (``AsyncAdmin`` for an ``AsyncLimiter``: the same methods, awaited) acts on
the limiter's store and plans:

- ``reset(key, limit)``: forget the key's counters of ``limit``;
- ``credit(key, limit, units)``: give ``units`` back in the current period (a fixed window's
  count may go below zero: a top-up; a bucket fills up to its capacity);
- ``debit(key, limit, units)``: charge ``units`` whatever the limit;
- ``override(tenant, limit, rate, until=...)``: count ``limit`` at ``rate`` for the tenant
  until ``until`` (epoch seconds, the limiter's clock; it must be in the future), keeping
  what it has used; ``clear_override`` ends it; ``set_plan`` moves a tenant;
- ``invalidate(tenant)``: drop the tenant's cached plan here (a ``RedisSource`` tells every
  process itself).

``limit`` is a plan limit's name (``"exports"`` or ``"plan:exports"``: the key's tenant's,
with its override if any) or a rate (``"100/hour"``, with ``algorithm=`` and its options) for
keys outside the plans. A reset, credit or debit is one atomic store step with the state
before and after it (``Limiter.administer``), so concurrent traffic is neither lost nor
double-counted, and the audit entry records exactly what changed. ``by`` (who) is required.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..algorithms import Outcome
from ..errors import ConfigError
from ..plan import Plan, Policy
from .audit import Audit, AuditEntry, LogAudit, record
from .overrides import Override
from .status import QuotaStatus

if TYPE_CHECKING:
    from .cache import Quotas, Resolved
    from .calls import AsyncPlanCalls, PlanCalls


@dataclass(frozen=True, slots=True)
class Adjustment:
    """A reset, credit or debit as applied: the rows of ``status`` before and after it (one
    per rate of the limit) and the audit entry written."""

    action: str
    key: str
    limit: str
    units: int
    before: tuple[QuotaStatus, ...]
    after: tuple[QuotaStatus, ...]
    entry: AuditEntry


def check_by(by: object) -> str:
    """Who made a change: 1-200 characters (it goes into the audit log)."""
    if not isinstance(by, str) or not by.strip() or len(by) > 200:
        raise ConfigError(f"by={str(by)[:50]!r} is invalid; say who makes the change (1-200 chars)")
    return by


class _Shared:
    """What ``Admin`` and ``AsyncAdmin`` share: targets, rows and audit entries."""

    def __init__(self, limiter: PlanCalls | AsyncPlanCalls, audit: Audit | None = None) -> None:
        self.limiter = limiter
        quotas = limiter._core.quotas
        self.audit: Audit = audit or (quotas.audit if quotas is not None else LogAudit())

    @property
    def plans(self) -> Quotas:
        return self.limiter.quotas

    def now(self) -> float:
        return float(self.limiter._core.clock())

    def target(self, key: str, limit: str) -> tuple[str, Resolved | None]:
        """``(plan limit name, None)`` when ``limit`` names one (resolved by the caller), else
        ``(limit, None)`` for a rate."""
        quotas = self.limiter._core.quotas
        if quotas is not None:
            name = limit[5:] if limit.startswith("plan:") else limit
            if name in quotas.plans.limit_names:
                return name, None
            if limit.startswith("plan:"):
                quotas.limit_name(limit)  # raises, naming the limits there are
        return "", None

    def rows(
        self,
        name: str,
        policy: Policy,
        outcomes: tuple[Outcome, ...],
        resolved: Resolved | None,
    ) -> tuple[QuotaStatus, ...]:
        out = []
        override = None if resolved is None else resolved.overrides.get(name)
        for rate, lim, o in zip(policy.rates, policy.limits, outcomes, strict=True):
            out.append(
                QuotaStatus(
                    name or rate.code,
                    rate.code,
                    lim.capacity,
                    lim.capacity - o.remaining,
                    o.remaining,
                    o.reset_ms / 1000,
                    "" if resolved is None else resolved.plan,
                    "rate" if resolved is None else resolved.source_of(name),
                    policy.algorithm.NAME,
                    None if override is None else override.until,
                )
            )
        return tuple(out)

    def adjusted(
        self,
        op: str,
        key: str,
        limit: str,
        units: int,
        by: str,
        reason: str,
        applied: tuple[Plan, tuple[Outcome, ...], tuple[Outcome, ...]],
        name: str,
        resolved: Resolved | None,
    ) -> Adjustment:
        plan, before, after = applied
        rows_before = self.rows(name, plan.policy, before, resolved)
        rows_after = self.rows(name, plan.policy, after, resolved)
        entry = AuditEntry(
            plan.now_ms / 1000,
            by,
            op,
            key,
            name or limit,
            units,
            reason,
            _state(rows_before),
            _state(rows_after),
        )
        record((self.audit,), entry)
        return Adjustment(op, key, name or limit, units, rows_before, rows_after, entry)

    def override_entry(
        self,
        action: str,
        tenant: str,
        name: str,
        by: str,
        reason: str,
        before: Override | None,
        after: Override | None,
    ) -> AuditEntry:
        entry = AuditEntry(
            self.now(),
            by,
            action,
            tenant,
            name,
            0,
            reason,
            {} if before is None else before.to_dict(),
            {} if after is None else after.to_dict(),
        )
        record((self.audit,), entry)
        return entry

    def prepare_override(
        self, tenant: str, limit: str, rate: str, until: float | None, by: str, reason: str
    ) -> tuple[str, Override]:
        check_by(by)
        name = limit[5:] if limit.startswith("plan:") else limit
        if until is not None and not (isinstance(until, int | float) and math.isfinite(until)):
            raise ConfigError(f"until {until!r} must be epoch seconds")
        override = self.plans.check_override(tenant, name, rate, until, self.now())
        return name, Override(override.spec, override.until, by, reason, override.at)

    def current_override(self, tenant: str, name: str) -> Override | None:
        answer = self.plans.lookup(tenant)
        return None if answer is None else answer.overrides.get(name)

    def current_plan(self, tenant: str) -> str:
        answer = self.plans.lookup(tenant)
        plan = None if answer is None else answer.plan
        return self.plans.plans.default if plan is None else plan


def _state(rows: tuple[QuotaStatus, ...]) -> dict[str, Any]:
    """The rows of one limit as the audit records them: per rate, used, remaining, reset."""
    return {
        row.rate: {"used": row.used, "remaining": row.remaining, "reset_at": row.reset_at}
        for row in rows
    }


class Admin(_Shared):
    """The admin operations on a ``Limiter`` (module docstring)."""

    limiter: PlanCalls

    def __init__(self, limiter: PlanCalls, audit: Audit | None = None) -> None:
        super().__init__(limiter, audit)

    def _change(
        self, op: str, key: str, limit: str, units: int, by: str, reason: str, **options: Any
    ) -> Adjustment:
        check_by(by)
        name, _ = self.target(key, limit)
        resolved = None
        rate: Any = limit
        if name:
            quotas = self.plans
            now = int(self.now() * 1000)
            resolved = quotas.cached(key, now) or quotas.fetch(key, now)
            rate = resolved.policies[name]
        applied = self.limiter.administer(op, key, rate, units, **options)
        return self.adjusted(op, key, limit, units, by, reason, applied, name, resolved)

    def reset(
        self, key: str, limit: str, *, by: str, reason: str = "", **options: Any
    ) -> Adjustment:
        """Forget ``key``'s counters of ``limit``."""
        return self._change("reset", key, limit, 0, by, reason, **options)

    def credit(
        self, key: str, limit: str, units: int, *, by: str, reason: str = "", **options: Any
    ) -> Adjustment:
        """Give ``units`` back in ``key``'s current period of ``limit``."""
        return self._change("credit", key, limit, units, by, reason, **options)

    def debit(
        self, key: str, limit: str, units: int, *, by: str, reason: str = "", **options: Any
    ) -> Adjustment:
        """Charge ``units`` to ``key``'s current period of ``limit``, whatever the limit."""
        return self._change("debit", key, limit, units, by, reason, **options)

    def override(
        self,
        tenant: str,
        limit: str,
        rate: str,
        *,
        until: float | None = None,
        by: str,
        reason: str = "",
    ) -> Override:
        """Count ``tenant``'s ``limit`` at ``rate`` until ``until`` (None: until cleared);
        the counters stay. The change reaches every process within the plans' TTL (at once
        through a ``RedisSource``)."""
        name, override = self.prepare_override(tenant, limit, rate, until, by, reason)
        before = self.current_override(tenant, name)
        self.plans.set_override(tenant, name, override)
        self.override_entry("override", tenant, name, by, reason, before, override)
        return override

    def clear_override(self, tenant: str, limit: str, *, by: str, reason: str = "") -> None:
        """End ``tenant``'s override of ``limit`` now."""
        check_by(by)
        name = limit[5:] if limit.startswith("plan:") else limit
        before = self.current_override(tenant, name)
        self.plans.set_override(tenant, name, None)
        self.override_entry("clear-override", tenant, name, by, reason, before, None)

    def set_plan(self, tenant: str, plan: str | None, *, by: str, reason: str = "") -> None:
        """Move ``tenant`` to ``plan`` (None: the default); its counters stay."""
        check_by(by)
        old = self.current_plan(tenant)
        self.plans.set_plan(tenant, plan)
        entry = AuditEntry(
            self.now(), by, "plan", tenant, "", 0, reason, {"plan": old}, {"plan": plan}
        )
        record((self.audit,), entry)

    def invalidate(self, tenant: str | None = None) -> None:
        """Drop ``tenant``'s cached plan (None: every tenant's) in this process."""
        self.plans.invalidate(tenant)


class AsyncAdmin(_Shared):
    """``Admin`` for an ``AsyncLimiter``: the same methods, awaited (writes to a plan source
    run in a thread)."""

    limiter: AsyncPlanCalls

    def __init__(self, limiter: AsyncPlanCalls, audit: Audit | None = None) -> None:
        super().__init__(limiter, audit)

    async def _change(
        self, op: str, key: str, limit: str, units: int, by: str, reason: str, **options: Any
    ) -> Adjustment:
        check_by(by)
        name, _ = self.target(key, limit)
        resolved = None
        rate: Any = limit
        if name:
            quotas = self.plans
            now = int(self.now() * 1000)
            resolved = quotas.cached(key, now) or await quotas.fetch_async(key, now)
            rate = resolved.policies[name]
        applied = await self.limiter.administer(op, key, rate, units, **options)
        return self.adjusted(op, key, limit, units, by, reason, applied, name, resolved)

    async def reset(
        self, key: str, limit: str, *, by: str, reason: str = "", **options: Any
    ) -> Adjustment:
        """See ``Admin.reset``."""
        return await self._change("reset", key, limit, 0, by, reason, **options)

    async def credit(
        self, key: str, limit: str, units: int, *, by: str, reason: str = "", **options: Any
    ) -> Adjustment:
        """See ``Admin.credit``."""
        return await self._change("credit", key, limit, units, by, reason, **options)

    async def debit(
        self, key: str, limit: str, units: int, *, by: str, reason: str = "", **options: Any
    ) -> Adjustment:
        """See ``Admin.debit``."""
        return await self._change("debit", key, limit, units, by, reason, **options)

    async def override(
        self,
        tenant: str,
        limit: str,
        rate: str,
        *,
        until: float | None = None,
        by: str,
        reason: str = "",
    ) -> Override:
        """See ``Admin.override``."""
        name, override = self.prepare_override(tenant, limit, rate, until, by, reason)
        before = await asyncio.to_thread(self.current_override, tenant, name)
        await asyncio.to_thread(self.plans.set_override, tenant, name, override)
        self.override_entry("override", tenant, name, by, reason, before, override)
        return override

    async def clear_override(self, tenant: str, limit: str, *, by: str, reason: str = "") -> None:
        """See ``Admin.clear_override``."""
        check_by(by)
        name = limit[5:] if limit.startswith("plan:") else limit
        before = await asyncio.to_thread(self.current_override, tenant, name)
        await asyncio.to_thread(self.plans.set_override, tenant, name, None)
        self.override_entry("clear-override", tenant, name, by, reason, before, None)

    async def set_plan(self, tenant: str, plan: str | None, *, by: str, reason: str = "") -> None:
        """See ``Admin.set_plan``."""
        check_by(by)
        old = await asyncio.to_thread(self.current_plan, tenant)
        await asyncio.to_thread(self.plans.set_plan, tenant, plan)
        entry = AuditEntry(
            self.now(), by, "plan", tenant, "", 0, reason, {"plan": old}, {"plan": plan}
        )
        record((self.audit,), entry)

    def invalidate(self, tenant: str | None = None) -> None:
        """See ``Admin.invalidate``."""
        self.plans.invalidate(tenant)
