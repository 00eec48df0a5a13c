"""``Quotas``: tenants' plans from a source, cached with a TTL, and what a failing source gives.

Time is injected twice: the limiter's ``ManualClock`` (windows, override ends) and the cache's
``monotonic`` (its TTL), each moved by hand.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from ratekeeper import AsyncLimiter, ConfigError, Limiter, ManualClock, MemoryStore
from ratekeeper.quotas import (
    FunctionSource,
    Override,
    Plans,
    Quotas,
    StaticSource,
    TenantPlan,
)

PLANS = Plans.from_yaml("""\
default: free
plans:
  free: {api: 3/hour, search: 2/minute}
  pro: {api: 10/hour, search: 5/minute}
  enterprise: {api: 100/hour, search: 50/minute}
""")


class Source:
    """A source whose answers the test sets, and that can be made to fail."""

    def __init__(self, answers: dict[str, Any] | None = None) -> None:
        self.answers = dict(answers or {})
        self.calls = 0
        self.error: Exception | None = None

    def lookup(self, tenant: str) -> Any:
        self.calls += 1
        if self.error is not None:
            raise self.error
        return self.answers.get(tenant)


def setup(
    answers: dict[str, Any] | None = None, **options: Any
) -> tuple[Limiter, Quotas, Source, ManualClock, ManualClock]:
    source = Source(answers)
    mono = ManualClock(100.0)
    quotas = Quotas(PLANS, FunctionSource(source.lookup), monotonic=mono, **options)
    clock = ManualClock(1_700_000_000.0)
    limiter = Limiter(MemoryStore(), clock=clock, quotas=quotas)
    return limiter, quotas, source, clock, mono


def remaining(limiter: Limiter, key: str, name: str = "api") -> int:
    return limiter.peek(key, f"plan:{name}", cost=0).remaining


def test_a_tenants_plan_decides_and_an_unknown_tenant_gets_the_default() -> None:
    limiter, _, source, _, _ = setup({"acme": "pro"})
    assert limiter.hit("acme", "plan:api").limit == 10
    assert limiter.hit("nobody", "plan:api").limit == 3
    assert limiter.hit("acme", "plan:search").limit == 5
    assert source.calls == 2  # one lookup per tenant: the cache answers the rest
    rows = {(r.name, r.plan, r.source) for r in limiter.status("nobody")}
    assert rows == {("api", "free", "default"), ("search", "free", "default")}


def test_a_plan_change_applies_after_the_ttl_and_keeps_the_counts() -> None:
    limiter, _, source, _, mono = setup({"acme": "free"}, ttl=30)
    assert [limiter.hit("acme", "plan:api").allowed for _ in range(4)] == [True] * 3 + [False]
    source.answers["acme"] = "pro"
    mono.advance(29.9)
    assert not limiter.hit("acme", "plan:api").allowed  # cached: still free
    mono.advance(0.1)
    d = limiter.hit("acme", "plan:api")  # asked again: pro, the 3 used still count
    assert d.allowed and d.limit == 10 and d.remaining == 6
    source.answers["acme"] = "free"
    mono.advance(30)
    assert not limiter.hit("acme", "plan:api").allowed  # back to 3 with 4 used


def test_invalidate_applies_a_change_at_once() -> None:
    limiter, quotas, source, _, _ = setup({"acme": "free"})
    assert remaining(limiter, "acme") == 3
    source.answers["acme"] = "enterprise"
    assert remaining(limiter, "acme") == 3
    quotas.invalidate("acme")
    assert remaining(limiter, "acme") == 100
    source.answers["acme"] = "pro"
    quotas.invalidate()
    assert remaining(limiter, "acme") == 10


def test_a_failing_source_keeps_the_last_known_plan_then_the_default(
    caplog: pytest.LogCaptureFixture,
) -> None:
    limiter, quotas, source, _, mono = setup({"acme": "pro"}, ttl=30, retry=5)
    assert remaining(limiter, "acme") == 10
    source.error = ConnectionError("database down")
    mono.advance(31)
    with caplog.at_level(logging.WARNING, "ratekeeper"):
        rows = limiter.status("acme")
    assert {r.source for r in rows} == {"last-known"} and rows[0].limit == 10
    assert "database down" in caplog.text
    calls = source.calls
    mono.advance(4)
    limiter.hit("acme", "plan:api")
    assert source.calls == calls  # asked again only after `retry`
    mono.advance(1)
    limiter.hit("acme", "plan:api")
    assert source.calls == calls + 1
    # a tenant never seen while the source fails: the default plan, never "no limit"
    rows = limiter.status("newcomer")
    assert {(r.plan, r.source) for r in rows} == {("free", "default-on-error")}
    assert [limiter.hit("newcomer", "plan:api").allowed for _ in range(4)] == [True] * 3 + [False]
    # back: the real answer
    source.error = None
    mono.advance(5)
    assert remaining(limiter, "newcomer") == 0 and {r.source for r in limiter.status("acme")} == {
        "plan"
    }
    assert quotas.stats()["source_errors"] >= 3


def test_on_error_allow_lets_tenants_through_degraded() -> None:
    limiter, _, source, _, _ = setup(on_error="allow")
    source.error = TimeoutError("slow")
    decisions = [limiter.hit("x", "plan:api") for _ in range(10)]
    assert all(d.allowed and d.degraded for d in decisions)
    assert limiter.stats()["degraded"] == 10


@pytest.mark.parametrize(
    "garbage",
    [
        "platinum",  # a plan that does not exist
        42,
        ["pro"],
        {"plan": 7},
        {"plan": "pro", "extra": 1},
        {"plan": "pro", "overrides": {"api": {"rate": "-5/hour"}}},
        {"plan": "pro", "overrides": {"api": {"rate": "5/huor"}}},
        {"plan": "pro", "overrides": {"nope": {"rate": "5/hour"}}},
        {"plan": "pro", "overrides": {"api": "5/hour"}},
        {"plan": "pro", "overrides": {"api": {"rate": 5}}},
        {"plan": "pro", "overrides": {"api": {"rate": "5/hour", "until": "soon"}}},
        TenantPlan("pro", {"api": Override("10/calendar-month")}),  # fine...
    ],
)
def test_garbage_from_a_source_is_a_failure_not_a_limit(garbage: Any) -> None:
    limiter, quotas, _, _, _ = setup({"acme": garbage})
    if isinstance(garbage, TenantPlan):  # ...a calendar override on a fixed window is valid
        assert remaining(limiter, "acme") == 10
        return
    rows = limiter.status("acme")
    assert {(r.plan, r.source) for r in rows} == {("free", "default-on-error")}
    assert quotas.stats()["source_errors"] == 1


def test_a_calendar_override_on_a_bucket_is_garbage_too() -> None:
    plans = Plans.from_dict(
        {"default": "free", "plans": {"free": {"api": {"rate": "5/hour", "algorithm": "gcra"}}}}
    )
    source = {"acme": {"plan": "free", "overrides": {"api": {"rate": "9/calendar-month"}}}}
    quotas = Quotas(plans, FunctionSource(source.get))
    limiter = Limiter(MemoryStore(), quotas=quotas)
    assert {r.source for r in limiter.status("acme")} == {"default-on-error"}


def test_overrides_apply_until_they_end_and_keep_the_counts() -> None:
    limiter, _, source, clock, _ = setup()
    until = clock() + 600
    source.answers["acme"] = TenantPlan(
        "free", {"api": Override("50/hour", until=until, by="support")}
    )
    assert limiter.hit("acme", "plan:api", cost=5).allowed  # 5 of 50
    row = next(r for r in limiter.status("acme") if r.name == "api")
    assert (row.source, row.limit, row.used, row.until) == ("override", 50, 5, until)
    clock.set(until)  # the override has ended: the plan's 3/hour, 5 used
    row = next(r for r in limiter.status("acme") if r.name == "api")
    assert (row.source, row.limit, row.remaining) == ("plan", 3, 0)


def test_the_cache_is_bounded_against_hostile_tenant_names() -> None:
    limiter, quotas, _, _, _ = setup(max_tenants=100)
    for i in range(1000):
        limiter.hit(f"tenant-{i}" + "x" * (i % 7), "plan:api")
    assert quotas.stats()["cached"] == 100
    for hostile in ["{", "}", "%7B", "#h", "\ud800", "a" * 10_000, "plan:api", "*", "t:x"]:
        assert limiter.hit(hostile, "plan:api").limit == 3


def test_a_tenant_function_maps_keys_to_tenants() -> None:
    source = Source({"acme": "pro"})
    quotas = Quotas(PLANS, FunctionSource(source.lookup), tenant=lambda key: key.split("/")[0])
    limiter = Limiter(MemoryStore(), clock=ManualClock(), quotas=quotas)
    assert limiter.hit("acme/alice", "plan:api").limit == 10
    assert limiter.hit("acme/bob", "plan:api").limit == 10
    assert source.calls == 1


def test_plan_refs_are_checked() -> None:
    limiter, _, _, _, _ = setup()
    with pytest.raises(ConfigError, match="names no limit of the plans"):
        limiter.hit("k", "plan:apii")
    with pytest.raises(ConfigError, match="sets its own algorithm"):
        limiter.hit("k", "plan:api", algorithm="gcra")
    with pytest.raises(ConfigError, match="no plans"):
        Limiter().status("k")
    with pytest.raises(ValueError, match="names a plan's limit, but this limiter has no plans"):
        Limiter().hit("k", "plan:api")
    with pytest.raises(ConfigError, match="customers"):
        Quotas(Plans.from_yaml(PLANS_WITH_CUSTOMERS), StaticSource())
    with pytest.raises(ConfigError, match="on_error"):
        Quotas(PLANS, on_error="ignore")


PLANS_WITH_CUSTOMERS = "default: free\nplans:\n  free: {api: 1/s}\ncustomers:\n  a: free\n"


def test_an_async_source_serves_the_async_limiter() -> None:
    calls: list[str] = []

    async def lookup(tenant: str) -> str | None:
        calls.append(tenant)
        await asyncio.sleep(0)
        return {"acme": "pro"}.get(tenant)

    quotas = Quotas(PLANS, FunctionSource(lookup))
    limiter = AsyncLimiter(MemoryStore(), clock=ManualClock(), quotas=quotas)

    async def run() -> list[int]:
        return [(await limiter.hit(t, "plan:api")).limit for t in ("acme", "acme", "x")]

    assert asyncio.run(run()) == [10, 10, 3]
    assert calls == ["acme", "x"]
    sync = Limiter(MemoryStore(), quotas=Quotas(PLANS, FunctionSource(lookup)))
    assert {r.source for r in sync.status("acme")} == {"default-on-error"}  # refused, loudly
