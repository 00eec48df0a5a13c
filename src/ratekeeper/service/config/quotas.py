"""The service's ``quotas:`` section and its policies of ``rate: plan:<limit>``.

::

    quotas:
      plans: plans.yaml            # the plans file (relative to this config file)
      source: file                 # file: the plans file's customers; redis: Redis hashes
      url: redis://127.0.0.1:6379/0   # source: redis (default: the store's url)
      prefix: "ratekeeper:plans:"  # source: redis
      tenant_separator: ":"        # the tenant is the key up to it (default: the whole key)
      ttl: 30                      # seconds a tenant's plan is cached
      retry: 5                     # seconds before a failing source is asked again
      on_error: default            # or allow: let through while the source fails
      audit_file: /var/log/ratekeeper/audit.jsonl   # the admin API's audit log, besides
      audit_stream: ratekeeper:audit                 # the log; audit_stream: source redis
    policies:
      api: {rate: "plan:api"}      # the caller's tenant's limit "api", from its plan

A policy of ``rate: plan:<limit>`` takes ``shadow`` and ``enabled`` and nothing else (the plan
sets the algorithm and its options); its counters are the limit's own, keyed by the caller's
key as the library keys them, so ``/v1/status``, the admin API and a library sharing the store
see the same counts. Every problem is ``file:line: problem``; the plans file's own problems
name its lines.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import ConfigError
from ...quotas import Plans
from ...yaml_lines import Map, Problem, Problems, need_map, no_unknown
from .policies import PolicySpec

KEYS = frozenset(
    {
        "plans",
        "source",
        "url",
        "prefix",
        "tenant_separator",
        "ttl",
        "retry",
        "on_error",
        "audit_file",
        "audit_stream",
    }
)
PLAN_POLICY_KEYS = frozenset({"kind", "rate", "shadow", "enabled"})


@dataclass(frozen=True, slots=True)
class QuotaSettings:
    """The ``quotas:`` section, its plans read and checked."""

    plans: Plans = field(compare=False)
    plans_file: str
    source: str = "file"
    url: str = ""
    prefix: str = "ratekeeper:plans:"
    tenant_separator: str = ""
    ttl: float = 30.0
    retry: float = 5.0
    on_error: str = "default"
    audit_file: str = ""
    audit_stream: str = ""
    stamp: float = field(default=0.0)
    """The plans file's mtime: a reload rebuilds the plans when it changed."""


def is_plan_rate(body: object) -> bool:
    """Whether a policy body's rate names a plan's limit (``plan:<limit>``)."""
    return (
        isinstance(body, Map)
        and isinstance(body.get("rate"), str)
        and str(body["rate"]).startswith("plan:")
    )


