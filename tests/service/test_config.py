"""Config files: our format and Envoy's, errors naming file and line, and the JSON Schema."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from ratekeeper import ConfigError, Rate
from ratekeeper.service.config import loader as config

SCHEMA = json.loads(Path(config.__file__).with_name("schema.json").read_text())

OURS = """\
store: memory
auth:
  token: aaaaaaaaaaaaaaaaaaaa
limits:
  max_key_length: 64
policies:
  api.core:
    rate: 100/minute
    algorithm: sliding_window
    buckets: 4
  stacked:
    rate: [2/second, 30/minute]
  bucket:
    rate: 10/minute
    algorithm: token_bucket
    burst: 20
    shadow: true
  off:
    rate: 1/hour
    enabled: false
  uploads:
    kind: concurrency
    capacity: 20
    lease_ttl: 30
  exports:
    kind: concurrency
    capacity: 2
    shadow: true
"""

ENVOY = """\
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500
  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 500
    shadow_mode: true
  - key: client_id
    descriptors:
      - key: path
        rate_limit: {unit: MINUTE, requests_per_unit: 10}
      - key: plan
        value: internal
        rate_limit: {unlimited: true}
  - key: blocked
    rate_limit: {unit: day, requests_per_unit: 0}
"""


def test_our_format() -> None:
    cfg = config.parse_text(OURS)
    assert cfg.store.kind == "memory"
    assert cfg.auth.token == "a" * 20
    assert cfg.max_key_length == 64
    core = cfg.policies["api.core"]
    assert core.policy.rates == (Rate(100, 60.0),)
    assert core.algorithm == "sliding_window" and core.buckets == 4
    assert cfg.policies["stacked"].policy.rates == (Rate(2, 1.0), Rate(30, 60.0))
    assert cfg.policies["bucket"].shadow and cfg.policies["bucket"].burst == 20
    assert not cfg.policies["off"].enabled


def test_envoy_format_as_is() -> None:
    cfg = config.parse_text(ENVOY)
    tree = cfg.domains["mongo_cps"].children  # by upstream's composite key: key or key_value
    users = tree["database_users"].limit
    assert users is not None and users.policy is not None
    assert cfg.policies[users.policy].policy.rates == (Rate(500, 1.0),)
    default = tree["database_default"].limit
    assert default is not None and cfg.policies[default.policy or ""].shadow
    nested = tree["client_id"].children
    path = nested["path"].limit
    assert path is not None and cfg.policies[path.policy or ""].policy.rates == (Rate(10, 60.0),)
    internal = nested["plan_internal"].limit
    assert internal is not None and internal.unlimited and internal.policy is None
    assert tree["client_id"].limit is None
    blocked = tree["blocked"].limit
    assert blocked is not None and cfg.policies[blocked.policy or ""].block


def test_week_month_year_are_one_grammar_in_both_formats() -> None:
    """Envoy's units come from the library's rate grammar: a month is 30 days, a year 365."""
    for unit, seconds in config.ENVOY_UNITS.items():
        assert Rate.parse(f"1/{unit}") == (Rate(1, float(seconds)),)
    native = config.parse_text("policies:\n  quota:\n    rate: 100/month; 1000/year; 50/week\n")
    month = Rate(100, 30 * 86400.0)
    year = Rate(1000, 365 * 86400.0)
    assert native.policies["quota"].policy.rates == (month, year, Rate(50, 604800.0))
    cfg = config.parse_text(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: month, "
        "requests_per_unit: 100}\n  - key: y\n    rate_limit: {unit: YEAR, "
        "requests_per_unit: 7}\n"
    )
    assert cfg.policies["d/k"].policy.rates == (month,)
    assert cfg.policies["d/y"].policy.rates == (Rate(7, 365 * 86400.0),)


STORES = [
    ("store: memory\n", "memory"),
    ("store: redis://127.0.0.1:6379/0\n", "redis"),
    ("store:\n  url: redis://h:1/0\n  batch: {max_size: 64, max_wait_ms: 0.5, max_in_flight: 3}\n",
     "redis"),
    ("store:\n  shards:\n    - redis://a:1/0\n    - url: redis://b:1/0\n      replicas: "
     "[redis://c:1/0]\n      name: b\n", "sharded"),
    ("store:\n  cluster: redis://n:7000\n  batch: false\n", "cluster"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "kind"), STORES)
def test_stores(text: str, kind: str) -> None:
    cfg = config.parse_text(text)
    assert cfg.store.kind == kind
    jsonschema.validate(yaml.safe_load(text), SCHEMA)


def test_store_details() -> None:
    batched = config.parse_text(STORES[2][0]).store
    assert batched.batch and batched.batch_max_size == 64 and batched.batch_max_wait_ms == 0.5
    assert batched.batch_max_in_flight == 3
    assert config.parse_text(STORES[1][0]).store.batch_max_in_flight == 2
    sharded = config.parse_text(STORES[3][0]).store
    assert sharded.shards[1] == config.ShardSettings("redis://b:1/0", ("redis://c:1/0",), "b")
    assert not config.parse_text(STORES[4][0]).store.batch


def test_files_merge_and_a_descriptor_can_name_a_policy(tmp_path: Path) -> None:
    a = tmp_path / "a.yaml"
    a.write_text("policies:\n  shared:\n    rate: 5/minute\n")
    b = tmp_path / "b.yaml"
    b.write_text("domain: d\ndescriptors:\n  - key: k\n    policy: shared\n")
    cfg = config.load([str(a), str(b)], env={})
    limit = cfg.domains["d"].children["k"].limit
    assert limit is not None and limit.policy == "shared"


def test_tokens_from_environment(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("auth:\n  token_env: MY_TOKEN\npolicies: {}\n")
    cfg = config.load([str(f)], env={"MY_TOKEN": "t" * 32, "RATEKEEPER_ADMIN_TOKEN": "b" * 16})
    assert cfg.auth.token == "t" * 32 and cfg.auth.admin_token == "b" * 16
    with pytest.raises(ConfigError, match=r"c.yaml:2: auth.token_env names 'MY_TOKEN'"):
        config.load([str(f)], env={})
    with pytest.raises(ConfigError, match="environment variable RATEKEEPER_TOKEN must be"):
        config.load([str(f)], env={"RATEKEEPER_TOKEN": "short", "MY_TOKEN": "t" * 32})


BAD = [
    ("policies:\n  a:\n    kind: concurrency\n", 3, "has no 'capacity'"),
    ("policies:\n  a:\n    kind: concurrency\n    capacity: 0\n", 4, "capacity 0"),
    (
        "policies:\n  a:\n    kind: concurrency\n    capacity: 2\n    lease_ttl: -1\n",
        5,
        "lease_ttl -1",
    ),
    (
        "policies:\n  a:\n    kind: concurrency\n    capacity: 2\n    rate: 1/s\n",
        5,
        "unknown key 'rate'",
    ),
    ("policies:\n  a:\n    kind: leaky\n    rate: 1/s\n", 3, "policy kind 'leaky'"),
    (
        "policies:\n  a:\n    kind: concurrency\n    capacity: 2\n  a:\n    rate: 1/s\n",
        5,
        "appears twice",
    ),
    (
        "policies:\n  c:\n    kind: concurrency\n    capacity: 2\n"
        "domains:\n  - domain: d\n    descriptors:\n      - key: k\n        policy: c\n",
        9,
        "'c' is a concurrency policy",
    ),
    ("policies:\n  a:\n    rate: 100/fortnight\n", 3, "unit 'fortnight'"),
    ("policies:\n  a:\n    rate: 10/minute\n    algorithm: leaky\n", 4, "algorithm 'leaky'"),
    ("policies:\n  a:\n    rate: 10/minute\n    burst: 5\n", 4, "does not apply"),
    ("policies:\n  a:\n    algorithm: gcra\n", 3, "has no 'rate'"),
    ("policies:\n  a:\n    rate: 1/s\n    shadow: yes please\n", 4, "shadow 'yes please'"),
    ("policies:\n  a:\n    rate: 1/s\n    colour: red\n", 4, "unknown key 'colour'"),
    ("policies:\n  a:\n    rate: 1/s\n  a:\n    rate: 2/s\n", 4, "appears twice"),
    ("policies:\n  'bad name':\n    rate: 1/s\n", 2, "policy name 'bad name'"),
    ("store: memcached://x\n", 1, "store 'memcached://x'"),
    (
        "store:\n  url: redis://a/0\n  cluster: redis://b\n",
        3,
        "one of url, shards, cluster or sentinel",
    ),
    ("store:\n  shards: []\n", 2, "store.shards is empty"),
    ("store:\n  shards:\n    - url: http://x\n", 3, "shard url 'http://x'"),
    ("store:\n  url: redis://a/0\n  batch: {max_wait_ms: 500}\n", 3, "max_wait_ms 500"),
    ("store:\n  url: redis://a/0\n  batch: {max_in_flight: 0}\n", 3, "max_in_flight"),
    ("limits:\n  max_key_length: 0\n", 2, "max_key_length 0"),
    ("auth:\n  token: short\n", 2, "at least 16"),
    ("policies: [1, 2]\n", 1, "policies must be a mapping"),
    ("policies:\n  a: {rate: 1/s\n", 3, "invalid YAML"),
    ("", 1, "the file is empty"),
    ("domain: d\ndescriptors:\n  - value: x\n", 3, "descriptor has an empty key"),
    (
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, "
        "requests_per_unit: 1}\n",
        4,
        "unit 'fortnight'",
    ),
    (
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n"
        "      requests_per_unit: -1\n",
        6,
        "requests_per_unit -1",
    ),
    ("domain: d\ndescriptors:\n  - key: k\n    policy: nowhere\n", 4, "policy 'nowhere'"),
    (
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: second}\n",
        4,
        "should not specify rate limit unit when unlimited",
    ),
    ("domain: d\ndescriptors:\n  - key: k\n  - key: k\n", 4, "composite key 'd.k'"),
    ("domains:\n  - {}\n", 2, "cannot have empty domain"),  # found by tests/abuse/test_fuzz.py
    ("domains:\n  - descriptors: []\n", 2, "cannot have empty domain"),
]


@pytest.mark.parametrize(("text", "line", "message"), BAD)
def test_errors_name_file_line_and_problem(tmp_path: Path, text: str, line: int, message: str):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as info:
        config.load([str(f)], env={})
    assert str(info.value).startswith(f"{f}:{line}: "), str(info.value)
    assert message in str(info.value)


def test_duplicates_across_files_name_the_first_file(tmp_path: Path) -> None:
    a = tmp_path / "a.yaml"
    a.write_text("domain: d\ndescriptors: []\n")
    b = tmp_path / "b.yaml"
    b.write_text("domain: d\ndescriptors: []\n")
    with pytest.raises(
        ConfigError, match=r"b.yaml:1: duplicate domain 'd': already defined in .*a.yaml"
    ):
        config.load([str(a), str(b)], env={})


def test_unreadable_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"missing.yaml: cannot read"):
        config.load([str(tmp_path / "missing.yaml")], env={})


@pytest.mark.parametrize("text", [OURS, ENVOY, config.EXAMPLE.read_text()])
def test_accepted_configs_match_the_schema(text: str) -> None:
    jsonschema.validate(yaml.safe_load(text), SCHEMA)


@pytest.mark.parametrize(
    "text",
    [
        "policies:\n  a:\n    rate: 1/s\n    colour: red\n",
        "policies:\n  a:\n    algorithm: gcra\n",
        "policies:\n  a:\n    kind: concurrency\n",
        "policies:\n  a:\n    kind: concurrency\n    capacity: 2\n    lease_ttl: 0\n",
        "policies:\n  a:\n    kind: rate\n    capacity: 2\n",
        "store: {url: memory, extra: 1}\n",
        "domain: d\ndescriptors:\n  - value: x\n",
    ],
)
def test_refused_configs_fail_the_schema(text: str) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(yaml.safe_load(text), SCHEMA)
    with pytest.raises(ConfigError):
        config.parse_text(text)


def test_example_loads_without_arguments() -> None:
    cfg = config.load([], env={})
    assert cfg.files == (str(config.EXAMPLE),)
    assert "api.core" in cfg.policies and "edge" in cfg.domains


def test_concurrency_policies() -> None:
    cfg = config.parse_text(OURS)
    assert set(cfg.concurrency) == {"uploads", "exports"}
    assert "uploads" not in cfg.policies
    assert cfg.concurrency["uploads"] == config.ConcurrencySpec("uploads", 20, 30.0)
    exports = cfg.concurrency["exports"]
    assert exports.capacity == 2 and exports.lease_ttl == 60.0 and exports.shadow


SENTINEL = (
    "sentinel: {service: mymaster, sentinels: [redis://10.0.0.1:26379, redis://10.0.0.2:26379]"
)


@pytest.mark.parametrize(
    ("text", "kind", "buckets"),
    [
        (f"store:\n  {SENTINEL}}}\n", "sentinel", 0),
        (
            f"store:\n  {SENTINEL}, url: 'rediss://rk:pw@/2'}}\n  layout: compact\n",
            "sentinel",
            4096,
        ),
        (
            f"store:\n  shards:\n    - {{{SENTINEL}}}, name: a}}\n    - redis://h:1/0\n",
            "sharded",
            0,
        ),
        ("store:\n  url: redis://h:1/0\n  layout: {buckets: 64}\n", "redis", 64),
        ("store:\n  cluster: redis://h:1\n  layout: default\n", "cluster", 0),
    ],
)
def test_sentinel_and_layout_settings(text: str, kind: str, buckets: int) -> None:
    jsonschema.validate(yaml.safe_load(text), SCHEMA)
    store = config.parse_text(text).store
    assert (store.kind, store.layout_buckets) == (kind, buckets)
    sentinel = [s for s in store.shards if s.sentinels]
    if kind != "redis" and kind != "cluster":
        (shard,) = sentinel
        assert shard.service == "mymaster" and len(shard.sentinels) == 2
        assert shard.url == ("rediss://rk:pw@/2" if buckets else "redis:///0")


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("store:\n  sentinel: {service: m}\n", r":2: store.sentinel.sentinels must be a list"),
        ("store:\n  sentinel: {service: '', sentinels: [redis://h:1]}\n", r":2: .*service ''"),
        (
            "store:\n  sentinel:\n    service: m\n    sentinels: [redis://h:1]\n"
            "    url: redis://u:hunter2@host:6379/0\n",
            r":5: store.sentinel: url 'redis://u:\*\*\*@host:6379/0' is invalid; expected .*",
        ),
        ("store:\n  sentinel: {service: m, sentinels: [ftp://h]}\n", r":2: .*sentinel url 'ftp"),
        ("store:\n  url: redis://h:1/0\n  layout: tiny\n", r":3: store layout 'tiny' is unknown"),
        ("store:\n  url: redis://h:1/0\n  layout: {buckets: 0}\n", r":3: .*buckets=0 is invalid"),
        (
            f"store:\n  url: redis://h:1/0\n  {SENTINEL}}}\n",
            r"one of url, shards, cluster or sentinel",
        ),
        (f"store:\n  shards:\n    - {{{SENTINEL}}}, url: redis://h:1}}\n", r"url"),
        ("store: 'http://u:hunter2@h/0'\n", r"store 'http://u:\*\*\*@h/0' is unknown"),
    ],
)
def test_bad_sentinel_and_layout_settings_are_named(text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as caught:
        config.parse_text(text)
    assert "hunter2" not in str(caught.value)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(yaml.safe_load(text), SCHEMA)
