"""Service configuration: YAML files -> one frozen ``ServiceConfig``, or a ``ConfigError``
naming the file, the line and what is wrong.

Two formats are read, and may be mixed across files (``--config`` can be repeated, and a
directory stands for every file in it, as envoyproxy/ratelimit's runtime directory):

- ours: ``store``, ``auth``, ``limits``, ``envoy`` (upstream's global settings, see
  ``config.envoy.EnvoySettings``), ``policies`` (named rate stacks with algorithm and options,
  ``shadow``, ``enabled``; or ``kind: concurrency`` with ``capacity`` and ``lease_ttl``: at
  most N requests in progress per key) and ``domains`` (a list of Envoy-format domains);
- envoyproxy/ratelimit's, as is: a file whose top level is ``domain`` + ``descriptors``, read
  with upstream's rules by ``config.envoy``.

Settings are read from every file first, then policies, then domains, so a descriptor may
name a policy (``policy:``, our extension) of any file. Validation is complete before
anything is used: a config either loads whole or not at all, and a refusal lists every
problem found (each independent part — a file, a section, a policy, a field, a descriptor —
is checked even after another failed), one ``file:line: problem`` a line. Keys upstream
accepts where they do nothing are reported in ``ServiceConfig.warnings``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from ...yaml_lines import (
    Map,
    Problem,
    Problems,
    need_bool,
    need_int,
    need_map,
    need_seq,
    no_unknown,
    parse,
)
from . import environment
from .envoy import (
    UNIT_SECONDS,
    VALID_KEYS,
    DomainCompiler,
    EnvoyNode,
    EnvoySettings,
    check_values,
)
from .envoy import settings as envoy_settings
from .files import config_files
from .policies import ConcurrencySpec as ConcurrencySpec
from .policies import PolicySpec as PolicySpec
from .policies import policy_from
from .quotas import QuotaReader, QuotaSettings, is_plan_rate
from .rlqs import RlqsSettings, read_rlqs
from .settings import AuthSettings as AuthSettings
from .settings import ShardSettings as ShardSettings
from .settings import StoreSettings as StoreSettings
from .settings import check_token, read_auth, read_store

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
OVER_LIMIT_STATUSES = (200, 429)
"""What ``/v1/hit`` may answer a request over its limit with (``limits.over_limit_status``)."""


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    """Everything the service needs from its config files."""

    files: tuple[str, ...]
    store: StoreSettings = field(default_factory=StoreSettings)
    auth: AuthSettings = field(default_factory=AuthSettings)
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
    over_limit_status: int = 200
    """The HTTP status of ``/v1/hit`` when the answer is ``allowed: false``."""
    rlqs: RlqsSettings = field(default_factory=RlqsSettings)
    """Envoy's quota buckets -> policies, and the quota service's settings (``rlqs/``)."""
    quotas: QuotaSettings | None = None
    """The plans and their source (``quotas:``, ``config.quotas``); None: no plans."""


# --- loading ----------------------------------------------------------------------------------


def load(
    paths: list[str] | tuple[str, ...],
    env: Mapping[str, str] | None = None,
    dotfiles: bool = False,
) -> ServiceConfig:
    """Read, merge and validate config files (a directory: every file in it, see
    ``config.files``); raise ``ConfigError`` listing every problem, one
    ``file:line: problem`` a line."""
    env = os.environ if env is None else env
    if not paths:
        paths = (str(EXAMPLE),)
    problems = Problems()
    texts: list[tuple[str, str]] = []
    for given in paths:
        try:
            files = config_files([given], dotfiles)
        except ConfigError as exc:
            problems.add_text(len(texts), str(exc))
            continue
        for path in files:
            try:
                texts.append((path, Path(path).read_text(encoding="utf-8")))
            except (OSError, UnicodeDecodeError) as exc:
                problems.add_text(len(texts), f"{path}: cannot read config file: {exc}")
    return _build(texts, env, problems)


def parse_text(text: str, name: str = "<config>") -> ServiceConfig:
    """Validate one config given as text (tests and tools)."""
    return _build([(name, text)], {}, Problems())


def _build(
    texts: list[tuple[str, str]], env: Mapping[str, str], problems: Problems
) -> ServiceConfig:
    """Settings from every file first, then policies, then domains (so a domain may name a
    policy of any file); every problem names its file and line, and all are reported."""
    builder = _Builder(env, problems)
    docs = []
    for index, (path, text) in enumerate(texts):
        problems.at(index, path)
        with problems.guard():
            docs.append((index, path, _document(text)))
    try:  # the environment's store/envoy/limits settings, over the settings file's
        sections, _ = environment.config_overlay(env)
    except environment.EnvironmentProblem as exc:
        problems.add_text(-1, str(exc))
    else:
        created = environment.lay_over(docs, sections)
        if created is not None:
            texts.append(("<environment>", ""))
            docs.append((len(texts) - 1, "<environment>", created))
    phases = (builder.read_settings, builder.read_quotas, builder.read_policies,
              builder.read_domains)  # fmt: skip
    for phase in phases:
        for index, path, doc in docs:
            problems.at(index, path)
            phase(path, doc)
    if not problems.count:
        files = tuple(path for path, _ in texts if path != "<environment>")
        problems.at(files.index(builder.settings_file) if builder.settings_file in files else 0,
                    builder.settings_file or (files[0] if files else "<config>"))  # fmt: skip
        with problems.guard():
            return builder.build(files)
    raise ConfigError("\n".join(problems.lines()))


def _document(text: str) -> Map:
    doc = parse(text)
    if doc is None:
        raise Problem(1, "the file is empty; expected a mapping with 'policies' or 'domain'")
    if not isinstance(doc, Map):
        raise Problem(1, "the top level must be a mapping with 'policies' or 'domain'")
    if "descriptors" in doc and "domain" not in doc:
        found = [
            Problem(doc.lines[key], f"unknown key {key!r} in an Envoy domain file")
            for key in doc
            if key not in VALID_KEYS
        ]
        found.append(Problem(doc.line, "config file cannot have empty domain: add domain: <name>"))
        raise Problem.first_of(found)
    return doc


class _Builder:
    """Accumulates the content of several files, refusing duplicates across them; a part
    with a problem is recorded in ``problems`` and left out, and reading goes on."""

    def __init__(self, env: Mapping[str, str], problems: Problems) -> None:
        self.env = env
        self.problems = problems
        self.guard = problems.guard
        self.store = StoreSettings()
        tokens = {}
        for var in ("RATEKEEPER_TOKEN", "RATEKEEPER_ADMIN_TOKEN"):
            value = env.get(var, "")
            if value:
                try:
                    check_token(value, 0, f"environment variable {var}")
                except Problem as exc:
                    problems.add_text(-1, exc.message)
            tokens[var] = value
        self.auth = AuthSettings(tokens["RATEKEEPER_TOKEN"], tokens["RATEKEEPER_ADMIN_TOKEN"])
        self.auth_line = 0
        self.max_key_length = DEFAULT_MAX_KEY_LENGTH
        self.local_cache = True
        self.over_limit_status = 200
        self.envoy = EnvoySettings()
        self.settings_file = ""
        self.policies: dict[str, PolicySpec] = {}
        self.concurrency: dict[str, ConcurrencySpec] = {}
        self.policy_files: dict[str, str] = {}
        self.failed: set[str] = set()
        """Policies refused for a problem: naming one is not another problem."""
        self.domains: dict[str, DomainCompiler] = {}
        self.domain_files: dict[str, str] = {}
        self.warnings: list[str] = []
        self.rlqs = RlqsSettings()
        self.rlqs_file = ""
        self.quotas = QuotaReader(problems)

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
            self.over_limit_status,
            self.rlqs,
            self.quotas.settings,
        )

    def read_settings(self, path: str, doc: Map) -> None:
        """Phase 1: store, auth, limits and envoy (one file may set them)."""
        if "domain" in doc:
            return
        with self.guard():
            _no_unknown(doc, {"store", "auth", "limits", "envoy", "policies", "domains", "rlqs",
                                "quotas"},
                        "the top level")  # fmt: skip
        given = [k for k in ("store", "auth", "limits", "envoy") if k in doc]
        if not given:
            return
        if self.settings_file:
            line = min(doc.lines[k] for k in given)
            self.problems.add(
                Problem(line, f"store/auth/limits/envoy are already set in {self.settings_file}")
            )
            return
        self.settings_file = path
        problems = self.problems
        if "store" in doc:
            with self.guard():
                self.store = read_store(doc["store"], doc.lines["store"], problems)
        if "auth" in doc:
            self.auth_line = doc.lines["auth"]
            with self.guard():
                body = _map(doc["auth"], doc.lines["auth"], "auth")
                self.auth = read_auth(body, self.env, self.auth, problems)
        if "limits" in doc:
            with self.guard():
                self._limits(_map(doc["limits"], doc.lines["limits"], "limits"))
        if "envoy" in doc:
            with self.guard():
                body = _map(doc["envoy"], doc.lines["envoy"], "envoy")
                self.envoy = envoy_settings(body, problems)

    def read_quotas(self, path: str, doc: Map) -> None:
        """Phase 1b: the plans (``quotas:``), once the store is known."""
        if "domain" not in doc:
            self.quotas.read(path, doc, self.store.url if self.store.kind == "redis" else "")

    def read_policies(self, path: str, doc: Map) -> None:
        """Phase 2: named policies."""
        if "policies" in doc and "domain" not in doc:
            with self.guard():
                policies = _map(doc["policies"], doc.lines["policies"], "policies")
                for name, body in policies.items():
                    with self.guard():
                        self._add_policy(path, name, body, policies.lines[name])

    def read_domains(self, path: str, doc: Map) -> None:
        """Phase 3: Envoy-format domains (a file of one, or our format's ``domains:`` list),
        and the quota service's bucket rules (``rlqs:``, in one file)."""
        if "rlqs" in doc and "domain" not in doc:
            with self.guard():
                if self.rlqs_file:
                    raise Problem(doc.lines["rlqs"], f"rlqs is already set in {self.rlqs_file}")
                self.rlqs_file = path
                body = _map(doc["rlqs"], doc.lines["rlqs"], "rlqs")
                self.rlqs = read_rlqs(
                    body, self.problems, self.policies, self._register, self._lookup
                )
        if "domain" in doc:
            with self.guard():
                self._envoy_domain(path, doc)
        elif "domains" in doc:
            with self.guard():
                domains = _seq(doc["domains"], doc.lines["domains"], "domains")
                for item, line in zip(domains, domains.lines, strict=True):
                    with self.guard():
                        self._envoy_domain(path, _map(item, line, "a domain"))

    def _limits(self, limits: Map) -> None:
        with self.guard():
            _no_unknown(limits, {"max_key_length", "local_cache", "over_limit_status"}, "limits")
        if "max_key_length" in limits:
            with self.guard():
                self.max_key_length = _int(
                    limits["max_key_length"],
                    limits.lines["max_key_length"],
                    "limits.max_key_length",
                    1,
                    MAX_KEY_LENGTH_LIMIT,
                )
        if "local_cache" in limits:
            with self.guard():
                self.local_cache = _bool(
                    limits["local_cache"], limits.lines["local_cache"], "limits.local_cache"
                )
        if "over_limit_status" in limits:
            status = limits["over_limit_status"]
            if isinstance(status, bool) or status not in OVER_LIMIT_STATUSES:
                self.problems.add(
                    Problem(
                        limits.lines["over_limit_status"],
                        f"limits.over_limit_status {status!r} must be 200 or 429",
                    )
                )
            else:
                self.over_limit_status = status

    def _add_policy(self, path: str, name: str, body: Any, line: int) -> None:
        if name in self.policy_files:
            raise Problem(line, f"policy {name!r} is already defined in {self.policy_files[name]}")
        self.failed.add(name)  # until it is read whole
        _check_name(name, line)
        body = _map(body, line, f"policy {name!r}")
        kind = body.get("kind", "rate")
        before = self.problems.count
        if kind == "rate" and is_plan_rate(body):
            self.policies[name] = self.quotas.policy(name, body)
        elif kind == "concurrency":
            spec = _concurrency(name, body, self.problems)
            if self.problems.count == before:
                self.concurrency[name] = spec
        elif kind == "rate":
            policy = _policy(name, body, self.problems)
            if policy is not None and self.problems.count == before:
                self.policies[name] = policy
        else:
            raise Problem(
                body.lines["kind"], f"policy kind {kind!r} is unknown; expected rate or concurrency"
            )
        if self.problems.count == before:
            self.policy_files[name] = path
            self.failed.discard(name)

    def _envoy_domain(self, path: str, doc: Map) -> None:
        before = self.problems.count
        with self.guard():
            check_values(doc, doc.line)
        if self.problems.count > before:  # values that cannot be read: no more to say
            return
        domain = _domain_name(doc)
        compiler = self.domains.get(domain)
        if compiler is not None and not self.envoy.merge_domains:
            raise Problem(
                doc.lines.get("domain", doc.line),
                f"duplicate domain {domain!r}: already defined in {self.domain_files[domain]} "
                "(envoy.merge_domains: true merges them)",
            )
        if compiler is None:
            compiler = DomainCompiler(domain, self._register, self._lookup, self.problems)
            self.domains[domain] = compiler
            self.domain_files[domain] = path
        for key in doc:
            if key not in ("domain", "descriptors"):
                if key not in VALID_KEYS:
                    self.problems.add(
                        Problem(doc.lines[key], f"unknown key {key!r} in an Envoy domain")
                    )
                else:
                    self.warnings.append(f"{path}:{doc.lines[key]}: key {key!r} has no effect here")
        descriptors = doc.get("descriptors")
        compiler.warnings.clear()
        with self.guard():
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
        if isinstance(name, str) and name in self.policies and self.policies[name].plan:
            raise Problem(line, f"policy {name!r} counts a plan's limit, keyed by a caller's "
                          "tenant; Envoy descriptors cannot use it (give a rate)")  # fmt: skip
        if name in self.concurrency:
            raise Problem(
                line, f"policy {name!r} is a concurrency policy; a descriptor needs a rate policy"
            )
        if isinstance(name, str) and name in self.failed:
            return name  # refused already, for its own problem
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


def _policy(name: str, body: Map, problems: Problems) -> PolicySpec | None:
    """The rate policy ``name``, or None with its problems recorded."""
    guard = problems.guard
    allowed = {"kind", "rate", "algorithm", "burst", "buckets", "shadow", "enabled"}
    with guard():
        _no_unknown(body, allowed, f"policy {name!r}")
    options = {}
    for opt in ("burst", "buckets"):
        if opt in body:
            with guard():
                options[opt] = _int(body[opt], body.lines[opt], opt, 1, 10**12)
    shadow, enabled = _switches(body, problems)
    with guard():
        if "rate" not in body:
            raise Problem(body.line, f"policy {name!r} has no 'rate' (e.g. rate: 100/minute)")
        rate = body["rate"]
        if isinstance(rate, list):
            if not rate or not all(isinstance(r, str) for r in rate):
                raise Problem(body.lines["rate"], f"rate {rate!r} must be a list of rate strings")
            rate = "; ".join(rate)
        if not isinstance(rate, str):
            raise Problem(body.lines["rate"], f"rate {rate!r} must be a string like '100/minute'")
        algorithm = body.get("algorithm", "fixed_window")
        spec = policy_from(name, rate, algorithm, options, body)
        return replace(spec, shadow=shadow, enabled=enabled)
    return None


def _switches(body: Map, problems: Problems) -> tuple[bool, bool]:
    """A policy's ``shadow`` and ``enabled`` (false and true unless given)."""
    shadow, enabled = False, True
    with problems.guard():
        shadow = _bool(body.get("shadow", False), body.lines.get("shadow", body.line), "shadow")
    with problems.guard():
        enabled = _bool(body.get("enabled", True), body.lines.get("enabled", body.line), "enabled")
    return shadow, enabled


def _concurrency(name: str, body: Map, problems: Problems) -> ConcurrencySpec:
    """The concurrency policy ``name`` (its problems recorded: then not to be used)."""
    guard = problems.guard
    with guard():
        allowed = {"kind", "capacity", "lease_ttl", "shadow", "enabled"}
        _no_unknown(body, allowed, f"concurrency policy {name!r}")
    capacity = 1
    with guard():
        if "capacity" not in body:
            raise Problem(body.line, f"concurrency policy {name!r} has no 'capacity' (e.g. 20)")
        capacity = _int(body["capacity"], body.lines["capacity"], "capacity", 1, 2**52 - 1)
    ttl = body.get("lease_ttl", 60)
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl <= 86_400 * 365:
        problems.add(
            Problem(
                body.lines.get("lease_ttl", body.line),
                f"lease_ttl {ttl!r} must be seconds, more than 0 and at most a year (31536000)",
            )
        )
        ttl = 60
    shadow, enabled = _switches(body, problems)
    return ConcurrencySpec(name, capacity, float(ttl), shadow, enabled)


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
