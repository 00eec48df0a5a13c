"""``Quotas``: each tenant's limits, resolved from the plans and a source, cached in process.

A limiter given ``quotas=`` takes ``"plan:<limit>"`` wherever it takes a rate: the key's tenant
(``tenant(key)``, the key itself by default) is looked up in the source, its plan's limit (or
the tenant's override of it) becomes the policy, and the decision is counted on the limit's own
counters, which a change of plan or override keeps.

Cache rules:

- an answer is served for ``ttl`` seconds of the ``monotonic`` clock, then asked again (the
  first decision after that waits for the source); an override's ``until`` (epoch seconds,
  the limiter's clock) ends it sooner;
- ``invalidate(tenant)`` drops one tenant (``None``: all) at once: the admin operations call it,
  and a ``RedisSource`` publishes every change so that every process's cache calls it;
- an unknown tenant (the source answers None) gets the ``default`` plan;
- a failing source (an exception, or an answer that is not a plan of ours, a bad override)
  is logged and counted, and the tenant keeps its last known answer, asked again after
  ``retry`` seconds; a tenant never seen gets the default plan (``on_error="default"``), or is
  let through like a failing store (``on_error="allow"``: a degraded decision) — never "no
  limit" unless so configured;
- at most ``max_tenants`` answers are kept (the oldest dropped first), so hostile tenant names
  cannot grow memory without bound.

A decision served from the cache costs two dict lookups and a monotonic clock read, and no
store round trip (``benchmarks/bench_quotas.py``).
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..clock import Clock
from ..errors import ConfigError, RatekeeperError
from ..plan import Policy
from .audit import Audit, LogAudit
from .catalog import PlanLimit, Plans, check_name
from .overrides import Override, TenantPlan
from .sources import AsyncSource, ListeningSource, Source, StaticSource, WritableSource

log = logging.getLogger("ratekeeper")

ORIGINS = ("plan", "default", "last-known", "default-on-error", "allow-on-error")
"""Where a tenant's plan came from: its source's answer, the default for an unknown tenant,
the last answer kept through a failing source, the default or a pass for a tenant the failing
source never answered for. A limit of the tenant's may then be an ``override``."""


@dataclass(slots=True)
class Resolved:
    """A tenant's limits as the cache holds them (``policies`` and ``limits`` by name)."""

    tenant: str
    plan: str
    origin: str
    policies: dict[str, Policy]
    limits: dict[str, PlanLimit]
    overrides: dict[str, Override]
    answer: TenantPlan | None
    fresh_until: float = 0.0
    """When to ask the source again (monotonic seconds)."""
    until_ms: float = math.inf
    """When the earliest live override ends (epoch ms of the limiter's clock)."""
    open: bool = False
    """``on_error="allow"``: decisions pass, degraded."""
    known: bool = field(default=True)
    """Whether ``answer`` came from the source (else nothing was ever learnt)."""
    fast: dict[str, Policy] = field(default_factory=dict)
    """``"plan:<limit>"`` -> its policy, for the limits of one rate that an in-process store
    decides on the fast path (``calls.local_quota_hit``); empty when ``open``."""

    def source_of(self, name: str) -> str:
        """Where limit ``name`` came from: ``override`` or the plan's origin."""
        return "override" if name in self.overrides else self.origin


