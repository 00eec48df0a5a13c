"""Envoy-format domains, as envoyproxy/ratelimit reads them, compiled into descriptor trees.

A domain comes from a file whose top level is ``domain`` + ``descriptors`` (upstream's own
files, unchanged) or from an item of our format's ``domains:`` list. Upstream's rules, kept:

- One flat set of keys is valid at every level (``VALID_KEYS``); any other key is refused. A
  valid key where it does nothing (``unit`` beside ``key``, ``unlimited`` outside
  ``rate_limit``) is accepted and ignored, as upstream does, with a warning. Lists hold
  mappings only; values are strings, whole numbers, true/false or null (a float is refused);
  ``metadata`` is free-form. Null is the empty value: a null ``descriptors:`` is none, a
  missing ``requests_per_unit`` is 0 (every hit is over the limit).
- A domain is named once (``merge_domains`` loads a repeated domain's descriptors into the
  first). A descriptor needs a ``key``; at its level it is named by its composite key, ``key``
  or ``key_value``, which may appear once (so ``key: a_b`` and ``key: a`` + ``value: b``
  clash, as upstream).
- ``rate_limit`` needs a unit (second, minute, hour, day, week, month, year, any case) unless
  ``unlimited``, which takes none; ``replaces`` entries need a ``name`` other than the limit's.
- ``share_threshold`` needs a ``*`` in the composite key.

Ratekeeper's extensions on a descriptor: ``policy`` (count with a named rate policy of ours)
and ``algorithm`` (count ``rate_limit`` with another algorithm, with our semantics). Without
them a limit is counted as upstream counts it: an aligned fixed window counting rejected hits,
one counter per domain, descriptor entries and unit (see ``service.envoy.rls``).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ...rates import UNIT_MS, Rate
from ...yaml_lines import (
    Map,
    Problem,
    Problems,
    Seq,
    need_bool,
    need_int,
    need_map,
    need_seq,
    no_unknown,
)
from .policies import PolicySpec, policy_from

UNITS = {"SECOND": 1, "MINUTE": 2, "HOUR": 3, "DAY": 4, "MONTH": 5, "YEAR": 6, "WEEK": 7}
"""Envoy's ``RateLimitUnit`` enum numbers (UNKNOWN is 0)."""
UNIT_SECONDS = {
    number: UNIT_MS[name] // 1000
    for number, name in enumerate(("second", "minute", "hour", "day", "month", "year", "week"), 1)
}
"""Seconds per unit (by the proto's unit number), from the library's rate grammar
(``rates.UNIT_MS``): a month is 30 days, a year 365, as upstream counts them."""
VALID_KEYS = frozenset(
    {
        "domain",
        "key",
        "value",
        "descriptors",
        "rate_limit",
        "unit",
        "requests_per_unit",
        "unlimited",
        "shadow_mode",
        "quota_mode",
        "name",
        "replaces",
        "detailed_metric",
        "value_to_metric",
        "share_threshold",
        "metadata",
    }
)
EXTENSION_KEYS = frozenset({"policy", "algorithm"})
_DESCRIPTOR_KEYS = frozenset(
    {
        "key",
        "value",
        "descriptors",
        "rate_limit",
        "shadow_mode",
        "quota_mode",
        "detailed_metric",
        "value_to_metric",
        "share_threshold",
        "metadata",
    }
)
_FLAGS = ("shadow_mode", "quota_mode", "detailed_metric", "value_to_metric", "share_threshold")
_RATE_LIMIT_KEYS = frozenset({"unit", "requests_per_unit", "unlimited", "name", "replaces"})
MAX_UINT32 = 2**32 - 1


@dataclass(frozen=True, slots=True, eq=False)
class EnvoyLimit:
    """A descriptor's ``rate_limit`` (or ``policy``), compiled."""

    policy: str | None
    """The rate policy that counts it; None when ``unlimited``."""
    name: str = ""
    """``rate_limit.name``: sent as ``current_limit.name``, and what ``replaces`` names."""
    requests_per_unit: int = 0
    unit: int = 0
    unlimited: bool = False
    replaces: tuple[str, ...] = ()
    shadow: bool = False
    quota: bool = False
    detailed_metric: bool = False
    stats_key: str = ""
    """Upstream's stat key: ``domain.key_value.key`` down to this descriptor."""
    upstream: bool = True
    """Counted as envoyproxy/ratelimit counts (False: ``policy``/``algorithm`` extensions)."""
    metadata: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True, eq=False)
class EnvoyNode:
    """One level of a descriptor tree; the root is the domain."""

    limit: EnvoyLimit | None = None
    children: Mapping[str, EnvoyNode] = field(default_factory=dict)
    """By composite key: ``key`` (any value) or ``key_value``."""
    wildcards: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """The composite keys with a ``*`` among ``children``, in config order, split on ``*``."""
    final: str = ""
    value_to_metric: bool = False
    share_threshold: bool = False


