"""Service configuration: YAML files -> one frozen ``ServiceConfig``, or a ``ConfigError``
naming the file, the line and what is wrong.

Two formats are read, and may be mixed across files (``--config`` can be repeated):

- ours: ``store``, ``auth``, ``limits``, ``policies`` (named rate stacks with algorithm and
  options, ``shadow``, ``enabled``; or ``kind: concurrency`` with ``capacity`` and
  ``lease_ttl``: at most N requests in progress per key) and ``domains`` (Envoy-style
  descriptor trees, which name rate policies only);
- envoyproxy/ratelimit's, as is: a file whose top level is ``domain`` + ``descriptors``
  (``key``, ``value``, ``rate_limit: {unit, requests_per_unit}``, ``shadow_mode``,
  ``unlimited``, nested ``descriptors``). Keys this service does not act on (``name``,
  ``detailed_metric``, ``replaces``) are accepted and ignored.

Every Envoy ``rate_limit`` becomes a fixed-window policy of its own (named
``<domain>/<key>=<value>/...``), so its counters never mix with those of another node; two
nodes whose names would coincide (``a/b`` + ``c`` and ``a`` + ``b`` + ``c``) are refused, and
a descriptor key may not hold ``=`` (it separates key from value in the tree). A descriptor
may instead name one of our policies with ``policy:`` (our extension).
Validation is complete before anything is used: a config either loads whole or not at all.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError, RateSpecError
from ..plan import Policy, make_policy
from ..rates import UNIT_MS, Rate
from .yaml_lines import Loader, Map, Problem, Seq

EXAMPLE = Path(__file__).with_name("example.yaml")
"""The built-in example policy file used by ``ratekeeper serve`` without ``--config``."""

ENVOY_UNITS = {
    name: UNIT_MS[name] // 1000
    for name in ("second", "minute", "hour", "day", "week", "month", "year")
}
"""Envoy's units in seconds, from the library's rate grammar (``rates.UNIT_MS``): a month is
30 days and a year 365, as envoyproxy/ratelimit counts."""
DEFAULT_MAX_KEY_LENGTH = 512
MAX_KEY_LENGTH_LIMIT = 65_536


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """A named policy: a validated rate stack, and whether it is enforced."""

    name: str
    policy: Policy
    rate_text: str
    algorithm: str
    burst: int | None = None
    buckets: int | None = None
    shadow: bool = False
    enabled: bool = True
    block: bool = False
    """Envoy's ``requests_per_unit: 0``: every request is over the limit."""


@dataclass(frozen=True, slots=True)
class ConcurrencySpec:
    """A named concurrency policy: at most ``capacity`` leases live per key."""

    name: str
    capacity: int
    lease_ttl: float = 60.0
    """Seconds after which a lease never released (a crashed caller) expires."""
    shadow: bool = False
    enabled: bool = True


@dataclass(frozen=True, slots=True)
class DescriptorNode:
    """One node of an Envoy descriptor tree; ``policy`` is None when it sets no limit."""

    policy: str | None
    unlimited: bool
    children: Mapping[str, DescriptorNode]
    """Keyed ``"key=value"`` for an exact match, ``"key"`` for any value."""


@dataclass(frozen=True, slots=True)
class AuthSettings:
    """Bearer tokens; an empty string means not configured."""

    token: str = ""
    admin_token: str = ""
    grpc: bool = False


@dataclass(frozen=True, slots=True)
class ShardSettings:
    """One shard of a sharded store: a primary URL, replica URLs and an optional name."""

    url: str
    replicas: tuple[str, ...] = ()
    name: str = ""


