"""The quota service's logic without the wire: streams reporting buckets on a manual clock,
what each is sent, and how reloads, toggles, restarts and several processes are handled."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from ratekeeper import AsyncLimiter, ManualClock, MemoryStore
from ratekeeper.errors import StoreUnavailable
from ratekeeper.service.config import loader as config
from ratekeeper.service.engine import Engine
from ratekeeper.service.envoy.rlqs.allocator import Grant, Step
from ratekeeper.service.envoy.rlqs.hub import (
    Action,
    Quotas,
    Stream,
    Usage,
    fill_seconds,
    token_bucket,
)
from ratekeeper.service.envoy.rlqs.state import MemoryQuotaState, QuotaState
from ratekeeper.service.metrics import Metrics
from ratekeeper.service.rlqs_stats import MAX_LABELS, OTHER

T = TypeVar("T")
CONFIG = """\
policies:
  tenant.quota: {rate: 60/second}
  bursty: {rate: 60/second, algorithm: token_bucket, burst: 30}
rlqs:
  assignment_ttl: 20
  buckets:
    - domain: edge
      bucket: {name: tenant, tenant: "*"}
      policy: tenant.quota
    - domain: edge
      bucket: {name: tenant, tenant: "vip*"}
      policy: bursty
    - domain: edge
      bucket: {name: catch-all}
      rate: 100/minute
"""
ACME = (("name", "tenant"), ("tenant", "acme"))


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


class Envoy:
    """A stream and what it was sent."""

    def __init__(self, quotas: Quotas) -> None:
        self.sent: list[list[Action]] = []
        self.stream = Stream(self.sent.append)
        self.quotas = quotas
        quotas.open(self.stream)

    async def report(self, *usages: Usage) -> list[Action]:
        before = len(self.sent)
        await self.quotas.report(self.stream, list(usages))
        return [a for batch in self.sent[before:] for a in batch]

    def last(self) -> Action:
        return self.sent[-1][-1]


def usage(elapsed: int = 0, allowed: int = 1, denied: int = 0, entries: Any = ACME) -> Usage:
    return Usage("edge", entries, elapsed, allowed, denied)


def make(text: str = CONFIG, state: QuotaState | None = None,
         clock: ManualClock | None = None) -> Quotas:  # fmt: skip
    cfg = config.parse_text(text)
    clock = clock or ManualClock(1_800_000_000.0)
    engine = Engine(cfg, AsyncLimiter(MemoryStore(), clock=clock), Metrics(), clock)
    return Quotas(engine, state or MemoryQuotaState(), engine.metrics.rlqs, clock)


def rate(action: Action) -> float:
    assert action.kind == "token_bucket", action
    return action.tokens_per_fill / action.fill_seconds


def test_one_envoy_gets_the_whole_rate_as_a_token_bucket() -> None:
    quotas = make()
    envoy = Envoy(quotas)
    (action,) = run(envoy.report(usage()))
    assert action == Action(ACME, "token_bucket", 60, 1200, 20, 20)  # 60/s, a second of burst
    assert rate(action) == 60


def test_a_second_envoy_takes_half_and_the_first_is_pushed_its_half_at_once() -> None:
    async def scenario() -> None:
        quotas = make()
        a, b = Envoy(quotas), Envoy(quotas)
        await a.report(usage())
        quotas.clock.advance(5)  # type: ignore[attr-defined]
        await a.report(usage(5, 300, 200))  # 100/s offered
        (mine,) = await b.report(usage())
        assert rate(mine) == 30 and rate(a.last()) == 30  # pushed, not waiting for a report
        quotas.clock.advance(1)  # type: ignore[attr-defined]
        await quotas.end(b.stream)
        assert rate(a.last()) == 60  # b's share back to a at once

    run(scenario())


def test_demand_moves_shares_and_the_sum_stays_under_the_limit() -> None:
    async def scenario() -> None:
        quotas = make()
        clock: ManualClock = quotas.clock  # type: ignore[assignment]
        a, b = Envoy(quotas), Envoy(quotas)
        await a.report(usage())
        await b.report(usage())
        for _ in range(3):
            clock.advance(5)
            await a.report(usage(5, 50, 0))  # 10/s
            await b.report(usage(5, 500, 300))  # 160/s
        assert rate(a.last()) + rate(b.last()) <= 60
        assert (rate(a.last()), rate(b.last())) == (11, 49)  # a needs 10 + 10 %: b the rest

    run(scenario())


def test_toggles_push_blanket_rules_to_every_stream_before_any_report() -> None:
    async def scenario() -> None:
        quotas = make()
        envoys = [Envoy(quotas) for _ in range(3)]
        for e in envoys:
            await e.report(usage())
        engine = quotas.engine
        engine.toggle("tenant.quota", None, None, block=True)
        await quotas.refresh()
        assert [e.last().kind for e in envoys] == ["deny_all"] * 3
        engine.toggle("tenant.quota", None, None, block=False)
        engine.toggle("tenant.quota", None, True)
        await quotas.refresh()
        assert [e.last().kind for e in envoys] == ["allow_all"] * 3
        engine.toggle("tenant.quota", None, False)
        await quotas.refresh()
        assert sum(rate(e.last()) for e in envoys) == pytest.approx(60, abs=0.2)
        engine.toggle("tenant.quota", False, None)  # switched off: no limit
        await quotas.refresh()
        assert [e.last().kind for e in envoys] == ["allow_all"] * 3

    run(scenario())


def test_a_reload_without_the_rule_abandons_the_bucket() -> None:
    async def scenario() -> None:
        quotas = make()
        envoy = Envoy(quotas)
        await envoy.report(usage())
        state = quotas.state
        assert isinstance(state, MemoryQuotaState) and state.buckets
        quotas.engine.swap(config.parse_text(CONFIG.replace('tenant: "*"', "tenant: other")))
        await quotas.refresh()
        assert envoy.last() == Action(ACME, "abandon")
        assert not envoy.stream.subs and not state.buckets
        # Envoy reports it afresh: now unmatched, no assignment (Envoy's own rule)
        assert await envoy.report(usage()) == []
        assert quotas.stats.unmatched == {"edge": 1}

    run(scenario())


def test_a_reload_that_lowers_the_rate_is_pushed() -> None:
    async def scenario() -> None:
        quotas = make()
        envoy = Envoy(quotas)
        await envoy.report(usage())
        quotas.engine.swap(config.parse_text(CONFIG.replace("60/second}", "10/second}", 1)))
        await quotas.refresh()
        assert rate(envoy.last()) == 10

    run(scenario())


@pytest.mark.parametrize(("how", "kind"), [("allow", "allow_all"), ("deny", "deny_all")])
def test_unmatched_buckets_get_the_configured_answer(how: str, kind: str) -> None:
    quotas = make(CONFIG.replace("  assignment_ttl: 20\n", f"  unmatched: {how}\n"))
    (action,) = run(Envoy(quotas).report(usage(entries=(("name", "other"),))))
    assert action.kind == kind and action.ttl == 20


def test_the_most_specific_rule_wins_and_a_policy_burst_is_split() -> None:
    vip = (("name", "tenant"), ("tenant", "vip-1"))
    (action,) = run(Envoy(make()).report(usage(entries=vip)))
    assert action.max_tokens == 30 and rate(action) == 60  # bursty: burst 30 of 60/s


def test_a_slow_rate_gets_a_long_fill_interval() -> None:
    (action,) = run(Envoy(make()).report(usage(entries=(("name", "catch-all"),))))
    assert (action.fill_seconds, action.tokens_per_fill, action.max_tokens) == (900, 1499, 1)
    assert fill_seconds(1) == 3600


def test_only_the_interval_changing_changes_max_tokens_too() -> None:
    """Envoy 1.40 keeps its bucket when only the fill interval's seconds change."""
    spec = make().engine.spec("tenant.quota")
    before = Action(ACME, "token_bucket", 5, 1200, 10, 20)
    after = token_bucket(ACME, 60_000, 60_000, spec, 20, before)
    assert (after.tokens_per_fill, after.fill_seconds) == (1200, 20) and after.max_tokens == 60
    clash = Action(ACME, "token_bucket", 60, 1200, 10, 20)
    assert token_bucket(ACME, 60_000, 60_000, spec, 20, clash).max_tokens == 61