@dataclass(frozen=True, slots=True)
class HeaderNames:
    """Upstream's LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER and LIMIT_RESET_HEADER."""

    limit: str = "RateLimit-Limit"
    remaining: str = "RateLimit-Remaining"
    reset: str = "RateLimit-Reset"


@dataclass(frozen=True, slots=True)
class EnvoySettings:
    """The ``envoy:`` section: upstream's environment variables, and the gRPC API's caps."""

    shadow_mode: bool = False
    quota_mode: bool = False
    near_limit_ratio: float = 0.8
    stop_increment_when_over_limit: bool = False
    response_headers: str = "none"
    """``none``, ``upstream`` (RateLimit-Limit/-Remaining/-Reset) or ``ratekeeper``."""
    header_names: HeaderNames = HeaderNames()
    response_dynamic_metadata: bool = False
    merge_domains: bool = False
    nested_domains: tuple[str, ...] = ()
    """Domains whose requests' descriptors are decided as one nested call (``engine.nested``):
    ours, not upstream's (upstream decides each descriptor on its own)."""
    max_descriptors: int = 256
    max_entries: int = 2048
    max_stat_keys: int = 1000


def settings(body: Map, problems: Problems) -> EnvoySettings:
    """The ``envoy:`` section, checked: each setting's problem is recorded in ``problems``
    and the setting left at its default."""
    with problems.guard():
        no_unknown(body, {f for f in EnvoySettings.__dataclass_fields__}, "envoy")
    out: dict[str, Any] = {}
    for key in body:
        with problems.guard():
            _setting(body, key, out)
    return EnvoySettings(**out)


def _setting(body: Map, key: str, out: dict[str, Any]) -> None:
    """One key of the ``envoy:`` section into ``out`` (an unknown key is left alone)."""
    at = body.lines.get
    if key in (
        "shadow_mode",
        "quota_mode",
        "stop_increment_when_over_limit",
        "response_dynamic_metadata",
        "merge_domains",
    ):
        out[key] = need_bool(body[key], at(key, body.line), f"envoy.{key}")
    highs = {"max_descriptors": 100_000, "max_entries": 1_000_000, "max_stat_keys": 1_000_000}
    if key in highs:
        out[key] = need_int(body[key], at(key, body.line), f"envoy.{key}", 1, highs[key])
    if key == "nested_domains":
        domains = need_seq(body[key], at(key, body.line), "envoy.nested_domains")
        for domain in domains:
            if not isinstance(domain, str) or not domain:
                why = f"envoy.nested_domains: {domain!r} must be a domain name"
                raise Problem(at(key, body.line), why)
        out[key] = tuple(domains)
    if key == "near_limit_ratio":
        ratio = body["near_limit_ratio"]
        if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 <= ratio <= 1:
            raise Problem(
                at("near_limit_ratio", body.line),
                f"envoy.near_limit_ratio {ratio!r} must be a number from 0 to 1",
            )
        out["near_limit_ratio"] = float(ratio)
    if key == "response_headers":
        mode = body["response_headers"]
        if mode not in ("none", "upstream", "ratekeeper"):
            raise Problem(
                at("response_headers", body.line),
                f"envoy.response_headers {mode!r} must be none, upstream or ratekeeper",
            )
        out["response_headers"] = mode
    if key == "header_names":
        names = need_map(body["header_names"], at("header_names", body.line), "header_names")
        fields = {"limit", "remaining", "reset"}
        given = {}
        for name, value in names.items():
            if name not in fields:
                raise Problem(
                    names.lines[name],
                    f"unknown key {name!r} in envoy.header_names; "
                    "expected limit, remaining or reset",
                )
            if not isinstance(value, str) or not value.isascii() or not _token(value):
                raise Problem(
                    names.lines[name],
                    f"header name {value!r} must be an HTTP token (e.g. RateLimit-Limit)",
                )
            given[name] = value
        out["header_names"] = HeaderNames(**given)


def _token(name: str) -> bool:
    return bool(name) and all(c.isalnum() or c in "!#$%&'*+-.^_`|~" for c in name)


Register = Callable[[PolicySpec, str], str]
"""Adds a policy under a wished-for name; returns the name it got (made unique)."""
Lookup = Callable[[Any, int], str]
"""Resolves a descriptor's ``policy:`` value (at a line) to a rate policy's name."""


