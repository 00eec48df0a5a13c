"""The service's decision engine: named policies and Envoy descriptors -> ``Decision``s.

Both APIs (HTTP JSON and gRPC) call this module; it does no parsing of the wire formats.

- Store keys are namespaced by policy name (``<len>:<name>:<key>``), so two policies with
  the same rates never share a counter, whatever characters their names and keys hold.
- ``enabled: false`` answers "allowed" without touching the store; ``shadow: true`` counts
  as usual but always answers "allowed" (the would-be rejection shows in metrics and in the
  answer's ``shadow`` flag); Envoy's ``requests_per_unit: 0`` and the ``block`` toggle (the
  emergency stop) reject without the store.
- The over-limit cache: after the store rejects ``cost`` units of a key, requests of at least
  that cost are rejected locally until the moment the store said a retry could succeed, with
  ``retry_after`` counted down from it. ``remaining`` is the store's value at the rejection:
  never above the truth for window algorithms, and for refilling ones below it by less than
  ``cost`` (the request still does not fit). A refund or reset of the key forgets the entry.
- Concurrency policies (``kind: concurrency``): ``acquire`` takes a lease of the policy's
  capacity and TTL under ``store_key(name, key)`` and answers an opaque lease token,
  ``lease_token``: base64url of ``[policy, key, lease id]``. ``release`` needs only the token
  (it works on any instance of the service, and after a reload that dropped the policy). A
  token names a random 72-bit lease id, so a forged one releases nothing. ``enabled: false``
  and a full shadow policy answer "acquired" with a token that holds nothing (empty id);
  so does fail-open (``degraded``).
- Envoy's ``ShouldRateLimit`` is ``envoy.rls.Envoy``, which decides each descriptor's limit with
  ``decide`` on a key of its own (a counter shared as envoyproxy/ratelimit shares it).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, TypeVar

from ...clock import Clock
from ...decision import Decision
from ...errors import BadRequest
from ...limiter import AsyncLimiter, Pending
from ...overload.concurrency import AsyncConcurrencyLimiter, Lease
from ...plan import Op, decide
from ..config.loader import ConcurrencySpec, PolicySpec, ServiceConfig
from ..metrics import Metrics
from .cache import OverLimitCache
from .fast import Admitted, FastHits
from .keys import lease_token, parse_lease_token, store_key
from .nested import Nested
from .quotas import PlanService
from .results import LeaseResult, Result, _result

UNLIMITED_REMAINING = 2**32 - 1
MAX_COST = 2**31 - 1
S = TypeVar("S", PolicySpec, ConcurrencySpec)


class Engine:
    """Answers hit/peek/refund/reset on named policies, Envoy descriptor requests, and lease
    acquire/release on concurrency policies."""

    def __init__(
        self,
        config: ServiceConfig,
        limiter: AsyncLimiter,
        metrics: Metrics,
        clock: Clock = time.time,
        leases: AsyncConcurrencyLimiter | None = None,
    ) -> None:
        self.limiter = limiter
        self.leases = leases
        self.metrics = metrics
        self.clock = clock
        self.cache = OverLimitCache()
        self.config = config
        self.overrides: dict[str, tuple[bool, bool, bool]] = {}
        """Runtime toggles by policy: enabled, shadow, blocked (until the next reload)."""
        self.plans = PlanService(limiter)
        """The plans of ``plan:<limit>`` policies and the admin tools (``engine.quotas``)."""
        self.plans.apply(config.quotas)
        self.generation = 0
        """Changes whenever a policy may answer differently (reload, toggle): what callers
        derived from ``spec()`` and the config (Envoy's resolved descriptors) is stale then."""
        self.fast = FastHits(self)
        """The fast hit on an in-process store (``answer_now`` asks it first)."""
        self.nested = Nested(self)
        """Nested decisions and reservations over the policies (``/v1/hit`` with levels)."""
        self._zero(config)

    def swap(self, config: ServiceConfig) -> None:
        """Start answering from a new config (runtime toggles and the local cache reset)."""
        self.plans.apply(config.quotas)
        self.config = config
        self.generation += 1
        self.overrides.clear()
        self.cache.clear()
        self._zero(config)

    def _zero(self, config: ServiceConfig) -> None:
        """Every configured policy's decision counters at zero (``Metrics.zero``)."""
        zero = getattr(self.metrics, "zero", None)  # the service's Metrics
        if zero is not None:
            named = [spec.label or name for name, spec in config.policies.items()]
            zero([*named, *config.concurrency])

    def spec(self, name: object) -> PolicySpec:
        """The named rate policy with runtime toggles applied, or ``BadRequest`` (404)."""
        return self._named(
            name, self.config.policies, self.config.concurrency,
            "a concurrency policy; use /v1/concurrency/acquire",
        )  # fmt: skip

    def concurrency_spec(self, name: object) -> ConcurrencySpec:
        """The named concurrency policy with runtime toggles applied, or ``BadRequest`` (404)."""
        return self._named(
            name, self.config.concurrency, self.config.policies,
            "a rate policy; use /v1/hit (not concurrency)",
        )  # fmt: skip

    def _named(
        self, name: object, table: Mapping[str, S], other: Mapping[str, object], other_kind: str
    ) -> S:
        """``table[name]`` with toggles applied; 404 when absent, naming the right route when
        ``name`` is a policy of the other kind."""
        if not isinstance(name, str) or not name:
            raise BadRequest("policy", f"policy {name!r} is invalid; expected a policy name")
        spec = table.get(name)
        if spec is None:
            why = other_kind if name in other else "not configured"
            raise BadRequest("policy", f"policy {name!r} is {why}", 404)
        toggles = self.overrides.get(name)
        if toggles is not None:
            spec = replace(spec, enabled=toggles[0], shadow=toggles[1])
            if toggles[2] and isinstance(spec, PolicySpec):
                spec = replace(spec, block=True)
        return spec

    def check_key(self, key: object, field: str = "key") -> str:
        """A caller key: a non-empty string no longer than ``max_key_length``."""
        if not isinstance(key, str) or not key:
            raise BadRequest(field, f"{field} {key!r} is invalid; expected a non-empty string")
        limit = self.config.max_key_length
        if len(key) > limit:
            raise BadRequest(field, f"{field} is {len(key)} characters long; the limit is {limit}")
        if not key.isascii():
            try:
                key.encode("utf-8")
            except UnicodeEncodeError:  # a lone surrogate from JSON "\ud800": no store takes it
                raise BadRequest(field, f"{field} is not valid Unicode text") from None
        return key

    def checked(self, req: Mapping[str, Any]) -> tuple[PolicySpec, str, int]:
        """A decision request's policy, key and cost (1 when absent), from its parsed fields
        (``policy``, ``key``, ``cost``), or ``BadRequest`` naming the field."""
        config = self.config
        name = req.get("policy")
        spec = None
        if type(name) is str and name not in self.overrides:  # spec's common case
            spec = config.policies.get(name)
        if spec is None:
            spec = self.spec(name)
        key = req.get("key")
        if type(key) is not str or not key.isascii() or not 0 < len(key) <= config.max_key_length:
            if "key" not in req:
                raise BadRequest("key", "key is missing; expected a non-empty string")
            key = self.check_key(key)  # the checks with their messages
        cost = req.get("cost", 1)
        if type(cost) is not int or not 1 <= cost <= MAX_COST:
            if isinstance(cost, float) and cost.is_integer():  # JSON Schema's integer: 2.0 is 2
                cost = int(cost)
            if isinstance(cost, bool) or not isinstance(cost, int) or not 1 <= cost <= MAX_COST:
                raise BadRequest("cost", f"cost {cost!r} is invalid; expected a whole number >= 1")
        return spec, key, cost

    def toggle(
        self, name: str, enabled: bool | None, shadow: bool | None, block: bool | None = None
    ) -> None:
        """Switch a policy (of either kind) off/on or into/out of shadow mode until the next
        reload; ``block`` (rate policies): reject every request, the emergency stop (it wins
        over ``enabled`` and ``shadow``; ``block: false`` lifts only a toggled block)."""
        concurrency = name in self.config.concurrency
        spec = self.concurrency_spec(name) if concurrency else self.spec(name)
        if block is not None and concurrency:
            raise BadRequest("block", f"policy {name!r} is a concurrency policy; block applies "
                             "to rate policies")  # fmt: skip
        before = self.overrides.get(name)
        new = (
            spec.enabled if enabled is None else enabled,
            spec.shadow if shadow is None else shadow,
            (before is not None and before[2]) if block is None else block,
        )
        self.overrides[name] = new
        self.generation += 1
        self.cache.clear()

    async def hit(self, spec: PolicySpec, key: str, cost: int) -> Result:
        """Consume ``cost`` units of ``key`` under the policy (all-or-nothing over its stack)."""
        return await self.decide("hit", spec, key, cost, store_key(spec.name, key))

    async def peek(self, spec: PolicySpec, key: str, cost: int) -> Result:
        """The answer a hit would get now, consuming nothing."""
        return await self.decide("peek", spec, key, cost, store_key(spec.name, key))

    async def refund(self, spec: PolicySpec, key: str, cost: int) -> None:
        """Give back ``cost`` units."""
        self.cache.forget(spec.name, key)
        if spec.plan:
            await self.limiter.refund(key, spec.rate_text, cost=cost)
            return
        await self.limiter.refund(
            store_key(spec.name, key), spec.policy.rates, algorithm=spec.algorithm, cost=cost,
            burst=spec.burst, buckets=spec.buckets, aligned=spec.aligned,
            count_rejected=spec.count_rejected,
        )  # fmt: skip

    async def reset(self, spec: PolicySpec, key: str) -> None:
        """Forget every counter of ``key`` under the policy."""
        self.cache.forget(spec.name, key)
        if spec.plan:
            await self.limiter.reset(key, spec.rate_text)
            return
        await self.limiter.reset(
            store_key(spec.name, key), spec.policy.rates, algorithm=spec.algorithm,
            burst=spec.burst, buckets=spec.buckets, aligned=spec.aligned,
            count_rejected=spec.count_rejected,
        )  # fmt: skip

    async def acquire(self, spec: ConcurrencySpec, key: str) -> LeaseResult:
        """Take a lease of ``key`` under a concurrency policy, if one is free."""
        metrics = self.metrics
        name = spec.name
        if not spec.enabled or self.leases is None:
            metrics.decision(name, "disabled")
            return LeaseResult(True, lease_token(name, key, ""), spec.capacity, None, None, name)
        lease, in_use = await self.leases.acquire_counted(
            store_key(name, key), capacity=spec.capacity, lease_ttl=spec.lease_ttl
        )
        if lease is None:
            if spec.shadow:
                metrics.decision(name, "shadow_rejected", key)
                token = lease_token(name, key, "")
                return LeaseResult(True, token, spec.capacity, in_use, None, name, shadow=True)
            metrics.decision(name, "rejected", key)
            return LeaseResult(False, None, spec.capacity, in_use, None, name)
        lease_id = "" if lease.degraded else lease.id
        metrics.decision(name, "degraded" if lease.degraded else "allowed")
        return LeaseResult(
            True,
            lease_token(name, key, lease_id),
            spec.capacity,
            in_use,
            lease.expires_at,
            name,
            degraded=lease.degraded,
        )

    async def release(self, token: object) -> bool:
        """Give back the lease a token names; True if it was live."""
        name, key, lease_id = parse_lease_token(token)
        try:
            key = self.check_key(key, "lease")
        except BadRequest as exc:  # a key no acquire accepts: no such lease
            raise BadRequest("lease", str(exc), 404) from None
        if not lease_id or self.leases is None:
            return False
        return await self.leases.release(Lease(store_key(name, key), lease_id, 0.0))

    async def decide(self, op: str, spec: PolicySpec, key: str, cost: int, stored: str) -> Result:
        """``hit`` or ``peek`` ``cost`` units on the store key ``stored``; the over-limit cache
        and the metrics know it as (policy, ``key``). Shadow, kill switch and Envoy's
        ``requests_per_unit: 0`` apply here."""
        result = self.decide_now(op, spec, key, cost, stored)
        if result is None:
            result = await self.ask(op, spec, key, cost, stored)
        return result

    def decide_now(
        self, op: str, spec: PolicySpec, key: str, cost: int, stored: str
    ) -> Result | None:
        """``decide`` when no store I/O is needed (a disabled or blocking policy, the
        over-limit cache, an in-process store's hit), else None having done nothing: then
        ``ask`` the store. Safe from any thread (the locks are the store's and the cache's)."""
        if not spec.enabled or spec.block:
            return self._fixed(op, spec, cost)
        if self.cache._entries and self.config.local_cache:  # a dict: empty is the usual case
            cached = self.cache.get(spec.name, key, cost, int(self.clock() * 1000))
            if cached is not None:
                return self._cached(spec, key, cached)
        if op == "hit" and not spec.plan:
            local = self.limiter.decide_local("hit", stored, spec.policy, cost)
            if local is not None:
                if local.allowed and not local.degraded:  # the common answer
                    self.metrics.decision(spec.label or spec.name, "allowed")
                    return _result((local, spec.name, False, False))
                return self.settle(spec, key, cost, local)
        return None

    def answer_now(
        self, op: str, spec: PolicySpec, key: str, cost: int, soon: bool = False
    ) -> Admitted | Result | Pending | None:
        """``hit`` or ``peek`` answered without awaiting, its fast paths first: an admitted fast
        hit (``fast``: the store's outcome, counted), else ``decide_now``'s ``Result``; else,
        when ``soon`` is asked and a batching store has queued the call, its ``Pending`` (give
        it to ``answered`` once its future is done); else None, having done nothing: await
        ``answer``. For a protocol that answers from a callback (the HTTP protocol)."""
        if op == "hit":
            made = self.fast.hit(spec, key, cost)
            if made is not None:
                return made
        stored = f"{len(spec.name)}:{spec.name}:{key}"  # store_key, inlined
        result = self.decide_now(op, spec, key, cost, stored)
        if result is None and soon and not spec.plan:
            kind: Op = "hit" if op == "hit" else "peek"
            return self.limiter.decide_soon(kind, stored, spec.policy, cost)
        return result

    async def answer(self, op: str, spec: PolicySpec, key: str, cost: int) -> Result:
        """The store's answer to what ``answer_now`` could not decide."""
        return await self.ask(op, spec, key, cost, f"{len(spec.name)}:{spec.name}:{key}")

    def answered(
        self, spec: PolicySpec, key: str, cost: int, pending: Pending
    ) -> Admitted | Result:
        """The answer to a ``Pending`` of ``answer_now`` once its batch is back (call it once):
        as ``answer_now`` would have answered, counted and settled."""
        plan = pending.plan
        stored = pending.result()
        if isinstance(stored, Decision):  # the failure policy's
            return self.settle(spec, key, cost, stored)
        made = self.fast.stored(spec, key, cost, stored, plan.now_ms)
        if made is None:  # no fast plan: the general way
            return self.settle(spec, key, cost, decide(plan, stored))
        return made

    async def ask(self, op: str, spec: PolicySpec, key: str, cost: int, stored: str) -> Result:
        """The store's answer to what ``decide_now`` could not decide."""
        if spec.plan:  # the caller's tenant's limit (``config.quotas``)
            call = self.limiter.hit if op == "hit" else self.limiter.peek
            return self.settle(spec, key, cost, await call(key, spec.rate_text, cost=cost))
        kind: Op = "hit" if op == "hit" else "peek"
        return self.settle(
            spec, key, cost, await self.limiter.decide(kind, stored, spec.policy, cost)
        )

    def settle(self, spec: PolicySpec, key: str, cost: int, decision: Decision) -> Result:
        """The store's decision as the service reports it: counted, a rejection remembered
        by the over-limit cache, shadow applied."""
        metrics = self.metrics
        label = spec.label or spec.name
        if decision.allowed and not decision.degraded:  # the common answer
            metrics.decision(label, "allowed")
            return _result((decision, spec.name, False, False))
        if decision.degraded:
            metrics.decision(label, "degraded")
            return Result(decision, spec.name)
        if self.config.local_cache and not spec.plan:  # a plan's limit may be raised any time
            self.cache.put(spec.name, key, cost, decision)
        if spec.shadow:
            metrics.decision(label, "shadow_rejected", key)
            return Result(replace(decision, allowed=True, retry_after=0.0), spec.name, True)
        metrics.decision(label, "rejected", key)
        return Result(decision, spec.name)

    def fixed(self, op: str, spec: PolicySpec, cost: int) -> Result:
        """The answer of a switched-off or blocking policy, without the store (counted)."""
        return self._fixed(op, spec, cost)

    def _fixed(self, op: str, spec: PolicySpec, cost: int) -> Result:
        """A disabled (kill switch) or blocking (Envoy's ``requests_per_unit: 0``) policy."""
        label = spec.label or spec.name
        if spec.block and op == "peek" and cost == 0:  # 0 hits of a limit of 0: within it
            decision = replace(_fixed(spec, self.clock(), allowed=True), remaining=0)
            self.metrics.decision(label, "allowed")
            return Result(decision, spec.name)
        decision = _fixed(spec, self.clock(), allowed=not spec.block)
        self.metrics.decision(label, "disabled" if not spec.block else "rejected")
        return Result(decision, spec.name)

    def _cached(self, spec: PolicySpec, key: str, cached: Decision) -> Result:
        """A rejection answered by the over-limit cache."""
        label = spec.label or spec.name
        self.metrics.decision(label, "shadow_rejected" if spec.shadow else "local_rejected", key)
        if spec.shadow:
            return Result(replace(cached, allowed=True, retry_after=0.0), spec.name, True, True)
        return Result(cached, spec.name, local=True)


def _fixed(spec: PolicySpec, now: float, allowed: bool) -> Decision:
    """The answer of a disabled policy (allowed, full) or a blocking one (rejected, empty)."""
    rate = spec.policy.rates[0]
    capacity = spec.policy.limits[0].capacity
    return Decision(
        allowed,
        capacity if allowed else 0,
        capacity if allowed else 0,
        now + rate.period,
        0.0 if allowed else math.inf,
        rate,
        spec.policy.rates,
        now,
    )
