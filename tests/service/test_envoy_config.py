"""Envoy-format config loads, or is refused, exactly where envoyproxy/ratelimit's would be.

Each case restates one file of upstream's ``test/config`` and ``examples/ratelimit/config``
sets (written here, not copied) with what upstream's own tests expect of it: the limit each
descriptor gets, its stat key, or the refusal, which here also names ``file:line``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ratekeeper.errors import ConfigError
from ratekeeper.service.config import loader as config
from ratekeeper.service.config.envoy import EnvoyLimit
from ratekeeper.service.envoy.match import find, wildcard_match


def load(tmp_path: Path, *texts: str, merge: bool = False) -> config.ServiceConfig:
    paths = []
    if merge:
        (tmp_path / "settings.yaml").write_text("envoy: {merge_domains: true}\n")
        paths.append(str(tmp_path / "settings.yaml"))
    for i, text in enumerate(texts):
        path = tmp_path / f"f{i}.yaml"
        path.write_text(text)
        paths.append(str(path))
    return config.load(paths, env={})


def refused(tmp_path: Path, text: str, message: str, line: int) -> None:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text)
    assert f"f0.yaml:{line}: " in str(info.value)
    assert message in str(info.value)


def limit(cfg: config.ServiceConfig, domain: str, *entries: tuple[str, str]) -> EnvoyLimit | None:
    m = find(domain, cfg.domains[domain], tuple(entries))
    return None if m is None else m.limit


def stats_key(cfg: config.ServiceConfig, domain: str, *entries: tuple[str, str]) -> str:
    m = find(domain, cfg.domains[domain], tuple(entries))
    assert m is not None
    return m.stats_key


BASIC = """\
domain: app
descriptors:
  - key: tenant
    value: acme
    descriptors:
      - key: user                       # any user of acme
        rate_limit: {unit: second, requests_per_unit: 5}
      - key: user
        value: root                     # this one user: more specific, wins
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: route
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: route
    value: /login
    rate_limit: {unit: minute, requests_per_unit: 30}
  - key: route
    value: /health                      # no limit: allow-listed
  - key: region
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: plan
    rate_limit: {name: plan_limit, unit: day, requests_per_unit: 1}
  - key: job
    value: nightly
    rate_limit: {unit: day, requests_per_unit: 15}
    descriptors:
      - key: step
        value: load
        rate_limit: {unit: day, requests_per_unit: 25}
  - key: internal
    rate_limit: {unlimited: true}
  - key: client
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 70}
"""


def test_basic_matching_as_upstream(tmp_path: Path) -> None:
    cfg = load(tmp_path, BASIC)
    assert limit(cfg, "app") is None  # no entries: no limit
    assert limit(cfg, "app", ("tenant", "other")) is None
    assert limit(cfg, "app", ("tenant", "acme")) is None  # a level without a limit
    assert limit(cfg, "app", ("route", "/x"), ("sub", "y")) is None  # deeper than the tree
    assert limit(cfg, "app", ("job", "nightly"), ("step", "other")) is None
    any_user = limit(cfg, "app", ("tenant", "acme"), ("user", "bob"))
    assert any_user is not None and (any_user.requests_per_unit, any_user.unit) == (5, 1)
    root = limit(cfg, "app", ("tenant", "acme"), ("user", "root"))
    assert root is not None and root.requests_per_unit == 10
    assert stats_key(cfg, "app", ("tenant", "acme"), ("user", "bob")) == "app.tenant_acme.user"
    assert (
        stats_key(cfg, "app", ("tenant", "acme"), ("user", "root")) == "app.tenant_acme.user_root"
    )
    route = limit(cfg, "app", ("route", "/x"))
    assert route is not None and (route.requests_per_unit, route.unit) == (20, 2)
    assert stats_key(cfg, "app", ("route", "/login")) == "app.route_/login"
    assert limit(cfg, "app", ("route", "/health")) is None
    plain = limit(cfg, "app", ("region", "eu"))
    assert plain is not None and plain.name == "" and plain.unit == 3
    named = limit(cfg, "app", ("plan", "free"))
    assert named is not None and named.name == "plan_limit" and named.unit == 4
    unlimited = limit(cfg, "app", ("internal", "x"))
    assert unlimited is not None and unlimited.unlimited and unlimited.policy is None
    # detailed_metric: the caller's value is in the stat key
    assert stats_key(cfg, "app", ("client", "a")) == "app.client_a"
    assert stats_key(cfg, "app", ("client", "b")) == "app.client_b"
    assert cfg.warnings == ()


def test_domains_merge_when_asked(tmp_path: Path) -> None:
    item = (
        "domain: d\ndescriptors:\n  - {{key: {}, value: '{}', rate_limit: {{unit: minute, {}}}}}\n"
    )
    one = item.format("a", 1, "requests_per_unit: 10")
    two = item.format("b", 2, "requests_per_unit: 20")
    cfg = load(tmp_path, one, two, merge=True)
    a, b = limit(cfg, "d", ("a", "1")), limit(cfg, "d", ("b", "2"))
    assert a is not None and a.requests_per_unit == 10
    assert b is not None and b.requests_per_unit == 20
    with pytest.raises(ConfigError, match=r"f1.yaml:1: duplicate domain 'd'"):
        load(tmp_path, one, two)
    with pytest.raises(ConfigError, match=r"f1.yaml:3: duplicate descriptor composite key 'd.a_1'"):
        load(tmp_path, one, one, merge=True)


@pytest.mark.parametrize(
    ("text", "message", "line"),
    [
        ("descriptors:\n", "config file cannot have empty domain", 1),
        ("0.25: d\ndescriptors:\n", "unknown key '0.25'", 1),
        ("domain: d\ndescriptors:\n  - value: v\n", "descriptor has an empty key", 3),
        ("domain: d\ndescriptors:\n  - {key: k, value: v}\n  - {key: k, value: v}\n",
         "duplicate descriptor composite key 'd.k_v'", 4),
        # a key and a key+value whose composite keys coincide clash too, as upstream
        ("domain: d\ndescriptors:\n  - {key: k_v}\n  - {key: k, value: v}\n",
         "duplicate descriptor composite key 'd.k_v'", 4),
        ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: foo, requests_per_unit: 5}\n",
         "invalid rate limit unit 'foo'", 4),
        ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {requests_per_unit: 5}\n",
         "invalid rate limit unit ''", 4),
        ("domain: d\ndescriptors:\n  - key: k\n    ratelimit: {unit: day}\n",
         "unknown key 'ratelimit'", 4),
        ("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: day\n"
         "      requestsperunit: 5\n", "unknown key 'requestsperunit'", 6),
        ("domain: d\ndescriptors:\n  - a\n  - b\n", "a list may hold only mappings, not 'a'", 3),
        ("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      name: me\n"
         "      replaces: [{name: me}]\n      unit: second\n",
         "replaces should not contain name of same descriptor", 6),
        ("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      name: me\n"
         "      replaces:\n        - name:\n      unit: second\n",
         "should not have an empty replaces entry", 7),
        ("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, unit: day}\n",
         "should not specify rate limit unit when unlimited", 4),
        ("domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      requests_per_unit: 1.5\n",
         "must be a string, a whole number, true/false", 5),
        ("domain: d\ndescriptors:\n  - {key: k, value: v, share_threshold: true}\n",
         "share_threshold can only be used with wildcard values", 3),
        ("'''\n", "invalid YAML", 2),
    ],
)  # fmt: skip
def test_refused_as_upstream_refuses(tmp_path: Path, text: str, message: str, line: int) -> None:
    refused(tmp_path, text, message, line)


def test_duplicate_domain_is_refused_naming_both_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"f1.yaml:1: duplicate domain 'app': already defined in"):
        load(tmp_path, BASIC, "domain: app\ndescriptors:\n")


def test_what_upstream_accepts_loads(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        """\
domain: 7
descriptors:
  - key: a=b                 # '=' in a key is fine
    value: 5                 # a whole number is its digits
    rate_limit: {unit: SeCoNd}   # no requests_per_unit: 0, always over
  - key: none
    descriptors:             # null: no descriptors
    rate_limit:              # null: no limit
  - key: w
    unlimited: true          # a valid key where it does nothing: ignored, with a warning
    rate_limit: {unlimited: true, requests_per_unit: 9, name: free}
  - key: meta
    rate_limit: {unit: hour, requests_per_unit: 3}
    metadata: {team: {name: x, tags: [a, 1, 2.5]}}