def test_a_restarted_service_resumes_at_what_envoys_were_allowed() -> None:
    """The memory state is gone after a restart; Envoy's first report after reconnecting
    carries the last period's usage: the first assignment is held to it, so the Envoys
    that still enforce their old shares are not joined by one given the whole rate."""

    async def scenario() -> None:
        quotas = make()
        a, b, c = Envoy(quotas), Envoy(quotas), Envoy(quotas)
        (first,) = await a.report(usage(5, 100, 400))  # allowed 20/s of 100/s offered
        assert rate(first) == 20
        await b.report(usage(5, 100, 400))
        await c.report(usage(5, 100, 400))
        assert sum(rate(e.last()) for e in (a, b, c)) == 60
        quotas.clock.advance(5)  # type: ignore[attr-defined]
        await a.report(usage(5, 100, 400))  # uncapped now: the fair share
        assert rate(a.last()) == 20

    run(scenario())


def test_a_stopped_services_orphans_are_taken_over_by_reconnecting_envoys() -> None:
    async def scenario() -> None:
        state = MemoryQuotaState()
        clock = ManualClock(1_800_000_000.0)
        old = make(state=state, clock=clock)
        a, b = Envoy(old), Envoy(old)
        await a.report(usage())
        await b.report(usage())
        clock.advance(5)
        await a.report(usage(5, 100, 400))
        await b.report(usage(5, 100, 400))
        await old.close()  # shares kept as orphans (Redis keeps them across the restart)
        await old.end(a.stream)
        await old.end(b.stream)
        new = make(state=state, clock=clock)
        clock.advance(3)
        stranger = Envoy(new)
        (nothing,) = await stranger.report(usage())  # a new Envoy: only what is free
        assert nothing.kind == "deny_all"
        a2, b2 = Envoy(new), Envoy(new)
        assert rate((await a2.report(usage(5, 150, 350)))[0]) == 30  # a's or b's, taken over
        assert rate((await b2.report(usage(5, 150, 350)))[0]) == 20  # the rest, a third each

    run(scenario())