class Quotas:
    """Plans, a source of tenants' plans, and the cache between them (module docstring)."""

    def __init__(
        self,
        plans: Plans,
        source: Source | None = None,
        *,
        overrides: Source | None = None,
        ttl: float = 30.0,
        retry: float = 5.0,
        tenant: Callable[[str], str] | None = None,
        on_error: str = "default",
        max_tenants: int = 100_000,
        audit: Audit | None = None,
        listen: bool = True,
        monotonic: Clock = time.monotonic,
    ) -> None:
        if not isinstance(plans, Plans):
            raise ConfigError(f"plans {plans!r} is invalid; expected ratekeeper.quotas.Plans")
        if source is not None and plans.customers:
            raise ConfigError(
                "the plans assign customers and a source is given as well; put the customers "
                "in the source"
            )
        source = StaticSource(plans.customers) if source is None else source
        if not isinstance(source, Source | AsyncSource):
            raise ConfigError(f"source {source!r} is invalid; expected an object with lookup()")
        if overrides is None:
            overrides = source if isinstance(source, WritableSource) else StaticSource()
        if not isinstance(overrides, WritableSource):
            raise ConfigError(f"overrides {overrides!r} must be writable (set_override)")
        for name, value, low in (("ttl", ttl, 0.0), ("retry", retry, 0.0)):
            if isinstance(value, bool) or not isinstance(value, int | float) or value < low:
                raise ConfigError(f"{name}={value!r} is invalid; expected seconds >= 0")
        if on_error not in ("default", "allow"):
            raise ConfigError(f"on_error={on_error!r} is invalid; expected 'default' or 'allow'")
        if isinstance(max_tenants, bool) or not isinstance(max_tenants, int) or max_tenants < 1:
            raise ConfigError(f"max_tenants={max_tenants!r} is invalid; expected a number >= 1")
        if tenant is not None and not callable(tenant):
            raise ConfigError(f"tenant={tenant!r} is invalid; expected a function of the key")
        self.plans = plans
        self.source = source
        self.overrides = overrides
        self.ttl = float(ttl)
        self.retry = float(retry)
        self.tenant_of = tenant
        self.on_error = on_error
        self.max_tenants = max_tenants
        self.audit: Audit = LogAudit() if audit is None else audit
        self.monotonic = monotonic
        self.refs = {f"plan:{name}": name for name in plans.limit_names}
        """``"plan:<limit>"`` -> limit name, for every limit of the plans."""
        self._cache: OrderedDict[str, Resolved] = OrderedDict()
        self._policies: dict[tuple[str, str, str], Policy] = {}
        self._lock = threading.Lock()
        self._last_log = -math.inf
        self.counts = {"lookups": 0, "source_errors": 0, "invalidations": 0}
        self._stops: list[Callable[[], None]] = []
        if listen:
            for s in {id(source): source, id(overrides): overrides}.values():
                if isinstance(s, ListeningSource):
                    self._stops.append(s.listen(self.invalidate))

    def close(self) -> None:
        """Stop listening for changes."""
        for stop in self._stops:
            stop()
        self._stops.clear()

    def tenant(self, key: str) -> str:
        """The tenant of a caller key."""
        return key if self.tenant_of is None else self.tenant_of(key)

    def limit_name(self, rate: object) -> str | None:
        """The limit a rate spec names (``"plan:api"`` -> ``"api"``), else None."""
        if type(rate) is not str or not rate.startswith("plan:"):
            return None
        name = self.refs.get(rate)
        if name is None:
            raise ConfigError(
                f"rate {rate!r} names no limit of the plans; expected one of "
                f"{', '.join(sorted(self.refs))}"
            )
        return name

    def cached(self, key: str, now_ms: int) -> Resolved | None:
        """The key's tenant's limits if the cache holds a fresh answer, else None (the hot
        path: a caller then asks ``fetch`` or ``fetch_async``)."""
        r = self._cache.get(key if self.tenant_of is None else self.tenant_of(key))
        if r is None or now_ms >= r.until_ms or self.monotonic() >= r.fresh_until:
            return None
        return r

    def fetch(self, key: str, now_ms: int) -> Resolved:
        """Ask the source for the key's tenant (sync), cache and return the answer."""
        tenant = self.tenant(key)
        try:
            answer, error = self.lookup(tenant), None
        except Exception as exc:
            answer, error = None, exc
        return self._settle(tenant, answer, error, now_ms)

    async def fetch_async(self, key: str, now_ms: int) -> Resolved:
        """``fetch`` without blocking the event loop (a sync-only source runs in a thread)."""
        tenant = self.tenant(key)
        try:
            answer, error = await self.lookup_async(tenant), None
        except Exception as exc:
            answer, error = None, exc
        return self._settle(tenant, answer, error, now_ms)

    def resolved(self, key: str, now_ms: int) -> Resolved:
        """The key's tenant's limits: cached, or fetched now."""
        return self.cached(key, now_ms) or self.fetch(key, now_ms)

    def lookup(self, tenant: str) -> TenantPlan | None:
        """What the source (and the override store) say about ``tenant`` now, uncached and
        unchecked."""
        self.counts["lookups"] += 1
        source = self.source
        if not isinstance(source, Source):
            raise ConfigError("this plan source answers only lookup_async; use AsyncLimiter")
        answer = source.lookup(tenant)
        if self.overrides is not source:
            answer = _merge(answer, self.overrides.lookup(tenant))
        return answer

    async def lookup_async(self, tenant: str) -> TenantPlan | None:
        """``lookup`` without blocking the event loop."""
        self.counts["lookups"] += 1
        answer = await _ask(self.source, tenant)
        if self.overrides is not self.source:
            answer = _merge(answer, await _ask(self.overrides, tenant))
        return answer

    def _settle(
        self, tenant: str, answer: TenantPlan | None, error: BaseException | None, now_ms: int
    ) -> Resolved:
        """Check an answer against the plans and cache what it resolves to (or, when the
        source failed or answered garbage, the last known answer or the fallback)."""
        resolved = None
        if error is None:
            try:
                resolved = self.resolve(tenant, answer, now_ms)
            except RatekeeperError as exc:
                error = exc
        if resolved is None:
            assert error is not None
            resolved = self._fallback(tenant, error, now_ms)
            resolved.fresh_until = self.monotonic() + min(self.retry, self.ttl)
        else:
            resolved.fresh_until = self.monotonic() + self.ttl
        with self._lock:
            cache = self._cache
            cache[tenant] = resolved
            if len(cache) > self.max_tenants:
                cache.popitem(last=False)
        return resolved

    def resolve(
        self, tenant: str, answer: TenantPlan | None, now_ms: int, origin: str = ""
    ) -> Resolved:
        """What ``answer`` means for ``tenant`` at ``now_ms`` (pure: nothing cached);
        ``ConfigError`` for a plan or override the plans cannot hold."""
        plans = self.plans
        plan = plans.default if answer is None or answer.plan is None else answer.plan
        limits = plans.plans.get(plan)
        if limits is None:
            raise ConfigError(f"plan source put {tenant!r} on plan {plan!r}, which is not a plan")
        live = {} if answer is None else answer.live_overrides(now_ms / 1000)
        policies: dict[str, Policy] = {}
        used: dict[str, PlanLimit] = {}
        for name, limit in limits.items():
            override = live.get(name)
            if override is not None:
                limit = self._overridden(plan, limit, override)
            policies[name] = limit.policy
            used[name] = limit
        unknown = sorted(set(live) - set(limits))
        if unknown:
            raise ConfigError(f"plan source overrides {unknown[0]!r} of {tenant!r}: no such limit")
        ends = [o.until * 1000 for o in live.values() if o.until is not None]
        if not origin:
            origin = "default" if answer is None or answer.plan is None else "plan"
        return Resolved(
            tenant,
            plan,
            origin,
            policies,
            used,
            live,
            answer,
            until_ms=min(ends, default=math.inf),
            fast={f"plan:{n}": p for n, p in policies.items() if len(p.limits) == 1},
        )

    def _overridden(self, plan: str, limit: PlanLimit, override: Override) -> PlanLimit:
        key = (plan, limit.name, override.spec)
        policy = self._policies.get(key)
        if policy is not None:
            return _with_policy(limit, policy)
        changed = limit.with_rates(override.rates)
        if len(self._policies) >= 10_000:
            self._policies.clear()
        self._policies[key] = changed.policy
        return changed

    def _fallback(self, tenant: str, error: BaseException, now_ms: int) -> Resolved:
        self.counts["source_errors"] += 1
        now = self.monotonic()
        if now - self._last_log >= 60.0:
            self._last_log = now
            log.warning(
                "ratekeeper plan source failed for tenant %r (%s); using its last known plan, "
                "else %s",
                tenant[:100],
                error,
                "the default plan" if self.on_error == "default" else "letting it through",
            )
        old = self._cache.get(tenant)
        if old is not None and old.known:
            try:
                return self.resolve(tenant, old.answer, now_ms, origin="last-known")
            except RatekeeperError:
                pass
        origin = "default-on-error" if self.on_error == "default" else "allow-on-error"
        r = self.resolve(tenant, None, now_ms, origin=origin)
        r.known = False
        r.open = self.on_error == "allow"
        if r.open:
            r.fast = {}
        return r

    def status_of(self, key: str, name: str, default: int = 429) -> int:
        """The HTTP status an exhausted limit ``name`` of the key's tenant answers with (its
        plan's ``status``, 429 or 403), from the cache; ``default`` if it holds nothing."""
        r = self._cache.get(self.tenant(key))
        limit = None if r is None else r.limits.get(name)
        return default if limit is None else limit.status

    def invalidate(self, tenant: str | None = None) -> None:
        """Drop ``tenant``'s cached answer (``None``: every tenant's)."""
        self.counts["invalidations"] += 1
        with self._lock:
            if tenant is None:
                self._cache.clear()
            else:
                self._cache.pop(tenant, None)

    def stats(self) -> dict[str, Any]:
        """``lookups`` (source calls), ``source_errors``, ``invalidations``, ``cached``."""
        return {**self.counts, "cached": len(self._cache)}

    # changes (the admin operations call these, then write the audit)

    def check_override(
        self, tenant: str, name: str, rate: str, until: float | None, now: float
    ) -> Override:
        """A valid override of ``name`` for ``tenant`` at epoch second ``now``, or
        ``ConfigError`` (an unknown limit, a rate its algorithm cannot count, an expiry that
        has passed)."""
        check_tenant(tenant)
        if name not in self.plans.limit_names:
            raise ConfigError(
                f"limit {name!r} is unknown; expected one of {list(self.plans.limit_names)}"
            )
        if until is not None:
            if isinstance(until, bool) or not isinstance(until, int | float):
                raise ConfigError(f"until {until!r} must be epoch seconds")
            if not math.isfinite(until) or until <= now:
                raise ConfigError(
                    f"until {until!r} is not in the future (now is {now:.3f}); an override "
                    "must end after it starts"
                )
        override = Override.make(rate, until=until, at=now)
        for limits in self.plans.plans.values():  # the rate must work on every plan's limit
            limits[name].with_rates(override.rates)
        return override

    def set_override(self, tenant: str, name: str, override: Override | None) -> None:
        """Write (None: remove) an override and drop the tenant from the cache."""
        self.overrides.set_override(tenant, name, override)
        self.invalidate(tenant)

    def set_plan(self, tenant: str, plan: str | None) -> None:
        """Move ``tenant`` to ``plan`` (None: the default) where the source can be written."""
        check_tenant(tenant)
        if plan is not None:
            check_name(plan, "plan name")
            if plan not in self.plans.plans:
                raise ConfigError(
                    f"plan {plan!r} is unknown; expected one of {sorted(self.plans.plans)}"
                )
        target = self.source if isinstance(self.source, WritableSource) else None
        if target is None:
            raise ConfigError(
                "the plan source cannot be written (a function); change the plan where it "
                "comes from, then invalidate the tenant"
            )
        target.set_plan(tenant, plan)
        self.invalidate(tenant)