@dataclass(frozen=True, slots=True)
class StoreSettings:
    """Which store runs the plans: ``memory``, ``redis`` (one URL), ``sharded`` or ``cluster``."""

    kind: str = "memory"
    url: str = ""
    shards: tuple[ShardSettings, ...] = ()
    max_keys: int = 1_000_000
    prefix: str = "rk"
    socket_timeout: float = 0.05
    batch: bool = True
    batch_max_size: int = 128
    batch_max_wait_ms: float = 1.0


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    """Everything the service needs from its config files."""

    files: tuple[str, ...]
    store: StoreSettings = StoreSettings()
    auth: AuthSettings = AuthSettings()
    max_key_length: int = DEFAULT_MAX_KEY_LENGTH
    local_cache: bool = True
    policies: Mapping[str, PolicySpec] = field(default_factory=dict)
    domains: Mapping[str, Mapping[str, DescriptorNode]] = field(default_factory=dict)
    concurrency: Mapping[str, ConcurrencySpec] = field(default_factory=dict)
    """Concurrency policies (``kind: concurrency``); their names differ from ``policies``'."""


# --- loading ----------------------------------------------------------------------------------


def load(paths: list[str] | tuple[str, ...], env: Mapping[str, str] | None = None) -> ServiceConfig:
    """Read, merge and validate config files; raise ``ConfigError`` ("file:line: problem")."""
    env = os.environ if env is None else env
    if not paths:
        paths = (str(EXAMPLE),)
    builder = _Builder(env)
    for path in paths:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: cannot read config file: {exc}") from exc
        try:
            builder.add_file(path, text)
        except Problem as exc:
            raise ConfigError(f"{path}:{exc.line}: {exc.message}") from None
    return builder.build(tuple(str(p) for p in paths))


def parse_text(text: str, name: str = "<config>") -> ServiceConfig:
    """Validate one config given as text (tests and tools)."""
    builder = _Builder({})
    try:
        builder.add_file(name, text)
    except Problem as exc:
        raise ConfigError(f"{name}:{exc.line}: {exc.message}") from None
    return builder.build((name,))