class DomainCompiler:
    """Turns the descriptor lists of one domain (from one or, merged, several files) into an
    ``EnvoyNode`` tree, registering a policy per limit and collecting warnings. A descriptor
    with a problem is recorded in ``problems`` and left out; its siblings and nested
    descriptors are still read."""

    def __init__(self, domain: str, register: Register, lookup: Lookup, problems: Problems) -> None:
        self.domain = domain
        self.register = register
        self.lookup = lookup
        self.problems = problems
        self.warnings: list[tuple[int, str]] = []
        self.root: dict[str, Any] = _draft()

    def add(self, descriptors: Seq | None) -> None:
        """Load one file's top-level descriptors (merging repeats them into the same root)."""
        if descriptors is not None:
            self._level(self.root, descriptors, self.domain + ".", ())

    def build(self) -> EnvoyNode:
        return _freeze(self.root)

    def _level(
        self, parent: dict[str, Any], seq: Seq, stats_prefix: str, names: tuple[str, ...]
    ) -> None:
        for item, line in zip(seq, seq.lines, strict=True):
            with self.problems.guard():
                self._descriptor(parent, need_map(item, line, "a descriptor"), stats_prefix, names)

    def _descriptor(
        self, parent: dict[str, Any], d: Map, stats_prefix: str, names: tuple[str, ...]
    ) -> None:
        guard = self.problems.guard
        with guard():
            self._misplaced(d, _DESCRIPTOR_KEYS | EXTENSION_KEYS, "a descriptor")
        key = _text(d.get("key"), d.lines.get("key", d.line), "key")
        if not key:
            raise Problem(d.line, "descriptor has an empty key; every descriptor needs one")
        value = _text(d.get("value"), d.lines.get("value", d.line), "value")
        final = key + "_" + value if value else key
        if final in parent["children"]:
            raise Problem(d.line, f"duplicate descriptor composite key {stats_prefix + final!r}")
        flags = dict.fromkeys(_FLAGS, False)
        for k in _FLAGS:
            if d.get(k) is not None:
                with guard():
                    flags[k] = need_bool(d[k], d.lines[k], k)
        node = _draft()
        node["final"] = final
        node["value_to_metric"] = flags["value_to_metric"]
        path = (*names, f"{key}={value}" if value else key)
        with guard():
            node["limit"] = self._limit(d, stats_prefix + final, path, flags)
        if flags["share_threshold"] and "*" not in final:
            self.problems.add(
                Problem(
                    d.lines["share_threshold"],
                    "share_threshold can only be used with wildcard values (containing '*'), "
                    f"but found key {final!r}",
                )
            )
        node["share_threshold"] = flags["share_threshold"]
        if "*" in final:
            parent["wildcards"].append((final, tuple(final.split("*"))))
        if d.get("descriptors") is not None:
            with guard():
                nested = need_seq(d["descriptors"], d.lines["descriptors"], "descriptors")
                self._level(node, nested, stats_prefix + final + ".", path)
        parent["children"][final] = node

    def _limit(
        self, d: Map, stats_key: str, path: tuple[str, ...], flags: dict[str, bool]
    ) -> EnvoyLimit | None:
        metadata = _metadata(d.get("metadata"), d.lines.get("metadata", d.line))
        if "policy" in d:
            if d.get("rate_limit") is not None:
                raise Problem(d.line, "a descriptor takes 'policy' or 'rate_limit', not both")
            name = self.lookup(d["policy"], d.lines["policy"])
            return EnvoyLimit(
                name,
                shadow=flags["shadow_mode"],
                quota=flags["quota_mode"],
                detailed_metric=flags["detailed_metric"],
                stats_key=stats_key,
                upstream=False,
                metadata=metadata,
            )
        if d.get("rate_limit") is None:
            return None
        rl = need_map(d["rate_limit"], d.lines["rate_limit"], "rate_limit")
        self._misplaced(rl, _RATE_LIMIT_KEYS, "rate_limit")
        at = rl.lines.get
        unlimited = rl.get("unlimited") is not None and need_bool(
            rl["unlimited"], at("unlimited", rl.line), "unlimited"
        )
        unit_text = _text(rl.get("unit"), at("unit", rl.line), "unit")
        unit = UNITS.get(unit_text.upper(), 0)
        if unlimited and unit:
            raise Problem(at("unit", rl.line), "should not specify rate limit unit when unlimited")
        if not unlimited and not unit:
            raise Problem(
                at("unit", rl.line),
                f"invalid rate limit unit {unit_text!r}; expected one of "
                + ", ".join(u.lower() for u in UNITS),
            )
        count = 0
        if rl.get("requests_per_unit") is not None:
            count = need_int(
                rl["requests_per_unit"],
                at("requests_per_unit", rl.line),
                "rate_limit.requests_per_unit",
                0,
                MAX_UINT32,
            )
        name = _text(rl.get("name"), at("name", rl.line), "name")
        replaces = self._replaces(rl, name)
        common = EnvoyLimit(
            None, name, count, unit, unlimited, replaces, flags["shadow_mode"],
            flags["quota_mode"], flags["detailed_metric"], stats_key, metadata=metadata,
        )  # fmt: skip
        if unlimited:
            return common
        rate = Rate(max(count, 1), float(UNIT_SECONDS[unit]))
        wished = self.domain + "/" + "/".join(path)
        algorithm = d.get("algorithm")
        if algorithm is None:
            spec = policy_from(wished, rate, "fixed_window", {}, d, upstream=True)
        else:
            spec = policy_from(wished, rate, algorithm, {}, d)
        spec = replace(spec, shadow=flags["shadow_mode"], block=count == 0)
        policy = self.register(spec, wished)
        return replace(common, policy=policy, upstream=algorithm is None)

    def _replaces(self, rl: Map, name: str) -> tuple[str, ...]:
        if rl.get("replaces") is None:
            return ()
        out = []
        seq = need_seq(rl["replaces"], rl.lines["replaces"], "replaces")
        for item, line in zip(seq, seq.lines, strict=True):
            entry = need_map(item, line, "a replaces entry")
            self._misplaced(entry, frozenset({"name"}), "a replaces entry")
            other = _text(entry.get("name"), entry.lines.get("name", line), "name")
            if not other:
                raise Problem(line, "should not have an empty replaces entry")
            if other == name:
                raise Problem(line, "replaces should not contain name of same descriptor")
            out.append(other)
        return tuple(out)

    def _misplaced(self, body: Map, used: frozenset[str], where: str) -> None:
        unknown = []
        for key in body:
            if key in used:
                continue
            if key in VALID_KEYS:
                self.warnings.append(
                    (
                        body.lines[key],
                        f"key {key!r} has no effect in {where} (ignored, as "
                        "envoyproxy/ratelimit ignores it)",
                    )
                )
            else:
                allowed = ", ".join(sorted(VALID_KEYS | EXTENSION_KEYS))
                unknown.append(
                    Problem(body.lines[key], f"unknown key {key!r}; expected one of {allowed}")
                )
        if unknown:
            raise Problem.first_of(unknown)