def check_tenant(tenant: object) -> str:
    """A tenant is a non-empty string of at most 1,000 characters."""
    if not isinstance(tenant, str) or not tenant or len(tenant) > 1000:
        raise ConfigError(f"tenant {str(tenant)[:100]!r} is invalid; expected 1-1000 characters")
    return tenant


def _with_policy(limit: PlanLimit, policy: Policy) -> PlanLimit:
    """``limit`` at the rates of ``policy`` (made before), without making the policy again."""
    changed = object.__new__(PlanLimit)
    for name, value in (
        ("name", limit.name),
        ("rates", policy.rates),
        ("algorithm", limit.algorithm),
        ("burst", limit.burst),
        ("buckets", limit.buckets),
        ("status", limit.status),
        ("policy", policy),
    ):
        object.__setattr__(changed, name, value)
    return changed


def _merge(main: TenantPlan | None, extra: TenantPlan | None) -> TenantPlan | None:
    """The main source's answer with the override store's overrides on top."""
    if extra is None or not extra.overrides:
        return main
    base = main or TenantPlan()
    return TenantPlan(base.plan, {**base.overrides, **extra.overrides})


async def _ask(source: object, tenant: str) -> TenantPlan | None:
    if isinstance(source, AsyncSource):
        return await source.lookup_async(tenant)
    assert isinstance(source, Source)
    return await asyncio.to_thread(source.lookup, tenant)