class QuotaReader:
    """Reads ``quotas:`` (one file may set it) and the policies of plan rates."""

    def __init__(self, problems: Problems) -> None:
        self.problems = problems
        self.settings: QuotaSettings | None = None
        self.file = ""

    def read(self, path: str, doc: Map, store_url: str) -> None:
        """Phase 1: the section, if this file has it."""
        if "quotas" not in doc:
            return
        line = doc.lines["quotas"]
        with self.problems.guard():
            if self.file:
                raise Problem(line, f"quotas is already set in {self.file}")
            self.file = path
            body = need_map(doc["quotas"], line, "quotas")
            self.settings = self._settings(path, body, store_url)

    def _settings(self, path: str, body: Map, store_url: str) -> QuotaSettings | None:
        problems = self.problems
        before = problems.count
        with problems.guard():
            no_unknown(body, KEYS, "quotas")
        values: dict[str, Any] = {}
        for name in ("prefix", "tenant_separator", "audit_file", "audit_stream", "url"):
            if name in body:
                value = body[name]
                if not isinstance(value, str) or not value or len(value) > 1000:
                    problems.add(
                        Problem(
                            body.lines[name], f"quotas.{name} {value!r} must be a non-empty string"
                        )
                    )
                else:
                    values[name] = value
        for name in ("ttl", "retry"):
            if name in body:
                value = body[name]
                if (
                    isinstance(value, bool)
                    or not isinstance(value, int | float)
                    or not (0 <= value <= 86_400)
                ):
                    problems.add(
                        Problem(
                            body.lines[name],
                            f"quotas.{name} {value!r} must be seconds from 0 to 86400",
                        )
                    )
                else:
                    values[name] = float(value)
        on_error = body.get("on_error", "default")
        if on_error not in ("default", "allow"):
            problems.add(
                Problem(
                    body.lines.get("on_error", body.line),
                    f"quotas.on_error {on_error!r} must be default or allow",
                )
            )
        source = body.get("source", "file")
        if source not in ("file", "redis"):
            problems.add(
                Problem(
                    body.lines.get("source", body.line),
                    f"quotas.source {source!r} must be file or redis",
                )
            )
        elif source == "redis" and "url" not in values:
            if store_url.startswith(("redis://", "rediss://", "unix://")):
                values["url"] = store_url
            elif "url" not in body:
                problems.add(
                    Problem(
                        body.lines["source"],
                        "quotas.source redis needs quotas.url "
                        "(redis://host:port/db): the store is not one Redis",
                    )
                )
        if source != "redis":
            for name in ("url", "prefix", "audit_stream"):
                if name in body:
                    problems.add(Problem(body.lines[name], f"quotas.{name} needs source: redis"))
        if "plans" not in body:
            problems.add(
                Problem(body.line, "quotas has no 'plans' (the plans file, e.g. plans: plans.yaml)")
            )
            return None
        given = body["plans"]
        if not isinstance(given, str) or not given:
            problems.add(Problem(body.lines["plans"], f"quotas.plans {given!r} must be a file"))
            return None
        file = Path(path).parent / given
        try:
            stamp = file.stat().st_mtime
            plans = Plans.load(file)
        except OSError as exc:
            problems.add(
                Problem(
                    body.lines["plans"],
                    f"quotas.plans {given!r}: cannot read: {exc.strerror or exc}",
                )
            )
            return None
        except ConfigError as exc:
            for text in str(exc).splitlines():
                problems.add(Problem(body.lines["plans"], f"quotas.plans: {text}"))
            return None
        if source == "redis" and plans.customers:
            problems.add(
                Problem(
                    body.lines["source"],
                    f"quotas.source is redis and {given} "
                    "assigns customers: put them in Redis, or use source: file",
                )
            )
        if problems.count > before:
            return None
        return QuotaSettings(
            plans, str(file), str(source), on_error=str(on_error), stamp=stamp, **values
        )

    def policy(self, name: str, body: Map) -> PolicySpec:
        """The policy ``name`` of ``rate: plan:<limit>``, or a ``Problem``."""
        rate = str(body["rate"])
        extra = sorted(set(body) - PLAN_POLICY_KEYS)
        if extra:
            raise Problem(
                body.lines[extra[0]],
                f"policy {name!r} counts a plan's limit ({rate}), whose plan sets {extra[0]!r}; "
                f"remove it (a plan policy takes only {', '.join(sorted(PLAN_POLICY_KEYS))})",
            )
        line = body.lines["rate"]
        if self.settings is None:
            if self.file:  # the section is there but was refused: its problems say why
                raise Problem(line, f"rate {rate!r} names a plan; the quotas section is invalid")
            raise Problem(
                line,
                f"rate {rate!r} names a plan's limit; add a quotas: section "
                "naming the plans file (quotas: {plans: plans.yaml})",
            )
        plans = self.settings.plans
        limit = rate[5:]
        if limit not in plans.limit_names:
            raise Problem(
                line,
                f"rate {rate!r} names no limit of the plans; expected one of "
                f"{', '.join('plan:' + n for n in plans.limit_names)}",
            )
        shadow = body.get("shadow", False)
        enabled = body.get("enabled", True)
        for key, value in (("shadow", shadow), ("enabled", enabled)):
            if not isinstance(value, bool):
                raise Problem(body.lines[key], f"{key} {value!r} must be true or false")
        found = plans.limit(plans.default, limit)
        return PolicySpec(
            name,
            found.policy,
            rate,
            found.algorithm,
            found.burst,
            found.buckets,
            shadow=shadow,
            enabled=enabled,
            plan=limit,
        )