class _Builder:
    """Accumulates the content of several files, refusing duplicates across them."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = env
        self.store = StoreSettings()
        tokens = {}
        for var in ("RATEKEEPER_TOKEN", "RATEKEEPER_ADMIN_TOKEN"):
            value = env.get(var, "")
            if value:
                try:
                    _token(value, 0, f"environment variable {var}")
                except Problem as exc:
                    raise ConfigError(exc.message) from None
            tokens[var] = value
        self.auth = AuthSettings(tokens["RATEKEEPER_TOKEN"], tokens["RATEKEEPER_ADMIN_TOKEN"])
        self.max_key_length = DEFAULT_MAX_KEY_LENGTH
        self.local_cache = True
        self.settings_file = ""
        self.policies: dict[str, PolicySpec] = {}
        self.concurrency: dict[str, ConcurrencySpec] = {}
        self.policy_files: dict[str, str] = {}
        self.domains: dict[str, dict[str, DescriptorNode]] = {}
        self.domain_files: dict[str, str] = {}

    def build(self, files: tuple[str, ...]) -> ServiceConfig:
        return ServiceConfig(
            files,
            self.store,
            self.auth,
            self.max_key_length,
            self.local_cache,
            dict(self.policies),
            {d: dict(tree) for d, tree in self.domains.items()},
            dict(self.concurrency),
        )

    def add_file(self, path: str, text: str) -> None:
        try:
            doc = yaml.load(text, Loader=Loader)  # a SafeLoader: builds plain data only
        except Problem:
            raise
        except yaml.MarkedYAMLError as exc:
            line = exc.problem_mark.line + 1 if exc.problem_mark else 1
            raise Problem(line, f"invalid YAML: {exc.problem}") from None
        except yaml.YAMLError as exc:
            raise Problem(1, f"invalid YAML: {exc}") from None
        except RecursionError:
            raise Problem(1, "invalid YAML: lists or mappings nest too deeply") from None
        except ValueError as exc:  # e.g. an integer of over 4300 digits
            raise Problem(1, f"invalid YAML: {str(exc)[:200]}") from None
        if doc is None:
            raise Problem(1, "the file is empty; expected a mapping with 'policies' or 'domain'")
        if not isinstance(doc, Map):
            raise Problem(1, "the top level must be a mapping with 'policies' or 'domain'")
        if "domain" in doc:
            self._envoy_domain(path, doc, doc.line)
            return
        allowed = {"store", "auth", "limits", "policies", "domains"}
        _no_unknown(doc, allowed, "the top level")
        if any(k in doc for k in ("store", "auth", "limits")):
            if self.settings_file:
                line = min(doc.lines[k] for k in ("store", "auth", "limits") if k in doc)
                raise Problem(line, f"store/auth/limits are already set in {self.settings_file}")
            self.settings_file = path
        if "store" in doc:
            self.store = _store(doc["store"], doc.lines["store"])
        if "auth" in doc:
            self.auth = _auth(_map(doc["auth"], doc.lines["auth"], "auth"), self.env, self.auth)
        if "limits" in doc:
            self._limits(_map(doc["limits"], doc.lines["limits"], "limits"))
        if "policies" in doc:
            policies = _map(doc["policies"], doc.lines["policies"], "policies")
            for name, body in policies.items():
                self._add_policy(path, name, body, policies.lines[name])
        if "domains" in doc:
            domains = _seq(doc["domains"], doc.lines["domains"], "domains")
            for item, line in zip(domains, domains.lines, strict=True):
                self._envoy_domain(path, _map(item, line, "a domain"), line)

    def _limits(self, limits: Map) -> None:
        _no_unknown(limits, {"max_key_length", "local_cache"}, "limits")
        if "max_key_length" in limits:
            self.max_key_length = _int(
                limits["max_key_length"],
                limits.lines["max_key_length"],
                "limits.max_key_length",
                1,
                MAX_KEY_LENGTH_LIMIT,
            )
        if "local_cache" in limits:
            self.local_cache = _bool(
                limits["local_cache"], limits.lines["local_cache"], "limits.local_cache"
            )

    def _add_policy(self, path: str, name: str, body: Any, line: int) -> None:
        _check_name(name, line)
        if name in self.policy_files:
            raise Problem(line, f"policy {name!r} is already defined in {self.policy_files[name]}")
        body = _map(body, line, f"policy {name!r}")
        kind = body.get("kind", "rate")
        if kind == "concurrency":
            self.concurrency[name] = _concurrency(name, body)
        elif kind == "rate":
            self.policies[name] = _policy(name, body)
        else:
            raise Problem(
                body.lines["kind"], f"policy kind {kind!r} is unknown; expected rate or concurrency"
            )
        self.policy_files[name] = path

    def _envoy_domain(self, path: str, doc: Map, line: int) -> None:
        _no_unknown(doc, {"domain", "descriptors"}, "an Envoy domain")
        if "domain" not in doc:
            raise Problem(line, "an Envoy domain needs a domain: name (a non-empty string)")
        domain = doc["domain"]
        if not isinstance(domain, str) or not domain:
            raise Problem(doc.lines["domain"], f"domain {domain!r} must be a non-empty string")
        if domain in self.domains:
            raise Problem(
                line, f"domain {domain!r} is already defined in {self.domain_files[domain]}"
            )
        tree: dict[str, DescriptorNode] = {}  # a domain without descriptors limits nothing
        if "descriptors" in doc:
            seq = _seq(doc["descriptors"], doc.lines["descriptors"], "descriptors")
            tree = self._tree(domain, seq, ())
        self.domains[domain] = tree
        self.domain_files[domain] = path

    def _tree(self, domain: str, seq: Seq, parents: tuple[str, ...]) -> dict[str, DescriptorNode]:
        out: dict[str, DescriptorNode] = {}
        for item, line in zip(seq, seq.lines, strict=True):
            d = _map(item, line, "a descriptor")
            _no_unknown(
                d,
                {
                    "key",
                    "value",
                    "rate_limit",
                    "shadow_mode",
                    "unlimited",
                    "descriptors",
                    "policy",
                    "algorithm",
                    "detailed_metric",
                    "replaces",
                    "name",
                },
                "a descriptor",
            )
            key = d.get("key")
            if not isinstance(key, str) or not key or "=" in key:
                raise Problem(d.line, f"descriptor key {key!r} must be a non-empty string, no '='")
            value = d.get("value")
            if value is not None and not isinstance(value, str | int):
                raise Problem(d.lines["value"], f"descriptor value {value!r} must be a string")
            match = key if value is None else f"{key}={value}"
            if match in out:
                raise Problem(d.line, f"descriptor {match!r} appears twice at this level")
            path = (*parents, match)
            policy = self._descriptor_policy(domain, path, d)
            unlimited = _bool(
                d.get("unlimited", False), d.lines.get("unlimited", d.line), "unlimited"
            )
            if unlimited and policy is not None:
                raise Problem(d.line, "a descriptor cannot have both 'unlimited' and a limit")
            children: dict[str, DescriptorNode] = {}
            if "descriptors" in d:
                nested = _seq(d["descriptors"], d.lines["descriptors"], "descriptors")
                children = self._tree(domain, nested, path)
            out[match] = DescriptorNode(policy, unlimited, children)
        return out

    def _descriptor_policy(self, domain: str, path: tuple[str, ...], d: Map) -> str | None:
        if "policy" in d:
            if "rate_limit" in d:
                raise Problem(d.line, "a descriptor takes 'policy' or 'rate_limit', not both")
            name = d["policy"]
            if name in self.concurrency:
                raise Problem(
                    d.lines["policy"],
                    f"policy {name!r} is a concurrency policy; a descriptor needs a rate policy",
                )
            if name not in self.policies:
                known = ", ".join(sorted(self.policies)) or "none defined yet"
                raise Problem(
                    d.lines["policy"],
                    f"policy {name!r} is not defined (define it under 'policies' in this or an "
                    f"earlier file; known: {known})",
                )
            return str(name)
        if "rate_limit" not in d:
            return None
        rl = _map(d["rate_limit"], d.lines["rate_limit"], "rate_limit")
        _no_unknown(rl, {"unit", "requests_per_unit", "name"}, "rate_limit")
        unit = rl.get("unit")
        if not isinstance(unit, str) or unit.lower() not in ENVOY_UNITS:
            raise Problem(
                rl.lines.get("unit", rl.line),
                f"rate_limit unit {unit!r} is unknown; expected one of {', '.join(ENVOY_UNITS)}",
            )
        count = _int(
            rl.get("requests_per_unit"),
            rl.lines.get("requests_per_unit", rl.line),
            "rate_limit.requests_per_unit",
            0,
            2**32 - 1,
        )
        name = domain + "/" + "/".join(path)
        algorithm = str(d.get("algorithm", "fixed_window"))
        period = float(ENVOY_UNITS[unit.lower()])
        spec = _policy_from(name, Rate(max(count, 1), period), algorithm, {}, d)
        shadow = _bool(
            d.get("shadow_mode", False), d.lines.get("shadow_mode", d.line), "shadow_mode"
        )
        if name in self.policies:  # e.g. domain "a/b", key "c" and domain "a", keys "b", "c"
            raise Problem(
                d.line,
                f"this descriptor's limit would be named {name!r}, like another descriptor's "
                "limit; rename a domain, key or value so the names differ",
            )
        # Envoy: zero requests per unit puts every request over the limit.
        self.policies[name] = replace(spec, shadow=shadow, block=count == 0)
        self.policy_files[name] = "<envoy>"
        return name


# --- field helpers ----------------------------------------------------------------------------


def _policy(name: str, body: Map) -> PolicySpec:
    allowed = {"kind", "rate", "algorithm", "burst", "buckets", "shadow", "enabled"}
    _no_unknown(body, allowed, f"policy {name!r}")
    if "rate" not in body:
        raise Problem(body.line, f"policy {name!r} has no 'rate' (e.g. rate: 100/minute)")
    rate = body["rate"]
    if isinstance(rate, list):
        if not rate or not all(isinstance(r, str) for r in rate):
            raise Problem(body.lines["rate"], f"rate {rate!r} must be a list of rate strings")
        rate = "; ".join(rate)
    if not isinstance(rate, str):
        raise Problem(body.lines["rate"], f"rate {rate!r} must be a string like '100/minute'")
    options = {}
    for opt in ("burst", "buckets"):
        if opt in body:
            options[opt] = _int(body[opt], body.lines[opt], opt, 1, 10**12)
    algorithm = body.get("algorithm", "fixed_window")
    spec = _policy_from(name, rate, algorithm, options, body)
    shadow = _bool(body.get("shadow", False), body.lines.get("shadow", body.line), "shadow")
    enabled = _bool(body.get("enabled", True), body.lines.get("enabled", body.line), "enabled")
    return replace(spec, shadow=shadow, enabled=enabled)


def _concurrency(name: str, body: Map) -> ConcurrencySpec:
    _no_unknown(
        body, {"kind", "capacity", "lease_ttl", "shadow", "enabled"}, f"concurrency policy {name!r}"
    )
    if "capacity" not in body:
        raise Problem(body.line, f"concurrency policy {name!r} has no 'capacity' (e.g. 20)")
    capacity = _int(body["capacity"], body.lines["capacity"], "capacity", 1, 2**52 - 1)
    ttl = body.get("lease_ttl", 60)
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl <= 86_400 * 365:
        raise Problem(
            body.lines.get("lease_ttl", body.line),
            f"lease_ttl {ttl!r} must be seconds, more than 0 and at most a year (31536000)",
        )
    shadow = _bool(body.get("shadow", False), body.lines.get("shadow", body.line), "shadow")
    enabled = _bool(body.get("enabled", True), body.lines.get("enabled", body.line), "enabled")
    return ConcurrencySpec(name, capacity, float(ttl), shadow, enabled)


def _policy_from(
    name: str,
    rate: str | Rate,
    algorithm: Any,
    options: dict[str, int],
    where: Map,
) -> PolicySpec:
    line = where.lines.get("rate", where.lines.get("rate_limit", where.line))
    if not isinstance(algorithm, str):
        raise Problem(
            where.lines.get("algorithm", line), f"algorithm {algorithm!r} must be a string"
        )
    try:
        policy = make_policy(rate, algorithm, options.get("burst"), options.get("buckets"))
    except (ConfigError, RateSpecError) as exc:
        bad = "algorithm" if "algorithm" in str(exc) and "algorithm" in where else "rate"
        raise Problem(where.lines.get(bad, line), str(exc)) from None
    text = rate if isinstance(rate, str) else str(rate)
    return PolicySpec(name, policy, text, algorithm, options.get("burst"), options.get("buckets"))


_URL = ("redis://", "rediss://", "unix://")


def _store(value: Any, line: int) -> StoreSettings:
    if isinstance(value, str):
        value = Map({"url": value})
        value.line, value.lines = line, {"url": line}
    body = _map(value, line, "store")
    allowed = {"url", "shards", "cluster", "max_keys", "prefix", "socket_timeout", "batch"}
    _no_unknown(body, allowed, "store")
    where = [k for k in ("url", "shards", "cluster") if k in body]
    if len(where) > 1:
        raise Problem(body.lines[where[1]], "store takes one of url, shards or cluster")
    at = body.lines.get
    max_keys = _int(body.get("max_keys", 1_000_000), at("max_keys", line), "max_keys", 1, 10**9)
    prefix = body.get("prefix", "rk")
    if not isinstance(prefix, str) or not prefix or len(prefix) > 64:
        raise Problem(at("prefix", line), f"store prefix {prefix!r} must be 1-64 characters")
    timeout = body.get("socket_timeout", 0.05)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= 60:
        raise Problem(at("socket_timeout", line), f"socket_timeout {timeout!r} must be 0-60 s")
    batch, size, wait = _batch(body.get("batch", True), at("batch", line))
    common = StoreSettings("memory", "", (), max_keys, prefix, float(timeout), batch, size, wait)
    if "shards" in body:
        shards = _seq(body["shards"], body.lines["shards"], "store.shards")
        if not shards:
            raise Problem(shards.line, "store.shards is empty; expected at least one shard")
        out = tuple(_shard(item, ln) for item, ln in zip(shards, shards.lines, strict=True))
        return replace(common, kind="sharded", shards=out)
    kind = "cluster" if "cluster" in body else "redis"
    url = body.get("cluster", body.get("url", "memory"))
    url_line = at("cluster", at("url", line))
    if url == "memory":
        return common
    if not isinstance(url, str) or not url.startswith(_URL):
        raise Problem(url_line, f"store {url!r} is unknown; expected 'memory' or a redis:// URL")
    return replace(common, kind=kind, url=url)


def _batch(value: Any, line: int) -> tuple[bool, int, float]:
    if isinstance(value, bool):
        return value, 128, 1.0
    body = _map(value, line, "store.batch")
    _no_unknown(body, {"max_size", "max_wait_ms"}, "store.batch")
    size = _int(body.get("max_size", 128), body.lines.get("max_size", line), "max_size", 1, 10_000)
    wait = body.get("max_wait_ms", 1.0)
    if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait <= 100:
        raise Problem(body.lines.get("max_wait_ms", line), f"max_wait_ms {wait!r} must be 0-100")
    return True, size, float(wait)


def _shard(value: Any, line: int) -> ShardSettings:
    if isinstance(value, str):
        value = Map({"url": value})
        value.line, value.lines = line, {"url": line}
    body = _map(value, line, "a shard")
    _no_unknown(body, {"url", "replicas", "name"}, "a shard")
    url = body.get("url")
    if not isinstance(url, str) or not url.startswith(_URL):
        raise Problem(body.lines.get("url", line), f"shard url {url!r} must be a redis:// URL")
    replicas = body.get("replicas", [])
    if not isinstance(replicas, list) or not all(
        isinstance(r, str) and r.startswith(_URL) for r in replicas
    ):
        raise Problem(body.lines.get("replicas", line), "replicas must be a list of redis:// URLs")
    name = body.get("name", "")
    if not isinstance(name, str):
        raise Problem(body.lines.get("name", line), f"shard name {name!r} must be a string")
    return ShardSettings(url, tuple(replicas), name)


def _auth(body: Map, env: Mapping[str, str], current: AuthSettings) -> AuthSettings:
    _no_unknown(body, {"token", "token_env", "admin_token", "admin_token_env", "grpc"}, "auth")
    tokens = {"token": current.token, "admin_token": current.admin_token}
    for name in ("token", "admin_token"):
        if name in body and f"{name}_env" in body:
            raise Problem(body.lines[name], f"auth takes {name} or {name}_env, not both")
        if name in body:
            tokens[name] = _token(body[name], body.lines[name], f"auth.{name}")
        elif f"{name}_env" in body:
            var = body[f"{name}_env"]
            line = body.lines[f"{name}_env"]
            if not isinstance(var, str) or var not in env:
                raise Problem(line, f"auth.{name}_env names {var!r}, which is not set")
            tokens[name] = _token(env[var], line, f"environment variable {var}")
    grpc = _bool(body.get("grpc", False), body.lines.get("grpc", body.line), "auth.grpc")
    return AuthSettings(tokens["token"], tokens["admin_token"], grpc)


def _token(value: Any, line: int, what: str) -> str:
    if not isinstance(value, str) or len(value) < 16 or not value.isascii() or " " in value:
        raise Problem(line, f"{what} must be a string of at least 16 ASCII characters, no spaces")
    return value


def _check_name(name: str, line: int) -> None:
    if not name or len(name) > 200 or not all(c.isalnum() or c in "._-:" for c in name):
        raise Problem(
            line, f"policy name {name!r} is invalid; use letters, digits and . _ - : (<= 200)"
        )


def _no_unknown(body: Map, allowed: set[str], where: str) -> None:
    for key in body:
        if key not in allowed:
            raise Problem(
                body.lines[key],
                f"unknown key {key!r} in {where}; expected one of {', '.join(sorted(allowed))}",
            )


def _map(value: Any, line: int, what: str) -> Map:
    if not isinstance(value, Map):
        raise Problem(line, f"{what} must be a mapping, not {type(value).__name__}")
    return value


def _seq(value: Any, line: int, what: str) -> Seq:
    if not isinstance(value, Seq):
        raise Problem(line, f"{what} must be a list, not {type(value).__name__}")
    return value


def _int(value: Any, line: int, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise Problem(line, f"{what} {value!r} must be a whole number from {low} to {high:_}")
    return value


def _bool(value: Any, line: int, what: str) -> bool:
    if not isinstance(value, bool):
        raise Problem(line, f"{what} {value!r} must be true or false")
    return value
