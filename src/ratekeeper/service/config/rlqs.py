"""The ``rlqs:`` config section: which of our policies governs which of Envoy's quota
buckets, and the quota service's settings.

Envoy's ``rate_limit_quota`` filter names a bucket by a map of strings (its
``bucket_id_builder``: ``{name: tenant, tenant: acme}``) and reports it under the filter's
``domain``. A rule matches a bucket as a descriptor is matched: the same domain, the same
keys, and each value exact, ``*`` (any value) or ``prefix*``; each distinct bucket is a
global limit of its own (one per tenant above). When several rules match, the most
specific wins (more exact values, then longer prefixes), then the first written::

    rlqs:
      assignment_ttl: 20          # seconds, whole, 10..3600 (Envoy reports every 5 s)
      unmatched: no_assignment    # a bucket no rule matches: no_assignment | allow | deny
      max_buckets: 10000          # buckets tracked per process (past it: unmatched)
      buckets:
        - domain: edge
          bucket: {name: tenant, tenant: "*"}
          policy: tenant.quota    # one of ours: one rate; shadow/enabled/block apply
        - domain: edge
          bucket: {name: catch-all}
          rate: 2000/second       # or a rate of its own (a policy named rlqs:<domain>/...)

Envoy enforces each share as a token bucket, so a rule's policy must have one rate; its
``burst`` (token_bucket, gcra) is split like the rate, else a share holds one second of it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ...yaml_lines import Map, Problem, Problems, need_int, need_map, need_seq, no_unknown
from .policies import PolicySpec, policy_from

UNMATCHED = ("no_assignment", "allow", "deny")
MAX_LIMIT_MRPS = 10**12
"""The highest global rate a bucket may have: 10**9 requests a second."""


@dataclass(frozen=True, slots=True)
class BucketRule:
    """One ``buckets:`` entry: a pattern and the policy it names."""

    domain: str
    pattern: tuple[tuple[str, str], ...]
    """(key, value pattern), sorted by key: a value, ``*`` or ``prefix*``."""
    policy: str
    order: int = 0

    @property
    def rank(self) -> tuple[int, int, int]:
        """Higher is more specific (exact values, then prefix lengths), then earlier."""
        exact = sum(1 for _, v in self.pattern if not v.endswith("*"))
        prefixes = sum(len(v) - 1 for _, v in self.pattern if v.endswith("*"))
        return (exact, prefixes, -self.order)

    def matches(self, entries: tuple[tuple[str, str], ...]) -> bool:
        """Whether a bucket id (sorted entries) is one of this rule's buckets."""
        if len(entries) != len(self.pattern):
            return False
        for (key, value), (want, pattern) in zip(entries, self.pattern, strict=True):
            if key != want:
                return False
            if pattern.endswith("*"):
                if not value.startswith(pattern[:-1]):
                    return False
            elif value != pattern:
                return False
        return True


@dataclass(frozen=True, slots=True)
class RlqsSettings:
    """The ``rlqs:`` section (no rules: every bucket is unmatched)."""

    rules: tuple[BucketRule, ...] = ()
    assignment_ttl: int = 20
    unmatched: str = "no_assignment"
    max_buckets: int = 10_000

    def rule_for(self, domain: str, entries: tuple[tuple[str, str], ...]) -> BucketRule | None:
        """The most specific rule matching a bucket, or None."""
        best: BucketRule | None = None
        for rule in self.rules:
            if (
                rule.domain == domain
                and rule.matches(entries)
                and (best is None or rule.rank > best.rank)
            ):
                best = rule
        return best


Register = Callable[[PolicySpec, str], str]
Lookup = Callable[[Any, int], str]