""",
    )
    zero = limit(cfg, "7", ("a=b", "5"))
    assert zero is not None and zero.requests_per_unit == 0 and zero.unit == 1
    assert cfg.policies[zero.policy or ""].block
    assert limit(cfg, "7", ("none", "x")) is None
    w = limit(cfg, "7", ("w", "x"))
    assert w is not None and w.unlimited
    assert len(cfg.warnings) == 1 and "f0.yaml:10: key 'unlimited' has no effect" in cfg.warnings[0]
    meta = limit(cfg, "7", ("meta", "x"))
    assert meta is not None and meta.metadata == {"team": {"name": "x", "tags": ["a", 1, 2.5]}}


def test_wildcards(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        """\
domain: d
descriptors:
  - {key: wild, value: foo*, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: exact, value: foo, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: any, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: mid, value: bar*b, rate_limit: {unit: minute, requests_per_unit: 20}}
  - {key: multi, value: foo*bar*baz, rate_limit: {unit: minute, requests_per_unit: 10}}
  - key: nested
    value: v1
    descriptors:
      - {key: wild, value: goo*, rate_limit: {unit: minute, requests_per_unit: 20}}
""",
    )
    assert limit(cfg, "d", ("any", "foo1")) is limit(cfg, "d", ("any", "foo2"))
    assert stats_key(cfg, "d", ("any", "foo1")) == "d.any"
    assert limit(cfg, "d", ("wild", "foo1")) is limit(cfg, "d", ("wild", "foo"))
    assert stats_key(cfg, "d", ("wild", "foo1")) == "d.wild_foo*"
    assert stats_key(cfg, "d", ("nested", "v1"), ("wild", "goo2")) == "d.nested_v1.wild_goo*"
    assert limit(cfg, "d", ("wild", "bar")) is None
    assert limit(cfg, "d", ("exact", "foo1")) is None  # no '*': no prefix match
    for value, matches in [("barab", True), ("bar123b", True), ("barb", True),
                           ("bara", False), ("xbarb", False)]:  # fmt: skip
        assert (limit(cfg, "d", ("mid", value)) is not None) == matches, value
    assert stats_key(cfg, "d", ("mid", "bar1b")) == "d.mid_bar*b"
    for value, matches in [("foo123bar456baz", True), ("foobarbaz", True),
                           ("foo123baz", False), ("bar456baz", False)]:  # fmt: skip
        assert (limit(cfg, "d", ("multi", value)) is not None) == matches, value
    assert wildcard_match(("a", "b", "a"), "aba") and not wildcard_match(("ab", "ba"), "aba")


SHARE = """\
domain: d
descriptors:
  - {key: files, value: files/*, share_threshold: true,
     rate_limit: {unit: minute, requests_per_unit: 100}}
  - key: path
    value: path/*
    share_threshold: true
    descriptors:
      - key: file
        value: file/*
        descriptors:
          - {key: type, rate_limit: {unit: minute, requests_per_unit: 120}}
  - key: route
    value: api/*
    share_threshold: true
    value_to_metric: true
    descriptors:
      - {key: method, rate_limit: {unit: minute, requests_per_unit: 60}}
  - key: service
    value: svc/*
    share_threshold: true
    descriptors:
      - {key: endpoint, detailed_metric: true, rate_limit: {unit: minute, requests_per_unit: 80}}
  - {key: file, value: test1, rate_limit: {unit: minute, requests_per_unit: 50}}
  - {key: file, value: test*, share_threshold: true,
     rate_limit: {unit: minute, requests_per_unit: 100}}
"""


def test_share_threshold_counts_all_values_of_a_wildcard_on_one_counter(tmp_path: Path) -> None:
    cfg = load(tmp_path, SHARE)
    root = cfg.domains["d"]
    a = find("d", root, (("files", "files/a.pdf"),))
    b = find("d", root, (("files", "files/b.csv"),))
    assert a is not None and b is not None
    assert a.counter == b.counter == (("files", "files/*"),)
    assert a.stats_key == "d.files_files/*"
    deep = find("d", root, (("path", "path/x"), ("file", "file/y"), ("type", "pdf")))
    assert deep is not None  # only the share_threshold entry is replaced in the counter
    assert deep.counter == (("path", "path/*"), ("file", "file/y"), ("type", "pdf"))
    metric = find("d", root, (("route", "api/v1"), ("method", "GET")))
    assert metric is not None and metric.stats_key == "d.route_api/*.method"
    detailed = find("d", root, (("service", "svc/a"), ("endpoint", "e1")))
    assert detailed is not None and detailed.stats_key == "d.service_svc/*.endpoint_e1"
    exact = find("d", root, (("file", "test1"),))  # an exact value wins over the wildcard
    assert exact is not None and exact.limit.requests_per_unit == 50
    assert exact.counter == (("file", "test1"),)
    other = find("d", root, (("file", "test2"),))
    assert other is not None and other.counter == (("file", "test*"),)


def test_value_to_metric_and_detailed_metric_stat_keys(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        """\
domain: m
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: http_method
        value_to_metric: true
        descriptors:
          - {key: subject_id, rate_limit: {unit: minute, requests_per_unit: 60}}
  - key: user
    value_to_metric: true
    descriptors:
      - key: action
        value: read*
        value_to_metric: true
        descriptors:
          - {key: resource, rate_limit: {unit: minute, requests_per_unit: 100}}
  - key: key-1
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 100}
    descriptors:
      - {key: key-2, rate_limit: {unit: minute, requests_per_unit: 5}}
""",
    )
    three = (("route", "api"), ("http_method", "GET"), ("subject_id", "123"))
    assert stats_key(cfg, "m", *three) == "m.route_api.http_method_GET.subject_id"
    wild = (("user", "alice"), ("action", "readfile"), ("resource", "documents"))
    assert stats_key(cfg, "m", *wild) == "m.user_alice.action_readfile.resource"
    assert stats_key(cfg, "m", ("key-1", "value-1")) == "m.key-1_value-1"
    assert stats_key(cfg, "m", ("key-1", "v"), ("key-2", "w")) == "m.key-1.key-2"


def test_upstreams_example_config_loads(tmp_path: Path) -> None:
    """examples/ratelimit/config/example.yaml, restated: replaces, shadow, unlimited, detailed
    metrics, quota mode with metadata."""
    cfg = load(
        tmp_path,
        """\
---
domain: rl
descriptors:
  - key: category
    value: account
    rate_limit:
      replaces: [{name: bkthomps}, {name: fake_name}]
      unit: minute
      requests_per_unit: 4
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        value: bkthomps
        rate_limit: {replaces: [{name: bkthomps}], unit: minute, requests_per_unit: 2}
      - key: destination_cluster
        value: fake
        rate_limit: {name: fake_name, unit: minute, requests_per_unit: 2}
  - key: foo
    rate_limit: {unit: minute, requests_per_unit: 2}
    descriptors:
      - key: bar
        value: bkthomps
        rate_limit: {name: bkthomps, unit: minute, requests_per_unit: 1}
      - key: bar
        value: banned
        rate_limit: {name: banned_limit, unit: minute, requests_per_unit: 0}
      - key: baz
        value: shady
        shadow_mode: true
        rate_limit: {unit: minute, requests_per_unit: 3}
      - {key: bay, rate_limit: {unlimited: true}}
  - {key: unspec, detailed_metric: true, rate_limit: {unit: minute, requests_per_unit: 2}}
  - key: service
    value: service_1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
    metadata: {service_with_quota: {name: service_1}}
""",
    )
    account = limit(cfg, "rl", ("category", "account"))
    assert account is not None and account.replaces == ("bkthomps", "fake_name")
    shady = limit(cfg, "rl", ("foo", "x"), ("baz", "shady"))
    assert shady is not None and shady.shadow
    quota = limit(cfg, "rl", ("service", "service_1"))
    assert quota is not None and quota.quota and quota.metadata is not None
    banned = limit(cfg, "rl", ("foo", "x"), ("bar", "banned"))
    assert banned is not None and cfg.policies[banned.policy or ""].block


def test_extensions_policy_and_algorithm(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        "policies:\n  slow: {rate: 1/minute, algorithm: gcra}\n",
        "domain: x\ndescriptors:\n  - {key: a, policy: slow}\n"
        "  - {key: b, algorithm: sliding_window,\n"
        "     rate_limit: {unit: minute, requests_per_unit: 3}}\n",
    )
    a, b = limit(cfg, "x", ("a", "1")), limit(cfg, "x", ("b", "1"))
    assert a is not None and a.policy == "slow" and not a.upstream
    assert (
        b is not None
        and not b.upstream
        and cfg.policies[b.policy or ""].algorithm == "sliding_window"
    )
    with pytest.raises(ConfigError, match="policy 'nope' is not defined"):
        load(tmp_path, "domain: x\ndescriptors:\n  - {key: a, policy: nope}\n")


def test_clashing_policy_names_are_made_unique(tmp_path: Path) -> None:
    cfg = load(
        tmp_path,
        "domain: d\ndescriptors:\n"
        "  - {key: a=b, value: c, rate_limit: {unit: second, requests_per_unit: 1}}\n"
        "  - {key: a, value: b=c, rate_limit: {unit: second, requests_per_unit: 2}}\n",
    )
    one, two = limit(cfg, "d", ("a=b", "c")), limit(cfg, "d", ("a", "b=c"))
    assert one is not None and two is not None
    assert (one.policy, two.policy) == ("d/a=b=c", "d/a=b=c~2")


def test_a_directory_is_every_file_in_it(tmp_path: Path) -> None:
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "basic.yaml").write_text(BASIC)
    (tmp_path / "config" / "sub").mkdir()
    (tmp_path / "config" / "sub" / "other").write_text("domain: other\ndescriptors:\n")
    (tmp_path / "config" / ".swap.yaml").write_text("not: yaml: at all")
    cfg = config.load([str(tmp_path / "config")], env={})
    assert set(cfg.domains) == {"app", "other"}
    with pytest.raises(ConfigError, match=r"\.swap\.yaml"):
        config.load([str(tmp_path / "config")], env={}, dotfiles=True)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="holds no file"):
        config.load([str(tmp_path / "empty")], env={})


def test_grpc_auth_needs_a_token(tmp_path: Path) -> None:
    text = "auth:\n  admin_token: admin-token-0123456789\n  grpc: true\n"
    cfg = load(tmp_path, text)  # an admin token alone: gRPC then requires it
    assert cfg.auth.grpc and cfg.auth.admin_token
    with pytest.raises(ConfigError, match=r"f0.yaml:1: auth\.grpc: true needs a token"):
        load(tmp_path, "auth:\n  grpc: true\n")


def test_fingerprint_sees_writes_removals_and_a_swapped_symlink(tmp_path: Path) -> None:
    from ratekeeper.service.config.files import fingerprint

    for name in ("v1", "v2"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "edge.yaml").write_text(f"domain: {name}\ndescriptors:\n")
    link = tmp_path / "current"
    link.symlink_to(tmp_path / "v1")
    first = fingerprint([str(link)])
    link.unlink()
    link.symlink_to(tmp_path / "v2")  # upstream's deploy: swap the runtime root's symlink
    second = fingerprint([str(link)])
    assert second != first
    (tmp_path / "v2" / "more.yaml").write_text("domain: more\ndescriptors:\n")
    third = fingerprint([str(link)])
    assert third != second
    (tmp_path / "v2" / "more.yaml").unlink()
    assert fingerprint([str(link)]) == second
    assert set(config.load([str(link)], env={}).domains) == {"v2"}