def test_two_processes_share_one_view_and_never_exceed_the_limit() -> None:
    """Two services on one state (as on one Redis): each assigns its own streams, the sum
    stays under the global rate, and a newcomer is absorbed within a report period."""

    async def scenario() -> None:
        state = MemoryQuotaState()
        clock = ManualClock(1_800_000_000.0)
        p1, p2 = make(state=state, clock=clock), make(state=state, clock=clock)
        a = Envoy(p1)
        await a.report(usage())
        assert rate(a.last()) == 60
        b = Envoy(p2)
        (first,) = await b.report(usage())
        assert first.kind == "deny_all"  # a (on the other process) holds it all
        for _ in range(2):
            clock.advance(5)
            await a.report(usage(5, 500, 0))
            await b.report(usage(5, 500, 0))
            assert rate(a.last()) + (rate(b.last()) if b.last().kind != "deny_all" else 0) <= 60
        assert rate(a.last()) == rate(b.last()) == 30

    run(scenario())


class Failing(MemoryQuotaState):
    async def step(self, bucket: str, s: Step) -> Grant:
        raise StoreUnavailable("redis at 127.0.0.1:1 does not answer")


def test_a_store_failure_sends_nothing_and_counts() -> None:
    quotas = make(state=Failing())
    assert run(Envoy(quotas).report(usage())) == []
    assert quotas.engine.metrics.store_errors.samples() == [((), 1.0)]


def test_bad_buckets_are_refused_and_counted() -> None:
    quotas = make(CONFIG.replace("  assignment_ttl: 20\n", "  max_buckets: 1\n"))
    envoy = Envoy(quotas)
    assert run(envoy.report(usage(entries=()))) == []
    run(envoy.report(usage()))
    assert run(envoy.report(usage(entries=(("name", "catch-all"),)))) == []
    long = (("name", "tenant"), ("tenant", "x" * 600))
    assert run(envoy.report(usage(entries=long))) == []
    assert quotas.stats.refused == {"bucket_id": 2, "max_buckets": 1, "report": 0}


def test_rows_and_metrics_show_each_bucket() -> None:
    quotas = make()
    run(Envoy(quotas).report(usage(0, 1, 0)))
    (row,) = quotas.stats.rows()
    assert (row.bucket, row.policy, row.mode, row.limit, row.assigned, row.streams) == (
        "edge/name=tenant,tenant=acme", "tenant.quota", "quota", 60.0, 60.0, 1,
    )  # fmt: skip
    text = quotas.engine.metrics.exposition().decode()
    assert 'ratekeeper_rlqs_assigned_rate{bucket="edge/name=tenant,tenant=acme"' in text
    assert "ratekeeper_rlqs_open_streams 1.0" in text


class Counting(MemoryQuotaState):
    def __init__(self) -> None:
        super().__init__()
        self.steps: list[Step] = []

    async def step(self, bucket: str, s: Step) -> Grant:
        self.steps.append(s)
        return await super().step(bucket, s)


def test_a_report_within_a_second_is_answered_without_a_step_and_carried() -> None:
    """Envoy's periodic report may follow a bucket's first closely; a client reporting in a
    loop costs at most one step a second, and no count is lost to the demand."""

    async def scenario() -> None:
        state = Counting()
        quotas = make(state=state)
        clock: ManualClock = quotas.clock  # type: ignore[assignment]
        envoy = Envoy(quotas)
        (first,) = await envoy.report(usage())
        for _ in range(50):
            clock.advance(0.01)
            assert await envoy.report(usage(0, 10, 10)) == [first]  # TTL refreshed, same
        assert len(state.steps) == 1
        clock.advance(0.6)
        await envoy.report(usage(1, 0, 0))
        assert len(state.steps) == 2
        elapsed_ms = state.steps[1].now_ms - state.steps[0].now_ms
        assert 1090 <= elapsed_ms <= 1110
        assert state.steps[1].demand == 1000 * 1_000_000 // elapsed_ms  # 1000 requests carried

    run(scenario())


def test_a_bucket_listed_twice_in_a_report_is_answered_once() -> None:
    quotas = make()
    actions = run(Envoy(quotas).report(usage(), usage(0, 5, 0)))
    assert len(actions) == 1


def test_bucket_labels_are_bounded() -> None:
    """Bucket ids come from request headers: past ``MAX_LABELS`` buckets, metrics sum the
    rest under ``<other>``."""
    quotas = make()
    envoy = Envoy(quotas)
    for i in range(MAX_LABELS + 50):
        run(envoy.report(usage(entries=(("name", "tenant"), ("tenant", f"t{i}")))))
    rows = quotas.stats.rows()
    assert len(rows) == MAX_LABELS + 1 and rows[0].bucket == OTHER
    assert rows[0].streams == 50
    text = quotas.engine.metrics.exposition().decode()
    assert text.count("ratekeeper_rlqs_limit_rate{") == MAX_LABELS + 1
