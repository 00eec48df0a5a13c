"""``status``: what a tenant's limits are and how much of each is left, charging nothing.

GitHub's ``GET /rate_limit`` for a caller: one ``QuotaStatus`` per rate of every limit of its
plan (a stack gives one row per rate), from a peek of nothing (``cost=0``) of each limit —
which reads and never writes — and the plan cache's answer for where each came from.

``used`` is ``limit - remaining``: below zero after a credit took a window's count below zero,
``limit`` when a lowered limit leaves nothing (the window may hold more). ``reset_at`` is when
the rate is fully reset or refilled (a calendar rate's period end; for a key with no state yet,
when a window opened now would end).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from ..algorithms import Outcome
from ..plan import Plan

if TYPE_CHECKING:
    from .cache import Resolved
    from .core import LimiterCore


@dataclass(frozen=True, slots=True)
class QuotaStatus:
    """One rate of one of a tenant's limits, as it stands."""

    name: str
    """The limit's name in the plans (``api``)."""
    rate: str
    """The rate as text (``5000/1h``, ``1000/calendar-month``)."""
    limit: int
    used: int
    remaining: int
    reset_at: float
    """Epoch seconds, the limiter's clock."""
    plan: str
    source: str
    """``plan``, ``default``, ``override``, ``last-known``, ``default-on-error`` or
    ``allow-on-error`` (``quotas.cache.ORIGINS``)."""
    algorithm: str
    until: float | None = None
    """When the limit's override ends (epoch seconds; None: no override, or none set)."""

    def to_dict(self) -> dict[str, Any]:
        """The row as JSON-ready data."""
        return asdict(self)


def status_plans(core: LimiterCore, key: str, resolved: Resolved) -> list[Plan]:
    """A peek of nothing (cost 0) of every limit of the tenant, in the plans' order."""
    return [core.plan_of("peek", key, policy, 0) for policy in resolved.policies.values()]


def status_rows(
    resolved: Resolved, plans: Sequence[Plan], found: Sequence[Sequence[Outcome]]
) -> tuple[QuotaStatus, ...]:
    """The rows of ``status`` from the peeks' outcomes."""
    rows = []
    for (name, policy), outcomes in zip(resolved.policies.items(), found, strict=True):
        override = resolved.overrides.get(name)
        for rate, limit, outcome in zip(policy.rates, policy.limits, outcomes, strict=True):
            rows.append(
                QuotaStatus(
                    name,
                    rate.code,
                    limit.capacity,
                    limit.capacity - outcome.remaining,
                    outcome.remaining,
                    outcome.reset_ms / 1000,
                    resolved.plan,
                    resolved.source_of(name),
                    policy.algorithm.NAME,
                    None if override is None else override.until,
                )
            )
    return tuple(rows)
