"""Keys crafted to collide never share a counter: on every store, in the Redis key layout and
through the service's policy namespacing (``<len>:<name>:<key>``) and Envoy descriptors.

Each family below holds keys that a careless encoding would map to one counter: braces and
percent-escapes that would move or fake the Redis hash tag, separators and prefixes that would
shift the policy/key boundary, a leading ``#`` that would pass for a hashed tag, unicode normal
forms (NFC/NFD look alike but are distinct strings), the 200/201-byte plain/hashed boundary,
huge keys, and lone surrogates. The check is behavioural: exhaust one key, every other key of
the family must still be admitted.
"""

from __future__ import annotations

import asyncio
import unicodedata
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ratekeeper import Limiter, ManualClock
from ratekeeper.service.config.loader import parse_text
from ratekeeper.service.engine import envoy_key, store_key
from ratekeeper.stores.redis.keys import MAX_PLAIN_BYTES, encode_tag, redis_key
from tests.conftest import Backend
from tests.harness import T0

CAFE_NFC = unicodedata.normalize("NFC", "café")
CAFE_NFD = unicodedata.normalize("NFD", "café")
ANGSTROM = "\u212b"  # Angstrom sign, NFC-normalizes to U+00C5


def _plain_boundary() -> list[str]:
    """Keys of exactly 200 and 201 UTF-8 bytes (plain and hashed tags), and their twins."""
    at = "a" * MAX_PLAIN_BYTES
    over = "a" * (MAX_PLAIN_BYTES + 1)
    multibyte = "é" * (MAX_PLAIN_BYTES // 2)  # 200 bytes, 100 characters
    return [at, over, at[:-1] + "b", over[:-1] + "b", multibyte, multibyte + "a", "%" * 67]


FAMILIES: dict[str, list[str]] = {
    "braces": ["{a}", "a", "{a", "a}", "}{a", "%7Ba%7D", "{{a}}", "{}", "{}a", "a{}"],
    "percent": ["%", "%25", "%2525", "%7B", "{", "%7D", "}", "%23", "#", "%u", "%uD800"],
    "hash-prefix": ["#", "#a", "%23a", "#" + "0" * 64, encode_tag("x" * 300)],
    "separators": ["a:b", "a:b:", ":a:b", "a::b", "a/b", "a b", "a\x00b", "a\nb", "a\tb"],
    "unicode": [CAFE_NFC, CAFE_NFD, ANGSTROM, "\u00c5", "A\u030a", "ǅ", "Ǆ", "ǆ", "ß", "ss"],
    "boundary": _plain_boundary(),
    "huge": ["k" * 10_000, "k" * 10_001, "k" * 9_999 + "j", "€" * 5_000],
    "surrogates": ["\ud800", "\udfff", "\ud83d\ude00", "😀", "%uD800", "\ud800\ud800"],
}


def _assert_isolated(limiter: Limiter, keys: list[str], rate: str = "1/hour") -> None:
    for key in keys:
        assert limiter.hit(key, rate).allowed, f"{key[:40]!r} was refused before its first use"
    for key in keys:
        decision = limiter.hit(key, rate)
        assert not decision.allowed, f"{key[:40]!r} admitted twice: its counter was shared"
        assert not decision.degraded, f"{key[:40]!r} made the store fail"


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_no_two_crafted_keys_share_a_counter_on_any_store(backend: Backend, family: str) -> None:
    backend.flush()
    keys = FAMILIES[family]
    assert len(set(keys)) == len(keys)
    limiter = Limiter(store=backend.store, clock=ManualClock(start=T0), fail_open=True)
    _assert_isolated(limiter, keys)
    assert limiter.stats()["store_errors"] == 0


def test_every_family_together_on_the_memory_store() -> None:
    keys = sorted({k for family in FAMILIES.values() for k in family})
    limiter = Limiter(clock=ManualClock(start=T0))
    _assert_isolated(limiter, keys)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.text(st.characters(exclude_categories=()), min_size=1, max_size=260), min_size=2)
)
def test_redis_key_layout_is_injective(keys: list[str]) -> None:
    keys = list(dict.fromkeys(keys))
    tags = [encode_tag(k) for k in keys]
    assert len(set(tags)) == len(tags)
    for tag in tags:
        assert "}" not in tag and "{" not in tag
        tag.encode("utf-8")  # a Redis client can always send it
        assert len(tag.encode()) <= MAX_PLAIN_BYTES or tag.startswith("#")
    full = {redis_key("rk", k, "f:1h") for k in keys}
    assert len(full) == len(keys)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (("rk", "a", "f:1h"), ("rk", "a", "f:1m")),
        (("rk", "a}b", "f"), ("rk", "a", "b}f")),
        (("", "x", "f"), ("rk", "x", "f")),
        (("rk:", "x", "f"), ("rk", ":x", "f")),
    ],
)
def test_prefix_tag_and_slot_cannot_trade_characters(
    a: tuple[str, str, str], b: tuple[str, str, str]
) -> None:
    assert redis_key(*a) != redis_key(*b)