def check_values(value: Any, line: int) -> None:
    """Upstream's checks of a whole file's values (before any meaning is given to them):
    lists hold mappings, values are strings, whole numbers, true/false or null; ``metadata``
    is left to ``_metadata``. Every bad value is reported, in one ``Problem``."""
    found: list[Problem] = []
    _bad_values(value, line, found)
    if found:
        raise Problem.first_of(found)


def _bad_values(value: Any, line: int, found: list[Problem]) -> None:
    if isinstance(value, Map):
        for key, inner in value.items():
            if key != "metadata":
                _bad_values(inner, value.lines[key], found)
    elif isinstance(value, Seq):
        for item, at in zip(value, value.lines, strict=True):
            if not isinstance(item, Map):
                found.append(Problem(at, f"a list may hold only mappings, not {item!r}"))
            else:
                _bad_values(item, at, found)
    elif value is not None and not isinstance(value, str | int):  # bool is an int
        message = f"value {value!r} must be a string, a whole number, true/false or a list"
        found.append(Problem(line, message))


def _text(value: Any, line: int, what: str) -> str:
    """A string field: null is empty, a whole number is its digits (as upstream reads it)."""
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise Problem(line, f"{what} {value!r} must be a string")
    return str(value)


def _metadata(value: Any, line: int) -> Mapping[str, Any] | None:
    if value is None:
        return None
    body = need_map(value, line, "metadata")
    return _plain(body, line) or None


def _plain(value: Any, line: int) -> Any:
    """YAML data -> what a protobuf ``Struct`` holds (dicts, lists, strings, numbers, bools)."""
    if isinstance(value, dict):
        return {str(k): _plain(v, line) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v, line) for v in value]
    if value is None or isinstance(value, str | int | float):
        return value
    if isinstance(value, datetime.date):
        return value.isoformat()
    raise Problem(line, f"error parsing metadata: {value!r} cannot be sent as metadata")


def _draft() -> dict[str, Any]:
    return {
        "limit": None,
        "children": {},
        "wildcards": [],
        "final": "",
        "value_to_metric": False,
        "share_threshold": False,
    }


def _freeze(draft: dict[str, Any]) -> EnvoyNode:
    return EnvoyNode(
        draft["limit"],
        {k: _freeze(v) for k, v in draft["children"].items()},
        tuple(draft["wildcards"]),
        draft["final"],
        draft["value_to_metric"],
        draft["share_threshold"],
    )
