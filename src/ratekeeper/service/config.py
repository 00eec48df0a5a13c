"""Service configuration: YAML files -> one frozen ``ServiceConfig``, or a ``ConfigError``
naming the file, the line and what is wrong.

Two formats are read, and may be mixed across files (``--config`` can be repeated, and a
directory stands for every file in it, as envoyproxy/ratelimit's runtime directory):

- ours: ``store``, ``auth``, ``limits``, ``envoy`` (upstream's global settings, see
  ``envoy_config.EnvoySettings``), ``policies`` (named rate stacks with algorithm and options,
  ``shadow``, ``enabled``; or ``kind: concurrency`` with ``capacity`` and ``lease_ttl``: at
  most N requests in progress per key) and ``domains`` (a list of Envoy-format domains);
- envoyproxy/ratelimit's, as is: a file whose top level is ``domain`` + ``descriptors``, read
  with upstream's rules by ``envoy_config``.

Settings are read from every file first, then policies, then domains, so a descriptor may
name a policy (``policy:``, our extension) of any file. Validation is complete before
anything is used: a config either loads whole or not at all. Keys upstream accepts where they
do nothing are reported in ``ServiceConfig.warnings``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .config_files import config_files
from .envoy_config import (
    UNIT_SECONDS,
    VALID_KEYS,
    DomainCompiler,
    EnvoyNode,
    EnvoySettings,
    check_values,
)
from .envoy_config import settings as envoy_settings
from .policies import ConcurrencySpec as ConcurrencySpec
from .policies import PolicySpec as PolicySpec
from .policies import policy_from
from .yaml_lines import (
    Map,
    Problem,
    need_bool,
    need_int,
    need_map,
    need_seq,
    no_unknown,
    parse,
)

EXAMPLE = Path(__file__).with_name("example.yaml")
"""The built-in example policy file used by ``ratekeeper serve`` without ``--config``."""

ENVOY_UNITS = {
    "second": UNIT_SECONDS[1],
    "minute": UNIT_SECONDS[2],
    "hour": UNIT_SECONDS[3],
    "day": UNIT_SECONDS[4],
    "week": UNIT_SECONDS[7],
    "month": UNIT_SECONDS[5],
    "year": UNIT_SECONDS[6],
}
"""Envoy's units in seconds; a month is 30 days and a year 365, as envoyproxy/ratelimit counts."""
DEFAULT_MAX_KEY_LENGTH = 512
MAX_KEY_LENGTH_LIMIT = 65_536


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
    domains: Mapping[str, EnvoyNode] = field(default_factory=dict)
    """Envoy-format domains: each a compiled descriptor tree."""
    concurrency: Mapping[str, ConcurrencySpec] = field(default_factory=dict)
    """Concurrency policies (``kind: concurrency``); their names differ from ``policies``'."""
    envoy: EnvoySettings = field(default_factory=EnvoySettings)
    warnings: tuple[str, ...] = ()
    """``file:line: message`` for keys accepted but without effect (as upstream ignores them)."""


# --- loading ----------------------------------------------------------------------------------


def load(
    paths: list[str] | tuple[str, ...],
    env: Mapping[str, str] | None = None,
    dotfiles: bool = False,
) -> ServiceConfig:
    """Read, merge and validate config files (a directory: every file in it, see
    ``config_files``); raise ``ConfigError`` ("file:line: problem")."""
    env = os.environ if env is None else env
    if not paths:
        paths = (str(EXAMPLE),)
    docs = []
    for path in config_files(paths, dotfiles):
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: cannot read config file: {exc}") from exc
        docs.append((path, text))
    return _build(docs, env)


def parse_text(text: str, name: str = "<config>") -> ServiceConfig:
    """Validate one config given as text (tests and tools)."""
    return _build([(name, text)], {})


def _build(texts: list[tuple[str, str]], env: Mapping[str, str]) -> ServiceConfig:
    """Settings from every file first, then policies, then domains (so a domain may name a
    policy of any file); every problem names its file and line."""
    builder = _Builder(env)
    docs = []
    for path, text in texts:
        with _in(path):
            docs.append((path, _document(text)))
    for phase in (builder.read_settings, builder.read_policies, builder.read_domains):
        for path, doc in docs:
            with _in(path):
                phase(path, doc)
    with _in(builder.settings_file or texts[0][0] if texts else "<config>"):
        return builder.build(tuple(path for path, _ in texts))


@contextlib.contextmanager
def _in(path: str) -> Iterator[None]:
    """Turn a ``Problem`` raised inside into a ``ConfigError`` naming ``path``."""
    try:
        yield
    except Problem as exc:
        raise ConfigError(f"{path}:{exc.line}: {exc.message}") from None


