"""What a plan source says about one tenant: its plan and its overrides.

- ``TenantPlan``: the tenant's plan name (``None``: the default plan) and its overrides by
  limit name.
- ``Override``: one limit of one tenant counted at other rates until ``until`` (epoch seconds
  on the limiter's clock; ``None``: until removed), with who set it, why and when. An override
  changes the rate, not the counters: the tenant keeps what it used (``catalog.PlanLimit``).

Both are checked when made, so a source's garbage (a negative limit, a plan that does not
exist, a number where a rate belongs) is refused where it is read, never enforced.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from ..rates import Rate

MAX_TEXT = 500
"""Longest ``by``/``reason`` kept (longer text is cut): an audit field, not a document."""


@dataclass(frozen=True, slots=True)
class Override:
    """Limit rates for one tenant until ``until``; ``spec`` is the rate text as given."""

    spec: str
    until: float | None = None
    by: str = ""
    reason: str = ""
    at: float | None = None
    rates: tuple[Rate, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.spec, str):
            raise ConfigError(f"override rate {self.spec!r} must be a string like '100/hour'")
        object.__setattr__(self, "rates", Rate.parse(self.spec))
        for name in ("until", "at"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
            ):
                raise ConfigError(f"override {name} {value!r} must be epoch seconds")
        for name in ("by", "reason"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise ConfigError(f"override {name} {value!r} must be text")
            object.__setattr__(self, name, value[:MAX_TEXT])

    @classmethod
    def make(
        cls,
        rate: str | Rate,
        *,
        until: float | None = None,
        by: str = "",
        reason: str = "",
        at: float | None = None,
    ) -> Override:
        """An override from a rate (text or ``Rate``)."""
        spec = rate if isinstance(rate, str) else _spec(rate)
        return cls(spec, None if until is None else float(until), by, reason, at)

    def live(self, now: float) -> bool:
        """Whether the override applies at epoch second ``now``."""
        return self.until is None or now < self.until

    def to_dict(self) -> dict[str, Any]:
        """The override as JSON-ready data (what ``RedisSource`` stores)."""
        return {
            "rate": self.spec,
            "until": self.until,
            "by": self.by,
            "reason": self.reason,
            "at": self.at,
        }

    @classmethod
    def from_dict(cls, data: object) -> Override:
        """An override from ``to_dict``'s data; ``ConfigError`` for anything else."""
        if not isinstance(data, Mapping) or not isinstance(data.get("rate"), str):
            raise ConfigError(f"override {str(data)[:100]!r} must be a mapping with a 'rate'")
        unknown = sorted(set(data) - {"rate", "until", "by", "reason", "at"})
        if unknown:
            raise ConfigError(f"override has unknown field {unknown[0]!r}")
        return cls(
            data["rate"],
            data.get("until"),
            data.get("by") or "",
            data.get("reason") or "",
            data.get("at"),
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Override:
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            raise ConfigError(f"override {str(text)[:100]!r} is not JSON") from None
        return cls.from_dict(data)


def _spec(rate: Rate) -> str:
    if rate.calendar is not None:
        return f"{rate.count}/calendar-{rate.calendar.unit}"
    return rate.code


@dataclass(frozen=True, slots=True)
class TenantPlan:
    """A tenant's plan (``None``: the default) and its overrides by limit name."""

    plan: str | None = None
    overrides: Mapping[str, Override] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.plan is not None and not isinstance(self.plan, str):
            raise ConfigError(f"plan {self.plan!r} must be a plan name")
        if not isinstance(self.overrides, Mapping) or not all(
            isinstance(k, str) and isinstance(v, Override) for k, v in self.overrides.items()
        ):
            raise ConfigError(f"overrides {self.overrides!r} must map limit names to Override")

    def live_overrides(self, now: float) -> dict[str, Override]:
        """The overrides that apply at epoch second ``now``."""
        return {name: o for name, o in self.overrides.items() if o.live(now)}
