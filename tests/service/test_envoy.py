"""Envoy's ShouldRateLimit answered as envoyproxy/ratelimit answers it: the engine on a memory
store and a manual clock, each behaviour of upstream's code and README checked (and the
counter semantics on Redis too, through the same algorithm option)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from ratekeeper import AsyncLimiter, ManualClock, MemoryStore, RedisStore
from ratekeeper.service.config import loader as config
from ratekeeper.service.engine import Engine
from ratekeeper.service.envoy.rls import Answer, Descriptor, Envoy
from ratekeeper.service.metrics import OTHER, Metrics, sanitize

T = TypeVar("T")
T0 = 1_800_000_000.0 + 17.25  # 17.25 s into a minute; not on any unit's boundary
MINUTE, HOUR, DAY, MONTH, YEAR, WEEK = 2, 3, 4, 5, 6, 7

DOMAIN = """\
domain: edge
descriptors:
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 10, name: per-ip}
  - key: week
    rate_limit: {unit: week, requests_per_unit: 5}
  - key: month
    rate_limit: {unit: month, requests_per_unit: 5}
  - key: year
    rate_limit: {unit: year, requests_per_unit: 5}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: free
    rate_limit: {unlimited: true}
  - key: blocked
    rate_limit: {unit: second}
  - key: quota
    value: a
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
    metadata: {service: {name: a}}
  - key: quota
    value: b
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
    metadata: {service: {name: b}, other: 1}
  - key: route
    value: /admin
    rate_limit: {name: admin, unit: minute, requests_per_unit: 100}
  - key: route
    value: /admin/special
    rate_limit: {replaces: [{name: admin}], unit: minute, requests_per_unit: 1}
  - key: user
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: files_no_share
    value: files_no_share/*
    rate_limit: {unit: hour, requests_per_unit: 10}
"""


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def make(settings: str = "", store: Any = None, start: float = T0) -> tuple[Envoy, ManualClock]:
    clock = ManualClock(start)
    cfg = config.parse_text((settings + "domains:\n" if settings else "domains:\n") + _listed())
    metrics = Metrics()
    metrics.envoy.configure(cfg.envoy.near_limit_ratio, cfg.envoy.max_stat_keys)
    limiter = AsyncLimiter(MemoryStore() if store is None else store, clock=clock)
    engine = Engine(cfg, limiter, metrics, clock)
    return Envoy(engine, metrics.envoy), clock


def _listed() -> str:
    lines = DOMAIN.splitlines()
    out = ["  - " + lines[0]] + ["    " + line for line in lines[1:]]
    return "\n".join(out) + "\n"


def ask(envoy: Envoy, *descriptors: Descriptor | tuple[str, str], hits: int = 0,
        domain: str = "edge") -> Answer:  # fmt: skip
    ds = [d if isinstance(d, Descriptor) else Descriptor((d,)) for d in descriptors]
    return run(envoy.should_rate_limit(domain, ds, hits))


def stat(envoy: Envoy, name: str, key: str, domain: str = "edge") -> float:
    value = envoy.engine.metrics.registry.get_sample_value(
        f"ratekeeper_envoy_{name}_total", {"domain": domain, "key": key}
    )
    return value or 0.0


def test_unknown_domain_is_ok_for_every_descriptor() -> None:
    envoy, _ = make()
    override = Descriptor((("ip", "x"),), limit=(0, MINUTE))  # would always be over
    answer = ask(envoy, ("ip", "x"), override, domain="nope")
    assert not answer.over and [s.over for s in answer.statuses] == [False, False]
    assert all(s.limit is None for s in answer.statuses)
    sample = envoy.engine.metrics.registry.get_sample_value(
        "ratekeeper_envoy_domain_not_found_total", {"domain": "nope"}
    )
    assert sample == 1.0


@pytest.mark.parametrize(
    ("key", "unit_seconds"),
    [("ip", 60), ("week", 7 * 86400), ("month", 30 * 86400), ("year", 365 * 86400)],
)
def test_windows_are_aligned_to_the_unit(key: str, unit_seconds: int) -> None:
    envoy, clock = make()
    status = ask(envoy, (key, "x")).statuses[0]
    assert status.reset == unit_seconds - int(T0) % unit_seconds  # upstream: unit - now % unit
    assert status.reset == int(status.reset)  # whole seconds
    clock.set(T0 - T0 % unit_seconds + unit_seconds - 0.001)  # the window's last ms
    assert ask(envoy, (key, "x")).statuses[0].remaining == status.remaining - 1
    clock.set(T0 - T0 % unit_seconds + unit_seconds)  # the next window: a fresh counter
    fresh = ask(envoy, (key, "x")).statuses[0]
    assert fresh.remaining == status.remaining and fresh.reset == unit_seconds


def test_over_limit_hits_are_counted() -> None:
    envoy, _ = make()
    got = [ask(envoy, ("ip", "a"), hits=h) for h in (8, 5, 1)]
    assert [a.over for a in got] == [False, True, True]  # 8, 13, 14 of 10
    assert [a.statuses[0].remaining for a in got] == [2, 0, 0]


@pytest.mark.parametrize("store_kind", ["memory", "redis"])
def test_hits_addend_zero_checks_without_charging(
    store_kind: str, request: pytest.FixtureRequest
) -> None:
    store = None
    if store_kind == "redis":
        store = RedisStore(request.getfixturevalue("redis_url"), socket_timeout=5, prefix="envoy")
        store.client.flushdb()  # type: ignore[union-attr]
    envoy, _ = make(store=store)
    check = Descriptor((("ip", "z"),), hits=0)
    assert ask(envoy, check).statuses[0].remaining == 10
    ask(envoy, ("ip", "z"), hits=10)
    at_limit = ask(envoy, check)
    assert not at_limit.over and at_limit.statuses[0].remaining == 0  # exactly at: OK, 0 left
    ask(envoy, ("ip", "z"))  # 11 of 10
    assert ask(envoy, check).over


def test_current_limit_is_the_configured_limit_and_name() -> None:
    envoy, _ = make()
    ip, week = ask(envoy, ("ip", "a"), ("week", "a")).statuses
    assert ip.limit == (10, MINUTE, "per-ip")
    assert week.limit == (5, WEEK, "")


def test_unlimited_blocked_and_replaced() -> None:
    envoy, _ = make()
    free = ask(envoy, ("free", "a")).statuses[0]
    assert free.remaining == 2**32 - 1 and free.limit is None and not free.over
    blocked = ask(envoy, ("blocked", "a"))  # no requests_per_unit: 0, always over
    assert blocked.over and blocked.statuses[0].limit == (0, 1, "")
    peek = ask(envoy, Descriptor((("blocked", "a"),), hits=0))
    assert not peek.over and peek.statuses[0].remaining == 0
    # /admin/special replaces the limit named admin when both match in one request
    answer = ask(envoy, ("route", "/admin"), ("route", "/admin/special"))
    admin, special = answer.statuses
    assert admin.limit is None and not admin.over  # replaced: as if no limit matched
    assert special.limit == (1, MINUTE, "")
    assert ask(envoy, ("route", "/admin")).statuses[0].remaining == 99  # it was not charged


def test_shadow_mode_per_limit_and_global() -> None:
    envoy, _ = make()
    ask(envoy, ("shadow", "a"))
    second = ask(envoy, ("shadow", "a"))
    assert not second.over and not second.statuses[0].over and second.statuses[0].remaining == 0
    assert stat(envoy, "shadow_mode", "shadow") == 1
    envoy, _ = make("envoy: {shadow_mode: true}\n")
    ask(envoy, ("ip", "a"), hits=10)
    over = ask(envoy, ("ip", "a"), ("week", "a"))
    assert not over.over and over.statuses[0].over  # the status still says OVER_LIMIT
    assert (
        envoy.engine.metrics.registry.get_sample_value("ratekeeper_envoy_global_shadow_mode_total")
        == 1
    )


def test_quota_mode_is_over_only_when_every_quota_is() -> None:
    envoy, _ = make("envoy: {response_dynamic_metadata: true}\n")
    ask(envoy, ("quota", "a"))
    one = ask(envoy, ("quota", "a"), ("quota", "b"))
    assert not one.over and [s.over for s in one.statuses] == [True, False]
    assert one.metadata is not None and one.metadata["metadata"] == {"service": {"name": "b"},
                                                                      "other": 1}  # fmt: skip
    both = ask(envoy, ("quota", "a"), ("quota", "b"))
    assert both.over


def test_stats_as_upstream_counts_them() -> None:
    envoy, _ = make()
    ask(envoy, ("ip", "a"), hits=7)  # within; 7 <= near (8): no near_limit
    ask(envoy, ("ip", "a"), hits=2)  # 9: within, 1 hit past the near threshold
    ask(envoy, ("ip", "a"), hits=3)  # 12: over by 2, 1 hit (9 -> 10) near
    ask(envoy, ("ip", "a"), hits=4)  # over already: 4 over
    assert stat(envoy, "total_hits", "ip") == 16
    assert stat(envoy, "within_limit", "ip") == 9
    assert stat(envoy, "near_limit", "ip") == 2
    assert stat(envoy, "over_limit", "ip") == 6
    assert stat(envoy, "over_limit_with_local_cache", "ip") == 4  # the local cache answered


def test_detailed_metric_and_override_stat_keys_are_bounded() -> None:
    envoy, _ = make("envoy: {max_stat_keys: 3}\n")
    for user in ("u1", "u2", "u3", "u4", "u5"):
        ask(envoy, ("user", user))
    for rate in range(1, 6):  # callers choose override rates: no series per rate
        ask(envoy, Descriptor((("ip", "b"),), limit=(rate, HOUR)))
    assert stat(envoy, "total_hits", "user_u1") == 1
    assert stat(envoy, "total_hits", "user_u4") == 0
    assert stat(envoy, "total_hits", OTHER) == 7  # u4, u5 and the override of ip_b
    text = envoy.engine.metrics.exposition().decode()
    assert "override:" not in text  # ratekeeper_decisions_total{policy="edge/override"}
    assert 'policy="edge/override"' in text
    assert sanitize("remote_address_10.0.0.1:80|x") == "remote_address_10_0_0_1_80_x"


def test_override_shares_the_counter_of_the_configured_limit() -> None:
    envoy, _ = make()
    ask(envoy, ("ip", "c"), hits=4)
    status = ask(envoy, Descriptor((("ip", "c"),), limit=(5, MINUTE))).statuses[0]
    assert status.remaining == 0 and status.limit == (5, MINUTE, "")  # 5 hits of 5
    assert ask(envoy, Descriptor((("ip", "c"),), limit=(5, MINUTE))).over
    assert ask(envoy, ("ip", "c")).statuses[0].remaining == 3  # 7 of the configured 10


def test_share_threshold_shares_one_counter() -> None:
    envoy, _ = make()
    for name in ("a.pdf", "b.csv"):
        ask(envoy, ("files", "files/" + name), hits=5)
    assert ask(envoy, ("files", "files/c.txt")).over
    ask(envoy, ("files_no_share", "files_no_share/a.pdf"), hits=10)
    assert not ask(envoy, ("files_no_share", "files_no_share/b.csv")).over


def test_response_headers_none_upstream_or_ours() -> None:
    envoy, _ = make()
    assert ask(envoy, ("ip", "h")).headers == []
    envoy, _ = make("envoy:\n  response_headers: upstream\n  header_names: {reset: X-Reset}\n")
    answer = ask(envoy, ("ip", "h"), ("week", "h"), hits=3)
    assert answer.headers == [  # the descriptor with the least remaining: week, 2 of 5 left
        ("RateLimit-Limit", "5"),
        ("RateLimit-Remaining", "2"),
        ("X-Reset", str(7 * 86400 - int(T0) % (7 * 86400))),
    ]
    over = ask(envoy, ("week", "h"), ("ip", "h2"), hits=3)  # an over descriptor is chosen
    assert dict(over.headers)["RateLimit-Limit"] == "5"
    assert dict(over.headers)["RateLimit-Remaining"] == "0"
    envoy, _ = make("envoy: {response_headers: ratekeeper}\n")
    assert "X-RateLimit-Limit" in dict(ask(envoy, ("ip", "h")).headers)


def test_stop_increment_charges_only_the_descriptors_going_over() -> None:
    envoy, _ = make("envoy: {stop_increment_when_over_limit: true}\n")
    ask(envoy, ("week", "s"), hits=5)
    answer = ask(envoy, ("ip", "s"), ("week", "s"))
    assert answer.over and [s.over for s in answer.statuses] == [False, True]
    assert answer.statuses[0].remaining == 10  # checked, not charged
    assert ask(envoy, ("ip", "s")).statuses[0].remaining == 9
    envoy, _ = make()  # without the setting every descriptor is charged
    ask(envoy, ("week", "s"), hits=5)
    ask(envoy, ("ip", "s"), ("week", "s"))
    assert ask(envoy, ("ip", "s")).statuses[0].remaining == 8


def test_dynamic_metadata_describes_the_request() -> None:
    envoy, _ = make("envoy: {response_dynamic_metadata: true}\n")
    answer = ask(envoy, Descriptor((("ip", "m"),), hits=2, limit=(3, HOUR)), hits=1)
    assert answer.metadata == {
        "domain": "edge",
        "descriptors": [
            {"entries": ["ip=m"], "limit": "requests_per_unit:3 unit:HOUR", "hitsAddend": 2}
        ],
        "hitsAddend": 1,
    }


def test_large_requests_yield_to_the_event_loop() -> None:
    envoy, _ = make()
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    async def go() -> Answer:
        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        answer = await envoy.should_rate_limit(
            "edge", [Descriptor((("ip", str(i)),)) for i in range(256)], 1
        )
        task.cancel()
        return answer

    answer = run(go())
    assert len(answer.statuses) == 256 and ticks >= 256 // 64