def _document(text: str) -> Map:
    doc = parse(text)
    if doc is None:
        raise Problem(1, "the file is empty; expected a mapping with 'policies' or 'domain'")
    if not isinstance(doc, Map):
        raise Problem(1, "the top level must be a mapping with 'policies' or 'domain'")
    if "descriptors" in doc and "domain" not in doc:
        for key in doc:
            if key not in VALID_KEYS:
                raise Problem(doc.lines[key], f"unknown key {key!r} in an Envoy domain file")
        raise Problem(doc.line, "config file cannot have empty domain: add domain: <name>")
    return doc


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
        self.auth_line = 0
        self.max_key_length = DEFAULT_MAX_KEY_LENGTH
        self.local_cache = True
        self.envoy = EnvoySettings()
        self.settings_file = ""
        self.policies: dict[str, PolicySpec] = {}
        self.concurrency: dict[str, ConcurrencySpec] = {}
        self.policy_files: dict[str, str] = {}
        self.domains: dict[str, DomainCompiler] = {}
        self.domain_files: dict[str, str] = {}
        self.warnings: list[str] = []

    def build(self, files: tuple[str, ...]) -> ServiceConfig:
        if self.auth.grpc and not (self.auth.token or self.auth.admin_token):
            raise Problem(
                self.auth_line,
                "auth.grpc: true needs a token (auth.token or RATEKEEPER_TOKEN): gRPC callers "
                "must present it, and with no token configured gRPC would stay open",
            )
        return ServiceConfig(
            files,
            self.store,
            self.auth,
            self.max_key_length,
            self.local_cache,
            dict(self.policies),
            {name: compiler.build() for name, compiler in self.domains.items()},
            dict(self.concurrency),
            self.envoy,
            tuple(self.warnings),
        )

    def read_settings(self, path: str, doc: Map) -> None:
        """Phase 1: store, auth, limits and envoy (one file may set them)."""
        if "domain" in doc:
            return
        _no_unknown(
            doc, {"store", "auth", "limits", "envoy", "policies", "domains"}, "the top level"
        )
        given = [k for k in ("store", "auth", "limits", "envoy") if k in doc]
        if not given:
            return
        if self.settings_file:
            line = min(doc.lines[k] for k in given)
            raise Problem(line, f"store/auth/limits/envoy are already set in {self.settings_file}")
        self.settings_file = path
        if "store" in doc:
            self.store = _store(doc["store"], doc.lines["store"])
        if "auth" in doc:
            self.auth_line = doc.lines["auth"]
            self.auth = _auth(_map(doc["auth"], doc.lines["auth"], "auth"), self.env, self.auth)
        if "limits" in doc:
            self._limits(_map(doc["limits"], doc.lines["limits"], "limits"))
        if "envoy" in doc:
            self.envoy = envoy_settings(_map(doc["envoy"], doc.lines["envoy"], "envoy"))

    def read_policies(self, path: str, doc: Map) -> None:
        """Phase 2: named policies."""
        if "policies" in doc and "domain" not in doc:
            policies = _map(doc["policies"], doc.lines["policies"], "policies")
            for name, body in policies.items():
                self._add_policy(path, name, body, policies.lines[name])

    def read_domains(self, path: str, doc: Map) -> None:
        """Phase 3: Envoy-format domains (a file of one, or our format's ``domains:`` list)."""
        if "domain" in doc:
            self._envoy_domain(path, doc)
        elif "domains" in doc:
            domains = _seq(doc["domains"], doc.lines["domains"], "domains")
            for item, line in zip(domains, domains.lines, strict=True):
                self._envoy_domain(path, _map(item, line, "a domain"))

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

    def _envoy_domain(self, path: str, doc: Map) -> None:
        check_values(doc, doc.line)
        domain = _domain_name(doc)
        compiler = self.domains.get(domain)
        if compiler is not None and not self.envoy.merge_domains:
            raise Problem(
                doc.lines.get("domain", doc.line),
                f"duplicate domain {domain!r}: already defined in {self.domain_files[domain]} "
                "(envoy.merge_domains: true merges them)",
            )
        if compiler is None:
            compiler = DomainCompiler(domain, self._register, self._lookup)
            self.domains[domain] = compiler
            self.domain_files[domain] = path
        for key in doc:
            if key not in ("domain", "descriptors"):
                if key not in VALID_KEYS:
                    raise Problem(doc.lines[key], f"unknown key {key!r} in an Envoy domain")
                self.warnings.append(f"{path}:{doc.lines[key]}: key {key!r} has no effect here")
        descriptors = doc.get("descriptors")
        compiler.warnings.clear()
        compiler.add(
            None
            if descriptors is None
            else _seq(descriptors, doc.lines["descriptors"], "descriptors")
        )
        self.warnings += [f"{path}:{line}: {message}" for line, message in compiler.warnings]

    def _register(self, spec: PolicySpec, wished: str) -> str:
        name, n = wished, 1
        while name in self.policies or name in self.concurrency:
            n += 1
            name = f"{wished}~{n}"
        self.policies[name] = replace(spec, name=name)
        self.policy_files[name] = "<envoy>"
        return name

    def _lookup(self, name: Any, line: int) -> str:
        if name in self.concurrency:
            raise Problem(
                line, f"policy {name!r} is a concurrency policy; a descriptor needs a rate policy"
            )
        if not isinstance(name, str) or name not in self.policies:
            known = ", ".join(sorted(n for n, f in self.policy_files.items() if f != "<envoy>"))
            raise Problem(
                line,
                f"policy {name!r} is not defined (define it under 'policies'; known: "
                f"{known or 'none'})",
            )
        return name


def _domain_name(doc: Map) -> str:
    value = doc.get("domain")
    if isinstance(value, bool) or not isinstance(value, str | int | None):
        raise Problem(doc.lines.get("domain", doc.line), f"domain {value!r} must be a string")
    if value is None or value == "":
        raise Problem(doc.lines.get("domain", doc.line), "config file cannot have empty domain")
    return str(value)


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
    spec = policy_from(name, rate, algorithm, options, body)
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


_no_unknown = no_unknown
_map = need_map
_seq = need_seq
_int = need_int
_bool = need_bool
