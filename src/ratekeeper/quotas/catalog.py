"""The plans a business sells, as data: ``Plans`` maps plan names to their ``PlanLimit``s.

A plans file (YAML, or the same shape as a dict)::

    default: free                      # the plan of a tenant no source knows
    plans:
      free:
        api: 100/hour                  # a limit: a rate or a stack of rates ...
        exports: {rate: 10/calendar-month, status: 403}
      pro:
        api: {rate: 20/second; 5000/hour, algorithm: token_bucket}
        exports: {rate: 1000/calendar-month, timezone: Europe/Berlin, anchor: "15"}
    customers:                         # optional: tenants and their plans
      acme: pro
      initech: {plan: pro, overrides: {api: {rate: 20000/hour, until: "2031-07-01T00:00:00Z"}}}

Rules, checked when the plans are read (``ConfigError``; from a file one ``file:line: problem``
per line, every problem at once):

- every plan defines every limit name some plan defines: a tenant that changes plan keeps
  every limit (a limit missing from one plan would silently not limit its tenants);
- a limit is ``rate`` (required), ``algorithm``, ``burst``, ``buckets``, ``unit`` (the
  ``qu`` of ``RateLimit-Policy``: ``requests``, ``content-bytes`` or ``concurrent-requests``),
  ``status`` (429, or 403 for an exhausted quota), and for calendar rates ``timezone`` and
  ``anchor`` (``ratekeeper.calendar``);
- names are 1-100 letters, digits and ``. _ - :``; unknown keys are refused, not ignored.

Each limit's ``Policy`` is made once here, named after the limit: its counters are the limit's
(``plan.make_policy``), so a tenant moving from free to pro keeps what it used.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from ..errors import ConfigError, RatekeeperError
from ..plan import Policy, make_policy
from ..rates import QUOTA_UNITS, Rate
from .overrides import Override, TenantPlan

NAME = re.compile(r"^[A-Za-z0-9._:-]{1,100}$")
LIMIT_KEYS = frozenset(
    {"rate", "algorithm", "burst", "buckets", "unit", "status", "timezone", "anchor"}
)
CUSTOMER_KEYS = frozenset({"plan", "overrides"})
OVERRIDE_KEYS = frozenset({"rate", "until", "by", "reason"})
TOP_KEYS = frozenset({"default", "plans", "customers"})


@dataclass(frozen=True, slots=True)
class PlanLimit:
    """One named limit of a plan: the rates and how they are counted."""

    name: str
    rates: tuple[Rate, ...]
    algorithm: str = "fixed_window"
    burst: int | None = None
    buckets: int | None = None
    status: int = 429
    policy: Policy = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_name(self.name, "limit name")
        if self.status not in (429, 403):
            raise ConfigError(f"status {self.status!r} is invalid; expected 429 or 403")
        policy = make_policy(self.rates, self.algorithm, self.burst, self.buckets, name=self.name)
        object.__setattr__(self, "policy", policy)

    def with_rates(self, rates: tuple[Rate, ...]) -> PlanLimit:
        """The same limit counted at other rates (an override): the same counters."""
        units = {r.unit for r in self.rates}
        unit = units.pop() if len(units) == 1 else None
        rates = tuple(r if r.unit is not None else r.with_unit(unit) for r in rates)
        return PlanLimit(self.name, rates, self.algorithm, self.burst, self.buckets, self.status)


@dataclass(frozen=True, slots=True)
class Plans:
    """Plans by name, each a mapping of limit name to ``PlanLimit``; ``default`` names the plan
    of tenants no source knows; ``customers`` are the tenants the file itself assigns."""

    plans: Mapping[str, Mapping[str, PlanLimit]]
    default: str
    customers: Mapping[str, TenantPlan] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.plans:
            raise ConfigError("plans are empty; expected at least one plan with its limits")
        if self.default not in self.plans:
            raise ConfigError(
                f"default plan {self.default!r} is not one of the plans: "
                f"{', '.join(sorted(self.plans))}"
            )
        names = self.limit_names
        for plan, limits in self.plans.items():
            missing = sorted(set(names) - set(limits))
            if missing:
                raise ConfigError(
                    f"plan {plan!r} does not define {', '.join(map(repr, missing))}; every plan "
                    "must define every limit (give a high rate rather than none)"
                )

    @property
    def limit_names(self) -> tuple[str, ...]:
        """Every limit name, in the order the plans first give them."""
        seen: dict[str, None] = {}
        for limits in self.plans.values():
            seen.update(dict.fromkeys(limits))
        return tuple(seen)

    def limit(self, plan: str, name: str) -> PlanLimit:
        """Plan ``plan``'s limit ``name`` (``ConfigError`` naming what exists otherwise)."""
        limits = self.plans.get(plan)
        if limits is None:
            raise ConfigError(f"plan {plan!r} is unknown; expected one of {sorted(self.plans)}")
        found = limits.get(name)
        if found is None:
            raise ConfigError(
                f"limit {name!r} is not in the plans; expected one of {list(self.limit_names)}"
            )
        return found

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "plans") -> Plans:
        """Plans from a mapping of the file's shape; problems name the key path."""
        reader = _Reader(source, lines=False)
        plans = reader.read(data)
        if reader.problems:
            raise ConfigError("\n".join(reader.problems))
        assert plans is not None
        return plans

    @classmethod
    def from_yaml(cls, text: str, source: str = "<plans>") -> Plans:
        """Plans from YAML text (PyYAML: the ``server`` extra); ``source:line: problem``."""
        from ..yaml_lines import Problem, parse

        try:
            data = parse(text)
        except Problem as exc:
            raise ConfigError(f"{source}:{exc.line}: {exc.message}") from None
        reader = _Reader(source, lines=True)
        plans = reader.read(data)
        if reader.problems:
            raise ConfigError("\n".join(reader.problems))
        assert plans is not None
        return plans

    @classmethod
    def load(cls, path: str | Path) -> Plans:
        """Plans from a YAML file; every problem as ``file:line: problem``."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: cannot read plans file: {exc}") from None
        return cls.from_yaml(text, str(path))


def check_name(name: object, what: str) -> str:
    """A plan, limit or tenant-facing name: 1-100 letters, digits and ``. _ - :``."""
    if not isinstance(name, str) or not NAME.match(name):
        raise ConfigError(f"{what} {name!r} is invalid; expected 1-100 letters, digits and . _ - :")
    return name


def parse_limit(name: str, spec: object) -> PlanLimit:
    """A limit from its spec: a rate string, or a mapping of ``LIMIT_KEYS``."""
    if isinstance(spec, str | Rate):
        return PlanLimit(name, _rates(spec, None, None, None))
    if not isinstance(spec, Mapping):
        raise ConfigError(
            f"limit {name!r} must be a rate or a mapping with 'rate', not {type(spec).__name__}"
        )
    unknown = sorted(set(spec) - LIMIT_KEYS)
    if unknown:
        raise ConfigError(
            f"unknown key {unknown[0]!r} in limit {name!r}; expected one of "
            f"{', '.join(sorted(LIMIT_KEYS))}"
        )
    if "rate" not in spec:
        raise ConfigError(f"limit {name!r} has no 'rate'")
    rates = _rates(spec["rate"], spec.get("unit"), spec.get("timezone"), spec.get("anchor"))
    status = spec.get("status", 429)
    if isinstance(status, bool) or status not in (429, 403):
        raise ConfigError(f"status {status!r} of limit {name!r} is invalid; expected 429 or 403")
    algorithm = spec.get("algorithm", "fixed_window")
    if not isinstance(algorithm, str):
        raise ConfigError(f"algorithm {algorithm!r} of limit {name!r} must be a name")
    return PlanLimit(name, rates, algorithm, spec.get("burst"), spec.get("buckets"), status)


def _rates(spec: object, unit: object, timezone: object, anchor: object) -> tuple[Rate, ...]:
    if isinstance(spec, Rate):
        rates: tuple[Rate, ...] = (spec,)
    elif isinstance(spec, str):
        rates = Rate.parse(spec)
    else:
        raise ConfigError(f"rate {spec!r} must be a string like '100/hour'")
    if unit is not None and unit not in QUOTA_UNITS:
        raise ConfigError(f"unit {unit!r} is invalid; expected one of {', '.join(QUOTA_UNITS)}")
    if (timezone is not None or anchor is not None) and not any(r.calendar for r in rates):
        raise ConfigError(
            "timezone and anchor apply to calendar rates (e.g. '1000/calendar-month'); "
            f"{spec!r} has none"
        )
    out = []
    for r in rates:
        if r.calendar is not None and (timezone is not None or anchor is not None):
            r = Rate.per_calendar(
                r.count,
                r.calendar.unit,
                timezone=r.calendar.timezone if timezone is None else timezone,  # type: ignore[arg-type]  # checked by Calendar
                anchor=r.calendar.anchor if anchor is None else anchor,  # type: ignore[arg-type]  # checked by Calendar
            )
        out.append(r.with_unit(str(unit) if unit is not None else "requests"))
    return tuple(out)


def parse_until(value: object) -> float | None:
    """An expiry: None, epoch seconds, or an ISO 8601 time with its offset (``...Z``)."""
    if value is None:
        return None
    if isinstance(value, datetime):
        when = value
    elif isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ConfigError(f"until {value!r} is invalid; expected an ISO 8601 time or epoch seconds")
    elif isinstance(value, int | float):
        return float(value)
    else:
        try:
            when = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError(
                f"until {value!r} is invalid; expected an ISO 8601 time with its offset, "
                "e.g. '2031-07-01T00:00:00Z'"
            ) from None
    if when.tzinfo is None:
        raise ConfigError(
            f"until {value!r} has no time zone offset; write it, e.g. '2031-07-01T00:00:00Z'"
        )
    return when.timestamp()


class _Reader:
    """Reads the file's shape, gathering every problem (with lines when read from YAML)."""

    def __init__(self, source: str, lines: bool) -> None:
        self.source = source
        self.lines = lines
        self.problems: list[str] = []

    def where(self, node: Any, key: str | None, path: str) -> str:
        line = 0
        if self.lines and node is not None:
            line = node.lines.get(key, node.line) if key is not None else node.line
        return f"{self.source}:{line}" if self.lines else f"{self.source}: {path}"

    def fail(self, node: Any, key: str | None, path: str, problem: str) -> None:
        self.problems.append(f"{self.where(node, key, path)}: {problem}")

    def read(self, data: Any) -> Plans | None:
        if not isinstance(data, Mapping):
            self.fail(None, None, "(top)", "a plans file is a mapping with 'default' and 'plans'")
            return None
        for key in sorted(set(data) - TOP_KEYS):
            self.fail(data, key, key, f"unknown key {key!r}; expected one of {sorted(TOP_KEYS)}")
        plans = self.read_plans(data)
        customers = self.read_customers(data, plans)
        default = data.get("default")
        if default is None:
            self.fail(data, None, "default", "no 'default': name the plan of unknown tenants")
        elif not isinstance(default, str) or default not in plans:
            self.fail(
                data, "default", "default", f"default plan {default!r} is not one of the plans"
            )
        if self.problems:
            return None
        try:
            return Plans(plans, str(default), customers)
        except RatekeeperError as exc:  # every plan must define every limit
            self.fail(data, "plans", "plans", str(exc))
            return None

    def read_plans(self, data: Mapping[str, Any]) -> dict[str, dict[str, PlanLimit]]:
        body = data.get("plans")
        out: dict[str, dict[str, PlanLimit]] = {}
        if not isinstance(body, Mapping) or not body:
            self.fail(data, "plans", "plans", "'plans' must map plan names to their limits")
            return out
        for plan, limits in body.items():
            path = f"plans.{plan}"
            try:
                check_name(plan, "plan name")
            except ConfigError as exc:
                self.fail(body, plan, path, str(exc))
                continue
            if not isinstance(limits, Mapping) or not limits:
                self.fail(body, plan, path, f"plan {plan!r} must map limit names to limits")
                continue
            out[plan] = {}
            for name, spec in limits.items():
                try:
                    check_name(name, "limit name")
                    out[plan][name] = parse_limit(name, spec)
                except RatekeeperError as exc:
                    self.fail(limits, name, f"{path}.{name}", str(exc))
        return out

    def read_customers(
        self, data: Mapping[str, Any], plans: Mapping[str, Mapping[str, PlanLimit]]
    ) -> dict[str, TenantPlan]:
        body = data.get("customers", {})
        out: dict[str, TenantPlan] = {}
        if not isinstance(body, Mapping):
            self.fail(data, "customers", "customers", "'customers' must map tenants to plans")
            return out
        for tenant, spec in body.items():
            path = f"customers.{tenant}"
            try:
                out[str(tenant)] = self.read_customer(str(tenant), spec, plans)
            except RatekeeperError as exc:
                self.fail(body, tenant, path, str(exc))
        return out

    @staticmethod
    def read_customer(
        tenant: str, spec: object, plans: Mapping[str, Mapping[str, PlanLimit]]
    ) -> TenantPlan:
        if isinstance(spec, str):
            spec = {"plan": spec}
        if not isinstance(spec, Mapping):
            raise ConfigError(f"tenant {tenant!r} must name a plan or be a mapping with 'plan'")
        unknown = sorted(set(spec) - CUSTOMER_KEYS)
        if unknown:
            raise ConfigError(
                f"unknown key {unknown[0]!r} for tenant {tenant!r}; expected plan, overrides"
            )
        plan = spec.get("plan")
        if plan is not None and plan not in plans:
            raise ConfigError(
                f"plan {plan!r} of tenant {tenant!r} is not one of the plans: {sorted(plans)}"
            )
        overrides: dict[str, Override] = {}
        raw = spec.get("overrides", {})
        if not isinstance(raw, Mapping):
            raise ConfigError(f"overrides of tenant {tenant!r} must map limit names to overrides")
        names = {n for limits in plans.values() for n in limits}
        for name, body in raw.items():
            if name not in names:
                raise ConfigError(f"override of {name!r} for {tenant!r}: no plan has that limit")
            if isinstance(body, str):
                body = {"rate": body}
            if not isinstance(body, Mapping) or "rate" not in body:
                raise ConfigError(f"override of {name!r} for {tenant!r} needs a 'rate'")
            unknown = sorted(set(body) - OVERRIDE_KEYS)
            if unknown:
                raise ConfigError(
                    f"unknown key {unknown[0]!r} in the override of {name!r}; expected one of "
                    f"{', '.join(sorted(OVERRIDE_KEYS))}"
                )
            overrides[name] = Override.make(
                body["rate"],
                until=parse_until(body.get("until")),
                by=str(body.get("by", "plans file")),
                reason=str(body.get("reason", "")),
            )
        return TenantPlan(None if plan is None else str(plan), overrides)