def read_rlqs(
    body: Map, problems: Problems, policies: Mapping[str, PolicySpec],
    register: Register, lookup: Lookup,
) -> RlqsSettings:  # fmt: skip
    """The section, its problems recorded (a rule with a problem is left out)."""
    guard = problems.guard
    with guard():
        no_unknown(body, {"assignment_ttl", "unmatched", "max_buckets", "buckets"}, "rlqs")
    ttl, max_buckets, unmatched = 20, 10_000, "no_assignment"
    if "assignment_ttl" in body:
        with guard():
            ttl = need_int(
                body["assignment_ttl"], body.lines["assignment_ttl"],
                "rlqs.assignment_ttl (seconds; Envoy 1.40 reports every 5 s and reads the "
                "TTL in whole seconds)", 10, 3600,
            )  # fmt: skip
    if "max_buckets" in body:
        with guard():
            max_buckets = need_int(
                body["max_buckets"], body.lines["max_buckets"], "rlqs.max_buckets", 1, 10**6
            )
    if "unmatched" in body:
        value = body["unmatched"]
        if value not in UNMATCHED:
            problems.add(
                Problem(
                    body.lines["unmatched"],
                    f"rlqs.unmatched {value!r} must be one of {', '.join(UNMATCHED)}",
                )
            )
        else:
            unmatched = value
    rules: list[BucketRule] = []
    if "buckets" in body:
        with guard():
            seq = need_seq(body["buckets"], body.lines["buckets"], "rlqs.buckets")
            for item, line in zip(seq, seq.lines, strict=True):
                with guard():
                    rule = _rule(need_map(item, line, "a bucket rule"), len(rules), policies,
                                 register, lookup)  # fmt: skip
                    for other in rules:
                        if (other.domain, other.pattern) == (rule.domain, rule.pattern):
                            raise Problem(line, f"bucket {_text(rule)} is matched twice")
                    rules.append(rule)
    return RlqsSettings(tuple(rules), ttl, unmatched, max_buckets)


def _rule(
    d: Map, order: int, policies: Mapping[str, PolicySpec], register: Register, lookup: Lookup
) -> BucketRule:
    no_unknown(d, {"domain", "bucket", "policy", "rate", "burst"}, "a bucket rule")
    domain = d.get("domain")
    if not isinstance(domain, str) or not domain:
        raise Problem(d.lines.get("domain", d.line), f"domain {domain!r} must be a non-empty "
                      "string (the filter's domain)")  # fmt: skip
    if "bucket" not in d:
        raise Problem(d.line, "a bucket rule needs bucket: {key: value, ...} (the bucket id)")
    bucket = need_map(d["bucket"], d.lines["bucket"], "bucket")
    if not bucket:
        raise Problem(d.lines["bucket"], "bucket is empty; Envoy's bucket ids have entries")
    pattern = []
    for key, value in bucket.items():
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise Problem(bucket.lines[key], f"bucket value {value!r} of {key!r} must be a "
                          "string (quote it), '*' or 'prefix*'")  # fmt: skip
        pattern.append((key, str(value)))
    pattern.sort()
    if ("policy" in d) == ("rate" in d):
        raise Problem(d.line, "a bucket rule needs policy: <name> or rate: <rate>, one of them")
    if "policy" in d:
        if "burst" in d:
            raise Problem(d.lines["burst"], "burst goes with rate:; a named policy has its own")
        name = lookup(d["policy"], d.lines["policy"])
        spec = policies.get(name)
        line = d.lines["policy"]
    else:
        options = {}
        if "burst" in d:
            options["burst"] = need_int(d["burst"], d.lines["burst"], "burst", 1, 10**12)
        rate = d["rate"]
        if not isinstance(rate, str):
            raise Problem(d.lines["rate"], f"rate {rate!r} must be a string like '1000/second'")
        algorithm = "token_bucket" if options else "fixed_window"
        made = policy_from("", rate, algorithm, options, d)
        text = ",".join(f"{k}={v}" for k, v in pattern)
        name = register(made, f"rlqs:{domain}/{text}")
        spec = made
        line = d.lines["rate"]
    if spec is not None:
        check_policy(spec, line)
    return BucketRule(domain, tuple(pattern), name, order)


def check_policy(spec: PolicySpec, line: int) -> None:
    """Refuse a policy Envoy cannot enforce as one token bucket."""
    rates = spec.policy.rates
    if len(rates) != 1:
        raise Problem(line, f"policy {spec.name!r} has {len(rates)} rates; an Envoy quota "
                      "bucket is one token bucket: give it a policy of one rate")  # fmt: skip
    if not 1 <= limit_mrps(spec) <= MAX_LIMIT_MRPS:
        raise Problem(line, f"policy {spec.name!r}'s rate {rates[0]} is outside what a quota "
                      "bucket takes (1/1000 a second to 10**9 a second)")  # fmt: skip


def limit_mrps(spec: PolicySpec) -> int:
    """A one-rate policy's rate in milli-requests per second."""
    rate = spec.policy.rates[0]
    return rate.count * 1_000_000 // rate.period_ms


def _text(rule: BucketRule) -> str:
    return rule.domain + "/" + ",".join(f"{k}={v}" for k, v in rule.pattern)
