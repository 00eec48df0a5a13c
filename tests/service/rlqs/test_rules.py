"""The ``rlqs:`` config section: rules read with their problems at their lines, matched as
descriptors are, and the JSON Schema agreeing."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from ratekeeper.errors import ConfigError
from ratekeeper.service.config import loader as config

SCHEMA = json.loads(Path(config.__file__).with_name("schema.json").read_text())
GOOD = """\
policies:
  tenant.quota: {rate: 100/second}
  stack: {rate: "1/second; 10/minute"}
  uploads: {kind: concurrency, capacity: 3}
rlqs:
  assignment_ttl: 30
  unmatched: deny
  max_buckets: 50
  buckets:
    - domain: edge
      bucket: {name: tenant, tenant: "*"}
      policy: tenant.quota
    - domain: edge
      bucket: {name: tenant, tenant: "acme-*"}
      rate: 5/second
    - domain: edge
      bucket: {name: tenant, tenant: acme-eu}
      rate: 7/second
      burst: 3
    - domain: edge
      bucket: {name: tier, tier: 1}
      policy: tenant.quota
"""


def test_a_good_section_loads() -> None:
    rlqs = config.parse_text(GOOD).rlqs
    assert (rlqs.assignment_ttl, rlqs.unmatched, rlqs.max_buckets) == (30, "deny", 50)
    assert [r.policy for r in rlqs.rules] == [
        "tenant.quota", "rlqs:edge/name=tenant,tenant=acme-*",
        "rlqs:edge/name=tenant,tenant=acme-eu", "tenant.quota",
    ]  # fmt: skip
    jsonschema.validate(yaml.safe_load(GOOD), SCHEMA)
    cfg = config.parse_text(GOOD)
    assert cfg.policies["rlqs:edge/name=tenant,tenant=acme-eu"].burst == 3


@pytest.mark.parametrize(
    ("tenant", "policy"),
    [
        ("globex", "tenant.quota"),
        ("acme-us", "rlqs:edge/name=tenant,tenant=acme-*"),
        ("acme-eu", "rlqs:edge/name=tenant,tenant=acme-eu"),  # exact beats the prefix
    ],
)
def test_the_most_specific_rule_wins(tenant: str, policy: str) -> None:
    rlqs = config.parse_text(GOOD).rlqs
    rule = rlqs.rule_for("edge", (("name", "tenant"), ("tenant", tenant)))
    assert rule is not None and rule.policy == policy


def test_keys_domains_and_values_must_all_match() -> None:
    rlqs = config.parse_text(GOOD).rlqs
    assert rlqs.rule_for("other", (("name", "tenant"), ("tenant", "a"))) is None
    assert rlqs.rule_for("edge", (("name", "tenant"),)) is None  # a key missing
    assert rlqs.rule_for("edge", (("name", "tenant"), ("tenant", "a"), ("x", "y"))) is None
    assert rlqs.rule_for("edge", (("name", "tier"), ("tier", "1"))) is not None


def test_equal_specificity_goes_to_the_first_written() -> None:
    first = '    - domain: edge\n      bucket: {name: tenant, tenant: "*"}'
    text = GOOD.replace(first, '    - domain: edge\n      bucket: {name: "*", tenant: "*"}\n'
                        "      policy: tenant.quota\n" + first)  # fmt: skip
    rlqs = config.parse_text(text).rlqs
    rule = rlqs.rule_for("edge", (("name", "tenant"), ("tenant", "zz")))
    assert rule is not None and rule.pattern == (("name", "tenant"), ("tenant", "*"))


BAD = [
    ("      policy: tenant.quota\n", "      policy: stack\n", 12, "has 2 rates"),
    ("      policy: tenant.quota\n", "      policy: uploads\n", 12, "concurrency policy"),
    ("      policy: tenant.quota\n", "      policy: nope\n", 12, "'nope' is not defined"),
    ("  assignment_ttl: 30\n", "  assignment_ttl: 5\n", 6, "from 10 to 3_600"),
    ("  unmatched: deny\n", "  unmatched: sometimes\n", 7, "no_assignment, allow, deny"),
    ("  max_buckets: 50\n", "  max_buckets: 50\n  cap: 1\n", 9, "unknown key 'cap'"),
    (
        'tenant: "acme-*"}\n      rate: 5/second',
        'tenant: "*"}\n      rate: 5/second',
        13,
        "matched twice",
    ),
    ("      rate: 5/second\n", "      rate: 5/fortnight\n", 15, "fortnight"),
    (
        "      rate: 5/second\n",
        "      rate: 5/second\n      policy: tenant.quota\n",
        13,
        "one of them",
    ),
    (
        "      policy: tenant.quota\n",
        "      policy: tenant.quota\n      burst: 2\n",
        13,
        "burst goes with rate",
    ),
    ("{name: tier, tier: 1}", "{name: tier, tier: true}", 21, "must be a string"),
    ("{name: tier, tier: 1}", "{}", 21, "bucket is empty"),
    (
        "    - domain: edge\n      bucket: {name: tier",
        "    - domain: ''\n      bucket: {name: tier",
        20,
        "non-empty string",
    ),
    ("100/second}", "0/second}", 2, "rate"),
]


@pytest.mark.parametrize(("old", "new", "line", "words"), BAD)
def test_a_bad_section_is_refused_at_its_line(old: str, new: str, line: int, words: str) -> None:
    assert old in GOOD
    with pytest.raises(ConfigError) as caught:
        config.parse_text(GOOD.replace(old, new, 1), "rk.yaml")
    assert f"rk.yaml:{line}:" in str(caught.value) and words in str(caught.value), caught.value


def test_every_problem_of_the_section_is_reported_at_once() -> None:
    text = GOOD.replace("  assignment_ttl: 30\n", "  assignment_ttl: 5\n").replace(
        "      policy: tenant.quota\n", "      policy: stack\n", 1
    )
    with pytest.raises(ConfigError) as caught:
        config.parse_text(text, "rk.yaml")
    assert str(caught.value).count("rk.yaml:") == 2


def test_the_section_may_appear_in_one_file_only(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("rlqs: {}\n")
    (tmp_path / "b.yaml").write_text("rlqs: {unmatched: allow}\n")
    with pytest.raises(ConfigError, match="rlqs is already set in"):
        config.load([str(tmp_path)])


def test_the_schema_refuses_what_the_loader_refuses() -> None:
    for old, new in (("  unmatched: deny\n", "  unmatched: sometimes\n"),
                     ("  assignment_ttl: 30\n", "  assignment_ttl: 5\n"),
                     ("  max_buckets: 50\n", "  max_buckets: 50\n  cap: 1\n")):  # fmt: skip
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(yaml.safe_load(GOOD.replace(old, new)), SCHEMA)