@settings(max_examples=300, deadline=None)
@given(
    st.tuples(st.text(min_size=1, max_size=12), st.text(min_size=1, max_size=12)),
    st.tuples(st.text(min_size=1, max_size=12), st.text(min_size=1, max_size=12)),
)
def test_policy_namespacing_is_injective(a: tuple[str, str], b: tuple[str, str]) -> None:
    assert (store_key(*a) == store_key(*b)) == (a == b)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.text(max_size=6), st.text(max_size=6)), max_size=3),
    st.lists(st.tuples(st.text(max_size=6), st.text(max_size=6)), max_size=3),
    st.sampled_from(["d", "d/x", "x"]),
)
def test_envoy_descriptor_keys_are_injective(
    a: list[tuple[str, str]], b: list[tuple[str, str]], domain: str
) -> None:
    assert (envoy_key("d", a) == envoy_key(domain, b)) == (a == b and domain == "d")


TENANT_CONFIG = """\
policies:
  a:
    rate: 1/hour
  "a:1":
    rate: 1/hour
  "1:a":
    rate: 1/hour
  a.b:
    rate: 1/hour
"""


@pytest.mark.parametrize("store_kind", ["memory", "redis"])
def test_tenants_whose_name_and_key_overlap_never_share(
    store_kind: str, request: pytest.FixtureRequest
) -> None:
    from ratekeeper import AsyncLimiter, MemoryStore, RedisStore
    from ratekeeper.service.engine import Engine
    from ratekeeper.service.metrics import Metrics

    store: Any = MemoryStore()
    if store_kind == "redis":
        url = request.getfixturevalue("redis_url")
        store = RedisStore(url, socket_timeout=5, prefix="abuse")
    limiter = AsyncLimiter(store=store, clock=ManualClock(start=T0))
    engine = Engine(parse_text(TENANT_CONFIG), limiter, Metrics(), clock=lambda: T0)
    # (policy, key) pairs whose naive "policy:key" join would coincide
    pairs = [("a", "1:x"), ("a:1", "x"), ("1:a", "x"), ("a", "x"), ("a.b", "x"), ("a", "b:x")]

    async def hits() -> list[bool]:
        return [
            (await engine.hit(engine.spec(p), engine.check_key(k), 1)).decision.allowed
            for p, k in pairs + pairs
        ]

    answers = asyncio.run(hits())
    assert answers == [True] * len(pairs) + [False] * len(pairs), answers
    assert limiter.stats()["store_errors"] == 0


def test_envoy_limits_whose_generated_names_coincide_keep_their_own_limits() -> None:
    """Domain ``a/b`` + key ``c`` and domain ``a`` + keys ``b``, ``c`` are both named ``a/b/c``:
    the second used to replace the first's limit silently (5/hour became 1000/second). Now
    the second is named ``a/b/c~2`` and each descriptor keeps its limit and counter."""
    config = parse_text(
        """\
domains:
  - domain: a/b
    descriptors:
      - key: c
        rate_limit: {unit: hour, requests_per_unit: 5}
  - domain: a
    descriptors:
      - key: b
        descriptors:
          - key: c
            rate_limit: {unit: second, requests_per_unit: 1000}
"""
    )
    assert config.policies["a/b/c"].policy.rates[0].count == 5
    assert config.policies["a/b/c~2"].policy.rates[0].count == 1000


def test_keys_holding_equals_or_underscores_never_share_a_counter() -> None:
    """``key: "k=v"`` and ``key: k, value: v`` are distinct descriptors (envoyproxy/ratelimit
    accepts both); requests whose entries differ never share a counter, however they join."""
    from ratekeeper import AsyncLimiter, MemoryStore
    from ratekeeper.service.engine import Engine
    from ratekeeper.service.envoy.rls import Descriptor, Envoy
    from ratekeeper.service.metrics import Metrics

    config = parse_text(
        """\
domains:
  - domain: d
    descriptors:
      - key: "k=v"
        rate_limit: {unit: hour, requests_per_unit: 1}
      - key: k
        value: v
        rate_limit: {unit: hour, requests_per_unit: 1}
      - key: a_b
        rate_limit: {unit: hour, requests_per_unit: 1}
      - key: a
        rate_limit: {unit: hour, requests_per_unit: 1}
"""
    )
    metrics = Metrics()
    engine = Engine(config, AsyncLimiter(store=MemoryStore()), metrics, clock=lambda: T0)
    envoy = Envoy(engine, metrics.envoy)
    requests = [[("k=v", "x")], [("k", "v")], [("a_b", "c")], [("a", "b_c")]]

    async def answers() -> list[bool]:
        out = []
        for entries in requests + requests:
            answer = await envoy.should_rate_limit("d", [Descriptor(tuple(entries))], 1)
            out.append(answer.over)
        return out

    assert asyncio.run(answers()) == [False] * 4 + [True] * 4
